"""A layer built from a checkpoint's separate q / k / v / gate / o projections for one
tensor-parallel rank (MuseAttentionDecode.from_projections) against an unfused layer written from
torch primitives on the same weights: separate projections, per-head RMS norm, RoPE,
scaled_dot_product_attention over the request's keys, norm, gate, o_proj; TP 1, 2 and 8."""
import pytest
import torch
import torch.nn.functional as F

import muse_ops
from muse_ops import MuseAttentionDecode, PagedBatch
from muse_ops.config import GROUP, HEAD_DIM, HIDDEN, RMS_EPS
from muse_ops.testing import assert_close, bf16

TOTAL_KV = 8           # a checkpoint of 8 KV heads (64 query heads) splits over 1, 2 and 8 ranks


@pytest.fixture(scope="module")
def checkpoint():
    g = torch.Generator().manual_seed(11)

    def proj(rows, cols):
        return (torch.randn(rows, cols, generator=g) * cols ** -0.5).to(torch.bfloat16)
    hq = GROUP * TOTAL_KV
    return {"q": proj(hq * HEAD_DIM, HIDDEN), "k": proj(TOTAL_KV * HEAD_DIM, HIDDEN),
            "v": proj(TOTAL_KV * HEAD_DIM, HIDDEN), "gate": proj(hq * HEAD_DIM, HIDDEN),
            "o": proj(HIDDEN, hq * HEAD_DIM)}


def rms(t):
    return t * torch.rsqrt(t.square().mean(-1, keepdim=True) + RMS_EPS)


def rope(t, cos, sin):
    """Interleaved pairs (2i, 2i+1) of t [..., 64]; cos, sin [..., 32]."""
    even, odd = t[..., 0::2], t[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


def unfused_layer(ckpt, x, history_k, history_v, lengths, tp_rank, tp_size, window, scale, cos_sin, q_len):
    """This rank's share of the layer's output, float64, from the checkpoint's own projections."""
    hkv = TOTAL_KV // tp_size
    hq = GROUP * hkv
    kv_rows = slice(tp_rank * hkv * HEAD_DIM, (tp_rank + 1) * hkv * HEAD_DIM)
    q_rows = slice(tp_rank * hq * HEAD_DIM, (tp_rank + 1) * hq * HEAD_DIM)
    x = x.double()
    q = bf16(F.linear(x, ckpt["q"][q_rows].double())).view(-1, hq, HEAD_DIM)
    k = bf16(F.linear(x, ckpt["k"][kv_rows].double())).view(-1, hkv, HEAD_DIM)
    v = bf16(F.linear(x, ckpt["v"][kv_rows].double())).view(-1, hkv, HEAD_DIM)
    gate = bf16(F.linear(x, ckpt["gate"][q_rows].double())).view(-1, hq, HEAD_DIM)
    q, k = bf16(rms(q)), bf16(rms(k))
    outs = []
    for r, length in enumerate(lengths):
        rows = slice(r * q_len, (r + 1) * q_len)
        pos = torch.arange(length - q_len, length)
        if cos_sin is not None:
            cs = cos_sin.double()[pos]
            q_r = bf16(rope(q[rows], cs[:, None, :32], cs[:, None, 32:]))
            k_r = bf16(rope(k[rows], cs[:, None, :32], cs[:, None, 32:]))
        else:
            q_r, k_r = q[rows], k[rows]
        keys = torch.cat((history_k[r], k_r), dim=0)                 # [L, hkv, 64]
        values = torch.cat((history_v[r], v[rows]), dim=0)
        key_pos = torch.arange(length)
        mask = key_pos[None, :] <= pos[:, None]
        if window:
            mask &= key_pos[None, :] > pos[:, None] - window
        o = F.scaled_dot_product_attention(
            q_r.transpose(0, 1),                                                   # [hq, q_len, 64]
            keys.transpose(0, 1).repeat_interleave(GROUP, dim=0),                  # [hq, L, 64]
            values.transpose(0, 1).repeat_interleave(GROUP, dim=0),
            attn_mask=mask, scale=scale).transpose(0, 1)                           # [q_len, hq, 64]
        outs.append(bf16(torch.sigmoid(gate[rows]) * rms(bf16(o))).reshape(q_len, -1))
    attn = torch.cat(outs, dim=0)
    o_cols = slice(tp_rank * hq * HEAD_DIM, (tp_rank + 1) * hq * HEAD_DIM)
    return F.linear(attn, ckpt["o"][:, o_cols].double())


@pytest.mark.parametrize("tp_size,tp_rank,window", [(1, 0, 0), (2, 1, 2048), (8, 0, 0), (8, 7, 2048)])
def test_layer_from_projections_matches_an_unfused_layer(checkpoint, tp_size, tp_rank, window):
    q_len, lengths = 8, [50, 2100]
    layer = MuseAttentionDecode.from_projections(checkpoint["q"], checkpoint["k"], checkpoint["v"], checkpoint["gate"],
                                                 checkpoint["o"], tp_rank=tp_rank, tp_size=tp_size, window=window,
                                                 max_seq_len=4096, max_batch=2)
    hkv = layer.config.kv_heads
    assert hkv == TOTAL_KV // tp_size and layer.qkv_weight.shape == (1152 * hkv, HIDDEN)
    g = torch.Generator().manual_seed(tp_size * 10 + tp_rank)
    num_pages = sum(-(-n // 16) for n in lengths) + 3
    b = PagedBatch.build(lengths, num_pages, q_len, generator=g)
    cache = muse_ops.allocate_kv_cache(num_pages, hkv)
    # the history (every token before the block), in the paged cache and as dense tensors
    history_k, history_v = [], []
    for r, length in enumerate(lengths):
        hist = torch.randn(length - q_len, hkv, 2 * HEAD_DIM, generator=g).to(torch.bfloat16)
        t = torch.arange(length - q_len)
        cache[b.page_table[r].long()[t // 16], :, t % 16] = hist
        history_k.append(hist[..., :HEAD_DIM].double())
        history_v.append(hist[..., HEAD_DIM:].double())
    x = torch.randn(len(lengths) * q_len, HIDDEN, generator=g).to(torch.bfloat16)
    with torch.inference_mode():
        out = layer(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    ref = unfused_layer(checkpoint, x, history_k, history_v, lengths, tp_rank, tp_size, window,
                        layer.config.scale, layer.cos_sin, q_len)
    assert out.shape == (len(lengths) * q_len, HIDDEN)
    assert_close(out, ref, f"TP {tp_size} rank {tp_rank}")


def test_bad_tensor_parallel_splits_raise(checkpoint):
    with pytest.raises(ValueError, match="do not split"):
        muse_ops.weights.fuse_projections(checkpoint["q"], checkpoint["k"], checkpoint["v"], checkpoint["gate"], 0, 3)
    with pytest.raises(ValueError, match="tp_rank"):
        muse_ops.weights.fuse_projections(checkpoint["q"], checkpoint["k"], checkpoint["v"], checkpoint["gate"], 2, 2)
    with pytest.raises(ValueError, match="k_proj"):
        muse_ops.weights.fuse_projections(checkpoint["q"], checkpoint["k"][:100], checkpoint["v"], checkpoint["gate"])
