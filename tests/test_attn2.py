"""muse::attn2 on the reference backend against the float64 evaluation (muse_ops.testing)."""
import pytest
import torch
from hypothesis import given, strategies as st

import muse_ops
from muse_ops.config import DEFAULT_SCALE, SLIDING_WINDOW

from muse_ops.testing import assert_close, attn2_f64, bf16
from scenario import attn2_inputs


def run_attn2(y, cache, batch, q_len, window, scale=DEFAULT_SCALE, max_seq_len=1 << 20, **kw):
    return muse_ops.attn2(y, cache, batch.page_table, batch.seq_lens, q_len=q_len, window=window, scale=scale,
                          max_seq_len=max_seq_len, backend="reference", **kw)


@given(lengths=st.lists(st.integers(1, 700), min_size=1, max_size=4),
       q_len=st.sampled_from([1, 8]), window=st.sampled_from([0, 5, 64, SLIDING_WINDOW]),
       kv_heads=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**31 - 1))
def test_attn2_reference_matches_float64(lengths, q_len, window, kv_heads, seed):
    lengths = [max(n, q_len) for n in lengths]
    gen = torch.Generator().manual_seed(seed)
    y, cache, batch = attn2_inputs(lengths, q_len, kv_heads, gen)
    out = run_attn2(y, cache, batch, q_len, window)
    assert out.dtype == torch.bfloat16 and out.shape == (q_len * len(lengths), 512 * kv_heads)
    ref = attn2_f64(y, cache, batch.page_table, batch.seq_lens, q_len=q_len, window=window, scale=DEFAULT_SCALE)
    assert_close(out, ref)


@pytest.mark.parametrize("q_len,window,lengths", [
    (8, 0, [8, 9, 16, 17, 31, 33]),         # page boundaries, L == q_len
    (8, 2048, [2047, 2048, 2049, 2063, 4100]),  # window edges
    (1, 0, [1, 2, 15, 16, 17]),
    (1, 16, [1, 17, 40]),
])
def test_attn2_reference_edges(q_len, window, lengths):
    gen = torch.Generator().manual_seed(1)
    y, cache, batch = attn2_inputs(lengths, q_len, 2, gen)
    out = run_attn2(y, cache, batch, q_len, window)
    assert_close(out, attn2_f64(y, cache, batch.page_table, batch.seq_lens, q_len=q_len, window=window, scale=DEFAULT_SCALE))


def test_attn2_single_visible_key_is_v():
    """L = q_len = 1: the one key is the token itself, so o = v exactly and out = sigmoid(g) rmsnorm(v)."""
    gen = torch.Generator().manual_seed(2)
    y, cache, batch = attn2_inputs([1], 1, 1, gen)
    out = run_attn2(y, cache, batch, 1, 0).double()
    v = bf16(cache[batch.page_table[0, 0].long(), 0, 0, 64:].float()).view(1, 64)
    gate = y[0, 640:].double().view(8, 64)
    expect = torch.sigmoid(gate) * (v / torch.sqrt((v * v).mean() + 1e-5))
    torch.testing.assert_close(out.view(8, 64), bf16(expect), atol=0, rtol=0)


def test_attn2_empty_batch():
    cache = muse_ops.allocate_kv_cache(4, 2)
    y = torch.empty(0, 2304, dtype=torch.bfloat16)
    out = muse_ops.attn2(y, cache, torch.empty(0, 1, dtype=torch.int32), torch.empty(0, dtype=torch.int32),
                         q_len=8, window=0, scale=0.5, max_seq_len=64)
    assert out.shape == (0, 1024)


def test_attn2_reference_ignores_other_requests():
    """A request's output depends on its own rows only: alone vs inside a batch, same bits."""
    gen = torch.Generator().manual_seed(3)
    y, cache, batch = attn2_inputs([300, 50, 1000], 8, 2, gen)
    full = run_attn2(y, cache, batch, 8, 0)
    alone = muse_ops.attn2(y[8:16], cache, batch.page_table[1:2], batch.seq_lens[1:2], q_len=8, window=0,
                           scale=DEFAULT_SCALE, max_seq_len=4096, backend="reference")
    assert torch.equal(full[8:16].view(torch.int16), alone.view(torch.int16))
