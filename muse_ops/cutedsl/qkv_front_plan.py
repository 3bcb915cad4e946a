"""The host side of qkv_front's CuTe DSL kernel (muse_ops/cutedsl/qkv_front.py), with no cutlass
import: the K split of a deployment, the variant a launch of M tokens takes, every variant a
deployment may launch, and whether it can run here.

What fixes the bits of a token's y and of its cache rows (docs/DESIGN.md section 10): the K split
S (a function of Hkv only) and the order in which the S partial sums are added (rank order).
What may change with M without changing them: the token tile (the N of the wgmma, 8 to 256) and
the heads a CTA computes (1 or 2). See the kernel module's docstring for why.

The comments here state each rule and what it keeps invariant; the measurements that chose the
numbers are in bench/RESULTS.md, "Measurements behind the plan constants" (that is what
"RESULTS.md" below refers to).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from ..config import GROUP, HEAD_DIM, HIDDEN
from . import runtime

K_TILE = 64                      # k columns per ring stage: one 128-byte swizzle row of bf16
K_TILES = HIDDEN // K_TILE       # 128
SM_TARGET = 132                  # the H100 / H200 SXM multiprocessor count the K split is sized for
MAX_K_SPLIT = 3                  # the largest K split a deployment takes (k_split)
WAVE_TILES_ABOVE = 256           # launches of more tokens take wave_tile's tile
# wave_tile's cost of a grid, in tokens of work an SM does (fitted to tile sweeps at Hkv 1 to 16
# above 256 tokens, where it picks the fastest tile in every row: RESULTS.md):
TILE_FIXED_TOKENS = 48           # a CTA's fixed cost (ring fill, split-K sum, epilogue) in tokens of its tile
L2_RESIDENT_BYTES = 50 * 2**20   # the H100 / H200 L2: a weight of at most this streams from it...
L2_COST_TENTHS = 11              # ...and a grid then costs at least 1.1 x (its CTAs / SM_TARGET) x a CTA's rows
SMEM_LIMIT = 227 * 1024 - 4096   # what a ring may take of an sm_90 CTA's 227 KB (barriers, indices, alignment)
# The landing zone of the split-K sum (qkv_front.py's push_partial / reduce_and_store). Tokens are
# owned in blocks of B = QkvFrontConfig.owner_block (8: an accumulator column group; 2 for tiles of
# up to 16 tokens): block b of a tile belongs to rank b % S, as its (b // S)-th block. Each (owned
# block, source rank, head) is a slab of landing_slab_floats(B) fp32 holding [64 head columns][B
# tokens], so a thread pushes a head column's two consecutive tokens as one 8-byte store, and at B
# = 8 a warp's store of a column group is 256 contiguous bytes to one owner; the quarters of the
# 64 columns are skewed by B floats and a slab is 4 mod 32 floats long, so at B = 8 the owner's
# loads (a quad per (token, head) row, 16 columns each) meet no bank conflict. Blocks of 2 at the
# smallest tiles spread 8 tokens over the 3 owners as 4 / 2 / 2 (blocks of 8 give one owner all 8).
OWNER_BLOCK = 8
SMALL_TILE_OWNER_BLOCK = 2
# Landing barriers (QkvFrontConfig.landing_barriers, the split-cluster tiles; a development knob
# until timed on a GPU: no launch of the package takes it, CI compiles it, dev_variants): an
# owner's epilogue runs in passes of LANDING_CHUNK_TOKENS owned tokens (a quad of lanes a (token,
# head) row, 128 threads a head), and each pass waits only for its own chunk of the landing zone:
# the peers push with st.async, whose bytes complete on the owner's mbarrier of that chunk
# (landing_chunk_bytes of them, registered when the barriers are initialised), a rank's own share
# stays in its CTA (plain shared stores, then an arrival of each consumer warp on every chunk's
# barrier), so an owner sums, norms and stores its first tokens while the later ones are still
# crossing the cluster, instead of waiting for every push at a cluster barrier. Why: the push
# moves 2 / 3 of a CTA's fp32 accumulator (86 KB at 256 x 2, K split 3) over the SM-to-SM
# network, and took about as long as the epilogue after it (RESULTS.md, the thirty-ninth
# session's timeline). Only the synchronisation changes: the partials, their places and the order
# they are added in are the same, so are the bits. st.async needs a cluster of more than one CTA:
# a split of 1 (Hkv 4 to 7) keeps the plain stores and a cluster barrier.
LANDING_CHUNK_TOKENS = 32
INDEX_DTYPES = ("int32", "int64")
# A partial token tile (the last of a launch whose M is not a multiple of the tile) loads x in boxes
# of X_BOX_MIN_ROWS x 2^k rows that together cover its rows rounded up to X_BOX_MIN_ROWS, at most
# X_BOXES_MAX of them, instead of one box that reaches past the end of x: TMA's fill of rows
# outside a tensor is slow, and each box is one more instruction for the producer warp, so boxes
# of several sizes rather than many of 16 rows. Tiles up to 32 tokens take one box (the rows
# outside x cost nothing measurable there). The boxes change which rows are loaded, never a
# token's bits. Measured: RESULTS.md.
X_BOX_MIN_ROWS = 16
X_BOXES_MAX = 4

# Development instrumentation (QkvFrontConfig.stamps, tools/qkv_front/timeline.py): a CTA
# writes the global timer at each of these phase boundaries into its row of STAMP_SLOTS int64
# (slot k = STAMP_PHASES[k], slot STAMP_SM_SLOT = its SM id). Who stamps: thread 0, but the
# STAMP_PRODUCER_PHASES are the producer warp's lane 0.
#   entry     the kernel's start            wait      past griddepcontrol.wait (producer)
#   issued    the last load issued          first     past the first stage's full barrier
#   loop_end  every wgmma complete          drained   past the cluster barrier after the main loop
#   pushed    past the barrier after the split-K push                 done      the epilogue's end
STAMP_PHASES = ("entry", "wait", "issued", "first", "loop_end", "drained", "pushed", "done")
STAMP_PRODUCER_PHASES = ("wait", "issued")   # stamped by the producer warp's lane 0
STAMP_SM_SLOT = 8
STAMP_SLOTS = 16

# Every variant triggers the dependent launch early (the next kernel, attn2 in a layer, launches
# while this one finishes). That relies on attn2's occupancy caps (attn2_plan.occupancy_cap):
# without them the early attn2 CTAs pack four or five to an SM onto the SMs this grid leaves free,
# and from 64 tokens the layer is slower with the trigger than without. Where: tiles of up to
# TRIGGER_AT_LAST_LOAD_TILE tokens trigger once the producer has issued its last load, larger ones
# after the main loop (the last-load trigger slows large tiles alone and gains them nothing in a
# stack of layers). Before its own griddepcontrol.wait the next kernel reads nothing this one
# writes, and a trigger moves no data: the bits do not depend on it. Measured: RESULTS.md.
TRIGGER_AT_LAST_LOAD_TILE = 64

# When a consumer releases a ring stage (QkvFrontConfig.mma_lag): tiles of up to
# RELEASE_AT_ONCE_TILE tokens wait for the stage's own wgmmas to complete and release it at once
# (mma_lag 0), so the producer refills it a stage sooner and one more stage of weight is in
# flight; larger tiles release a stage once the next stage's wgmmas are issued (mma_lag 1), so
# their tensor work stays queued back to back. Either way the same bits. The rule is by tile
# alone: a variant serves every Hkv (kv_heads is a run-time dimension, and the ahead-of-time
# library and the C++ ops pick variants by tile); alone the gain is Hkv 2's, and the layer, where
# these kernels run, was no slower at any Hkv measured (RESULTS.md).
RELEASE_AT_ONCE_TILE = 16

# x multicast over a pair of head groups (QkvFrontConfig.x_multicast): the cluster is the K split
# times two head groups; each CTA of a pair loads half of a K tile's x box and multicasts it into
# both, so a CTA reads half as much x from the L2. Where the head groups are odd (two-head tiles at
# an odd Hkv) the last pair has a helper CTA past the last group: it loads its half of x and no
# weight, and stores nothing. Only the loads change, never the bits. The plan takes it in one
# place: a launch of up to WAVE_TILES_ABOVE tokens whose table tile has two heads (128 x 2, 193 to
# 256 tokens) where the heads alone exceed a wave (Hkv >= 8, K split 2: clusters of 4), so 72 or
# more head groups each re-read x: 7-8% faster at Hkv 16 M=200 and 256, 2-6% at Hkv 8 (RESULTS.md,
# forty-fourth session). Elsewhere a development knob, slower or no faster (RESULTS.md,
# 2026-12-06 and the forty-fourth session): a cluster of 6 CTAs (Hkv 1 and 2, K split 3) holds
# only 102 CTAs on the GPU at once, and from 512 tokens the large tiles are not bound by the L2's
# x traffic at any Hkv.
MULTICAST_GROUP = 2
# Weight multicast over a pair of token tiles (QkvFrontConfig.w_multicast, whole-K tiles only): the
# cluster is two token tiles of one head group; each CTA loads the half of every weight box (32 of
# a head's 64 rows) and multicasts it into both rings, so the pair reads its weight from the L2
# once. A whole-K grid of 96 x 3 tiles at Hkv 2 M=1024 otherwise moves about twice the L2 bytes of
# cuBLAS's matmul (ncu, RESULTS.md). An odd tile count gets a helper CTA past the last tile: it
# loads its halves of the weight and no x, and stores nothing. Only the loads change, never the bits.

# Whole-K CTAs (QkvFrontConfig.whole_k): a CTA owns its tile's whole K range and sums it as the
# split's S stripes, stripe g the K tiles [g 128 / S, (g + 1) 128 / S) (k_range), each from a zeroed
# accumulator in K order, folded into a running sum from 0.0 in stripe order: the value the split
# cluster's owner computes from its ranks' partials, bit for bit. The grid is then token tiles x
# head groups, with no factor S, so tiles may be sized to fill the GPU's SMs in whole waves. Two
# accumulators are 2 x 64 x tile fp32 a consumer warpgroup, tile registers a thread: at most
# WHOLE_K_MAX_TILE[heads per CTA] tokens (ptxas's register budget at 128 threads a head + 32).
WHOLE_K_MAX_TILE = {1: 192, 2: 160, 3: 112}
# Register reallocation (QkvFrontConfig.register_reallocation): the producer is a whole warpgroup
# that keeps PRODUCER_REGISTERS a thread (setmaxnreg.dec; its lane 0 of warp 0 issues the loads,
# the other warps only join the CTA's barriers) and gives the rest to the two consumer warpgroups
# (setmaxnreg.inc to CONSUMER_REGISTERS: 128 x 40 + 256 x 232 = 64,512 of the SM's 65,536), so
# their two accumulators may hold up to REALLOCATED_MAX_TILE tokens (a register a token a thread:
# ptxas spills nothing at 224 and spills at 240): larger wgmmas (N = tokens), and at Hkv 2 one wave
# of 7 token tiles x 18 head groups up to 1568 tokens. Each role runs to the kernel's end in its
# own branch (with the roles rejoining after the main loop ptxas spilled from 192 tokens). Two-head
# whole-K tiles of REALLOCATE_FROM_TILE tokens or more take it (the rule is create's): 160 x 2 was
# 1-3% faster with it at each of the five rows measured, and larger tiles need it. Only the
# registers change, never the bits. Measured: RESULTS.md, forty-fourth session.
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232
REALLOCATED_MAX_TILE = 224
REALLOCATE_FROM_TILE = 160

# (largest M, token tile, heads per CTA, K tiles per stage) of the variant a launch takes. Up to
# 192 tokens a CTA computes one head for all of them, so the weight streams once. Above that a CTA
# computes two heads, so x is read from L2 half as often (the large-M cases are L2-bandwidth
# bound): 128 tokens up to 256. Above WAVE_TILES_ABOVE tokens a launch takes the two-head tile of
# 128, 192 or 256 tokens that wave_tile's cost picks (so the last two rows' limits only name those
# tiles). Tiles of 8 and 16 tokens take 4 K tiles a stage (fewer, longer wgmma groups: that main
# loop is otherwise latency bound), 32 and 64 one (a ring of 8 one-tile stages). Every tile gives
# a token the same bits (the K split fixes them). Measured: RESULTS.md.
TILES = ((8, 8, 1, 4), (16, 16, 1, 4), (32, 32, 1, 1), (64, 64, 1, 1), (128, 128, 1, 1), (192, 192, 1, 1),
         (256, 128, 2, 1), (384, 192, 2, 1), (1 << 62, 256, 2, 1))
TILE_SHAPES = tuple(sorted({(t, h) for _, t, h, _ in TILES}))
# The whole-K tiles (token tile, heads per CTA) a launch above WAVE_TILES_ABOVE tokens may take
# besides TILES' two-head cluster tiles (wave_tile weighs them all). None has fewer than 96 tokens:
# smaller ones run slower per token (each k16 wgmma reads its 64 weight rows and its token rows
# from shared memory, so its bytes a FLOP grow as 1 / tokens + 1 / 64), and at Hkv 2 80 x 2 and
# 96 x 2 lost at every measured M. 192 x 2 and 224 x 2 reallocate the registers (above); at Hkv 2
# they run 7 token tiles in one wave up to 1344 and 1568 tokens, where the other tiles take two.
# Measured: RESULTS.md (thirty-sixth, thirty-seventh and forty-fourth sessions).
WHOLE_K_TILES = ((128, 2), (160, 2), (192, 2), (224, 2), (96, 3), (112, 3))
# The whole-K tiles a launch may also take with weight multicast over pairs of token tiles
# (w_multicast), beside the same tile without: 128 x 2 (the same bits; 1-5% faster at five of the
# six rows measured where the plan takes it). grid_cost counts its pairs (an odd tile count adds a
# helper CTA, which may cost a wave) and wave_tile prefers it on a tie. The other whole-K tiles
# gained 1-6% with it at rows the plan gives to other tiles. Measured: RESULTS.md, forty-third session.
WHOLE_K_MULTICAST_TILES = ((128, 2),)
# A whole-K CTA's fixed cost in grid_cost, in tokens of two heads: none where the weight streams
# from the L2 (Hkv 1 and 2; fitted to the thirty-sixth session's sweep), WHOLE_K_HBM_FIXED_TOKENS
# where it streams from HBM (Hkv >= 3: the thirty-seventh's sweep at Hkv 3, 4, 8 and 16, where any
# value from 59 to 71 picks a tile within 3.1% of the fastest at every measured row).
WHOLE_K_L2_FIXED_TOKENS = 0
WHOLE_K_HBM_FIXED_TOKENS = 64
WHOLE_K_L2_COST_TENTHS = 5       # grid_cost's L2 bound of a whole-K grid (L2_COST_TENTHS of a cluster grid)


class Tile(NamedTuple):
    """What the plan picks for a launch, and what the C++ ops index (LAUNCH_TILES): the token tile
    (the N of the wgmma), the heads per CTA, the K tiles a ring stage, and whether a CTA sums the
    whole K range as the split's stripes (whole_k) or its rank's share in a split cluster, and
    whether a whole-K CTA's weight is multicast over a pair of token tiles (w_multicast), and
    whether a cluster tile's x is multicast over a pair of head groups (x_multicast)."""
    tokens: int
    heads: int
    k_tiles_per_stage: int = 1
    whole_k: bool = False
    w_multicast: bool = False
    x_multicast: bool = False


# the two-head table tile with x multicast (tile_for, where the heads exceed a wave)
X_MULTICAST_TILE = next(Tile(t, h, k, x_multicast=True) for _, t, h, k in TILES if h == 2)
LAUNCH_TILES = (tuple(Tile(t, h, k) for _, t, h, k in TILES)
                + tuple(Tile(t, h, 1, True) for t, h in WHOLE_K_TILES)
                + tuple(Tile(t, h, 1, True, True) for t, h in WHOLE_K_MULTICAST_TILES)
                + (X_MULTICAST_TILE,))


def x_part_boxes(token_tile: int) -> tuple[int, ...]:
    """Rows of each x box a partial tile may load, largest first (the largest may repeat): empty
    for tiles of up to 32 tokens (one box); each divides the tile, so every box starts at a
    multiple of its size. A partial tile of r rows (r rounded up to X_BOX_MIN_ROWS, r < tile)
    takes r // largest boxes of the largest size, then one of each smaller size its binary digits
    of the remainder ask for."""
    if token_tile <= 32:
        return ()
    sizes, rows = [], X_BOX_MIN_ROWS
    while rows < token_tile and token_tile % rows == 0 and len(sizes) < X_BOXES_MAX:
        sizes.append(rows)
        rows *= 2
    return tuple(reversed(sizes))


def x_part_box_counts(token_tile: int, x_rows: int) -> list[tuple[int, int]]:
    """(box rows, boxes) a tile with x_rows rows of x loads (as the kernel derives them)."""
    sizes = x_part_boxes(token_tile)
    left = -(-x_rows // X_BOX_MIN_ROWS) * X_BOX_MIN_ROWS
    if not sizes or left >= token_tile:
        return [(token_tile, 1)]
    counts = []
    for rows in sizes:
        count, left = divmod(left, rows)
        counts.append((rows, count))
    return [c for c in counts if c[1]]


def heads(kv_heads: int) -> int:
    """64-column heads of the projection: 8 Hkv q, Hkv k, Hkv v, 8 Hkv gate."""
    return (2 * GROUP + 2) * kv_heads


def k_split(kv_heads: int) -> int:
    """CTAs that split K for one head (a cluster). Where one CTA per head fits a wave of a 132-SM
    H100 / H200, the largest of 3, 2, 1 that still does (Hkv 1 and 2: 3, Hkv 3: 2, Hkv 4 to 7: 1);
    where even one CTA per head takes more than a wave (Hkv >= 8), 2: the grid's waves are then
    of half-length CTAs, so its last wave leaves less of the GPU idle. It depends on Hkv only,
    never on M: it fixes the order of the K sums, so a token gets the same bits in any batch.
    At most MAX_K_SPLIT: at Hkv 1 the 18 clusters of a split of 6 or 7 do not all fit the GPCs at
    once. The splits measured at each Hkv: bench/RESULTS.md."""
    if heads_exceed_a_wave(kv_heads):
        return 2
    return next(s for s in (MAX_K_SPLIT, 2, 1) if heads(kv_heads) * s <= SM_TARGET or s == 1)


def heads_exceed_a_wave(kv_heads: int) -> bool:
    """Whether one CTA a head takes more than a wave of SM_TARGET SMs (Hkv >= 8): k_split is then 2,
    and tile_for multicasts x over pairs of head groups in the two-head table tile."""
    return heads(kv_heads) > SM_TARGET


def stage_bytes(token_tile: int, heads_per_cta: int, k_tiles_per_stage: int) -> int:
    """Bytes of one ring stage: the heads' weight rows and x's tokens, k_tiles_per_stage K tiles."""
    return (heads_per_cta * HEAD_DIM + token_tile) * K_TILE * 2 * k_tiles_per_stage


def landing_slab_floats(block: int) -> int:
    """fp32 of one slab: at least (64 + 3) * block (the columns and the quarters' skew), 4 mod 32."""
    return 67 * block + (4 - 67 * block) % 32


def landing_bytes(token_tile: int, heads_per_cta: int, block: int = OWNER_BLOCK) -> int:
    """Bytes of the landing zone of the split-K sum: a slab per (owned block, source rank, head),
    ceil(blocks / S) S <= blocks + MAX_K_SPLIT - 1 of them a head for any split S."""
    return (token_tile // block + MAX_K_SPLIT - 1) * heads_per_cta * landing_slab_floats(block) * 4


def landing_chunks(token_tile: int) -> int:
    """Landing barriers a CTA of this tile holds: one per LANDING_CHUNK_TOKENS owned tokens (a
    split of 1 owns the whole tile)."""
    return -(-token_tile // LANDING_CHUNK_TOKENS)


def landing_chunk_bytes(chunk: int, token_tile: int, heads_per_cta: int, split: int, rank: int,
                        block: int = OWNER_BLOCK) -> int:
    """Bytes the peers' st.async complete on chunk `chunk` of rank's landing barriers: each of the
    split's other ranks pushes every block of the tile (a partial tile's too), 64 columns x block
    tokens of fp32 a head, and the chunk holds the rank's owned blocks [chunk c, (chunk + 1) c),
    c = LANDING_CHUNK_TOKENS / block (the rank's own share lands by plain stores). The kernel's
    SplitK.init_landing computes the same from its own owned_tokens."""
    per_chunk = LANDING_CHUNK_TOKENS // block
    owned = owned_tokens(token_tile, rank, split, block) // block   # the rank's blocks of the tile
    blocks = min(max(owned - chunk * per_chunk, 0), per_chunk)
    return blocks * (split - 1) * heads_per_cta * HEAD_DIM * block * 4


def landing_slab(owned_block: int, source: int, head: int, split: int, heads_per_cta: int) -> int:
    """The slab index of an owner's landing zone that holds its owned_block-th block's partial
    from rank `source` for head `head`. The kernel calls this (and landing_offset, owned_token) on
    its run-time integers, so these use only operators the DSL's integers have."""
    return (owned_block * split + source) * heads_per_cta + head


def landing_offset(column: int, token_in_block: int, block: int = OWNER_BLOCK) -> int:
    """fp32 offset of (head column, token) within a slab: [64][block], the column quarters skewed."""
    return (column + column // 16) * block + token_in_block


def owned_tokens(t_count: int, rank: int, split: int, block: int = OWNER_BLOCK) -> int:
    """Tokens rank owns of a tile's first t_count (as the kernel derives them, dividing by the
    run-time split by multiply and shift): its whole blocks below t_count, then the partial block
    if that is its."""
    whole, rest = divmod(t_count, block)
    n = (whole - rank + split - 1) // split * block
    return n + (rest if whole % split == rank else 0)


def owned_token(index: int, rank: int, split: int, block: int = OWNER_BLOCK) -> int:
    """The tile token of rank's index-th owned token."""
    return ((index // block) * split + rank) * block + index % block


def k_range(rank: int, split: int) -> tuple[int, int]:
    """The K tiles [lo, hi) rank `rank` of a split of `split` sums (as the kernel derives them)."""
    return rank * K_TILES // split, (rank + 1) * K_TILES // split


@dataclass(frozen=True)
class QkvFrontConfig:
    """Compile-time parameters of one variant (M, N, Hkv, the K split, the cache size and every
    address are run time)."""
    token_tile: int       # tokens per CTA: the N of the wgmma (8..256)
    heads_per_cta: int    # 64-column heads per CTA: one consumer warpgroup each
    stages: int           # ring depth
    rope: bool            # interleaved RoPE on q and k (cos_sin given)
    pos_dtype: str        # "int32" or "int64"
    slot_dtype: str
    k_tiles_per_stage: int = 1   # 64-column K tiles per ring stage (one barrier and wgmma group per stage)
    mma_lag: int = 1      # wgmma groups in flight when a stage is released (0: at once; RELEASE_AT_ONCE_TILE)
    pdl: bool = True      # programmatic dependent launch: only weight loads before griddepcontrol.wait
    trigger: bool = True  # let the next kernel on the stream launch early (trigger_point)
    epilogue: bool = True  # development only: False skips the sum and the epilogue (times the main loop)
    owner_block: int = OWNER_BLOCK   # tokens per block of the split-K sum's ownership (2 or 8; see above)
    stamps: int = 0       # development only: global address of the phase stamps (STAMP_PHASES); 0: none
    fp8: bool = False     # a float8_e4m3fn cache: the insert quantizes k' / k_scale and v / v_scale
    x_multicast: bool = False   # x multicast over a pair of head groups (X_MULTICAST_TILE; elsewhere development)
    whole_k: bool = False   # a CTA sums every K tile as the split's stripes (Whole-K CTAs, above): no cluster
    w_multicast: bool = False   # whole-K: the weight multicast over a pair of token tiles (MULTICAST_GROUP; see above)
    register_reallocation: bool = False   # whole-K two-head: a producer warpgroup (REALLOCATE_FROM_TILE; see above)
    landing_barriers: bool = False   # cluster tiles: the push lands chunk by chunk (LANDING_CHUNK_TOKENS; development)

    @property
    def threads(self) -> int:   # the consumer warpgroups, then one producer warp (a warpgroup with reallocation)
        return 128 * self.heads_per_cta + (128 if self.register_reallocation else 32)

    @property
    def tile(self) -> Tile:
        """The plan's Tile of this variant (the C++ ops' key names it: shims.qkv_front_key)."""
        return Tile(self.token_tile, self.heads_per_cta, self.k_tiles_per_stage, self.whole_k, self.w_multicast,
                    self.x_multicast)

    @property
    def group_cluster(self) -> int:
        """Head groups per cluster: MULTICAST_GROUP with x_multicast, else 1."""
        return MULTICAST_GROUP if self.x_multicast else 1

    @property
    def tile_cluster(self) -> int:
        """Token tiles per cluster: MULTICAST_GROUP with w_multicast, else 1."""
        return MULTICAST_GROUP if self.w_multicast else 1

    @property
    def multicast(self) -> bool:
        """A CTA's ring takes loads from its pair's other CTA (x or weight multicast)."""
        return self.x_multicast or self.w_multicast

    @property
    def x_part_boxes(self) -> tuple[int, ...]:
        return x_part_boxes(self.token_tile)

    @property
    def trigger_point(self) -> str | None:
        """Where a CTA triggers the dependent launch: "last_load" (the producer, once its last load
        is issued: tiles of up to TRIGGER_AT_LAST_LOAD_TILE tokens), "main_loop" (the consumers,
        after it: larger tiles), or None (no PDL or no trigger)."""
        if not (self.pdl and self.trigger):
            return None
        return "last_load" if self.token_tile <= TRIGGER_AT_LAST_LOAD_TILE else "main_loop"

    @property
    def stage_bytes(self) -> int:
        return stage_bytes(self.token_tile, self.heads_per_cta, self.k_tiles_per_stage)

    @property
    def landing_bytes(self) -> int:
        return landing_bytes(self.token_tile, self.heads_per_cta, self.owner_block)

    @staticmethod
    def create(token_tile: int, heads_per_cta: int, rope: bool, pos_dtype: str = "int64",
               slot_dtype: str = "int64", stages: int | None = None, **over) -> "QkvFrontConfig":
        if over.get("whole_k"):
            # two-head tiles from REALLOCATE_FROM_TILE tokens reallocate the registers (unless told not to)
            over.setdefault("register_reallocation", heads_per_cta == 2 and token_tile >= REALLOCATE_FROM_TILE)
            # any token tile of whole 16-row x boxes up to WHOLE_K_MAX_TILE[heads] (two
            # accumulators a thread; REALLOCATED_MAX_TILE with reallocation), one K tile a stage
            # (a stripe starts at any K tile)
            most = (REALLOCATED_MAX_TILE if over.get("register_reallocation") and heads_per_cta == 2
                    else WHOLE_K_MAX_TILE.get(heads_per_cta, 0))
            assert token_tile % X_BOX_MIN_ROWS == 0 and token_tile <= most, (token_tile, heads_per_cta)
            assert over.get("k_tiles_per_stage", 1) == 1, over
        else:
            assert (token_tile, heads_per_cta) in TILE_SHAPES, (token_tile, heads_per_cta)
        assert pos_dtype in INDEX_DTYPES and slot_dtype in INDEX_DTYPES
        over.setdefault("owner_block", SMALL_TILE_OWNER_BLOCK if token_tile <= 16 else OWNER_BLOCK)
        over.setdefault("mma_lag", 0 if token_tile <= RELEASE_AT_ONCE_TILE else 1)
        if stages is None:   # as deep as shared memory allows, up to 8 stages
            stage = stage_bytes(token_tile, heads_per_cta, over.get("k_tiles_per_stage", 1))
            stages = max(2, min(8, SMEM_LIMIT // stage))
        cfg = QkvFrontConfig(token_tile, heads_per_cta, stages, bool(rope), pos_dtype, slot_dtype, **over)
        # a multicast tile's partial last tile loads its own x in boxes (tiles of up to 32 tokens have none)
        assert not cfg.x_multicast or cfg.x_part_boxes, f"{cfg}: x multicast needs a tile of 64 tokens or more"
        # weight multicast pairs token tiles of whole-K CTAs (a split cluster would need 2 S CTAs;
        # the helper CTA past an odd tile count loads no x: x_part_boxes); with x multicast too the
        # cluster is two token tiles x two head groups
        assert not cfg.w_multicast or (cfg.whole_k and cfg.x_part_boxes), cfg
        # landing barriers: the split-cluster tiles (a whole-K CTA lands its own sum in its own
        # shared memory)
        assert not (cfg.landing_barriers and cfg.whole_k), cfg
        # register reallocation: two consumer warpgroups of whole-K tiles (their registers and the
        # producer's fill the SM: PRODUCER_REGISTERS, CONSUMER_REGISTERS)
        assert not cfg.register_reallocation or (cfg.whole_k and cfg.heads_per_cta == 2), cfg
        # the landing zone of the split-K sum reuses the ring once every CTA's main loop is done
        assert cfg.stages * cfg.stage_bytes >= cfg.landing_bytes, cfg
        assert cfg.stages * cfg.stage_bytes <= SMEM_LIMIT, f"{cfg}: the ring exceeds shared memory"
        return cfg


@functools.lru_cache(maxsize=4096)   # every eager launch asks (wave_tile weighs 7 tiles: ~11 us)
def tile_for(m: int, kv_heads: int) -> Tile:
    """The tile of a launch of m tokens at kv_heads: by M from TILES up to WAVE_TILES_ABOVE tokens
    (the two-head one with x multicast where the heads exceed a wave: X_MULTICAST_TILE), above by
    the grid's cost (wave_tile). Every tile gives a token the same bits."""
    if m > WAVE_TILES_ABOVE:
        return wave_tile(m, kv_heads)
    for limit, tile, hpc, kps in TILES:
        if m <= limit:
            return Tile(tile, hpc, kps, x_multicast=hpc == 2 and heads_exceed_a_wave(kv_heads))
    raise AssertionError(m)


def tile_runs(kv_heads: int, limit: int) -> list[tuple[int, Tile]]:
    """tile_for(m, kv_heads) for m = 1 .. limit as runs (last m, tile), evaluated only where it may
    change: past a TILES row's limit, and past a multiple of a wave tile's tokens (grid_cost sees m
    only through its token tiles, ceil(m / tokens)). What the C++ ops' tables hold (shims), at a
    fraction of the cost of asking every m."""
    starts = {1, WAVE_TILES_ABOVE + 1} | {row[0] + 1 for row in TILES if row[0] < limit}
    starts |= {k * t.tokens + 1 for t in WAVE_TILES for k in range(1, limit // t.tokens + 1)}
    starts = sorted(x for x in starts if x <= limit)
    runs: list[tuple[int, Tile]] = []
    for i, start in enumerate(starts):
        last = starts[i + 1] - 1 if i + 1 < len(starts) else limit
        tile = tile_for(start, kv_heads)
        if runs and runs[-1][1] == tile:
            runs[-1] = (last, tile)
        else:
            runs.append((last, tile))
    return runs


def weight_fits_l2(kv_heads: int) -> bool:
    """Whether the projection's weight (heads x 64 rows of HIDDEN bf16) fits L2_RESIDENT_BYTES
    (Hkv 1 and 2: 19 and 38 MB)."""
    return heads(kv_heads) * HEAD_DIM * HIDDEN * 2 <= L2_RESIDENT_BYTES


def grid_cost(m: int, kv_heads: int, tile: Tile) -> int:
    """wave_tile's cost of a launch's grid, in integers (x 10 SM_TARGET): ceil(C / SM_TARGET) waves
    of one CTA an SM, C = token tiles x head groups (x the K split for a cluster tile). A wave of
    cluster CTAs costs their tile's tokens plus TILE_FIXED_TOKENS (heads / 2 of them, over 1 / S of
    K); a wave of whole-K CTAs costs S stripes of heads / 2 x tokens, plus WHOLE_K_L2_FIXED_TOKENS
    or WHOLE_K_HBM_FIXED_TOKENS (whether the weight fits the L2).
    Where the weight fits the L2 a grid also costs at least L2_COST_TENTHS / 10 x C / SM_TARGET x
    (the CTA's weight rows + its tokens) a K share: its operands then all stream from the L2, and
    many small tiles are bound by that traffic. A weight-multicast tile counts whole pairs of token
    tiles (the helper CTA past an odd count holds an SM) and half its weight rows."""
    split, groups, in_l2 = k_split(kv_heads), heads(kv_heads) // tile.heads, weight_fits_l2(kv_heads)
    pair = MULTICAST_GROUP if tile.w_multicast else 1   # token tiles rounded up to whole pairs
    ctas = -(-m // (tile.tokens * pair)) * pair * groups
    if tile.whole_k:
        fixed = WHOLE_K_L2_FIXED_TOKENS if in_l2 else WHOLE_K_HBM_FIXED_TOKENS
        wave = split * tile.heads * tile.tokens // 2 + fixed
        shares, l2_tenths = split, WHOLE_K_L2_COST_TENTHS
    else:
        ctas *= split
        wave = tile.heads * tile.tokens // 2 + TILE_FIXED_TOKENS
        shares, l2_tenths = 1, L2_COST_TENTHS
    cost = -(-ctas // SM_TARGET) * wave * 10 * SM_TARGET
    if in_l2:
        cost = max(cost, l2_tenths * ctas * shares * (tile.heads * HEAD_DIM // pair + tile.tokens))
    return cost


CLUSTER_WAVE_TILES = tuple(t for t in LAUNCH_TILES if not t.whole_k and t.heads == 2 and not t.x_multicast)
WAVE_TILES = CLUSTER_WAVE_TILES + tuple(t for t in LAUNCH_TILES if t.whole_k)


def wave_tile(m: int, kv_heads: int, candidates: tuple | None = None) -> Tile:
    """The tile of the least grid_cost among `candidates` (by default TILES' two-head cluster tiles,
    WHOLE_K_TILES and WHOLE_K_MULTICAST_TILES), the larger tile on a tie, then the multicast one.
    The cost is computed in integers; the C++ ops look its choice up in the tables Python hands
    them. Every tile gives a token the same bits, so the cost only decides the time
    (bench/RESULTS.md has the sweeps it is fitted to)."""
    if candidates is None:
        candidates = WAVE_TILES
    return min(candidates, key=lambda t: (grid_cost(m, kv_heads, t), -t.tokens * t.heads, not t.w_multicast))


def _dtype_name(t) -> str:
    return str(t).replace("torch.", "")


def launch_config(m: int, kv_heads: int, rope: bool, positions_dtype, slots_dtype,
                  override: dict | None = None, fp8: bool = False) -> QkvFrontConfig:
    """The variant a launch of m tokens at kv_heads runs (fp8: into a float8_e4m3fn cache);
    override (dev tools, tests) forces a tile ("tile": (T, heads)) or another knob of the config."""
    if not override:   # every eager call asks: the table's variants are cached
        return tile_config(tile_for(m, kv_heads), bool(rope), _dtype_name(positions_dtype),
                           _dtype_name(slots_dtype), bool(fp8))
    over = dict(override)
    tile, hpc, kps, whole_k, w_multicast, x_multicast = tile_for(m, kv_heads)
    if "tile" in over:   # a cluster tile of TILES, unless the override also asks for whole_k (and w_multicast)
        tile, hpc = over.pop("tile")
        kps = next((k for _, t, h, k in TILES if (t, h) == (tile, hpc)), 1)
        whole_k = w_multicast = x_multicast = False
    over.setdefault("k_tiles_per_stage", kps)
    over.setdefault("whole_k", whole_k)
    over.setdefault("w_multicast", w_multicast)
    over.setdefault("x_multicast", x_multicast)
    over.setdefault("fp8", bool(fp8))
    return QkvFrontConfig.create(tile, hpc, rope, _dtype_name(positions_dtype), _dtype_name(slots_dtype), **over)


@functools.lru_cache(maxsize=None)   # every eager launch asks
def tile_config(tile: Tile, rope: bool, pos_dtype: str = "int64", slot_dtype: str = "int64",
                fp8: bool = False) -> QkvFrontConfig:
    """The plan's variant of a tile (every other knob at its rule)."""
    return QkvFrontConfig.create(tile.tokens, tile.heads, rope, pos_dtype, slot_dtype,
                                 k_tiles_per_stage=tile.k_tiles_per_stage, fp8=fp8, whole_k=tile.whole_k,
                                 w_multicast=tile.w_multicast, x_multicast=tile.x_multicast)


def deployment_variants(kv_heads: int, rope: bool, fp8: bool = False) -> list[QkvFrontConfig]:
    """Every variant a deployment may launch for M = 1 .. any: one per token tile, for int64
    positions and slots (as muse_ops.PagedBatch builds them) and for int32 (what some engines
    pass). Mixed index dtypes compile on first use. kv_heads is a run-time dimension (every Hkv
    compiles the same tiles)."""
    return [tile_config(tile, rope, d, d, fp8) for tile in LAUNCH_TILES for d in INDEX_DTYPES]


def ci_variants() -> list[QkvFrontConfig]:
    """What CI compiles on the CPU: every tile shape, RoPE on and off, every index dtype pair, for a
    bf16 cache; and every tile shape, RoPE on and off, for an FP8 cache (one index dtype each: the
    insert's code does not depend on it)."""
    bf16 = [tile_config(tile, rope, p, s) for tile in LAUNCH_TILES for rope in (False, True) for p in INDEX_DTYPES
            for s in INDEX_DTYPES]
    fp8 = [tile_config(tile, rope, "int64", "int64", fp8=True) for tile in LAUNCH_TILES for rope in (False, True)]
    return bf16 + fp8


def dev_variants() -> list[QkvFrontConfig]:
    """Development knobs CI also compiles, so they keep compiling (no launch of the package takes
    them, and the ahead-of-time library holds none): x_multicast at a one-head and a two-head
    cluster tile and at a whole-K tile; w_multicast at a three-head whole-K tile, alone and with
    x_multicast (the two-head 128 x 2 with w_multicast is a launch tile: ci_variants);
    register_reallocation with w_multicast at REALLOCATED_MAX_TILE tokens, and 160 x 2 without
    reallocation (the largest two-head whole-K tile that fits without it); landing_barriers at
    the cluster tiles of 16 x 1 (blocks of 2, four K tiles a stage), 256 x 2, and the x multicast
    tile with an FP8 cache."""
    return ([QkvFrontConfig.create(tile, hpc, True, "int64", "int64", x_multicast=True, whole_k=whole_k)
             for tile, hpc, whole_k in ((128, 1, False), (256, 2, False), (128, 2, True))]
            + [QkvFrontConfig.create(tile, hpc, True, "int64", "int64", w_multicast=True, whole_k=True, x_multicast=x)
               for tile, hpc, x in ((112, 3, False), (112, 3, True))]
            + [QkvFrontConfig.create(REALLOCATED_MAX_TILE, 2, True, "int64", "int64", whole_k=True, w_multicast=True),
               QkvFrontConfig.create(WHOLE_K_MAX_TILE[2], 2, True, "int64", "int64", whole_k=True,
                                     register_reallocation=False)]
            + [QkvFrontConfig.create(tile, hpc, True, "int64", "int64", k_tiles_per_stage=kps, landing_barriers=True,
                                     x_multicast=x, fp8=x)
               for tile, hpc, kps, x in ((16, 1, 4, False), (256, 2, 1, False), (128, 2, 1, True))])


def can_implement(device, kv_heads: int, rope: bool | None = None, fp8: bool = False) -> tuple[bool, str]:
    ok, why = runtime.device_support(device)
    if not ok:
        return ok, why
    if kv_heads < 1:
        return False, f"kv_heads must be >= 1, got {kv_heads}"
    return True, "ok"
