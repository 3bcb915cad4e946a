"""What every CuTe DSL kernel family of the package needs from its host side, without importing
cutlass at module import: whether the DSL can run here, the device facts, the compile options,
and the fake tensors a variant is compiled against.

Nothing here changes a process-wide setting. The target architecture goes into each compile as
the DSL option `--gpu-arch sm_90a` instead of the `CUTE_DSL_ARCH` environment variable, which
would also steer every other CuTe DSL library in the process (FlashAttention-4 in the bench).
On an sm_90 GPU the DSL detects sm_90a by itself; on a CPU machine (CI, development) the option
is what makes it compile for Hopper, so kernels compile and export there without a GPU.
"""
from __future__ import annotations

import functools

import torch

COMPILE_ARCH = "sm_90a"
SUPPORTED_CAPABILITY = (9, 0)


@functools.lru_cache(maxsize=1)
def ffi_error() -> str | None:
    """Why TVM-FFI (which every compiled variant is called through) cannot be imported here."""
    try:
        import tvm_ffi  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"apache-tvm-ffi not importable: {type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=1)
def import_error() -> str | None:
    """Why kernel variants cannot be compiled here (None when they can): the CuTe DSL and TVM-FFI.
    Cached: it asks once."""
    try:
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (CPU-only / no cutlass / a cutlass that fails to load)
        return f"cutlass DSL not importable: {type(exc).__name__}: {exc}"
    return ffi_error()


def require_dsl() -> None:
    why = import_error()
    if why is not None:
        raise RuntimeError(why)


def device_support(device) -> tuple[bool, str]:
    """Whether `device` can launch this package's sm_90a kernels, and why not: TVM-FFI (every
    variant is called through it) and the device. Where the variants come from (the CuTe DSL or
    an ahead-of-time library) is registry.support's question."""
    why = ffi_error()
    if why is not None:
        return False, why
    dev = torch.device(device)
    if dev.type != "cuda":
        return False, f"{dev.type} device (the CuTe DSL kernels need an sm_90 GPU)"
    if not torch.cuda.is_available():
        return False, "CUDA not available"
    cap = torch.cuda.get_device_capability(dev)
    if cap != SUPPORTED_CAPABILITY:
        return False, f"needs compute capability 9.0 (sm_90a), device has {cap[0]}.{cap[1]}"
    return True, "ok"


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device) -> int:
    idx = torch.device(device).index
    return _sm_count(torch.cuda.current_device() if idx is None else idx)


def compile_options(extra: str = "") -> str:
    """TVM-FFI entry (torch tensors straight in, torch's current stream) for sm_90a."""
    return f"--enable-tvm-ffi --gpu-arch {COMPILE_ARCH} {extra}".strip()


def fake_tensor(dtype, shape, *, align: int, row_major: bool = True):
    """A compact fake global tensor to compile against (sizes may be cute.sym_int())."""
    from cutlass.cute.runtime import make_fake_compact_tensor
    order = tuple(range(len(shape) - 1, -1, -1)) if row_major else None
    return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)


def env_stream():
    """The stream argument of a compile: dropped from the call, torch's current stream at run time."""
    from cutlass.cute.runtime import make_fake_stream
    return make_fake_stream(use_tvm_ffi_env_stream=True)


_DUMMIES: dict = {}


def dummy_tensor(device, dtype=torch.float32, shape=(1, 64), fill: float = 0.0) -> torch.Tensor:
    """A small constant tensor standing in for an absent optional input of a compiled variant
    (zeros the variant never reads, or a scale of 1.0); one per device, dtype, shape and value, so
    a call allocates nothing."""
    key = (torch.device(device), dtype, shape, fill)
    t = _DUMMIES.get(key)
    if t is None:
        with torch.inference_mode(False):
            t = _DUMMIES[key] = torch.full(shape, fill, dtype=dtype, device=device)
    return t
