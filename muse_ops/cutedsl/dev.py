"""Development launches of both kernels: a variant other than the plan's (an override of its
launch config: a tile, a layout, a knob) or a copy of a kernel module (an A/B of two versions of
a kernel's source). The A/B tools, the kernels' own tests and the bench's chain cases use it; the
package's production paths (muse_ops.ops, the C++ ops) never do.

Variants of a kernel copy are keyed by the copy's file and never written to the disk cache, and
none of these launches is offered to the C++ ops.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys

import torch

from . import launch, runtime
from .attn2_plan import launch_config as attn2_launch_config
from .qkv_front_plan import k_split, launch_config as qkv_front_launch_config


@functools.lru_cache(maxsize=None)
def kernel_copy(path: str):
    """The copy of a kernel module at path, imported inside this package (its relative imports
    resolve here), for an A/B; one module per path."""
    name = f"{__package__}._alt_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod           # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def compile_qkv_front(cfg, extra_options: str = "", kernel=None):
    """A qkv_front variant compiled from the package's kernel module, or from `kernel` (a copy)."""
    return launch._get("qkv_front", cfg, extra_options, cfg, kernel)


def compile_attn2(cfg, extra_options: str = "", kernel=None):
    return launch._get("attn2", cfg.compile_key, extra_options, cfg, kernel)


def launch_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, override: dict | None = None,
                     kernel=None, k_scale=None, v_scale=None) -> None:
    """launch.launch_qkv_front with the plan's config overridden (qkv_front_plan.launch_config's
    override; "split" forces another K split) and/or another kernel module."""
    if x.shape[0] == 0:
        return
    over = dict(override or {})
    split = over.pop("split", None) or k_split(kv_cache.shape[1])
    cfg = qkv_front_launch_config(x.shape[0], kv_cache.shape[1], cos_sin is not None, positions.dtype, slots.dtype,
                                  over, fp8=kv_cache.dtype == torch.float8_e4m3fn)
    fn = compile_qkv_front(cfg, kernel=kernel)
    launch.call_qkv_front(fn, x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, split, k_scale, v_scale)


def launch_attn2(y, kv_cache, page_table, seq_lens, out, workspace, error_flag, *, q_len: int, window: int,
                 scale: float, max_seq_len: int, override: dict | None = None, kernel=None, k_scale=None,
                 v_scale=None) -> None:
    """launch.launch_attn2 with the plan's config overridden (attn2_plan.launch_config's override:
    "layout", "ctas_per_sm", ...) and/or another kernel module."""
    if seq_lens.shape[0] == 0:
        return
    cfg = attn2_launch_config(seq_lens.shape[0], kv_cache.shape[1], q_len, window, max_seq_len, override,
                              runtime.sm_count(y.device), fp8=kv_cache.dtype == torch.float8_e4m3fn)
    fn = compile_attn2(cfg, kernel=kernel)
    launch.call_attn2(fn, cfg, y, kv_cache, page_table, seq_lens, out, workspace, error_flag, scale, max_seq_len,
                      k_scale, v_scale)
