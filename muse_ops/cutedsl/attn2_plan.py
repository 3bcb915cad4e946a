"""The host side of attn2's CuTe DSL kernel (muse_ops/cutedsl/attn2.py), with no cutlass import:
the reduction tree of a request (split_plan), the compile-time parameters of a variant
(Attn2Config), the workspace layout, which layout a launch takes, and whether a deployment can
run. The ops, the backends and the tests read these on machines without the DSL too.

The tree and its invariants are described in the kernel module's docstring; docs/DESIGN.md
sections 5, 10 and 11 are the contract they implement. The comments here state each rule and what
it keeps invariant; the measurements that chose the numbers are in bench/RESULTS.md, "Measurements
behind the plan constants" (that is what "RESULTS.md" below refers to).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ..config import GROUP, HEAD_DIM, PAGE_SIZE, SUPPORTED_Q_LENS
from . import runtime

THREADS = 128     # one warpgroup
M_TILE = 64       # wgmma M: the q_len * 8 query rows of a KV head, zero-padded
MAX_SEQ_LEN = 2**21   # a CTA stages its page-table slice in shared memory (32 KB at 2^21)

# The reduction tree. Its shape depends on a request's own L only; which CTAs compute which part
# of it (the wide or the deep layout) depends on the batch, and the bits do not.
SUB_CHUNKS = 8         # chunks per sub = CTAs of a wide cluster (WINDOW_SUB_CHUNKS with a window)
WINDOW_SUB_CHUNKS = 4  # the same with a window (sub_chunks)
NODES_MAX = 8          # most nodes (2 subs each) of one (request, KV head); chosen over 16 and 4
                       # across batch sizes, since the tree cannot depend on the batch (RESULTS.md)
# Nodes of a request (split_plan): one below TWO_NODE_STEPS ring steps, two from there, then one
# per NODE_MIN_STEPS steps, at most NODES_MAX: chunks of 4 steps (256 keys) at L = 8192, 8 from
# L = 16384 to 65535, longer beyond. Both cache dtypes share the tree. A node per 128 steps
# instead of 64 (64 until the forty-eighth session; 32 before the nineteenth run) halves a long
# request's chunks and subs: a large batch runs half the CTAs, each paying its page table,
# prologue and merges once for twice the keys, and the wide layout's chunks are no longer too
# short for those costs. Faster from L = 12288 at B >= 32 (bf16 2-4%, FP8 12-15% at B >= 64) and
# where the wide layout runs long requests (B=8 L=32768: bf16 15%, FP8 19%); slower where the
# deep grid then holds about one CTA an SM (B=16 at L = 12288-16384: bf16 8-13%, FP8 up to 42%):
# RESULTS.md, forty-seventh and forty-eighth sessions. From 64 to 127 steps (L = 4096-8191) two
# nodes, as at L = 4096 one node was slower. The tree is a function of a request's own L only, so
# its bits do not depend on the batch.
NODE_MIN_STEPS = 128   # ring steps per node from the third node on
TWO_NODE_STEPS = 64    # ring steps from which a request has two nodes
# A deployment of 16 KV heads a rank (TP1) takes one node below 128 steps (L < 8192) instead of
# two from 64: its batch holds 16 (request, KV head) pairs a request, so B=32 fills the GPU as
# B=256 at Hkv 2, and there a request's second node costs more than it spreads (a partial, a
# ticket, the last arriver's fold). Faster at L = 4096 at B=32 (bf16 11%, FP8 13%; decode 5% and
# 14%) and B=1, bf16 at B=8 (8%); FP8 B=8 5% slower. A node per 256 steps as well (2 nodes up to
# L = 49151) was up to 29% slower for FP8 from L = 32768, so longer requests keep the default
# tree (RESULTS.md, forty-ninth session). Hkv is a deployment constant: a request's bits still do
# not depend on the batch (tree_knobs).
COARSE_TREE_KV_HEADS = 16
COARSE_TREE = {"two_node_steps": 128}
WIDE_MAX_PAIRS = 24    # the wide layout runs up to this many (request, KV head) pairs per launch
                       # (at 24 pairs wide beats deep at L=4096 and 8192, not at L=16384: RESULTS.md)
WIDE_MAX_PAIRS_WINDOW = 32   # the same for window deployments (choose_layout)

# When attn2 triggers its dependent launch (attn2.py, trigger_dependents): after its main loop,
# so the next kernel (the next layer's qkv_front in a stack) launches while our merges run and
# streams its weight into the SMs our CTAs leave. Every deep grid and every wide grid of more than
# QUIET_WIDE_PAIRS (request, KV head) pairs does; a wide grid of fewer pairs only where it has at
# most one working CTA per SM. The rule is by pair count, not CTA count: the wide grids the
# trigger slows (six and eight pairs) run as many CTAs as some it speeds up (RESULTS.md). A
# trigger moves no data: the bits do not depend on it.
QUIET_WIDE_PAIRS = 8

# Occupancy caps (occupancy_cap). qkv_front triggers its dependent launch before its epilogue
# (at its last load or after its main loop: QkvFrontConfig.trigger_point), so attn2's grid
# launches while qkv_front's CTAs (one per SM, 108 of 132 at Hkv 2) still hold their SMs: the
# block scheduler places as many attn2 CTAs as fit on the SMs left free, 5 to an SM (4 deep), and
# those SMs then carry more of the grid than the others. Reserving shared memory so that at most
# 1 to 4 CTAs fit an SM spreads it: the first CTAs still run their prologue under qkv_front's
# tail, the rest land on the SMs qkv_front frees. A launch takes the smallest cap under which its
# whole grid fits one wave (a cap that does not fit costs a second wave), and none where no cap
# below what its registers allow fits. A cap only reserves shared memory, so the bits do not
# depend on it. What the caps gain, per cap: bench/RESULTS.md.
SMEM_PER_SM = 228 * 1024                  # an H100 / H200 SM; each resident CTA also takes 1 KB
OCCUPANCY_SMEM_BYTES = {1: 124 * 1024,    # > (228 - 2) / 2 KB: one CTA an SM
                        2: 92 * 1024,     # > (228 - 3) / 3 KB and <= (228 - 2) / 2: two
                        3: 60 * 1024,     # > (228 - 4) / 4 KB and <= (228 - 3) / 3: three
                        4: 48 * 1024}     # > (228 - 5) / 5 KB and <= (228 - 4) / 4: four
# the largest cap worth a variant in each layout: one below the CTAs an SM its registers allow
# (Attn2Config.create's min_blocks: wide 5, deep 4)
OCCUPANCY_MAX_CAP = {"wide": 4, "deep": 3}
# Ring stages of a variant under a cap of 1 or 2 (2 otherwise): a third stage lives in shared
# memory the cap reserves anyway, so it costs no CTA an SM; the ring depth does not change the
# bits. Deeper rings (4 to 7 stages, what caps 1 and 2 hold) and a third stage under cap 3 were
# slower (RESULTS.md).
CAPPED_RING_STAGES = {1: 3, 2: 3}
# The q_lens whose variants under a cap compile for the cap's CTAs an SM (__launch_bounds__
# min_blocks = the cap: ptxas takes 103 registers wide and 150 deep, no spills) instead of 5 (wide)
# or 4 (deep): the cap leaves the registers free anyway. Verify (q_len 8) only: decode was not
# faster with it (RESULTS.md).
CAPPED_REGISTER_Q_LENS = (8,)


# FP8 decode (q_len 1) takes one TMA box a page and its refills from warps 1..3 in turn: warp 0
# alone runs decode's softmax, and the loads of its refills were on the path every step waits
# for. 1-3% faster each, together 2-4% at every decode case measured; in verify (q_len 8), where
# every warp runs a softmax, each was 1-3% slower. Neither changes the bits (RESULTS.md,
# forty-seventh session; tests/test_attn2_cutedsl.py, test_development_knobs_bit_identical).
FP8_DECODE_KNOBS = {"page_box": True, "refill_warp": -1}


def default_knobs(q_len: int, fp8: bool) -> dict:
    """The development knobs' settings a variant takes unless told (Attn2Config.create):
    FP8_DECODE_KNOBS for FP8 decode, both off elsewhere."""
    return dict(FP8_DECODE_KNOBS) if fp8 and q_len == 1 else {"page_box": False, "refill_warp": 0}


def occupancy_caps(layout: str) -> range:
    """Every cap a launch of this layout may take (0: none)."""
    return range(OCCUPANCY_MAX_CAP[layout] + 1)


def occupancy_cap(ctas: int, cluster_size: int, sm_count: int, max_cap: int) -> int:
    """CTAs an SM a launch of `ctas` CTAs (clusters of cluster_size) allows (1 to max_cap; 0: no
    cap, as many as registers and shared memory fit): the smallest cap under which the grid fits
    one wave. A GPC's SMs hold whole clusters only: at one CTA an SM the H200's 132 SMs hold 30
    clusters of 4 or 15 of 8, 120 CTAs (tools/cluster_occupancy.py), so clusters of 4 and 8 count
    on 7/8 of the SMs at every cap (a grid at cap 4 confirmed it: bench/RESULTS.md)."""
    if sm_count <= 0:
        return 0
    one_wave = sm_count if cluster_size <= 2 else sm_count * 7 // 8
    for cap in range(1, max_cap + 1):
        if ctas <= cap * one_wave:
            return cap
    return 0


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def sub_chunks(window: int) -> int:
    """Chunks per sub of a deployment. A window bounds every request to ~33 steps, one node: with
    one chunk per sub (the first design) that tree has 2 chunks, so a small batch ran on 2 CTAs per
    (request, KV head). With 4 chunks per sub the tree has 8 chunks: the wide layout runs them on
    8 CTAs at small batches, the deep one folds 4 in a CTA at large ones. It depends on the
    deployment only, so a request's bits do not depend on the batch (1, 2, 4 and 8 chunks per sub
    measured: bench/RESULTS.md)."""
    return WINDOW_SUB_CHUNKS if window > 0 else SUB_CHUNKS


def tree_knobs(kv_heads: int, window: int) -> dict:
    """The tree constants a deployment's variants take beyond the defaults: COARSE_TREE from
    COARSE_TREE_KV_HEADS KV heads without a window (a window bounds a request to about 33 steps,
    one node in either tree), none otherwise."""
    return dict(COARSE_TREE) if kv_heads >= COARSE_TREE_KV_HEADS and window == 0 else {}


def node_count(n_steps: int, node_min_steps: int = NODE_MIN_STEPS, two_node_steps: int = TWO_NODE_STEPS) -> int:
    """Nodes of a request with n_steps ring steps (before split_plan trims empty ones): n_steps //
    node_min_steps, at least 2 from two_node_steps steps, 1 to NODES_MAX (as the kernel derives it)."""
    return max(1, min(NODES_MAX, max(n_steps // node_min_steps, 2 * int(n_steps >= two_node_steps))))


def split_plan(n_steps: int, chunks_per_sub: int = SUB_CHUNKS, node_min_steps: int = NODE_MIN_STEPS,
               two_node_steps: int = TWO_NODE_STEPS) -> tuple[int, int, int, int]:
    """(most steps of a chunk, chunks, subs, nodes) of a request with n_steps ring steps, exactly
    as the kernel derives them from L: node_count(n_steps) nodes of 16 chunks, chunk j covering
    steps [j * n_steps // chunks, (j + 1) * n_steps // chunks), so the subs of a request (the work
    of a deep CTA) differ by at most one step."""
    nodes = node_count(n_steps, node_min_steps, two_node_steps)
    n_chunks = min(2 * chunks_per_sub * nodes, n_steps)
    n_subs = -(-n_chunks // chunks_per_sub)
    return -(-n_steps // n_chunks), n_chunks, n_subs, -(-n_subs // 2)


LAYOUTS = ("wide", "deep")


@dataclass(frozen=True)
class Attn2Config:
    """Compile-time parameters of one variant (everything else is run time)."""
    q_len: int
    window: int
    max_seq_len: int
    layout: str       # which CTAs compute which part of the tree: "wide" or "deep" (LAYOUTS)
    nodes_max: int    # most nodes of a request under this deployment (<= NODES_MAX)
    chunk_max: int    # most steps per chunk under this deployment
    stages: int       # TMA ring depth
    pages_per_step: int = 4   # pages per ring step (keys per step = 16 pages, the N of S = Q K^T)
    min_blocks: int = 0  # __launch_bounds__ min CTAs per SM (0: no hint)
    pdl: bool = True  # programmatic dependent launch (seq_lens, the page table and early_ring's rows read before griddepcontrol.wait)
    node_min_steps: int = NODE_MIN_STEPS   # ring steps per node from the third on (node_count)
    chunks_per_sub: int = 0                 # chunks per sub of the tree; 0: sub_chunks(window)
    two_node_steps: int = TWO_NODE_STEPS   # ring steps from which a request has two nodes (node_count)
    ctas_per_sm: int = 0   # 1 to 4: shared memory reserved so no more CTAs share an SM (occupancy_cap); 0: none
    early_ring: bool = True    # the ring prologue's steps of rows older than the new tokens go out before the PDL wait
    fp8: bool = False          # a float8_e4m3fn cache: e4m3 pages staged by TMA, to f16 in smem for f16 wgmmas (KVRing)
    page_box: bool = False     # fp8: one (16, 128) TMA box a page (its K and V rows together), not two (16, 64)
    refill_warp: int = 0       # the warp that issues the ring's refills; -1: step k's is warp k % 4 (q_len 1:
    # 1 + k % 3, as warp 0 alone runs the softmax). Both: FP8 decode's defaults (FP8_DECODE_KNOBS)

    @property
    def query_rows(self):      # real query rows per (request, KV head); the wgmma tile has M_TILE rows
        return self.q_len * GROUP

    @property
    def keys_per_step(self):   # the N of S = Q K^T
        return self.pages_per_step * PAGE_SIZE

    @property
    def sub_chunks(self):
        return self.chunks_per_sub or sub_chunks(self.window)

    @property
    def wide(self):
        return self.layout == "wide"

    @property
    def cluster_size(self):    # CTAs per cluster: the chunks of a sub (wide) or the subs of a node (deep)
        return self.sub_chunks if self.wide else 2

    @property
    def chunks_per_cta(self):  # 1 (wide) or a sub (deep)
        return 1 if self.wide else self.sub_chunks

    @property
    def max_clusters(self):    # clusters per (request, KV head) in the grid: subs (wide) or nodes
        return 2 * self.nodes_max if self.wide else self.nodes_max

    @property
    def ctas_per_pair(self):   # CTAs per (request, KV head) in the grid
        return self.cluster_size * self.max_clusters

    @property
    def slots(self):   # workspace partials per (request, KV head): subs (wide) or nodes
        return 2 * self.nodes_max

    @property
    def page_table_max(self):  # page-table entries of one CTA kept in smem
        return self.chunks_per_cta * self.chunk_max * self.pages_per_step

    @property
    def rows_per_rank(self):   # query rows each CTA of a cluster merges and writes
        return max(1, self.query_rows // self.cluster_size)

    @property
    def mma_stages(self):      # 16-bit K / V stages the wgmmas read: the ring's (bf16), one step buffer (fp8)
        return 1 if self.fp8 else self.stages

    @property
    def steps_ahead(self):     # ring steps in flight while a step computes: a bf16 stage is free once
        # its wgmmas are done, an FP8 one once it is converted (before them)
        return self.stages if self.fp8 else self.stages - 1

    @property
    def refill_under_qk(self):  # warp 0 issues a step's refill while its S = Q K^T runs (wide, and fp8,
        # which keeps one more step in flight); bf16 deep issues it before, as early as it can
        # (each measured faster so: bench/RESULTS.md, thirty-ninth session)
        return self.wide or self.fp8

    @property
    def box_columns(self):     # columns of a page one TMA box loads: its K or V half, or with page_box all of it
        return 2 * HEAD_DIM if self.page_box else HEAD_DIM

    @property
    def staging_bytes(self):   # the FP8 staging ring: stages x (K | V) x keys_per_step rows of 64 bytes
        return self.stages * 2 * self.keys_per_step * HEAD_DIM if self.fp8 else 0

    @property
    def smem_bytes(self):      # what the kernel allocates (attn2.py, kernel), alignment included
        ring = self.mma_stages * self.keys_per_step * HEAD_DIM * 2
        return (1024 + 2 * ring + M_TILE * HEAD_DIM * 2 + self.staging_bytes + _round_up(4 * self.page_table_max, 16)
                + 16 + 8 * self.query_rows)

    @property
    def smem_pad(self):        # bytes reserved past smem_bytes so at most ctas_per_sm CTAs fit an SM
        if not self.ctas_per_sm:
            return 0
        return _round_up(max(0, OCCUPANCY_SMEM_BYTES[self.ctas_per_sm] - self.smem_bytes), 16)

    @functools.cached_property
    def compile_key(self):     # max_seq_len is a run-time argument of the kernel
        return dataclasses.replace(self, max_seq_len=0)

    @staticmethod
    def create(q_len: int, window: int, max_seq_len: int, layout: str = "deep",
               stages: int | None = None, min_blocks: int | None = None,
               pdl: bool = True, node_min_steps: int = NODE_MIN_STEPS,
               chunks_per_sub: int | None = None, pages_per_step: int = 4,
               two_node_steps: int = TWO_NODE_STEPS, ctas_per_sm: int = 0,
               early_ring: bool = True, fp8: bool = False, page_box: bool | None = None,
               refill_warp: int | None = None) -> "Attn2Config":
        # 2-stage ring of 4-page steps; deep: __launch_bounds__ 4 CTAs per SM (5 without the second
        # accumulator). A wide ring of 4 stages costs CTAs an SM (3 instead of 5), deep compiled
        # for 5 CTAs an SM spills, and pages_per_step 8 (128 keys a step, a node per 16 steps: the same tree
        # in keys; a dev knob) was slower: bench/RESULTS.md. early_ring (the prologue's old rows
        # before the PDL wait) is on by default (RESULTS.md); none of these changes the bits.
        # fp8: the same variants and tree over an e4m3 cache (its ring: KVRing in attn2.py), with
        # FP8_DECODE_KNOBS in decode; None: those defaults
        assert layout in LAYOUTS, layout
        if window > 0:
            vis_pages = (window + q_len - 2) // PAGE_SIZE + 2
        else:
            vis_pages = (max_seq_len + PAGE_SIZE - 1) // PAGE_SIZE
        steps = (vis_pages + pages_per_step - 1) // pages_per_step
        per_sub = chunks_per_sub or sub_chunks(window)
        if per_sub == 1 and layout == "wide":
            layout = "deep"       # with one chunk per sub the wide layout is the deep one
        # beyond 2048 steps the chunk count is fixed, so the chunk length only grows with the steps
        defaults = default_knobs(q_len, fp8)
        if page_box is None:
            page_box = defaults["page_box"]
        if refill_warp is None:
            refill_warp = defaults["refill_warp"]
        plans = [split_plan(n, per_sub, node_min_steps, two_node_steps)
                 for n in list(range(1, min(steps, 2048) + 1)) + [steps]]
        chunk_max = max(p[0] for p in plans)
        nodes_max = max(p[3] for p in plans)
        explicit_stages = stages
        if stages is None:
            stages = 2   # a capped variant may take more (CAPPED_RING_STAGES, below)
        if min_blocks is None:
            # deep: 4 CTAs per SM with the second accumulator (126 registers), 5 without (91: one
            # chunk per sub, a dev override now); wide: 5 (96 registers: unbounded, the loads
            # before the PDL wait took it to 104, 4 CTAs per SM, slower: RESULTS.md)
            min_blocks = (5 if per_sub == 1 else 4) if layout == "deep" else 5
            if ctas_per_sm and q_len in CAPPED_REGISTER_Q_LENS:
                min_blocks = ctas_per_sm   # the cap's register budget (CAPPED_REGISTER_Q_LENS)
        cfg = Attn2Config(q_len, window, max_seq_len, layout, nodes_max, chunk_max, stages, pages_per_step,
                          min_blocks, pdl, node_min_steps, chunks_per_sub or 0, two_node_steps, ctas_per_sm,
                          early_ring, fp8, page_box, refill_warp)
        if explicit_stages is None and ctas_per_sm in CAPPED_RING_STAGES:
            deeper = dataclasses.replace(cfg, stages=CAPPED_RING_STAGES[ctas_per_sm])
            # (where a long deployment's page-table slice leaves no room, 2 stages stay)
            if deeper.smem_bytes <= OCCUPANCY_SMEM_BYTES[ctas_per_sm]:
                cfg = deeper
        # the merge buffer (query rows x 64 fp32) reuses the K and V rings (fp8: the f16 step buffer)
        assert 2 * cfg.mma_stages * cfg.keys_per_step * HEAD_DIM * 2 >= M_TILE * HEAD_DIM * 4, cfg
        assert ctas_per_sm in OCCUPANCY_SMEM_BYTES or ctas_per_sm == 0, cfg
        assert fp8 or not page_box, cfg
        assert -1 <= refill_warp < THREADS // 32, cfg
        return cfg


def workspace_layout(cfg: Attn2Config, num_requests: int, kv_heads: int) -> tuple[int, int, int]:
    """(byte offset of the partials' (m, l), counters, total bytes) of the workspace: fp32 partials
    O [R*Hkv*slots, query_rows, 64], fp32 (m, l) [R*Hkv*slots, query_rows, 2]; the uint32 arrival
    counters, one per (request, KV head, cluster rank < SUB_CHUNKS), count back from the end of
    the buffer."""
    nslot = num_requests * kv_heads * cfg.slots
    off = 4 * nslot * cfg.query_rows * HEAD_DIM
    n_cnt = num_requests * kv_heads * SUB_CHUNKS
    return off, n_cnt, (off + 4 * nslot * cfg.query_rows * 2 + 4 * n_cnt + 15) // 16 * 16



def choose_layout(num_requests: int, kv_heads: int, window: int = 0) -> str:
    """The layout a launch uses, a host decision on shapes and the deployment only (the bits do
    not depend on it): wide for few (request, KV head) pairs, where a CTA per chunk fills the GPU;
    deep otherwise. With a window, wide up to 32 pairs. (A third layout, one CTA per node for
    window deployments, was no faster than deep.) The layouts compute one tree, so the choice
    never changes the bits. Measured: bench/RESULTS.md."""
    limit = WIDE_MAX_PAIRS_WINDOW if window > 0 else WIDE_MAX_PAIRS
    return "wide" if num_requests * kv_heads <= limit else "deep"


def deployment_layouts(window: int) -> tuple[str, ...]:
    """Every layout a deployment may launch (what prepare compiles)."""
    return ("deep", "wide")


def _config(q_len: int, window: int, max_seq_len: int, layout: str = "deep", kv_heads: int = 2,
            **over) -> "Attn2Config":
    tree = tree_knobs(kv_heads, window)
    if set(over) <= {"ctas_per_sm", "fp8"}:
        return _default_config(q_len, window, max_seq_len, layout, over.get("ctas_per_sm", 0),
                               bool(over.get("fp8", False)), tuple(tree.items()))
    return Attn2Config.create(q_len, window, max_seq_len, layout, **{**tree, **over})


@functools.lru_cache(maxsize=None)
def _default_config(q_len: int, window: int, max_seq_len: int, layout: str, ctas_per_sm: int = 0,
                    fp8: bool = False, tree: tuple = ()) -> "Attn2Config":
    """A deployment's variant (cached: launch and workspace_bytes ask for it on every call); tree:
    tree_knobs' items, as a key the cache can hash."""
    return Attn2Config.create(q_len, window, max_seq_len, layout, ctas_per_sm=ctas_per_sm, fp8=fp8, **dict(tree))


def can_implement(device, kv_heads: int, q_len: int, window: int, max_seq_len: int,
                  fp8: bool = False) -> tuple[bool, str]:
    """Whether a deployment's attn2 runs on the kernel on `device`, and why not."""
    ok, why = runtime.device_support(device)
    if not ok:
        return ok, why
    if q_len not in SUPPORTED_Q_LENS:
        return False, f"q_len must be one of {SUPPORTED_Q_LENS}, got {q_len}"
    if kv_heads < 1 or window < 0 or max_seq_len < q_len:
        return False, f"bad deployment kv_heads={kv_heads} window={window} max_seq_len={max_seq_len}"
    # a deep CTA stages its page-table slice in smem: 4 KB at 2^18 tokens, 32 KB at 2^21 (with
    # NODES_MAX 8 the chunks grow with L); above 2^19 that costs the deep layout a CTA per SM
    if max_seq_len > MAX_SEQ_LEN:
        return False, ("max_seq_len above 2^21 tokens: a CTA stages its page-table slice in shared "
                       "memory (32 KB at 2^21)")
    return True, "ok"


def workspace_bytes(num_requests: int, kv_heads: int, q_len: int, window: int, max_seq_len: int) -> int:
    """Bytes for calls of up to num_requests requests (every layout uses the same slots; the
    counters sit at the end, so any smaller batch finds its counters where they were; an FP8
    cache's variants have the same tree, slots and counters). Sized by the default tree at every
    Hkv: the coarse tree (tree_knobs) has no more nodes at any L, so no more slots, and the bytes
    stay linear in the pairs, as the C++ ops' tables need."""
    return workspace_layout(_config(q_len, window, max_seq_len), num_requests, kv_heads)[2]


def launch_config(num_requests: int, kv_heads: int, q_len: int, window: int, max_seq_len: int,
                  override: dict | None = None, sm_count: int = 0, fp8: bool = False) -> "Attn2Config":
    """The variant a launch of this shape runs on a GPU of sm_count SMs (0: no occupancy cap), over
    a float8_e4m3fn cache with fp8; override (dev tools) forces a layout, a cap or a tuning knob."""
    over = dict(override or {})
    over.setdefault("fp8", bool(fp8))
    layout = over.pop("layout", choose_layout(num_requests, kv_heads, window))
    cfg = _config(q_len, window, max_seq_len, layout, kv_heads, **over)
    if "ctas_per_sm" in over:
        return cfg
    cap = occupancy_cap(cfg.ctas_per_pair * num_requests * kv_heads, cfg.cluster_size, sm_count,
                        OCCUPANCY_MAX_CAP[cfg.layout])
    return _config(q_len, window, max_seq_len, layout, kv_heads, **over, ctas_per_sm=cap) if cap else cfg


def deployment_variants(kv_heads: int, q_len: int, window: int, max_seq_len: int,
                        fp8: bool = False) -> list["Attn2Config"]:
    """Every variant a deployment may launch, whatever its batch (what prepare compiles): each
    layout under each occupancy cap, over a float8_e4m3fn cache with fp8; kv_heads is a run-time
    dimension of the kernel, and picks the tree (tree_knobs)."""
    return [_config(q_len, window, max_seq_len, layout, kv_heads, ctas_per_sm=cap, fp8=fp8)
            for layout in deployment_layouts(window) for cap in occupancy_caps(layout)]


def ci_variants(max_seq_lens=(2048, 32768, 262144), fp8_max_seq_lens=(2048, 262144)) -> list["Attn2Config"]:
    """The variants CI compiles on the CPU: both q_lens, with and without a window, short to long
    deployments, every layout, for a bf16 cache; and the same for an FP8 cache at a short and a
    long deployment (its ring differs from bf16's only in the KV loads, which max_seq_len does not
    change)."""
    bf16 = [cfg for q_len in SUPPORTED_Q_LENS for window in (0, 2048) for msl in max_seq_lens
            for cfg in deployment_variants(2, q_len, window, msl)]
    fp8 = [cfg for q_len in SUPPORTED_Q_LENS for window in (0, 2048) for msl in fp8_max_seq_lens
           for cfg in deployment_variants(2, q_len, window, msl, fp8=True)]
    # the coarse tree (tree_knobs) changes only the tree's constants: one deployment a dtype
    coarse = [cfg for q_len in SUPPORTED_Q_LENS for fp8 in (False, True)
              for cfg in deployment_variants(COARSE_TREE_KV_HEADS, q_len, 0, 32768, fp8=fp8)]
    return bf16 + fp8 + coarse


def flipped_knobs(q_len: int, fp8: bool) -> dict:
    """The development knobs set the other way from a variant's default (default_knobs):
    page_box (FP8 only) and refill_warp, each between its two settings; what dev_variants compiles
    and the GPU test of the knobs' bits runs against the default."""
    default = default_knobs(q_len, fp8)
    knobs = {"refill_warp": 0 if default["refill_warp"] < 0 else -1}
    if fp8:
        knobs["page_box"] = not default["page_box"]
    return knobs


def dev_variants() -> list["Attn2Config"]:
    """Development knobs no deployment compiles, which CI compiles too (flipped_knobs): an FP8
    cache's staging ring read the other way (Attn2Config.page_box), every layout at both q_lens;
    the refills issued the other way (Attn2Config.refill_warp), each q_len, layout and dtype once
    (four variants: CI compiles these in one process)."""
    return ([_config(q_len, 0, 32768, layout, fp8=True, page_box=flipped_knobs(q_len, True)["page_box"])
             for q_len in SUPPORTED_Q_LENS for layout in LAYOUTS]
            + [_config(q_len, 0, 32768, layout, fp8=fp8, refill_warp=flipped_knobs(q_len, fp8)["refill_warp"])
               for q_len, layout, fp8 in ((1, "deep", True), (8, "wide", True), (8, "deep", False), (1, "wide", False))])


def triggers_dependents(layout: str, pairs: int, n_chunks: int, wave: int) -> bool:
    """Whether a launch of `pairs` (request, KV head) pairs whose requests have n_chunks chunks
    triggers its dependent launch after the main loop, as attn2.py's trigger_dependents decides
    it on its run-time integers (wave: wave_ctas). See QUIET_WIDE_PAIRS."""
    return layout != "wide" or pairs > QUIET_WIDE_PAIRS or pairs * n_chunks <= wave


def wave_ctas(device) -> int:
    """Working wide CTAs a launch may have and still trigger its dependent launch early: one per
    SM (2 per SM was inconclusive: bench/RESULTS.md)."""
    return runtime.sm_count(device)
