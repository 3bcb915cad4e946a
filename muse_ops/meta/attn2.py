"""Fake of muse::attn2: out's metadata, nothing checked (see meta/qkv_front.py: the real op
checks its arguments when it runs, so a compiled call raises the package's own MuseInputError)."""
from __future__ import annotations

import torch

from ..config import GROUP, HEAD_DIM
from .qkv_front import _dim


def attn2_fake(y, kv_cache, page_table, seq_lens, workspace, k_scale=None, v_scale=None, *, q_len, window, scale,
               max_seq_len, backend=None) -> torch.Tensor:
    return y.new_empty((_dim(y, 0), GROUP * _dim(kv_cache, 1) * HEAD_DIM), dtype=torch.bfloat16)
