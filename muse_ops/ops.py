"""The two ops of the package, `muse::qkv_front` and `muse::attn2`: schemas, checks, dispatch.

This is the only file that spells "muse::". Each op is one `torch.library.custom_op` whose
Python signature is its schema; its fake lives in `meta/`, its reference in `reference/`, its
kernel in `cutedsl/`. The body validates metadata (every call, no sync), picks the backend
(`backends.py`), validates contents where that is allowed (reference: every eager call; GPU:
MUSE_OPS_CHECK=1), then runs the backend. Nothing is written before the checks pass.

qkv_front returns a fresh y and mutates kv_cache in place (declared, so torch.compile keeps the
write in place); attn2 returns a fresh out and mutates only its optional workspace (the split
kernel's partials and self-resetting arrival counters). The workspace has no default in the
schema: torch 2.11 drops a defaulted argument before it bumps the versions of mutated ones and
fails. The public wrappers at the bottom take DESIGN.md's argument order (workspace a keyword).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode

from . import backends
from .config import GROUP, HEAD_DIM
from .errors import error_flag
from .meta import attn2_fake, qkv_front_fake
from .reference import attn2_ref, qkv_front_ref
from .validation import (check_attn2_contents, check_attn2_metadata, check_qkv_front_contents,
                         check_qkv_front_metadata)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _may_check_contents(backend: str, device: torch.device) -> bool:
    if _capturing(device):  # a host read would break the capture
        return False
    return backend == "reference" or backends.checked_mode()


def _qkv_front_impl(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               cos_sin: Optional[torch.Tensor], kv_cache: torch.Tensor, *,
               backend: Optional[str] = None) -> torch.Tensor:
    check_qkv_front_metadata(x, weight, positions, slots, cos_sin, kv_cache)
    name = backends.resolve("qkv_front", x.device, backend)
    if _may_check_contents(name, x.device):
        check_qkv_front_contents(positions, slots, cos_sin, kv_cache)
    if x.shape[0] == 0:
        return x.new_empty((0, weight.shape[0]))
    return qkv_front_ref(x, weight, positions, slots, cos_sin, kv_cache)


_qkv_front = torch.library.custom_op("muse::qkv_front", _qkv_front_impl, mutates_args=("kv_cache",))
_qkv_front.register_fake(qkv_front_fake)


def _attn2_variant(kv_cache: torch.Tensor, q_len: int, window: int, max_seq_len: int) -> dict:
    return {"kv_heads": kv_cache.shape[1], "q_len": q_len, "window": window, "max_seq_len": max_seq_len}


def _attn2_impl(y: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
           workspace: Optional[torch.Tensor], *, q_len: int, window: int, scale: float,
           max_seq_len: int, backend: Optional[str] = None) -> torch.Tensor:
    variant = _attn2_variant(kv_cache, q_len, window, max_seq_len)
    name = backends.resolve("attn2", y.device, backend, **variant)
    r = seq_lens.shape[0]
    need = 0
    if name == "cutedsl":
        from .cutedsl import attn2 as kernel
        need = kernel.workspace_bytes(r, **variant) if workspace is not None else 0
    check_attn2_metadata(y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                         workspace_bytes=need)
    if _may_check_contents(name, y.device):
        check_attn2_contents(page_table, seq_lens, kv_cache, q_len, window, max_seq_len)
    if name == "reference":
        return attn2_ref(y, kv_cache, page_table, seq_lens, q_len=q_len, window=window, scale=scale)

    out = y.new_empty((y.shape[0], GROUP * kv_cache.shape[1] * HEAD_DIM))
    if r == 0:
        return out
    if workspace is None:
        # Correct but costs a memset per call; a deployment passes its persistent workspace.
        workspace = torch.zeros(max(kernel.workspace_bytes(r, **variant), 16), dtype=torch.uint8, device=y.device)
    kernel.launch_attn2(y, kv_cache, page_table, seq_lens, out, workspace, error_flag(y.device),
                        q_len=q_len, window=window, scale=scale, max_seq_len=max_seq_len)
    return out


_attn2 = torch.library.custom_op("muse::attn2", _attn2_impl, mutates_args=("workspace",))
_attn2.register_fake(attn2_fake)


# ----------------------------------------------------------------------------- public functions
def _plain_eager(*tensors) -> bool:
    """Whether a call may run the op body directly instead of through the dispatcher.

    The custom-op boundary (autograd wrapper, ADInplaceOrView, redispatch) costs more than the
    whole body on the host (measured on the CPU machine: ~190 us of a 235 us call), and users
    without CUDA graphs pay it on every step. So plain eager calls skip it, as quack's
    _EagerBypassOp does; anything that traces, records or differentiates goes through the
    registered op: torch.compile, an active dispatch or function mode (fake tensors, export,
    functionalization), tensor subclasses, and inputs that require grad (the ops have no
    backward, and the registered op says so)."""
    if torch.compiler.is_compiling() or _dispatch_mode() is not None or torch._C._is_torch_function_mode_enabled():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)):
            return False
    return True


def qkv_front(x, weight, positions, slots, cos_sin, kv_cache, *, backend: str | None = None) -> torch.Tensor:
    """y [M, 1152*Hkv] = q' | k' | v | gate of x [M, 8192] (DESIGN.md section 3); writes the new
    keys and values into kv_cache [pages, Hkv, 16, 128] at slots (slot < 0: no insert)."""
    if _plain_eager(x, weight, positions, slots, cos_sin, kv_cache):
        return _qkv_front_impl(x, weight, positions, slots, cos_sin, kv_cache, backend=backend)
    return torch.ops.muse.qkv_front(x, weight, positions, slots, cos_sin, kv_cache, backend=backend)


def attn2(y, kv_cache, page_table, seq_lens, *, q_len: int, window: int, scale: float, max_seq_len: int,
          workspace: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """out [q_len*R, 512*Hkv] = sigmoid(gate) * rmsnorm(paged causal attention of y's q rows)
    (DESIGN.md section 4); y is qkv_front's output for the block."""
    if _plain_eager(y, kv_cache, page_table, seq_lens, workspace):
        return _attn2_impl(y, kv_cache, page_table, seq_lens, workspace, q_len=q_len, window=window,
                           scale=scale, max_seq_len=max_seq_len, backend=backend)
    return torch.ops.muse.attn2(y, kv_cache, page_table, seq_lens, workspace, q_len=q_len, window=window,
                                scale=scale, max_seq_len=max_seq_len, backend=backend)


def attn2_workspace_bytes(num_requests: int, kv_heads: int, q_len: int, window: int, max_seq_len: int,
                          device) -> int:
    """Bytes of workspace attn2 needs on `device` for this deployment (0 where the reference runs)."""
    variant = {"kv_heads": kv_heads, "q_len": q_len, "window": window, "max_seq_len": max_seq_len}
    ok, _ = backends.cutedsl_support("attn2", torch.device(device), **variant)
    if not ok:
        return 0
    from .cutedsl import attn2 as kernel
    return kernel.workspace_bytes(num_requests, **variant)


def attn2_workspace(device, num_requests: int, kv_heads: int, q_len: int, window: int,
                    max_seq_len: int) -> torch.Tensor:
    """A zero-initialised workspace for every attn2 call of a deployment with up to num_requests
    requests per step. Allocate it once and pass it each step (CUDA graphs need it persistent:
    the kernel's arrival counters reset themselves to zero after each launch)."""
    size = attn2_workspace_bytes(num_requests, kv_heads, q_len, window, max_seq_len, device)
    return torch.zeros(max(size, 16), dtype=torch.uint8, device=device)


def prepare(kv_heads: int, q_len: int, window: int, max_seq_len: int, device) -> str:
    """Compile what a deployment launches before its first step; returns the attn2 backend."""
    variant = {"kv_heads": kv_heads, "q_len": q_len, "window": window, "max_seq_len": max_seq_len}
    name = backends.resolve("attn2", torch.device(device), None, **variant)
    if name == "cutedsl":
        from .cutedsl import attn2 as kernel
        kernel.prepare(**variant)
    return name
