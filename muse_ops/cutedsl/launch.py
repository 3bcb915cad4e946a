"""The host path of both kernels, with no cutlass import: pick the variant (the plan modules),
get its compiled function (compile_cache: memory, the ahead-of-time library, the disk cache,
else a compile by the family's kernel module, which needs the CuTe DSL), launch it. Also what
`prepare` and CI compile.

A deployment with the ahead-of-time library (muse_ops.cutedsl.aot) runs the kernels through this
module and TVM-FFI alone: neither the DSL compiler nor compile time at start-up.

_kernel (development tools only): a copy of a kernel module (kernel_copy) to compile instead of
the package's (an A/B of two versions of the kernel source); its variants are keyed by the copy's
file and never written to the disk cache; nor are variants instrumented with phase stamps
(QkvFrontConfig.stamps: an address of one process).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time

from . import aot, compile_cache, registry, runtime, shims
from .attn2_plan import Attn2Config, launch_config as attn2_launch_config, wave_ctas, workspace_layout
from .qkv_front_plan import QkvFrontConfig, k_split, launch_config as qkv_front_launch_config


def _get(op: str, key_cfg, extra_options: str, cfg, kernel):
    key = (op, key_cfg, extra_options) + ((kernel.__file__,) if kernel is not None else ())

    def build():
        return (kernel or registry.family(op).kernel_module())._compile(cfg, extra_options)
    disk = not extra_options and kernel is None and not getattr(key_cfg, "stamps", 0)
    return compile_cache.get(key, build, disk=disk, library=aot)


@functools.lru_cache(maxsize=None)
def kernel_copy(path: str):
    """The copy of a kernel module at path, imported inside this package (its relative imports
    resolve here), for a _kernel A/B; one module per path."""
    name = f"{__package__}._alt_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod           # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def compile_qkv_front(cfg: QkvFrontConfig, extra_options: str = "", _kernel=None):
    """The compiled qkv_front variant cfg, called with torch tensors on torch's current stream."""
    return _get("qkv_front", cfg, extra_options, cfg, _kernel)


def compile_attn2(cfg: Attn2Config, extra_options: str = "", _kernel=None):
    """The compiled attn2 variant cfg (max_seq_len is a run-time argument: keyed without it)."""
    return _get("attn2", cfg.compile_key, extra_options, cfg, _kernel)


COMPILE = {"qkv_front": compile_qkv_front, "attn2": compile_attn2}


def prepare(op: str, **deployment) -> list[dict]:
    """Compile or load every variant `op` may launch in this deployment; one report per variant:
    {"op", "variant", "how" ("aot": the ahead-of-time library, "compiled", "loaded" from the disk
    cache, "memory"), "seconds"}."""
    fam = registry.family(op)
    args = {k: deployment[k] for k in fam.deployment_args}
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


def launch_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag,
                     _cfg_override: dict | None = None, _kernel=None) -> None:
    """Write y and the cache rows on torch's current stream (graph-capturable; no host sync)."""
    m = x.shape[0]
    if m == 0:
        return
    rope = cos_sin is not None
    over = dict(_cfg_override or {})
    split = over.pop("split", None) or k_split(kv_cache.shape[1])     # dev tools may force another split
    cfg = qkv_front_launch_config(m, kv_cache.shape[1], rope, positions.dtype, slots.dtype, over)
    fn = compile_qkv_front(cfg, _kernel=_kernel)
    if not _cfg_override and _kernel is None:
        shims.offer_qkv_front(cfg, fn)   # the C++ ops launch it from now on
    if not rope:
        cos_sin = runtime.dummy_tensor(x.device)
    fn(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag, split)


def launch_attn2(y, kv_cache, page_table, seq_lens, out, workspace, error_flag, *, q_len: int,
                 window: int, scale: float, max_seq_len: int, _cfg_override: dict | None = None,
                 _kernel=None) -> None:
    """Write out on torch's current stream (graph-capturable; no host sync)."""
    r = seq_lens.shape[0]
    if r == 0:
        return
    cfg = attn2_launch_config(r, kv_cache.shape[1], q_len, window, max_seq_len, _cfg_override,
                              runtime.sm_count(y.device))
    need = workspace_layout(cfg, r, kv_cache.shape[1])[2]
    if workspace.numel() < need:
        raise ValueError(f"workspace: need {need} bytes for {r} requests, got {workspace.numel()}")
    fn = compile_attn2(cfg, _kernel=_kernel)
    if not _cfg_override and _kernel is None:
        shims.offer_attn2(cfg, max_seq_len, fn)
    fn(y, kv_cache, page_table, seq_lens, out, workspace, error_flag, float(scale), int(max_seq_len),
       wave_ctas(y.device))
