"""The CuTe DSL kernel families of the package, one entry per op, read by the backend selection,
`prepare` and the CI compile test (so none of them names a kernel module itself).

Each family has a plan module (pure Python, importable anywhere) with
    can_implement(device, **variant) -> (ok, why)
    deployment_variants(**deployment) -> [config, ...]   every variant a deployment may launch
    ci_variants() -> [config, ...]                        what CI compiles on the CPU
and a kernel module (imports cutlass) with
    compile_variant(config)                               compile or load one variant
    prepare(**deployment)                                 compile or load the deployment's variants
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KernelFamily:
    op: str
    plan: str      # module path of the plan (no cutlass import)
    kernel: str    # module path of the kernel
    deployment_args: tuple[str, ...]   # the DeploymentConfig fields its variants depend on

    def plan_module(self):
        return importlib.import_module(self.plan)

    def kernel_module(self):
        return importlib.import_module(self.kernel)


FAMILIES: dict[str, KernelFamily] = {
    "attn2": KernelFamily("attn2", "muse_ops.cutedsl.attn2_plan", "muse_ops.cutedsl.attn2",
                          ("kv_heads", "q_len", "window", "max_seq_len")),
    "qkv_front": KernelFamily("qkv_front", "muse_ops.cutedsl.qkv_front_plan", "muse_ops.cutedsl.qkv_front",
                              ("kv_heads", "rope")),
}


def family(op: str) -> KernelFamily:
    try:
        return FAMILIES[op]
    except KeyError:
        raise ValueError(f"no CuTe DSL kernel family for op {op!r} (have {sorted(FAMILIES)})") from None


def support(op: str, device: torch.device, **variant) -> tuple[bool, str]:
    """Whether the family of `op` can run this variant on `device`, and why not (never raises)."""
    try:
        return family(op).plan_module().can_implement(device, **variant)
    except Exception as exc:  # noqa: BLE001  (a broken install must say why, not crash the selection)
        return False, f"CuTe DSL backend unusable: {type(exc).__name__}: {exc}"


def prepare(op: str, **deployment) -> list[dict]:
    """Compile or load every variant `op` may launch in this deployment; one report per variant:
    {"op", "variant", "how" ("aot": the ahead-of-time library, "compiled", "loaded" from the disk
    cache, "memory"), "seconds"}."""
    from . import compile_cache, launch
    fam = family(op)
    args = {k: deployment[k] for k in fam.deployment_args}
    reports = []
    for cfg in fam.plan_module().deployment_variants(**args):
        before = dict(compile_cache.stats)
        t0 = time.perf_counter()
        launch.COMPILE[op](cfg)
        how = next((k for k in ("aot", "compiled", "loaded") if compile_cache.stats[k] > before[k]), "memory")
        reports.append({"op": op, "variant": cfg, "how": how, "seconds": time.perf_counter() - t0})
    return reports


def ci_variants(op: str) -> list:
    return family(op).plan_module().ci_variants()
