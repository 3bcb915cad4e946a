"""The FP8 (float8_e4m3fn) KV cache of both ops (docs/DESIGN.md section 3b): qkv_front inserts
e4m3(k' / k_scale) | e4m3(v / v_scale), rounded to nearest even and saturated to +-448, byte for
byte what torch's own conversion gives; attn2 reads float(e4m3) * scale against the float64
oracle on the dequantized cache, per-tensor and per-KV-head scales, scales other than 1; a
long-context needle keeps its softmax weight; bad scales are refused before anything is written.

CPU tests run the reference backend; the `gpu` ones run whatever the default backend is there
(the CuTe DSL kernels where they serve an FP8 cache) and check the same contract.
"""
import pytest
import torch

import muse_ops
from muse_ops import DeploymentConfig, MuseAttentionDecode, MuseInputError, PagedBatch
from muse_ops.config import FP8_MAX, HEAD_DIM, PAGE_SIZE, proj_cols
from muse_ops.testing import (assert_close, attn2_f64, fp8_rows, inserted_rows_f64, qkv_front_f64,
                              tolerance_report)

from scenario import qkv_front_inputs

E4M3 = torch.float8_e4m3fn
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
NAN_BYTE = 0x7F


def _scales(kind: str, kv_heads: int, device):
    """(k_scale, v_scale): None (1.0), one element, or one per KV head (values other than 1)."""
    if kind == "none":
        return None, None
    if kind == "tensor":
        return (torch.tensor([0.37], device=device), torch.tensor([2.5], device=device))
    gen = torch.Generator().manual_seed(kv_heads)
    return ((0.2 + torch.rand(kv_heads, generator=gen)).to(device), (0.5 + 2 * torch.rand(kv_heads, generator=gen)).to(device))


def _poisoned_fp8_cache(num_pages, kv_heads, device):
    return torch.full((num_pages, kv_heads, PAGE_SIZE, 128), NAN_BYTE, dtype=torch.uint8, device=device).view(E4M3)


# ------------------------------------------------------------------------------ qkv_front
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["none", "tensor", "per_head"])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("m,kv_heads", [(1, 2), (8, 2), (24, 1), (40, 3)])
def test_qkv_front_fp8_insert_is_torch_e4m3_of_the_reference(device, kind, rope, m, kv_heads):
    gen = torch.Generator().manual_seed(m * 7 + kv_heads)
    x, w = qkv_front_inputs(m, kv_heads, gen, device=device)
    num_pages = 8
    cache = _poisoned_fp8_cache(num_pages, kv_heads, device)
    slots = torch.randperm(num_pages * PAGE_SIZE, generator=gen)[:m].to(device)
    slots[m // 2] = -1                                          # a padding token inserts nothing
    positions = torch.randint(0, 512, (m,), generator=gen).to(device)
    cos_sin = muse_ops.rope_cos_sin(512, device=device) if rope else None
    k_scale, v_scale = _scales(kind, kv_heads, device)
    before = cache.view(torch.uint8).clone()
    with torch.inference_mode():
        y = muse_ops.qkv_front(x, w, positions, slots, cos_sin, cache, k_scale=k_scale, v_scale=v_scale)
    y64 = qkv_front_f64(x, w, positions, cos_sin, kv_heads)
    assert_close(y, y64, "y")
    # the bytes: torch's e4m3 of the fp32 quotients of the op's own bf16 k', v (the bf16 rows
    # themselves are held to the float64 oracle above)
    rows = inserted_rows_f64(y.double(), kv_heads).to(torch.bfloat16)
    want = fp8_rows(rows, k_scale, v_scale).view(torch.uint8)
    got = cache.view(torch.uint8)
    kept = (slots >= 0).nonzero().flatten()
    s = slots[kept].long()
    assert torch.equal(got[s // PAGE_SIZE, :, s % PAGE_SIZE], want[kept]), "inserted bytes"
    untouched = torch.ones(num_pages * PAGE_SIZE, dtype=torch.bool, device=device)
    untouched[s] = False
    by_slot = lambda c: c.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)      # [pages * 16, Hkv, 128]
    assert torch.equal(by_slot(got)[untouched], by_slot(before)[untouched]), "a row outside the slots changed"


@pytest.mark.parametrize("device", DEVICES)
def test_qkv_front_fp8_saturates(device):
    """A quotient beyond 448 is stored as +-448 (k' is normalised, |k'| <= 8: a scale of 1e-3
    pushes every element past it); values stay finite."""
    gen = torch.Generator().manual_seed(3)
    x, w = qkv_front_inputs(8, 1, gen, device=device)
    cache = _poisoned_fp8_cache(4, 1, device)
    slots = torch.arange(8, device=device)
    tiny = torch.tensor([1e-3], device=device)
    with torch.inference_mode():
        y = muse_ops.qkv_front(x, w, torch.arange(8, device=device), slots, None, cache, k_scale=tiny, v_scale=tiny)
    keys = cache[0, 0, :8, :HEAD_DIM].float()
    k = y[:, 8 * HEAD_DIM:9 * HEAD_DIM].float()
    big = (k.abs() / 1e-3) >= FP8_MAX
    assert big.any() and torch.equal(keys[big], FP8_MAX * torch.sign(k[big]))
    assert torch.isfinite(cache[0, 0, :8].float()).all()


def test_fp8_conversion_rules():
    """The reference's quantization: round to nearest even, saturate to +-448, NaN stays NaN,
    +-inf becomes +-448 (what the kernels' cvt.rn.satfinite does), byte for byte torch's own."""
    from muse_ops.reference import quantize_rows
    special = torch.tensor([0.0, -0.0, 1.0, 447.0, 449.0, 1e6, float("inf"), -float("inf"), float("nan"),
                            2 ** -10, 3 * 2 ** -10, 1.0625, 1.1875], dtype=torch.float32)
    rows = torch.zeros(1, 1, 128)
    rows[0, 0, :special.numel()] = special
    got = quantize_rows(rows.to(torch.bfloat16) if False else rows, None, None).float()[0, 0, :special.numel()]
    want = [0.0, -0.0, 1.0, 448.0, 448.0, 448.0, 448.0, -448.0, float("nan"), 0.0, 2 ** -8, 1.0, 1.25]
    for g, e in zip(got.tolist(), want):
        assert (g != g and e != e) or g == e, (got.tolist(), want)


def test_fp8_rows_saturates_whatever_torch():
    """The tests' oracle (testing.fp8_rows) saturates as the contract does whatever torch's own
    conversion does past 448 (torch 2.11 gives the NaN byte there, 2.13 saturates): 470, 1000 and
    inf become 0x7E, -1000 becomes 0xFE, NaN stays 0x7F, 448 and 464 (a tie: to even) stay 448."""
    special = torch.tensor([448.0, 464.0, 470.0, 1000.0, float("inf"), -1000.0, float("nan"), 1.0])
    rows = torch.ones(1, 1, 128)
    rows[0, 0, :special.numel()] = special
    rows[0, 0, HEAD_DIM:HEAD_DIM + special.numel()] = special
    got = fp8_rows(rows).view(torch.uint8)[0, 0]
    want = [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x38]
    assert got[:special.numel()].tolist() == want and got[HEAD_DIM:HEAD_DIM + special.numel()].tolist() == want


# ------------------------------------------------------------------------------ attn2
def _fp8_attn2_inputs(lengths, q_len, kv_heads, gen, device, k_scale, v_scale):
    """y and an FP8 cache whose rows a request holds are e4m3 of N(0,1) / scale (so the
    dequantized values are O(1)); every other byte is NaN."""
    need = sum(-(-n // PAGE_SIZE) for n in lengths)
    num_pages = need + 5
    batch = PagedBatch.build(lengths, num_pages, q_len, max_pages=max(-(-n // PAGE_SIZE) for n in lengths) + 2,
                             generator=gen)
    cache = _poisoned_fp8_cache(num_pages, kv_heads, "cpu")
    ks = muse_ops.reference.per_head(k_scale, kv_heads, "cpu")[:, None]
    vs = muse_ops.reference.per_head(v_scale, kv_heads, "cpu")[:, None]
    for r, length in enumerate(batch.seq_lens.tolist()):
        t = torch.arange(length)
        pages = batch.page_table[r].long()[t // PAGE_SIZE]
        rows = torch.randn(length, kv_heads, 128, generator=gen)
        rows = torch.cat((rows[..., :HEAD_DIM] / ks, rows[..., HEAD_DIM:] / vs), dim=-1)
        cache[pages, :, t % PAGE_SIZE] = rows.to(E4M3)
    y = (torch.randn(q_len * len(lengths), proj_cols(kv_heads), generator=gen) * 1.5).to(torch.bfloat16)
    to = lambda b: PagedBatch(*(t.to(device) for t in (b.seq_lens, b.page_table, b.positions, b.slots)))
    return y.to(device), cache.to(device), to(batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["none", "tensor", "per_head"])
@pytest.mark.parametrize("q_len,window,lengths,kv_heads", [
    (8, 0, [40, 700, 9], 2), (1, 0, [1, 300, 77], 1), (8, 2048, [2100, 60], 1), (1, 64, [500], 3)])
def test_attn2_fp8_matches_float64(device, kind, q_len, window, lengths, kv_heads):
    gen = torch.Generator().manual_seed(sum(lengths) + q_len)
    k_scale, v_scale = _scales(kind, kv_heads, device)
    y, cache, b = _fp8_attn2_inputs(lengths, q_len, kv_heads, gen, device, k_scale, v_scale)
    kw = dict(q_len=q_len, window=window, scale=0.68, max_seq_len=4096)
    with torch.inference_mode():
        out = muse_ops.attn2(y, cache, b.page_table, b.seq_lens, k_scale=k_scale, v_scale=v_scale, **kw)
        again = muse_ops.attn2(y, cache, b.page_table, b.seq_lens, k_scale=k_scale, v_scale=v_scale, **kw)
    ref = attn2_f64(y, cache, b.page_table, b.seq_lens, q_len=q_len, window=window, scale=0.68, k_scale=k_scale,
                    v_scale=v_scale)
    assert_close(out, ref)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "run to run"


@pytest.mark.parametrize("device", DEVICES)
def test_attn2_fp8_batch_invariant(device):
    """A request's rows are the same bits alone and in a batch with others (FP8 cache)."""
    gen = torch.Generator().manual_seed(9)
    k_scale, v_scale = _scales("per_head", 2, device)
    y, cache, b = _fp8_attn2_inputs([900, 33, 4100, 250], 8, 2, gen, device, k_scale, v_scale)
    kw = dict(q_len=8, window=0, scale=0.68, max_seq_len=8192, k_scale=k_scale, v_scale=v_scale)
    with torch.inference_mode():
        full = muse_ops.attn2(y, cache, b.page_table, b.seq_lens, **kw)
        for r in range(4):
            alone = muse_ops.attn2(y[8 * r:8 * r + 8], cache, b.page_table[r:r + 1], b.seq_lens[r:r + 1], **kw)
            assert torch.equal(alone.view(torch.int16), full[8 * r:8 * r + 8].view(torch.int16)), r


def _needle_weight(out: torch.Tensor, gate_sign: float = 1.0) -> torch.Tensor:
    """The needle's softmax weight w from a head's output row: its value is e_0, every other
    visible key's is e_1, so o = w e_0 + (1 - w) e_1 and the norm and gate keep the ratio."""
    return out[..., 0].float() / (out[..., 0].float() + out[..., 1].float())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_long_context_needle_keeps_its_weight(device):
    """L = 131072: one planted key matches the last token's queries strongly (weight ~0.5 against
    the other 131071 keys together). With an FP8 cache it gets the softmax weight it gets with a
    bf16 cache, within the contract's tolerance (accumulation over the long context stays fp32)."""
    length, q_len, kv_heads = 131072, 1, 1
    gen = torch.Generator().manual_seed(4)
    batch = PagedBatch.build([length], length // PAGE_SIZE + 1, q_len, generator=gen)
    keys = torch.randn(length, HEAD_DIM, generator=gen) * 0.5
    q = torch.where(torch.rand(HEAD_DIM, generator=gen) < 0.5, -1.0, 1.0)      # |q| = 8, exact in bf16
    scale = 0.68
    needle = 77_777
    # logit of the needle: scale * 2.5 * 64 = 108.8 * 2.5 / 2.5 ...; chosen so that its weight is ~0.5
    others = torch.logsumexp(scale * (keys @ q), 0)
    c = float(others) / (scale * HEAD_DIM)
    c = float(torch.tensor(c).to(E4M3).float())                                   # exact in e4m3 and bf16
    keys[needle] = c * q
    values = torch.zeros(length, HEAD_DIM)
    values[:, 1] = 1.0
    values[needle] = 0.0
    values[needle, 0] = 1.0
    rows = torch.cat((keys, values), -1)[:, None]                               # [L, 1, 128]
    t = torch.arange(length)
    weights = {}
    for dtype in (torch.bfloat16, E4M3):
        cache = torch.zeros(length // PAGE_SIZE + 1, kv_heads, PAGE_SIZE, 128, dtype=dtype)
        cache[batch.page_table[0].long()[t // PAGE_SIZE], :, t % PAGE_SIZE] = rows.to(dtype)
        y = torch.zeros(q_len, proj_cols(kv_heads))
        y[:, :8 * HEAD_DIM] = q.repeat(8)
        y[:, (8 + 2) * HEAD_DIM:] = 4.0                                            # gate: sigmoid ~ 1, same per column
        kw = dict(q_len=q_len, window=0, scale=scale, max_seq_len=length)
        d = lambda x: x.to(device)
        with torch.inference_mode():
            out = muse_ops.attn2(d(y.to(torch.bfloat16)), d(cache), d(batch.page_table), d(batch.seq_lens), **kw)
        weights[dtype] = _needle_weight(out.cpu().view(8, HEAD_DIM)).double()
    w16, w8 = weights[torch.bfloat16], weights[E4M3]
    assert 0.2 < float(w16.mean()) < 0.8, f"the needle's weight {w16.tolist()} (should be ~0.5)"
    err = (w8 - w16).abs()
    assert bool((err <= 2e-2 + 1e-2 * w16.abs()).all()), f"FP8 {w8.tolist()} against bf16 {w16.tolist()}"


# ------------------------------------------------------------------------------ the layer
def _fp8_layer_pair(device, window=2048):
    """A bf16 layer and an FP8 layer with the same weights, and caches holding the same history
    (the FP8 one its e4m3 quantization)."""
    gen = torch.Generator().manual_seed(12)
    torch.manual_seed(12)
    lengths = [100, 1500, 37]
    bf16_cfg = DeploymentConfig(kv_heads=2, window=window, max_seq_len=4096, max_batch=4)
    fp8_cfg = DeploymentConfig(kv_heads=2, window=window, max_seq_len=4096, max_batch=4, cache_dtype=E4M3)
    layer16 = MuseAttentionDecode(bf16_cfg, device=device)
    layer8 = MuseAttentionDecode(fp8_cfg, device=device, k_scale=[0.1, 0.15], v_scale=0.5)
    layer8.qkv_weight.copy_(layer16.qkv_weight)
    num_pages = sum(-(-n // PAGE_SIZE) for n in lengths) + 4
    b = PagedBatch.build(lengths, num_pages, 8, generator=gen, device=device)
    history = torch.randn(num_pages, 2, PAGE_SIZE, 128, generator=gen)
    cache16 = history.to(torch.bfloat16).to(device)
    ks = torch.tensor([0.1, 0.15])[None, :, None, None]
    cache8 = torch.cat((history[..., :64] / ks, history[..., 64:] / 0.5), -1).to(E4M3).to(device)
    x = torch.randn(len(lengths) * 8, 8192, generator=gen).to(device, torch.bfloat16)
    return layer16, layer8, cache16, cache8, b, x


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_layer_against_float64_and_against_bf16(device, capsys):
    """The FP8 layer's step against the float64 oracle on its dequantized cache (the contract), and
    its distance from the bf16 layer on the same inputs (reported: the cost of the FP8 cache)."""
    layer16, layer8, cache16, cache8, b, x = _fp8_layer_pair(device)
    with torch.inference_mode():
        out16 = layer16(x, b.positions, b.slots, cache16, b.page_table, b.seq_lens)
        out8 = layer8(x, b.positions, b.slots, cache8, b.page_table, b.seq_lens)
    y64 = qkv_front_f64(x, layer8.qkv_weight, b.positions, layer8.cos_sin, 2)
    ref = attn2_f64(y64.to(torch.bfloat16), cache8, b.page_table, b.seq_lens, q_len=8, window=2048,
                    scale=layer8.config.scale, k_scale=layer8.k_scale, v_scale=layer8.v_scale)
    muse_ops.testing.assert_layer_close(out8, ref, "FP8 layer")
    rep = tolerance_report(out8, out16.double())
    with capsys.disabled():
        print(f"\n[{device}] FP8 layer against the bf16 layer, same inputs: max |err| {rep['max_abs']:.3e}, "
              f"mean |err| {rep['mean_abs']:.3e}, {rep['bad']} of {out8.numel()} outside the op bound")
    # e4m3 keeps 3 mantissa bits: the logits move by ~0.1 and the rms norm of a long context's
    # small o amplifies what that moves (CPU: mean 0.026, max 0.98 of outputs ~N(0,1)); a wrong
    # row, page or scale moves the mean by far more
    assert rep["mean_abs"] < 0.06 and rep["max_abs"] < 3.0


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_layer_compiles_with_the_cache_in_place(device):
    torch._dynamo.reset()
    _, layer8, _, cache8, b, x = _fp8_layer_pair(device)
    eager_cache = cache8.clone()
    with torch.inference_mode():
        eager = layer8(x, b.positions, b.slots, eager_cache, b.page_table, b.seq_lens)
        ptr = cache8.data_ptr()
        compiled = torch.compile(layer8, fullgraph=True)(x, b.positions, b.slots, cache8, b.page_table, b.seq_lens)
    assert torch.equal(compiled.view(torch.int16), eager.view(torch.int16))
    assert torch.equal(cache8.view(torch.uint8), eager_cache.view(torch.uint8)) and cache8.data_ptr() == ptr


# torch.library.opcheck's test_schema perturbs the float inputs with a multiply that has no
# float8 kernel on the CPU ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'): the other
# checks (fake tensors, autograd registration, AOT dispatch static and dynamic) run as for bf16.
OPCHECK_FP8 = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
               "test_aot_dispatch_dynamic")


def test_opcheck_with_an_fp8_cache():
    gen = torch.Generator().manual_seed(5)
    k_scale, v_scale = _scales("per_head", 2, "cpu")
    y, cache, b = _fp8_attn2_inputs([40, 130], 8, 2, gen, "cpu", k_scale, v_scale)
    cache = cache.view(torch.uint8).masked_fill(cache.view(torch.uint8) == NAN_BYTE, 0).view(E4M3)  # NaN would not compare
    torch.library.opcheck(torch.ops.muse.attn2.default, (y, cache, b.page_table, b.seq_lens, None),
                          dict(q_len=8, window=0, scale=0.68, max_seq_len=4096, k_scale=k_scale, v_scale=v_scale),
                          test_utils=OPCHECK_FP8)
    x, w = qkv_front_inputs(8, 2, gen)
    torch.library.opcheck(torch.ops.muse.qkv_front.default,
                          (x, w, torch.arange(100, 108), torch.arange(8) * 3 + 1, muse_ops.rope_cos_sin(512),
                           muse_ops.allocate_kv_cache(16, 2, dtype=E4M3)), dict(k_scale=k_scale, v_scale=v_scale),
                          test_utils=OPCHECK_FP8)


# ------------------------------------------------------------------------------ bad scales
BAD_SCALES = {
    "zero": (lambda c: torch.tensor([0.0]), "positive and finite"),
    "negative": (lambda c: torch.tensor([-1.0, 1.0]), "positive and finite"),
    "nan": (lambda c: torch.tensor([float("nan")]), "positive and finite"),
    "inf": (lambda c: torch.tensor([1.0, float("inf")]), "positive and finite"),
    "shape": (lambda c: torch.ones(3), "one element"),
    "dtype": (lambda c: torch.ones(1, dtype=torch.float64), "float32"),
    "not a tensor": (lambda c: 0.5, "float32 tensor"),
}


@pytest.mark.parametrize("arg", ["k_scale", "v_scale"])
@pytest.mark.parametrize("case", sorted(BAD_SCALES))
def test_bad_scales_are_refused_before_any_write(arg, case):
    gen = torch.Generator().manual_seed(8)
    x, w = qkv_front_inputs(8, 2, gen)
    cache = muse_ops.allocate_kv_cache(4, 2, dtype=E4M3)
    before = cache.view(torch.uint8).clone()
    bad, message = BAD_SCALES[case]
    kw = {arg: bad(cache)}
    with pytest.raises(MuseInputError, match=rf"muse::qkv_front: {arg} must be .*{message}"):
        muse_ops.qkv_front(x, w, torch.arange(8), torch.arange(8), None, cache, **kw)
    assert torch.equal(cache.view(torch.uint8), before)
    y = torch.zeros(8, proj_cols(2), dtype=torch.bfloat16)
    b = PagedBatch.build([20], 4, 8, generator=gen)
    with pytest.raises(MuseInputError, match=rf"muse::attn2: {arg} must be .*{message}"):
        muse_ops.attn2(y, cache, b.page_table, b.seq_lens, q_len=8, window=0, scale=0.68, max_seq_len=64, **kw)


def test_scales_on_a_bf16_cache_and_the_layers_scales_are_checked():
    gen = torch.Generator().manual_seed(8)
    x, w = qkv_front_inputs(8, 1, gen)
    with pytest.raises(MuseInputError, match="k_scale must be None for a bf16 kv_cache"):
        muse_ops.qkv_front(x, w, torch.arange(8), torch.arange(8), None, muse_ops.allocate_kv_cache(4, 1),
                           k_scale=torch.ones(1))
    cfg = DeploymentConfig(kv_heads=2, cache_dtype=E4M3, max_seq_len=256, max_batch=2)
    for bad in (0.0, -2.0, float("nan"), float("inf"), [1.0, 2.0, 3.0], 1e-50):
        with pytest.raises(MuseInputError, match="k_scale must be"):
            MuseAttentionDecode(cfg, k_scale=bad)
    layer = MuseAttentionDecode(cfg, k_scale=[0.5, 0.25], v_scale=3.0)
    assert layer.k_scale.tolist() == [0.5, 0.25] and layer.v_scale.tolist() == [3.0, 3.0]
    with pytest.raises(MuseInputError, match="v_scale must be"):
        layer.set_kv_scales(1.0, float("nan"))
    assert layer.k_scale.tolist() == [0.5, 0.25], "a refused set changed the scales"
    with pytest.raises(MuseInputError, match="scale an FP8 cache"):
        MuseAttentionDecode(DeploymentConfig(kv_heads=1)).set_kv_scales(1.0, 1.0)
    # the layer refuses a cache of another dtype than its config's
    layer16 = MuseAttentionDecode(DeploymentConfig(kv_heads=2, max_seq_len=256, max_batch=2))
    b = PagedBatch.build([20], 4, 8, generator=gen)
    with pytest.raises(MuseInputError, match="kv_cache must be torch.bfloat16"):
        with torch.inference_mode():
            layer16(torch.zeros(8, 8192, dtype=torch.bfloat16), b.positions, b.slots,
                    muse_ops.allocate_kv_cache(4, 2, dtype=E4M3), b.page_table, b.seq_lens)


def test_tokens_per_gigabyte():
    """The FP8 cache holds twice the tokens of a bf16 one in the same bytes."""
    for kv_heads in (1, 2, 16):
        bf16 = muse_ops.allocate_kv_cache(2, kv_heads)
        fp8 = muse_ops.allocate_kv_cache(2, kv_heads, dtype=E4M3)
        assert bf16.nbytes == 2 * fp8.nbytes
