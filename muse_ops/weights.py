"""A checkpoint's attention weights -> the fused layer of one tensor-parallel rank.

A checkpoint holds, for all heads of a layer, separate projections with the output rows of
head h at rows h * 64 .. h * 64 + 63:
    q_proj     [Hq_all * 64, 8192]      gate_proj  [Hq_all * 64, 8192]
    k_proj     [Hkv_all * 64, 8192]     v_proj     [Hkv_all * 64, 8192]
    o_proj     [8192, Hq_all * 64]      (optional)
with Hq_all = 8 Hkv_all and query head h reading KV head h // 8. Tensor parallelism splits the
KV heads evenly: rank r of a world of size T keeps KV heads r Hkv .. (r + 1) Hkv - 1 (Hkv =
Hkv_all / T) and the 8 Hkv query and gate heads of their groups, in order. Its fused projection
weight [1152 Hkv, 8192] stacks, in this order, its q rows | k rows | v rows | gate rows (the
column order of qkv_front's y). Its o_proj keeps the matching 8 Hkv x 64 input columns (a
row-parallel linear: the ranks' outputs are summed by the caller's all-reduce).
"""
from __future__ import annotations

import torch

from .config import GROUP, HEAD_DIM, HIDDEN


def _rows(w: torch.Tensor, name: str, heads: int) -> None:
    if w.dim() != 2 or w.shape != (heads * HEAD_DIM, HIDDEN):
        raise ValueError(f"{name} must be [{heads} * {HEAD_DIM}, {HIDDEN}], got {list(w.shape)}")


def rank_kv_heads(total_kv_heads: int, tp_rank: int, tp_size: int) -> range:
    """The KV heads rank tp_rank keeps."""
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, tp_size), got rank {tp_rank} of {tp_size}")
    if total_kv_heads % tp_size:
        raise ValueError(f"{total_kv_heads} KV heads do not split over {tp_size} ranks")
    per_rank = total_kv_heads // tp_size
    return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)


def fuse_projections(q_proj: torch.Tensor, k_proj: torch.Tensor, v_proj: torch.Tensor, gate_proj: torch.Tensor,
                     tp_rank: int = 0, tp_size: int = 1) -> torch.Tensor:
    """The fused [1152 Hkv, 8192] weight of rank tp_rank: its q | k | v | gate rows."""
    total_kv = k_proj.shape[0] // HEAD_DIM
    _rows(k_proj, "k_proj", total_kv)
    _rows(v_proj, "v_proj", total_kv)
    _rows(q_proj, "q_proj", GROUP * total_kv)
    _rows(gate_proj, "gate_proj", GROUP * total_kv)
    kv = rank_kv_heads(total_kv, tp_rank, tp_size)
    kv_rows = slice(kv.start * HEAD_DIM, kv.stop * HEAD_DIM)
    q_rows = slice(GROUP * kv.start * HEAD_DIM, GROUP * kv.stop * HEAD_DIM)
    return torch.cat((q_proj[q_rows], k_proj[kv_rows], v_proj[kv_rows], gate_proj[q_rows]), dim=0)


def o_proj_columns(o_proj: torch.Tensor, total_kv_heads: int, tp_rank: int = 0, tp_size: int = 1) -> torch.Tensor:
    """The [8192, 8 Hkv 64] input columns of o_proj that rank tp_rank multiplies."""
    if o_proj.dim() != 2 or o_proj.shape != (HIDDEN, GROUP * total_kv_heads * HEAD_DIM):
        raise ValueError(f"o_proj must be [{HIDDEN}, {GROUP * total_kv_heads} * {HEAD_DIM}], got {list(o_proj.shape)}")
    kv = rank_kv_heads(total_kv_heads, tp_rank, tp_size)
    return o_proj[:, GROUP * kv.start * HEAD_DIM: GROUP * kv.stop * HEAD_DIM]
