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
