"""GPU tests of the CuTe DSL qkv_front kernel (muse_ops/cutedsl/qkv_front.py) against the float64
evaluation of muse_ops.testing: every M range and variant, Hkv 1 / 2 / 4 / 16, RoPE on and off,
int32 and int64 indices, padding slots; y and the cache poisoned first, only the target rows
written; bit-identical across M (batch invariance) and run to run; the device error flag; CUDA
graph replay with new inputs. Skips cleanly without CUDA / cutlass."""
from __future__ import annotations

import pytest
import torch

from muse_ops.config import HIDDEN, PAGE_SIZE, proj_cols
from muse_ops.cutedsl import dev, launch as L
from muse_ops.errors import BAD_POSITION, BAD_SLOT
from muse_ops.reference import rope_cos_sin
from muse_ops.testing import assert_close, inserted_rows_f64, qkv_front_f64

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
POSITIONS = 40000
M_VALUES = [1, 2, 7, 8, 9, 16, 17, 64, 65, 100, 136, 200, 256, 300, 512]


def _kernel():
    from muse_ops.cutedsl import qkv_front_plan
    ok, why = qkv_front_plan.can_implement(torch.device(DEV), 2)
    if not ok:
        pytest.skip(why)
    # the kernel's own tests compile variants with launch overrides, so they need the CuTe DSL; an
    # ahead-of-time build without it is tested by test_gpu_shims.py and test_gpu_aot.py
    pytest.importorskip("cutlass", reason="the CuTe DSL is not importable (an ahead-of-time build)")
    from muse_ops.cutedsl import qkv_front as Q
    return Q


@pytest.fixture(scope="module")
def cos_sin():
    return rope_cos_sin(POSITIONS, device=DEV)


def make_inputs(m, kv_heads, *, seed, num_pages=None, pad=0, index_dtype=torch.int64):
    """x ~ N(0, 1), W ~ N(0, 1/8192) (realistic magnitudes), distinct random slots over a NaN
    cache, `pad` of them padding (-1)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = proj_cols(kv_heads)
    x = torch.randn(m, HIDDEN, generator=g, device=DEV).to(torch.bfloat16)
    w = (torch.randn(n, HIDDEN, generator=g, device=DEV) * HIDDEN ** -0.5).to(torch.bfloat16)
    num_pages = num_pages or max(4, -(-2 * m // PAGE_SIZE))
    slots = torch.randperm(num_pages * PAGE_SIZE, generator=g, device=DEV)[:m]
    slots[torch.randperm(m, generator=g, device=DEV)[:pad]] = -1
    positions = torch.randint(0, POSITIONS, (m,), generator=g, device=DEV)
    cache = torch.full((num_pages, kv_heads, PAGE_SIZE, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    return x, w, positions.to(index_dtype), slots.to(index_dtype), cache


def run(Q, x, w, positions, slots, cos_sin, cache, err=None, override=None):
    """One launch into a NaN-poisoned y."""
    y = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=torch.bfloat16, device=DEV)
    err = torch.zeros(1, dtype=torch.int32, device=DEV) if err is None else err
    if override:
        dev.launch_qkv_front(x, w, positions, slots, cos_sin, cache, y, err, override=override)
    else:
        L.launch_qkv_front(x, w, positions, slots, cos_sin, cache, y, err)
    return y, err


def check_against_float64(x, w, positions, slots, cos_sin, cache_before, cache, y, kv_heads):
    y64 = qkv_front_f64(x, w, positions, cos_sin, kv_heads)
    assert_close(y, y64, "y")
    rows64 = inserted_rows_f64(y64, kv_heads)
    keep = slots.long() >= 0
    flat = cache.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)            # [slots, Hkv, 128]
    before = cache_before.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)
    target = slots.long()[keep]
    if keep.any():
        assert_close(flat[target], rows64[keep], "inserted rows")
        # the cache holds exactly y's k' and v bits
        assert torch.equal(flat[target].view(torch.int16), inserted_rows_f64(y.double(), kv_heads)[keep]
                           .to(torch.bfloat16).view(torch.int16))
    touched = torch.zeros(flat.shape[0], dtype=torch.bool, device=DEV)
    touched[target] = True
    assert torch.equal(flat[~touched].view(torch.int16), before[~touched].view(torch.int16)), \
        "rows outside the target slots were written"


CASES = ([(m, 2, m % 2 == 1, torch.int64 if m % 3 else torch.int32) for m in M_VALUES]
         + [(m, kv_heads, rope, torch.int64) for kv_heads in (1, 4, 16) for m, rope in ((1, True), (9, False),
                                                                                        (64, True), (256, False))]
         + [(17, 1, True, torch.int32), (512, 4, True, torch.int32), (100, 16, True, torch.int64)])


@pytest.mark.parametrize("m,kv_heads,rope,index_dtype", CASES)
def test_matches_float64(m, kv_heads, rope, index_dtype, cos_sin):
    Q = _kernel()
    x, w, pos, slots, cache = make_inputs(m, kv_heads, seed=m * 31 + kv_heads, pad=m // 5, index_dtype=index_dtype)
    cs = cos_sin if rope else None
    before = cache.clone()
    y, err = run(Q, x, w, pos, slots, cs, cache)
    check_against_float64(x, w, pos, slots, cs, before, cache, y, kv_heads)
    assert int(err.item()) == 0


@pytest.mark.parametrize("kv_heads,rope", [(2, True), (1, False), (4, True), (8, True)])   # K splits 3, 3, 1, 2
def test_bit_identical_across_m_and_runs(kv_heads, rope, cos_sin):
    """A token's y row and cache row are the same bits computed alone, among M = 2 .. 512 tokens
    (every token tile and heads-per-CTA variant), at any place in its tile, and run to run."""
    Q = _kernel()
    x, w, pos, slots, cache = make_inputs(512, kv_heads, seed=7 + kv_heads)
    cs = cos_sin if rope else None
    y_all, _ = run(Q, x, w, pos, slots, cs, cache)
    cache_all = cache.clone()
    y_again, _ = run(Q, x, w, pos, slots, cs, cache)
    assert torch.equal(y_all.view(torch.int16), y_again.view(torch.int16)), "not deterministic run to run"
    assert torch.equal(cache.view(torch.int16), cache_all.view(torch.int16))
    for m in M_VALUES[:-1]:
        for start in sorted({0, 512 - m, (97 * m) % (512 - m + 1)}):
            part = slice(start, start + m)
            cache_m = torch.full_like(cache, float("nan"))
            y_m, _ = run(Q, x[part].contiguous(), w, pos[part].contiguous(), slots[part].contiguous(), cs, cache_m)
            assert torch.equal(y_m.view(torch.int16), y_all[part].view(torch.int16)), (m, start)
            s = slots[part].long()
            flat_m = cache_m.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)[s]
            flat_all = cache_all.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)[s]
            assert torch.equal(flat_m.view(torch.int16), flat_all.view(torch.int16)), (m, start)
    # every variant computes the same bits (the host picks one by M; here each one is forced)
    from muse_ops.cutedsl.qkv_front_plan import TILE_SHAPES
    for tile, hpc in TILE_SHAPES:
        y_t, _ = run(Q, x[:200].contiguous(), w, pos[:200].contiguous(), slots[:200].contiguous(), cs,
                     torch.full_like(cache, float("nan")), override={"tile": (tile, hpc)})
        assert torch.equal(y_t.view(torch.int16), y_all[:200].view(torch.int16)), (tile, hpc)


SERVING_M = [1, 8, 16, 64, 128, 129, 256, 512, 1000, 2048]


def _cache_rows(cache, kv_heads):
    return cache.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)


@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8, 16])
def test_serving_sizes_bit_identical_and_float64(kv_heads, cos_sin):
    """Serving batch sizes (issue 49): 2048 tokens against the float64 evaluation, then every M of
    SERVING_M taken from them (a different place at each M) gives each token the same y and cache
    bits into a NaN cache and y, writing only its own slots' rows."""
    Q = _kernel()
    big = SERVING_M[-1]
    x, w, pos, slots, cache = make_inputs(big, kv_heads, seed=4900 + kv_heads, pad=big // 9)
    before = cache.clone()
    y_all, err = run(Q, x, w, pos, slots, cos_sin, cache)
    check_against_float64(x, w, pos, slots, cos_sin, before, cache, y_all, kv_heads)
    assert int(err.item()) == 0
    rows_all = _cache_rows(cache, kv_heads)
    for m in SERVING_M[:-1]:
        start = (37 * m * kv_heads) % (big - m + 1)
        _assert_part_matches(Q, (x, w, pos, slots, cos_sin, cache), slice(start, start + m), None, y_all, rows_all,
                             kv_heads)


@pytest.mark.parametrize("kv_heads", [1, 2, 3, 8])
def test_x_multicast_keeps_the_bits(kv_heads, cos_sin):
    """x multicast (a launch tile at 128 x 2 where the heads exceed a wave, a development knob
    elsewhere) changes only how x is loaded: the same bits as the variant without it at a whole
    and a partial last tile, with a helper CTA past an odd count of two-head groups (Hkv 1 and 3),
    and at K splits 3, 2 and 2."""
    Q = _kernel()
    x, w, pos, slots, cache = make_inputs(600, kv_heads, seed=4950 + kv_heads)
    for tile, hpc, m in ((256, 2, 512), (256, 2, 600), (128, 1, 200), (128, 2, 256), (128, 2, 200)):
        over = {"tile": (tile, hpc)}
        caches = [torch.full_like(cache, float("nan")) for _ in range(2)]
        y0, _ = run(Q, x[:m].contiguous(), w, pos[:m].contiguous(), slots[:m].contiguous(), cos_sin, caches[0],
                    override=over)
        y1, err = run(Q, x[:m].contiguous(), w, pos[:m].contiguous(), slots[:m].contiguous(), cos_sin, caches[1],
                      override={**over, "x_multicast": True})
        assert torch.equal(y0.view(torch.int16), y1.view(torch.int16)), (tile, hpc, m)
        assert torch.equal(caches[0].view(torch.int16), caches[1].view(torch.int16)), (tile, hpc, m)
        assert int(err.item()) == 0


def _default_launch(Q, m, kv_heads, seed, cos_sin):
    """m tokens (50 of them padding) launched by the plan's variant, checked against the float64
    evaluation: (the inputs with cos_sin, y, the cache rows)."""
    x, w, pos, slots, cache = make_inputs(m, kv_heads, seed=seed, pad=50)
    before = cache.clone()
    y_all, err = run(Q, x, w, pos, slots, cos_sin, cache)
    check_against_float64(x, w, pos, slots, cos_sin, before, cache, y_all, kv_heads)
    assert int(err.item()) == 0
    return (x, w, pos, slots, cos_sin, cache), y_all, _cache_rows(cache, kv_heads)


def _assert_part_matches(Q, inputs, part, over, y_all, rows_all, kv_heads):
    """A launch of the tokens `part` (a slice) of `inputs` under override `over` (None: the plan's
    variant), into a NaN cache: the same y and cache-row bits as the default launch of them all
    (y_all, rows_all), no row outside its slots written, no error flag."""
    x, w, pos, slots, cos_sin, cache = inputs
    cache_m = torch.full_like(cache, float("nan"))
    y_m, err = run(Q, x[part].contiguous(), w, pos[part].contiguous(), slots[part].contiguous(), cos_sin, cache_m,
                   override=over)
    assert torch.equal(y_m.view(torch.int16), y_all[part].view(torch.int16)), (over, part)
    s = slots[part].long()
    s = s[s >= 0]
    rows_m = _cache_rows(cache_m, kv_heads)
    assert torch.equal(rows_m[s].view(torch.int16), rows_all[s].view(torch.int16)), (over, part)
    untouched = torch.ones(rows_m.shape[0], dtype=torch.bool, device=DEV)
    untouched[s] = False
    assert bool(rows_m[untouched].isnan().all()), f"{over}, {part}: rows outside its slots were written"
    assert int(err.item()) == 0


def _whole_k_tiles():
    """The plan's whole-K tiles and the largest and smallest of each head count."""
    from muse_ops.cutedsl.qkv_front_plan import WHOLE_K_TILES
    return sorted(set(WHOLE_K_TILES) | {(64, 2), (160, 2), (192, 1), (112, 3), (48, 3)})


@pytest.mark.parametrize("kv_heads", [1, 2, 3, 4, 8])   # K splits 3, 3, 2, 1, 2
def test_whole_k_tiles_keep_the_bits(kv_heads, cos_sin):
    """A whole-K CTA (QkvFrontConfig.whole_k) sums the split's stripes in rank order from two
    accumulators: the same y and cache bits as the split cluster, at a whole and a partial last
    tile of each tile shape, run to run; the float64 evaluation at the largest launch."""
    Q = _kernel()
    inputs, y_all, rows_all = _default_launch(Q, 700, kv_heads, 4970 + kv_heads, cos_sin)
    x, w, pos, slots, _, cache = inputs
    for tile, hpc in _whole_k_tiles():
        over = {"whole_k": True, "tile": (tile, hpc)}
        for m in (3 * tile, 3 * tile - 40, 700):
            _assert_part_matches(Q, inputs, slice(0, m), over, y_all, rows_all, kv_heads)
        y_again, _ = run(Q, x, w, pos, slots, cos_sin, torch.full_like(cache, float("nan")), override=over)
        assert torch.equal(y_again.view(torch.int16), y_all.view(torch.int16)), (tile, hpc, "run to run")


@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8, 16])   # K splits 3, 3, 1, 2, 2
def test_landing_barriers_keep_the_bits(kv_heads, cos_sin):
    """Landing barriers (QkvFrontConfig.landing_barriers: the peers' pushes as st.async completing
    on per-chunk barriers, each epilogue pass waiting for its own chunk) change only when an owner
    may read its landing zone: the same y and cache bits as the default launch, at every
    split-cluster tile shape (blocks of 2 and 8, one and two heads, the x multicast tile), at a
    whole and a partial last tile and at fewer tokens than the tile (chunks that receive only
    padding blocks), run to run; at Hkv 4 (a split of 1) through the plain stores and the cluster
    barrier; no row outside the launch's slots written."""
    Q = _kernel()
    inputs, y_all, rows_all = _default_launch(Q, 600, kv_heads, 5010 + kv_heads, cos_sin)
    x, w, pos, slots, _, cache = inputs
    for tile, hpc, kps, xm in ((8, 1, 4, False), (16, 1, 4, False), (64, 1, 1, False), (128, 1, 1, False),
                               (128, 2, 1, True), (256, 2, 1, False)):
        over = {"tile": (tile, hpc), "k_tiles_per_stage": kps, "x_multicast": xm, "landing_barriers": True}
        for m in sorted({2 * tile, 2 * tile - 5, max(1, tile - 40), 3}):
            _assert_part_matches(Q, inputs, slice(0, m), over, y_all, rows_all, kv_heads)
    over = {"tile": (256, 2), "landing_barriers": True}
    y_again, _ = run(Q, x, w, pos, slots, cos_sin, torch.full_like(cache, float("nan")), override=over)
    assert torch.equal(y_again.view(torch.int16), y_all.view(torch.int16)), "run to run"


@pytest.mark.parametrize("x_multicast", [False, True], ids=["w", "xw"])
@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8])   # K splits 3, 3, 1, 2
def test_weight_multicast_keeps_the_bits(kv_heads, x_multicast, cos_sin):
    """Weight multicast over a pair of token tiles (QkvFrontConfig.w_multicast) changes only how
    the weight is loaded: the same y and cache bits as the default variant at an even tile count,
    at an odd one with a partial last tile (a helper CTA past it loads its halves of the weight
    and stores nothing), and at a single partial tile; rows outside the launch's slots untouched.
    With x multicast too (clusters of two token tiles x two head groups), at Hkv 1 a helper past
    an odd count of two-head groups as well."""
    Q = _kernel()
    inputs, y_all, rows_all = _default_launch(Q, 700, kv_heads, 4990 + kv_heads, cos_sin)
    for tile, hpc in ((112, 3), (128, 2)) + (() if x_multicast else ((96, 3),)):
        over = {"whole_k": True, "tile": (tile, hpc), "w_multicast": True, "x_multicast": x_multicast}
        for m in (4 * tile, 3 * tile - 40, tile - 7, 700):
            _assert_part_matches(Q, inputs, slice(0, m), over, y_all, rows_all, kv_heads)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])   # K splits 3, 3, 1
def test_register_reallocation_keeps_the_bits(kv_heads, cos_sin):
    """A producer warpgroup that gives its registers to the consumers
    (QkvFrontConfig.register_reallocation: two-head whole-K tiles from REALLOCATE_FROM_TILE tokens
    take it, up to REALLOCATED_MAX_TILE) changes neither the sum nor the epilogue: 160 x 2 with
    and without it, and the reallocated tiles also with weight multicast, give the same y and cache
    bits as the default variant at whole and partial tiles; rows outside the launch's slots
    untouched."""
    from muse_ops.cutedsl.qkv_front_plan import REALLOCATE_FROM_TILE, REALLOCATED_MAX_TILE
    Q = _kernel()
    inputs, y_all, rows_all = _default_launch(Q, 700, kv_heads, 5010 + kv_heads, cos_sin)
    for tile, reallocate, w_multicast in ((REALLOCATE_FROM_TILE, False, False), (REALLOCATE_FROM_TILE, True, False),
                                          (192, True, True), (REALLOCATED_MAX_TILE, True, True)):
        over = {"whole_k": True, "tile": (tile, 2), "register_reallocation": reallocate, "w_multicast": w_multicast}
        for m in (3 * tile, 3 * tile - 40, tile - 7, 700):
            _assert_part_matches(Q, inputs, slice(0, m), over, y_all, rows_all, kv_heads)


def test_error_flags_and_skipped_rows(cos_sin):
    """A slot past the cache is skipped (BAD_SLOT), a position past cos_sin reads row 0
    (BAD_POSITION); everything else is written as usual."""
    Q = _kernel()
    m, kv_heads = 12, 2
    x, w, pos, slots, cache = make_inputs(m, kv_heads, seed=3, num_pages=8)
    slots[4] = cache.shape[0] * PAGE_SIZE + 5
    pos[7] = POSITIONS + 10
    before = cache.clone()
    y, err = run(Q, x, w, pos, slots, cos_sin, cache)
    assert int(err.item()) == BAD_SLOT | BAD_POSITION
    ok = torch.ones(m, dtype=torch.bool, device=DEV)
    ok[[4, 7]] = False
    pos_ref = pos.clone()
    pos_ref[7] = 0
    y64 = qkv_front_f64(x, w, pos_ref, cos_sin, kv_heads)
    assert_close(y, y64, "y")
    slots_ok = slots.clone()
    slots_ok[4] = -1
    check_against_float64(x, w, pos_ref, slots_ok, cos_sin, before, cache, y, kv_heads)


def test_cuda_graph_replays_new_inputs(cos_sin):
    _kernel()
    m, kv_heads = 24, 2
    x, w, pos, slots, cache = make_inputs(m, kv_heads, seed=5, num_pages=16)
    y = torch.empty(m, proj_cols(kv_heads), dtype=torch.bfloat16, device=DEV)
    err = torch.zeros(1, dtype=torch.int32, device=DEV)
    L.launch_qkv_front(x, w, pos, slots, cos_sin, cache, y, err)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        L.launch_qkv_front(x, w, pos, slots, cos_sin, cache, y, err)
    for seed in (11, 12):
        x2, w2, pos2, slots2, cache2 = make_inputs(m, kv_heads, seed=seed, num_pages=16, pad=3)
        x.copy_(x2), w.copy_(w2), pos.copy_(pos2), slots.copy_(slots2), cache.copy_(cache2)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_float64(x, w, pos, slots, cos_sin, cache2, cache, y, kv_heads)
    assert int(err.item()) == 0


def test_op_runs_the_kernel_by_default(cos_sin):
    """muse_ops.qkv_front picks the cutedsl backend on sm_90 and says so."""
    import muse_ops
    _kernel()
    x, w, pos, slots, cache = make_inputs(8, 2, seed=9)
    y = muse_ops.qkv_front(x, w, pos, slots, cos_sin, cache)
    assert muse_ops.last_backend("qkv_front") == "cutedsl"
    ref_cache = torch.full_like(cache, float("nan"))
    y_ref = muse_ops.qkv_front(x, w, pos, slots, cos_sin, ref_cache, backend="reference")
    assert_close(y, y_ref.double(), "cutedsl vs reference")


# ----------------------------------------------------------------------------- an FP8 cache
FP8_CASES = [(1, 2, True, "tensor"), (8, 2, False, "per_head"), (16, 1, True, "per_head"), (40, 4, True, "tensor"),
             (129, 2, True, "per_head"), (256, 8, False, "per_head"), (700, 2, True, "tensor"), (64, 16, True, "none")]


def _fp8_scales(kind, kv_heads):
    if kind == "none":
        return None, None
    if kind == "tensor":
        return torch.tensor([0.37], device=DEV), torch.tensor([2.5], device=DEV)
    g = torch.Generator(device="cpu").manual_seed(kv_heads)
    return ((0.2 + torch.rand(kv_heads, generator=g)).to(DEV), (0.5 + 2 * torch.rand(kv_heads, generator=g)).to(DEV))


def run_fp8(x, w, positions, slots, cos_sin, cache, k_scale, v_scale, override=None):
    y = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=torch.bfloat16, device=DEV)
    err = torch.zeros(1, dtype=torch.int32, device=DEV)
    dev.launch_qkv_front(x, w, positions, slots, cos_sin, cache, y, err, override=override, k_scale=k_scale,
                         v_scale=v_scale)
    return y, err


@pytest.mark.parametrize("m,kv_heads,rope,scales", FP8_CASES)
def test_fp8_insert_matches_torch_e4m3(m, kv_heads, rope, scales, cos_sin):
    """An FP8 cache: y against float64 as for bf16, the inserted bytes exactly torch's e4m3 of
    y's k' / k_scale and v / v_scale, every other byte untouched (NaN-poisoned)."""
    from muse_ops.testing import fp8_rows
    _kernel()
    x, w, pos, slots, _ = make_inputs(m, kv_heads, seed=m * 13 + kv_heads, pad=m // 5)
    num_pages = max(4, -(-2 * m // PAGE_SIZE))
    cache = torch.full((num_pages, kv_heads, PAGE_SIZE, 128), 0x7F, dtype=torch.uint8, device=DEV)
    before = cache.clone()
    k_scale, v_scale = _fp8_scales(scales, kv_heads)
    cs = cos_sin if rope else None
    y, err = run_fp8(x, w, pos, slots, cs, cache.view(torch.float8_e4m3fn), k_scale, v_scale)
    assert int(err.item()) == 0
    assert_close(y, qkv_front_f64(x, w, pos, cs, kv_heads), "y")
    want = fp8_rows(inserted_rows_f64(y.double(), kv_heads).to(torch.bfloat16), k_scale, v_scale).view(torch.uint8)
    flat = cache.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)
    keep = slots.long() >= 0
    assert torch.equal(flat[slots.long()[keep]], want[keep]), "inserted bytes"
    touched = torch.zeros(flat.shape[0], dtype=torch.bool, device=DEV)
    touched[slots.long()[keep]] = True
    assert torch.equal(flat[~touched], before.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)[~touched])


def test_fp8_insert_bit_identical_across_m_and_tiles(cos_sin):
    """A token's FP8 cache row is the same bytes alone, among M = 1 .. 512 tokens, in every forced
    tile, and run to run."""
    _kernel()
    kv_heads = 2
    x, w, pos, slots, _ = make_inputs(512, kv_heads, seed=21)
    k_scale, v_scale = _fp8_scales("per_head", kv_heads)
    fresh = lambda: torch.full((64, kv_heads, PAGE_SIZE, 128), 0x7F, dtype=torch.uint8, device=DEV)  # noqa: E731
    by_slot = lambda c: c.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)  # noqa: E731
    cache_all = fresh()
    run_fp8(x, w, pos, slots, cos_sin, cache_all.view(torch.float8_e4m3fn), k_scale, v_scale)
    again = fresh()
    run_fp8(x, w, pos, slots, cos_sin, again.view(torch.float8_e4m3fn), k_scale, v_scale)
    assert torch.equal(cache_all, again), "not deterministic run to run"
    for m in (1, 8, 16, 64, 128, 129, 256):
        for start in sorted({0, 512 - m}):
            part = slice(start, start + m)
            c = fresh()
            run_fp8(x[part].contiguous(), w, pos[part].contiguous(), slots[part].contiguous(), cos_sin,
                    c.view(torch.float8_e4m3fn), k_scale, v_scale)
            s = slots[part].long()
            assert torch.equal(by_slot(c)[s], by_slot(cache_all)[s]), (m, start)
    from muse_ops.cutedsl.qkv_front_plan import TILE_SHAPES
    for tile, hpc in TILE_SHAPES:
        c = fresh()
        run_fp8(x[:200].contiguous(), w, pos[:200].contiguous(), slots[:200].contiguous(), cos_sin,
                c.view(torch.float8_e4m3fn), k_scale, v_scale, override={"tile": (tile, hpc)})
        s = slots[:200].long()
        assert torch.equal(by_slot(c)[s], by_slot(cache_all)[s]), (tile, hpc)
