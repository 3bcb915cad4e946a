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

Constraints: sm_90a (wgmma, TMA, clusters, distributed shared memory, PDL). M, N, Hkv, P, the page
count and every address are run time; N is a multiple of 64 times the heads per CTA, and the
K split S (the cluster size, qkv_front_plan.k_split) is at most MAX_K_SPLIT. A variant
(QkvFrontConfig) fixes the token tile (8 to 256), the heads per CTA (1 or 2), the ring depth, the
K tiles a stage, RoPE on or off and the index dtypes. A slot past the cache is skipped and
flagged; a position outside cos_sin reads row 0 and is flagged.

Design (docs/DESIGN.md section 12 has the reasons; the measurements are in bench/RESULTS.md):
- The output is computed transposed: the 64 weight rows of a head are the M of a wgmma and the
  token tile its N. A cluster of S CTAs owns one head group and one token tile; rank r sums the K
  tiles [r 128 / S, (r + 1) 128 / S) (KTiles).
- Per CTA, a producer warp streams each K tile's weight and x boxes with TMA into a ring of full /
  empty mbarriers (Producer, Ring); one consumer warpgroup per head accumulates its wgmmas in fp32
  (consume).
- The split-K sum: each consumer pushes its accumulator into the landing zones of the ranks that
  own its tokens (push_partial, SplitK); after a cluster barrier each owner sums the S partials
  of its rows in rank order and runs the epilogue (Epilogue: split_k_sum, norm_rope, store, the
  cache row through KvCache.store_row). No global scratch, no atomics but the error flag, no state
  across calls.
- Batch invariance: a token's y and cache rows are the same bits whatever M, the token tile, the
  heads per CTA or the K tiles per stage: its accumulator sees the same k16 steps in the same
  order (each wgmma output element is a fixed function of its own row and column), the S partials
  are added in the same order, and the epilogue is the same code on the same quad mapping. Run to
  run it is deterministic for the same reasons.
- PDL: before griddepcontrol.wait a CTA only initialises its barriers and loads weights (no kernel
  writes them inside a step); every thread waits before it touches x, positions, slots, cos_sin,
  y or the cache. The dependent launch is triggered at QkvFrontConfig.trigger_point.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32, Int64, Uint32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cuda.bindings import driver as cuda

from ..config import CACHE_ROW, GROUP, HEAD_DIM, HIDDEN, PAGE_SIZE, RMS_EPS
from ..errors import BAD_POSITION, BAD_SLOT
from . import runtime
from .ptx import (add_rn, bf16_round, div_rn, fma_rn, mbarrier_wait_cluster, mul_rn, pack_e4m3x4, pack_x2, select,
                  set_error_bit, st_dsmem_f32x2, st_landing_f32x2)
from .qkv_front_plan import (CONSUMER_REGISTERS, K_TILE, K_TILES, LANDING_CHUNK_TOKENS, MAX_K_SPLIT,  # noqa: F401
                             PRODUCER_REGISTERS, STAMP_PHASES, STAMP_PRODUCER_PHASES, STAMP_SLOTS, STAMP_SM_SLOT,
                             X_BOX_MIN_ROWS, QkvFrontConfig, ci_variants, deployment_variants, k_split, landing_chunks,
                             landing_offset, landing_slab, landing_slab_floats, launch_config, owned_token)

ROW_THREADS = 4                 # threads per (token, head) row of the epilogue (a quad)
ROW_COLS = HEAD_DIM // ROW_THREADS
# an epilogue pass holds 128 / ROW_THREADS rows a head: the owned tokens of one landing barrier
assert LANDING_CHUNK_TOKENS == 128 // ROW_THREADS
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
        _st_global_v4(addr + 16 * q,
                      pack_x2(v[8 * q], v[8 * q + 1], "bf16"), pack_x2(v[8 * q + 2], v[8 * q + 3], "bf16"),
                      pack_x2(v[8 * q + 4], v[8 * q + 5], "bf16"), pack_x2(v[8 * q + 6], v[8 * q + 7], "bf16"))


@cute.jit
def _store_row_e4m3(addr: Int64, v: cute.Tensor, scale: Float32):
    """e4m3(bf16(v) / scale) (ROW_COLS fp32: the quotient of the bf16 value y holds, divided in
    fp32, rounded to nearest even, saturated) as ROW_COLS bytes at a 16-byte aligned address."""
    q = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
    for c in cutlass.range_constexpr(ROW_COLS):
        q[c] = div_rn(bf16_round(v[c]), scale)
    for w in cutlass.range_constexpr(ROW_COLS // 16):
        _st_global_v4(addr + 16 * w, *(pack_e4m3x4(q[16 * w + 4 * i], q[16 * w + 4 * i + 1], q[16 * w + 4 * i + 2],
                                                   q[16 * w + 4 * i + 3]) for i in range(4)))


# ------------------------------------------------------------------------ device-side state
# Small frozen objects built inside the kernel (FA4's BlockInfo / PagedKVManager shape): each
# owns one piece of state and the @cute.jit methods that use it.

@dataclass(frozen=True)
class TokenTile:
    """The CTA's token tile: tokens index * size .. index * size + size - 1 of the launch's m
    (the last tile of a launch may be partial)."""
    index: Int32
    m: Int32
    size: cutlass.Constexpr[int]

    @cute.jit
    def token(self, t: Int32) -> Int32:
        """The launch token of tile token t."""
        return self.index * self.size + t

    @cute.jit
    def count(self) -> Int32:
        """The tile's tokens below m."""
        return cutlass.min(Int32(self.size), self.m - self.index * self.size)


@dataclass(frozen=True)
class KTiles:
    """The K tiles a rank sums, [first, first + count), per_stage to a ring stage: stage i holds
    tiles first + i per_stage + j for j < per_stage while i per_stage + j < count (the last stage
    may hold fewer)."""
    first: Int32
    count: Int32
    per_stage: cutlass.Constexpr[int]

    @cute.jit
    def stages(self) -> Int32:
        return (self.count + self.per_stage - 1) // self.per_stage

    @cute.jit
    def holds(self, i: Int32, j: int):
        """Whether stage i has a j-th tile."""
        return i * self.per_stage + j < self.count

    @cute.jit
    def tile(self, i: Int32, j: int) -> Int32:
        """The K tile (of 64 columns) of stage i's j-th tile."""
        return self.first + i * self.per_stage + j

    @cute.jit
    def in_stage(self, i: Int32) -> Int32:
        """The number of tiles stage i holds."""
        return cutlass.min(self.count - i * self.per_stage, Int32(self.per_stage))


@dataclass(frozen=True)
class Ring:
    """The CTA's ring of `stages` stages, each of per_stage K tiles: for K tile j of stage s a
    (64, 64) weight box per head h (sW box (s per_stage + j) heads + h) and the tile's (tokens, 64)
    x box (sX box s per_stage + j), both 128-byte swizzled (the canonical K-major wgmma layout).
    Per stage a full barrier (the producer's arrive and its TMA bytes) and an empty one (an arrive
    per consumer warp); the n-th use of a stage is phase n % 2 of both. With x multicast the other
    CTA of the pair of head groups (`x_peer`) writes half of every stage's x, with weight
    multicast the other CTA of the pair of token tiles (`w_peer`) half of its weight boxes, so a
    stage is empty once the consumer warps of every CTA that writes it have released it: each warp
    arrives on its own CTA's empty barrier and on its peers'. After the main loop the ring's bytes
    are the split-K sum's landing zone (SplitK)."""
    full: cute.Pointer
    empty: cute.Pointer
    sW: cute.Tensor
    sX: cute.Tensor
    stages: cutlass.Constexpr[int]
    x_peer: Int32                          # the other CTA of the pair of head groups (its cluster rank)
    w_peer: Int32                          # the other CTA of the pair of token tiles
    x_multicast: cutlass.Constexpr[bool]
    w_multicast: cutlass.Constexpr[bool]

    @staticmethod
    def allocate(smem: SmemAllocator, sW_layout: cute.ComposedLayout, sX_layout: cute.ComposedLayout,
                 stages: int, place: ClusterPlace, cfg) -> "Ring":
        """The barriers, then the stages (x's right after the weight's)."""
        full = smem.allocate_array(Int64, stages, byte_alignment=8)
        empty = smem.allocate_array(Int64, stages, byte_alignment=8)
        sW = smem.allocate_tensor(BFloat16, sW_layout.outer, byte_alignment=1024, swizzle=sW_layout.inner)
        sX = smem.allocate_tensor(BFloat16, sX_layout.outer, byte_alignment=1024, swizzle=sX_layout.inner)
        return Ring(full, empty, sW, sX, stages, place.x_peer(), place.w_peer(), cfg.x_multicast, cfg.w_multicast)

    @cute.jit
    def init(self, consumer_warps: cutlass.Constexpr[int]):
        """One lane of one warp, before the CTA's first barrier (a cluster barrier with multicast:
        the peers' copies and arrives must find these initialised)."""
        releases = consumer_warps * (1 + int(self.x_multicast) + int(self.w_multicast))
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(self.stages):
                cute.arch.mbarrier_init(self.full + s, 1)
                cute.arch.mbarrier_init(self.empty + s, releases)
            cute.arch.mbarrier_init_fence()

    def landing_zone(self, floats: int) -> cute.Tensor:
        """The ring's first `floats` fp32, for the split-K sum once no CTA reads its ring again."""
        return cute.make_tensor(cute.recast_ptr(self.sW.iterator, dtype=Float32), cute.make_layout(floats))

    @cute.jit
    def wait_full(self, i: Int32, s: Int32):
        """The consumers: the i-th stage's bytes (stage s = i % stages) have landed."""
        cute.arch.mbarrier_wait(self.full + s, (i // self.stages) % 2)

    @cute.jit
    def wait_empty(self, i: Int32, s: Int32):
        """The producer: stage s's previous use (the (i - stages)-th stage) is released."""
        cute.arch.mbarrier_wait(self.empty + s, (i // self.stages + 1) % 2)

    @cute.jit
    def release(self, s: Int32):
        """A consumer warp's lane 0: its wgmmas no longer read stage s (here, and with multicast
        its peers may write their halves into it)."""
        cute.arch.mbarrier_arrive(self.empty + s)
        if const_expr(self.x_multicast):
            cute.arch.mbarrier_arrive(self.empty + s, self.x_peer)
        if const_expr(self.w_multicast):
            cute.arch.mbarrier_arrive(self.empty + s, self.w_peer)


@dataclass(frozen=True)
class TmaLoads:
    """The kernel's TMA atoms and their tensors: the weight, the whole tile's x, the partial
    tile's x boxes (one atom and tensor per size in QkvFrontConfig.x_part_boxes), and the
    multicasts (mc_*): with x_multicast the whole tile's x over the pair of head groups, then with
    w_multicast the weight box over the pair of token tiles; none where a variant uses none: each
    is a tensor map the launch builds and passes."""
    w: cute.CopyAtom
    mW: cute.Tensor
    x: cute.CopyAtom
    mX: cute.Tensor
    box_atoms: tuple
    box_tensors: tuple
    mc_atoms: tuple
    mc_tensors: tuple

    @cute.jit
    def prefetch(self):
        cpasync.prefetch_descriptor(self.w)
        cpasync.prefetch_descriptor(self.x)
        for box in self.box_atoms:
            cpasync.prefetch_descriptor(box)
        for atom in self.mc_atoms:
            cpasync.prefetch_descriptor(atom)


@dataclass(frozen=True)
class XBoxes:
    """`count` boxes of `rows` rows of a partial tile's x, from tile row `first` (every box starts
    at a multiple of its size)."""
    atom: cute.CopyAtom
    tBs: cute.Tensor     # the ring's x boxes: (box, row block, 1, slot)
    tBg: cute.Tensor     # x: (box, row block, K tile)
    rows: cutlass.Constexpr[int]
    count: Int32
    first: Int32


@dataclass(frozen=True)
class HalfMulticast:
    """This CTA's half of a box (rows pair * rows / 2 ..: a whole tile's x box, or a head's weight
    box), multicast into the same place of both CTAs of the pair (mask: their ranks in the cluster)."""
    atom: cute.CopyAtom
    tS: cute.Tensor      # the ring's half boxes: (box, slot) (weight: slot * heads + head)
    tG: cute.Tensor      # x: (box, token tile, K tile); the weight: (box, head, K tile)
    mask: cutlass.Int16


@dataclass(frozen=True)
class ClusterPlace:
    """Where the CTA sits in its cluster: the K split's rank, its place in the pair of head groups
    (x multicast) and in the pair of token tiles (weight multicast; 0 without), and whether its
    head group and its token tile exist (a helper past the last group or tile of an odd count
    loads its halves for its pair and computes nothing anyone reads). The cluster is (K split,
    token tiles, head groups), x fastest."""
    rank: Int32          # in the K split
    split: Int32
    pair: Int32          # 0 or 1: which CTA of the pair of head groups
    tile_pair: Int32     # 0 or 1: which CTA of the pair of token tiles
    group_real: Int32    # 1: the head group exists
    tile_real: Int32     # 1: the token tile exists
    tile_pairs: cutlass.Constexpr[int]   # token tiles a cluster (QkvFrontConfig.tile_cluster)

    @staticmethod
    def create(cfg: QkvFrontConfig, rank: Int32, tile: Int32, head_group: Int32, split: Int32,
               mY: cute.Tensor) -> "ClusterPlace":
        """CTA (rank, tile, head_group) of a launch whose output is mY (tokens x columns). A whole-K CTA
        is the only rank of a split of 1 (its epilogue sums one partial, its own); its main loop
        runs the deployment's split as stripes. Without multicast every head group and token tile
        exist."""
        pair, tile_pair, group_real, tile_real = Int32(0), Int32(0), Int32(1), Int32(1)
        if const_expr(cfg.x_multicast):
            pair = head_group % cfg.group_cluster
            group_real = Int32(head_group < mY.shape[1] // (HEAD_DIM * cfg.heads_per_cta))
        if const_expr(cfg.w_multicast):
            tile_pair = tile % cfg.tile_cluster
            tile_real = Int32(tile * cfg.token_tile < mY.shape[0])
        return ClusterPlace(rank, Int32(1) if const_expr(cfg.whole_k) else split, pair, tile_pair, group_real,
                            tile_real, cfg.tile_cluster)

    @property
    def real(self) -> Int32:   # the CTA computes rows someone reads
        return self.group_real * self.tile_real

    @cute.jit
    def cluster_rank(self, rank: Int32, pair: Int32, tile_pair: Int32) -> Int32:
        """The cluster rank of the CTA at (K split rank, tile pair, group pair)."""
        return rank + self.split * (tile_pair + self.tile_pairs * pair)

    @cute.jit
    def own(self, rank: Int32) -> Int32:
        """The cluster rank of K split rank `rank` beside this CTA (the same pairs)."""
        return self.cluster_rank(rank, self.pair, self.tile_pair)

    @cute.jit
    def x_peer(self) -> Int32:
        """The other CTA of the pair of head groups (x multicast)."""
        return self.cluster_rank(self.rank, 1 - self.pair, self.tile_pair)

    @cute.jit
    def w_peer(self) -> Int32:
        """The other CTA of the pair of token tiles (weight multicast)."""
        return self.cluster_rank(self.rank, self.pair, 1 - self.tile_pair)

    @cute.jit
    def x_mask(self) -> Int32:
        """The multicast mask of the pair of head groups (x multicast): both CTAs' cluster ranks."""
        return ((1 << self.cluster_rank(self.rank, 0, self.tile_pair))
                | (1 << self.cluster_rank(self.rank, 1, self.tile_pair)))

    @cute.jit
    def w_mask(self) -> Int32:
        """The multicast mask of the pair of token tiles (weight multicast)."""
        return ((1 << self.cluster_rank(self.rank, self.pair, 0))
                | (1 << self.cluster_rank(self.rank, self.pair, 1)))


@dataclass(frozen=True)
class Producer:
    """The producer warp's loads: per K tile a weight box (64 x 64) per head and the tile's x, into
    the ring. The x of a partial tile goes in boxes of 16 x 2^k rows (qkv_front_plan.x_part_boxes)
    that stop at most X_BOX_MIN_ROWS - 1 rows past x, not one box reaching past it: TMA's fill of
    rows outside a tensor is slow (bench/RESULTS.md)."""
    ring: Ring
    k_tiles: KTiles
    tokens: TokenTile
    head_group: Int32
    heads: cutlass.Constexpr[int]
    tma_w: cute.CopyAtom
    tWs: cute.Tensor     # the ring's weight boxes: (box, slot * heads + head)
    tWg: cute.Tensor     # the weight: (box, head, K tile)
    tma_x: cute.CopyAtom
    tXs: cute.Tensor     # the ring's x boxes: (box, slot)
    tXg: cute.Tensor     # x: (box, token tile, K tile)
    boxes: tuple         # XBoxes per size of a partial tile's boxes; () for tiles of up to 32 tokens
    x_multicast: tuple   # (HalfMulticast,) of x with x_multicast, else ()
    w_multicast: tuple   # (HalfMulticast,) of the weight with w_multicast, else ()
    whole: Int32         # the tile loads x as one box (not partial, or no partial boxes)
    has_weights: Int32   # 0: a helper past the last head group (ClusterPlace.group_real), which loads x alone
    step_bytes: Int32    # the TMA bytes of one K tile
    n_stages: Int32      # the stages of the rank's K tiles
    n_fill: Int32        # of them, the first use of each ring stage

    @staticmethod
    def create(cfg: QkvFrontConfig, tma: TmaLoads, ring: Ring, k_tiles: KTiles, tokens: TokenTile,
               head_group: Int32, place: ClusterPlace) -> "Producer":
        size, heads = cfg.token_tile, cfg.heads_per_cta
        gW = cute.flat_divide(tma.mW, (HEAD_DIM, K_TILE))          # (64, 64, heads, 128)
        gX = cute.flat_divide(tma.mX, (size, K_TILE))               # (tokens, 64, token tiles, 128)
        tWs, tWg = cpasync.tma_partition(tma.w, 0, cute.make_layout(1), cute.group_modes(ring.sW, 0, 2),
                                         cute.group_modes(gW, 0, 2))
        tXs, tXg = cpasync.tma_partition(tma.x, 0, cute.make_layout(1), cute.group_modes(ring.sX, 0, 2),
                                         cute.group_modes(gX, 0, 2))
        # the rows of x a K tile loads: the whole box, or for a partial tile its rows rounded up to
        # X_BOX_MIN_ROWS, as boxes of x_part_boxes rows (qkv_front_plan.x_part_box_counts)
        x_rows = Int32(size)
        boxes = []
        if const_expr(len(cfg.x_part_boxes) > 0):
            x_rows = cutlass.min(Int32(size), (tokens.m - tokens.index * size + X_BOX_MIN_ROWS - 1) // X_BOX_MIN_ROWS
                                 * X_BOX_MIN_ROWS)
            if const_expr(cfg.w_multicast):
                x_rows = x_rows * place.tile_real     # a helper past the last token tile loads no x
            left = x_rows
            first = Int32(0)
            for i, rows in enumerate(cfg.x_part_boxes):
                gB = cute.flat_divide(tma.box_tensors[i], (rows, K_TILE))    # (rows, 64, row blocks, 128)
                sB = cute.flat_divide(ring.sX, (rows, K_TILE))               # (rows, 64, tokens / rows, 1, slots)
                tBs, tBg = cpasync.tma_partition(tma.box_atoms[i], 0, cute.make_layout(1),
                                                 cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
                count = left // rows
                boxes.append(XBoxes(tma.box_atoms[i], tBs, tBg, rows, count, first))
                left = left - count * rows
                first = first + count * rows
        x_multicast = []
        if const_expr(cfg.x_multicast):
            # a whole tile's x: this CTA's half of the box, multicast (a partial tile's boxes: each
            # CTA loads its own, both in full)
            gXm = cute.flat_divide(tma.mc_tensors[0], (size, K_TILE))
            tXs_m, tXg_m = cpasync.tma_partition(tma.mc_atoms[0], place.pair, cute.make_layout(cfg.group_cluster),
                                                 cute.group_modes(ring.sX, 0, 2), cute.group_modes(gXm, 0, 2))
            x_multicast.append(HalfMulticast(tma.mc_atoms[0], tXs_m, tXg_m, cutlass.Int16(place.x_mask())))
        w_multicast = []
        if const_expr(cfg.w_multicast):
            # this CTA's half of every weight box (32 of a head's rows), multicast over the pair of
            # token tiles; a helper past the last tile loads its halves too (its pair's weight)
            w_atom = len(x_multicast)     # the weight's multicast atom follows x's
            gWm = cute.flat_divide(tma.mc_tensors[w_atom], (HEAD_DIM, K_TILE))
            tWs_m, tWg_m = cpasync.tma_partition(tma.mc_atoms[w_atom], place.tile_pair,
                                                 cute.make_layout(cfg.tile_cluster),
                                                 cute.group_modes(ring.sW, 0, 2), cute.group_modes(gWm, 0, 2))
            w_multicast.append(HalfMulticast(tma.mc_atoms[w_atom], tWs_m, tWg_m, cutlass.Int16(place.w_mask())))
        has_weights = place.group_real   # a helper past the last head group loads no weight
        whole = Int32(x_rows == size)
        step_bytes = (heads * HEAD_DIM * has_weights + x_rows) * K_TILE * 2
        n_stages = k_tiles.stages()
        n_fill = cutlass.min(n_stages, Int32(cfg.stages))
        return Producer(ring, k_tiles, tokens, head_group, heads, tma.w, tWs, tWg, tma.x, tXs, tXg, tuple(boxes),
                        tuple(x_multicast), tuple(w_multicast), whole, has_weights, step_bytes, n_stages, n_fill)

    @cute.jit
    def issue(self, i: Int32, s: Int32, weights: cutlass.Constexpr[bool], x: cutlass.Constexpr[bool]):
        """Stage i of the rank's K tiles into ring stage s: with `weights`, the arrive with the
        stage's bytes on its full barrier and the heads' weight boxes; with `x`, the x boxes."""
        per_stage, heads = self.k_tiles.per_stage, self.heads
        if const_expr(weights):
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(self.ring.full + s, self.k_tiles.in_stage(i) * self.step_bytes)
        for j in cutlass.range_constexpr(per_stage):
            if self.k_tiles.holds(i, j):
                kt = self.k_tiles.tile(i, j)
                if const_expr(weights):
                    if self.has_weights != 0:
                        for h in cutlass.range_constexpr(heads):
                            if const_expr(len(self.w_multicast) > 0):
                                mc = self.w_multicast[0]
                                cute.copy(mc.atom, mc.tG[None, self.head_group * heads + h, kt],
                                          mc.tS[None, (s * per_stage + j) * heads + h], tma_bar_ptr=self.ring.full + s,
                                          mcast_mask=mc.mask)
                            else:
                                cute.copy(self.tma_w, self.tWg[None, self.head_group * heads + h, kt],
                                          self.tWs[None, (s * per_stage + j) * heads + h],
                                          tma_bar_ptr=self.ring.full + s)
                if const_expr(x):
                    self.load_x(kt, s * per_stage + j, self.ring.full + s)

    @cute.jit
    def load_x(self, kt: Int32, slot: Int32, bar: cute.Pointer):
        """K tile kt of the tile's x into ring slot `slot`: one box for a whole tile (with
        multicast this CTA's half of it, into both CTAs of the pair), else the partial tile's
        boxes. Rows past x keep whatever the ring held: they only reach the wgmma columns of tokens
        past M, which nothing stores."""
        tile = self.tokens.index
        if const_expr(len(self.boxes) == 0):
            cute.copy(self.tma_x, self.tXg[None, tile, kt], self.tXs[None, slot], tma_bar_ptr=bar)
        else:
            if self.whole != 0:
                if const_expr(len(self.x_multicast) > 0):
                    mc = self.x_multicast[0]
                    cute.copy(mc.atom, mc.tG[None, tile, kt], mc.tS[None, slot], tma_bar_ptr=bar,
                              mcast_mask=mc.mask)
                else:
                    cute.copy(self.tma_x, self.tXg[None, tile, kt], self.tXs[None, slot], tma_bar_ptr=bar)
            else:
                for box in self.boxes:
                    for b in cutlass.range(box.count, unroll=1):
                        block = box.first // box.rows + b
                        cute.copy(box.atom, box.tBg[None, tile * (self.tokens.size // box.rows) + block, kt],
                                  box.tBs[None, block, 0, slot], tma_bar_ptr=bar)


@dataclass(frozen=True)
class TileIndices:
    """The tile's cache slots and RoPE rows in shared memory: the producer stages them while the
    ring fills, so the epilogue's only global loads are cos_sin rows."""
    sSlot: cute.Tensor   # Int64 [tokens]
    sPos: cute.Tensor    # Int32 [tokens]: the cos_sin row (0 for a position outside cos_sin)
    rope: cutlass.Constexpr[bool]

    @staticmethod
    def allocate(smem: SmemAllocator, size: int, rope: bool) -> "TileIndices":
        sSlot = smem.allocate_tensor(Int64, cute.make_layout(size), byte_alignment=16)
        sPos = smem.allocate_tensor(Int32, cute.make_layout(size), byte_alignment=16)
        return TileIndices(sSlot, sPos, rope)

    @cute.jit
    def stage(self, tokens: TokenTile, mPos: cute.Tensor, mSlot: cute.Tensor, mCS: cute.Tensor, mErr: cute.Tensor):
        """The producer warp: a position outside cos_sin becomes row 0 and sets BAD_POSITION.
        Tokens past m repeat the last one (and flag nothing)."""
        lane = cute.arch.lane_idx()
        n_pos = Int64(mCS.shape[0])
        for i in cutlass.range(lane, tokens.size, 32, unroll=1):
            token = cutlass.min(tokens.token(i), tokens.m - 1)
            self.sSlot[i] = Int64(mSlot[token])
            if const_expr(self.rope):
                pos = Int64(mPos[token])
                ok = Int32(pos >= 0) * Int32(pos < n_pos)
                if ok == 0:
                    pos = Int64(0)
                    if tokens.token(i) < tokens.m:
                        set_error_bit(mErr, BAD_POSITION)
                self.sPos[i] = Int32(pos)


@dataclass(frozen=True)
class SplitK:
    """Rank `rank` of the cluster's K split of `split`: which rank owns which tokens, and where a
    partial lands. The tile's tokens are owned in blocks of `block` (an accumulator column group),
    block b by rank b % split as its (b // split)-th owned block; the partial from rank `source` for
    head h of an owner's o-th block lands in slab qkv_front_plan.landing_slab(o, source, h) of the
    owner's landing zone, at landing_offset(column, token % block) in it. With landing barriers
    (QkvFrontConfig.landing_barriers) and a split of more than one, the pushes to peers are
    st.async stores that complete on the owner's barrier of their chunk (`landed`: one per
    LANDING_CHUNK_TOKENS owned tokens, qkv_front_plan.landing_chunk_bytes), the rank's own share
    is stored locally and arrived for, and each epilogue pass waits for its own chunk."""
    place: ClusterPlace  # the rank and the split; the split's ranks are this pair's CTAs of the cluster
    sL: cute.Tensor      # this CTA's landing zone (fp32, over the ring)
    landed: cute.Pointer | None   # the landing barriers (None without them)
    block: cutlass.Constexpr[int]
    heads: cutlass.Constexpr[int]
    slab_floats: cutlass.Constexpr[int]
    chunks: cutlass.Constexpr[int]   # landing barriers (0 without them)

    @staticmethod
    def create(place: ClusterPlace, ring: Ring, landed: cute.Pointer | None, cfg: QkvFrontConfig) -> "SplitK":
        return SplitK(place, ring.landing_zone(cfg.landing_bytes // 4), landed, cfg.owner_block, cfg.heads_per_cta,
                      landing_slab_floats(cfg.owner_block), landing_chunks(cfg.token_tile) if landed is not None else 0)

    @cute.jit
    def signals(self) -> Int32:
        """1 where the pushes signal the landing barriers (a split of more than one: st.async needs
        a cluster of several CTAs), else 0 (plain stores, then a cluster barrier)."""
        return Int32(self.split > 1) if const_expr(self.chunks > 0) else Int32(0)

    @cute.jit
    def init_landing(self, token_tile: cutlass.Constexpr[int], consumer_warps: cutlass.Constexpr[int]):
        """One lane of the producer warp, before the CTA's first barrier: each landing barrier
        waits for this lane's arrival, which registers the bytes the peers push into its chunk
        (none where the pushes do not signal: its phase then completes here), and where they
        signal for one arrival of each consumer warp once its own rank's share is stored (that
        share stays in this CTA: plain shared stores). Peers complete bytes on them only after the
        cluster barrier that follows the main loop, so the release fence of the initialisation
        reaches them first."""
        if const_expr(self.chunks > 0):
            with cute.arch.elect_one():
                per_chunk = LANDING_CHUNK_TOKENS // self.block
                owned = self.owned_tokens(Int32(token_tile)) // self.block   # the rank's blocks of the tile
                signals = self.signals()
                for c in cutlass.range_constexpr(self.chunks):
                    cute.arch.mbarrier_init(self.landed + c, 1 + consumer_warps * signals)
                cute.arch.mbarrier_init_fence()
                for c in cutlass.range_constexpr(self.chunks):
                    blocks = cutlass.min(cutlass.max(owned - c * per_chunk, Int32(0)), Int32(per_chunk))
                    chunk_bytes = blocks * (self.split - 1) * (self.heads * HEAD_DIM * self.block * 4) * signals
                    cute.arch.mbarrier_arrive_and_expect_tx(self.landed + c, chunk_bytes)

    @cute.jit
    def own_share_stored(self):
        """A consumer warp, after its pushes: its lanes' stores of its own rank's share are
        released to the landing barriers (every chunk, whether or not it stored into it) by lane
        0, after a warp barrier that orders the other lanes' stores before its arrival (one
        arrival a warp: 256 threads arriving on each of 8 barriers would queue on them)."""
        if const_expr(self.chunks > 0):
            if self.signals() != 0:
                cute.arch.sync_warp()
                if cute.arch.lane_idx() == 0:
                    for c in cutlass.range_constexpr(self.chunks):
                        cute.arch.mbarrier_arrive(self.landed + c)

    @cute.jit
    def wait_landed(self, chunk: Int32):
        """Chunk `chunk` of this CTA's landing zone holds every rank's partial (its phase 0),
        acquired at cluster scope (the peers' st.async release their bytes there)."""
        if const_expr(self.chunks > 0):
            mbarrier_wait_cluster((self.landed + chunk).toint(), Int32(0))

    @property
    def rank(self) -> Int32:
        return self.place.rank

    @property
    def split(self) -> Int32:
        return self.place.split

    def k_tiles(self, per_stage: int) -> KTiles:
        """The rank's K tiles [rank 128 / S, (rank + 1) 128 / S): a function of the split alone,
        which depends on Hkv alone."""
        first = self.rank * K_TILES // self.split
        return KTiles(first, (self.rank + 1) * K_TILES // self.split - first, per_stage)

    @cute.jit
    def magic(self) -> Int32:
        """b // split = (b magic) >> DIV_SHIFT."""
        return ((1 << DIV_SHIFT) + self.split - 1) // self.split

    @cute.jit
    def slab(self, owned_block: Int32, source: Int32, head: Int32) -> Int32:
        """The fp32 offset of a slab in a landing zone."""
        return landing_slab(owned_block, source, head, self.split, self.heads) * self.slab_floats

    @cute.jit
    def owned_token(self, index: Int32) -> Int32:
        """The tile token of this rank's index-th owned token."""
        return owned_token(index, self.rank, self.split, self.block)

    @cute.jit
    def owned_tokens(self, t_count: Int32) -> Int32:
        """The tokens this rank owns of the tile's first t_count (qkv_front_plan.owned_tokens):
        its whole blocks below t_count, then the partial block if that is its."""
        magic = self.magic()
        whole = t_count // self.block
        whole_owned = ((whole - self.rank + self.split - 1) * magic) >> DIV_SHIFT
        n_own = whole_owned * self.block
        if whole - ((whole * magic) >> DIV_SHIFT) * self.split == self.rank:
            n_own = n_own + t_count % self.block
        return n_own


@dataclass(frozen=True)
class KvCache:
    """The paged K/V cache as the epilogue writes it: row (page, kv head, slot % 16) holds k' in
    columns 0:64 and v in 64:128, from y's heads hq .. hq + hkv - 1 (k) and the next hkv (v).
    Rows are addressed in 64 bits (a cache may exceed 2^31 elements). An FP8 cache (fp8) holds
    e4m3(k' / k_scale) and e4m3(v / v_scale), the scales per tensor (one element) or per KV head."""
    base: Int64          # the cache's global address
    hq: Int32            # y's q heads, before its k heads
    hkv: Int32
    capacity: Int64      # pages * PAGE_SIZE slots
    mErr: cute.Tensor
    mKScale: cute.Tensor | None    # fp32 [1] or [Hkv] (fp8 only)
    mVScale: cute.Tensor | None
    fp8: cutlass.Constexpr[bool]

    @staticmethod
    def create(mCache: cute.Tensor, mErr: cute.Tensor, mKScale, mVScale) -> "KvCache":
        hkv = mCache.shape[1]
        return KvCache(mCache.iterator.toint(), GROUP * hkv, hkv, Int64(mCache.shape[0]) * PAGE_SIZE, mErr,
                       mKScale, mVScale, mKScale is not None)

    @cute.jit
    def store_row(self, row: cute.Tensor, slot: Int64, head: Int32, is_v: Int32, col: Int32):
        """A quad lane's ROW_COLS columns from col of y's k head (is_v 0) or v head (is_v 1)
        `head` into the cache row of `slot`, rounded to bf16 as y's are (the values are y's fp32
        row: v exact in bf16, k' rotated but not yet rounded), then, in an FP8 cache, divided by
        the head's scale and rounded to e4m3. A negative slot (padding) stores nothing; a slot past
        the cache stores nothing and sets BAD_SLOT."""
        if slot >= 0:
            if slot < self.capacity:
                kv_head = head - self.hq - is_v * self.hkv
                page = slot // PAGE_SIZE
                cache_row = (page * self.hkv + kv_head) * PAGE_SIZE + slot % PAGE_SIZE
                cache_col = is_v * HEAD_DIM + col
                if const_expr(self.fp8):
                    k_scale = self.mKScale[cutlass.min(kv_head, self.mKScale.shape[0] - 1)]
                    v_scale = self.mVScale[cutlass.min(kv_head, self.mVScale.shape[0] - 1)]
                    _store_row_e4m3(self.base + cache_row * CACHE_ROW + cache_col, row, select(is_v, v_scale, k_scale))
                else:
                    _store_row(self.base + (cache_row * CACHE_ROW + cache_col) * 2, row)
            else:
                if col == 0:
                    set_error_bit(self.mErr, BAD_SLOT)


@dataclass(frozen=True)
class CosSin:
    """RoPE's cos and sin of a lane's ROW_COLS columns, loaded a pass ahead: the partials are in
    this CTA's shared memory, so a cos_sin row's L2 latency would otherwise be each pass's longest
    wait (bench/RESULTS.md)."""
    mCS: cute.Tensor
    sPos: cute.Tensor
    col: Int32
    cos: cute.Tensor         # this pass's (ROW_COLS / 2 frequencies)
    sin: cute.Tensor
    cos_ahead: cute.Tensor   # the next pass's
    sin_ahead: cute.Tensor

    @staticmethod
    def create(mCS: cute.Tensor, sPos: cute.Tensor, col: Int32) -> "CosSin":
        tensors = [cute.make_rmem_tensor(cute.make_layout(ROW_COLS // 2), Float32) for _ in range(4)]
        return CosSin(mCS, sPos, col, *tensors)

    @cute.jit
    def load_ahead(self, t: Int32):
        """Token t's row, frequencies col / 2 .. col / 2 + ROW_COLS / 2 - 1, for the next pass."""
        pos = self.sPos[t]
        quarter = self.col // ROW_COLS
        cute.autovec_copy(cute.local_tile(self.mCS, (1, ROW_COLS // 2), (pos, quarter))[0, None], self.cos_ahead)
        cute.autovec_copy(cute.local_tile(self.mCS, (1, ROW_COLS // 2), (pos, quarter + ROW_THREADS))[0, None],
                          self.sin_ahead)

    @cute.jit
    def advance(self):
        """The rows loaded ahead become this pass's."""
        for i in cutlass.range_constexpr(ROW_COLS // 2):
            self.cos[i] = self.cos_ahead[i]
            self.sin[i] = self.sin_ahead[i]

    @cute.jit
    def rotate(self, v: cute.Tensor):
        """v's pairs (2i, 2i+1) rotated in place (fp32; the store rounds them)."""
        for i in cutlass.range_constexpr(ROW_COLS // 2):
            even = v[2 * i]
            odd = v[2 * i + 1]
            v[2 * i] = fma_rn(even, self.cos[i], -mul_rn(odd, self.sin[i]))
            v[2 * i + 1] = fma_rn(odd, self.cos[i], mul_rn(even, self.sin[i]))


@dataclass(frozen=True)
class EpilogueRow:
    """A lane's row of one epilogue pass: the owner's own-th owned token (tile token t, launch token
    `token`) and the CTA's hh-th head (`head` of N / 64). Lanes past the rank's last row repeat it
    (active 0): the butterfly needs the whole quad, but they store nothing."""
    active: Int32
    own: Int32
    t: Int32
    hh: Int32
    token: Int32
    head: Int32
    is_qk: Int32         # a q or k head: normed (and rotated)


@dataclass(frozen=True)
class Epilogue:
    """The owner's epilogue as one consumer thread runs it: the rows this rank owns (its tokens x
    the CTA's heads; row r is owned token r // heads, head r % heads), a quad of lanes per row,
    ROW_COLS columns from `col` a lane, rows_per_pass rows a pass. y's heads are q (cache.hq of
    them) | k (cache.hkv) | v (cache.hkv) | gate."""
    split_k: SplitK
    tokens: TokenTile
    slots: cute.Tensor   # TileIndices.sSlot
    head_group: Int32
    heads: cutlass.Constexpr[int]
    rows: Int32          # the rows this rank owns
    lane_row: Int32      # this lane's row in a pass
    col: Int32           # its first column
    y_base: Int64        # y's global address
    n: Int32             # y's columns
    cache: KvCache
    cos_sin: CosSin
    rope: cutlass.Constexpr[bool]

    @staticmethod
    def create(cfg: QkvFrontConfig, split_k: SplitK, tokens: TokenTile, head_group: Int32, indices: TileIndices,
               mCS: cute.Tensor, mY: cute.Tensor, cache: KvCache) -> "Epilogue":
        tidx, _, _ = cute.arch.thread_idx()
        rows = split_k.owned_tokens(tokens.count()) * cfg.heads_per_cta
        lane_row = tidx // ROW_THREADS
        col = (tidx % ROW_THREADS) * ROW_COLS
        return Epilogue(split_k, tokens, indices.sSlot, head_group, cfg.heads_per_cta, rows, lane_row, col,
                        mY.iterator.toint(), mY.shape[1], cache, CosSin.create(mCS, indices.sPos, col), cfg.rope)

    @cute.jit
    def load_cos_sin_ahead(self, r: Int32):
        """The cos and sin of row r's token, for the pass that holds it."""
        self.cos_sin.load_ahead(self.split_k.owned_token(r // self.heads))

    @cute.jit
    def row(self, base: Int32) -> EpilogueRow:
        """This lane's row of the pass from row `base`."""
        active = Int32(base + self.lane_row < self.rows)
        r = cutlass.min(base + self.lane_row, self.rows - 1)
        own = r // self.heads
        t = self.split_k.owned_token(own)
        hh = r % self.heads
        token = self.tokens.token(t)
        head = self.head_group * self.heads + hh
        is_qk = Int32(head < self.cache.hq + self.cache.hkv)
        return EpilogueRow(active, own, t, hh, token, head, is_qk)

    @cute.jit
    def split_k_sum(self, row: EpilogueRow) -> cute.Tensor:
        """bf16(the sum of the S partials of the row's columns), in fp32: from this CTA's landing
        zone (the pushes were acquired), every rank's loads out together, then added in rank
        order, one rounding an add."""
        block, split_k = self.split_k.block, self.split_k
        acc = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
        acc.fill(0.0)
        part = cute.make_rmem_tensor(cute.make_layout((ROW_COLS, MAX_K_SPLIT), stride=(1, ROW_COLS)), Float32)
        at = landing_offset(self.col, row.own % block, block)   # column col + c is at + c * block (c < 16)
        for g in cutlass.range_constexpr(MAX_K_SPLIT):
            if g < split_k.split:
                slab = split_k.slab(row.own // block, g, row.hh)
                for c in cutlass.range_constexpr(ROW_COLS):
                    part[c, g] = split_k.sL[slab + at + c * block]
        for g in cutlass.range_constexpr(MAX_K_SPLIT):
            if g < split_k.split:
                for c in cutlass.range_constexpr(ROW_COLS):
                    acc[c] = add_rn(acc[c], part[c, g])
        pb = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), BFloat16)
        pb.store(acc.load().to(BFloat16))
        p = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
        p.store(pb.load().to(Float32))
        return p

    @cute.jit
    def norm_rope(self, p: cute.Tensor, row: EpilogueRow) -> cute.Tensor:
        """q and k heads: bf16(p rsqrt(mean(p^2) + eps)), with RoPE rotated; v and gate heads: p.
        Every lane computes the norm (the rows of one warp may be of different kinds; the
        butterfly needs the whole warp)."""
        rs = _row_norm(p)
        normed = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
        for c in cutlass.range_constexpr(ROW_COLS):
            normed[c] = mul_rn(p[c], rs)
        nb = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), BFloat16)
        nb.store(normed.load().to(BFloat16))
        out = cute.make_rmem_tensor(cute.make_layout(ROW_COLS), Float32)
        out.store(nb.load().to(Float32))
        if const_expr(self.rope):
            self.cos_sin.rotate(out)
        for c in cutlass.range_constexpr(ROW_COLS):
            out[c] = select(row.is_qk, out[c], p[c])
        return out

    @cute.jit
    def store(self, out: cute.Tensor, row: EpilogueRow):
        """y, then for a k or v head the cache row."""
        if row.active != 0:
            _store_row(self.y_base + (Int64(row.token) * self.n + row.head * HEAD_DIM + self.col) * 2, out)
            hq, hkv = self.cache.hq, self.cache.hkv
            is_k = Int32(row.head >= hq) * row.is_qk
            is_v = Int32(row.head >= hq + hkv) * Int32(row.head < hq + 2 * hkv)
            if is_k + is_v != 0:
                self.cache.store_row(out, self.slots[row.t], row.head, is_v, self.col)


# ------------------------------------------------------------------------------------ kernel
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

    @cute.jit
    def __call__(self, mX: cute.Tensor,       # bf16 [M, 8192]
                 mW: cute.Tensor,             # bf16 [N, 8192]
                 mPos: cute.Tensor,           # int32 | int64 [M]
                 mSlot: cute.Tensor,          # int32 | int64 [M]
                 mCS: cute.Tensor,            # fp32 [P, 64]
                 mCache: cute.Tensor,         # bf16 | float8_e4m3fn [pages, Hkv, 16, 128]
                 mY: cute.Tensor,             # bf16 [M, N]
                 mErr: cute.Tensor,           # int32 [1]
                 mKScale: cute.Tensor | None,  # fp32 [1] or [Hkv] (an FP8 cache), else None
                 mVScale: cute.Tensor | None,
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
        # with x_multicast the whole tile's x box also as a multicast over the pair of head groups;
        # with w_multicast the weight box as a multicast over the pair of token tiles
        multicast = []
        pairs, tile_pairs = self.cfg.group_cluster, self.cfg.tile_cluster
        if const_expr(self.cfg.x_multicast):
            multicast.append(cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SMulticastOp(), mX,
                                                         cute.slice_(sX_layout, (None, None, 0)), (tokens, K_TILE),
                                                         num_multicast=pairs))
        if const_expr(self.cfg.w_multicast):
            multicast.append(cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SMulticastOp(), mW,
                                                         cute.slice_(sW_layout, (None, None, 0)), (HEAD_DIM, K_TILE),
                                                         num_multicast=tile_pairs))
        m = mX.shape[0]
        # token tiles and head groups rounded up to whole pairs (a helper CTA past an odd count: ClusterPlace)
        token_tiles = ((m + tokens - 1) // tokens + tile_pairs - 1) // tile_pairs * tile_pairs
        head_groups = (mW.shape[0] // (HEAD_DIM * heads) + pairs - 1) // pairs * pairs
        # the split's ranks are a cluster's CTAs, or a whole-K CTA sums them all as stripes
        ranks = 1 if const_expr(self.cfg.whole_k) else split
        # token tiles before head groups in launch order: the CTAs that read one head group's
        # weight rows run side by side, so the weight crosses from HBM once however many tiles
        # there are, even where it exceeds the L2 (Hkv >= 4) and the grid takes several waves
        self.kernel(tma_w, mW_tma, tma_x, mX_tma, tuple(a for a, _ in boxes), tuple(t for _, t in boxes),
                    tuple(a for a, _ in multicast), tuple(t for _, t in multicast), mPos, mSlot,
                    mCS, mCache, mY, mErr, mKScale, mVScale, sW_layout, sX_layout, split).launch(
            grid=(ranks, token_tiles, head_groups), block=(self.cfg.threads, 1, 1),
            cluster=(ranks, tile_pairs, pairs), stream=stream, use_pdl=self.cfg.pdl)

    @cute.kernel
    def kernel(self, tma_w: cute.CopyAtom, mW_tma: cute.Tensor, tma_x: cute.CopyAtom, mX_tma: cute.Tensor,
               box_atoms: tuple, box_tensors: tuple, mc_atoms: tuple, mc_tensors: tuple, mPos: cute.Tensor, mSlot: cute.Tensor, mCS: cute.Tensor, mCache: cute.Tensor, mY: cute.Tensor,
               mErr: cute.Tensor, mKScale: cute.Tensor | None, mVScale: cute.Tensor | None,
               sW_layout: cute.ComposedLayout, sX_layout: cute.ComposedLayout, split: Int32):
        """CTA (rank, tile, head_group): the K tiles of `rank` for the heads_per_cta heads from
        head_group * heads_per_cta and the token_tile tokens from tile * token_tile. Warps
        0 .. 4 heads_per_cta - 1 are the consumer warpgroups (one head each), the next one the producer."""
        tidx, _, _ = cute.arch.thread_idx()
        rank, tile, head_group = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        self.stamp("entry")
        multicast = self.cfg.multicast
        place = ClusterPlace.create(self.cfg, rank, tile, head_group, split, mY)

        # ---- shared memory: the ring, the tile's indices; after the main loop the ring is the
        # landing zone of the split-K sum
        smem = SmemAllocator()
        ring = Ring.allocate(smem, sW_layout, sX_layout, self.stages, place, self.cfg)
        indices = TileIndices.allocate(smem, self.token_tile, self.rope)
        landed = (smem.allocate_array(Int64, landing_chunks(self.token_tile), byte_alignment=8)
                  if self.cfg.landing_barriers else None)
        split_k = SplitK.create(place, ring, landed, self.cfg)
        tma = TmaLoads(tma_w, mW_tma, tma_x, mX_tma, box_atoms, box_tensors, mc_atoms, mc_tensors)
        if warp == self.producer_warp:
            tma.prefetch()
            ring.init(4 * self.heads_per_cta)   # one empty arrive per consumer warp (of each CTA writing the ring)
            split_k.init_landing(self.token_tile, self.consumer_threads // 32)
        if const_expr(multicast):
            # the peers' copies and arrives land in this CTA's ring: every barrier initialised first
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()

        # ---- main loop: the producer streams the rank's K tiles, the consumers accumulate them;
        # then every CTA's ring is drained and the consumers push their partials to the owners
        k_tiles = split_k.k_tiles(self.tiles_per_stage)
        tokens = TokenTile(tile, mY.shape[0], self.token_tile)
        if const_expr(self.cfg.register_reallocation):
            # each role runs to the kernel's end in its own branch (with the roles rejoining after
            # the main loop, ptxas spilled the consumers' accumulators); every warp of a
            # warpgroup executes its warpgroup's one setmaxnreg
            if warp >= self.producer_warp:
                cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
                if warp == self.producer_warp:
                    producer = Producer.create(self.cfg, tma, ring, k_tiles, tokens, head_group, place)
                    self.produce(producer, indices, mPos, mSlot, mCS, mErr)
                self.rings_drained()   # the producer warpgroup's other warps: the barriers only
                self.partials_landed()
            else:
                cute.arch.setmaxregister_increase(CONSUMER_REGISTERS)
                self.consume_and_push(ring, k_tiles, split, split_k, place, warp, tidx)
                self.partials_landed()
                self.stamp("pushed")
                if place.real != 0:
                    self.store_rows(split_k, tokens, head_group, indices, mCS, mY, mCache, mErr, mKScale, mVScale)
        else:
            if warp == self.producer_warp:
                producer = Producer.create(self.cfg, tma, ring, k_tiles, tokens, head_group, place)
                self.produce(producer, indices, mPos, mSlot, mCS, mErr)
                self.rings_drained()
            else:
                self.consume_and_push(ring, k_tiles, split, split_k, place, warp, tidx)
            if const_expr(self.cfg.landing_barriers):
                if split_k.signals() == 0:   # plain stores: every push lands before any epilogue
                    self.partials_landed()
            else:
                self.partials_landed()
            self.stamp("pushed")

            # ---- epilogue: the owners' rows, summed, normed, stored (none in a helper CTA)
            if warp < self.producer_warp and place.real != 0:
                self.store_rows(split_k, tokens, head_group, indices, mCS, mY, mCache, mErr, mKScale, mVScale)

    @cute.jit
    def store_rows(self, split_k: SplitK, tokens: TokenTile, head_group: Int32, indices: TileIndices,
                   mCS: cute.Tensor, mY: cute.Tensor, mCache: cute.Tensor, mErr: cute.Tensor,
                   mKScale: cute.Tensor | None, mVScale: cute.Tensor | None):
        """A consumer thread of a CTA that owns rows: once the previous kernel is done (PDL), the
        epilogue of its rows (the split-K sum, the norm and RoPE, the stores)."""
        if const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()   # before the first global access of these threads
        if const_expr(self.cfg.epilogue):
            cache = KvCache.create(mCache, mErr, mKScale, mVScale)
            self.epilogue(Epilogue.create(self.cfg, split_k, tokens, head_group, indices, mCS, mY, cache))
            self.stamp("done")
        # every push into this CTA has landed (also the chunks it owns no row of: the peers push a
        # partial tile's padding blocks too) before its shared memory may go to another CTA
        for c in cutlass.range_constexpr(split_k.chunks):
            split_k.wait_landed(c)

    @cute.jit
    def produce(self, producer: Producer, indices: TileIndices, mPos: cute.Tensor, mSlot: cute.Tensor,
                mCS: cute.Tensor, mErr: cute.Tensor):
        """The producer warp: the weights of the first stages go out before griddepcontrol.wait,
        their x after it; while those are in flight the epilogue's indices are staged; then every
        later stage once its previous use is released."""
        for i in cutlass.range(producer.n_fill, unroll=1):
            producer.issue(i, i, weights=True, x=False)
        if const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()   # x is the previous kernel's output
            self.stamp("wait")
        for i in cutlass.range(producer.n_fill, unroll=1):
            producer.issue(i, i, weights=False, x=True)
        indices.stage(producer.tokens, mPos, mSlot, mCS, mErr)   # the ring is in flight meanwhile
        for i in cutlass.range(producer.n_fill, producer.n_stages, unroll=1):
            s = i % self.stages
            producer.ring.wait_empty(i, s)
            producer.issue(i, s, weights=True, x=True)
        if const_expr(self.cfg.trigger_point == "last_load"):
            # every load of this CTA is issued: the next kernel may launch and run its prologue
            # while the ring drains (qkv_front_plan, the trigger's comment)
            cute.arch.griddepcontrol_launch_dependents()
        self.stamp("issued")

    def tiled_mma(self):
        """The wgmma of a consumer warpgroup: 64 head columns x token_tile tokens, fp32."""
        return sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                 (1, 1, 1), (HEAD_DIM, self.token_tile))

    @cute.jit
    def consume(self, ring: Ring, k_tiles: KTiles, wg: Int32, wg_tidx: Int32):
        """Consumer warpgroup wg (head head_group * heads + wg): acc (64 rows x tokens tokens, fp32, from
        0) += W_tile x_tile^tokens over the rank's K tiles in order, four k16 wgmmas a tile, one wgmma
        group a stage, mma_lag groups in flight when a stage is released: 1 (a stage is freed once
        the next one's wgmmas are issued), or 0 in tiles of up to RELEASE_AT_ONCE_TILE tokens, whose
        main loop waits for the weight's bytes (a stage is freed once its own wgmmas are complete).
        Returns the accumulator, every wgmma complete."""
        heads, stages = self.heads_per_cta, self.stages
        atom, tCrW, tCrX, acc_shape = self.mma_operands(ring, wg_tidx)
        acc = cute.make_rmem_tensor(acc_shape, Float32)
        acc.fill(0.0)
        lane = cute.arch.lane_idx()
        tiles_per_stage = self.tiles_per_stage
        for i in cutlass.range(k_tiles.stages(), unroll=1):
            s = i % stages
            ring.wait_full(i, s)
            if const_expr(self.cfg.stamps != 0):   # (stamp guards itself; this keeps i == 0 out of plain variants)
                if i == 0:
                    self.stamp("first")
            warpgroup.fence()
            for j in cutlass.range_constexpr(tiles_per_stage):
                # K tiles in order, k16 steps in order: the same for any tiles_per_stage
                if k_tiles.holds(i, j):
                    for kb in cutlass.range_constexpr(K_TILE // 16):
                        cute.gemm(atom, acc, tCrW[None, None, kb, (s * tiles_per_stage + j) * heads + wg],
                                  tCrX[None, None, kb, s * tiles_per_stage + j], acc)
            warpgroup.commit_group()
            self.release_issued(ring, i, 0, lane)
        warpgroup.wait_group(0)
        return acc

    def mma_operands(self, ring: Ring, wg_tidx: Int32):
        """A consumer thread's wgmma atom (accumulating), its views of the ring's weight and x
        boxes, and the shape of its accumulator (64 head columns x token_tile tokens, fp32)."""
        mma = self.tiled_mma()
        thr = mma.get_slice(wg_tidx)
        atom = cute.make_mma_atom(mma.op)
        tCrW = thr.make_fragment_A(thr.partition_A(ring.sW))
        tCrX = thr.make_fragment_B(thr.partition_B(ring.sX))
        atom.set(warpgroup.Field.ACCUMULATE, True)
        return atom, tCrW, tCrX, thr.partition_shape_C((HEAD_DIM, self.token_tile))

    @cute.jit
    def release_issued(self, ring: Ring, i: Int32, first: Int32, lane: Int32):
        """Once stage i's wgmma group is committed (`first`: the first stage of this run, whose
        predecessor is not this run's): with mma_lag 1 free the previous stage once its wgmmas
        have read it, with mma_lag 0 (memory-bound tiles) free stage i once its own have."""
        if const_expr(self.cfg.mma_lag == 1):
            warpgroup.wait_group(1)
            if i > first:
                if lane == 0:
                    ring.release((i - 1) % self.stages)
        else:
            warpgroup.wait_group(0)
            if lane == 0:
                ring.release(i % self.stages)

    @cute.jit
    def consume_and_push(self, ring: Ring, k_tiles: KTiles, split: Int32, split_k: SplitK, place: ClusterPlace,
                         warp: Int32, tidx: Int32):
        """A consumer warp: its warpgroup's main loop (the rank's K tiles, or a whole-K CTA's
        stripes), the dependent launch's trigger after it for large tiles, the drain barrier, then
        the push of the partials to their owners (none from a helper CTA)."""
        if const_expr(self.cfg.whole_k):
            acc = self.consume_stripes(ring, split, warp // 4, tidx % 128)
        else:
            acc = self.consume(ring, k_tiles, warp // 4, tidx % 128)
        self.stamp("loop_end")
        if const_expr(self.cfg.trigger_point == "main_loop"):
            cute.arch.griddepcontrol_launch_dependents()   # larger tiles: after the main loop
        self.rings_drained()
        self.stamp("drained")
        if place.real != 0:
            self.push_partial(acc, split_k, warp // 4, tidx % 128)

    @cute.jit
    def consume_stripes(self, ring: Ring, stripes: Int32, wg: Int32, wg_tidx: Int32):
        """A whole-K CTA's consumer warpgroup wg: the sum, from 0.0 in stripe order, one rounding an
        add, of the split's stripes (stripe g: K tiles qkv_front_plan.k_range(g, stripes), summed
        as `consume` sums a rank's tiles, from a zeroed accumulator in K order): the value the
        split cluster's owner adds up from its ranks' partials, bit for bit. Stages are released as
        in `consume` (mma_lag), and a stripe's last one once its wgmmas are complete. Returns the
        sum, every wgmma complete."""
        stages = self.stages
        atom, tCrW, tCrX, acc_shape = self.mma_operands(ring, wg_tidx)
        acc = cute.make_rmem_tensor(acc_shape, Float32)
        total = cute.make_rmem_tensor(acc_shape, Float32)
        total.fill(0.0)
        lane = cute.arch.lane_idx()
        for g in cutlass.range(stripes, unroll=1):
            first = g * K_TILES // stripes
            end = (g + 1) * K_TILES // stripes
            acc.fill(0.0)
            for i in cutlass.range(first, end, unroll=1):
                s = i % stages
                ring.wait_full(i, s)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(K_TILE // 16):
                    cute.gemm(atom, acc, tCrW[None, None, kb, s * self.heads_per_cta + wg], tCrX[None, None, kb, s],
                              acc)
                warpgroup.commit_group()
                self.release_issued(ring, i, first, lane)
            warpgroup.wait_group(0)              # the stripe is summed: fold it in
            if const_expr(self.cfg.mma_lag == 1):
                if lane == 0:
                    ring.release((end - 1) % stages)
            for e in cutlass.range(cute.size(total), unroll_full=True):
                total[e] = add_rn(total[e], acc[e])
        return total

    @cute.jit
    def rings_drained(self):
        """Every thread of the cluster: after this barrier no CTA reads its ring again (every stage
        was waited for, so the producers' copies have landed, and every wgmma is complete), so
        partials may land in any of them. Relaxed: nothing written before it is read after it."""
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()

    @cute.jit
    def partials_landed(self):
        """Every thread of the cluster: the pushes are released to their owners and acquired by
        them; after this no CTA touches another's shared memory, so none waits for its peers again."""
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

    @cute.jit
    def push_partial(self, acc: cute.Tensor, split_k: SplitK, wg: Int32, wg_tidx: Int32):
        """Consumer warpgroup wg: the accumulator to its owners' landing zones (SplitK). A thread
        holds each head column's tokens in consecutive pairs (the wgmma C layout: values (2
        columns, 2 row halves, column groups)), so it stores 8 bytes at a time; with blocks of 8 a
        warp's store of one column group is 256 contiguous bytes to one owner. A store to a peer
        needs no reply, so the warps go on as soon as they are issued (an owner pulling the
        partials instead would wait on its loads in every epilogue pass, bench/RESULTS.md). With
        landing barriers, where the split signals, a store to a peer is st.async, completing its 8
        bytes on the owner's barrier of the chunk its block lies in (SplitK.init_landing), and the
        own share goes to this CTA's shared memory, each warp then arriving on every chunk."""
        thr = self.tiled_mma().get_slice(wg_tidx)
        coords = thr.partition_C(cute.make_identity_tensor((HEAD_DIM, self.token_tile)))
        magic = split_k.magic()
        # the landing zone's address in each rank's window (ranks past the split: the last one, unused)
        base = [cute.arch.map_dsmem_ptr(split_k.sL.iterator, split_k.place.own(
            cutlass.min(Int32(r), split_k.split - 1))).toint() for r in range(MAX_K_SPLIT)]
        if const_expr(split_k.chunks > 0):
            signals = split_k.signals()
            # a rank's landing barriers lie at the same distance from its landing zone in every window
            to_barriers = split_k.landed.toint() - split_k.sL.iterator.toint()
            local = split_k.sL.iterator.toint()   # this CTA's own landing zone (its own share)
        for group in cutlass.range_constexpr(cute.size(acc) // 4):   # column groups of 8 tokens
            for half in cutlass.range_constexpr(2):                   # row halves
                i = 4 * group + 2 * half
                c, t = coords[i]                      # acc[i + 1] is (c, t + 1)
                block = t // split_k.block
                owned = (block * magic) >> DIV_SHIFT
                owner = block - owned * split_k.split
                owner_base = base[0]
                for r in cutlass.range_constexpr(1, MAX_K_SPLIT):
                    owner_base = owner_base + Int32(owner == r) * (base[r] - base[0])
                offset = split_k.slab(owned, split_k.rank, wg) + landing_offset(c, t % split_k.block, split_k.block)
                if const_expr(split_k.chunks > 0):
                    chunk = owned // (LANDING_CHUNK_TOKENS // split_k.block)
                    mode = signals * (1 + Int32(owner == split_k.rank))   # 1: to a peer, 2: to this CTA
                    st_landing_f32x2(owner_base + offset * 4, local + offset * 4, acc[i], acc[i + 1],
                                     owner_base + to_barriers + chunk * 8, mode)
                else:
                    st_dsmem_f32x2(owner_base + offset * 4, acc[i], acc[i + 1])
        split_k.own_share_stored()

    @cute.jit
    def epilogue(self, ep: Epilogue):
        """The rows this rank owns, rows_per_pass a pass: the split-K sum, the norm and RoPE, the
        stores. RoPE's cos_sin rows go out a pass ahead (CosSin)."""
        if const_expr(self.rope):
            if ep.rows > 0:
                ep.load_cos_sin_ahead(cutlass.min(ep.lane_row, ep.rows - 1))
        for base in cutlass.range(0, ep.rows, self.rows_per_pass, unroll=1):
            row = ep.row(base)
            if const_expr(self.rope):
                ep.cos_sin.advance()
                if base + self.rows_per_pass < ep.rows:
                    ep.load_cos_sin_ahead(cutlass.min(base + self.rows_per_pass + ep.lane_row, ep.rows - 1))
            ep.split_k.wait_landed(base // self.rows_per_pass)   # this pass's chunk has landed
            p = ep.split_k_sum(row)
            out = ep.norm_rope(p, row)
            ep.store(out, row)

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


# ------------------------------------------------------------------------------------ host
# compiling, loading and launching a variant live in launch.py (no cutlass import); this is the compile
def _compile(cfg: QkvFrontConfig, extra_options: str):
    runtime.require_dsl()
    m = cute.sym_int()
    n = cute.sym_int(divisibility=64)
    pages, hkv, n_pos = (cute.sym_int() for _ in range(3))
    fake = runtime.fake_tensor
    # an FP8 cache's variant takes the two scales (fp32, one element or one per KV head); a bf16
    # cache's takes none (the arguments are compile-time None: not in its signature)
    scales = ((fake(Float32, (cute.sym_int(),), align=4), fake(Float32, (cute.sym_int(),), align=4)) if cfg.fp8
              else (None, None))
    return cute.compile(
        QkvFrontSm90(cfg),
        fake(BFloat16, (m, HIDDEN), align=16),                          # x
        fake(BFloat16, (n, HIDDEN), align=16),                          # weight
        fake(_INDEX[cfg.pos_dtype], (m,), align=4),                     # positions
        fake(_INDEX[cfg.slot_dtype], (m,), align=4),                    # slots
        fake(Float32, (n_pos, HEAD_DIM), align=16),                     # cos_sin
        fake(Float8E4M3FN if cfg.fp8 else BFloat16, (pages, hkv, PAGE_SIZE, CACHE_ROW), align=16),  # kv_cache
        fake(BFloat16, (m, n), align=16),                               # y
        fake(Int32, (1,), align=4),                                     # error flag
        *scales,                                                        # k_scale, v_scale
        Int32(3), runtime.env_stream(),
        options=runtime.compile_options(extra_options))
