"""muse::qkv_front on the reference backend against the float64 evaluation (muse_ops.testing), and its cache writes."""
import torch
from hypothesis import given, strategies as st

import muse_ops
from muse_ops.config import PAGE_SIZE

from muse_ops.testing import assert_close, qkv_front_f64

from scenario import qkv_front_inputs


def poisoned_cache(num_pages, kv_heads):
    return torch.full((num_pages, kv_heads, PAGE_SIZE, 128), float("nan"), dtype=torch.bfloat16)


@given(m=st.integers(1, 20), kv_heads=st.sampled_from([1, 2, 4]), rope=st.booleans(),
       pad=st.integers(0, 3), seed=st.integers(0, 2**31 - 1))
def test_qkv_front_reference_matches_float64(m, kv_heads, rope, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = qkv_front_inputs(m, kv_heads, gen)
    num_pages = 8
    cache = poisoned_cache(num_pages, kv_heads)
    before = cache.clone()
    positions = torch.randint(0, 5000, (m,), generator=gen)
    slots = torch.randperm(num_pages * PAGE_SIZE, generator=gen)[:m]
    slots[:min(pad, m)] = -1                         # padding tokens: no insert
    cos_sin = muse_ops.rope_cos_sin(5000) if rope else None
    y = muse_ops.qkv_front(x, w, positions, slots, cos_sin, cache, backend="reference")

    ref = qkv_front_f64(x, w, positions, cos_sin, kv_heads)
    assert y.shape == (m, 1152 * kv_heads) and y.dtype == torch.bfloat16
    assert_close(y, ref, "y")
    hq = 8 * kv_heads
    written = torch.zeros(num_pages * PAGE_SIZE, dtype=torch.bool)
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        written[s] = True
        row = cache[s // PAGE_SIZE, :, s % PAGE_SIZE].double()              # [Hkv, 128]
        k_ref = ref[i, hq * 64:(hq + kv_heads) * 64].view(kv_heads, 64)
        v_ref = ref[i, (hq + kv_heads) * 64:(hq + 2 * kv_heads) * 64].view(kv_heads, 64)
        assert_close(row[:, :64], k_ref, "inserted k")
        assert_close(row[:, 64:], v_ref, "inserted v")
        # the cache holds exactly what y returned
        assert torch.equal(row[:, :64], y[i, hq * 64:(hq + kv_heads) * 64].double().view(kv_heads, 64))
    flat_after = cache.permute(0, 2, 1, 3).reshape(-1, kv_heads * 128)
    flat_before = before.permute(0, 2, 1, 3).reshape(-1, kv_heads * 128)
    assert torch.equal(flat_after[~written].view(torch.int16), flat_before[~written].view(torch.int16)), \
        "rows outside the slots were touched"


def test_qkv_front_rope_matches_sglang_table():
    """cos_sin row p, column i = cos(p * 500000^(-2i/64)); columns 32+i the sin."""
    cs = muse_ops.rope_cos_sin(100)
    i = torch.arange(32, dtype=torch.float64)
    f = 500000.0 ** (-2 * i / 64)
    torch.testing.assert_close(cs[77, :32].double(), torch.cos(77 * f), atol=1e-6, rtol=0)
    torch.testing.assert_close(cs[77, 32:].double(), torch.sin(77 * f), atol=1e-6, rtol=0)


def test_qkv_front_empty():
    cache = muse_ops.allocate_kv_cache(2, 1)
    x = torch.empty(0, 8192, dtype=torch.bfloat16)
    w = torch.zeros(1152, 8192, dtype=torch.bfloat16)
    idx = torch.empty(0, dtype=torch.int64)
    assert muse_ops.qkv_front(x, w, idx, idx, None, cache).shape == (0, 1152)


def test_qkv_front_all_padding_writes_nothing():
    gen = torch.Generator().manual_seed(9)
    x, w = qkv_front_inputs(4, 1, gen)
    cache = poisoned_cache(2, 1)
    cache[1].normal_(generator=gen)
    before = cache.clone()
    slots = torch.full((4,), -1, dtype=torch.int64)
    muse_ops.qkv_front(x, w, torch.arange(4), slots, None, cache)
    assert torch.equal(cache.view(torch.int16), before.view(torch.int16))
