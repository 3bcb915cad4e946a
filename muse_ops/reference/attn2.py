"""attn2 in plain PyTorch (docs/DESIGN.md section 5): the numerics spec of the verify attention.

Row r * q_len + t of y is request r's token at position L - q_len + t. Query head h (KV head
h // 8) sees keys [max(0, pos - W + 1), pos] with window W, [0, pos] without, and

    o   = softmax(scale * q k^T) v                 fp32
    out = bf16(sigmoid(gate) * rmsnorm(bf16(o)))   per head, weightless, eps 1e-5, fp32 math

An FP8 cache holds e4m3 keys and values: key = float(e4m3) * k_scale, value = float(e4m3) *
v_scale, per tensor or per KV head (None: 1.0); the rest is the same fp32 math.

Vectorised: every request's pages are gathered up to the page table's width and masked per
key, then one batched matmul per product. Cache rows past a request's length may hold anything
(NaN included), so masked keys are zeroed in V, not only in the logits (0 * NaN = NaN).
"""
from __future__ import annotations

import torch

from ..config import GROUP, HEAD_DIM, PAGE_SIZE, RMS_EPS, column_offsets
from .qkv_front import per_head


def attn2_ref(y: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
              *, q_len: int, window: int, scale: float, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> torch.Tensor:
    num_pages, kv_heads = kv_cache.shape[0], kv_cache.shape[1]
    hq = GROUP * kv_heads
    r = seq_lens.shape[0]
    cols = column_offsets(kv_heads)
    out = y.new_empty((q_len * r, hq * HEAD_DIM))
    if r == 0:
        return out
    width = page_table.shape[1]
    keys = width * PAGE_SIZE

    # Gather every request's pages; entries past its last page are masked below, whatever they hold.
    pages = page_table.long().clamp(0, num_pages - 1)                       # [R, P]
    kv = kv_cache[pages].permute(0, 2, 1, 3, 4).reshape(r, kv_heads, keys, 2 * HEAD_DIM)
    k = kv[..., :HEAD_DIM].float()                                          # [R, Hkv, T, 64]
    v = kv[..., HEAD_DIM:].float()
    if kv_cache.dtype == torch.float8_e4m3fn:                                # dequantize per KV head
        k = k * per_head(k_scale, kv_heads, k.device)[None, :, None, None]
        v = v * per_head(v_scale, kv_heads, v.device)[None, :, None, None]

    # Query rows of request r, KV head g: token t, head j -> [R, Hkv, q_len * 8, 64]
    q = y[:, :hq * HEAD_DIM].float().view(r, q_len, kv_heads, GROUP, HEAD_DIM)
    q = q.permute(0, 2, 1, 3, 4).reshape(r, kv_heads, q_len * GROUP, HEAD_DIM)

    L = seq_lens.long()
    pos = (L[:, None] - q_len + torch.arange(q_len, device=y.device))       # [R, q_len]
    key = torch.arange(keys, device=y.device)
    visible = key[None, None, :] <= pos[:, :, None]                          # causal + length
    if window > 0:
        visible &= key[None, None, :] > pos[:, :, None] - window
    visible = visible.repeat_interleave(GROUP, dim=1)[:, None]              # [R, 1, q_len*8, T]
    # Keys some row of the request sees; the rest (past L, before the window) may be garbage.
    needed = key[None, :] < L[:, None]
    if window > 0:
        needed &= key[None, :] > pos[:, :1] - window
    needed = needed[:, None, :, None]                                       # [R, 1, T, 1]
    v = torch.where(needed, v, 0.0)
    k = torch.where(needed, k, 0.0)

    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.matmul(p, v).to(torch.bfloat16).float()                       # [R, Hkv, q_len*8, 64]

    o = o.view(r, kv_heads, q_len, GROUP, HEAD_DIM).permute(0, 2, 1, 3, 4).reshape(r * q_len, hq, HEAD_DIM)
    gate = y[:, cols["gate"]:].float().view(r * q_len, hq, HEAD_DIM)
    normed = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + RMS_EPS)
    out.copy_((torch.sigmoid(gate) * normed).view(r * q_len, hq * HEAD_DIM))
    return out
