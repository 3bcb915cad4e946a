"""Fake of muse::qkv_front: the same metadata checks as the real op, then an empty y.
The cache write has no metadata effect (it is in place), so nothing else is produced."""
from __future__ import annotations

import torch

from ..validation import check_qkv_front_metadata


def qkv_front_fake(x, weight, positions, slots, cos_sin, kv_cache, *, backend=None) -> torch.Tensor:
    check_qkv_front_metadata(x, weight, positions, slots, cos_sin, kv_cache)
    return x.new_empty((x.shape[0], weight.shape[0]))
