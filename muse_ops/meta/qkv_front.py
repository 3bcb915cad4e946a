"""Fake of muse::qkv_front: y's metadata, nothing checked.

The fakes raise nothing: torch.compile wraps any exception raised while it traces in its own
error type (torch._dynamo.exc.TorchRuntimeError), which an engine's `except MuseInputError` would
miss. The real op checks its arguments when it runs, eager or compiled, before anything is
written (docs/DESIGN.md section 8). The cache write has no metadata effect (it is in place), so
nothing else is produced."""
from __future__ import annotations

import torch


def _dim(t, i: int):
    """t.shape[i], or 0 where a bad argument has no such dimension (the run-time check names it)."""
    return t.shape[i] if isinstance(t, torch.Tensor) and t.dim() > i else 0


def qkv_front_fake(x, weight, positions, slots, cos_sin, kv_cache, k_scale=None, v_scale=None, *,
                   backend=None) -> torch.Tensor:
    return x.new_empty((_dim(x, 0), _dim(weight, 0)), dtype=torch.bfloat16)
