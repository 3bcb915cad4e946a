"""The CuTe DSL kernel families of the package, one entry per op, read by the backend selection,
`prepare` and the CI compile test (so none of them names a kernel module itself).

Each family has a plan module (pure Python, importable anywhere) with
    can_implement(device, **variant) -> (ok, why)
    deployment_variants(**deployment) -> [config, ...]   every variant a deployment may launch
    ci_variants() -> [config, ...]                        what CI compiles on the CPU
    dev_variants() -> [config, ...]                       development knobs, which CI compiles too
and a kernel module (imports cutlass) with
    _compile(config, extra_options)                       cute.compile of one variant
(launch.py compiles, loads and prepares variants through these; no module names a kernel module
itself.)
"""
from __future__ import annotations

import importlib
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
                          ("kv_heads", "q_len", "window", "max_seq_len", "fp8")),
    "qkv_front": KernelFamily("qkv_front", "muse_ops.cutedsl.qkv_front_plan", "muse_ops.cutedsl.qkv_front",
                              ("kv_heads", "rope", "fp8")),
}


def family(op: str) -> KernelFamily:
    try:
        return FAMILIES[op]
    except KeyError:
        raise ValueError(f"no CuTe DSL kernel family for op {op!r} (have {sorted(FAMILIES)})") from None


def support(op: str, device: torch.device, **variant) -> tuple[bool, str]:
    """Whether the family of `op` can run this variant on `device`, and why not (never raises):
    the plan's checks (device, deployment), then where its kernels come from: the CuTe DSL, which
    compiles them, or an ahead-of-time library (muse_ops.cutedsl.aot) without it."""
    try:
        ok, why = family(op).plan_module().can_implement(device, **variant)
        if not ok:
            return ok, why
        from . import aot, runtime
        dsl = runtime.import_error()
        if dsl is not None and not aot.available():
            return False, f"{dsl}; and no ahead-of-time library: {aot.status()}"
        return True, "ok"
    except Exception as exc:  # noqa: BLE001  (a broken install must say why, not crash the selection)
        return False, f"CuTe DSL backend unusable: {type(exc).__name__}: {exc}"


def ci_variants(op: str) -> list:
    return family(op).plan_module().ci_variants()


def dev_variants(op: str) -> list:
    return family(op).plan_module().dev_variants()
