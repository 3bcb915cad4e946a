"""A float64 evaluation of the whole layer step, request by request, for self-checks (the demo,
the benchmark's sanity pass). It restates DESIGN.md sections 3-4 directly, with the bf16
roundings where the formulas put them, and shares no code with `reference/`.
"""
from __future__ import annotations

import torch

from .config import GROUP, HEAD_DIM, PAGE_SIZE, RMS_EPS

BF16 = torch.bfloat16


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(BF16).double()


def _norm64(v: torch.Tensor) -> torch.Tensor:
    return v * torch.rsqrt((v * v).mean(-1, keepdim=True) + RMS_EPS)


def qkv_front_f64(x, weight, positions, cos_sin, kv_heads: int) -> torch.Tensor:
    """y as float64 holding bf16 values: [M, 1152*Hkv]."""
    hq = GROUP * kv_heads
    p = _bf16(x.double() @ weight.double().t())
    m = p.shape[0]
    heads = p.view(m, -1, HEAD_DIM).clone()
    n = _bf16(_norm64(heads[:, : hq + kv_heads]))
    if cos_sin is not None:
        cs = cos_sin.double()[positions.long()]
        c, s = cs[:, None, :32], cs[:, None, 32:]
        rot = torch.empty_like(n)
        rot[..., 0::2] = _bf16(n[..., 0::2] * c - n[..., 1::2] * s)
        rot[..., 1::2] = _bf16(n[..., 1::2] * c + n[..., 0::2] * s)
        n = rot
    heads[:, : hq + kv_heads] = n
    return heads.view(m, -1)


def attn2_f64(y, kv_cache, page_table, seq_lens, *, q_len: int, window: int, scale: float) -> torch.Tensor:
    """out as float64 (before the final bf16 rounding): [q_len*R, Hq*64]."""
    kv_heads = kv_cache.shape[1]
    hq = GROUP * kv_heads
    y = y.double()
    gate_col = (hq + 2 * kv_heads) * HEAD_DIM
    out = torch.empty(y.shape[0], hq * HEAD_DIM, dtype=torch.float64, device=y.device)
    for r, length in enumerate(seq_lens.tolist()):
        pages = page_table[r, : -(-length // PAGE_SIZE)].long()
        rows = kv_cache[pages].double().permute(1, 0, 2, 3).reshape(kv_heads, -1, 2 * HEAD_DIM)[:, :length]
        for t in range(q_len):
            row = r * q_len + t
            pos = length - q_len + t
            lo = max(0, pos - window + 1) if window else 0
            for h in range(hq):
                g = h // GROUP
                k = rows[g, lo: pos + 1, :HEAD_DIM]
                v = rows[g, lo: pos + 1, HEAD_DIM:]
                q = y[row, h * HEAD_DIM:(h + 1) * HEAD_DIM]
                w = torch.softmax(scale * (k @ q), dim=0)
                o = _bf16(w @ v)
                gate = y[row, gate_col + h * HEAD_DIM: gate_col + (h + 1) * HEAD_DIM]
                out[row, h * HEAD_DIM:(h + 1) * HEAD_DIM] = torch.sigmoid(gate) * _norm64(o)
    return out


def within_tolerance(got: torch.Tensor, ref64: torch.Tensor) -> tuple[bool, float, float]:
    """DESIGN.md section 7: |err| <= 2e-2 + 1e-2|ref| everywhere and mean |err| <= 2e-3."""
    err = (got.double() - ref64).abs()
    ok = bool((err <= 2e-2 + 1e-2 * ref64.abs()).all()) and float(err.mean()) <= 2e-3
    return ok, float(err.max()), float(err.mean())
