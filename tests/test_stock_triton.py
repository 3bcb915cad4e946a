"""The benchmark's stock Triton epilogues (bench/stock_triton.py) against muse_ops' reference, at
docs/DESIGN.md section 9's tolerances. Without a GPU they run in Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported), small shapes; the test extra
installs triton for this. Skipped with the reason when triton cannot be imported."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first `import triton`

from bench import stock_triton  # noqa: E402
from muse_ops.config import GROUP, HEAD_DIM, proj_cols  # noqa: E402
from muse_ops.reference import attn2_ref, qkv_front_ref, rope_cos_sin  # noqa: E402
from muse_ops.testing import MEAN_ATOL, assert_close  # noqa: E402

pytestmark = pytest.mark.skipif(not stock_triton.HAVE_TRITON,
                                reason=f"triton not importable ({stock_triton.TRITON_IMPORT_ERROR}); "
                                       "pip install -e .[test] installs it")

DEV = "cuda" if torch.cuda.is_available() else "cpu"


# Triton's interpreter converts fp32 to bf16 by truncation (numpy), not round-to-nearest-even as
# the GPU does (fp_downcast_rounding is ignored there); the kernels round twice (the normed head,
# then RoPE), which biases the mean error to ~2.3e-3. The element bound is the contract's in both
# modes; the mean bound is the contract's 2e-3 on a GPU and 4e-3 in the interpreter.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
MEAN_BOUND = 4e-3 if INTERPRETED else MEAN_ATOL


def _close(got, ref):
    assert_close(got, ref.double(), mean_atol=MEAN_BOUND)


@pytest.mark.parametrize("kv_heads,m,rope,fa_layout", [(1, 5, True, True), (2, 3, False, True),
                                                       (2, 4, True, False), (1, 1, False, False)])
def test_qk_norm_rope_insert_matches_reference(kv_heads, m, rope, fa_layout):
    g = torch.Generator().manual_seed(1)
    n = proj_cols(kv_heads)
    pages = 6
    # p is what cuBLAS returns; the reference recomputes it from x, W, so feed it the same p via an
    # identity-like projection: x = p padded, W = [I | 0] keeps p exact in bf16.
    p = torch.randn(m, n, generator=g).to(torch.bfloat16)
    hidden = 8192
    x = torch.zeros(m, hidden, dtype=torch.bfloat16)
    x[:, :n] = p
    w = torch.zeros(n, hidden, dtype=torch.bfloat16)
    w[:, :n] = torch.eye(n, dtype=torch.bfloat16)
    positions = torch.randint(0, 4096, (m,), generator=g)
    slots = torch.randperm(pages * 16, generator=g)[:m]
    if m > 2:
        slots[1] = -1  # a padding token: no insert
    cos_sin = rope_cos_sin(4096) if rope else None
    poison = torch.full((pages, kv_heads, 16, 2 * HEAD_DIM), float("nan"), dtype=torch.bfloat16)
    ref_cache = poison.clone()
    y_ref = qkv_front_ref(x, w, positions, slots, cos_sin, ref_cache)

    y = p.clone().to(DEV)
    if fa_layout:
        kc = torch.full((pages, 16, kv_heads, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=DEV)
        vc = kc.clone()
    else:
        cache = poison.clone().to(DEV)
        kc, vc = stock_triton.fa_cache_views(cache)
    stock_triton.qk_norm_rope_insert(y, positions.to(DEV), slots.to(DEV),
                                     None if cos_sin is None else cos_sin.to(DEV), kc, vc, kv_heads)
    _close(y.cpu(), y_ref)
    got = torch.cat((kc.transpose(1, 2), vc.transpose(1, 2)), dim=-1).cpu()  # [pages, Hkv, 16, 128]
    written = ~torch.isnan(ref_cache.float()).all(-1)
    assert torch.equal(written, ~torch.isnan(got.float()).all(-1)), "wrong cache rows written"
    _close(got[written], ref_cache[written])


@pytest.mark.parametrize("kv_heads,m", [(1, 3), (2, 8)])
def test_norm_gate_matches_reference(kv_heads, m):
    """norm_gate(o, y) is attn2's epilogue: check it on the reference's own attention output by
    running attn2_ref with the norm/gate removed (o = attention, then the epilogue)."""
    g = torch.Generator().manual_seed(2)
    hq = GROUP * kv_heads
    n = proj_cols(kv_heads)
    y = torch.randn(m, n, generator=g).to(torch.bfloat16)
    o = (torch.randn(m, hq * HEAD_DIM, generator=g) * 0.3).to(torch.bfloat16)
    gate = y[:, (hq + 2 * kv_heads) * HEAD_DIM:].double().view(m, hq, HEAD_DIM)
    od = o.double().view(m, hq, HEAD_DIM)
    ref = (torch.sigmoid(gate) * od * torch.rsqrt(od.square().mean(-1, keepdim=True) + 1e-5)).view(m, -1)
    out = stock_triton.norm_gate(o.to(DEV), y.to(DEV), kv_heads)
    _close(out.cpu(), ref)


def test_stock_attention_path_matches_attn2_ref():
    """The peer's composition (attention in fp32 here standing in for FA4, then norm_gate) equals
    attn2_ref: a check of the gate columns and head order the epilogue uses."""
    g = torch.Generator().manual_seed(3)
    kv_heads, q_len, lens = 1, 8, [20, 37]
    hq, n = GROUP * kv_heads, proj_cols(kv_heads)
    r = len(lens)
    pages = 8
    cache = torch.randn(pages, kv_heads, 16, 2 * HEAD_DIM, generator=g).to(torch.bfloat16)
    table = torch.tensor([[0, 3, -1], [5, 1, 6]], dtype=torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    y = torch.randn(q_len * r, n, generator=g).to(torch.bfloat16)
    ref = attn2_ref(y, cache, table, seq, q_len=q_len, window=0, scale=0.684)
    # attention alone: the reference with an identity epilogue is not exposed, so compute it here
    o = torch.empty(q_len * r, hq, HEAD_DIM)
    for b, L in enumerate(lens):
        toks = torch.arange(L)
        kv = cache[table[b, toks // 16].long(), :, toks % 16].float()   # [L, Hkv, 128]
        for t in range(q_len):
            pos = L - q_len + t
            for h in range(hq):
                q = y[b * q_len + t, h * 64:(h + 1) * 64].float()
                k = kv[:pos + 1, h // GROUP, :64]
                v = kv[:pos + 1, h // GROUP, 64:]
                o[b * q_len + t, h] = torch.softmax(k @ q * 0.684, 0) @ v
    out = stock_triton.norm_gate(o.to(torch.bfloat16).view(q_len * r, -1).to(DEV), y.to(DEV), kv_heads)
    _close(out.cpu(), ref)


# ------------------------------------------------------------------------------ the FP8 insert
E4M3 = torch.float8_e4m3fn


def _torch_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """torch's e4m3 of the fp32 quotient, saturated (muse_ops.reference's quantize_rows)."""
    return (x.float() / scale.float()).clamp(-448.0, 448.0).to(E4M3)


class _quiet:
    """numpy's warnings about the NaN and out-of-range lanes the conversion computes and discards
    (interpreter only)."""

    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def test_e4m3_conversion_is_torchs_byte_for_byte():
    """The insert's fp32 -> e4m3 conversion (integer arithmetic, the same in the interpreter and on
    the GPU) against torch's: ties to even, carries into the exponent, subnormals down to 2^-9,
    saturation (+-inf too), NaN with its sign; random values over 2^-20 .. 2^12 and random bits."""
    g = torch.Generator().manual_seed(11)
    special = torch.tensor([0.0, -0.0, 1.0, 1.0625, 1.1875, 447.0, 449.0, 464.0, 480.0, 1e6, -1e6,
                            float("inf"), -float("inf"), float("nan"), -float("nan"), 2 ** -6, 2 ** -6 * 0.99,
                            2 ** -9, 2 ** -10, 3 * 2 ** -10, 5 * 2 ** -11, 2 ** -7 * 1.0625, 15.5, 31.6, -126.3,
                            1e-30, -1e-40])
    mags = torch.exp2(torch.empty(20000).uniform_(-20, 12, generator=g)) * torch.where(
        torch.rand(20000, generator=g) < 0.5, -1.0, 1.0)
    bits = torch.randint(-2 ** 31, 2 ** 31, (20000,), generator=g, dtype=torch.int64)
    bits = bits.to(torch.int32).view(torch.float32)
    x = torch.cat([special, mags, bits])
    for s in (1.0, 0.37, 6.0 / 448.0):
        scale = torch.tensor([s])
        with _quiet():
            got = stock_triton.quantize_e4m3(x.to(DEV), scale.to(DEV)).cpu()
        want = _torch_e4m3(x, scale)
        bad = (got.view(torch.uint8) != want.view(torch.uint8)).nonzero().flatten()
        assert bad.numel() == 0, [(float(x[i]), int(got.view(torch.uint8)[i]), int(want.view(torch.uint8)[i]))
                                  for i in bad[:8]]


def _fp8_scales(kind: str, kv_heads: int):
    if kind == "tensor":
        return torch.tensor([6.0 / 448]), torch.tensor([0.5])
    g = torch.Generator().manual_seed(kv_heads)
    return (0.005 + 0.02 * torch.rand(kv_heads, generator=g)), (0.01 + torch.rand(kv_heads, generator=g))


@pytest.mark.parametrize("layout", ["fa", "muse", "hnd"])
@pytest.mark.parametrize("kind", ["tensor", "per_head"])
@pytest.mark.parametrize("kv_heads,m,rope", [(1, 5, True), (2, 4, False), (3, 6, True)])
def test_fp8_insert_is_torch_e4m3_of_its_own_rows(layout, kind, kv_heads, m, rope):
    """The quantizing insert: y (q' | k' | v | gate) is the bf16 insert's y bit for bit, and the
    cache bytes at each slot are torch's e4m3 of y's own k' and v divided by their scales
    (per tensor or per KV head; k by k_scale, v by v_scale); padding slots and other rows untouched.
    Layouts: FA4's [pages, 16, Hkv, 64], muse's [pages, Hkv, 16, 128] halves, FlashInfer's HND
    [pages, Hkv, 16, 64] (transposed views)."""
    from muse_ops.reference import quantize_rows
    g = torch.Generator().manual_seed(7 + m)
    n = proj_cols(kv_heads)
    pages = 5
    p = torch.randn(m, n, generator=g).to(torch.bfloat16)
    positions = torch.randint(0, 4096, (m,), generator=g)
    slots = torch.randperm(pages * 16, generator=g)[:m]
    slots[1] = -1                                            # a padding token: no insert
    cos_sin = rope_cos_sin(4096).to(DEV) if rope else None
    k_scale, v_scale = (t.to(DEV) for t in _fp8_scales(kind, kv_heads))
    nan = 0x7F

    def caches():
        if layout == "fa":
            k = torch.full((pages, 16, kv_heads, HEAD_DIM), nan, dtype=torch.uint8, device=DEV).view(E4M3)
            return k, k.clone(), (lambda k, v: torch.cat((k.transpose(1, 2), v.transpose(1, 2)), -1))
        if layout == "hnd":
            k = torch.full((pages, kv_heads, 16, HEAD_DIM), nan, dtype=torch.uint8, device=DEV).view(E4M3)
            return (k.transpose(1, 2), k.clone().transpose(1, 2),
                    lambda k, v: torch.cat((k.transpose(1, 2), v.transpose(1, 2)), -1))
        cache = torch.full((pages, kv_heads, 16, 2 * HEAD_DIM), nan, dtype=torch.uint8, device=DEV).view(E4M3)
        kc, vc = stock_triton.fa_cache_views(cache)
        return kc, vc, (lambda k, v: cache)
    kc, vc, whole = caches()
    y16 = p.clone().to(DEV)
    bc = torch.zeros((pages, 16, kv_heads, HEAD_DIM), dtype=torch.bfloat16, device=DEV)
    stock_triton.qk_norm_rope_insert(y16, positions.to(DEV), slots.to(DEV), cos_sin, bc, bc.clone(), kv_heads)
    y = p.clone().to(DEV)
    with _quiet():
        stock_triton.qk_norm_rope_insert(y, positions.to(DEV), slots.to(DEV), cos_sin, kc, vc, kv_heads,
                                         k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(y.view(torch.int16), y16.view(torch.int16)), "y differs from the bf16 insert's"
    got = whole(kc, vc).view(torch.uint8).cpu()                        # [pages, Hkv, 16, 128] bytes
    hq = GROUP * kv_heads
    yk = y.cpu().view(m, -1, HEAD_DIM)
    rows = torch.cat((yk[:, hq:hq + kv_heads], yk[:, hq + kv_heads:hq + 2 * kv_heads]), -1)   # [M, Hkv, 128] bf16
    want = quantize_rows(rows, k_scale.cpu(), v_scale.cpu()).view(torch.uint8)
    kept = (slots >= 0).nonzero().flatten()
    s = slots[kept]
    assert torch.equal(got[s // 16, :, s % 16], want[kept]), "inserted bytes"
    untouched = torch.ones(pages * 16, dtype=torch.bool)
    untouched[s] = False
    by_slot = got.permute(0, 2, 1, 3).reshape(pages * 16, kv_heads, 2 * HEAD_DIM)
    assert bool((by_slot[untouched] == nan).all()), "a row outside the slots changed"


def test_fp8_insert_needs_its_scales():
    kv_heads, m = 1, 2
    y = torch.randn(m, proj_cols(kv_heads)).to(torch.bfloat16).to(DEV)
    k = torch.zeros((2, 16, kv_heads, HEAD_DIM), dtype=torch.uint8, device=DEV).view(E4M3)
    with pytest.raises(ValueError, match="k_scale"):
        stock_triton.qk_norm_rope_insert(y, torch.arange(m, device=DEV), torch.arange(m, device=DEV), None, k,
                                         k.clone(), kv_heads)
