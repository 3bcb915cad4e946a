"""qkv_front in plain PyTorch (docs/DESIGN.md section 4): the numerics spec of the fused front.

    p  = bf16(x @ weight^T)                      fp32 accumulation
    q', k' per head: n = bf16(p_h * rsqrt(mean(p_h^2) + eps))   then, with cos_sin, interleaved RoPE
    y  = q' | k' | v | gate                       v and gate are p unchanged
    kv_cache[slot // 16, h, slot % 16] = k'_h | v_h   for every slot >= 0
    (an FP8 cache: e4m3(k'_h / k_scale) | e4m3(v_h / v_scale), fp32 quotients rounded to nearest
    even and saturated to +-448; a NaN stays NaN, +-inf becomes +-448)

Vectorised over tokens and heads; readable over fast. Runs on any device.
"""
from __future__ import annotations

import torch

from ..config import FP8_MAX, GROUP, HEAD_DIM, PAGE_SIZE, RMS_EPS, ROPE_THETA


def rope_cos_sin(max_positions: int, theta: float = ROPE_THETA, device=None) -> torch.Tensor:
    """fp32 [max_positions, 64]: cos(pos * f_i) in columns 0:32, sin in 32:64, f_i = theta^(-2i/64).

    Built the way SGLang's RotaryEmbedding builds its cache, once per deployment."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64, device=device) / HEAD_DIM))
    pos = torch.arange(max_positions, dtype=torch.float64, device=device)
    freqs = torch.outer(pos, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(torch.float32)


def head_rmsnorm(p: torch.Tensor) -> torch.Tensor:
    """Weightless RMS norm over the last dim (64) in fp32, rounded to bf16."""
    p = p.float()
    return (p * torch.rsqrt(p.square().mean(-1, keepdim=True) + RMS_EPS)).to(torch.bfloat16)


def interleaved_rope(n: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on interleaved pairs (2i, 2i+1) of bf16 n [..., 64]; cos, sin fp32 [..., 32]."""
    n = n.float()
    even, odd = n[..., 0::2], n[..., 1::2]
    out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
    return out.flatten(-2).to(torch.bfloat16)


def per_head(scale: torch.Tensor | None, kv_heads: int, device) -> torch.Tensor:
    """fp32 [Hkv] of a scale given per tensor (one element) or per KV head; None is 1.0."""
    if scale is None:
        return torch.ones(kv_heads, dtype=torch.float32, device=device)
    return scale.to(device=device, dtype=torch.float32).reshape(-1).expand(kv_heads)


def quantize_rows(rows: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> torch.Tensor:
    """bf16 cache rows [..., Hkv, 128] (k' | v) as FP8 cache rows: e4m3 of the fp32 quotients by the
    scales of their KV head, rounded to nearest even, saturated to +-448 (NaN stays NaN)."""
    kv_heads = rows.shape[-2]
    ks = per_head(k_scale, kv_heads, rows.device)[:, None]
    vs = per_head(v_scale, kv_heads, rows.device)[:, None]
    f = rows.float()
    q = torch.cat((f[..., :HEAD_DIM] / ks, f[..., HEAD_DIM:] / vs), dim=-1)
    return q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def qkv_front_ref(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                  cos_sin: torch.Tensor | None, kv_cache: torch.Tensor, k_scale: torch.Tensor | None = None,
                  v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """y bf16 [M, N]; writes the new keys and values into kv_cache at slots (in place), quantized
    with k_scale / v_scale where the cache is float8_e4m3fn."""
    kv_heads = kv_cache.shape[1]
    hq = GROUP * kv_heads
    m = x.shape[0]
    p = (x.float() @ weight.float().t()).to(torch.bfloat16)            # [M, N]
    heads = p.view(m, -1, HEAD_DIM)                                     # [M, 2Hq + 2Hkv, 64]
    qk = head_rmsnorm(heads[:, : hq + kv_heads])                        # q heads then k heads
    if cos_sin is not None:
        rows = cos_sin[positions.long()]                                # [M, 64]
        cos = rows[:, None, : HEAD_DIM // 2]
        sin = rows[:, None, HEAD_DIM // 2:]
        qk = interleaved_rope(qk, cos, sin)
    y = torch.cat((qk, heads[:, hq + kv_heads:]), dim=1).view(m, -1)

    rows = torch.cat((qk[:, hq:], heads[:, hq + kv_heads: hq + 2 * kv_heads]), dim=-1)   # [M, Hkv, 128]
    if kv_cache.dtype == torch.float8_e4m3fn:
        rows = quantize_rows(rows, k_scale, v_scale)
    _insert(kv_cache, slots, rows)
    return y


def _insert(kv_cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """kv_cache[slot // 16, :, slot % 16] = rows[i] for every slot >= 0, without a host sync (so
    the reference can be captured in a CUDA graph): a padding token (slot < 0) rewrites the row of
    the first kept token with that token's own values, so duplicated targets carry identical
    data; with no kept token at all, row 0 is rewritten with what it holds."""
    m = slots.shape[0]
    keep = slots >= 0
    first = keep.to(torch.int32).argmax()
    src = torch.where(keep, torch.arange(m, device=slots.device), first)
    any_kept = keep.any()
    target = torch.where(any_kept, slots.long()[src], 0)
    page, row = target // PAGE_SIZE, target % PAGE_SIZE
    # the bits, as integers of the element's width (torch.where has no float8 kernels)
    bits = torch.int16 if kv_cache.element_size() == 2 else torch.uint8
    cache, rows = kv_cache.view(bits), rows.to(kv_cache.dtype).view(bits)
    # advanced indices around a slice put the token dim first: the target is [M, Hkv, 128]
    old = cache[page, :, row]
    cache[page, :, row] = torch.where(any_kept, rows[src], old)
