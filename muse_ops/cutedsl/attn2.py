"""muse::attn2 on Hopper (sm_90a): paged verify/decode attention fused with the per-head output
RMS norm and the sigmoid gate, one CuTe DSL kernel launch.

Math (docs/DESIGN.md section 5, numerics of muse_ops/reference/attn2.py), per request r, KV head g,
query token t (position pos = L - q_len + t) and query head j (= g * 8 + j overall):
    o   = softmax(scale * q k^T) v over keys [max(0, pos - W + 1), pos] (W > 0) or [0, pos]
    out = bf16(sigmoid(gate) * rmsnorm(bf16(o)))     rmsnorm = o * rsqrt(mean(o^2) + 1e-5), fp32

Tensors (all contiguous, 16-byte aligned):
    y          bf16  [q_len * R, 1152 * Hkv]   q at columns 0:Hq*64, gate at (Hq + 2 Hkv)*64 : N
    kv_cache   bf16  [num_pages, Hkv, 16, 128] K in columns 0:64, V in 64:128
    page_table int32 [R, max_pages]            logical page -> physical page
    seq_lens   int32 [R]                       L (includes the q_len new tokens)
    out        bf16  [q_len * R, Hq * 64]
    workspace  uint8 [workspace_bytes(...)]    fp32 partials O and (m, l); uint32 counters at the end
    error_flag int32 [1]                       |= 1: L outside [q_len, max_seq_len]; |= 2: bad page

Design (split KV with cluster and workspace merges on wgmma + TMA; one reduction tree per
request whatever the batch; docs/DESIGN.md section 11):
- The reduction tree of a request depends on its own L and the deployment only (split_plan): its
  visible pages are cut into ring steps of pages_per_step pages; about steps // 64 nodes, 2 from
  64 steps (node_count: 1 to NODES_MAX = 8, so at most 128 chunks); 2 subs per node; SUB_CHUNKS chunks per sub
  (WINDOW_SUB_CHUNKS = 4 for window deployments, whose ~33 steps make one node: 8 chunks); chunk j
  covers steps [j * steps // chunks, (j + 1) * steps // chunks). A chunk is an online
  softmax from the identity I = (m = -1e30, l = 0, O = 0); a sub is the left fold of its chunks; a
  node is fold(fold(I, sub 2i), sub 2i + 1) (a missing sub is I); the output is the flat sum of
  the nodes weighted by ex2(m - M), M the largest node max. Every fold is the same explicit PTX
  (_fold_w / _fold_v: max, ex2.approx, mul.rn, fma.rn) wherever it runs, so its bits do not depend
  on which CTA, thread or layout ran it.
- Two layouts of that tree on CTAs, chosen on the host from the batch shape (choose_layout):
  wide (R * Hkv <= WIDE_MAX_PAIRS, or WIDE_MAX_PAIRS_WINDOW with a window): one CTA per chunk, a
  cluster of a sub's chunks (8, or 4 with a window), so a single request at L = 8192 runs on 128
  CTAs of 2 steps; deep (otherwise): one CTA per sub, which folds its chunks in a second register
  accumulator (acc_*), a CTA pair per node. Both compute the same tree,
  so a request's bits depend neither on the batch (batch invariance) nor on timing (fixed fold
  orders). Why: every CTA pays three dependent loads (seq_len -> page table -> first KV, ~2 us)
  and a merge (~2 us) around its steps, and one warpgroup alone on an SM takes ~0.65 us per
  step (measured with globaltimer stamps, bench/RESULTS.md): a request alone needs many short
  CTAs, a full batch needs few long ones. The price in deep: a second O accumulator (126
  registers, 4 CTAs per SM) and a fold per chunk.
- PDL: every launch may start while its predecessor in the stream runs. Before
  griddepcontrol.wait a CTA reads only seq_lens, the page table (and may OR the bad-page bit
  into the error flag) and, with cfg.early_ring (the default), the ring prologue's steps whose
  rows all sit at positions before L - q_len; Q (y), the new tokens' rows, which qkv_front
  writes, and every write wait for it. So the kernel right before attn2 must not write seq_lens,
  the page table or those older rows after triggering its dependents early: qkv_front (which
  inserts positions L - q_len .. L - 1) and attn2 do not, and a kernel that does not trigger
  early has finished before attn2 starts. A CTA triggers its dependent launch after its main
  loop, so the next kernel's launch overlaps our merges when it is launched with PDL too: in
  every deep grid and every wide grid of more than attn2_plan.QUIET_WIDE_PAIRS pairs, and in a
  wide grid of fewer pairs only where it has at most one working CTA per SM (the others of
  fewer pairs measured slower with the trigger); a grid that does not trigger lets the next
  kernel launch as our CTAs exit.
- Occupancy caps (attn2_plan.occupancy_cap): behind qkv_front, which triggers after its main
  loop while its CTAs still hold 108 of the 132 SMs (Hkv 2), the block scheduler would put the
  grid's early CTAs five (deep: four) to an SM on the 24 SMs left free. A variant with
  ctas_per_sm = 1 to 4 reserves shared memory it never touches (cfg.smem_pad) so that no more
  CTAs share an SM: the first CTAs run their prologue there, the rest land on the SMs qkv_front
  frees. The host picks the smallest cap under which the whole grid fits one wave. The bits do
  not change (where a CTA runs is not an input of what it computes).
- Start of a CTA: seq_len, then the page-table entries of its chunks, then the first KV load are
  three dependent latencies; the first two run before the PDL wait, under the predecessor's
  tail, and so does the third for the prologue's steps whose rows are older than the new tokens
  (cfg.early_ring). A wide CTA issues three guesses of its page-table entries (32 from step s, 2 s and 3 s:
  where chunk s starts when steps // chunks is exactly 1, 2 or 3) with seq_len's load, and takes
  the entries from a guess that covers them. Nothing depends on a guess being right. After the
  wait, Q and the prologue's remaining KV loads go out together.
- Grid (cluster_size, Hkv * R, max_clusters) with clusters of cluster_size CTAs along x: the
  cluster index is the slowest dimension, so the clusters that have work (low indices) are
  dispatched first and the idle ones (beyond the request's subs / nodes) exit at the end. 128
  threads = one warpgroup. CTA (rank, g + Hkv r, cluster) owns split cluster * cluster_size +
  rank of the tree of request r and KV head g, and every query row of the pair (q_len * 8 rows,
  token-major: row m = t * 8 + j, zero-padded to the wgmma M of 64). Warp w holds rows
  16 w .. 16 w + 15 of the accumulators (tokens 2w, 2w + 1), lane rows lane // 4 and
  lane // 4 + 8 (the wgmma C layout).
- KV ring: `stages` stages of pages_per_step pages. Warp 0 issues, per page, one TMA box (16 rows x
  64 columns) for its K half and one for its V half into 128 B-swizzled smem (the canonical K-major
  wgmma layout), completing on the stage's mbarrier; a CTA barrier per step frees the stage read in
  the step before (a wide CTA refills it while the step's S wgmma runs, a deep one before that
  wgmma). A page that the page table does not give (past the last page, or invalid) is read at
  page index num_pages, outside the tensor map, so TMA fills zeros and still counts its bytes.
  The tail page's V rows >= L are zeroed in smem before use (the cache holds anything there and
  0 * NaN = NaN); their logits, and those of invalid pages, are masked. Masking (causal, window,
  tail, invalid pages) runs on edge steps only.
- S = Q K^T: wgmma m64nNk16 (N = keys_per_step = 16 pages_per_step), Q and K from smem. O += P V:
  wgmma m64n64k16 with P (bf16, packed cvt.rn.bf16x2) in registers -- the C layout of S is the A
  layout of P V -- and V read through a transposed view of the same swizzled ring (the MN-major B
  operand). Every wgmma group is waited for before its registers or smem are touched.
- Online softmax in base 2: p = ex2.approx.ftz(fma(s, scale * log2 e, -m)). The running max is
  lazy: it moves only when a logit exceeds it by more than RESCALE_SLACK = 8 (p <= 2^8, fine
  in fp32 and bf16), and O is rescaled only when a row max of the warp moved (x * 1 = x). The
  rule depends on the data alone, so the bits stay deterministic; softmax does not depend on
  the reference point, so only rounding changes. Running max starts at -1e30 (finite), so fully
  masked tiles need no branch.
- Merge, level 1 (DSMEM): each CTA leaves its partial (O, m, l) rows in its idle ring (a wide CTA
  its chunk, a deep CTA its sub); after a cluster barrier, rank c reads rows
  [c * rows_per_rank, (c + 1) * rows_per_rank) of all cluster_size peers (ld.shared::cluster) and
  folds them in rank order from I (wide: chunks past the request's end are skipped by selection;
  deep: the pair's two subs). A second cluster barrier keeps every CTA's smem alive until its peers
  are done: its relaxed arrive follows the CTA's DSMEM loads, its wait is the CTA's last step (so
  the level-2 merge does not wait for the slowest peer's loads).
- Merge, level 2 (more than one node, or more than one sub when wide): rank c writes its rows of
  the cluster's partial to the workspace, one thread takes a ticket (one atom.acq_rel.gpu.add
  after a CTA barrier: cumulative over the CTA's writes) on the counter of (request, KV head, rank
  c); the last arriving cluster's CTA of rank c resets it to 0 and merges the partials of its
  rows: the largest max first, then the nodes in order (wide: each folded from its two subs
  first). Counters are self-resetting and sit at the end of the workspace, so one zeroed workspace
  serves calls of any batch size.
- One node (and after level 2): norm + gate, then out. Page-table entries of a CTA are staged in
  smem once.
- q_len 1 uses the same kernel (8 real rows of the 64). Deterministic and batch invariant, and
  both layouts give the same bits (the fixed fold orders above). Measurements, and the designs
  tried and measured slower (pushing the level-1 rows into the merging CTA with st.async or
  st.shared::cluster instead of pulling them; 1-step chunks at L = 8192): bench/RESULTS.md and
  bench/RESULTS-archive.md.
- Epilogue: o = bf16(O * rcp(l)); ss = the sum of the 64 squares in one fixed tree whatever
  the layout (_sum_of_squares: leaves of 4 columns, then a balanced tree over the 16 leaves; the
  layouts give a row 4, 8 or 16 threads, so a thread's own columns then a butterfly over its
  lanes would sum in a layout's order, and a request's bits would move with the batch);
  rsqrt.approx; sigmoid = rcp(1 + ex2(-g log2 e)); out = bf16(o * rs * sig).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64, Uint32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup
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
from .ptx import (add_rn, fma_rn, ld_dsmem_f32x2, ld_dsmem_f32x4, mul_rn, pack_bf16x2, quad_max, quad_sum, select,
                  set_error_bit, sub_rn, wgmma_commit, wgmma_group)

LOG2E = 1.4426950408889634
NEG_BIG = -1.0e30
RESCALE_SLACK = 8.0   # log2 units: the running max lags the true max by at most this


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



@cute.jit
def _load_step(tma_atom: cute.CopyAtom, tKVg: cute.Tensor, tKs: cute.Tensor, tVs: cute.Tensor,
               full, sPT: cute.Tensor, kv_head: Int32, kloc: Int32, stage: Int32, num_pages: Int32,
               pages_per_step: cutlass.Constexpr[int], page_table_max: cutlass.Constexpr[int]):
    """Warp 0: TMA the K and V halves of the pages_per_step pages of local step kloc into ring
    stage `stage`, one (16, 64) box each, completing on full[stage]. A page the smem page table
    marks -1 (past the last page, or invalid) is read at page index num_pages, out of the tensor
    map's bounds, so TMA fills it with zeros and still counts its bytes."""
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(full + stage, pages_per_step * 2 * PAGE_SIZE * HEAD_DIM * 2)
    for p in cutlass.range_constexpr(pages_per_step):
        phys = sPT[cutlass.min(kloc * pages_per_step + p, Int32(page_table_max - 1))]
        src = phys
        if phys < 0:
            src = num_pages
        page = stage * pages_per_step + p
        cute.copy(tma_atom, tKVg[None, 0, 0, kv_head, src], tKs[None, page], tma_bar_ptr=full + stage)
        cute.copy(tma_atom, tKVg[None, 0, 1, kv_head, src], tVs[None, page], tma_bar_ptr=full + stage)


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


class _Tree(NamedTuple):
    """A CTA's place in its request's reduction tree (Attn2Sm90.reduction_tree): dynamic Int32s."""
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


class _MyRows(NamedTuple):
    """The rows a CTA merges and writes (rows_per_rank rows of its rank, threads_per_row threads
    of columns_per_thread columns each): dynamic Int32s."""
    active: Int32        # 1 where this thread's row is one of the rank's rows
    row: Int32           # row m = token * 8 + head of the accumulators (clamped to rows - 1)
    col0: Int32          # this thread's first column of the row
    out_row: Int32       # the row's row of y and out
    out_col: Int32       # this thread's first column of out (and, shifted, of the gate in y)


class Attn2Sm90:
    """One variant of the attn2 kernel (see the module docstring)."""

    def __init__(self, cfg: Attn2Config):
        self.cfg = cfg
        self.q_len = cfg.q_len
        self.window = cfg.window
        self.rows = cfg.query_rows                  # real query rows: q_len * 8 of the M_TILE
        self.pages_per_step = cfg.pages_per_step
        self.keys_per_step = cfg.keys_per_step      # 16 * pages_per_step: the N of S = Q K^T
        self.stages = cfg.stages                    # KV ring stages
        self.wide = cfg.wide                        # layout: a CTA per chunk (else per sub)
        self.sub_chunks = cfg.sub_chunks
        self.cluster_size = cfg.cluster_size
        self.chunks_per_cta = cfg.chunks_per_cta
        # the CTA folds its chunks in a second accumulator; a one-chunk CTA needs none, since
        # fold(I, X) = X exactly (weights ex2(-1e30 - m) = 0 and ex2(0) = 1, fma(0, 0, x) = x)
        self.second_accumulator = cfg.chunks_per_cta > 1
        self.max_clusters = cfg.max_clusters        # clusters per (request, KV head) in the grid
        self.slots = cfg.slots                      # workspace partials per (request, KV head)
        self.nodes_max = cfg.nodes_max
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
                 scale: Float32, max_seq_len: Int32, wave_ctas: Int32,
                 stream: cuda.CUstream):
        num_requests = mSeq.shape[0]
        kv_heads = mCache.shape[1]
        # K and V rings and Q: rows of 64 bf16 (128 B) in the 128 B swizzle, the canonical
        # K-major wgmma layout; V read through a transposed view is the MN-major B of P V
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        sRing_layout = cute.tile_to_shape(atom, (self.keys_per_step, HEAD_DIM, self.stages), (0, 1, 2))
        sPages_layout = cute.tile_to_shape(atom, (PAGE_SIZE, HEAD_DIM, self.pages_per_step * self.stages),
                                           (0, 1, 2))
        sQ_layout = cute.tile_to_shape(atom, (M_TILE, HEAD_DIM), (0, 1))
        # the cache as (row, column, KV head, page); a TMA box is one page's K or V half
        mKV = cute.make_tensor(mCache.iterator, cute.select(mCache.layout, mode=[2, 3, 1, 0]))
        tma_atom, mKV_tma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mKV, cute.slice_(sPages_layout, (None, None, 0)),
            (PAGE_SIZE, HEAD_DIM))
        occ = {}
        if const_expr(self.cfg.min_blocks > 0):
            occ = dict(min_blocks_per_mp=self.cfg.min_blocks, preferred_smem_carveout=100)
        if const_expr(self.cluster_size > 1):
            occ["cluster"] = (self.cluster_size, 1, 1)
        self.kernel(mY, mPT, mSeq, mOut, mWs, mErr, tma_atom, mKV_tma, sRing_layout, sPages_layout,
                    sQ_layout, mCache.shape[0], scale * LOG2E, max_seq_len, wave_ctas).launch(
            grid=(self.cluster_size, kv_heads * num_requests, self.max_clusters), block=(THREADS, 1, 1),
            stream=stream, use_pdl=self.cfg.pdl, **occ)

    @cute.kernel
    def kernel(self, mY: cute.Tensor, mPT: cute.Tensor, mSeq: cute.Tensor,
               mOut: cute.Tensor, mWs: cute.Tensor, mErr: cute.Tensor,
               tma_atom: cute.CopyAtom, mKV_tma: cute.Tensor, sRing_layout: cute.ComposedLayout,
               sPages_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout,
               num_pages: Int32, scale_log2: Float32, max_seq_len: Int32, wave_ctas: Int32):
        """CTA (block_rank, block_pair, block_cluster), one warpgroup, owns split = block_cluster *
        cluster_size + block_rank of the reduction tree of (request, KV head) = divmod(block_pair,
        kv_heads): every query row of the pair, and the chunks [split * chunks_per_cta, ..) of the
        request's chunks (reduction_tree). Phases, in order (every thread calls each; its
        docstring says which threads act): barriers; before the PDL wait, seq_len and the
        page-table guesses, then (a live CTA of a valid length) its page-table entries to smem
        and the ring prologue's steps of older rows (early_ring); the PDL wait; then either the invalid length (zero rows, error bit) or, for a CTA of a
        live cluster: the first KV loads and Q to smem, the main loop, the partial to smem, the
        level-1 (cluster) merge, the level-2 (workspace) merge, the epilogue. A CTA of a live cluster
        reaches both cluster barriers (merge_cluster and the final wait) whatever its steps; a CTA
        of an idle cluster (beyond the request's subs or nodes) or of a bad length exits before
        either, and so does the rest of its cluster (same request, same cluster index)."""
        tidx, _, _ = cute.arch.thread_idx()
        block_rank, block_pair, block_cluster = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        num_requests = mSeq.shape[0]
        kv_heads = mKV_tma.shape[2]
        kv_head = block_pair % kv_heads
        request = block_pair // kv_heads
        split = block_cluster * self.cluster_size + block_rank

        # ---- shared memory
        smem = SmemAllocator()
        full = smem.allocate_array(Int64, self.stages, byte_alignment=8)   # one mbarrier per ring stage
        sK = smem.allocate_tensor(BFloat16, sRing_layout.outer, byte_alignment=1024, swizzle=sRing_layout.inner)
        sV = smem.allocate_tensor(BFloat16, sRing_layout.outer, byte_alignment=1024, swizzle=sRing_layout.inner)
        sQ = smem.allocate_tensor(BFloat16, sQ_layout.outer, byte_alignment=1024, swizzle=sQ_layout.inner)
        sPT = smem.allocate_tensor(Int32, cute.make_layout(self.page_table_max), byte_alignment=16)
        sFlag = smem.allocate_tensor(Int32, cute.make_layout(4), byte_alignment=16)
        sXm = smem.allocate_tensor(Float32, cute.make_layout((self.rows, 2), stride=(2, 1)), byte_alignment=16)
        if const_expr(self.cfg.smem_pad > 0):   # never touched: it caps the CTAs an SM holds (occupancy_cap)
            smem.allocate_array(Uint32, self.cfg.smem_pad // 4, byte_alignment=16)

        self.init_barriers(tma_atom, full, warp)
        # ---- PDL: this grid may start while its predecessor in the stream still runs. Before
        # griddepcontrol.wait it reads only seq_len, its page-table entries (into sPT; a bad
        # entry sets its error bit, an atomic OR) and, with cfg.early_ring, the ring prologue's
        # steps of rows older than the new tokens (unwritten_steps), and writes nothing else
        # global: the kernel right before attn2 in a step is qkv_front (or attn2, or a kernel
        # that does not trigger its dependents early and so has finished), and none of them
        # writes the lengths, the page table or those rows (docs/DESIGN.md section 11 states it
        # as the contract). So after the wait only Q and the remaining KV loads are left, where
        # seq_len -> page table -> KV were three dependent latencies. Measured: bench/RESULTS.md,
        # fourteenth, twenty-fourth and twenty-fifth runs. The trigger for the next grid comes
        # after the main loop (trigger_dependents).
        pt_guess = self.load_page_table_guesses(mPT, request, split, warp, lane)
        L = mSeq[request]
        bad_len = Int32(L < self.q_len) + Int32(L > max_seq_len)
        tree = self.reduction_tree(L, split)
        if bad_len == 0:
            if tree.cluster < tree.n_clusters:
                k_begin, my_steps, page_base = self.cta_steps(tree)
                self.stage_page_table(mPT, sPT, mErr, tree, page_base, my_steps, pt_guess, num_pages,
                                      request, split, tidx, warp, lane)
                cute.arch.sync_threads()               # sPT and the mbarriers visible
                if const_expr(self.cfg.early_ring):
                    self.ring_prologue(tma_atom, mKV_tma, sK, sV, sPages_layout, full, sPT, kv_head, my_steps,
                                       num_pages, warp, self.unwritten_steps(L, page_base), True)
        if const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()
        if bad_len != 0:
            self.write_bad_length(mOut, mErr, request, kv_head, split, tidx)
        else:
            if tree.cluster < tree.n_clusters:
                # every CTA of a live cluster runs to the cluster barriers, even with no steps
                k_begin, my_steps, page_base = self.cta_steps(tree)
                # the first KV loads (warp 0) and Q go out together: their latencies overlap
                tKVg, tKs, tVs = self.ring_prologue(tma_atom, mKV_tma, sK, sV, sPages_layout, full, sPT,
                                                    kv_head, my_steps, num_pages, warp,
                                                    self.unwritten_steps(L, page_base), False)
                # ---- Q (row m = token*8 + head; rows >= self.rows zero)
                qv = cute.make_rmem_tensor(cute.make_layout((8, M_TILE * 8 // THREADS)), BFloat16)
                _load_q(mY, qv, request, kv_head, tidx, self.q_len)
                self.store_query(sQ, qv, tidx)
                cute.arch.fence_view_async_shared()    # sQ (generic stores) -> wgmma (async proxy)
                cute.arch.sync_threads()               # sQ visible
                thr_pv, o_part, m_part, l_part = self.main_loop(
                    tma_atom, tKVg, tKs, tVs, full, sQ, sK, sV, sPT, tree, L, k_begin, page_base, my_steps,
                    kv_head, num_pages, scale_log2, tidx, warp, lane)
                self.trigger_dependents(num_requests, kv_heads, tree.n_chunks, wave_ctas)

                my_rows = self.merge_rows(request, kv_head, tree.rank, tidx)
                cute.arch.sync_threads()      # every wgmma read of the rings is done: reuse them
                sX = self.write_partial(sK, sXm, thr_pv, o_part, m_part, l_part, warp, lane)
                cute.arch.cluster_arrive()    # release my sX / sXm to the cluster (merge_cluster waits)
                # the gate load goes out after the release, whose MEMBAR.GPU would otherwise wait
                # for it, and its latency overlaps the cluster wait and the merges
                gate = self.load_gate(mY, my_rows, kv_heads)
                m_merged, l_merged, o_merged, o_node = self.merge_cluster(sX, sXm, my_rows, tree)
                writes_out = Int32(1)      # one cluster: its (only) node is the whole row
                if tree.n_clusters > 1:
                    writes_out, l_merged = self.merge_workspace(
                        mWs, sFlag, my_rows, tree, m_merged, l_merged, o_merged, o_node,
                        request, kv_head, num_requests, kv_heads, tidx)
                if writes_out != 0:     # the single writer of these rows
                    self.epilogue(mOut, gate, my_rows, o_merged, l_merged)
                # my smem stays alive until every peer has read it (merge_cluster's relaxed arrive)
                cute.arch.cluster_wait()

    # ---------------------------------------------------------------------------- phases
    @cute.jit
    def init_barriers(self, tma_atom: cute.CopyAtom, full, warp: Int32):
        """Warp 0, before any global access: what needs no global data, the TMA descriptor (a
        kernel parameter) prefetch and the init of the ring's mbarriers full[0 .. stages) (count
        1: warp 0's expect_tx arrive), so the first KV load does not wait for them. The other
        warps see them after the kernel's CTA barrier before ring_prologue."""
        if warp == 0:
            cpasync.prefetch_descriptor(tma_atom)
            with cute.arch.elect_one():
                for stage in cutlass.range_constexpr(self.stages):
                    cute.arch.mbarrier_init(full + stage, 1)
                cute.arch.mbarrier_init_fence()

    @cute.jit
    def load_page_table_guesses(self, mPT: cute.Tensor, request: Int32, split: Int32, warp: Int32,
                                lane: Int32) -> Int32:
        """Every thread, before the PDL wait; returns pt_guess. Wide: what does not need L goes
        out together with L (one latency instead of two): warp w's guess of the CTA's page-table
        entries, 32 from step (w + 1) * split: chunk s starts at step s * steps // chunks, which
        one of them covers when steps / chunks is close to 1, 2, 3 or 4 (every CTA at L <= 1024,
        2048, 6144 and the multiples of 4096 up to 32768; 48% of the CTAs over the L up to 16384;
        split_plan). A guess, checked against L in stage_page_table; measured 0.2-0.4 us faster
        at B=1 (L = 512, 6000, 8192, with guesses of 1-3 and the tree of a node per 32 steps).
        Deep: -1 (its CTAs load their entries after L)."""
        pt_guess = Int32(-1)
        if const_expr(self.wide):
            pt_guess = mPT[request, cutlass.min((warp + 1) * split * self.pages_per_step + lane, mPT.shape[1] - 1)]
        return pt_guess

    @cute.jit
    def cta_steps(self, tree: _Tree):
        """(k_begin, my_steps, page_base) of this CTA: its first ring step in the request's steps,
        how many it runs, and its first page."""
        k_begin = tree.chunk_lo * tree.n_steps // tree.n_chunks
        my_steps = tree.chunk_hi * tree.n_steps // tree.n_chunks - k_begin
        page_base = tree.first_page + k_begin * self.pages_per_step
        return k_begin, my_steps, page_base

    @cute.jit
    def write_bad_length(self, mOut: cute.Tensor, mErr: cute.Tensor, request: Int32, kv_head: Int32,
                         split: Int32, tidx: Int32):
        """L outside [q_len, max_seq_len]: split 0 (every thread) writes zero rows for the pair
        and thread 0 sets error bit 1; no smem, no barrier (every CTA of the pair takes this path)."""
        if split == 0:
            threads_per_row = THREADS // self.rows
            columns_per_thread = HEAD_DIM // threads_per_row
            row = tidx // threads_per_row
            c0 = (tidx % threads_per_row) * columns_per_thread
            z = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), BFloat16)
            z.fill(0.0)
            qcol = (kv_head * GROUP + row % GROUP) * HEAD_DIM + c0
            cute.autovec_copy(z, cute.local_tile(mOut, (1, columns_per_thread),
                                                 (request * self.q_len + row // GROUP,
                                                  qcol // columns_per_thread))[0, None])
            if tidx == 0:
                set_error_bit(mErr, BAD_SEQ_LEN)

    @cute.jit
    def reduction_tree(self, L: Int32, split: Int32) -> _Tree:
        """The reduction tree of this request, from L and compile-time constants only
        (split_plan): ring steps of pages_per_step pages -> chunks (the steps cut evenly) ->
        subs of sub_chunks chunks -> nodes of 2 subs; and this CTA's place in it. CTA split =
        cluster * cluster_size + rank computes the chunks_per_cta chunks from chunk split *
        chunks_per_cta: wide, chunk split (rank of sub cluster); deep, sub split (rank of node
        cluster). Chunk j covers steps [j * n_steps // n_chunks, (j + 1) * n_steps // n_chunks).
        Pure arithmetic (every thread, same values)."""
        pages_per_step = self.pages_per_step
        key_lo = Int32(0)
        if const_expr(self.window > 0):
            key_lo = cutlass.max(L - self.q_len - self.window + 1, Int32(0))
        first_page = key_lo // PAGE_SIZE
        last_page = (L - 1) // PAGE_SIZE
        n_steps = (last_page - first_page + pages_per_step) // pages_per_step
        n_nodes = cutlass.max(n_steps // self.cfg.node_min_steps, Int32(n_steps >= self.cfg.two_node_steps) * 2)
        n_nodes = cutlass.max(Int32(1), cutlass.min(Int32(NODES_MAX), n_nodes))   # attn2_plan.node_count
        n_chunks = cutlass.min(2 * self.sub_chunks * n_nodes, n_steps)
        n_subs = (n_chunks + self.sub_chunks - 1) // self.sub_chunks
        n_nodes = (n_subs + 1) // 2
        cluster_size = self.cluster_size
        cluster = split // cluster_size
        rank = split % cluster_size
        n_clusters = n_nodes
        if const_expr(self.wide):
            n_clusters = n_subs
        chunk_lo = cutlass.min(split * self.chunks_per_cta, n_chunks)
        chunk_hi = cutlass.min(chunk_lo + self.chunks_per_cta, n_chunks)
        return _Tree(first_page, last_page, n_steps, n_chunks, n_subs, n_nodes, cluster, rank, n_clusters,
                     chunk_lo, chunk_hi)

    @cute.jit
    def stage_page_table(self, mPT: cute.Tensor, sPT: cute.Tensor, mErr: cute.Tensor, tree: _Tree,
                         page_base: Int32, my_steps: Int32, pt_guess: Int32, num_pages: Int32,
                         request: Int32, split: Int32, tidx: Int32, warp: Int32, lane: Int32):
        """This CTA's page-table entries -> sPT[0 .. min(my_steps * pages_per_step,
        page_table_max)) (one latency, not one per step), each the physical page or -1 past the
        last page or where invalid (error bit 2; _pt_entry). A wide CTA takes them from the guess
        of the first warp whose 32 entries cover them (that warp's lanes store), else every
        thread loads its share from the page table. No barrier: the caller's CTA barrier
        publishes sPT before ring_prologue / main_loop read it."""
        pages_per_step = self.pages_per_step
        width = mPT.shape[1]
        n_pt = cutlass.min(my_steps * pages_per_step, Int32(self.page_table_max))
        guess_warp = Int32(-1)
        if const_expr(self.wide):
            for guess in cutlass.range_constexpr(THREADS // 32 - 1, -1, -1):   # a guess per warp
                off = page_base - (guess + 1) * split * pages_per_step
                if Int32(off >= 0) * Int32(off + n_pt <= 32) != 0:
                    guess_warp = Int32(guess)
        if guess_warp >= 0:
            if warp == guess_warp:
                d = page_base - (warp + 1) * split * pages_per_step
                phys = cute.arch.shuffle_sync(pt_guess, cutlass.min(lane + d, Int32(31)))
                if lane < n_pt:
                    sPT[lane] = _pt_entry(page_base + lane, phys, tree.last_page, width, num_pages, mErr)
        else:
            for it in cutlass.range((n_pt + THREADS - 1) // THREADS, unroll=1):
                i_pt = it * THREADS + tidx
                if i_pt < n_pt:
                    lp = page_base + i_pt
                    phys = mPT[request, cutlass.min(lp, width - 1)]
                    sPT[i_pt] = _pt_entry(lp, phys, tree.last_page, width, num_pages, mErr)

    @cute.jit
    def store_query(self, sQ: cute.Tensor, qv: cute.Tensor, tidx: Int32):
        """Every thread: its Q pieces qv (_load_q) -> sQ (generic stores; the caller fences them
        for the async proxy of wgmma and publishes them with a CTA barrier)."""
        for it in cutlass.range_constexpr(M_TILE * 8 // THREADS):
            ci = tidx + it * THREADS
            cute.autovec_copy(qv[None, it], cute.local_tile(sQ, (1, 8), (ci // 8, ci % 8))[0, None])

    @cute.jit
    def ring_prologue(self, tma_atom: cute.CopyAtom, mKV_tma: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor,
                      sPages_layout: cute.ComposedLayout, full, sPT: cute.Tensor, kv_head: Int32,
                      my_steps: Int32, num_pages: Int32, warp: Int32, unwritten: Int32,
                      before_wait: cutlass.Constexpr[bool]):
        """The TMA partitions of the ring, pages (16, 64, pages_per_step * stages) against the
        cache's boxes; returns (tKVg, tKs, tVs). Warp 0 issues the ring prologue, steps 0 ..
        stages - 2 (those < my_steps), each completing on full[step]; needs sPT published. With
        cfg.early_ring the call before the PDL wait (before_wait) issues the steps < unwritten
        (unwritten_steps: no row the predecessor may write) and the call after it the rest;
        without it unwritten is 0, and the call after the wait issues them all."""
        sKp = cute.make_tensor(sK.iterator, sPages_layout.outer)
        sVp = cute.make_tensor(sV.iterator, sPages_layout.outer)
        gKV = cute.flat_divide(mKV_tma, (PAGE_SIZE, HEAD_DIM))      # (16, 64, 1, 2, Hkv, pages)
        tKs, tKVg = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sKp, 0, 2),
                                          cute.group_modes(gKV, 0, 2))
        tVs, _ = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sVp, 0, 2),
                                       cute.group_modes(gKV, 0, 2))
        if warp == 0:
            for k0 in cutlass.range_constexpr(self.stages - 1):
                if k0 < my_steps:
                    if Int32(k0 < unwritten) == Int32(before_wait):
                        _load_step(tma_atom, tKVg, tKs, tVs, full, sPT, kv_head, Int32(k0), Int32(k0),
                                   num_pages, self.pages_per_step, self.page_table_max)
        return tKVg, tKs, tVs

    @cute.jit
    def unwritten_steps(self, L: Int32, page_base: Int32) -> Int32:
        """How many of this CTA's first ring steps hold only rows of positions < L - q_len, which
        the kernel before attn2 does not write (it inserts the q_len new tokens, positions L - q_len
        .. L - 1; docs/DESIGN.md section 11): those loads may go out before the PDL wait. 0
        without cfg.early_ring (every load waits)."""
        if const_expr(not self.cfg.early_ring):
            return Int32(0)
        first_written_page = (L - self.q_len) // PAGE_SIZE
        return cutlass.max(first_written_page - page_base, Int32(0)) // self.pages_per_step

    @cute.jit
    def main_loop(self, tma_atom: cute.CopyAtom, tKVg: cute.Tensor, tKs: cute.Tensor, tVs: cute.Tensor, full,
                  sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor, sPT: cute.Tensor, tree: _Tree, L: Int32,
                  k_begin: Int32, page_base: Int32, my_steps: Int32, kv_head: Int32, num_pages: Int32,
                  scale_log2: Float32, tidx: Int32, warp: Int32, lane: Int32):
        """Every thread: the my_steps ring steps of this CTA's chunks, S = Q K^T, masks, online
        softmax, O += P V; with second_accumulator each chunk is folded into (acc_o, acc_m,
        acc_l) at its last step. Returns (thr_pv, O, m, l) of the CTA's partial: (tOrO, row_max,
        row_sum) with l per lane (not yet summed over the quad), or the second accumulator's
        (acc_o, acc_m, acc_l) with l summed. Expects sQ, sPT and the mbarriers published and the
        ring prologue issued; warp 0 keeps stages - 1 steps in flight (a CTA barrier per step
        frees the stage read in the step before). On return the last wgmma groups were waited
        for, but other warps may still read the ring: a CTA barrier must precede its reuse."""
        q_len = self.q_len
        window = self.window
        keys_per_step = self.keys_per_step
        stages = self.stages
        # ---- wgmma: S = Q K^T (A and B K-major in smem), O += P V (P in registers,
        # V the MN-major B through a transposed view of the ring)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, (1, 1, 1), (M_TILE, keys_per_step))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN,
            Float32, (1, 1, 1), (M_TILE, HEAD_DIM), a_source=warpgroup.OperandSource.RMEM)
        thr_qk = mma_qk.get_slice(tidx)
        thr_pv = mma_pv.get_slice(tidx)
        atom_qk = cute.make_mma_atom(mma_qk.op)
        atom_pv = cute.make_mma_atom(mma_pv.op)
        sVt = cute.composition(sV, cute.make_ordered_layout((HEAD_DIM, keys_per_step, stages), order=(1, 0, 2)))
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
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
        o_part, m_part, l_part = tOrO, row_max, row_sum
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
            chunk_end = (chunk_lo + 1) * tree.n_steps // tree.n_chunks - k_begin
            o_part, m_part, l_part = acc_o, acc_m, acc_l
        inv = cute.make_rmem_tensor(cute.make_layout(self.pages_per_step), Int32)

        # visible keys of token t: [lo_t, pos_t]; every row of the CTA sees [lo_all, pos_min].
        # Thread rows (wgmma C layout): 16 warp + lane // 4 + 8 h, h = 0, 1, i.e. tokens 2 warp + h
        # (rows >= self.rows are zero padding of q_len 1 and mirror its last token)
        pos0 = L - q_len
        lo_all = Int32(0)
        if const_expr(window > 0):
            lo_all = cutlass.max(L - window, Int32(0))
        t0 = cutlass.min(2 * warp, Int32(q_len - 1))
        t1 = cutlass.min(2 * warp + 1, Int32(q_len - 1))
        tail_lo = L - (page_base * PAGE_SIZE)            # first row >= L, relative to the split
        tail_hi = (tree.last_page + 1 - page_base) * PAGE_SIZE

        for k in cutlass.range(my_steps, unroll=1):
            stage = k % stages
            # every warp is done with step k-1, so its stage may be refilled
            cute.arch.sync_threads()
            k_next = k + stages - 1
            if const_expr(not self.wide):
                self.refill_stage(tma_atom, tKVg, tKs, tVs, full, sPT, kv_head, k_next, my_steps, num_pages, warp)
            kbase = (page_base + k * self.pages_per_step) * PAGE_SIZE
            for p in cutlass.range_constexpr(self.pages_per_step):
                inv[p] = Int32(sPT[cutlass.min(k * self.pages_per_step + p, Int32(self.page_table_max - 1))] < 0)
            cute.arch.mbarrier_wait(full + stage, (k // stages) % 2)
            self.zero_tail_rows(sV, stage, k, tail_lo, tail_hi, tidx)

            # ---- S = Q K^T (raw logits; the scale is folded into the exp). Wide: warp 0 issues
            # the refill while this wgmma runs, off the path the other warps wait on at it
            # (B=4 L=8192 13.2 against 13.9 us); deep refills first (issued this late, B=16
            # L=8192 took 28.8 against 27.7). Measured: bench/RESULTS.md, twelfth run.
            if const_expr(self.wide):
                wgmma_commit(atom_qk, tSrS, tSrQ, tSrK[None, None, None, stage], True)
                self.refill_stage(tma_atom, tKVg, tKs, tVs, full, sPT, kv_head, k_next, my_steps, num_pages, warp)
                cute.nvgpu.warpgroup.wait_group(0)
            else:
                wgmma_group(atom_qk, tSrS, tSrQ, tSrK[None, None, None, stage], True)
            self.mask_logits(tSrS, tScS, inv, kbase, lo_all, pos0, t0, t1)
            self.online_softmax(tSrS, tOrO, row_max, row_sum, corr, scale_log2)

            # ---- P -> bf16 A fragment (the C layout of S is the A layout of P V); O += P V
            for q in cutlass.range_constexpr(cute.size(tOrP32)):
                tOrP32[q] = pack_bf16x2(tSrS[2 * q], tSrS[2 * q + 1])
            wgmma_group(atom_pv, tOrO, tOrP, tOrVt[None, None, None, stage], False)

            if const_expr(self.second_accumulator):
                if k + 1 == chunk_end:
                    chunk_lo, chunk_end = self.fold_chunk(tOrO, row_max, row_sum, acc_o, acc_m, acc_l, fw,
                                                          chunk_lo, tree, k_begin)
        return thr_pv, o_part, m_part, l_part

    @cute.jit
    def refill_stage(self, tma_atom: cute.CopyAtom, tKVg: cute.Tensor, tKs: cute.Tensor, tVs: cute.Tensor, full,
                     sPT: cute.Tensor, kv_head: Int32, k_next: Int32, my_steps: Int32, num_pages: Int32, warp: Int32):
        """Warp 0, in step k after the step's CTA barrier: ring step k_next = k + stages - 1, if the
        CTA has it, into its stage (the one step k - 1 read, which every warp is done with)."""
        if warp == 0:
            if k_next < my_steps:
                _load_step(tma_atom, tKVg, tKs, tVs, full, sPT, kv_head, k_next, k_next % self.stages,
                           num_pages, self.pages_per_step, self.page_table_max)

    @cute.jit
    def zero_tail_rows(self, sV: cute.Tensor, stage: Int32, k: Int32, tail_lo: Int32, tail_hi: Int32,
                       tidx: Int32):
        """Step k, after its stage landed: the tail page's V rows >= L zeroed in smem (the cache
        holds anything there, and 0 * NaN = NaN; their logits are masked in mask_logits), then a
        proxy fence and a CTA barrier (every thread) before the P V wgmma reads them. Only on the
        step that holds rows >= L."""
        keys_per_step = self.keys_per_step
        r_lo = tail_lo - k * keys_per_step
        if r_lo < keys_per_step:
            n_z = (cutlass.min(tail_hi - k * keys_per_step, Int32(keys_per_step)) - r_lo) * 8
            if tidx < n_z:
                zv = cute.make_rmem_tensor(cute.make_layout((1, 8)), BFloat16)
                zv.fill(0.0)
                cute.autovec_copy(zv, cute.local_tile(sV[None, None, stage], (1, 8), (r_lo + tidx // 8, tidx % 8)))
            cute.arch.fence_view_async_shared()
            cute.arch.sync_threads()

    @cute.jit
    def mask_logits(self, tSrS: cute.Tensor, tScS: cute.Tensor, inv: cute.Tensor, kbase: Int32,
                    lo_all: Int32, pos0: Int32, t0: Int32, t1: Int32):
        """Masks (causal, window, tail, invalid pages) of the step's logits tSrS to -inf, on edge
        steps only: a step whose keys [kbase, kbase + keys_per_step) all lie in every row's
        visible range and whose pages are all valid (inv, 1 per invalid page) is left as is."""
        edge = Int32(kbase < lo_all + self.q_len) + Int32(kbase + self.keys_per_step - 1 > pos0)
        for p in cutlass.range_constexpr(self.pages_per_step):
            edge = edge + inv[p]
        if edge != 0:
            for i in cutlass.range_constexpr(cute.size(tSrS)):
                key = kbase + tScS[i][1]
                tt = t0
                if const_expr((i // 2) % 2 == 1):
                    tt = t1
                pos = pos0 + tt
                msk = Int32(key > pos) + inv[i // 8]      # C layout: column 8 (i // 4) + ..
                if const_expr(self.window > 0):
                    msk = msk + Int32(key < pos - self.window + 1)
                if msk != 0:
                    tSrS[i] = -math.inf

    @cute.jit
    def online_softmax(self, tSrS: cute.Tensor, tOrO: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                       corr: cute.Tensor, scale_log2: Float32):
        """Online softmax (base 2) of one step, rows h = 0 (lane//4) and 1 (lane//4 + 8): the logits
        tSrS become p, row_max / row_sum move, and tOrO is rescaled by corr where a row max of
        the warp moved. m is kept scaled (scale * log2 e > 0, so max commutes with it) and
        p = ex2(fma(s, scale_log2, -m)): one FFMA + MUFU per logit. The running max is lazy: it
        moves only when a logit exceeds it by more than RESCALE_SLACK (so p <= 2^8, exact in
        fp32 and bf16 range), and O is rescaled only when a row max of the warp moved (x * 1.0
        == x, so skipping is exact). Softmax is invariant to the reference point, so only
        rounding depends on the rule, and the rule depends on the data alone (bits stay
        deterministic)."""
        moved = Int32(0)
        for h in cutlass.range_constexpr(2):
            mx = tSrS[2 * h]
            for i in cutlass.range_constexpr(cute.size(tSrS)):
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
            for i in cutlass.range_constexpr(cute.size(tSrS)):
                if const_expr((i // 2) % 2 == h):
                    p = cute.math.exp2(cute.math.fma(tSrS[i], scale_log2, neg_m), fastmath=True)
                    tSrS[i] = p
                    psum = psum + p
            row_sum[h] = row_sum[h] * corr[h] + psum
        if cute.arch.vote_any_sync(moved != 0):
            for i in cutlass.range_constexpr(cute.size(tOrO)):
                tOrO[i] = tOrO[i] * corr[(i // 2) % 2]

    @cute.jit
    def fold_chunk(self, tOrO: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, acc_o: cute.Tensor,
                   acc_m: cute.Tensor, acc_l: cute.Tensor, fw: cute.Tensor, chunk_lo: Int32, tree: _Tree,
                   k_begin: Int32):
        """second_accumulator, at the last step of chunk chunk_lo (after its P V wgmma was waited
        for): fold the chunk (tOrO, row_max, row_sum) into the partial (acc_o, acc_m, acc_l) and
        restart the chunk from I. The same _fold_w / _fold_v as a wide cluster's DSMEM fold, so
        the bits match. Returns (chunk_lo, chunk_end) of the next chunk."""
        chunk_lo = chunk_lo + 1
        chunk_end = (chunk_lo + 1) * tree.n_steps // tree.n_chunks - k_begin
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
        return chunk_lo, chunk_end

    @cute.jit
    def trigger_dependents(self, num_requests: Int32, kv_heads: Int32, n_chunks: Int32, ctas_per_wave: Int32):
        """PDL trigger, after the main loop: the next grid in the stream may launch now and wait
        in its griddepcontrol.wait (it reads nothing of ours before our grid is done), so its
        launch and prologue (the next layer's weight stream, for qkv_front) overlap our merges.
        Every deep grid and every wide grid of more than QUIET_WIDE_PAIRS pairs triggers; a wide
        grid of fewer pairs only where it has at most one working CTA per SM (estimated from this
        request's L), so that the next grid's early CTAs take no SM slot that ours need. Why these
        grids: attn2_plan, QUIET_WIDE_PAIRS (measured in a stack of layers)."""
        if const_expr(self.cfg.pdl):
            if const_expr(self.wide):
                pairs = num_requests * kv_heads
                if pairs > QUIET_WIDE_PAIRS or pairs * n_chunks <= ctas_per_wave:
                    cute.arch.griddepcontrol_launch_dependents()
            else:
                cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def merge_rows(self, request: Int32, kv_head: Int32, rank: Int32, tidx: Int32) -> _MyRows:
        """The rows this CTA merges and writes: its rank's rows_per_rank rows, threads_per_row
        threads x columns_per_thread columns each (threads past them, active = 0, compute a
        duplicate of a clamped row and write nothing)."""
        rows_per_rank, threads_per_row = self.rows_per_rank, self.threads_per_row
        active = Int32(tidx < rows_per_rank * threads_per_row)
        row = cutlass.min(rank * rows_per_rank + tidx // threads_per_row, Int32(self.rows - 1))
        col0 = (tidx % threads_per_row) * self.columns_per_thread
        out_row = request * self.q_len + row // GROUP
        out_col = (kv_head * GROUP + row % GROUP) * HEAD_DIM + col0
        return _MyRows(active, row, col0, out_row, out_col)

    @cute.jit
    def load_gate(self, mY: cute.Tensor, my_rows: _MyRows, kv_heads: Int32) -> cute.Tensor:
        """This thread's columns_per_thread gate values (bf16, from y) of its row, into registers."""
        columns_per_thread = self.columns_per_thread
        gate_col = (GROUP + 2) * HEAD_DIM * kv_heads + my_rows.out_col
        gate = cute.make_rmem_tensor(cute.make_layout(columns_per_thread), BFloat16)
        cute.autovec_copy(cute.local_tile(mY, (1, columns_per_thread),
                                          (my_rows.out_row, gate_col // columns_per_thread))[0, None], gate)
        return gate

    @cute.jit
    def write_partial(self, sK: cute.Tensor, sXm: cute.Tensor, thr_pv: cute.ThrMma, o_part: cute.Tensor,
                      m_part: cute.Tensor, l_part: cute.Tensor, warp: Int32, lane: Int32) -> cute.Tensor:
        """Every thread, after a CTA barrier (no wgmma reads the rings any more): this CTA's
        partial (O, m, l) of main_loop -> sX [64, 64] fp32 and sXm [rows, 2] (l summed over the
        quad here when main_loop left it per lane); returns sX. sX lies over the K ring and, when
        that is smaller than 16 KB, the V ring allocated right after it (both 1 KB multiples;
        Attn2Config.create checks the size); rows >= self.rows are padding. Published to the cluster
        by merge_cluster's barrier."""
        sX = cute.make_tensor(cute.recast_ptr(sK.iterator, dtype=Float32),
                              cute.make_layout((M_TILE, HEAD_DIM), stride=(HEAD_DIM, 1)))
        tOsX = thr_pv.partition_C(sX)
        for i in cutlass.range_constexpr(cute.size(o_part)):
            tOsX[i] = o_part[i]
        for h in cutlass.range_constexpr(2):
            m_h = m_part[h]
            if const_expr(self.second_accumulator):
                l_h = l_part[h]
            else:
                l_h = quad_sum(l_part[h])
            row = 16 * warp + lane // 4 + 8 * h
            if lane % 4 == 0:
                if row < self.rows:
                    sXm[row, 0] = m_h
                    sXm[row, 1] = l_h
        return sX

    @cute.jit
    def merge_cluster(self, sX: cute.Tensor, sXm: cute.Tensor, my_rows: _MyRows, tree: _Tree):
        """Level 1 (DSMEM), every thread of every CTA of the cluster, after the kernel's
        cluster_arrive (the release of its sX / sXm): the barrier's wait, which publishes every
        peer's sX / sXm, then rank c folds its rows [c rows_per_rank, (c + 1) rows_per_rank) of
        the cluster's cluster_size partials, in rank order, starting from I.
        Wide: the chunks -> sub `cluster` (chunks past the request's end are skipped, as a deep
        CTA never folds them), and a lone sub becomes node 0 = fold(fold(I, sub 0), I). Deep: the
        2 subs -> node `cluster` (an empty sub is I and is folded, as the wide merge folds I for
        it). Ends with the relaxed arrive of the second cluster barrier, whose wait is the
        kernel's last step. Returns (m, l, o) of this thread's row and columns, and o_node, a
        scratch row for merge_workspace."""
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
        o_offset = my_rows.row * HEAD_DIM + my_rows.col0
        for j in cutlass.range_constexpr(cluster_size):      # every peer is alive until the 2nd barrier
            a_ml = cute.arch.map_dsmem_ptr(sXm.iterator + 2 * my_rows.row, Int32(j)).toint()
            m_peer[j], l_peer[j] = ld_dsmem_f32x2(a_ml)
            a_o = cute.arch.map_dsmem_ptr(sX.iterator + o_offset, Int32(j)).toint()
            for q in cutlass.range_constexpr(columns_per_thread // 4):
                o_peer[4 * q, j], o_peer[4 * q + 1, j], o_peer[4 * q + 2, j], o_peer[4 * q + 3, j] = \
                    ld_dsmem_f32x4(a_o + 16 * q)
        for j in cutlass.range_constexpr(cluster_size):
            # wide: a chunk past the request's end leaves the fold as it is
            take = Int32(tree.cluster * self.sub_chunks + j < tree.n_chunks)
            m_merged, l_merged = _fold_into(m_merged, l_merged, o_merged, m_peer[j], l_peer[j], o_peer[None, j],
                                            take, self.wide)
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

    @cute.jit
    def merge_workspace(self, mWs: cute.Tensor, sFlag: cute.Tensor, my_rows: _MyRows, tree: _Tree,
                        m_merged: Float32, l_merged: Float32, o_merged: cute.Tensor, o_node: cute.Tensor,
                        request: Int32, kv_head: Int32, num_requests: Int32, kv_heads: Int32, tidx: Int32):
        """Level 2 (more than one cluster), every thread: my partial (node, or sub when wide) of
        my rows -> workspace slot `cluster` of (request, KV head); a ticket per (request, KV head,
        rank); the last arriving cluster's CTA of this rank resets the counter and merges the
        partials of its rows (fold_workspace). Returns (writes_out, l): writes_out = 1 in that
        CTA only (then o_merged and l hold the merged rows), 0 elsewhere. Uses sFlag and two CTA
        barriers."""
        rows, columns_per_thread, threads_per_row = self.rows, self.columns_per_thread, self.threads_per_row
        nslot = num_requests * kv_heads * self.slots
        wsf = cute.recast_ptr(mWs.iterator, dtype=Float32)
        gWO = cute.make_tensor(wsf, cute.make_layout((nslot, rows, HEAD_DIM), stride=(rows * HEAD_DIM, HEAD_DIM, 1)))
        gWM = cute.make_tensor(wsf + nslot * rows * HEAD_DIM,
                               cute.make_layout((nslot, rows, 2), stride=(rows * 2, 2, 1)))
        # counters count back from the end of the workspace: their places do not move
        # with R, so one workspace serves calls of any batch size
        n_words = mWs.shape[0] // 4
        cnt_ptr = cute.recast_ptr(mWs.iterator, dtype=Uint32) + \
            (n_words - 1 - ((request * kv_heads + kv_head) * SUB_CHUNKS + tree.rank))
        slot0 = (request * kv_heads + kv_head) * self.slots
        if my_rows.active != 0:
            cute.autovec_copy(o_merged, cute.local_tile(gWO[slot0 + tree.cluster, None, None], (1, columns_per_thread),
                                                        (my_rows.row, tidx % threads_per_row))[0, None])
            if tidx % threads_per_row == 0:
                gWM[slot0 + tree.cluster, my_rows.row, 0] = m_merged
                gWM[slot0 + tree.cluster, my_rows.row, 1] = l_merged
        # one release, the ticket's: an acq_rel atomic by one thread after the barrier
        # is cumulative over the CTA's writes that the barrier ordered before it (as
        # CUTLASS's barrier arrive). SASS: MEMBAR.GPU, ATOMG, CCTL.IVALL; a separate
        # fence.acq_rel before it added a second MEMBAR.GPU; a fence in every thread
        # cost ~8% of the issue stalls (measured: "membar")
        cute.arch.sync_threads()
        if tidx == 0:
            old = cute.arch.atomic_add(cnt_ptr, Uint32(1), sem="acq_rel", scope="gpu")
            last = Int32(old == Uint32(tree.n_clusters - 1))
            sFlag[0] = last
            if last != 0:
                cute.arch.atomic_exch(cnt_ptr, Uint32(0), sem="relaxed", scope="gpu")
        cute.arch.sync_threads()     # the ticket's acquire (thread 0) -> every thread
        writes_out = sFlag[0]
        if writes_out != 0:
            l_merged = self.fold_workspace(gWO, gWM, slot0, my_rows, tree, l_merged, o_merged, o_node, tidx)
        return writes_out, l_merged

    @cute.jit
    def fold_workspace(self, gWO: cute.Tensor, gWM: cute.Tensor, slot0: Int32, my_rows: _MyRows, tree: _Tree,
                       l_merged: Float32, o_merged: cute.Tensor, o_node: cute.Tensor, tidx: Int32) -> Float32:
        """The last arriving CTA of a rank, every thread: the flat sum of the nodes of its rows
        from the workspace slots slot0 .. slot0 + n_clusters, into o_merged; returns l. Pass 1:
        M = the largest node max = the largest partial max (max is exact); pass 2: the nodes in
        order, each weighted ex2(m - M) (add_node). Loads go in groups of nodes_per_group nodes
        (indices clamped), independent of the folds, so their latencies overlap."""
        partials_per_node, nodes_per_group = self._workspace_groups()
        nodes_max = self.nodes_max
        # pass 1; with one group of nodes, M comes from pass 2's loads instead
        m_loads = cute.make_rmem_tensor(cute.make_layout(min(self.max_clusters, 8)), Float32)
        m_top = Float32(NEG_BIG)
        m_top = self.largest_max(gWM, slot0, my_rows, tree, m_loads, m_top)
        # pass 2: the nodes in order, each weighted ex2(m - M); a wide merge first
        # folds each node from its two subs as a deep pair does
        l_merged = Float32(0.0)
        o_merged.fill(0.0)
        columns_per_thread = self.columns_per_thread
        o_loads = cute.make_rmem_tensor(cute.make_layout((columns_per_thread, partials_per_node, nodes_per_group),
                                                         stride=(1, columns_per_thread,
                                                                 columns_per_thread * partials_per_node)), Float32)
        ml_loads = cute.make_rmem_tensor(cute.make_layout((2, partials_per_node, nodes_per_group),
                                                          stride=(1, 2, 2 * partials_per_node)), Float32)
        for group0 in cutlass.range_constexpr(0, nodes_max, nodes_per_group):
            if group0 < tree.n_nodes:
                self.load_node_group(gWO, gWM, slot0, my_rows, tree, o_loads, ml_loads, group0, tidx)
                if const_expr(group0 == 0):
                    m_top = self.max_of_first_group(ml_loads, tree, m_top)
                for u in cutlass.range_constexpr(min(nodes_per_group, nodes_max - group0)):
                    if group0 + u < tree.n_nodes:
                        l_merged = self.add_node(ml_loads, o_loads, u, group0 + u, tree, m_top, l_merged,
                                                 o_merged, o_node)
        return l_merged

    def _workspace_groups(self):
        """(partials per node, nodes per group of loads) of fold_workspace: compile-time ints."""
        partials_per_node = 2 if self.wide else 1
        nodes_per_group = max(1, min(self.nodes_max, 32 // (self.columns_per_thread * partials_per_node)))
        return partials_per_node, nodes_per_group

    @cute.jit
    def largest_max(self, gWM: cute.Tensor, slot0: Int32, my_rows: _MyRows, tree: _Tree, m_loads: cute.Tensor,
                    m_top: Float32) -> Float32:
        """Pass 1 of fold_workspace, when the nodes span more than one group of loads: the largest
        partial max of my row over the n_clusters slots, loaded in independent groups (indices
        clamped: a repeat leaves the max as is). Returns m_top (unchanged otherwise)."""
        max_clusters = self.max_clusters
        maxes_per_group = min(max_clusters, 8)
        if tree.n_nodes > self._workspace_groups()[1]:
            for group0 in cutlass.range_constexpr(0, max_clusters, maxes_per_group):
                if group0 < tree.n_clusters:
                    for u in cutlass.range_constexpr(maxes_per_group):
                        m_loads[u] = gWM[slot0 + cutlass.min(Int32(group0 + u), tree.n_clusters - 1), my_rows.row, 0]
                    for u in cutlass.range_constexpr(maxes_per_group):
                        m_top = cute.arch.fmax(m_top, m_loads[u])
        return m_top

    @cute.jit
    def load_node_group(self, gWO: cute.Tensor, gWM: cute.Tensor, slot0: Int32, my_rows: _MyRows, tree: _Tree,
                        o_loads: cute.Tensor, ml_loads: cute.Tensor, group0: cutlass.Constexpr[int], tidx: Int32):
        """Pass 2 of fold_workspace: the partials (m, l, O of my row and columns) of the nodes
        group0 .. group0 + nodes_per_group into ml_loads / o_loads (slot indices clamped)."""
        partials_per_node, nodes_per_group = self._workspace_groups()
        for u in cutlass.range_constexpr(nodes_per_group):
            for e in cutlass.range_constexpr(partials_per_node):
                slot = cutlass.min(Int32((group0 + u) * partials_per_node + e), tree.n_clusters - 1)
                ml_loads[0, e, u] = gWM[slot0 + slot, my_rows.row, 0]
                ml_loads[1, e, u] = gWM[slot0 + slot, my_rows.row, 1]
                cute.autovec_copy(cute.local_tile(gWO[slot0 + slot, None, None], (1, self.columns_per_thread),
                                                  (my_rows.row, tidx % self.threads_per_row))[0, None],
                                  o_loads[None, e, u])

    @cute.jit
    def max_of_first_group(self, ml_loads: cute.Tensor, tree: _Tree, m_top: Float32) -> Float32:
        """Pass 1 of fold_workspace when one group of loads covers every partial: M from pass 2's
        first loads. Returns m_top (unchanged otherwise)."""
        partials_per_node, nodes_per_group = self._workspace_groups()
        if tree.n_nodes <= nodes_per_group:
            for u in cutlass.range_constexpr(nodes_per_group):
                for e in cutlass.range_constexpr(partials_per_node):
                    m_top = cute.arch.fmax(m_top, ml_loads[0, e, u])
        return m_top

    @cute.jit
    def add_node(self, ml_loads: cute.Tensor, o_loads: cute.Tensor, u: cutlass.Constexpr[int],
                 node: cutlass.Constexpr[int], tree: _Tree, m_top: Float32, l_merged: Float32,
                 o_merged: cute.Tensor, o_node: cute.Tensor) -> Float32:
        """Pass 2 of fold_workspace for node `node`, whose partials are loads u: the node (wide:
        folded from its two subs, a missing second sub being I) into o_node, then added to
        (o_merged, l) with weight ex2(m - m_top), or taken as is when it is the only node.
        Returns l."""
        columns_per_thread = self.columns_per_thread
        m_n = ml_loads[0, 0, u]
        l_n = ml_loads[1, 0, u]
        for c in cutlass.range_constexpr(columns_per_thread):
            o_node[c] = o_loads[c, 0, u]
        if const_expr(self.wide):
            if 2 * node + 1 >= tree.n_subs:   # the node's second sub is I
                ml_loads[0, 1, u] = NEG_BIG
                ml_loads[1, 1, u] = 0.0
                for c in cutlass.range_constexpr(columns_per_thread):
                    o_loads[c, 1, u] = 0.0
            m_n, l_n = _node_into(o_node, ml_loads[0, 0, u], ml_loads[1, 0, u], o_loads[None, 0, u],
                                  ml_loads[0, 1, u], ml_loads[1, 1, u], o_loads[None, 1, u])
        if tree.n_nodes == 1:      # wide only: the node is the whole row
            l_merged = l_n
            for c in cutlass.range_constexpr(columns_per_thread):
                o_merged[c] = o_node[c]
        else:
            f = cute.math.exp2(sub_rn(m_n, m_top), fastmath=True)
            l_merged = fma_rn(l_n, f, l_merged)
            for c in cutlass.range_constexpr(columns_per_thread):
                o_merged[c] = fma_rn(o_node[c], f, o_merged[c])
        return l_merged

    @cute.jit
    def epilogue(self, mOut: cute.Tensor, gate: cute.Tensor, my_rows: _MyRows, o_merged: cute.Tensor,
                 l_merged: Float32):
        """The single writer of my rows, every thread: o / l, norm, gate, out (_epilogue; the
        threads_per_row lanes of a row reduce by butterfly, inactive lanes compute a duplicate)."""
        inv_l = cute.arch.rcp_approx(l_merged)
        for c in cutlass.range_constexpr(self.columns_per_thread):
            o_merged[c] = o_merged[c] * inv_l
        _epilogue(o_merged, gate, mOut, my_rows.out_row, my_rows.out_col, my_rows.active,
                  self.columns_per_thread, self.threads_per_row)


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
    return cute.compile(
        Attn2Sm90(cfg),
        fake(BFloat16, (rows, n), align=16),                            # y
        fake(BFloat16, (pages, hkv, PAGE_SIZE, CACHE_ROW), align=16),   # kv_cache
        fake(Int32, (nreq, width), align=4),                            # page_table
        fake(Int32, (nreq,), align=4),                                  # seq_lens
        fake(BFloat16, (rows, nq), align=16),                           # out
        fake(cutlass.Uint8, (nws,), align=16),                          # workspace
        fake(Int32, (1,), align=4),                                     # error flag
        Float32(0.5), Int32(cfg.max_seq_len), Int32(132), runtime.env_stream(),
        options=runtime.compile_options(extra_options))
