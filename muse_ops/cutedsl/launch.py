"""The host path of both kernels, with no cutlass import: pick the variant (the plan modules),
get its compiled function (compile_cache: the ahead-of-time library, memory, the disk cache,
else a compile, which imports the kernel module and needs the CuTe DSL), launch it.

A deployment with the ahead-of-time library (muse_ops.cutedsl.aot) runs the kernels through this
module and TVM-FFI alone: neither the DSL compiler nor compile time at start-up.
"""
from __future__ import annotations

from . import compile_cache, runtime
from .attn2_plan import Attn2Config, launch_config as attn2_launch_config, wave_ctas, workspace_layout
from .qkv_front_plan import QkvFrontConfig, k_split, launch_config as qkv_front_launch_config


def compile_qkv_front(cfg: QkvFrontConfig, extra_options: str = ""):
    """The compiled qkv_front variant cfg, called with torch tensors on torch's current stream."""
    def build():
        from . import qkv_front
        return qkv_front._compile(cfg, extra_options)
    return compile_cache.get(("qkv_front", cfg, extra_options), build, disk=not extra_options)


def compile_attn2(cfg: Attn2Config, extra_options: str = ""):
    """The compiled attn2 variant cfg (max_seq_len is a run-time argument: keyed without it)."""
    def build():
        from . import attn2
        return attn2._compile(cfg, extra_options)
    return compile_cache.get(("attn2", cfg.compile_key, extra_options), build, disk=not extra_options)


COMPILE = {"qkv_front": compile_qkv_front, "attn2": compile_attn2}


def launch_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag,
                     _cfg_override: dict | None = None) -> None:
    """Write y and the cache rows on torch's current stream (graph-capturable; no host sync)."""
    m = x.shape[0]
    if m == 0:
        return
    rope = cos_sin is not None
    over = dict(_cfg_override or {})
    split = over.pop("split", None) or k_split(kv_cache.shape[1])     # dev tools may force another split
    cfg = qkv_front_launch_config(m, rope, positions.dtype, slots.dtype, over)
    fn = compile_qkv_front(cfg)
    if not rope:
        cos_sin = runtime.dummy_tensor(x.device)
    fn(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, split)


def launch_attn2(y, kv_cache, page_table, seq_lens, out, workspace, error_flag, *, q_len: int,
                 window: int, scale: float, max_seq_len: int, _cfg_override: dict | None = None) -> None:
    """Write out on torch's current stream (graph-capturable; no host sync)."""
    r = seq_lens.shape[0]
    if r == 0:
        return
    cfg = attn2_launch_config(r, kv_cache.shape[1], q_len, window, max_seq_len, _cfg_override)
    need = workspace_layout(cfg, r, kv_cache.shape[1])[2]
    if workspace.numel() < need:
        raise ValueError(f"workspace: need {need} bytes for {r} requests, got {workspace.numel()}")
    fn = compile_attn2(cfg)
    fn(y, kv_cache, page_table, seq_lens, out, workspace, error_flag, float(scale), int(max_seq_len),
       wave_ctas(y.device))
