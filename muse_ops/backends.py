"""Which implementation runs an op: explicit, overridable, queryable, never silent.

Order of precedence: the op's `backend=` argument, then `set_backend()`, then the environment
variable MUSE_OPS_BACKEND, then the default: `cutedsl` where it can run the call (an sm_90 GPU
with nvidia-cutlass-dsl importable and a kernel for this op and variant), else `reference`.
An explicitly requested backend that cannot run raises with the reason. When the default falls
back to the reference on a GPU, the reason is logged once (logger "muse_ops") and
`last_backend(op)` / `backend_report()` tell which one ran.
"""
from __future__ import annotations

import functools
import logging
import os

import torch

from .cutedsl import shims

BACKENDS = ("cutedsl", "reference")
ENV_VAR = "MUSE_OPS_BACKEND"
CHECK_ENV_VAR = "MUSE_OPS_CHECK"

log = logging.getLogger("muse_ops")
_forced: str | None = None
_last: dict[str, str] = {}
_logged: set[tuple] = set()


def set_backend(name: str | None) -> None:
    """Force a backend for every op call that does not pass `backend=`; None restores the default."""
    if name is not None and name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {name!r}")
    global _forced
    _forced = name
    shims.set_backend(name)


def checked_mode() -> bool:
    """MUSE_OPS_CHECK=1: the GPU backend also validates contents (a host sync) on eager calls."""
    return os.environ.get(CHECK_ENV_VAR, "0") not in ("", "0")


def cutedsl_support(op: str, device: torch.device, **variant) -> tuple[bool, str]:
    """Whether the CuTe DSL backend can run `op` for this variant on `device`, and why not."""
    return _cutedsl_support(op, device, tuple(sorted(variant.items())))


@functools.lru_cache(maxsize=256)
def _cutedsl_support(op: str, device: torch.device, variant: tuple) -> tuple[bool, str]:
    """Cached: the answer depends on the device and the deployment only, and every call asks."""
    if device.type != "cuda":
        return False, f"{device.type} device (the CuTe DSL kernels need an sm_90 GPU)"
    from .cutedsl import registry
    return registry.support(op, device, **dict(variant))


def available_backends(device, op: str = "attn2", **variant) -> dict[str, tuple[bool, str]]:
    """{name: (can run, why)} for `op` on `device`; attn2's variant = kv_heads, q_len, window,
    max_seq_len, qkv_front's = kv_heads, rope (defaults: a TP8 verify deployment)."""
    device = torch.device(device)
    defaults = {"attn2": {"kv_heads": 2, "q_len": 8, "window": 0, "max_seq_len": 32768},
                "qkv_front": {"kv_heads": 2, "rope": True}}
    variant = {**defaults.get(op, {}), **variant}
    return {"cutedsl": cutedsl_support(op, device, **variant), "reference": (True, "runs anywhere")}


def resolve(op: str, device: torch.device, requested: str | None, *, record: bool = True, **variant) -> str:
    """The backend that runs `op` here (see the module docstring); record=False for a probe that
    runs nothing (prepare, the layer's checks), which neither logs nor changes last_backend."""
    name = requested or _forced or os.environ.get(ENV_VAR) or None
    if name is not None:
        if name not in BACKENDS:
            raise ValueError(f"muse::{op}: backend must be one of {BACKENDS}, got {name!r}")
        if name == "cutedsl":
            ok, why = cutedsl_support(op, device, **variant)
            if not ok:
                raise RuntimeError(f"muse::{op}: the cutedsl backend was requested but cannot run: {why}")
    else:
        ok, why = cutedsl_support(op, device, **variant)
        name = "cutedsl" if ok else "reference"
        key = (op, str(device), name, why)
        if record and device.type == "cuda" and not ok and key not in _logged:
            _logged.add(key)
            log.warning("muse::%s on %s runs on the reference backend: %s", op, device, why)
    if record:
        _last[op] = name
        shims.note_python(op)
    return name


def last_backend(op: str) -> str | None:
    """The backend that ran the most recent eager call of `op` ("attn2" or "qkv_front"),
    whether the C++ ops or Python launched it."""
    if shims.last_was_cpp(op):
        return "cutedsl"
    return _last.get(op)


def backend_report() -> dict[str, str]:
    """{op: the backend of its last eager call}, and "kernels": where the kernels come from (the
    ahead-of-time library or the CuTe DSL's compiler) and which host path launched them."""
    report = {op: name for op in ("qkv_front", "attn2") if (name := last_backend(op)) is not None}
    from .cutedsl import aot, compile_cache
    report["kernels"] = (f"ahead-of-time library: {aot.status()}; compile cache {dict(compile_cache.stats)}; "
                         f"C++ ops: {shims.status()} {shims.stats() or ''}".strip())
    return report
