"""muse::attn2 on Hopper (sm_90a): paged verify/decode attention fused with the per-head output
RMS norm and the sigmoid gate, one CuTe DSL kernel launch.

Math (docs/DESIGN.md section 5; numerics of muse_ops/reference/attn2.py), per request r, KV head g,
query token t at position pos = L - q_len + t, and query head g * 8 + j:
    o   = softmax(scale * q k^T) v over keys [max(0, pos - W + 1), pos] (window W > 0) or [0, pos]
    out = bf16(sigmoid(gate) * rmsnorm(bf16(o)))     rmsnorm(o) = o * rsqrt(mean(o^2) + 1e-5), fp32

Tensors (row-major, contiguous, 16-byte aligned; R requests, Hkv KV heads, Hq = 8 Hkv):
    y          bf16  [q_len * R, 1152 * Hkv]   row r * q_len + t: q at columns 0 : 64 Hq,
                                               the gate at 64 (Hq + 2 Hkv) : 1152 Hkv
    kv_cache   bf16 | float8_e4m3fn [num_pages, Hkv, 16, 128]  a page of 16 rows: K in columns 0:64,
                                               V in 64:128
    k_scale,   fp32  [1] or [Hkv]              an FP8 cache's dequantization scales (docs/DESIGN.md
    v_scale                                    section 3b): key = e4m3 * k_scale, value = e4m3 * v_scale
    page_table int32 [R, max_pages]            logical page -> physical page
    seq_lens   int32 [R]                       L (includes the q_len new tokens)
    out        bf16  [q_len * R, Hq * 64]      row r * q_len + t, columns 64 h : 64 (h + 1) of head h
    workspace  uint8 [workspace_bytes(...)]    fp32 partials O and (m, l) (workspace_layout), uint32
                                               arrival counters at the end (zeroed once by the
                                               caller; every call leaves them at zero)
    error_flag int32 [1]                       |= 1: L outside [q_len, max_seq_len] (the request's
                                               rows are zero); |= 2: a page it needs lies beyond
                                               max_pages or outside [0, num_pages) (read as zeros,
                                               its keys masked)

Constraints: a bf16 or an e4m3 cache (Attn2Config.fp8: e4m3 pages are converted exactly to f16
in shared memory before the wgmmas, which then run in f16 with fp32 accumulation, q scaled by a
power of two into f16 and P rounded to f16; KVRing, Attn2Sm90.load_query; never an FP8 MMA);
head_dim 64, 8 query heads per KV head, 16-row pages (muse_ops.config); q_len 1 (decode) or 8
(verify): the q_len * 8 query rows of a KV head fit one wgmma M of 64; max_seq_len up to 2^21
(attn2_plan.can_implement); sm_90a (wgmma, TMA, clusters, PDL); one warpgroup (128 threads) per CTA.

Design (docs/DESIGN.md section 11 has the whole; bench/RESULTS.md the measurements behind it):
split KV over one reduction tree per request that depends on L and the deployment only
(ReductionTree). A CTA (one warpgroup) holds every query row of one (request, KV head) and runs its
chunks of the tree: the KV ring streams pages with TMA (KVRing), S = Q K^T and O += P V run on
wgmma with P in registers, the softmax is online in base 2 (SoftmaxPartial). Two layouts place the
tree on CTAs, chosen on the host from the batch shape (choose_layout): wide, a CTA per chunk and
a cluster per sub; deep, a CTA per sub and a CTA pair per node (every CTA pays three dependent
loads and a merge around its steps: a request alone needs many short CTAs, a full batch few long
ones). The partials merge over DSMEM in
the cluster (merge_cluster), then through the workspace (WorkspaceMerge); the single writer of a
row applies the norm and the gate (MergeRows). Every fold is the same explicit PTX wherever it runs,
so a request's bits depend neither on the batch, the layout nor timing. PDL: the kernel may start
while its predecessor runs and reads only seq_lens, the page table and KV rows older than the new
tokens before griddepcontrol.wait (the contract: docs/DESIGN.md section 11).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float8E4M3FN, Float16, Float32, Int32, Int64, Uint32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cuda.bindings import driver as cuda

from ..config import CACHE_ROW, GROUP, HEAD_DIM, PAGE_SIZE, RMS_EPS
from ..errors import BAD_PAGE, BAD_SEQ_LEN
from . import runtime
from .attn2_plan import (LAYOUTS, M_TILE, NODE_MIN_STEPS, NODES_MAX, QUIET_WIDE_PAIRS, SUB_CHUNKS, THREADS,  # noqa: F401
                         WIDE_MAX_PAIRS,
                         WIDE_MAX_PAIRS_WINDOW, WINDOW_SUB_CHUNKS,
                         Attn2Config, _config, can_implement, choose_layout, deployment_layouts,
                         deployment_variants, launch_config, split_plan, sub_chunks, wave_ctas,
                         workspace_bytes, workspace_layout)
from .ptx import (add_rn, e4m3x4_to_f16x4, exponent_of, fma_rn, ld_dsmem_f32x2, ld_dsmem_f32x4,
                  ld_shared_v2_b32, mul_rn, pack_x2, pow2, quad_max, quad_sum, select,
                  set_error_bit, st_shared_v4_b32, sub_rn, wgmma_commit, wgmma_group)

LOG2E = 1.4426950408889634
NEG_BIG = -1.0e30
RESCALE_SLACK = 8.0   # log2 units: the running max lags the true max by at most this
# values of a thread's S fragment (wgmma C layout) per page of a step: 2 rows x 4 of the page's 16
# columns. The loops over S go page by page, so that a static loop stays below the 64 iterations
# from which the DSL warns (DSLOptimizationWarning; S has 64 values at pages_per_step 8)
S_PER_PAGE = 8


# ------------------------------------------------------------------------------------ device
@cute.jit
def _pt_entry(lp: Int32, phys: Int32, last_page: Int32, width: Int32, num_pages: Int32,
              mErr: cute.Tensor) -> Int32:
    """The smem page-table entry of logical page lp, whose table entry is phys: phys, or -1 past
    the request's last page or where the entry is invalid (which also sets error bit 2)."""
    v = Int32(-1)
    if lp <= last_page:
        ok = Int32(lp < width) * Int32(phys >= 0) * Int32(phys < num_pages)
        if ok != 0:
            v = phys
        else:
            set_error_bit(mErr, BAD_PAGE)
    return v

@cute.jit
def _load_q(mY: cute.Tensor, qv: cute.Tensor, request: Int32, kv_head: Int32, tidx: Int32,
            q_len: cutlass.Constexpr[int]):
    """The Q tile of (request, kv_head) into registers qv (8, its): 16-byte piece
    tidx + it * THREADS of the tile, i.e. row m = token * 8 + head, columns 8 (ci % 8) ..;
    rows >= q_len * 8 are zero."""
    for it in cutlass.range_constexpr(cute.size(qv, mode=[1])):
        ci = tidx + it * THREADS
        qm = ci // 8
        qv[None, it].fill(0.0)
        if qm < q_len * GROUP:
            src = cute.local_tile(mY, (1, 8), (request * q_len + qm // GROUP,
                                               (kv_head * GROUP + qm % GROUP) * 8 + ci % 8))
            cute.autovec_copy(src[0, None], qv[None, it])

@cute.jit
def _q_to_f16(qv: cute.Tensor, sQmax: cute.Tensor, warp: Int32, lane: Int32):
    """Every thread, its bf16 share qv of the Q tile: (f16(qv 2^-q_exp), q_exp), q_exp = E - 15
    for the tile's largest |q| in [2^E, 2^(E + 1)), clamped to [-120, 112] (Attn2Sm90.load_query
    says why). The tile's max: each warp's by butterfly, then the warps' through sQmax and a CTA
    barrier."""
    qf = cute.make_rmem_tensor(qv.layout, Float32)
    qf.store(qv.load().to(Float32))
    mx = Float32(0.0)
    for i in cutlass.range_constexpr(cute.size(qv)):
        mx = cute.arch.fmax(mx, cute.arch.fmax(qf[i], -qf[i]))
    for offset in cutlass.range_constexpr(5):
        mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1 << offset))
    if lane == 0:
        sQmax[warp] = mx
    cute.arch.sync_threads()
    for w in cutlass.range_constexpr(THREADS // 32):
        mx = cute.arch.fmax(mx, sQmax[w])
    q_exp = cutlass.min(cutlass.max(exponent_of(mx) - 15, Int32(-120)), Int32(112))
    down = pow2(-q_exp)
    qh = cute.make_rmem_tensor(qv.layout, Float16)
    qh32 = cute.recast_tensor(qh, Uint32)
    for i in cutlass.range_constexpr(cute.size(qv) // 2):
        qh32[i] = pack_x2(mul_rn(qf[2 * i], down), mul_rn(qf[2 * i + 1], down), "f16")
    return qh, q_exp


# The folds of the reduction tree are explicit PTX (muse_ops.cutedsl.ptx): the same instructions
# wherever a fold runs (a deep CTA's registers, a wide cluster's DSMEM merge, the level-2 merge),
# so the bits match whichever CTA, thread or layout ran it.
@cute.jit
def _fold_w(m_a: Float32, m_b: Float32):
    """fold(A, B) of two softmax partials (m, l, O) with m in log2 units: the new max and the
    weights of A and B. The value parts then fold with _fold_v."""
    m = cute.arch.fmax(m_a, m_b)
    return (m, cute.math.exp2(sub_rn(m_a, m), fastmath=True),
            cute.math.exp2(sub_rn(m_b, m), fastmath=True))

@cute.jit
def _fold_v(x_a: Float32, w_a: Float32, x_b: Float32, w_b: Float32) -> Float32:
    """x_a * w_a + x_b * w_b as fma(x_a, w_a, x_b * w_b)."""
    return fma_rn(x_a, w_a, mul_rn(x_b, w_b))

@cute.jit
def _fold_into(m: Float32, l: Float32, o: cute.Tensor, m_b: Float32, l_b: Float32, o_b: cute.Tensor,
               take: Int32, selected: cutlass.Constexpr[bool]):
    """(m, l, o) <- fold((m, l, o), (m_b, l_b, o_b)) for a row's columns o (in place); returns
    (m, l). selected: where take == 0 the fold is discarded (selp, no branch, exact)."""
    m_new, wa, wb = _fold_w(m, m_b)
    if const_expr(selected):
        l = select(take, _fold_v(l, wa, l_b, wb), l)
        for c in cutlass.range_constexpr(cute.size(o)):
            o[c] = select(take, _fold_v(o[c], wa, o_b[c], wb), o[c])
        m_new = select(take, m_new, m)
    else:
        l = _fold_v(l, wa, l_b, wb)
        for c in cutlass.range_constexpr(cute.size(o)):
            o[c] = _fold_v(o[c], wa, o_b[c], wb)
    return m_new, l

@cute.jit
def _node_into(o: cute.Tensor, m_a: Float32, l_a: Float32, o_a: cute.Tensor,
               m_b: Float32, l_b: Float32, o_b: cute.Tensor):
    """A node from its two subs: fold(fold(I, a), b) into o (not o_a / o_b); returns (m, l)."""
    o.fill(0.0)
    m, l = _fold_into(Float32(NEG_BIG), Float32(0.0), o, m_a, l_a, o_a, Int32(1), False)
    return _fold_into(m, l, o, m_b, l_b, o_b, Int32(1), False)


SS_LEAF = 4   # columns per leaf of the sum-of-squares tree (the fewest columns a thread of a row holds)


def _pairwise_sum(values: list):
    """A balanced binary tree of add.rn over a power-of-two list, in order (plain Python: it
    unrolls at trace time)."""
    while len(values) > 1:
        values = [add_rn(values[2 * i], values[2 * i + 1]) for i in range(len(values) // 2)]
    return values[0]


@cute.jit
def _sum_of_squares(of: cute.Tensor, columns_per_thread: cutlass.Constexpr[int],
                    threads_per_row: cutlass.Constexpr[int]) -> Float32:
    """The sum of a row's 64 squares, of[c]^2 over this thread's columns_per_thread columns and
    its row's threads_per_row lanes (consecutive lanes, consecutive columns), in one order for
    every (columns_per_thread, threads_per_row) of the layouts: 16 leaves of SS_LEAF columns
    (mul, then fma in column order), then a balanced binary tree over the leaves in column order.
    The thread's own leaves are the tree's lower levels; the butterfly over the lanes (offsets
    1, 2, 4, ..) its upper ones: lane i ^ offset holds the sibling subtree, and a + b == b + a.
    Every operation is explicit .rn PTX (nothing for ptxas to contract differently)."""
    leaves = []
    for leaf in cutlass.range_constexpr(columns_per_thread // SS_LEAF):
        c0 = leaf * SS_LEAF
        s = mul_rn(of[c0], of[c0])
        for c in cutlass.range_constexpr(c0 + 1, c0 + SS_LEAF):
            s = fma_rn(of[c], of[c], s)
        leaves.append(s)
    ss = _pairwise_sum(leaves)
    for b in cutlass.range_constexpr(int(math.log2(threads_per_row))):
        ss = add_rn(ss, cute.arch.shuffle_sync_bfly(ss, offset=1 << b))
    return ss


@cute.jit
def _epilogue(o: cute.Tensor, gt: cute.Tensor, mOut: cute.Tensor, row_g: Int32,
              qcol: Int32, active: Int32, columns_per_thread: cutlass.Constexpr[int],
              threads_per_row: cutlass.Constexpr[int]):
    """o: columns_per_thread fp32 values of one row (columns qcol.. of the head); writes
    bf16(sigmoid(gate) * rmsnorm(bf16(o))) if active. The threads_per_row lanes of a row reduce
    by butterfly (every lane takes part, so inactive lanes compute a duplicate row)."""
    ob = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), BFloat16)
    ob.store(o.load().to(BFloat16))
    of = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), Float32)
    of.store(ob.load().to(Float32))
    ss = _sum_of_squares(of, columns_per_thread, threads_per_row)
    rs = cute.math.rsqrt(ss * (1.0 / HEAD_DIM) + RMS_EPS, fastmath=True)
    gf = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), Float32)
    gf.store(gt.load().to(Float32))
    res = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), Float32)
    for c in cutlass.range_constexpr(columns_per_thread):
        sig = cute.arch.rcp_approx(1.0 + cute.math.exp2(gf[c] * (-LOG2E), fastmath=True))
        res[c] = of[c] * rs * sig
    rb = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), BFloat16)
    rb.store(res.load().to(BFloat16))
    if active != 0:
        cute.autovec_copy(rb, cute.local_tile(mOut, (1, columns_per_thread),
                                              (row_g, qcol // columns_per_thread))[0, None])


# ------------------------------------------------------------------------------ kernel state
# Each concern of the kernel is a frozen dataclass built once (create: plain arithmetic, or only
# layouts) and used through @cute.jit methods, as FA4's BlockInfo / PagedKVManager. The methods
# store into a field's tensor through a local name (sPT = self.sPT; sPT[i] = ..): a store through
# self.<field> inside a dynamic `if` makes the DSL carry the whole object through the `if`, which
# fails on its plain Python fields (cfg).
@dataclass(frozen=True)
class CtaPlace:
    """Where this thread works: its CTA's (request, KV head) pair and split, its index in the
    warpgroup. Grid (cluster_size, Hkv * R, max_clusters), clusters of cluster_size CTAs along x:
    CTA (rank, kv_head + Hkv * request, cluster) owns split = cluster * cluster_size + rank of the
    pair's reduction tree. The cluster index is the slowest grid dimension, so the clusters with
    work (low indices) are dispatched first and the idle ones exit at the end."""
    request: Int32
    kv_head: Int32
    split: Int32
    num_requests: Int32
    kv_heads: Int32
    tidx: Int32
    warp: Int32          # warp-uniform
    lane: Int32

    @staticmethod
    def create(mSeq: cute.Tensor, mKV_tma: cute.Tensor, cluster_size: int) -> "CtaPlace":
        tidx, _, _ = cute.arch.thread_idx()
        block_rank, block_pair, block_cluster = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        num_requests = mSeq.shape[0]
        kv_heads = mKV_tma.shape[2]
        kv_head = block_pair % kv_heads
        request = block_pair // kv_heads
        split = block_cluster * cluster_size + block_rank
        return CtaPlace(request, kv_head, split, num_requests, kv_heads, tidx, warp, lane)


class CtaSteps(NamedTuple):
    """The ring steps of one CTA (ReductionTree.cta_steps): dynamic Int32s."""
    first: Int32         # its first step in the request's steps (k_begin)
    count: Int32         # how many it runs
    page_base: Int32     # its first logical page


@dataclass(frozen=True)
class ReductionTree:
    """The reduction tree of a request, from its L and compile-time constants only (so a request's
    bits do not depend on the batch; attn2_plan.split_plan is the host's copy), and this CTA's
    place in it. The visible pages are cut into ring steps of pages_per_step pages; chunk j covers
    steps [j * n_steps // n_chunks, (j + 1) * n_steps // n_chunks); a sub is sub_chunks chunks, a
    node 2 subs; about n_steps // node_min_steps nodes, 2 from two_node_steps steps, 1 to
    NODES_MAX (attn2_plan.node_count). A chunk is an online softmax from the identity
    I = (m = -1e30, l = 0, O = 0); a sub is the left fold of its chunks; a node is
    fold(fold(I, sub 2i), sub 2i + 1) (a missing sub is I); the output is the flat sum of the
    nodes weighted by ex2(m - M), M the largest node max. CTA split computes the chunks_per_cta
    chunks from chunk split * chunks_per_cta: wide, chunk split (rank of sub cluster); deep, sub
    split (rank of node cluster). Every thread holds the same values."""
    seq_len: Int32       # L
    first_page: Int32    # first visible page (window) or 0
    last_page: Int32     # the page of key L - 1
    n_steps: Int32       # ring steps of pages_per_step pages over the visible pages
    n_chunks: Int32
    n_subs: Int32
    n_nodes: Int32
    cluster: Int32       # this CTA's cluster: a sub (wide) or a node (deep)
    rank: Int32          # this CTA's rank in it
    n_clusters: Int32    # clusters with work: subs (wide) or nodes (deep)
    chunk_lo: Int32      # this CTA's chunks: [chunk_lo, chunk_hi)
    chunk_hi: Int32
    cfg: Attn2Config

    @staticmethod
    def create(cfg: Attn2Config, L: Int32, split: Int32) -> "ReductionTree":
        pages_per_step = cfg.pages_per_step
        key_lo = Int32(0)
        if const_expr(cfg.window > 0):
            key_lo = cutlass.max(L - cfg.q_len - cfg.window + 1, Int32(0))
        first_page = key_lo // PAGE_SIZE
        last_page = (L - 1) // PAGE_SIZE
        n_steps = (last_page - first_page + pages_per_step) // pages_per_step
        n_nodes = cutlass.max(n_steps // cfg.node_min_steps, Int32(n_steps >= cfg.two_node_steps) * 2)
        n_nodes = cutlass.max(Int32(1), cutlass.min(Int32(NODES_MAX), n_nodes))   # attn2_plan.node_count
        n_chunks = cutlass.min(2 * cfg.sub_chunks * n_nodes, n_steps)
        n_subs = (n_chunks + cfg.sub_chunks - 1) // cfg.sub_chunks
        n_nodes = (n_subs + 1) // 2
        cluster = split // cfg.cluster_size
        rank = split % cfg.cluster_size
        n_clusters = n_nodes
        if const_expr(cfg.wide):
            n_clusters = n_subs
        chunk_lo = cutlass.min(split * cfg.chunks_per_cta, n_chunks)
        chunk_hi = cutlass.min(chunk_lo + cfg.chunks_per_cta, n_chunks)
        return ReductionTree(L, first_page, last_page, n_steps, n_chunks, n_subs, n_nodes, cluster, rank,
                             n_clusters, chunk_lo, chunk_hi, cfg)

    @cute.jit
    def cta_steps(self) -> CtaSteps:
        """This CTA's ring steps: those of its chunks [chunk_lo, chunk_hi)."""
        k_begin = self.chunk_lo * self.n_steps // self.n_chunks
        my_steps = self.chunk_hi * self.n_steps // self.n_chunks - k_begin
        page_base = self.first_page + k_begin * self.cfg.pages_per_step
        return CtaSteps(k_begin, my_steps, page_base)

    @cute.jit
    def unwritten_steps(self, page_base: Int32) -> Int32:
        """How many of the first ring steps from page_base hold only rows of positions < L - q_len,
        which the kernel before attn2 does not write (it inserts the q_len new tokens, positions
        L - q_len .. L - 1; docs/DESIGN.md section 11): those loads may go out before the PDL
        wait. 0 without cfg.early_ring (every load waits)."""
        if const_expr(not self.cfg.early_ring):
            return Int32(0)
        first_written_page = (self.seq_len - self.cfg.q_len) // PAGE_SIZE
        return cutlass.max(first_written_page - page_base, Int32(0)) // self.cfg.pages_per_step

    @cute.jit
    def chunk_end(self, chunk: Int32, k_begin: Int32) -> Int32:
        """The step where chunk `chunk` ends, counted from step k_begin."""
        return (chunk + 1) * self.n_steps // self.n_chunks - k_begin

    @cute.jit
    def has_chunk(self, rank: int) -> Int32:
        """Wide: 1 where the chunk of cluster rank `rank` in this CTA's sub exists (is below
        n_chunks), else 0."""
        return Int32(self.cluster * self.cfg.sub_chunks + rank < self.n_chunks)


@dataclass(frozen=True)
class KVRing:
    """The KV ring: the one owner of the KV loads. `stages` stages of pages_per_step pages; per
    page, warp 0 issues one TMA box (16 rows x 64 columns) for its K half and one for its V half
    into 128 B-swizzled smem (the canonical K-major wgmma layout; V read through a transposed view
    is the MN-major B of P V), completing on the stage's mbarrier full[stage] (count 1: warp 0's
    expect_tx arrive). A CTA barrier per step frees the stage read in the step before. The CTA's
    page-table entries are staged in smem once (stage_page_table), the physical page or -1; a page
    marked -1 (past the request's last page, or invalid) is read at page index num_pages, outside
    the tensor map, so TMA fills zeros and still counts its bytes. After `ready(k)` the stage of
    step k holds the step's K and V as 16-bit values (fp8: f16), the tail page's V rows >= L
    zeroed; sK / sV are what
    the wgmmas read. The rest of the kernel uses only these methods and views.

    An FP8 cache (cfg.fp8): the boxes are (16, 64) e4m3, 1 KB, unswizzled (64-byte rows), into a
    staging ring of `stages` stages (per stage the step's K pages, then its V pages: keys_per_step
    rows of 64 bytes each); `ready(k)` then has every thread convert its share of the stage to f16
    (convert) into a single step buffer sK / sV laid out as one stage of the bf16 ring (16-bit
    values in the same swizzle, so the masks and the softmax are those of bf16; the wgmmas run in
    f16), and the tail page's V rows >= L are
    written as zeros there instead of zero_tail_rows. A converted stage is free at once: the ring
    keeps `stages` steps in flight (cfg.steps_ahead), one more than bf16's, in about the bytes of
    bf16's (cfg.smem_bytes)."""
    tma_atom: cute.CopyAtom
    tKVg: cute.Tensor    # TMA view of the cache per box: (box, 1, K|V, Hkv, page)
    tKs: cute.Tensor     # the K ring per page box: (box, pages_per_step * stages) (fp8: the staging ring's)
    tVs: cute.Tensor     # the V ring, the same
    sK: cute.Tensor      # (keys_per_step, 64, mma_stages) bf16 (fp8: f16), 128 B swizzle
    sV: cute.Tensor      # the same
    full: cute.Pointer   # mbarriers full[0 .. stages)
    sPT: cute.Tensor     # int32 [page_table_max]: the CTA's page-table entries (physical page or -1)
    kv_head: Int32
    num_pages: Int32
    tidx: Int32
    warp: Int32          # warp 0 issues the loads
    cfg: Attn2Config
    src8: Int32 | None   # fp8: shared address of this thread's first 8 bytes of staging stage 0
    dst16: Int32 | None  # fp8: shared address of its first 16-byte f16 piece in sK (128 B swizzle applied)

    @staticmethod
    def make_tma(mCache: cute.Tensor, sPages_layout, box_columns: int):
        """Host side (__call__): the TMA atom and the cache's TMA tensor, the cache seen as (row,
        column, KV head, page); a box is (16, box_columns) (Attn2Config.box_columns: one page's K
        or V half, or with page_box the whole page). sPages_layout: the ring as pages (bf16: 128 B
        swizzled; fp8: the staging ring's boxes, staging_layout)."""
        mKV = cute.make_tensor(mCache.iterator, cute.select(mCache.layout, mode=[2, 3, 1, 0]))
        return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mKV,
                                           cute.slice_(sPages_layout, (None, None, 0)), (PAGE_SIZE, box_columns))

    @staticmethod
    def staging_layout(cfg: Attn2Config) -> cute.Layout:
        """fp8: the staging ring's K boxes as pages, (16, 64, (pages_per_step, stages)) bytes: page p
        of stage s at s * 2 keys_per_step * 64 + p * 1 KB; its V boxes follow each stage's K boxes.
        With cfg.page_box: the pages, (16, 128, (pages_per_step, stages)), page p of stage s at
        s * 2 keys_per_step * 64 + p * 2 KB, each row its K then its V bytes, as in the cache."""
        columns = cfg.box_columns
        return cute.make_layout((PAGE_SIZE, columns, (cfg.pages_per_step, cfg.stages)),
                                stride=(columns, 1, (PAGE_SIZE * columns, 2 * cfg.keys_per_step * HEAD_DIM)))

    @staticmethod
    def create(cfg: Attn2Config, tma_atom: cute.CopyAtom, mKV_tma: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor,
               sPages_layout, full, sPT: cute.Tensor, num_pages: Int32,
               cta: CtaPlace, s8: cute.Tensor | None = None) -> "KVRing":
        """The TMA partitions of the rings, seen as pages (16, 64, pages_per_step * stages), against
        the cache's boxes (layout only: no instruction). fp8: those of the staging ring s8, and this
        thread's two conversion addresses (convert)."""
        src8 = None
        dst16 = None
        if const_expr(cfg.fp8):
            sKp = cute.make_tensor(s8.iterator, sPages_layout)
            if const_expr(cfg.page_box):
                sVp = sKp    # one box a page: tVs unused
            else:
                sVp = cute.make_tensor(s8.iterator + cfg.pages_per_step * PAGE_SIZE * HEAD_DIM, sPages_layout)
            # chunk tidx + THREADS i of a stage: bytes 8 (tidx + THREADS i); its row of the step
            # tidx // 8 (+ 16 per i), its columns 8 (tidx % 8) ..: the f16 piece tidx % 8 of that
            # row, in the 128 B swizzle (16-byte piece ^= address bits 7..9, as CuTe addresses sK and
            # as TMA and wgmma read it; sK is 1 KB aligned)
            src8 = s8.iterator.toint() + cta.tidx * 8
            if const_expr(cfg.page_box):
                # chunk tidx + THREADS i: row tidx // 16 + 8 (i % 2) + 16 (i // 2) of the step, its K
                # (tidx % 16 < 8) or V bytes 8 (tidx % 8) ..: piece tidx % 8 of that row of sK or sV
                # (sV follows sK), the same swizzle for all of the thread's rows
                a = (sK.iterator.toint() + ((cta.tidx // 8) % 2) * (cfg.keys_per_step * HEAD_DIM * 2)
                     + (cta.tidx // 16) * (HEAD_DIM * 2) + (cta.tidx % 8) * 16)
            else:
                a = sK.iterator.toint() + (cta.tidx // 8) * (HEAD_DIM * 2) + (cta.tidx % 8) * 16
            dst16 = a ^ ((a >> 3) & 0x70)
        else:
            sKp = cute.make_tensor(sK.iterator, sPages_layout.outer)
            sVp = cute.make_tensor(sV.iterator, sPages_layout.outer)
        # (16, 64, 1, 2, Hkv, pages): a page's K and V boxes; with page_box (16, 128, 1, 1, ..): one
        gKV = cute.flat_divide(mKV_tma, (PAGE_SIZE, cfg.box_columns))
        tKs, tKVg = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sKp, 0, 2),
                                          cute.group_modes(gKV, 0, 2))
        tVs, _ = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sVp, 0, 2),
                                       cute.group_modes(gKV, 0, 2))
        return KVRing(tma_atom, tKVg, tKs, tVs, sK, sV, full, sPT, cta.kv_head, num_pages, cta.tidx, cta.warp, cfg,
                      src8, dst16)

    @cute.jit
    def init_barriers(self):
        """Warp 0, before any global access: what needs no global data, the TMA descriptor (a
        kernel parameter) prefetch and the init of full[0 .. stages), so the first KV load does not
        wait for them. The other warps see them after the kernel's CTA barrier before prologue."""
        if self.warp == 0:
            cpasync.prefetch_descriptor(self.tma_atom)
            with cute.arch.elect_one():
                for stage in cutlass.range_constexpr(self.cfg.stages):
                    cute.arch.mbarrier_init(self.full + stage, 1)
                cute.arch.mbarrier_init_fence()

    @cute.jit
    def stage_page_table(self, mPT: cute.Tensor, mErr: cute.Tensor, tree: ReductionTree, steps: CtaSteps,
                         pt_guess: Int32, cta: CtaPlace):
        """Every thread, before the PDL wait: this CTA's page-table entries -> sPT[0 ..
        min(steps.count * pages_per_step, page_table_max)) (one latency, not one per step), each
        the physical page or -1 past the last page or where invalid (error bit 2; _pt_entry). A
        wide CTA takes them from the guess (Attn2Sm90.load_page_table_guesses) of the first warp
        whose 32 entries cover them (that warp's lanes store), else every thread loads its share
        from the page table. No barrier: the caller's CTA barrier publishes sPT before prologue /
        the main loop read it."""
        pages_per_step = self.cfg.pages_per_step
        page_base = steps.page_base
        sPT = self.sPT
        width = mPT.shape[1]
        n_pt = cutlass.min(steps.count * pages_per_step, Int32(self.cfg.page_table_max))
        guess_warp = Int32(-1)
        if const_expr(self.cfg.wide):
            for guess in cutlass.range_constexpr(THREADS // 32 - 1, -1, -1):   # a guess per warp
                off = page_base - (guess + 1) * cta.split * pages_per_step
                if Int32(off >= 0) * Int32(off + n_pt <= 32) != 0:
                    guess_warp = Int32(guess)
        if guess_warp >= 0:
            if cta.warp == guess_warp:
                d = page_base - (cta.warp + 1) * cta.split * pages_per_step
                phys = cute.arch.shuffle_sync(pt_guess, cutlass.min(cta.lane + d, Int32(31)))
                if cta.lane < n_pt:
                    sPT[cta.lane] = _pt_entry(page_base + cta.lane, phys, tree.last_page, width, self.num_pages, mErr)
        else:
            for it in cutlass.range((n_pt + THREADS - 1) // THREADS, unroll=1):
                i_pt = it * THREADS + cta.tidx
                if i_pt < n_pt:
                    lp = page_base + i_pt
                    phys = mPT[cta.request, cutlass.min(lp, width - 1)]
                    sPT[i_pt] = _pt_entry(lp, phys, tree.last_page, width, self.num_pages, mErr)

    @cute.jit
    def load_step(self, k: Int32, stage: Int32):
        """Warp 0: TMA the K and V halves of the pages_per_step pages of local step k into ring
        stage `stage`, one (16, 64) box each, completing on full[stage]; a page sPT marks -1 is
        read at page index num_pages (zero-filled)."""
        pages_per_step = self.cfg.pages_per_step
        value_bytes = 1 if self.cfg.fp8 else 2
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(self.full + stage,
                                                    pages_per_step * 2 * PAGE_SIZE * HEAD_DIM * value_bytes)
        for p in cutlass.range_constexpr(pages_per_step):
            phys = self.sPT[cutlass.min(k * pages_per_step + p, Int32(self.cfg.page_table_max - 1))]
            src = phys
            if phys < 0:
                src = self.num_pages
            # the FP8 staging ring is (pages_per_step, stages) (staging_layout): its coordinate
            # names the place its index would, without CuTe dividing the index back into it (an
            # 8-bit div/mod a page in warp 0's refill)
            page = (p, stage) if const_expr(self.cfg.fp8) else stage * pages_per_step + p
            cute.copy(self.tma_atom, self.tKVg[None, 0, 0, self.kv_head, src], self.tKs[None, page],
                      tma_bar_ptr=self.full + stage)
            if const_expr(not self.cfg.page_box):   # (page_box: the box above held the whole page)
                cute.copy(self.tma_atom, self.tKVg[None, 0, 1, self.kv_head, src], self.tVs[None, page],
                          tma_bar_ptr=self.full + stage)

    @cute.jit
    def prologue(self, n_steps: Int32, unwritten: Int32, before_wait: cutlass.Constexpr[bool]):
        """Warp 0: the ring prologue, steps 0 .. steps_ahead - 1 (those < n_steps; steps_ahead is
        stages - 1, fp8 stages), step k into stage k; needs sPT published. With cfg.early_ring the
        call before the PDL wait (before_wait) issues the steps < unwritten
        (ReductionTree.unwritten_steps: no row the predecessor may write) and the call after it
        the rest; without it unwritten is 0, and the call after the wait issues them all."""
        if self.warp == 0:
            for k0 in cutlass.range_constexpr(self.cfg.steps_ahead):
                if k0 < n_steps:
                    if Int32(k0 < unwritten) == Int32(before_wait):
                        self.load_step(Int32(k0), Int32(k0))

    @cute.jit
    def refill(self, k_next: Int32, n_steps: Int32):
        """Warp cfg.refill_warp (-1: each step's in turn, Attn2Config.refill_warp), in step k after
        the step's CTA barrier: ring step k_next = k + steps_ahead, if the CTA has it (< n_steps),
        into its stage (bf16: the one step k - 1 read, which every warp is done with; fp8, after
        ready's barrier: the one step k was converted from). The barrier orders it after every
        warp's use of the stage, so any warp may issue it."""
        owner = Int32(self.cfg.refill_warp)
        if const_expr(self.cfg.refill_warp < 0):
            first = 1 if self.cfg.q_len == 1 else 0     # decode: warp 0 runs the softmax alone
            owner = first + k_next % (THREADS // 32 - first)
        if self.warp == owner:
            if k_next < n_steps:
                self.load_step(k_next, k_next % self.cfg.stages)

    @cute.jit
    def invalid_pages(self, k: Int32, inv: cute.Tensor):
        """inv[p] = 1 where page p of step k has no valid page (sPT -1), else 0."""
        pages_per_step = self.cfg.pages_per_step
        for p in cutlass.range_constexpr(pages_per_step):
            inv[p] = Int32(self.sPT[cutlass.min(k * pages_per_step + p, Int32(self.cfg.page_table_max - 1))] < 0)

    @cute.jit
    def ready(self, k: Int32, stage: Int32, tail_lo: Int32, tail_hi: Int32):
        """Every thread, in step k: wait until the stage of step k landed, then zero its tail rows
        (zero_tail_rows). Afterwards sK / sV[.., stage] hold the step's K and V for the wgmmas.
        fp8 (after the step's CTA barrier: no wgmma reads the step buffer any more): wait, convert
        the stage into the step buffer sK / sV[.., 0] (convert), then a proxy fence and a CTA
        barrier; afterwards the stage may be refilled."""
        cute.arch.mbarrier_wait(self.full + stage, (k // self.cfg.stages) % 2)
        if const_expr(self.cfg.fp8):
            self.convert(k, stage, tail_lo)
            cute.arch.fence_view_async_shared()    # generic stores -> the wgmmas (async proxy)
            cute.arch.sync_threads()
        else:
            self.zero_tail_rows(stage, k, tail_lo, tail_hi)

    @cute.jit
    def convert(self, k: Int32, stage: Int32, tail_lo: Int32):
        """fp8, every thread, step k (its staging stage landed): its 2 pages_per_step chunks of 8
        e4m3 bytes -> f16 in sK / sV, exact, NaN bytes included (e4m3x4_to_f16x4: 4 cvt a chunk).
        Chunk tidx + THREADS i is bytes 8 (tidx + THREADS i) of the stage (a warp reads 256
        contiguous bytes), i.e. K (i < pages_per_step, else V), row tidx // 8 + 16 (i %
        pages_per_step) of the step, columns 8 (tidx % 8) ..; it becomes the row's 16-byte f16
        piece tidx % 8 (a quarter warp stores the 8 pieces of one row: no bank conflict, whatever
        the swizzle), 16 rows apart from the thread's other pieces of the half (the same row % 8, so
        the same swizzle: one address, dst16, plus constants). V rows >= L (row >= tail_lo - k
        keys_per_step) are written as zeros instead: the cache may hold anything there (0 * NaN =
        NaN), and their logits are masked in StepMask."""
        keys_per_step = self.cfg.keys_per_step
        per_half = self.cfg.pages_per_step          # chunks of a thread per K (or V) half of a step
        src = self.src8 + stage * (2 * keys_per_step * HEAD_DIM)
        v_rows = tail_lo - k * keys_per_step          # V rows of the step below L
        row0 = self.tidx // 8
        # All loads first, then the conversions and stores: ptxas cannot prove that a chunk's
        # store does not alias the next chunk's load, so an interleaved loop issues each load only
        # after the previous store, a chain of shared-memory latencies (RESULTS, forty-first
        # session). A V word of a row >= L is masked to zero, the same bits as not loading it; an
        # AND in every step, which measured faster than a branch to the masks on the tail step.
        words = cute.make_rmem_tensor(cute.make_layout(4 * per_half), Uint32)
        if const_expr(self.cfg.page_box):
            # every chunk of this thread is K (tidx % 16 < 8) or every one V; row of chunk i:
            # tidx // 16 + 8 (i % 2) + 16 (i // 2) (KVRing.create)
            row0 = self.tidx // 16
            is_k = Int32((self.tidx // 8) % 2 == 0)
        for i in cutlass.range_constexpr(2 * per_half):
            w0, w1 = ld_shared_v2_b32(src, i * THREADS * 8)
            if const_expr(self.cfg.page_box):
                keep = Uint32(0) - Uint32((row0 + 8 * (i % 2) + 16 * (i // 2) < v_rows) | (is_k != 0))
                w0, w1 = w0 & keep, w1 & keep
            elif const_expr(i >= per_half):
                keep = Uint32(0) - Uint32(row0 + 16 * (i % per_half) < v_rows)
                w0, w1 = w0 & keep, w1 & keep
            words[2 * i] = w0
            words[2 * i + 1] = w1
        for i in cutlass.range_constexpr(2 * per_half):
            b0, b1 = e4m3x4_to_f16x4(words[2 * i])
            b2, b3 = e4m3x4_to_f16x4(words[2 * i + 1])
            if const_expr(self.cfg.page_box):
                offset = (8 * (i % 2) + 16 * (i // 2)) * HEAD_DIM * 2
            else:
                offset = (i // per_half) * keys_per_step * HEAD_DIM * 2 + (i % per_half) * 16 * HEAD_DIM * 2
            st_shared_v4_b32(self.dst16, offset, b0, b1, b2, b3)

    @cute.jit
    def zero_tail_rows(self, stage: Int32, k: Int32, tail_lo: Int32, tail_hi: Int32):
        """Step k, after its stage landed: the tail page's V rows >= L (rows [tail_lo, tail_hi) of
        the CTA's steps) zeroed in smem (the cache holds anything there, and 0 * NaN = NaN; their
        logits are masked in StepMask), then a proxy fence and a CTA barrier (every thread) before
        the P V wgmma reads them. Only on the step that holds rows >= L."""
        keys_per_step = self.cfg.keys_per_step
        r_lo = tail_lo - k * keys_per_step
        if r_lo < keys_per_step:
            n_z = (cutlass.min(tail_hi - k * keys_per_step, Int32(keys_per_step)) - r_lo) * 8
            if self.tidx < n_z:
                zv = cute.make_rmem_tensor(cute.make_layout((1, 8)), BFloat16)
                zv.fill(0.0)
                cute.autovec_copy(zv, cute.local_tile(self.sV[None, None, stage], (1, 8),
                                                      (r_lo + self.tidx // 8, self.tidx % 8)))
            cute.arch.fence_view_async_shared()
            cute.arch.sync_threads()

    @cute.jit
    def merge_buffer(self) -> cute.Tensor:
        """After the main loop (and a CTA barrier: no wgmma reads the ring any more): the ring's
        bytes as the fp32 [64, 64] merge buffer sX, over the K ring and, when that is smaller than
        16 KB, the V ring allocated right after it (both 1 KB multiples; Attn2Config.create checks
        the size)."""
        return cute.make_tensor(cute.recast_ptr(self.sK.iterator, dtype=Float32),
                                cute.make_layout((M_TILE, HEAD_DIM), stride=(HEAD_DIM, 1)))


@dataclass(frozen=True)
class StepMask:
    """The masks of a step's logits (causal, window, tail, invalid pages). Token t sees keys
    [lo_t, pos_t]; every row of the CTA sees [lo_all, pos0]. A thread's rows (wgmma C layout)
    are 16 warp + lane // 4 + 8 h, h = 0, 1, i.e. tokens t0 = 2 warp and t1 = 2 warp + 1 (rows >=
    q_len * 8 are zero padding of q_len 1 and mirror its last token)."""
    pos0: Int32          # position of token 0: L - q_len
    lo_all: Int32        # first key every row sees (window), or 0
    t0: Int32
    t1: Int32
    cfg: Attn2Config

    @staticmethod
    def create(cfg: Attn2Config, L: Int32, warp: Int32) -> "StepMask":
        pos0 = L - cfg.q_len
        lo_all = Int32(0)
        if const_expr(cfg.window > 0):
            lo_all = cutlass.max(L - cfg.window, Int32(0))
        t0 = cutlass.min(2 * warp, Int32(cfg.q_len - 1))
        t1 = cutlass.min(2 * warp + 1, Int32(cfg.q_len - 1))
        return StepMask(pos0, lo_all, t0, t1, cfg)

    @cute.jit
    def apply(self, tSrS: cute.Tensor, tScS: cute.Tensor, inv: cute.Tensor, kbase: Int32):
        """The step's logits tSrS (keys [kbase, kbase + keys_per_step)) masked to -inf, on edge
        steps only: a step whose keys all lie in every row's visible range and whose pages are all
        valid (inv, 1 per invalid page) is left as is. Value i of the C layout is in column
        8 (i // 4) + .., so in page i // S_PER_PAGE."""
        keys_per_step, pages_per_step, window = self.cfg.keys_per_step, self.cfg.pages_per_step, self.cfg.window
        edge = Int32(kbase < self.lo_all + self.cfg.q_len) + Int32(kbase + keys_per_step - 1 > self.pos0)
        for p in cutlass.range_constexpr(pages_per_step):
            edge = edge + inv[p]
        if edge != 0:
            for p in cutlass.range_constexpr(pages_per_step):     # per page: see S_PER_PAGE
                for v in cutlass.range_constexpr(S_PER_PAGE):
                    i = S_PER_PAGE * p + v
                    key = kbase + tScS[i][1]
                    tt = self.t0
                    if const_expr((i // 2) % 2 == 1):
                        tt = self.t1
                    pos = self.pos0 + tt
                    msk = Int32(key > pos) + inv[p]
                    if const_expr(window > 0):
                        msk = msk + Int32(key < pos - window + 1)
                    if msk != 0:
                        tSrS[i] = -math.inf


@dataclass(frozen=True)
class SoftmaxPartial:
    """A softmax partial (O, m, l) of the CTA's 64 rows in the wgmma C layout: O the (64, 64)
    accumulator fragment, m and l those of the thread's rows h = 0 (lane // 4) and 1 (lane // 4 + 8)
    of its warp's 16. m is in log2 units, kept scaled (scale * log2 e > 0, so max commutes with it).
    The running chunk keeps l per lane (summed over the quad when folded or written); the second
    accumulator's l is summed."""
    o: cute.Tensor       # fp32, wgmma C fragment of (M_TILE, HEAD_DIM)
    m: cute.Tensor       # fp32 (2,)
    l: cute.Tensor       # fp32 (2,)

    @cute.jit
    def update(self, tSrS: cute.Tensor, corr: cute.Tensor, scale_log2: Float32):
        """Online softmax (base 2) of one step: the logits tSrS become p, m / l move, and O is
        rescaled by corr where a row max of the warp moved. p = ex2(fma(s, scale_log2, -m)): one
        FFMA + MUFU per logit. The running max is lazy: it moves only when a logit exceeds it by
        more than RESCALE_SLACK (so p <= 2^8, exact in fp32 and bf16 range), and O is rescaled
        only when a row max of the warp moved (x * 1.0 == x, so skipping is exact). Softmax is
        invariant to the reference point, so only rounding depends on the rule, and the rule
        depends on the data alone (bits stay deterministic). m starts at -1e30 (finite), so fully
        masked tiles need no branch."""
        pages_per_step = cute.size(tSrS) // S_PER_PAGE
        row_max, row_sum, tOrO = self.m, self.l, self.o
        moved = Int32(0)
        for h in cutlass.range_constexpr(2):
            mx = tSrS[2 * h]
            for p in cutlass.range_constexpr(pages_per_step):     # per page: see S_PER_PAGE
                for v in cutlass.range_constexpr(S_PER_PAGE):
                    i = S_PER_PAGE * p + v
                    if const_expr((i // 2) % 2 == h and i != 2 * h):
                        mx = cute.arch.fmax(mx, tSrS[i])
            mx = quad_max(mx) * scale_log2
            m_old = row_max[h]
            m_new = m_old
            if mx > m_old + RESCALE_SLACK:
                m_new = mx
            moved = moved + Int32(m_new != m_old)
            corr[h] = cute.math.exp2(m_old - m_new, fastmath=True)
            row_max[h] = m_new
            neg_m = -m_new
            psum = Float32(0.0)
            for p in cutlass.range_constexpr(pages_per_step):
                for v in cutlass.range_constexpr(S_PER_PAGE):
                    i = S_PER_PAGE * p + v
                    if const_expr((i // 2) % 2 == h):
                        p_i = cute.math.exp2(cute.math.fma(tSrS[i], scale_log2, neg_m), fastmath=True)
                        tSrS[i] = p_i
                        psum = psum + p_i
            row_sum[h] = row_sum[h] * corr[h] + psum
        if cute.arch.vote_any_sync(moved != 0):
            for i in cutlass.range_constexpr(cute.size(tOrO)):
                tOrO[i] = tOrO[i] * corr[(i // 2) % 2]

    @cute.jit
    def fold_in(self, chunk: "SoftmaxPartial", fw: cute.Tensor):
        """The second accumulator (self), at the last step of a chunk (after its P V wgmma was
        waited for): self <- fold(self, chunk), then the chunk restarts from I. The same _fold_w /
        _fold_v as a wide cluster's DSMEM fold, so the bits match. fw: fp32 (2, 2) scratch."""
        acc_o, acc_m, acc_l = self.o, self.m, self.l
        tOrO, row_max, row_sum = chunk.o, chunk.m, chunk.l
        for h in cutlass.range_constexpr(2):
            l_chunk = quad_sum(row_sum[h])
            m_new, fw[h, 0], fw[h, 1] = _fold_w(acc_m[h], row_max[h])
            acc_l[h] = _fold_v(acc_l[h], fw[h, 0], l_chunk, fw[h, 1])
            acc_m[h] = m_new
            row_max[h] = NEG_BIG
            row_sum[h] = 0.0
        for i in cutlass.range_constexpr(cute.size(tOrO)):
            acc_o[i] = _fold_v(acc_o[i], fw[(i // 2) % 2, 0], tOrO[i], fw[(i // 2) % 2, 1])
            tOrO[i] = 0.0


@dataclass(frozen=True)
class MergeRows:
    """The rows a CTA merges and writes: the rows_per_rank rows of its cluster rank, each over
    threads_per_row consecutive threads of columns_per_thread columns (threads past them,
    active = 0, compute a duplicate of a clamped row and write nothing)."""
    active: Int32        # 1 where this thread's row is one of the rank's rows
    row: Int32           # row m = token * 8 + head of the accumulators (clamped to rows - 1)
    col0: Int32          # this thread's first column of the row
    out_row: Int32       # the row's row of y and out
    out_col: Int32       # this thread's first column of out (and, shifted, of the gate in y)
    tidx: Int32
    threads_per_row: int
    columns_per_thread: int

    @cute.jit
    def tile(self, gRows: cute.Tensor) -> cute.Tensor:
        """This thread's columns of its row of a (rows, 64) tensor."""
        return cute.local_tile(gRows, (1, self.columns_per_thread),
                               (self.row, self.tidx % self.threads_per_row))[0, None]

    @cute.jit
    def load_gate(self, mY: cute.Tensor, kv_heads: Int32) -> cute.Tensor:
        """This thread's columns_per_thread gate values (bf16, from y) of its row, into registers."""
        columns_per_thread = self.columns_per_thread
        gate_col = (GROUP + 2) * HEAD_DIM * kv_heads + self.out_col
        gate = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), BFloat16)
        cute.autovec_copy(cute.local_tile(mY, (1, columns_per_thread),
                                          (self.out_row, gate_col // columns_per_thread))[0, None], gate)
        return gate

    @cute.jit
    def write_out(self, mOut: cute.Tensor, gate: cute.Tensor, o: cute.Tensor, l: Float32,
                  v_scale: Float32 | None = None):
        """The single writer of these rows, every thread: o / l, norm, gate, out (_epilogue: o =
        bf16(O * rcp(l)); the sum of squares in one fixed tree whatever the layout; rsqrt.approx;
        sigmoid = rcp(1 + ex2(-g log2 e)); out = bf16(o * rs * sig)). The threads_per_row lanes of
        a row reduce by butterfly, inactive lanes compute a duplicate. An FP8 cache's value scale
        joins the normalisation: o = bf16(O * (v_scale * rcp(l)))."""
        inv_l = cute.arch.rcp_approx(l)
        if const_expr(v_scale is not None):
            inv_l = mul_rn(v_scale, inv_l)
        for c in cutlass.range_constexpr(self.columns_per_thread):
            o[c] = o[c] * inv_l
        _epilogue(o, gate, mOut, self.out_row, self.out_col, self.active, self.columns_per_thread,
                  self.threads_per_row)


@dataclass(frozen=True)
class WorkspaceMerge:
    """Level 2 of the merge (more than one cluster): the partials of a (request, KV head) in the
    workspace and the ticket of this CTA's rank. Workspace: fp32 O [R * Hkv * slots, rows, 64] and
    (m, l) [R * Hkv * slots, rows, 2] (attn2_plan.workspace_layout), slot = cluster; the uint32
    counters count back from the end of the workspace, one per (request, KV head, rank), so their
    places do not move with R and one zeroed workspace serves calls of any batch size (the last
    arriver resets its counter to 0)."""
    gWO: cute.Tensor
    gWM: cute.Tensor
    cnt_ptr: cute.Pointer    # this rank's arrival counter
    slot0: Int32             # the pair's first slot
    rows: MergeRows
    tree: ReductionTree
    cfg: Attn2Config

    @staticmethod
    def create(cfg: Attn2Config, mWs: cute.Tensor, rows: MergeRows, tree: ReductionTree,
               cta: CtaPlace) -> "WorkspaceMerge":
        query_rows = cfg.query_rows
        nslot = cta.num_requests * cta.kv_heads * cfg.slots
        wsf = cute.recast_ptr(mWs.iterator, dtype=Float32)
        gWO = cute.make_tensor(wsf, cute.make_layout((nslot, query_rows, HEAD_DIM),
                                                     stride=(query_rows * HEAD_DIM, HEAD_DIM, 1)))
        gWM = cute.make_tensor(wsf + nslot * query_rows * HEAD_DIM,
                               cute.make_layout((nslot, query_rows, 2), stride=(query_rows * 2, 2, 1)))
        n_words = mWs.shape[0] // 4
        cnt_ptr = cute.recast_ptr(mWs.iterator, dtype=Uint32) + \
            (n_words - 1 - ((cta.request * cta.kv_heads + cta.kv_head) * SUB_CHUNKS + tree.rank))
        slot0 = (cta.request * cta.kv_heads + cta.kv_head) * cfg.slots
        return WorkspaceMerge(gWO, gWM, cnt_ptr, slot0, rows, tree, cfg)

    @cute.jit
    def merge(self, sFlag: cute.Tensor, m_merged: Float32, l_merged: Float32, o_merged: cute.Tensor,
              o_node: cute.Tensor):
        """Every thread: my partial (node, or sub when wide) of my rows -> slot `cluster`; a ticket
        per (request, KV head, rank); the last arriving cluster's CTA of this rank resets the
        counter and merges the partials of its rows (fold). Returns (writes_out, l): writes_out = 1
        in that CTA only (then o_merged and l hold the merged rows), 0 elsewhere. Uses sFlag and
        two CTA barriers."""
        rows, tree, gWM, slot0 = self.rows, self.tree, self.gWM, self.slot0
        if rows.active != 0:
            cute.autovec_copy(o_merged, rows.tile(self.gWO[slot0 + tree.cluster, None, None]))
            if rows.tidx % rows.threads_per_row == 0:
                gWM[slot0 + tree.cluster, rows.row, 0] = m_merged
                gWM[slot0 + tree.cluster, rows.row, 1] = l_merged
        # one release, the ticket's: an acq_rel atomic by one thread after the barrier is
        # cumulative over the CTA's writes that the barrier ordered before it (as CUTLASS's
        # barrier arrive); SASS: MEMBAR.GPU, ATOMG, CCTL.IVALL. A fence.acq_rel before it would
        # add a second MEMBAR.GPU, and a fence in every thread a membar stall in every thread
        cute.arch.sync_threads()
        if rows.tidx == 0:
            old = cute.arch.atomic_add(self.cnt_ptr, Uint32(1), sem="acq_rel", scope="gpu")
            last = Int32(old == Uint32(tree.n_clusters - 1))
            sFlag[0] = last
            if last != 0:
                cute.arch.atomic_exch(self.cnt_ptr, Uint32(0), sem="relaxed", scope="gpu")
        cute.arch.sync_threads()     # the ticket's acquire (thread 0) -> every thread
        writes_out = sFlag[0]
        if writes_out != 0:
            l_merged = self.fold(o_merged, o_node)
        return writes_out, l_merged

    def groups(self):
        """(partials per node, nodes per group of loads) of fold: compile-time ints."""
        partials_per_node = 2 if self.cfg.wide else 1
        nodes_per_group = max(1, min(self.cfg.nodes_max, 32 // (self.rows.columns_per_thread * partials_per_node)))
        return partials_per_node, nodes_per_group

    @cute.jit
    def fold(self, o_merged: cute.Tensor, o_node: cute.Tensor) -> Float32:
        """The last arriving CTA of a rank, every thread: the flat sum of the nodes of its rows
        from the slots slot0 .. slot0 + n_clusters, into o_merged; returns l. Pass 1: M = the
        largest node max = the largest partial max (max is exact); pass 2: the nodes in order,
        each weighted ex2(m - M) (add_node); a wide merge first folds each node from its two subs
        as a deep pair does. Loads go in groups of nodes_per_group nodes (indices clamped),
        independent of the folds, so their latencies overlap."""
        partials_per_node, nodes_per_group = self.groups()
        nodes_max = self.cfg.nodes_max
        tree = self.tree
        # pass 1; with one group of nodes, M comes from pass 2's loads instead
        m_loads = cute.make_rmem_tensor(cute.make_layout(min(self.cfg.max_clusters, 8)), Float32)
        m_top = Float32(NEG_BIG)
        m_top = self.largest_max(m_loads, m_top)
        # pass 2
        l_merged = Float32(0.0)
        o_merged.fill(0.0)
        columns_per_thread = self.rows.columns_per_thread
        o_loads = cute.make_rmem_tensor(cute.make_layout((columns_per_thread, partials_per_node, nodes_per_group),
                                                         stride=(1, columns_per_thread,
                                                                 columns_per_thread * partials_per_node)), Float32)
        ml_loads = cute.make_rmem_tensor(cute.make_layout((2, partials_per_node, nodes_per_group),
                                                          stride=(1, 2, 2 * partials_per_node)), Float32)
        for group0 in cutlass.range_constexpr(0, nodes_max, nodes_per_group):
            if group0 < tree.n_nodes:
                self.load_node_group(o_loads, ml_loads, group0)
                if const_expr(group0 == 0):
                    m_top = self.max_of_first_group(ml_loads, m_top)
                for u in cutlass.range_constexpr(min(nodes_per_group, nodes_max - group0)):
                    if group0 + u < tree.n_nodes:
                        l_merged = self.add_node(ml_loads, o_loads, u, group0 + u, m_top, l_merged,
                                                 o_merged, o_node)
        return l_merged

    @cute.jit
    def largest_max(self, m_loads: cute.Tensor, m_top: Float32) -> Float32:
        """Pass 1 of fold, when the nodes span more than one group of loads: the largest partial
        max of my row over the n_clusters slots, loaded in independent groups (indices clamped: a
        repeat leaves the max as is). Returns m_top (unchanged otherwise)."""
        max_clusters = self.cfg.max_clusters
        maxes_per_group = min(max_clusters, 8)
        tree = self.tree
        if tree.n_nodes > self.groups()[1]:
            for group0 in cutlass.range_constexpr(0, max_clusters, maxes_per_group):
                if group0 < tree.n_clusters:
                    for u in cutlass.range_constexpr(maxes_per_group):
                        m_loads[u] = self.gWM[self.slot0 + cutlass.min(Int32(group0 + u), tree.n_clusters - 1),
                                              self.rows.row, 0]
                    for u in cutlass.range_constexpr(maxes_per_group):
                        m_top = cute.arch.fmax(m_top, m_loads[u])
        return m_top

    @cute.jit
    def load_node_group(self, o_loads: cute.Tensor, ml_loads: cute.Tensor, group0: cutlass.Constexpr[int]):
        """Pass 2 of fold: the partials (m, l, O of my row and columns) of the nodes group0 ..
        group0 + nodes_per_group into ml_loads / o_loads (slot indices clamped)."""
        partials_per_node, nodes_per_group = self.groups()
        for u in cutlass.range_constexpr(nodes_per_group):
            for e in cutlass.range_constexpr(partials_per_node):
                slot = cutlass.min(Int32((group0 + u) * partials_per_node + e), self.tree.n_clusters - 1)
                ml_loads[0, e, u] = self.gWM[self.slot0 + slot, self.rows.row, 0]
                ml_loads[1, e, u] = self.gWM[self.slot0 + slot, self.rows.row, 1]
                cute.autovec_copy(self.rows.tile(self.gWO[self.slot0 + slot, None, None]), o_loads[None, e, u])

    @cute.jit
    def max_of_first_group(self, ml_loads: cute.Tensor, m_top: Float32) -> Float32:
        """Pass 1 of fold when one group of loads covers every partial: M from pass 2's first
        loads. Returns m_top (unchanged otherwise)."""
        partials_per_node, nodes_per_group = self.groups()
        if self.tree.n_nodes <= nodes_per_group:
            for u in cutlass.range_constexpr(nodes_per_group):
                for e in cutlass.range_constexpr(partials_per_node):
                    m_top = cute.arch.fmax(m_top, ml_loads[0, e, u])
        return m_top

    @cute.jit
    def add_node(self, ml_loads: cute.Tensor, o_loads: cute.Tensor, u: cutlass.Constexpr[int],
                 node: cutlass.Constexpr[int], m_top: Float32, l_merged: Float32,
                 o_merged: cute.Tensor, o_node: cute.Tensor) -> Float32:
        """Pass 2 of fold for node `node`, whose partials are loads u: the node (wide: folded from
        its two subs, a missing second sub being I) into o_node, then added to (o_merged, l) with
        weight ex2(m - m_top), or taken as is when it is the only node. Returns l."""
        columns_per_thread = self.rows.columns_per_thread
        m_n = ml_loads[0, 0, u]
        l_n = ml_loads[1, 0, u]
        for c in cutlass.range_constexpr(columns_per_thread):
            o_node[c] = o_loads[c, 0, u]
        if const_expr(self.cfg.wide):
            if 2 * node + 1 >= self.tree.n_subs:   # the node's second sub is I
                ml_loads[0, 1, u] = NEG_BIG
                ml_loads[1, 1, u] = 0.0
                for c in cutlass.range_constexpr(columns_per_thread):
                    o_loads[c, 1, u] = 0.0
            m_n, l_n = _node_into(o_node, ml_loads[0, 0, u], ml_loads[1, 0, u], o_loads[None, 0, u],
                                  ml_loads[0, 1, u], ml_loads[1, 1, u], o_loads[None, 1, u])
        if self.tree.n_nodes == 1:      # wide only: the node is the whole row
            l_merged = l_n
            for c in cutlass.range_constexpr(columns_per_thread):
                o_merged[c] = o_node[c]
        else:
            f = cute.math.exp2(sub_rn(m_n, m_top), fastmath=True)
            l_merged = fma_rn(l_n, f, l_merged)
            for c in cutlass.range_constexpr(columns_per_thread):
                o_merged[c] = fma_rn(o_node[c], f, o_merged[c])
        return l_merged


class Attn2Sm90:
    """One variant of the attn2 kernel (see the module docstring)."""

    def __init__(self, cfg: Attn2Config):
        self.cfg = cfg
        self.q_len = cfg.q_len
        self.rows = cfg.query_rows                  # real query rows: q_len * 8 of the M_TILE
        self.pages_per_step = cfg.pages_per_step
        self.keys_per_step = cfg.keys_per_step      # 16 * pages_per_step: the N of S = Q K^T
        self.stages = cfg.stages                    # KV ring stages
        # the wgmmas' operand type: bf16, or f16 over an FP8 cache (e4m3 converts exactly to f16 in
        # one cvt per two values; to bf16 it takes about 3 instructions a byte: ptx.e4m3x4_to_f16x4)
        self.mma_dtype = Float16 if cfg.fp8 else BFloat16
        self.mma_kind = "f16" if cfg.fp8 else "bf16"    # its PTX name (ptx.pack_x2)
        self.wide = cfg.wide                        # layout: a CTA per chunk (else per sub)
        self.cluster_size = cfg.cluster_size
        # the CTA folds its chunks in a second accumulator; a one-chunk CTA needs none, since
        # fold(I, X) = X exactly (weights ex2(-1e30 - m) = 0 and ex2(0) = 1, fma(0, 0, x) = x)
        self.second_accumulator = cfg.chunks_per_cta > 1
        self.rows_per_rank = cfg.rows_per_rank      # rows each cluster rank merges and writes
        self.threads_per_row = min(16, THREADS // self.rows_per_rank)   # in the merges / epilogue
        self.columns_per_thread = HEAD_DIM // self.threads_per_row
        # _sum_of_squares: whole leaves per thread, a power-of-two count of them
        assert self.columns_per_thread % SS_LEAF == 0 and (self.columns_per_thread // SS_LEAF) in (1, 2, 4, 8, 16)
        self.page_table_max = cfg.page_table_max    # page-table entries of a CTA in smem

    @cute.jit
    def __call__(self, mY: cute.Tensor,       # bf16 [q_len*R, N]
                 mCache: cute.Tensor,         # bf16 [pages, Hkv, 16, 128]
                 mPT: cute.Tensor,            # int32 [R, max_pages]
                 mSeq: cute.Tensor,           # int32 [R]
                 mOut: cute.Tensor,           # bf16 [q_len*R, Hq*64]
                 mWs: cute.Tensor,            # uint8 [bytes]
                 mErr: cute.Tensor,           # int32 [1]
                 mKScale: cute.Tensor | None,  # fp32 [1] or [Hkv] (an FP8 cache), else None
                 mVScale: cute.Tensor | None,
                 scale: Float32, max_seq_len: Int32, wave_ctas: Int32,
                 stream: cuda.CUstream):
        num_requests = mSeq.shape[0]
        kv_heads = mCache.shape[1]
        # K and V rings and Q: rows of 64 16-bit values (128 B) in the 128 B swizzle, the canonical
        # K-major wgmma layout; V read through a transposed view is the MN-major B of P V
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, self.mma_dtype)
        sRing_layout = cute.tile_to_shape(atom, (self.keys_per_step, HEAD_DIM, self.cfg.mma_stages), (0, 1, 2))
        if const_expr(self.cfg.fp8):
            # e4m3 pages land unswizzled in the staging ring (KVRing.staging_layout)
            sPages_layout = KVRing.staging_layout(self.cfg)
        else:
            sPages_layout = cute.tile_to_shape(atom, (PAGE_SIZE, HEAD_DIM, self.pages_per_step * self.stages),
                                               (0, 1, 2))
        sQ_layout = cute.tile_to_shape(atom, (M_TILE, HEAD_DIM), (0, 1))
        tma_atom, mKV_tma = KVRing.make_tma(mCache, sPages_layout, self.cfg.box_columns)
        occ = {}
        if const_expr(self.cfg.min_blocks > 0):
            occ = dict(min_blocks_per_mp=self.cfg.min_blocks, preferred_smem_carveout=100)
        if const_expr(self.cluster_size > 1):
            occ["cluster"] = (self.cluster_size, 1, 1)
        self.kernel(mY, mPT, mSeq, mOut, mWs, mErr, mKScale, mVScale, tma_atom, mKV_tma, sRing_layout, sPages_layout,
                    sQ_layout, mCache.shape[0], scale * LOG2E, max_seq_len, wave_ctas).launch(
            grid=(self.cluster_size, kv_heads * num_requests, self.cfg.max_clusters), block=(THREADS, 1, 1),
            stream=stream, use_pdl=self.cfg.pdl, **occ)

    @cute.kernel
    def kernel(self, mY: cute.Tensor, mPT: cute.Tensor, mSeq: cute.Tensor,
               mOut: cute.Tensor, mWs: cute.Tensor, mErr: cute.Tensor,
               mKScale: cute.Tensor | None, mVScale: cute.Tensor | None,
               tma_atom: cute.CopyAtom, mKV_tma: cute.Tensor, sRing_layout: cute.ComposedLayout,
               sPages_layout, sQ_layout: cute.ComposedLayout,
               num_pages: Int32, scale_log2: Float32, max_seq_len: Int32, wave_ctas: Int32):
        """One CTA (CtaPlace): split `split` of the reduction tree of (request, KV head), every
        query row of the pair (q_len * 8 rows, row m = token * 8 + head, zero-padded to the wgmma
        M of 64; warp w holds rows 16 w .. 16 w + 15 of the accumulators). Every thread calls
        every phase; a phase's docstring says which threads act. A CTA of a live cluster reaches
        both cluster barriers (merge_cluster and the final wait) whatever its steps; a CTA of an
        idle cluster (beyond the request's subs or nodes) or of a bad length exits before either,
        and so does the rest of its cluster (same request, same cluster index)."""
        cta = CtaPlace.create(mSeq, mKV_tma, self.cluster_size)

        # ---- shared memory
        smem = SmemAllocator()
        full = smem.allocate_array(Int64, self.stages, byte_alignment=8)   # one mbarrier per ring stage
        sK = smem.allocate_tensor(self.mma_dtype, sRing_layout.outer, byte_alignment=1024, swizzle=sRing_layout.inner)
        sV = smem.allocate_tensor(self.mma_dtype, sRing_layout.outer, byte_alignment=1024, swizzle=sRing_layout.inner)
        sQ = smem.allocate_tensor(self.mma_dtype, sQ_layout.outer, byte_alignment=1024, swizzle=sQ_layout.inner)
        s8 = None
        sQmax = None
        if const_expr(self.cfg.fp8):   # the e4m3 staging ring (KVRing); sK / sV above are its f16 step buffer
            s8 = smem.allocate_tensor(Float8E4M3FN, cute.make_layout(self.cfg.staging_bytes), byte_alignment=1024)
            sQmax = smem.allocate_tensor(Float32, cute.make_layout(THREADS // 32), byte_alignment=16)
        sPT = smem.allocate_tensor(Int32, cute.make_layout(self.page_table_max), byte_alignment=16)
        sFlag = smem.allocate_tensor(Int32, cute.make_layout(4), byte_alignment=16)
        sXm = smem.allocate_tensor(Float32, cute.make_layout((self.rows, 2), stride=(2, 1)), byte_alignment=16)
        if const_expr(self.cfg.smem_pad > 0):   # never touched: it caps the CTAs an SM holds (occupancy_cap)
            smem.allocate_array(Uint32, self.cfg.smem_pad // 4, byte_alignment=16)
        ring = KVRing.create(self.cfg, tma_atom, mKV_tma, sK, sV, sPages_layout, full, sPT, num_pages, cta, s8)
        ring.init_barriers()

        # ---- before the PDL wait (this grid may start while its predecessor in the stream still
        # runs): it reads only seq_len, its page-table entries (into sPT; a bad entry sets its
        # error bit, an atomic OR) and, with cfg.early_ring, the ring prologue's steps of rows
        # older than the new tokens (ReductionTree.unwritten_steps), and writes nothing else
        # global: the kernel right before attn2 does not write the lengths, the page table or
        # those rows (docs/DESIGN.md section 11 states the contract). So seq_len -> page table ->
        # KV, three dependent latencies, run under the predecessor's tail, and after the wait only
        # Q and the remaining KV loads are left (bench/RESULTS.md).
        pt_guess = self.load_page_table_guesses(mPT, cta)
        L = mSeq[cta.request]
        bad_len = Int32(L < self.q_len) + Int32(L > max_seq_len)
        tree = ReductionTree.create(self.cfg, L, cta.split)
        if bad_len == 0:
            if tree.cluster < tree.n_clusters:
                steps = tree.cta_steps()
                ring.stage_page_table(mPT, mErr, tree, steps, pt_guess, cta)
                cute.arch.sync_threads()               # sPT and the mbarriers visible
                if const_expr(self.cfg.early_ring):
                    ring.prologue(steps.count, tree.unwritten_steps(steps.page_base), True)
        if const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()
        if bad_len != 0:
            self.write_bad_length(mOut, mErr, cta)
        else:
            if tree.cluster < tree.n_clusters:
                # every CTA of a live cluster runs to the cluster barriers, even with no steps
                steps = tree.cta_steps()
                # the first KV loads (warp 0) and Q go out together: their latencies overlap
                ring.prologue(steps.count, tree.unwritten_steps(steps.page_base), False)
                scale_qk = scale_log2
                q_exp = self.load_query(mY, sQ, sQmax, cta)
                if const_expr(self.cfg.fp8):
                    # the key scale and q's power of two fold into the softmax's:
                    # (scale log2 e k_scale 2^q_exp) (q 2^-q_exp . k8), fp32
                    scale_qk = mul_rn(mul_rn(scale_log2, mKScale[cutlass.min(cta.kv_head, mKScale.shape[0] - 1)]),
                                      pow2(q_exp))
                thr_pv, partial = self.main_loop(ring, sQ, tree, steps, scale_qk, cta)
                self.trigger_dependents(cta, tree, wave_ctas)

                rows = self.merge_rows(cta, tree.rank)
                cute.arch.sync_threads()      # every wgmma read of the rings is done: reuse them
                sX = self.write_partial(ring, sXm, thr_pv, partial, cta)
                cute.arch.cluster_arrive()    # release my sX / sXm to the cluster (merge_cluster waits)
                # the gate load goes out after the release, whose MEMBAR.GPU would otherwise wait
                # for it, and its latency overlaps the cluster wait and the merges
                gate = rows.load_gate(mY, cta.kv_heads)
                v_scale = None
                if const_expr(self.cfg.fp8):    # applied with 1 / l by the rows' writer
                    v_scale = mVScale[cutlass.min(cta.kv_head, mVScale.shape[0] - 1)]
                m_merged, l_merged, o_merged, o_node = self.merge_cluster(sX, sXm, rows, tree)
                writes_out = Int32(1)      # one cluster: its (only) node is the whole row
                if tree.n_clusters > 1:
                    writes_out, l_merged = WorkspaceMerge.create(self.cfg, mWs, rows, tree, cta).merge(
                        sFlag, m_merged, l_merged, o_merged, o_node)
                if writes_out != 0:     # the single writer of these rows
                    rows.write_out(mOut, gate, o_merged, l_merged, v_scale)
                # my smem stays alive until every peer has read it (merge_cluster's relaxed arrive)
                cute.arch.cluster_wait()

    # ---------------------------------------------------------------------------- phases
    @cute.jit
    def load_page_table_guesses(self, mPT: cute.Tensor, cta: CtaPlace) -> Int32:
        """Every thread, before the PDL wait; returns pt_guess. Wide: what does not need L goes
        out together with L (one latency instead of two): warp w's guess of the CTA's page-table
        entries, 32 from step (w + 1) * split: chunk s starts at step s * steps // chunks, which
        one of them covers when steps / chunks is close to 1, 2, 3 or 4 (every CTA at L <= 1024,
        2048, 6144 and the multiples of 4096 up to 32768; about half the CTAs over the L up to
        16384; split_plan). A guess, checked against L in KVRing.stage_page_table (nothing
        depends on it being right; bench/RESULTS.md). Deep: -1 (its CTAs load their entries
        after L)."""
        pt_guess = Int32(-1)
        if const_expr(self.wide):
            pt_guess = mPT[cta.request, cutlass.min((cta.warp + 1) * cta.split * self.pages_per_step + cta.lane,
                                                    mPT.shape[1] - 1)]
        return pt_guess

    @cute.jit
    def write_bad_length(self, mOut: cute.Tensor, mErr: cute.Tensor, cta: CtaPlace):
        """L outside [q_len, max_seq_len]: split 0 (every thread) writes zero rows for the pair
        and thread 0 sets error bit 1; no smem, no barrier (every CTA of the pair takes this path)."""
        if cta.split == 0:
            threads_per_row = THREADS // self.rows
            columns_per_thread = HEAD_DIM // threads_per_row
            row = cta.tidx // threads_per_row
            c0 = (cta.tidx % threads_per_row) * columns_per_thread
            z = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), BFloat16)
            z.fill(0.0)
            qcol = (cta.kv_head * GROUP + row % GROUP) * HEAD_DIM + c0
            cute.autovec_copy(z, cute.local_tile(mOut, (1, columns_per_thread),
                                                 (cta.request * self.q_len + row // GROUP,
                                                  qcol // columns_per_thread))[0, None])
            if cta.tidx == 0:
                set_error_bit(mErr, BAD_SEQ_LEN)

    @cute.jit
    def load_query(self, mY: cute.Tensor, sQ: cute.Tensor, sQmax: cute.Tensor | None, cta: CtaPlace) -> Int32:
        """Every thread: the Q tile (row m = token * 8 + head; rows >= q_len * 8 zero) -> sQ, through
        registers (_load_q), fenced for the async proxy of wgmma and published by a CTA barrier.
        Returns q_exp: 0, or with an FP8 cache (f16 wgmmas) the power of two sQ holds q in: sQ =
        f16(q 2^-q_exp), q_exp = E - 15 for the tile's largest |q| in [2^E, 2^(E + 1)) (clamped to
        [-120, 112]), so the largest lands in [2^15, 2^16), below f16's max, and every bf16 q down
        to 2^-29 of it is exact in f16 (8 significant bits inside f16's normal range); smaller ones
        round to f16's subnormals (an error below 2^-39 of the largest). The scaling is exact,
        and the caller folds 2^q_exp into the logits' scale (_q_to_f16: one more CTA barrier)."""
        qv = cute.make_rmem_tensor(cute.make_layout((8, M_TILE * 8 // THREADS)), BFloat16)
        _load_q(mY, qv, cta.request, cta.kv_head, cta.tidx, self.q_len)
        q_exp = Int32(0)
        if const_expr(self.cfg.fp8):
            qv, q_exp = _q_to_f16(qv, sQmax, cta.warp, cta.lane)
        for it in cutlass.range_constexpr(M_TILE * 8 // THREADS):
            ci = cta.tidx + it * THREADS
            cute.autovec_copy(qv[None, it], cute.local_tile(sQ, (1, 8), (ci // 8, ci % 8))[0, None])
        cute.arch.fence_view_async_shared()    # sQ (generic stores) -> wgmma (async proxy)
        cute.arch.sync_threads()               # sQ visible
        return q_exp

    @cute.jit
    def main_loop(self, ring: KVRing, sQ: cute.Tensor, tree: ReductionTree, steps: CtaSteps,
                  scale_log2: Float32, cta: CtaPlace):
        """Every thread: the ring steps of this CTA's chunks, S = Q K^T, masks (StepMask), online
        softmax (SoftmaxPartial.update), O += P V; with second_accumulator each chunk is folded
        into the second accumulator at its last step. Returns (thr_pv, the CTA's partial): the
        running chunk (l per lane) or the second accumulator (l summed). Expects sQ, sPT and the
        mbarriers published and the ring prologue issued; warp 0 keeps steps_ahead steps in flight.
        S = Q K^T is wgmma m64nNk16 (N = keys_per_step), Q and K from smem; O += P V is wgmma
        m64n64k16 with P (bf16, packed cvt.rn.bf16x2; fp8: f16) in registers -- the C layout of S is the A
        layout of P V -- and V the MN-major B through a transposed view of the ring. Every wgmma
        group is waited for before its registers or smem are touched. On return the last wgmma
        groups were waited for, but other warps may still read the ring: a CTA barrier must
        precede its reuse."""
        keys_per_step = self.keys_per_step
        stages = self.stages
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, OperandMajorMode.K, OperandMajorMode.K,
            Float32, (1, 1, 1), (M_TILE, keys_per_step))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, OperandMajorMode.K, OperandMajorMode.MN,
            Float32, (1, 1, 1), (M_TILE, HEAD_DIM), a_source=warpgroup.OperandSource.RMEM)
        thr_qk = mma_qk.get_slice(cta.tidx)
        thr_pv = mma_pv.get_slice(cta.tidx)
        atom_qk = cute.make_mma_atom(mma_qk.op)
        atom_pv = cute.make_mma_atom(mma_pv.op)
        sVt = cute.composition(ring.sV, cute.make_ordered_layout((HEAD_DIM, keys_per_step, self.cfg.mma_stages),
                                                                 order=(1, 0, 2)))
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(ring.sK))
        tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sVt))
        tSrS = cute.make_rmem_tensor(thr_qk.partition_shape_C((M_TILE, keys_per_step)), Float32)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((M_TILE, keys_per_step)))
        tOrO = cute.make_rmem_tensor(thr_pv.partition_shape_C((M_TILE, HEAD_DIM)), Float32)
        tOrO.fill(0.0)
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_shape_A((M_TILE, keys_per_step)))
        tOrP32 = cute.recast_tensor(tOrP, Uint32)
        row_max = cute.make_rmem_tensor(cute.make_layout(2), Float32)
        row_sum = cute.make_rmem_tensor(cute.make_layout(2), Float32)
        row_max.fill(NEG_BIG)
        row_sum.fill(0.0)
        corr = cute.make_rmem_tensor(cute.make_layout(2), Float32)
        chunk = SoftmaxPartial(tOrO, row_max, row_sum)   # the running chunk, from I
        partial = chunk
        chunk_lo = tree.chunk_lo
        chunk_end = Int32(0)     # second_accumulator: local step index where the current chunk ends
        if const_expr(self.second_accumulator):
            # the CTA's partial = left fold of its chunks, starting as the identity I
            acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((M_TILE, HEAD_DIM)), Float32)
            acc_m = cute.make_rmem_tensor(cute.make_layout(2), Float32)
            acc_l = cute.make_rmem_tensor(cute.make_layout(2), Float32)
            fw = cute.make_rmem_tensor(cute.make_layout((2, 2), stride=(1, 2)), Float32)
            acc_o.fill(0.0)
            acc_m.fill(NEG_BIG)
            acc_l.fill(0.0)
            chunk_end = tree.chunk_end(chunk_lo, steps.first)
            partial = SoftmaxPartial(acc_o, acc_m, acc_l)
        inv = cute.make_rmem_tensor(cute.make_layout(self.pages_per_step), Int32)
        mask = StepMask.create(self.cfg, tree.seq_len, cta.warp)
        # whether this warp holds real query rows: always at q_len 8; at q_len 1 warp 0 only (its
        # rows 0 .. 7; warps 1..3 hold padding rows, see the softmax below)
        real_rows = Int32(1)
        if const_expr(self.q_len == 1):
            real_rows = Int32(cta.warp == 0)
        tail_lo = tree.seq_len - (steps.page_base * PAGE_SIZE)      # first row >= L, relative to the split
        tail_hi = (tree.last_page + 1 - steps.page_base) * PAGE_SIZE

        for k in cutlass.range(steps.count, unroll=1):
            stage = k % stages
            mma_stage = k % self.cfg.mma_stages   # the stage the wgmmas read (fp8: the one step buffer)
            # fp8: into the stage step k is converted from, after ready; bf16: the one step k - 1 read
            k_next = k + self.cfg.steps_ahead
            # every warp is done with step k-1, so its stage (fp8: the step buffer) may be refilled
            cute.arch.sync_threads()
            if const_expr(not self.cfg.refill_under_qk):
                ring.refill(k_next, steps.count)
            if const_expr(self.cfg.fp8):
                # the conversion first: nothing of the step's masks is live across it (registers)
                ring.ready(k, stage, tail_lo, tail_hi)
            kbase = (steps.page_base + k * self.pages_per_step) * PAGE_SIZE
            ring.invalid_pages(k, inv)
            if const_expr(not self.cfg.fp8):
                ring.ready(k, stage, tail_lo, tail_hi)

            # ---- S = Q K^T (raw logits; the scale is folded into the exp). With refill_under_qk
            # warp 0 issues the refill while this wgmma runs, off the path the other warps wait on
            # at it (Attn2Config.refill_under_qk says where and why)
            if const_expr(self.cfg.refill_under_qk):
                wgmma_commit(atom_qk, tSrS, tSrQ, tSrK[None, None, None, mma_stage], True)
                ring.refill(k_next, steps.count)
                cute.nvgpu.warpgroup.wait_group(0)
            else:
                wgmma_group(atom_qk, tSrS, tSrQ, tSrK[None, None, None, mma_stage], True)
            # decode (q_len 1): warps 1..3 hold rows 16 .. 63, all padding, whose q rows are zero
            # (load_query): no softmax for them. Their logits, 0 (NaN against a NaN key), are
            # their P; their O, m and l are never read (the merges and the writer take rows <
            # q_len * 8 only, and their chunk folds are skipped too). Warp 0's rows run as before.
            if real_rows != 0:
                mask.apply(tSrS, tScS, inv, kbase)
                chunk.update(tSrS, corr, scale_log2)

            # ---- P -> 16-bit A fragment (the C layout of S is the A layout of P V); O += P V.
            # fp8: f16 (p <= 2^8: SoftmaxPartial.update), three more bits than bf16
            for q in cutlass.range_constexpr(cute.size(tOrP32)):
                tOrP32[q] = pack_x2(tSrS[2 * q], tSrS[2 * q + 1], self.mma_kind)
            wgmma_group(atom_pv, tOrO, tOrP, tOrVt[None, None, None, mma_stage], False)

            if const_expr(self.second_accumulator):
                if k + 1 == chunk_end:
                    chunk_lo = chunk_lo + 1
                    chunk_end = tree.chunk_end(chunk_lo, steps.first)
                    if real_rows != 0:
                        partial.fold_in(chunk, fw)
        return thr_pv, partial

    @cute.jit
    def trigger_dependents(self, cta: CtaPlace, tree: ReductionTree, ctas_per_wave: Int32):
        """PDL trigger, after the main loop: the next grid in the stream may launch now and wait
        in its griddepcontrol.wait (it reads nothing of ours before our grid is done), so its
        launch and prologue (the next layer's weight stream, for qkv_front) overlap our merges.
        Every deep grid and every wide grid of more than QUIET_WIDE_PAIRS pairs triggers; a wide
        grid of fewer pairs only where it has at most one working CTA per SM (estimated from this
        request's L), so that the next grid's early CTAs take no SM slot that ours need
        (attn2_plan, QUIET_WIDE_PAIRS)."""
        if const_expr(self.cfg.pdl):
            if const_expr(self.wide):
                pairs = cta.num_requests * cta.kv_heads
                if pairs > QUIET_WIDE_PAIRS or pairs * tree.n_chunks <= ctas_per_wave:
                    cute.arch.griddepcontrol_launch_dependents()
            else:
                cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def merge_rows(self, cta: CtaPlace, rank: Int32) -> MergeRows:
        """The rows this CTA merges and writes (MergeRows): those of cluster rank `rank`."""
        rows_per_rank, threads_per_row = self.rows_per_rank, self.threads_per_row
        active = Int32(cta.tidx < rows_per_rank * threads_per_row)
        row = cutlass.min(rank * rows_per_rank + cta.tidx // threads_per_row, Int32(self.rows - 1))
        col0 = (cta.tidx % threads_per_row) * self.columns_per_thread
        out_row = cta.request * self.q_len + row // GROUP
        out_col = (cta.kv_head * GROUP + row % GROUP) * HEAD_DIM + col0
        return MergeRows(active, row, col0, out_row, out_col, cta.tidx, threads_per_row, self.columns_per_thread)

    @cute.jit
    def write_partial(self, ring: KVRing, sXm: cute.Tensor, thr_pv: cute.ThrMma, partial: SoftmaxPartial,
                      cta: CtaPlace) -> cute.Tensor:
        """Every thread, after a CTA barrier (no wgmma reads the rings any more): this CTA's
        partial of main_loop -> sX [64, 64] fp32 (KVRing.merge_buffer) and sXm [rows, 2] (l summed
        over the quad here when main_loop left it per lane); returns sX. Rows >= self.rows are
        padding. Published to the cluster by the kernel's cluster_arrive."""
        sX = ring.merge_buffer()
        tOsX = thr_pv.partition_C(sX)
        for i in cutlass.range_constexpr(cute.size(partial.o)):
            tOsX[i] = partial.o[i]
        for h in cutlass.range_constexpr(2):
            m_h = partial.m[h]
            if const_expr(self.second_accumulator):
                l_h = partial.l[h]
            else:
                l_h = quad_sum(partial.l[h])
            row = 16 * cta.warp + cta.lane // 4 + 8 * h
            if cta.lane % 4 == 0:
                if row < self.rows:
                    sXm[row, 0] = m_h
                    sXm[row, 1] = l_h
        return sX

    @cute.jit
    def merge_cluster(self, sX: cute.Tensor, sXm: cute.Tensor, rows: MergeRows, tree: ReductionTree):
        """Level 1 (DSMEM), every thread of every CTA of the cluster, after the kernel's
        cluster_arrive (the release of its sX / sXm): the barrier's wait, which publishes every
        peer's sX / sXm, then rank c folds its rows [c rows_per_rank, (c + 1) rows_per_rank) of
        the cluster's cluster_size partials (ld.shared::cluster), in rank order, starting from I.
        Wide: the chunks -> sub `cluster` (chunks past the request's end are skipped by selection,
        as a deep CTA never folds them), and a lone sub becomes node 0 = fold(fold(I, sub 0), I).
        Deep: the 2 subs -> node `cluster` (an empty sub is I and is folded, as the wide merge
        folds I for it). Ends with the relaxed arrive of the second cluster barrier, whose wait is
        the kernel's last step (so the level-2 merge does not wait for the slowest peer's loads).
        Returns (m, l, o) of this thread's row and columns, and o_node, a scratch row for
        WorkspaceMerge."""
        cluster_size = self.cluster_size
        columns_per_thread = self.columns_per_thread
        o_merged = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), Float32)
        o_merged.fill(0.0)
        m_merged = Float32(NEG_BIG)
        l_merged = Float32(0.0)
        cute.arch.cluster_wait()         # every peer's release (its cluster_arrive in kernel)
        m_peer = cute.make_rmem_tensor(cute.make_layout(cluster_size), Float32)
        l_peer = cute.make_rmem_tensor(cute.make_layout(cluster_size), Float32)
        o_peer = cute.make_rmem_tensor(cute.make_layout((columns_per_thread, cluster_size),
                                                        stride=(1, columns_per_thread)), Float32)
        o_offset = rows.row * HEAD_DIM + rows.col0
        for j in cutlass.range_constexpr(cluster_size):      # every peer is alive until the 2nd barrier
            a_ml = cute.arch.map_dsmem_ptr(sXm.iterator + 2 * rows.row, Int32(j)).toint()
            m_peer[j], l_peer[j] = ld_dsmem_f32x2(a_ml)
            a_o = cute.arch.map_dsmem_ptr(sX.iterator + o_offset, Int32(j)).toint()
            for q in cutlass.range_constexpr(columns_per_thread // 4):
                o_peer[4 * q, j], o_peer[4 * q + 1, j], o_peer[4 * q + 2, j], o_peer[4 * q + 3, j] = \
                    ld_dsmem_f32x4(a_o + 16 * q)
        for j in cutlass.range_constexpr(cluster_size):
            # wide: a chunk past the request's end leaves the fold as it is
            m_merged, l_merged = _fold_into(m_merged, l_merged, o_merged, m_peer[j], l_peer[j], o_peer[None, j],
                                            tree.has_chunk(j), self.wide)
        # every load of a peer's smem issued above has returned (its value is used), so a
        # relaxed arrive suffices to let the peers exit; the matching wait is the CTA's last
        # step, so nothing after this waits for the slowest peer's merge
        cute.arch.cluster_arrive_relaxed()
        o_node = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), Float32)
        o_zero = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), Float32)   # O of I
        o_zero.fill(0.0)
        if const_expr(self.wide):
            if tree.n_subs == 1:
                # node 0 = fold(fold(I, sub 0), I): what a deep pair whose rank 1 is empty computes
                m_merged, l_merged = _node_into(o_node, m_merged, l_merged, o_merged,
                                                Float32(NEG_BIG), Float32(0.0), o_zero)
                for c in cutlass.range_constexpr(columns_per_thread):
                    o_merged[c] = o_node[c]
        return m_merged, l_merged, o_merged, o_node


# ------------------------------------------------------------------------------------ host
# compiling, loading and launching a variant live in launch.py (no cutlass import); this is the compile
def _compile(cfg: Attn2Config, extra_options: str):
    runtime.require_dsl()
    rows = cute.sym_int()
    n = cute.sym_int(divisibility=64)
    nq = cute.sym_int(divisibility=64)
    nws = cute.sym_int(divisibility=16)
    pages, hkv, nreq, width = (cute.sym_int() for _ in range(4))
    fake = runtime.fake_tensor
    # an FP8 cache's variant takes the two scales (fp32, one element or one per KV head); a bf16
    # cache's takes none (the arguments are compile-time None: not in its signature)
    scales = ((fake(Float32, (cute.sym_int(),), align=4), fake(Float32, (cute.sym_int(),), align=4)) if cfg.fp8
              else (None, None))
    return cute.compile(
        Attn2Sm90(cfg),
        fake(BFloat16, (rows, n), align=16),                            # y
        fake(Float8E4M3FN if cfg.fp8 else BFloat16, (pages, hkv, PAGE_SIZE, CACHE_ROW), align=16),   # kv_cache
        fake(Int32, (nreq, width), align=4),                            # page_table
        fake(Int32, (nreq,), align=4),                                  # seq_lens
        fake(BFloat16, (rows, nq), align=16),                           # out
        fake(cutlass.Uint8, (nws,), align=16),                          # workspace
        fake(Int32, (1,), align=4),                                     # error flag
        *scales,                                                        # k_scale, v_scale
        Float32(0.5), Int32(cfg.max_seq_len), Int32(132), runtime.env_stream(),
        options=runtime.compile_options(extra_options))
