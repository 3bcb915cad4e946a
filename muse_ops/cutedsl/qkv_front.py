"""muse::qkv_front on Hopper (sm_90a): the fused QKV + output-gate projection, the per-head RMS
norm of q and k, interleaved RoPE, the y store and the paged K/V insert, in one CuTe DSL launch.

Math (docs/DESIGN.md section 4; numerics of muse_ops/reference/qkv_front.py):
    p = bf16(x @ W^T)                    fp32 accumulation, K = 8192
    q', k' per 64-column head: n = bf16(p_h * rsqrt(mean(p_h^2) + 1e-5)); with RoPE on pairs
           (2i, 2i+1): bf16(n_2i c_i - n_2i+1 s_i), bf16(n_2i+1 c_i + n_2i s_i)
    y = q' | k' | v | gate; kv_cache[slot // 16, h, slot % 16] = k'_h | v_h for slot >= 0

Tensors (contiguous, 16-byte aligned):
    x         bf16  [M, 8192]
    weight    bf16  [N, 8192]              N = 1152 Hkv: 8 Hkv q | Hkv k | Hkv v | 8 Hkv gate heads
    positions int32 | int64 [M]            RoPE rows (read only with RoPE)
    slots     int32 | int64 [M]            flat cache slot page * 16 + row; < 0 padding
    cos_sin   fp32  [P, 64]                cos | sin (a 1-row dummy without RoPE)
    kv_cache  bf16  [pages, Hkv, 16, 128]  K in columns 0:64, V in 64:128
    y         bf16  [M, N]
    error     int32 [1]                    |= BAD_SLOT (slot >= pages * 16), |= BAD_POSITION

Design (a split-K cluster per head on wgmma for every M; docs/DESIGN.md section 12):
- The output is computed transposed ("swap AB"): a head's 64 weight rows are the M = 64 of a
  wgmma, the tokens its N (the token tile, 8 to 256), so one wgmma shape serves one token and
  512 alike, and the weight, the operand that is large, streams through once per token tile.
- A cluster of S CTAs (the K split, qkv_front_plan.k_split: 3 for Hkv 1 and 2, 2 for Hkv 3, 1 for
  Hkv 4 to 7, 2 from Hkv 8) owns one group of heads (1 or 2) and one token tile; rank r sums K tiles
  [r 128 / S, (r+1) 128 / S) of 64 columns each. S depends on Hkv only, so at Hkv 2 the 36 heads run on 108 CTAs at any M.
- Per CTA: one producer warp streams, per K tile, the heads' 64 x 64 weight boxes and the
  T x 64 x box with TMA (128-byte swizzle, the canonical K-major wgmma layout), 1 or 4 K tiles a
  stage (qkv_front_plan.TILES), into a ring of full / empty mbarriers (a partial tile's x in
  boxes of 16 x 2^k rows that stop at most 15 rows past x, not one box reaching past it: TMA's
  fill of rows outside a tensor is slow, bench/RESULTS.md); one consumer warpgroup per
  head issues each tile's four m64nTk16 wgmmas (A = weight, B = x, both from shared memory) into
  an fp32 accumulator that starts at 0, and releases a stage once the next one's wgmmas are
  issued (one group in flight), or in tiles of up to 16 tokens, whose main loop waits for the
  weight's bytes, once its own wgmmas are complete (qkv_front_plan.RELEASE_AT_ONCE_TILE).
- The split-K sum: the tile's tokens are owned in blocks of 8 (an accumulator column group; 2
  in tiles of up to 16 tokens), block b by rank b % S. Once every CTA of the cluster has drained
  its ring (a cluster barrier), each pushes its fp32 accumulator straight from registers to the
  owners (st.shared::cluster, 8 bytes a store; with blocks of 8, 256 contiguous bytes a warp) into
  their landing zones in the ring, a [64 columns][block] slab per (owned block, source rank, head)
  (qkv_front_plan.landing_slab).
  After a second cluster barrier (release / acquire) the owner reads the S partials of its
  rows from its own shared memory and adds them in rank order (explicit add.rn), rounds to bf16
  and runs the epilogue: no global scratch, no atomics (except the error flag), no state across
  calls. A push needs no reply; with the owner pulling the partials over DSMEM (the design
  before) each epilogue pass waited on its loads: 0.2-0.35 us slower at most M, about 6 at M=512
  (bench/RESULTS.md).
- Epilogue: a quad of threads per (token, head) row, 16 columns each (16-byte loads and stores):
  sum of squares in column order (fma.rn) then a butterfly over the quad, rsqrt.approx, RoPE in
  fma.rn / mul.rn, cvt.rn.bf16x2; y, then for k and v heads the cache row (64-bit addresses: a
  cache may exceed 2^31 elements). A slot past the cache is skipped and flagged; a position
  outside cos_sin reads row 0 and is flagged. The cos_sin rows of a pass are loaded during the
  pass before it (0.4 us at M=256, bench/RESULTS.md).
- Batch invariance (the property the design is built around): a token's y and cache rows are the
  same bits whatever M, the token tile, the heads per CTA or the K tiles per stage: its
  accumulator sees the same k16 steps in the same order (each wgmma output element is a fixed
  function of its own row and column), the S partials are added in the same order, and the
  epilogue is the same code on the same quad mapping. Run to run it is deterministic for the same reasons.
- PDL: before griddepcontrol.wait a CTA only initialises its barriers and loads weights (no kernel
  writes them inside a step); every thread waits before it touches x, positions, slots, cos_sin,
  y or the cache. A CTA triggers the dependent launch once its producer has issued its last load
  (tiles of up to 64 tokens) or after its main loop (larger tiles; QkvFrontConfig.trigger_point),
  so the next kernel's prologue (attn2's) overlaps this one's last stages or its epilogue;
  attn2's occupancy caps keep its early CTAs from crowding the SMs this grid leaves free
  (qkv_front_plan, the trigger's comment).

Measurements: bench/RESULTS.md.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64, Uint32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cuda.bindings import driver as cuda

from ..config import CACHE_ROW, GROUP, HEAD_DIM, HIDDEN, PAGE_SIZE, RMS_EPS
from ..errors import BAD_POSITION, BAD_SLOT
from . import runtime
from .ptx import add_rn, fma_rn, mul_rn, pack_bf16x2, select, set_error_bit, st_dsmem_f32x2
from .qkv_front_plan import (K_TILE, K_TILES, MAX_K_SPLIT, STAMP_PHASES, STAMP_PRODUCER_PHASES,  # noqa: F401
                             STAMP_SLOTS, STAMP_SM_SLOT, X_BOX_MIN_ROWS, QkvFrontConfig, ci_variants, deployment_variants, k_split,
                             landing_offset, landing_slab, landing_slab_floats, launch_config, owned_token)

ROW_THREADS = 4                 # threads per (token, head) row of the epilogue (a quad)
ROW_COLS = HEAD_DIM // ROW_THREADS
DIV_SHIFT = 16                  # b // S = (b ceil(2^16 / S)) >> 16, exact for b < 2^8 and S <= 3
_INDEX = {"int32": Int32, "int64": Int64}


@cute.jit
def _st_global_v4(addr: Int64, v0: Uint32, v1: Uint32, v2: Uint32, v3: Uint32):
    """16 bytes at a 64-bit global address."""
    cute.arch.inline_ptx("st.global.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};",
                         read_only_args=[addr, v0, v1, v2, v3])


@cute.jit
def _row_norm(v: cute.Tensor):
    """rsqrt(mean(v^2) + eps) of a 64-column row whose ROW_COLS columns v this thread holds:
    squares in column order, then a butterfly over the row's quad (every lane gets the value)."""
    ss = mul_rn(v[0], v[0])
    for c in cutlass.range_constexpr(1, ROW_COLS):
        ss = fma_rn(v[c], v[c], ss)
    for b in cutlass.range_constexpr(ROW_THREADS.bit_length() - 1):   # lanes ROW_THREADS apart: other rows
        ss = add_rn(ss, cute.arch.shuffle_sync_bfly(ss, offset=1 << b))
    return cute.math.rsqrt(fma_rn(ss, Float32(1.0 / HEAD_DIM), Float32(RMS_EPS)), fastmath=True)


@cute.jit
def _store_row(addr: Int64, v: cute.Tensor):
    """bf16(v) (ROW_COLS fp32) as ROW_COLS * 2 bytes at a 16-byte aligned global address."""
    for q in cutlass.range_constexpr(ROW_COLS // 8):
        _st_global_v4(addr + 16 * q, pack_bf16x2(v[8 * q], v[8 * q + 1]), pack_bf16x2(v[8 * q + 2], v[8 * q + 3]),
                      pack_bf16x2(v[8 * q + 4], v[8 * q + 5]), pack_bf16x2(v[8 * q + 6], v[8 * q + 7]))


class QkvFrontSm90:
    """One variant of the qkv_front kernel (see the module docstring)."""

    def __init__(self, cfg: QkvFrontConfig):
        self.cfg = cfg
        self.token_tile = cfg.token_tile
        self.heads_per_cta = cfg.heads_per_cta
        self.stages = cfg.stages
        self.tiles_per_stage = cfg.k_tiles_per_stage
        self.rope = cfg.rope
        self.consumer_threads = 128 * cfg.heads_per_cta
        self.producer_warp = 4 * cfg.heads_per_cta
        self.rows_per_pass = self.consumer_threads // ROW_THREADS
        self.x_part_boxes = cfg.x_part_boxes
        self.owner_block = cfg.owner_block
        self.slab = landing_slab_floats(cfg.owner_block)

    @cute.jit
    def __call__(self, mX: cute.Tensor,       # bf16 [M, 8192]
                 mW: cute.Tensor,             # bf16 [N, 8192]
                 mPos: cute.Tensor,           # int32 | int64 [M]
                 mSlot: cute.Tensor,          # int32 | int64 [M]
                 mCS: cute.Tensor,            # fp32 [P, 64]
                 mCache: cute.Tensor,         # bf16 [pages, Hkv, 16, 128]
                 mY: cute.Tensor,             # bf16 [M, N]
                 mErr: cute.Tensor,           # int32 [1]
                 split: Int32,                # the K split S (cluster size)
                 stream: cuda.CUstream):
        tokens, heads, stages = self.token_tile, self.heads_per_cta, self.stages
        tiles_per_stage = self.tiles_per_stage
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        # weight: a (64, 64) box per head and K tile; x: a (tokens, 64) box per K tile; tiles_per_stage a stage
        sW_layout = cute.tile_to_shape(atom, (HEAD_DIM, K_TILE, stages * tiles_per_stage * heads), (0, 1, 2))
        sX_layout = cute.tile_to_shape(atom, (tokens, K_TILE, stages * tiles_per_stage), (0, 1, 2))
        tma_w, mW_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mW,
                                                    cute.slice_(sW_layout, (None, None, 0)), (HEAD_DIM, K_TILE))
        tma_x, mX_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mX,
                                                    cute.slice_(sX_layout, (None, None, 0)), (tokens, K_TILE))
        # a partial tile's x in boxes of x_part_boxes rows (tiles up to 32 tokens: none, one box);
        # the kernel takes their atoms and tensors as two tuples, as many as the tile uses (each is
        # a tensor map the launch builds and passes: a tile that needs none gets none)
        boxes = []
        for rows in self.x_part_boxes:
            box_layout = cute.tile_to_shape(atom, (rows, K_TILE, 1), (0, 1, 2))
            boxes.append(cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mX,
                                                     cute.slice_(box_layout, (None, None, 0)), (rows, K_TILE)))
        m = mX.shape[0]
        head_groups = mW.shape[0] // (HEAD_DIM * heads)
        # token tiles before head groups in launch order: the CTAs that read one head group's
        # weight rows run side by side, so the weight crosses from HBM once however many tiles
        # there are, even where it exceeds the L2 (Hkv >= 4) and the grid takes several waves
        self.kernel(tma_w, mW_tma, tma_x, mX_tma, tuple(a for a, _ in boxes), tuple(t for _, t in boxes), mPos, mSlot,
                    mCS, mCache, mY, mErr, sW_layout, sX_layout, split).launch(
            grid=(split, (m + tokens - 1) // tokens, head_groups), block=(self.cfg.threads, 1, 1),
            cluster=(split, 1, 1), stream=stream, use_pdl=self.cfg.pdl)

    @cute.kernel
    def kernel(self, tma_w: cute.CopyAtom, mW_tma: cute.Tensor, tma_x: cute.CopyAtom, mX_tma: cute.Tensor,
               box_atoms: tuple, box_tensors: tuple, mPos: cute.Tensor, mSlot: cute.Tensor, mCS: cute.Tensor, mCache: cute.Tensor, mY: cute.Tensor,
               mErr: cute.Tensor, sW_layout: cute.ComposedLayout, sX_layout: cute.ComposedLayout, split: Int32):
        """CTA (rank, tile, head_group): the K tiles of `rank` for the heads_per_cta heads from
        head_group * heads_per_cta and the token_tile tokens from tile * token_tile. Warps
        0 .. 4 heads_per_cta - 1 are the consumer warpgroups (one head each), the next one the producer."""
        tokens, heads, stages = self.token_tile, self.heads_per_cta, self.stages
        tidx, _, _ = cute.arch.thread_idx()
        rank, tile, head_group = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        self.stamp("entry")

        # ---- shared memory: the ring's barriers and stages (x's stages right after the weight's),
        # the epilogue's indices; after the main loop the ring is the landing zone of the split-K sum
        smem = SmemAllocator()
        full = smem.allocate_array(Int64, stages, byte_alignment=8)
        empty = smem.allocate_array(Int64, stages, byte_alignment=8)
        sW = smem.allocate_tensor(BFloat16, sW_layout.outer, byte_alignment=1024, swizzle=sW_layout.inner)
        sX = smem.allocate_tensor(BFloat16, sX_layout.outer, byte_alignment=1024, swizzle=sX_layout.inner)
        sSlot = smem.allocate_tensor(Int64, cute.make_layout(tokens), byte_alignment=16)   # the tile's slots
        sPos = smem.allocate_tensor(Int32, cute.make_layout(tokens), byte_alignment=16)    # and RoPE rows
        sL = cute.make_tensor(cute.recast_ptr(sW.iterator, dtype=Float32),
                              cute.make_layout(self.cfg.landing_bytes // 4))
        if warp == self.producer_warp:
            cpasync.prefetch_descriptor(tma_w)
            cpasync.prefetch_descriptor(tma_x)
            for box in box_atoms:
                cpasync.prefetch_descriptor(box)
            with cute.arch.elect_one():
                for s in cutlass.range_constexpr(stages):
                    cute.arch.mbarrier_init(full + s, 1)
                    cute.arch.mbarrier_init(empty + s, 4 * heads)   # one arrive per consumer warp
                cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        # ---- this rank's K tiles: a function of the split alone, which depends on Hkv alone (the
        # last stage may hold fewer than tiles_per_stage of them)
        kt_lo = rank * K_TILES // split
        n_k = (rank + 1) * K_TILES // split - kt_lo

        if warp == self.producer_warp:
            self.produce(tma_w, mW_tma, tma_x, mX_tma, box_atoms, box_tensors, sW, sX, full, empty, head_group, tile, kt_lo, n_k, mPos, mSlot, mCS, mErr, sSlot, sPos,
                         mY.shape[0])
            self.rings_drained()
        else:
            acc = self.consume(sW, sX, full, empty, n_k, warp // 4, tidx % 128)
            self.stamp("loop_end")
            if const_expr(self.cfg.trigger_point == "main_loop"):
                cute.arch.griddepcontrol_launch_dependents()   # larger tiles: after the main loop
            self.rings_drained()
            self.stamp("drained")
            self.push_partial(acc, sL, warp // 4, tidx % 128, rank, split)
        # the pushes are released to their owners and acquired by them; after this no CTA touches
        # another's shared memory, so none waits for its peers again
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        self.stamp("pushed")
        if warp < self.producer_warp:
            if const_expr(self.cfg.pdl):
                cute.arch.griddepcontrol_wait()   # before the first global access of these threads
            if const_expr(self.cfg.epilogue):
                self.reduce_and_store(sL, sSlot, sPos, mCS, mCache, mY, mErr, split, rank, head_group, tile, tidx)
                self.stamp("done")

    @cute.jit
    def produce(self, tma_w: cute.CopyAtom, mW_tma: cute.Tensor, tma_x: cute.CopyAtom, mX_tma: cute.Tensor,
                box_atoms, box_tensors, sW: cute.Tensor, sX: cute.Tensor, full, empty, head_group: Int32, tile: Int32,
                kt_lo: Int32, n_k: Int32, mPos: cute.Tensor, mSlot: cute.Tensor, mCS: cute.Tensor, mErr: cute.Tensor,
                sSlot: cute.Tensor, sPos: cute.Tensor, m: Int32):
        """The producer warp: per K tile, a weight box (64 x 64) per head and the tile's x
        (load_x), tiles_per_stage K tiles to a stage. The weights of the first stages go out before
        griddepcontrol.wait; once the ring is full, the epilogue's indices are staged (stage_indices)."""
        tokens, heads, stages = self.token_tile, self.heads_per_cta, self.stages
        tiles_per_stage = self.tiles_per_stage
        gW = cute.flat_divide(mW_tma, (HEAD_DIM, K_TILE))          # (64, 64, heads, 128)
        gX = cute.flat_divide(mX_tma, (tokens, K_TILE))                 # (tokens, 64, token tiles, 128)
        tWs, tWg = cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                         cute.group_modes(gW, 0, 2))
        tXs, tXg = cpasync.tma_partition(tma_x, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                         cute.group_modes(gX, 0, 2))
        # the rows of x a K tile loads: the whole box, or for a partial tile its rows rounded up to
        # X_BOX_MIN_ROWS, as boxes of x_part_boxes rows (qkv_front_plan.x_part_box_counts)
        x_rows = Int32(tokens)
        boxes = []   # (atom, smem boxes, gmem boxes, rows, count, first row in the tile)
        if const_expr(len(self.x_part_boxes) > 0):
            x_rows = cutlass.min(Int32(tokens), (m - tile * tokens + X_BOX_MIN_ROWS - 1) // X_BOX_MIN_ROWS
                                 * X_BOX_MIN_ROWS)
            left = x_rows
            first = Int32(0)
            for i, rows in enumerate(self.x_part_boxes):
                gB = cute.flat_divide(box_tensors[i], (rows, K_TILE))    # (rows, 64, row blocks, 128)
                sB = cute.flat_divide(sX, (rows, K_TILE))                # (rows, 64, tokens / rows, 1, slots)
                tBs, tBg = cpasync.tma_partition(box_atoms[i], 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                                 cute.group_modes(gB, 0, 2))
                count = left // rows
                boxes.append((box_atoms[i], tBs, tBg, rows, count, first))
                left = left - count * rows
                first = first + count * rows
        whole = Int32(x_rows == tokens)
        step_bytes = (heads * HEAD_DIM + x_rows) * K_TILE * 2
        n_stages = (n_k + tiles_per_stage - 1) // tiles_per_stage
        n_pre = cutlass.min(n_stages, Int32(stages))
        for i in cutlass.range(n_pre, unroll=1):
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(
                    full + i, cutlass.min(n_k - i * tiles_per_stage, Int32(tiles_per_stage)) * step_bytes)
            for j in cutlass.range_constexpr(tiles_per_stage):
                if i * tiles_per_stage + j < n_k:
                    for h in cutlass.range_constexpr(heads):
                        cute.copy(tma_w, tWg[None, head_group * heads + h, kt_lo + i * tiles_per_stage + j],
                                  tWs[None, (i * tiles_per_stage + j) * heads + h], tma_bar_ptr=full + i)
        if const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()   # x is the previous kernel's output
            self.stamp("wait")
        for i in cutlass.range(n_pre, unroll=1):
            for j in cutlass.range_constexpr(tiles_per_stage):
                if i * tiles_per_stage + j < n_k:
                    self.load_x(tma_x, tXs, tXg, boxes, whole, tile, kt_lo + i * tiles_per_stage + j,
                                i * tiles_per_stage + j, full + i)
        self.stage_indices(mPos, mSlot, mCS, mErr, sSlot, sPos, m, tile)   # the ring is in flight meanwhile
        for i in cutlass.range(n_pre, n_stages, unroll=1):
            s = i % stages
            cute.arch.mbarrier_wait(empty + s, (i // stages + 1) % 2)   # its previous use is released
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(
                    full + s, cutlass.min(n_k - i * tiles_per_stage, Int32(tiles_per_stage)) * step_bytes)
            for j in cutlass.range_constexpr(tiles_per_stage):
                if i * tiles_per_stage + j < n_k:
                    kt = kt_lo + i * tiles_per_stage + j
                    for h in cutlass.range_constexpr(heads):
                        cute.copy(tma_w, tWg[None, head_group * heads + h, kt],
                                  tWs[None, (s * tiles_per_stage + j) * heads + h],
                                  tma_bar_ptr=full + s)
                    self.load_x(tma_x, tXs, tXg, boxes, whole, tile, kt, s * tiles_per_stage + j, full + s)
        if const_expr(self.cfg.trigger_point == "last_load"):
            # every load of this CTA is issued: the next kernel may launch and run its prologue
            # while the ring drains (qkv_front_plan, the trigger's comment)
            cute.arch.griddepcontrol_launch_dependents()
        self.stamp("issued")

    @cute.jit
    def load_x(self, tma_x: cute.CopyAtom, tXs: cute.Tensor, tXg: cute.Tensor, boxes, whole: Int32, tile: Int32,
               kt: Int32, slot: Int32, bar):
        """K tile kt of the tile's x into ring slot `slot`: one box for a whole tile, else the
        partial tile's boxes (the last may reach past x by fewer than X_BOX_MIN_ROWS rows). Rows
        past x keep whatever the ring held: they only reach the wgmma columns of tokens past M,
        which nothing stores."""
        if const_expr(len(boxes) == 0):
            cute.copy(tma_x, tXg[None, tile, kt], tXs[None, slot], tma_bar_ptr=bar)
        else:
            if whole != 0:
                cute.copy(tma_x, tXg[None, tile, kt], tXs[None, slot], tma_bar_ptr=bar)
            else:
                for atom, tBs, tBg, rows, count, first in boxes:
                    for b in cutlass.range(count, unroll=1):
                        block = first // rows + b
                        cute.copy(atom, tBg[None, tile * (self.token_tile // rows) + block, kt],
                                  tBs[None, block, 0, slot], tma_bar_ptr=bar)

    def tiled_mma(self):
        """The wgmma of a consumer warpgroup: 64 head columns x token_tile tokens, fp32."""
        return sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, warpgroup.OperandMajorMode.K,
                                                 warpgroup.OperandMajorMode.K, Float32, (1, 1, 1),
                                                 (HEAD_DIM, self.token_tile))

    @cute.jit
    def consume(self, sW: cute.Tensor, sX: cute.Tensor, full, empty, n_k: Int32, wg: Int32, wg_tidx: Int32):
        """Consumer warpgroup wg (head head_group * heads + wg): acc (64 rows x tokens tokens, fp32, from
        0) += W_tile x_tile^tokens over the rank's K tiles in order, four k16 wgmmas a tile, one wgmma
        group a stage, mma_lag groups in flight when a stage is released (1, or 0 for tiles of up
        to RELEASE_AT_ONCE_TILE tokens). Returns the accumulator, every wgmma complete."""
        tokens, heads, stages = self.token_tile, self.heads_per_cta, self.stages
        mma = self.tiled_mma()
        thr = mma.get_slice(wg_tidx)
        atom = cute.make_mma_atom(mma.op)
        tCrW = thr.make_fragment_A(thr.partition_A(sW))
        tCrX = thr.make_fragment_B(thr.partition_B(sX))
        acc = cute.make_rmem_tensor(thr.partition_shape_C((HEAD_DIM, tokens)), Float32)
        acc.fill(0.0)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        lane = cute.arch.lane_idx()
        tiles_per_stage = self.tiles_per_stage
        for i in cutlass.range((n_k + tiles_per_stage - 1) // tiles_per_stage, unroll=1):
            s = i % stages
            cute.arch.mbarrier_wait(full + s, (i // stages) % 2)
            if const_expr(self.cfg.stamps != 0):   # (stamp guards itself; this keeps i == 0 out of plain variants)
                if i == 0:
                    self.stamp("first")
            warpgroup.fence()
            for j in cutlass.range_constexpr(tiles_per_stage):
                # K tiles in order, k16 steps in order: the same for any tiles_per_stage
                if i * tiles_per_stage + j < n_k:
                    for kb in cutlass.range_constexpr(K_TILE // 16):
                        cute.gemm(atom, acc, tCrW[None, None, kb, (s * tiles_per_stage + j) * heads + wg],
                                  tCrX[None, None, kb, s * tiles_per_stage + j], acc)
            warpgroup.commit_group()
            if const_expr(self.cfg.mma_lag == 1):
                warpgroup.wait_group(1)      # the previous stage's wgmmas have read it: free it
                if i > 0:
                    if lane == 0:
                        cute.arch.mbarrier_arrive(empty + (i - 1) % stages)
            else:
                warpgroup.wait_group(0)      # memory-bound tiles: free this stage at once
                if lane == 0:
                    cute.arch.mbarrier_arrive(empty + s)
        warpgroup.wait_group(0)
        return acc

    @cute.jit
    def rings_drained(self):
        """Every thread of the cluster: after this barrier no CTA reads its ring again (every stage
        was waited for, so the producers' copies have landed, and every wgmma is complete), so
        partials may land in any of them. Relaxed: nothing written before it is read after it."""
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()

    @cute.jit
    def push_partial(self, acc: cute.Tensor, sL: cute.Tensor, wg: Int32, wg_tidx: Int32, rank: Int32,
                     split: Int32):
        """Consumer warpgroup wg: the accumulator to its owners' landing zones. Token block b (of
        owner_block tokens) belongs to rank b % split, and lands in its slab
        qkv_front_plan.landing_slab(b // split, rank, wg) at landing_offset(column, token %
        owner_block). A thread holds each head column's tokens in consecutive pairs (the wgmma C
        layout: values (2 columns, 2 row halves, column groups)), so it stores 8 bytes at a time;
        with blocks of 8 a warp's store of one column group is 256 contiguous bytes to one owner.
        Stores to a peer need no reply, so the warps go on as soon as they are issued."""
        thr = self.tiled_mma().get_slice(wg_tidx)
        coords = thr.partition_C(cute.make_identity_tensor((HEAD_DIM, self.token_tile)))
        magic = ((1 << DIV_SHIFT) + split - 1) // split
        # the landing zone's address in each rank's window (ranks past the split: the last one, unused)
        base = [cute.arch.map_dsmem_ptr(sL.iterator, cutlass.min(Int32(r), split - 1)).toint()
                for r in range(MAX_K_SPLIT)]
        for i in cutlass.range_constexpr(0, cute.size(acc), 2):
            c, t = coords[i]                      # acc[i + 1] is (c, t + 1)
            block = t // self.owner_block
            owned = (block * magic) >> DIV_SHIFT
            owner = block - owned * split
            owner_base = base[0]
            for r in cutlass.range_constexpr(1, MAX_K_SPLIT):
                owner_base = owner_base + Int32(owner == r) * (base[r] - base[0])
            slab = landing_slab(owned, rank, wg, split, self.heads_per_cta)
            offset = slab * self.slab + landing_offset(c, t % self.owner_block, self.owner_block)
            st_dsmem_f32x2(owner_base + offset * 4, acc[i], acc[i + 1])

    @cute.jit
    def stamp(self, phase: str):
        """Development only (QkvFrontConfig.stamps; compiles to nothing without it): the global
        timer into this CTA's slot for `phase` (qkv_front_plan.STAMP_PHASES), by thread 0, or by
        the producer warp's lane 0 for the producer's phases; "entry" also stamps the SM id."""
        if const_expr(self.cfg.stamps != 0):
            bx, by, bz = cute.arch.block_idx()
            gx, gy, _ = cute.arch.grid_dim()
            row = Int64(self.cfg.stamps) + ((Int64(bz) * gy + by) * gx + bx) * (STAMP_SLOTS * 8)
            tidx, _, _ = cute.arch.thread_idx()
            lead = tidx == 0
            if const_expr(phase in STAMP_PRODUCER_PHASES):
                lead = cute.arch.lane_idx() == 0
            if lead:
                now = Int64(cute.arch.globaltimer())
                cute.arch.inline_ptx("st.global.u64 [{$r0}], {$r1};",
                                     read_only_args=[row + STAMP_PHASES.index(phase) * 8, now])
                if const_expr(phase == "entry"):
                    cute.arch.inline_ptx("st.global.u64 [{$r0}], {$r1};",
                                         read_only_args=[row + STAMP_SM_SLOT * 8, Int64(cute.arch.smid())])

    @cute.jit
    def stage_indices(self, mPos: cute.Tensor, mSlot: cute.Tensor, mCS: cute.Tensor, mErr: cute.Tensor,
                      sSlot: cute.Tensor, sPos: cute.Tensor, m: Int32, tile: Int32):
        """The producer warp, while the first stages are in flight: the tile's slots and RoPE rows
        into shared memory, so the epilogue's only global loads are cos_sin rows. A position
        outside cos_sin becomes row 0 and sets BAD_POSITION."""
        lane = cute.arch.lane_idx()
        n_pos = Int64(mCS.shape[0])
        for i in cutlass.range(lane, self.token_tile, 32, unroll=1):
            token = cutlass.min(tile * self.token_tile + i, m - 1)
            sSlot[i] = Int64(mSlot[token])
            if const_expr(self.rope):
                pos = Int64(mPos[token])
                ok = Int32(pos >= 0) * Int32(pos < n_pos)
                if ok == 0:
                    pos = Int64(0)
                    if tile * self.token_tile + i < m:
                        set_error_bit(mErr, BAD_POSITION)
                sPos[i] = Int32(pos)

    @cute.jit
    def load_cos_sin(self, cos: cute.Tensor, sin: cute.Tensor, mCS: cute.Tensor, sPos: cute.Tensor, t: Int32,
                     col: Int32):
        """The cos and sin of token t's RoPE row for the frequencies col / 2 .. col / 2 + ROW_COLS / 2 - 1."""
        pos = sPos[t]
        quarter = col // ROW_COLS
        cute.autovec_copy(cute.local_tile(mCS, (1, ROW_COLS // 2), (pos, quarter))[0, None], cos)
        cute.autovec_copy(cute.local_tile(mCS, (1, ROW_COLS // 2), (pos, quarter + ROW_THREADS))[0, None], sin)

    @cute.jit
    def reduce_and_store(self, sL: cute.Tensor, sSlot: cute.Tensor, sPos: cute.Tensor, mCS: cute.Tensor,
                         mCache: cute.Tensor, mY: cute.Tensor, mErr: cute.Tensor, split: Int32, rank: Int32,
                         head_group: Int32, tile: Int32, tidx: Int32):
        """The rows this rank owns (its token blocks of the tile, qkv_front_plan.owned_token, each
        of the heads heads): the split-K sum of the S partials in its landing zone in rank order,
        bf16, then norm / RoPE by head kind, y, and the cache row of k and v heads. A quad of
        lanes per row, ROW_COLS columns each; row r is owned token r // heads, head r % heads."""
        tokens, heads = self.token_tile, self.heads_per_cta
        m = mY.shape[0]
        n = mY.shape[1]
        hkv = mCache.shape[1]
        hq = GROUP * hkv
        capacity = Int64(mCache.shape[0]) * PAGE_SIZE
        t_count = cutlass.min(Int32(tokens), m - tile * tokens)
        magic = ((1 << DIV_SHIFT) + split - 1) // split
        block = self.owner_block
        whole = t_count // block                       # qkv_front_plan.owned_tokens
        whole_owned = ((whole - rank + split - 1) * magic) >> DIV_SHIFT
        n_own = whole_owned * block
        if whole - ((whole * magic) >> DIV_SHIFT) * split == rank:
            n_own = n_own + t_count % block
        rows = n_own * heads
        lane_row = tidx // ROW_THREADS
        col = (tidx % ROW_THREADS) * ROW_COLS
        y_base = mY.iterator.toint()
        cache_base = mCache.iterator.toint()
        # RoPE's cos_sin rows go out a pass ahead: the partials are in this CTA's shared memory, so
        # their L2 latency would otherwise be each pass's longest wait
        cos = cute.make_rmem_tensor(cute.make_layout(ROW_COLS // 2), Float32)
        sin = cute.make_rmem_tensor(cute.make_layout(ROW_COLS // 2), Float32)
        cos_ahead = cute.make_rmem_tensor(cute.make_layout(ROW_COLS // 2), Float32)
        sin_ahead = cute.make_rmem_tensor(cute.make_layout(ROW_COLS // 2), Float32)
        if const_expr(self.rope):
            if rows > 0:
                self.load_cos_sin(cos_ahead, sin_ahead, mCS, sPos,
                                  owned_token(cutlass.min(lane_row, rows - 1) // heads, rank, split, block), col)
        for base in cutlass.range(0, rows, self.rows_per_pass, unroll=1):
            # lanes past the last row repeat it (the butterfly needs the whole quad) but store nothing
            active = Int32(base + lane_row < rows)
            row = cutlass.min(base + lane_row, rows - 1)
            own = row // heads
            t = owned_token(own, rank, split, block)
            hh = row % heads
            token = tile * tokens + t
            head = head_group * heads + hh
            is_qk = Int32(head < hq + hkv)
            if const_expr(self.rope):
                for i in cutlass.range_constexpr(ROW_COLS // 2):
                    cos[i] = cos_ahead[i]
                    sin[i] = sin_ahead[i]
                if base + self.rows_per_pass < rows:
                    ahead = cutlass.min(base + self.rows_per_pass + lane_row, rows - 1)
                    self.load_cos_sin(cos_ahead, sin_ahead, mCS, sPos, owned_token(ahead // heads, rank, split, block),
                                      col)
            # ---- split-K sum: the partials in rank order, one rounding per add; every rank's
            # loads go out together (from this CTA's shared memory: the pushes were acquired)
            acc = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
            acc.fill(0.0)
            part = cute.make_rmem_tensor(cute.make_layout((ROW_COLS, MAX_K_SPLIT), stride=(1, ROW_COLS)), Float32)
            at = landing_offset(col, own % block, block)   # column col + c is at + c * block (c < 16)
            for g in cutlass.range_constexpr(MAX_K_SPLIT):
                if g < split:
                    slab = landing_slab(own // block, g, hh, split, heads)
                    for c in cutlass.range_constexpr(ROW_COLS):
                        part[c, g] = sL[slab * self.slab + at + c * block]
            for g in cutlass.range_constexpr(MAX_K_SPLIT):
                if g < split:
                    for c in cutlass.range_constexpr(ROW_COLS):
                        acc[c] = add_rn(acc[c], part[c, g])
            pb = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), BFloat16)
            pb.store(acc.load().to(BFloat16))
            p = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
            p.store(pb.load().to(Float32))
            # ---- q and k heads: norm (+ RoPE); v and gate heads: p. Every lane computes the norm
            # (the rows of one warp may be of different kinds; the butterfly needs the whole warp)
            rs = _row_norm(p)
            normed = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
            for c in cutlass.range_constexpr(ROW_COLS):
                normed[c] = mul_rn(p[c], rs)
            nb = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), BFloat16)
            nb.store(normed.load().to(BFloat16))
            out = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
            out.store(nb.load().to(Float32))
            if const_expr(self.rope):
                for i in cutlass.range_constexpr(ROW_COLS // 2):    # pairs (2i, 2i+1), rounded by the store
                    even = out[2 * i]
                    odd = out[2 * i + 1]
                    out[2 * i] = fma_rn(even, cos[i], -mul_rn(odd, sin[i]))
                    out[2 * i + 1] = fma_rn(odd, cos[i], mul_rn(even, sin[i]))
            for c in cutlass.range_constexpr(ROW_COLS):
                out[c] = select(is_qk, out[c], p[c])
            # ---- y, then the cache row of a k or v head
            if active != 0:
                _store_row(y_base + (Int64(token) * n + head * HEAD_DIM + col) * 2, out)
                is_k = Int32(head >= hq) * is_qk
                is_v = Int32(head >= hq + hkv) * Int32(head < hq + 2 * hkv)
                if is_k + is_v != 0:
                    slot = sSlot[t]
                    if slot >= 0:
                        if slot < capacity:
                            kv_head = head - hq - is_v * hkv
                            page = slot // PAGE_SIZE
                            cache_row = (page * hkv + kv_head) * PAGE_SIZE + slot % PAGE_SIZE
                            cache_col = is_v * HEAD_DIM + col
                            _store_row(cache_base + (cache_row * CACHE_ROW + cache_col) * 2, out)
                        else:
                            if col == 0:
                                set_error_bit(mErr, BAD_SLOT)


# ------------------------------------------------------------------------------------ host
# compiling, loading and launching a variant live in launch.py (no cutlass import); this is the compile
def _compile(cfg: QkvFrontConfig, extra_options: str):
    runtime.require_dsl()
    m = cute.sym_int()
    n = cute.sym_int(divisibility=64)
    pages, hkv, n_pos = (cute.sym_int() for _ in range(3))
    fake = runtime.fake_tensor
    return cute.compile(
        QkvFrontSm90(cfg),
        fake(BFloat16, (m, HIDDEN), align=16),                          # x
        fake(BFloat16, (n, HIDDEN), align=16),                          # weight
        fake(_INDEX[cfg.pos_dtype], (m,), align=4),                     # positions
        fake(_INDEX[cfg.slot_dtype], (m,), align=4),                    # slots
        fake(Float32, (n_pos, HEAD_DIM), align=16),                     # cos_sin
        fake(BFloat16, (pages, hkv, PAGE_SIZE, CACHE_ROW), align=16),   # kv_cache
        fake(BFloat16, (m, n), align=16),                               # y
        fake(Int32, (1,), align=4),                                     # error flag
        Int32(3), runtime.env_stream(),
        options=runtime.compile_options(extra_options))
