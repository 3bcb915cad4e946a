"""The host path of both kernels, with no cutlass import: pick the variant (the plan modules),
get its compiled function (compile_cache: memory, the ahead-of-time library, the disk cache,
else a compile by the family's kernel module, which needs the CuTe DSL), launch it. Also what
`prepare` and CI compile.

A deployment with the ahead-of-time library (muse_ops.cutedsl.aot) runs the kernels through this
module and TVM-FFI alone: neither the DSL compiler nor compile time at start-up.

Launches here run the plan's variant only. Development launches (another variant than the plan
picks, a copy of a kernel module for an A/B) are muse_ops.cutedsl.dev's, over the same helpers.
"""
from __future__ import annotations

import time

import torch

from . import aot, compile_cache, registry, runtime, shims
from .attn2_plan import Attn2Config, launch_config as attn2_launch_config, wave_ctas, workspace_layout
from .qkv_front_plan import QkvFrontConfig, k_split, launch_config as qkv_front_launch_config


def _get(op: str, key_cfg, extra_options: str, cfg, kernel=None):
    """The compiled variant cfg (compile_cache's key: op, key_cfg, options; a kernel module other
    than the package's adds its file). Only the package's own variants without extra options or
    phase stamps (QkvFrontConfig.stamps: an address of one process) reach the disk cache."""
    key = (op, key_cfg, extra_options) + ((kernel.__file__,) if kernel is not None else ())

    def build():
        return (kernel or registry.family(op).kernel_module())._compile(cfg, extra_options)
    disk = not extra_options and kernel is None and not getattr(key_cfg, "stamps", 0)
    return compile_cache.get(key, build, disk=disk, library=aot)


def compile_qkv_front(cfg: QkvFrontConfig, extra_options: str = ""):
    """The compiled qkv_front variant cfg, called with torch tensors on torch's current stream."""
    return _get("qkv_front", cfg, extra_options, cfg)


def compile_attn2(cfg: Attn2Config, extra_options: str = ""):
    """The compiled attn2 variant cfg (max_seq_len is a run-time argument: keyed without it)."""
    return _get("attn2", cfg.compile_key, extra_options, cfg)


COMPILE = {"qkv_front": compile_qkv_front, "attn2": compile_attn2}


def prepare(op: str, **deployment) -> list[dict]:
    """Compile or load every variant `op` may launch in this deployment; one report per variant:
    {"op", "variant", "how" ("aot": the ahead-of-time library, "compiled", "loaded" from the disk
    cache, "memory"), "seconds"}."""
    fam = registry.family(op)
    args = {k: deployment[k] for k in fam.deployment_args if k in deployment}   # (fp8 may be left out: bf16)
    reports = []
    for cfg in fam.plan_module().deployment_variants(**args):
        before = dict(compile_cache.stats)
        t0 = time.perf_counter()
        fn = COMPILE[op](cfg)
        if op == "qkv_front":
            shims.offer_qkv_front(cfg, fn)
        else:
            shims.offer_attn2(cfg, deployment["max_seq_len"], fn)
        how = next((k for k in ("aot", "compiled", "loaded") if compile_cache.stats[k] > before[k]), "memory")
        reports.append({"op": op, "variant": cfg, "how": how, "seconds": time.perf_counter() - t0})
    return reports


def compile_all_for_ci(op: str) -> list:
    """Compile every variant CI checks (the plan's ci_variants) for sm_90a."""
    done = registry.ci_variants(op)
    for cfg in done:
        COMPILE[op](cfg)
    return done


def launch_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, k_scale=None,
                     v_scale=None) -> None:
    """Write y and the cache rows on torch's current stream (graph-capturable; no host sync). An
    FP8 cache takes its scales (None: 1.0)."""
    m = x.shape[0]
    if m == 0:
        return
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    cfg = qkv_front_launch_config(m, kv_cache.shape[1], cos_sin is not None, positions.dtype, slots.dtype, fp8=fp8)
    fn = compile_qkv_front(cfg)
    if not fp8:
        shims.offer_qkv_front(cfg, fn)   # the C++ ops launch it from now on
    call_qkv_front(fn, x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, k_split(kv_cache.shape[1]),
                   k_scale, v_scale)


def call_qkv_front(fn, x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, split: int, k_scale=None,
                   v_scale=None) -> None:
    """Call a compiled qkv_front variant (a dummy cos_sin where the variant has no RoPE; an FP8
    cache's variant also takes the two scales, 1.0 where None)."""
    if cos_sin is None:
        cos_sin = runtime.dummy_tensor(x.device)
    k_scale, v_scale = _scales(kv_cache.dtype == torch.float8_e4m3fn, x.device, k_scale, v_scale)
    fn(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, k_scale, v_scale, split)


def _scales(fp8: bool, device, k_scale, v_scale):
    """A variant's k_scale and v_scale arguments: an FP8 cache's as 1-D fp32 tensors (1.0 where
    None); a bf16 cache's variant compiled them as None, which are still two arguments of its
    signature."""
    if not fp8:
        return None, None
    one = runtime.dummy_tensor(device, shape=(1,), fill=1.0)
    return (one if k_scale is None else k_scale.view(-1)), (one if v_scale is None else v_scale.view(-1))


def launch_attn2(y, kv_cache, page_table, seq_lens, out, workspace, error_flag, *, q_len: int,
                 window: int, scale: float, max_seq_len: int, k_scale=None, v_scale=None) -> None:
    """Write out on torch's current stream (graph-capturable; no host sync). An FP8 cache takes
    its scales (None: 1.0)."""
    r = seq_lens.shape[0]
    if r == 0:
        return
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    cfg = attn2_launch_config(r, kv_cache.shape[1], q_len, window, max_seq_len, None, runtime.sm_count(y.device),
                              fp8=fp8)
    fn = compile_attn2(cfg)
    if not fp8:
        shims.offer_attn2(cfg, max_seq_len, fn)   # the C++ ops launch it from now on
    call_attn2(fn, cfg, y, kv_cache, page_table, seq_lens, out, workspace, error_flag, scale, max_seq_len,
               k_scale, v_scale)


def call_attn2(fn, cfg: Attn2Config, y, kv_cache, page_table, seq_lens, out, workspace, error_flag, scale: float,
               max_seq_len: int, k_scale=None, v_scale=None) -> None:
    """Call a compiled attn2 variant, its workspace checked against the batch's need; an FP8
    cache's variant also takes the two scales (fp32, one element or [Hkv]; 1.0 where None)."""
    need = workspace_layout(cfg, seq_lens.shape[0], kv_cache.shape[1])[2]
    if workspace.numel() < need:
        raise ValueError(f"workspace: need {need} bytes for {seq_lens.shape[0]} requests, got {workspace.numel()}")
    k_scale, v_scale = _scales(cfg.fp8, y.device, k_scale, v_scale)
    fn(y, kv_cache, page_table, seq_lens, out, workspace, error_flag, k_scale, v_scale, float(scale),
       int(max_seq_len), wave_ctas(y.device))
