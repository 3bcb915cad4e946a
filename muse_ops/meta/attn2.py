"""Fake of muse::attn2: the same metadata checks as the real op, then an empty output."""
from __future__ import annotations

import torch

from ..config import GROUP, HEAD_DIM
from ..validation import check_attn2_metadata


def attn2_fake(y, kv_cache, page_table, seq_lens, workspace, *, q_len, window, scale, max_seq_len,
               backend=None) -> torch.Tensor:
    check_attn2_metadata(y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len)
    return y.new_empty((y.shape[0], GROUP * kv_cache.shape[1] * HEAD_DIM))
