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
  visible pages are cut into ring steps of SP pages; about steps // 32 nodes (1 to NODES_MAX = 8,
  so at most 128 chunks); 2 subs per node; SUB_CHUNKS chunks per sub (WINDOW_SUB_CHUNKS = 4 for
  window deployments, whose ~33 steps make one node: 8 chunks);
  chunk j covers steps [j * steps // chunks, (j + 1) * steps // chunks). A chunk is an online
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
- PDL: every launch may start while its predecessor in the stream runs; griddepcontrol.wait
  comes before the first global access (only the TMA descriptor prefetch and the mbarrier init
  precede it), so any predecessor is safe. A wide grid of at most one working CTA per SM
  triggers its dependent launch after the main loop, so the next kernel's launch overlaps our
  merges when it is launched with PDL too; other grids do not trigger (the next grid's early
  CTAs took SM slots from ours, measured) and the next kernel launches as our CTAs exit.
- Start of a CTA: seq_len, then the page-table entries of its chunks, then the first KV load are
  three dependent latencies. A wide CTA issues its Q loads and three guesses of its page-table
  entries (32 from step s, 2 s and 3 s: where chunk s starts when steps // chunks is exactly 1, 2
  or 3) with seq_len's load, and takes the entries from a guess that covers them; a deep CTA
  issues Q before its page-table loads. Nothing depends on a guess being right.
- Grid (CS, Hkv * R, CL_MAX) with clusters of CS CTAs along x: the cluster index is the slowest
  dimension, so the clusters that have work (low indices) are dispatched first and the idle ones
  (beyond the request's subs / nodes) exit at the end. 128 threads = one warpgroup. CTA
  (rank, g, r) of cluster cl owns every query row of request r and KV head g (q_len * 8 rows,
  token-major: row m = t * 8 + j, zero-padded to the wgmma M of 64). Warp w holds rows
  16 w .. 16 w + 15 of the accumulators (tokens 2w, 2w + 1), lane rows lane // 4 and
  lane // 4 + 8 (the wgmma C layout).
- KV ring: NST stages of SP pages. Warp 0 issues, per page, one TMA box (16 rows x 64 columns) for
  its K half and one for its V half into 128 B-swizzled smem (the canonical K-major wgmma layout),
  completing on the stage's mbarrier; a CTA barrier per step frees the stage read in the step
  before. A page that the page table does not give (past the last page, or invalid) is read at
  page index num_pages, outside the tensor map, so TMA fills zeros and still counts its bytes.
  The tail page's V rows >= L are zeroed in smem before use (the cache holds anything there and
  0 * NaN = NaN); their logits, and those of invalid pages, are masked. Masking (causal, window,
  tail, invalid pages) runs on edge steps only.
- S = Q K^T: wgmma m64nNk16 (N = 16 SP keys), Q and K from smem. O += P V: wgmma m64n64k16 with
  P (bf16, packed cvt.rn.bf16x2) in registers -- the C layout of S is the A layout of P V -- and
  V read through a transposed view of the same swizzled ring (the MN-major B operand). Every
  wgmma group is waited for before its registers or smem are touched.
- Online softmax in base 2: p = ex2.approx.ftz(fma(s, scale * log2 e, -m)). The running max is
  lazy: it moves only when a logit exceeds it by more than RESCALE_SLACK = 8 (p <= 2^8, fine
  in fp32 and bf16), and O is rescaled only when a row max of the warp moved (x * 1 = x). The
  rule depends on the data alone, so the bits stay deterministic; softmax does not depend on
  the reference point, so only rounding changes. Running max starts at -1e30 (finite), so fully
  masked tiles need no branch.
- Merge, level 1 (DSMEM): each CTA leaves its partial (O, m, l) rows in its idle ring (a wide
  CTA its chunk, a deep CTA its sub); after a cluster barrier, rank c reads rows
  [c * RPR, (c + 1) * RPR) of all CS peers (ld.shared::cluster) and folds them in rank order from
  I (wide: chunks past the request's end are skipped by selection; deep: the pair's two subs).
  A second cluster barrier keeps every CTA's smem alive until its peers are done: its relaxed
  arrive follows the CTA's DSMEM loads, its wait is the CTA's last step (so the level-2 merge
  does not wait for the slowest peer's loads).
- Merge, level 2 (more than one node, or more than one sub when wide): rank c writes its rows of
  the cluster's partial to the workspace, one thread takes a ticket (one atom.acq_rel.gpu.add
  after a CTA barrier: cumulative over the CTA's writes) on the counter of (request, KV head, rank
  c); the last arriving cluster's CTA of rank c resets it to 0 and merges the partials of its
  rows: the largest max first, then the nodes in order (wide: each folded from its two subs
  first). Counters are self-resetting and sit at the end of the workspace, so one zeroed workspace
  serves calls of any batch size.
- One node (and after level 2): norm + gate, then out. Page-table entries of a CTA are staged in
  smem once.
- Status (H200, 2026-11-29, bench/RESULTS.md seventh run): correct, deterministic, batch
  invariant, both layouts bit-identical; faster than FA4 + norm-gate on every bench case;
  B=1 L=8192 in 7.6-7.7 us (the issue asks <= 8); every case whose floor is >= 20 us within
  1.07-1.30x of it. q_len 1 uses the same kernel (8 real rows of the 64). Tried and measured
  slower (sixth run): pushing the level-1 rows into the merging CTA (st.async or
  st.shared::cluster) instead of pulling them, and 1-step chunks at L = 8192. Seen and left: at
  B=1 L=8192 Hkv=2 the 16 clusters of 8 fit the H200's GPCs only 15 at a time, so one shares 8
  SMs with another; its CTAs end their loop ~0.8 us and pass the first cluster barrier ~1.5 us
  after the median CTA, and they finish the launch (bench/RESULTS-archive.md, seventh run).
- Epilogue: o = bf16(O * rcp(l)); ss summed over the thread's columns in order then a fixed
  butterfly; rsqrt.approx; sigmoid = rcp(1 + ex2(-g log2 e)); out = bf16(o * rs * sig).
"""
from __future__ import annotations

import math

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
from .attn2_plan import (LAYOUTS, M_TILE, NODE_MIN_STEPS, NODES_MAX, SUB_CHUNKS, THREADS, WIDE_MAX_PAIRS,  # noqa: F401
                         WIDE_MAX_PAIRS_WINDOW, WINDOW_SUB_CHUNKS,
                         Attn2Config, _config, can_implement, choose_layout, deployment_layouts,
                         deployment_variants, launch_config, split_plan, sub_chunks, wave_ctas,
                         workspace_bytes, workspace_layout)
from .ptx import (fma_rn, ld_dsmem_f32x2, ld_dsmem_f32x4, mul_rn, pack_bf16x2, quad_max, quad_sum, select,
                  set_error_bit, sub_rn, wgmma_group)

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
def _load_q(mY: cute.Tensor, qv: cute.Tensor, r: Int32, g: Int32, tidx: Int32, QL: cutlass.Constexpr[int]):
    """The Q tile of (request r, KV head g) into registers qv (8, its): 16-byte piece
    tidx + it * THREADS of the tile, i.e. row m = token * 8 + head, columns 8 (ci % 8) ..;
    rows >= q_len * 8 are zero."""
    for it in cutlass.range_constexpr(cute.size(qv, mode=[1])):
        ci = tidx + it * THREADS
        qm = ci // 8
        qv[None, it].fill(0.0)
        if qm < QL * GROUP:
            src = cute.local_tile(mY, (1, 8), (r * QL + qm // GROUP, (g * GROUP + qm % GROUP) * 8 + ci % 8))
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
               full, sPT: cute.Tensor, g: Int32, kloc: Int32, st: Int32, num_pages: Int32,
               SP: cutlass.Constexpr[int], PTMAX: cutlass.Constexpr[int]):
    """Warp 0: TMA the K and V halves of the SP pages of local step kloc into stage st, one
    (16, 64) box each, completing on full[st]. A page the smem page table marks -1 (past the
    last page, or invalid) is read at page index num_pages, out of the tensor map's bounds,
    so TMA fills it with zeros and still counts its bytes."""
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(full + st, SP * 2 * PAGE_SIZE * HEAD_DIM * 2)
    for p in cutlass.range_constexpr(SP):
        phys = sPT[cutlass.min(kloc * SP + p, Int32(PTMAX - 1))]
        src = phys
        if phys < 0:
            src = num_pages
        cute.copy(tma_atom, tKVg[None, 0, 0, g, src], tKs[None, st * SP + p], tma_bar_ptr=full + st)
        cute.copy(tma_atom, tKVg[None, 0, 1, g, src], tVs[None, st * SP + p], tma_bar_ptr=full + st)


@cute.jit
def _epilogue(o: cute.Tensor, gt: cute.Tensor, mOut: cute.Tensor, row_g: Int32,
              qcol: Int32, active: Int32, CPT: cutlass.Constexpr[int], TPR: cutlass.Constexpr[int]):
    """o: CPT fp32 values of one row (columns qcol..qcol+CPT of the head); writes
    bf16(sigmoid(gate) * rmsnorm(bf16(o))) if active. The TPR lanes of a row reduce by
    butterfly (every lane takes part, so inactive lanes compute a duplicate row)."""
    ob = cute.make_rmem_tensor(cute.make_layout(CPT), BFloat16)
    ob.store(o.load().to(BFloat16))
    of = cute.make_rmem_tensor(cute.make_layout(CPT), Float32)
    of.store(ob.load().to(Float32))
    ss = of[0] * of[0]
    for c in cutlass.range_constexpr(1, CPT):
        ss = ss + of[c] * of[c]
    for b in cutlass.range_constexpr(int(math.log2(TPR))):   # fixed butterfly over the row's lanes
        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << b)
    rs = cute.math.rsqrt(ss * (1.0 / HEAD_DIM) + RMS_EPS, fastmath=True)
    gf = cute.make_rmem_tensor(cute.make_layout(CPT), Float32)
    gf.store(gt.load().to(Float32))
    res = cute.make_rmem_tensor(cute.make_layout(CPT), Float32)
    for c in cutlass.range_constexpr(CPT):
        sig = cute.arch.rcp_approx(1.0 + cute.math.exp2(gf[c] * (-LOG2E), fastmath=True))
        res[c] = of[c] * rs * sig
    rb = cute.make_rmem_tensor(cute.make_layout(CPT), BFloat16)
    rb.store(res.load().to(BFloat16))
    if active != 0:
        cute.autovec_copy(rb, cute.local_tile(mOut, (1, CPT), (row_g, qcol // CPT))[0, None])

class Attn2Sm90:
    """One variant of the attn2 kernel (see the module docstring)."""

    def __init__(self, cfg: Attn2Config):
        self.cfg = cfg
        self.q_len = cfg.q_len
        self.window = cfg.window
        self.MR = cfg.mr
        self.SP = cfg.sp
        self.NK = cfg.nk
        self.NST = cfg.stages
        self.WIDE = cfg.wide
        self.SUBC = cfg.sub_chunks
        self.CS = cfg.cs
        self.CPC = cfg.cpc                # chunks per CTA
        # the CTA folds its chunks in a second accumulator; a one-chunk CTA needs none, since
        # fold(I, X) = X exactly (weights ex2(-1e30 - m) = 0 and ex2(0) = 1, fma(0, 0, x) = x)
        self.ACC = cfg.cpc > 1
        self.CL_MAX = cfg.cl_max
        self.SLOTS = cfg.slots
        self.NODES_MAX = cfg.nodes_max
        self.RPR = cfg.rows_per_rank      # rows each cluster rank merges and writes
        self.TPRM = min(16, THREADS // self.RPR)   # threads per row in the merges / epilogue
        self.CPTM = HEAD_DIM // self.TPRM
        self.PTMAX = cfg.pt_max

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
        R = mSeq.shape[0]
        hkv = mCache.shape[1]
        # K and V rings and Q: rows of 64 bf16 (128 B) in the 128 B swizzle, the canonical
        # K-major wgmma layout; V read through a transposed view is the MN-major B of P V
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        sRing_layout = cute.tile_to_shape(atom, (self.NK, HEAD_DIM, self.NST), (0, 1, 2))
        sPages_layout = cute.tile_to_shape(atom, (PAGE_SIZE, HEAD_DIM, self.SP * self.NST), (0, 1, 2))
        sQ_layout = cute.tile_to_shape(atom, (M_TILE, HEAD_DIM), (0, 1))
        # the cache as (row, column, KV head, page); a TMA box is one page's K or V half
        mKV = cute.make_tensor(mCache.iterator, cute.select(mCache.layout, mode=[2, 3, 1, 0]))
        tma_atom, mKV_tma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mKV, cute.slice_(sPages_layout, (None, None, 0)),
            (PAGE_SIZE, HEAD_DIM))
        occ = {}
        if const_expr(self.cfg.min_blocks > 0):
            occ = dict(min_blocks_per_mp=self.cfg.min_blocks, preferred_smem_carveout=100)
        if const_expr(self.CS > 1):
            occ["cluster"] = (self.CS, 1, 1)
        self.kernel(mY, mPT, mSeq, mOut, mWs, mErr, tma_atom, mKV_tma, sRing_layout, sPages_layout,
                    sQ_layout, mCache.shape[0], scale * LOG2E, max_seq_len, wave_ctas).launch(
            grid=(self.CS, hkv * R, self.CL_MAX), block=(THREADS, 1, 1), stream=stream,
            use_pdl=self.cfg.pdl, **occ)

    @cute.kernel
    def kernel(self, mY: cute.Tensor, mPT: cute.Tensor, mSeq: cute.Tensor,
               mOut: cute.Tensor, mWs: cute.Tensor, mErr: cute.Tensor,
               tma_atom: cute.CopyAtom, mKV_tma: cute.Tensor, sRing_layout: cute.ComposedLayout,
               sPages_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout,
               num_pages: Int32, scale_log2: Float32, max_seq_len: Int32, wave_ctas: Int32):
        QL = self.q_len
        W = self.window
        WIDE = self.WIDE
        ACC = self.ACC
        MR, SP, NK, NST, PTMAX = self.MR, self.SP, self.NK, self.NST, self.PTMAX
        tidx, _, _ = cute.arch.thread_idx()
        rank_x, gr, cl_z = cute.arch.block_idx()
        w = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        R = mSeq.shape[0]
        hkv = mKV_tma.shape[2]
        g = gr % hkv
        r = gr // hkv
        s = cl_z * self.CS + rank_x

        # ---- shared memory
        smem = SmemAllocator()
        full = smem.allocate_array(Int64, NST, byte_alignment=8)   # one mbarrier per ring stage
        sK = smem.allocate_tensor(BFloat16, sRing_layout.outer, byte_alignment=1024, swizzle=sRing_layout.inner)
        sV = smem.allocate_tensor(BFloat16, sRing_layout.outer, byte_alignment=1024, swizzle=sRing_layout.inner)
        sQ = smem.allocate_tensor(BFloat16, sQ_layout.outer, byte_alignment=1024, swizzle=sQ_layout.inner)
        sPT = smem.allocate_tensor(Int32, cute.make_layout(PTMAX), byte_alignment=16)
        sFlag = smem.allocate_tensor(Int32, cute.make_layout(4), byte_alignment=16)
        sXm = smem.allocate_tensor(Float32, cute.make_layout((MR, 2), stride=(2, 1)), byte_alignment=16)

        # ---- what needs no global data: the TMA descriptor (a kernel parameter) and the ring's
        # mbarriers, so the first KV load does not wait for them
        if w == 0:
            cpasync.prefetch_descriptor(tma_atom)
            with cute.arch.elect_one():
                for st0 in cutlass.range_constexpr(NST):
                    cute.arch.mbarrier_init(full + st0, 1)
                cute.arch.mbarrier_init_fence()
        # ---- PDL: this grid may start while its predecessor in the stream still runs; nothing
        # global is read or written before the predecessor is done, so any kernel may precede
        # (one that writes seq_lens or the page table too). Measured (tools/attn2_dev,
        # interleaved, us): B=1 L=8192 8.16 against 8.56 without PDL. The trigger for the next
        # grid comes after the main loop, in wide grids of at most one working CTA per SM.
        if const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()
        # ---- wide: issue what does not need L together with L (one latency instead of three):
        # Q (the CTA's rows of y), and warp w's guess of the CTA's page-table entries, 32 from
        # step (w + 1) * s: chunk s starts at step s * steps // chunks, which one of them covers
        # when steps / chunks is close to 1, 2 or 3 (every L <= 1024 and L a multiple of 2048
        # up to 24576; 63% of the L up to 16384; split_plan). A guess, checked against L below;
        # measured 0.2-0.4 us faster at B=1 (L = 512, 6000, 8192) than without the guesses.
        qv = cute.make_rmem_tensor(cute.make_layout((8, M_TILE * 8 // THREADS)), BFloat16)
        pt_guess = Int32(-1)
        if const_expr(WIDE):
            _load_q(mY, qv, r, g, tidx, QL)
            if w < 3:
                pt_guess = mPT[r, cutlass.min((w + 1) * s * SP + lane, mPT.shape[1] - 1)]
        L = mSeq[r]
        bad_len = Int32(L < QL) + Int32(L > max_seq_len)
        if bad_len != 0:
            # ---- invalid length: zero rows, flag bit 1 (split 0 only)
            if s == 0:
                TPR = THREADS // MR
                CPT = HEAD_DIM // TPR
                row = tidx // TPR
                c0 = (tidx % TPR) * CPT
                z = cute.make_rmem_tensor(cute.make_layout(CPT), BFloat16)
                z.fill(0.0)
                qcol = (g * GROUP + row % GROUP) * HEAD_DIM + c0
                cute.autovec_copy(z, cute.local_tile(mOut, (1, CPT), (r * QL + row // GROUP, qcol // CPT))[0, None])
                if tidx == 0:
                    set_error_bit(mErr, BAD_SEQ_LEN)
        else:
            # ---- the reduction tree of this request, from L and compile-time constants only
            # (split_plan): ring steps of SP pages -> chunks (the steps cut evenly) -> subs of
            # SUBC chunks -> nodes of 2 subs. CTA s = cl * CS + rank computes the CPC chunks from
            # chunk s * CPC: wide, chunk s (rank of sub cl); deep, sub s (rank of node cl).
            key_lo = Int32(0)
            if const_expr(W > 0):
                key_lo = cutlass.max(L - QL - W + 1, Int32(0))
            first_page = key_lo // PAGE_SIZE
            last_page = (L - 1) // PAGE_SIZE
            n_steps = (last_page - first_page + SP) // SP
            n_nodes = cutlass.max(Int32(1), cutlass.min(Int32(NODES_MAX), n_steps // self.cfg.node_min_steps))
            SUBC = self.SUBC
            n_chunks = cutlass.min(2 * SUBC * n_nodes, n_steps)
            n_subs = (n_chunks + SUBC - 1) // SUBC
            n_nodes = (n_subs + 1) // 2
            CS = self.CS
            cl = s // CS
            rank = s % CS
            # chunk j covers steps [j * n_steps // n_chunks, (j + 1) * n_steps // n_chunks)
            n_cl = n_nodes
            if const_expr(WIDE):
                n_cl = n_subs
            c_lo = cutlass.min(s * self.CPC, n_chunks)
            c_hi = cutlass.min(c_lo + self.CPC, n_chunks)
            if cl < n_cl:
                # every CTA of a live cluster runs to the cluster barriers, even with no steps
                k_begin = c_lo * n_steps // n_chunks
                my_steps = c_hi * n_steps // n_chunks - k_begin
                page_base = first_page + k_begin * SP

                # ---- Q (row m = token*8 + head; rows >= MR zero): a wide CTA issued its loads with
                # seq_len's; a deep one issues them now, before its page-table loads, and stores
                # them to smem after those (the two latencies overlap)
                if const_expr(not WIDE):
                    _load_q(mY, qv, r, g, tidx, QL)

                # ---- this CTA's page-table entries -> smem (one latency, not one per step); a wide
                # CTA takes them from the guess of the first warp whose 32 entries cover them
                width = mPT.shape[1]
                n_pt = cutlass.min(my_steps * SP, Int32(PTMAX))
                guess_w = Int32(-1)
                if const_expr(WIDE):
                    for w2 in cutlass.range_constexpr(2, -1, -1):
                        off = page_base - (w2 + 1) * s * SP
                        if Int32(off >= 0) * Int32(off + n_pt <= 32) != 0:
                            guess_w = Int32(w2)
                if guess_w >= 0:
                    if w == guess_w:
                        d = page_base - (w + 1) * s * SP
                        phys = cute.arch.shuffle_sync(pt_guess, cutlass.min(lane + d, Int32(31)))
                        if lane < n_pt:
                            sPT[lane] = _pt_entry(page_base + lane, phys, last_page, width, num_pages, mErr)
                else:
                    for it in cutlass.range((n_pt + THREADS - 1) // THREADS, unroll=1):
                        i_pt = it * THREADS + tidx
                        if i_pt < n_pt:
                            lp = page_base + i_pt
                            phys = mPT[r, cutlass.min(lp, width - 1)]
                            sPT[i_pt] = _pt_entry(lp, phys, last_page, width, num_pages, mErr)
                for it in cutlass.range_constexpr(M_TILE * 8 // THREADS):
                    ci = tidx + it * THREADS
                    cute.autovec_copy(qv[None, it], cute.local_tile(sQ, (1, 8), (ci // 8, ci % 8))[0, None])
                cute.arch.fence_view_async_shared()    # sQ (generic stores) -> wgmma (async proxy)
                cute.arch.sync_threads()               # sQ, sPT and the mbarriers visible

                # ---- TMA: pages of the ring (16, 64, SP * NST) against the cache's boxes
                sKp = cute.make_tensor(sK.iterator, sPages_layout.outer)
                sVp = cute.make_tensor(sV.iterator, sPages_layout.outer)
                gKV = cute.flat_divide(mKV_tma, (PAGE_SIZE, HEAD_DIM))      # (16, 64, 1, 2, Hkv, pages)
                tKs, tKVg = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sKp, 0, 2),
                                                  cute.group_modes(gKV, 0, 2))
                tVs, _ = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sVp, 0, 2),
                                               cute.group_modes(gKV, 0, 2))
                if w == 0:       # ring prologue: steps 0 .. NST-2
                    for k0 in cutlass.range_constexpr(NST - 1):
                        if k0 < my_steps:
                            _load_step(tma_atom, tKVg, tKs, tVs, full, sPT, g, Int32(k0), Int32(k0),
                                       num_pages, SP, PTMAX)

                # ---- wgmma: S = Q K^T (A and B K-major in smem), O += P V (P in registers,
                # V the MN-major B through a transposed view of the ring)
                mma_qk = sm90_utils.make_trivial_tiled_mma(
                    BFloat16, BFloat16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                    Float32, (1, 1, 1), (M_TILE, NK))
                mma_pv = sm90_utils.make_trivial_tiled_mma(
                    BFloat16, BFloat16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN,
                    Float32, (1, 1, 1), (M_TILE, HEAD_DIM), a_source=warpgroup.OperandSource.RMEM)
                thr_qk = mma_qk.get_slice(tidx)
                thr_pv = mma_pv.get_slice(tidx)
                atom_qk = cute.make_mma_atom(mma_qk.op)
                atom_pv = cute.make_mma_atom(mma_pv.op)
                sVt = cute.composition(sV, cute.make_ordered_layout((HEAD_DIM, NK, NST), order=(1, 0, 2)))
                tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
                tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
                tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sVt))
                tSrS = cute.make_rmem_tensor(thr_qk.partition_shape_C((M_TILE, NK)), Float32)
                tScS = thr_qk.partition_C(cute.make_identity_tensor((M_TILE, NK)))
                tOrO = cute.make_rmem_tensor(thr_pv.partition_shape_C((M_TILE, HEAD_DIM)), Float32)
                tOrO.fill(0.0)
                tOrP = thr_pv.make_fragment_A(thr_pv.partition_shape_A((M_TILE, NK)))
                tOrP32 = cute.recast_tensor(tOrP, Uint32)
                row_max = cute.make_rmem_tensor(cute.make_layout(2), Float32)
                row_sum = cute.make_rmem_tensor(cute.make_layout(2), Float32)
                row_max.fill(NEG_BIG)
                row_sum.fill(0.0)
                corr = cute.make_rmem_tensor(cute.make_layout(2), Float32)
                chunk_end = Int32(0)     # ACC: local step index where the current chunk ends
                if const_expr(ACC):
                    # the CTA's partial = left fold of its chunks, starting as the identity I
                    acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((M_TILE, HEAD_DIM)), Float32)
                    acc_m = cute.make_rmem_tensor(cute.make_layout(2), Float32)
                    acc_l = cute.make_rmem_tensor(cute.make_layout(2), Float32)
                    fw = cute.make_rmem_tensor(cute.make_layout((2, 2), stride=(1, 2)), Float32)
                    acc_o.fill(0.0)
                    acc_m.fill(NEG_BIG)
                    acc_l.fill(0.0)
                    chunk_end = (c_lo + 1) * n_steps // n_chunks - k_begin
                inv = cute.make_rmem_tensor(cute.make_layout(SP), Int32)

                # visible keys of token t: [lo_t, pos_t]; every row of the CTA sees [lo_all, pos_min].
                # Thread rows (wgmma C layout): 16 w + lane // 4 + 8 h, h = 0, 1, i.e. tokens 2w + h
                # (rows >= MR are zero padding of q_len 1 and mirror its last token)
                pos0 = L - QL
                lo_all = Int32(0)
                if const_expr(W > 0):
                    lo_all = cutlass.max(L - W, Int32(0))
                t0 = cutlass.min(2 * w, Int32(QL - 1))
                t1 = cutlass.min(2 * w + 1, Int32(QL - 1))
                tail_lo = L - (page_base * PAGE_SIZE)            # first row >= L, relative to the split
                tail_hi = (last_page + 1 - page_base) * PAGE_SIZE

                for k in cutlass.range(my_steps, unroll=1):
                    st = k % NST
                    # every warp is done with step k-1, so its stage may be refilled
                    cute.arch.sync_threads()
                    kn = k + NST - 1
                    if w == 0:
                        if kn < my_steps:
                            _load_step(tma_atom, tKVg, tKs, tVs, full, sPT, g, kn, kn % NST,
                                       num_pages, SP, PTMAX)
                    kbase = (page_base + k * SP) * PAGE_SIZE
                    for p in cutlass.range_constexpr(SP):
                        inv[p] = Int32(sPT[cutlass.min(k * SP + p, Int32(PTMAX - 1))] < 0)
                    cute.arch.mbarrier_wait(full + st, (k // NST) % 2)

                    # ---- the tail page's rows >= L: V rows zeroed (the cache holds anything
                    # there, and 0 * NaN = NaN); their logits are masked below
                    r_lo = tail_lo - k * NK
                    if r_lo < NK:
                        n_z = (cutlass.min(tail_hi - k * NK, Int32(NK)) - r_lo) * 8
                        if tidx < n_z:
                            zv = cute.make_rmem_tensor(cute.make_layout((1, 8)), BFloat16)
                            zv.fill(0.0)
                            cute.autovec_copy(zv, cute.local_tile(sV[None, None, st], (1, 8), (r_lo + tidx // 8, tidx % 8)))
                        cute.arch.fence_view_async_shared()
                        cute.arch.sync_threads()

                    # ---- S = Q K^T (raw logits; the scale is folded into the exp)
                    wgmma_group(atom_qk, tSrS, tSrQ, tSrK[None, None, None, st], True)

                    # ---- masks on edge steps only (causal, window, tail, invalid pages)
                    edge = Int32(kbase < lo_all + QL) + Int32(kbase + NK - 1 > pos0)
                    for p in cutlass.range_constexpr(SP):
                        edge = edge + inv[p]
                    if edge != 0:
                        for i in cutlass.range_constexpr(cute.size(tSrS)):
                            key = kbase + tScS[i][1]
                            tt = t0
                            if const_expr((i // 2) % 2 == 1):
                                tt = t1
                            pos = pos0 + tt
                            msk = Int32(key > pos) + inv[i // 8]      # C layout: column 8 (i // 4) + ..
                            if const_expr(W > 0):
                                msk = msk + Int32(key < pos - W + 1)
                            if msk != 0:
                                tSrS[i] = -math.inf

                    # ---- online softmax (base 2), rows h = 0 (lane//4) and 1 (lane//4 + 8).
                    # m is kept scaled (scale * log2 e > 0, so max commutes with it) and
                    # p = ex2(fma(s, scale_log2, -m)): one FFMA + MUFU per logit. The running max
                    # is lazy: it moves only when a logit exceeds it by more than RESCALE_SLACK
                    # (so p <= 2^8, exact in fp32 and bf16 range), and O is rescaled only when a
                    # row max of the warp moved (x * 1.0 == x, so skipping is exact). Softmax is
                    # invariant to the reference point, so only rounding depends on the rule, and
                    # the rule depends on the data alone (bits stay deterministic).
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

                    # ---- P -> bf16 A fragment (the C layout of S is the A layout of P V); O += P V
                    for q in cutlass.range_constexpr(cute.size(tOrP32)):
                        tOrP32[q] = pack_bf16x2(tSrS[2 * q], tSrS[2 * q + 1])
                    wgmma_group(atom_pv, tOrO, tOrP, tOrVt[None, None, None, st], False)

                    if const_expr(ACC):
                        # ---- last step of a chunk: fold the chunk into the partial, restart from I.
                        # The same _fold_w / _fold_v as a wide cluster's DSMEM fold, so the bits match.
                        if k + 1 == chunk_end:
                            c_lo = c_lo + 1
                            chunk_end = (c_lo + 1) * n_steps // n_chunks - k_begin
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

                # ---- PDL trigger: the next grid in the stream may launch now and wait in its
                # griddepcontrol.wait (it reads nothing of ours before our grid is done), so its
                # launch overlaps our merges. Only in wide grids of at most one working CTA per
                # SM (estimated from this request's L): there the next grid's early CTAs take no
                # SM slot that ours need. Measured (us, bench inputs, bench/RESULTS-archive.md
                # seventh run): B=1 L=8192 7.64 against 8.28, B=1 L=512 4.32 against 4.73;
                # B=8 L=2048 (256 CTAs) 9.50 against 9.84 in one process, 10.45-10.63 against
                # 10.1 in another; B=4 L=16384 (1024 CTAs, ab.py) 24.46 against 23.92; deep
                # grids slower (fifth run: B=32 L=4096 +4.5).
                if const_expr(WIDE and self.cfg.pdl):
                    if R * hkv * n_chunks <= wave_ctas:
                        cute.arch.griddepcontrol_launch_dependents()
                # ---- rows this CTA merges and writes: rank's RPR rows, TPRM threads x CPTM columns each
                RPR, TPRM, CPTM = self.RPR, self.TPRM, self.CPTM
                m_act = Int32(tidx < RPR * TPRM)
                mrow = cutlass.min(rank * RPR + tidx // TPRM, Int32(MR - 1))
                cm0 = (tidx % TPRM) * CPTM
                row_g = r * QL + mrow // GROUP
                qcol = (g * GROUP + mrow % GROUP) * HEAD_DIM + cm0
                gate_col = (GROUP + 2) * HEAD_DIM * hkv + qcol
                # gate issued now so its latency overlaps the merges
                gt = cute.make_rmem_tensor(cute.make_layout(CPTM), BFloat16)
                cute.autovec_copy(cute.local_tile(mY, (1, CPTM), (row_g, gate_col // CPTM))[0, None], gt)
                cute.arch.sync_threads()      # every wgmma read of the rings is done: reuse them

                # ---- this CTA's partial (O, m, l) -> sX [64, 64]
                # fp32, sXm [MR, 2]. sX lies over the K ring and, when that is smaller than 16 KB, the
                # V ring allocated right after it (both 1 KB multiples; Attn2Config.create checks the
                # size); rows >= MR are padding
                sX = cute.make_tensor(cute.recast_ptr(sK.iterator, dtype=Float32),
                                      cute.make_layout((M_TILE, HEAD_DIM), stride=(HEAD_DIM, 1)))
                tOsX = thr_pv.partition_C(sX)
                for i in cutlass.range_constexpr(cute.size(tOrO)):
                    if const_expr(ACC):
                        tOsX[i] = acc_o[i]
                    else:
                        tOsX[i] = tOrO[i]
                for h in cutlass.range_constexpr(2):
                    if const_expr(not ACC):
                        pm = row_max[h]
                        pl = quad_sum(row_sum[h])
                    else:
                        pm = acc_m[h]
                        pl = acc_l[h]
                    xrow = 16 * w + lane // 4 + 8 * h
                    if lane % 4 == 0:
                        if xrow < MR:
                            sXm[xrow, 0] = pm
                            sXm[xrow, 1] = pl

                # ---- level 1 (DSMEM): rank c folds rows [c RPR, (c + 1) RPR) of the cluster's CS
                # partials, in rank order, starting from I. Wide: the 8 chunks -> sub cl (chunks past
                # the request's end are skipped, as a deep CTA never folds them). Deep: the 2 subs ->
                # node cl (an empty sub is I and is folded, as the wide merge folds I for it).
                om = cute.make_rmem_tensor(cute.make_layout(CPTM), Float32)
                om.fill(0.0)
                m_g = Float32(NEG_BIG)
                l_g = Float32(0.0)
                cute.arch.cluster_arrive()       # release my sX / sXm to the cluster
                cute.arch.cluster_wait()
                mj = cute.make_rmem_tensor(cute.make_layout(CS), Float32)
                lj = cute.make_rmem_tensor(cute.make_layout(CS), Float32)
                oj = cute.make_rmem_tensor(cute.make_layout((CPTM, CS), stride=(1, CPTM)), Float32)
                xo = mrow * HEAD_DIM + cm0
                for j in cutlass.range_constexpr(CS):      # every peer is alive until the 2nd barrier
                    a_ml = cute.arch.map_dsmem_ptr(sXm.iterator + 2 * mrow, Int32(j)).toint()
                    mj[j], lj[j] = ld_dsmem_f32x2(a_ml)
                    a_o = cute.arch.map_dsmem_ptr(sX.iterator + xo, Int32(j)).toint()
                    for q in cutlass.range_constexpr(CPTM // 4):
                        oj[4 * q, j], oj[4 * q + 1, j], oj[4 * q + 2, j], oj[4 * q + 3, j] = \
                            ld_dsmem_f32x4(a_o + 16 * q)
                for j in cutlass.range_constexpr(CS):
                    # wide: a chunk past the request's end leaves the fold as it is
                    take = Int32(cl * SUBC + j < n_chunks)
                    m_g, l_g = _fold_into(m_g, l_g, om, mj[j], lj[j], oj[None, j], take, WIDE)
                # every load of a peer's smem issued above has returned (its value is used), so a
                # relaxed arrive suffices to let the peers exit; the matching wait is the CTA's last
                # step, so nothing below waits for the slowest peer's merge
                cute.arch.cluster_arrive_relaxed()
                onode = cute.make_rmem_tensor(cute.make_layout(CPTM), Float32)
                o_zero = cute.make_rmem_tensor(cute.make_layout(CPTM), Float32)   # O of I
                o_zero.fill(0.0)
                if const_expr(WIDE):
                    if n_subs == 1:
                        # node 0 = fold(fold(I, sub 0), I): what a deep pair whose rank 1 is empty computes
                        m_g, l_g = _node_into(onode, m_g, l_g, om, Float32(NEG_BIG), Float32(0.0), o_zero)
                        for c in cutlass.range_constexpr(CPTM):
                            om[c] = onode[c]

                writes_out = Int32(1)      # n_cl == 1: the (only) node is the whole row
                if n_cl > 1:
                    # ---- level 2: my partial (node, or sub when wide) -> workspace slot cl of (r, g);
                    # ticket per (request, KV head, rank); the last arriving cluster's CTA of this rank
                    # merges the nodes of its rows in order
                    SLOTS = self.SLOTS
                    nslot = R * hkv * SLOTS
                    wsf = cute.recast_ptr(mWs.iterator, dtype=Float32)
                    gWO = cute.make_tensor(wsf, cute.make_layout((nslot, MR, HEAD_DIM),
                                                                 stride=(MR * HEAD_DIM, HEAD_DIM, 1)))
                    gWM = cute.make_tensor(wsf + nslot * MR * HEAD_DIM,
                                           cute.make_layout((nslot, MR, 2), stride=(MR * 2, 2, 1)))
                    # counters count back from the end of the workspace: their places do not move
                    # with R, so one workspace serves calls of any batch size
                    n_words = mWs.shape[0] // 4
                    cnt_ptr = cute.recast_ptr(mWs.iterator, dtype=Uint32) + \
                        (n_words - 1 - ((r * hkv + g) * SUB_CHUNKS + rank))
                    slot0 = (r * hkv + g) * SLOTS
                    if m_act != 0:
                        cute.autovec_copy(om, cute.local_tile(gWO[slot0 + cl, None, None], (1, CPTM), (mrow, tidx % TPRM))[0, None])
                        if tidx % TPRM == 0:
                            gWM[slot0 + cl, mrow, 0] = m_g
                            gWM[slot0 + cl, mrow, 1] = l_g
                    # one release, the ticket's: an acq_rel atomic by one thread after the barrier
                    # is cumulative over the CTA's writes that the barrier ordered before it (as
                    # CUTLASS's barrier arrive). SASS: MEMBAR.GPU, ATOMG, CCTL.IVALL; a separate
                    # fence.acq_rel before it added a second MEMBAR.GPU; a fence in every thread
                    # cost ~8% of the issue stalls (measured: "membar")
                    cute.arch.sync_threads()
                    if tidx == 0:
                        old = cute.arch.atomic_add(cnt_ptr, Uint32(1), sem="acq_rel", scope="gpu")
                        last = Int32(old == Uint32(n_cl - 1))
                        sFlag[0] = last
                        if last != 0:
                            cute.arch.atomic_exch(cnt_ptr, Uint32(0), sem="relaxed", scope="gpu")
                    cute.arch.sync_threads()     # the ticket's acquire (thread 0) -> every thread
                    writes_out = sFlag[0]
                    if writes_out != 0:
                        NPS = 2 if WIDE else 1          # partials per node
                        NODES = self.NODES_MAX
                        GRP = max(1, min(NODES, 32 // (CPTM * NPS)))   # nodes per group of loads
                        # pass 1: M = the largest node max = the largest partial max (max is exact);
                        # loads in independent groups, indices clamped (a repeat leaves the max as
                        # is). With one group of nodes, M comes from pass 2's loads instead.
                        CL_MAX = self.CL_MAX
                        GM = min(CL_MAX, 8)
                        mbuf = cute.make_rmem_tensor(cute.make_layout(GM), Float32)
                        m_top = Float32(NEG_BIG)
                        if n_nodes > GRP:
                            for kg0 in cutlass.range_constexpr(0, CL_MAX, GM):
                                if kg0 < n_cl:
                                    for u in cutlass.range_constexpr(GM):
                                        mbuf[u] = gWM[slot0 + cutlass.min(Int32(kg0 + u), n_cl - 1), mrow, 0]
                                    for u in cutlass.range_constexpr(GM):
                                        m_top = cute.arch.fmax(m_top, mbuf[u])
                        # pass 2: the nodes in order, each weighted ex2(m - M); a wide merge first
                        # folds each node from its two subs as a deep pair does
                        l_g = Float32(0.0)
                        om.fill(0.0)
                        ok = cute.make_rmem_tensor(cute.make_layout((CPTM, NPS, GRP), stride=(1, CPTM, CPTM * NPS)), Float32)
                        mlk = cute.make_rmem_tensor(cute.make_layout((2, NPS, GRP), stride=(1, 2, 2 * NPS)), Float32)
                        for kg0 in cutlass.range_constexpr(0, NODES, GRP):
                            if kg0 < n_nodes:
                                for u in cutlass.range_constexpr(GRP):
                                    for e in cutlass.range_constexpr(NPS):
                                        kk = cutlass.min(Int32((kg0 + u) * NPS + e), n_cl - 1)
                                        mlk[0, e, u] = gWM[slot0 + kk, mrow, 0]
                                        mlk[1, e, u] = gWM[slot0 + kk, mrow, 1]
                                        cute.autovec_copy(cute.local_tile(gWO[slot0 + kk, None, None], (1, CPTM), (mrow, tidx % TPRM))[0, None], ok[None, e, u])
                                if const_expr(kg0 == 0):
                                    if n_nodes <= GRP:    # the loads cover every partial
                                        for u in cutlass.range_constexpr(GRP):
                                            for e in cutlass.range_constexpr(NPS):
                                                m_top = cute.arch.fmax(m_top, mlk[0, e, u])
                                for u in cutlass.range_constexpr(GRP):
                                    if const_expr(kg0 + u < NODES):
                                        if kg0 + u < n_nodes:
                                            m_n = mlk[0, 0, u]
                                            l_n = mlk[1, 0, u]
                                            for c in cutlass.range_constexpr(CPTM):
                                                onode[c] = ok[c, 0, u]
                                            if const_expr(WIDE):
                                                if 2 * (kg0 + u) + 1 >= n_subs:   # the node's second sub is I
                                                    mlk[0, 1, u] = NEG_BIG
                                                    mlk[1, 1, u] = 0.0
                                                    for c in cutlass.range_constexpr(CPTM):
                                                        ok[c, 1, u] = 0.0
                                                m_n, l_n = _node_into(onode, mlk[0, 0, u], mlk[1, 0, u], ok[None, 0, u],
                                                                      mlk[0, 1, u], mlk[1, 1, u], ok[None, 1, u])
                                            if n_nodes == 1:      # wide only: the node is the whole row
                                                l_g = l_n
                                                for c in cutlass.range_constexpr(CPTM):
                                                    om[c] = onode[c]
                                            else:
                                                f = cute.math.exp2(sub_rn(m_n, m_top), fastmath=True)
                                                l_g = fma_rn(l_n, f, l_g)
                                                for c in cutlass.range_constexpr(CPTM):
                                                    om[c] = fma_rn(onode[c], f, om[c])

                # ---- epilogue (the single writer of these rows): o / l, norm, gate, out
                if writes_out != 0:
                    inv_l = cute.arch.rcp_approx(l_g)
                    for c in cutlass.range_constexpr(CPTM):
                        om[c] = om[c] * inv_l
                    _epilogue(om, gt, mOut, row_g, qcol, m_act, CPTM, TPRM)
                # my smem stays alive until every peer has read it (the relaxed arrive above)
                cute.arch.cluster_wait()


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
