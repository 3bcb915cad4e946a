"""CPU: the attn2 kernel's reduction tree (split_plan, mirrored in the kernel) and the deployment
maxima that size its grid, workspace and shared memory. No cutlass needed: plain Python."""
import pytest

from muse_ops.config import PAGE_SIZE
from muse_ops.cutedsl import attn2_plan as A   # the host side: no cutlass import


def chunk_bounds(n_steps, n_chunks):
    return [(j * n_steps // n_chunks, (j + 1) * n_steps // n_chunks) for j in range(n_chunks)]


@pytest.mark.parametrize("per_sub", [A.SUB_CHUNKS, A.WINDOW_SUB_CHUNKS, 1])
def test_tree_covers_every_step_once_and_balances_subs(per_sub):
    for n_steps in range(1, 4097):
        c_max, n_chunks, n_subs, n_nodes = A.split_plan(n_steps, per_sub)
        b = chunk_bounds(n_steps, n_chunks)
        assert b[0][0] == 0 and b[-1][1] == n_steps
        assert all(lo < hi for lo, hi in b), n_steps                       # no empty chunk
        assert all(b[j][1] == b[j + 1][0] for j in range(n_chunks - 1))    # contiguous
        assert max(hi - lo for lo, hi in b) == c_max
        assert n_subs == -(-n_chunks // per_sub) and n_nodes == -(-n_subs // 2) <= A.NODES_MAX
        if n_chunks % per_sub == 0:     # full subs: a deep CTA's work differs by at most a step
            sub_steps = [b[s * per_sub + per_sub - 1][1] - b[s * per_sub][0] for s in range(n_subs)]
            assert max(sub_steps) - min(sub_steps) <= 1, n_steps


@pytest.mark.parametrize("q_len,window,max_seq_len",
                         [(8, 0, 2048), (8, 0, 1 << 17), (1, 0, 1 << 18), (8, 2048, 1 << 17), (1, 64, 4096)])
def test_deployment_maxima_bound_every_length(q_len, window, max_seq_len):
    cfgs = [A.Attn2Config.create(q_len, window, max_seq_len, layout) for layout in A.deployment_layouts(window)]
    assert [c.layout for c in cfgs] == list(A.deployment_layouts(window))   # none coerced
    assert A.Attn2Config.create(q_len, window, max_seq_len, "wide").wide
    assert not A.Attn2Config.create(q_len, window, max_seq_len, "wide", chunks_per_sub=1).wide   # wide = deep there
    for L in range(q_len, max_seq_len + 1, 61):
        first = max(0, L - q_len - window + 1) // 16 if window else 0
        for cfg in cfgs:
            n_steps = ((L - 1) // 16 - first + cfg.pages_per_step) // cfg.pages_per_step
            c_max, _, n_subs, n_nodes = A.split_plan(n_steps, cfg.sub_chunks)
            assert c_max <= cfg.chunk_max and n_nodes <= cfg.nodes_max and n_subs <= cfg.slots
            assert (n_subs if cfg.wide else n_nodes) <= cfg.max_clusters    # a cluster per sub / node
            # a CTA's pages fit its smem slice
            assert cfg.chunks_per_cta * c_max * cfg.pages_per_step <= cfg.page_table_max
    # one workspace serves every layout (the same slots; the counters at the end)
    assert len({A.workspace_layout(c, 7, 2) for c in cfgs}) == 1


def test_node_count_by_length():
    """Nodes by L (4 pages = 64 keys a step): one below 64 steps, two from 64, then a node per 128
    steps up to NODES_MAX (a node per 64 steps until the forty-eighth session; (32, 64), a node per
    32 steps, the nineteenth run's A/B baseline)."""
    node_count = A.node_count
    steps = {L: L // 64 for L in (1024, 2048, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 65536, 131072)}
    assert A.NODE_MIN_STEPS == 128
    assert {L: node_count(n) for L, n in steps.items()} == {
        1024: 1, 2048: 1, 4096: 2, 6144: 2, 8192: 2, 12288: 2, 16384: 2, 24576: 3, 32768: 4, 65536: 8, 131072: 8}
    assert {L: node_count(n, 64) for L, n in steps.items() if L >= 12288} == {
        12288: 3, 16384: 4, 24576: 6, 32768: 8, 65536: 8, 131072: 8}
    for nms in (32, 64, 128):
        assert all(node_count(n, nms, 64) == max(1, min(A.NODES_MAX, max(n // nms, 2 * (n >= 64))))
                   for n in range(1, 4097))
    assert all(node_count(a) <= node_count(b) for a, b in zip(range(1, 4096), range(2, 4097)))   # monotonic


def test_one_tree_for_both_dtypes_and_fp8_decode_knobs():
    """Both cache dtypes take the same tree (NODE_MIN_STEPS; an FP8 cache had a tree of its own in
    the forty-seventh session, bf16's since), and FP8 decode FP8_DECODE_KNOBS; bf16 and FP8 verify
    keep the knobs off; an explicit argument wins; the workspace a deployment sizes
    (workspace_bytes) holds an FP8 variant's partials and counters."""
    assert A.FP8_DECODE_KNOBS == {"page_box": True, "refill_warp": -1}
    for q_len in (1, 8):
        for layout in A.LAYOUTS:
            bf16 = A.Attn2Config.create(q_len, 0, 1 << 17, layout)
            fp8 = A.Attn2Config.create(q_len, 0, 1 << 17, layout, fp8=True)
            assert bf16.node_min_steps == fp8.node_min_steps == A.NODE_MIN_STEPS
            assert (bf16.nodes_max, bf16.chunk_max, bf16.slots) == (fp8.nodes_max, fp8.chunk_max, fp8.slots)
            assert (bf16.page_box, bf16.refill_warp) == (False, 0)
            assert (fp8.page_box, fp8.refill_warp) == ((True, -1) if q_len == 1 else (False, 0))
            assert A.Attn2Config.create(q_len, 0, 1 << 17, layout, fp8=True, node_min_steps=64,
                                        page_box=False, refill_warp=0).node_min_steps == 64
            assert A.workspace_layout(fp8, 9, 2)[2] == A.workspace_bytes(9, 2, q_len, 0, 1 << 17)
            knobs = A.flipped_knobs(q_len, True)
            assert knobs["page_box"] != fp8.page_box and (knobs["refill_warp"] < 0) != (fp8.refill_warp < 0)
        assert "page_box" not in A.flipped_knobs(q_len, False)


def test_coarse_tree_from_many_kv_heads():
    """From COARSE_TREE_KV_HEADS KV heads a deployment without a window takes COARSE_TREE (one node
    below 128 steps), in every variant it compiles and every launch it picks; fewer KV heads and
    windows keep the default tree. The coarse tree has no more nodes at any L, so workspace_bytes
    (sized by the default tree at every Hkv) holds its partials."""
    assert A.tree_knobs(A.COARSE_TREE_KV_HEADS, 0) == A.COARSE_TREE
    assert A.tree_knobs(A.COARSE_TREE_KV_HEADS - 1, 0) == {} and A.tree_knobs(A.COARSE_TREE_KV_HEADS, 2048) == {}
    coarse = (A.COARSE_TREE.get("node_min_steps", A.NODE_MIN_STEPS),
              A.COARSE_TREE.get("two_node_steps", A.TWO_NODE_STEPS))
    for q_len in (1, 8):
        for fp8 in (False, True):
            for hkv, window in ((16, 0), (16, 2048), (8, 0), (2, 0)):
                want = coarse if hkv >= A.COARSE_TREE_KV_HEADS and window == 0 else \
                    (A.NODE_MIN_STEPS, A.TWO_NODE_STEPS)
                for cfg in A.deployment_variants(hkv, q_len, window, 1 << 17, fp8=fp8):
                    assert (cfg.node_min_steps, cfg.two_node_steps) == want, (hkv, window, cfg)
                for r in (1, 2, 8, 32, 256):
                    cfg = A.launch_config(r, hkv, q_len, window, 1 << 17, sm_count=132, fp8=fp8)
                    assert (cfg.node_min_steps, cfg.two_node_steps) == want, (hkv, window, r)
                    assert A.workspace_layout(cfg, r, hkv)[2] <= A.workspace_bytes(r, hkv, q_len, window, 1 << 17)
    node_count = A.node_count
    assert all(node_count(n, *coarse) <= node_count(n) for n in range(1, 1 << 15))
    # L = 4096-8191 (64-127 steps): one node (the default tree: two); from 128 steps the default's
    assert [node_count(n, *coarse) for n in (63, 64, 127)] == [1, 1, 1]
    assert all(node_count(n, *coarse) == node_count(n) for n in list(range(1, 64)) + list(range(128, 1 << 15)))


def test_occupancy_cap_spreads_grids_behind_an_early_trigger():
    """Every launch follows a qkv_front that triggers early, so it takes the smallest cap of CTAs
    an SM (below what its registers allow) under which its grid fits one wave; the cap's shared
    memory reservation admits exactly that many CTAs an SM, in every deployment's variants, and
    under caps 1 and 2 holds a 3-stage ring (CAPPED_RING_STAGES)."""
    cap, sms = A.occupancy_cap, 132
    # clusters of 4 and 8: 7/8 of the SMs (115 of 132)
    assert cap(64, 8, sms, 4) == 1 and cap(115, 4, sms, 4) == 1 and cap(116, 8, sms, 4) == 2
    assert cap(230, 8, sms, 4) == 2 and cap(231, 8, sms, 4) == 3 and cap(345, 8, sms, 4) == 3
    assert cap(384, 8, sms, 4) == 4 and cap(460, 8, sms, 4) == 4 and cap(461, 8, sms, 4) == 0
    assert cap(384, 8, sms, 3) == 0                                    # past the layout's largest cap
    # clusters of 2: every SM
    assert cap(128, 2, sms, 3) == 1 and cap(264, 2, sms, 3) == 2 and cap(396, 2, sms, 3) == 3
    assert cap(397, 2, sms, 3) == 0 and cap(16, 4, 0, 4) == 0          # no GPU known
    # the bench's launches at Hkv 2 (requests, q_len, window, max_seq_len) -> cap
    launches = {(1, 8, 0, 8192): 1, (2, 8, 0, 8192): 2, (1, 8, 0, 16384): 1, (1, 8, 2048, 8192): 1,
                (2, 8, 2048, 8192): 1, (16, 1, 0, 8192): 1, (4, 1, 0, 8192): 3, (8, 8, 0, 8192): 0, (6, 8, 0, 8192): 4,
                (16, 8, 0, 8192): 1, (32, 8, 0, 8192): 2, (48, 8, 0, 8192): 3, (64, 8, 0, 8192): 0,
                (8, 8, 2048, 8192): 2, (64, 8, 2048, 8192): 2, (128, 8, 0, 8192): 0}
    for (r, q_len, window, msl), want in launches.items():
        assert A.launch_config(r, 2, q_len, window, msl, sm_count=sms).ctas_per_sm == want, (r, q_len, window)
        assert A.launch_config(r, 2, q_len, window, msl).ctas_per_sm == 0
    reserve = 1024   # per resident CTA
    for q_len in A.SUPPORTED_Q_LENS:
        for window in (0, 2048):
            for msl in (512, 8192, 1 << 17, A.MAX_SEQ_LEN):
                for cfg in A.deployment_variants(2, q_len, window, msl):
                    total = cfg.smem_bytes + cfg.smem_pad + reserve
                    assert total <= 227 * 1024 + reserve
                    if cfg.ctas_per_sm:
                        assert (cfg.ctas_per_sm + 1) * total > A.SMEM_PER_SM >= cfg.ctas_per_sm * total, cfg
                    # a third ring stage where a cap of 1 or 2 reserves the room for it (every
                    # deployment up to MAX_SEQ_LEN), two elsewhere
                    assert cfg.stages == (3 if cfg.ctas_per_sm in (1, 2) else 2), cfg


def test_trigger_rule_on_the_measured_grids():
    """Which launches trigger their dependent launch after the main loop (triggers_dependents, as
    the kernel decides it), on the grids the twenty-eighth run measured in a layer step (Hkv 2,
    L = 8192, 132 SMs): B = 1 and 2 (one working CTA an SM) and B >= 5 trigger; B = 3 and 4 (6
    and 8 pairs, 2-3 CTAs an SM), which measured slower with it, do not; nor does Hkv 4 at B = 2."""
    def triggers(requests, kv_heads, length=8192):
        cfg = A.launch_config(requests, kv_heads, 8, 0, length, sm_count=132)
        steps = -(-length // PAGE_SIZE // cfg.pages_per_step)
        return A.triggers_dependents(cfg.layout, requests * kv_heads, A.split_plan(steps)[1], 132)
    assert [b for b in range(1, 33) if not triggers(b, 2)] == [3, 4]
    assert not triggers(4, 2, 16384) and not triggers(2, 4) and triggers(1, 4) and triggers(1, 16)
