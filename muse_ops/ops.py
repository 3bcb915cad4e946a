"""The two ops of the package, `muse::qkv_front` and `muse::attn2`: schemas, checks, dispatch.

This is the only Python file that defines or registers muse:: ops (where the C++ ops of csrc_shims/
are built, they define the public schemas and CUDA kernels, and this file registers the rest:
see the registration block below and docs/DESIGN.md section 16). Each public op is defined by its schema string
(SCHEMAS) and implemented as a composite of one internal op (`muse::_qkv_front`,
`muse::_attn2`, registered with torch.library.custom_op, whose fakes live in `meta/`):

- The composite says no to autograd: the ops are inference-only, so a call that autograd would
  record (grad mode on and an input that requires grad) raises MuseInputError saying so, before
  anything runs. Under torch.no_grad / inference_mode, or with inputs that do not require grad
  (MuseAttentionDecode's parameters do not), nothing is recorded.
- attn2's workspace is optional in the public schema. A None workspace becomes a fresh zeroed one
  in the composite, before the internal op (whose workspace is required) sees it: torch.compile's
  re-inplacing of a mutated *optional* argument fails when it is None (torch 2.13, Inductor:
  "getitem is not an OpOverload"), and torch 2.11's custom_op could not default a mutated
  argument at all. A deployment passes its persistent workspace (muse_ops.attn2_workspace).

The internal ops validate metadata (every call, no sync), pick the backend (`backends.py`),
validate contents where that is allowed (reference: every eager call; GPU: MUSE_OPS_CHECK=1),
then run the backend. Nothing is written before the checks pass. qkv_front returns a fresh y and
mutates kv_cache in place; attn2 returns a fresh out and mutates only its workspace (the split
kernel's partials and self-resetting arrival counters); both are declared, so torch.compile keeps
the writes in place. The public functions at the bottom take docs/DESIGN.md's argument order and
skip the dispatcher in plain eager calls.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode

from . import backends
from .cutedsl import shims
from .config import GROUP, HEAD_DIM, DeploymentConfig
from .errors import MuseInputError, error_flag, set_flag_source
from .meta import attn2_fake, qkv_front_fake
from .reference import attn2_ref, qkv_front_ref
from .validation import (check_attn2_contents, check_attn2_metadata, check_qkv_front_contents,
                         check_qkv_front_metadata, check_step_metadata, check_step_tokens, check_workspace_size)

SCHEMAS = {
    "qkv_front": "qkv_front(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, "
                 "Tensor(a!) kv_cache, *, Tensor? k_scale=None, Tensor? v_scale=None, str? backend=None) -> Tensor",
    "attn2": "attn2(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, Tensor(a!)? workspace=None, *, "
             "int q_len, int window, float scale, int max_seq_len, Tensor? k_scale=None, Tensor? v_scale=None, "
             "str? backend=None) -> Tensor",
}


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def contents_checked(backend: str, device: torch.device) -> bool:
    """Whether a call on `backend` checks the contents of its inputs (a host sync): the reference
    backend always, the GPU backend with MUSE_OPS_CHECK=1; never while tracing or capturing."""
    if _capturing(device) or torch.compiler.is_compiling():
        return False
    return backend == "reference" or backends.checked_mode()


def check_inference_only(op: str, **tensors) -> None:
    """The ops have no backward: refuse a call that autograd would record."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise MuseInputError(
                f"muse::{op}: the muse ops are inference-only (no backward), but {name} requires grad "
                "with grad mode on; call them under torch.no_grad() or torch.inference_mode(), or with "
                f"inputs that do not require grad (e.g. {name}.detach())")


# ----------------------------------------------------------------------------- qkv_front
def _fp8(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == torch.float8_e4m3fn


def _qkv_front_variant(kv_cache: torch.Tensor, cos_sin) -> dict:
    return {"kv_heads": kv_cache.shape[1], "rope": cos_sin is not None, "fp8": _fp8(kv_cache)}


def _qkv_front_impl(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                    cos_sin: Optional[torch.Tensor], kv_cache: torch.Tensor, k_scale: Optional[torch.Tensor] = None,
                    v_scale: Optional[torch.Tensor] = None, *, backend: Optional[str] = None) -> torch.Tensor:
    check_qkv_front_metadata(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale)
    name = backends.resolve("qkv_front", x.device, backend, **_qkv_front_variant(kv_cache, cos_sin))
    if contents_checked(name, x.device):
        check_qkv_front_contents(positions, slots, cos_sin, kv_cache, k_scale, v_scale)
    return _run_qkv_front(name, x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale)


def _run_qkv_front(name, x, weight, positions, slots, cos_sin, kv_cache, k_scale=None, v_scale=None):
    """qkv_front's body on backend `name`, its inputs checked."""
    if x.shape[0] == 0:
        return x.new_empty((0, weight.shape[0]))
    if name == "reference":
        return qkv_front_ref(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale)
    from .cutedsl import launch as kernel
    y = x.new_empty((x.shape[0], weight.shape[0]))
    kernel.launch_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, y, error_flag(x.device), k_scale, v_scale)
    return y


_qkv_front_op = torch.library.custom_op("muse::_qkv_front", _qkv_front_impl, mutates_args=("kv_cache",))
_qkv_front_op.register_fake(qkv_front_fake)


def _qkv_front_composite(x, weight, positions, slots, cos_sin, kv_cache, *, k_scale=None, v_scale=None,
                         backend=None):
    check_inference_only("qkv_front", x=x, weight=weight, cos_sin=cos_sin)
    return torch.ops.muse._qkv_front(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale,
                                     backend=backend)


# ----------------------------------------------------------------------------- attn2
def _attn2_variant(kv_cache: torch.Tensor, q_len: int, window: int, max_seq_len: int) -> dict:
    return {"kv_heads": kv_cache.shape[1], "q_len": q_len, "window": window, "max_seq_len": max_seq_len,
            "fp8": _fp8(kv_cache)}


def _attn2_impl(y: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
                workspace: torch.Tensor, k_scale: Optional[torch.Tensor] = None,
                v_scale: Optional[torch.Tensor] = None, *, q_len: int, window: int, scale: float,
                max_seq_len: int, backend: Optional[str] = None) -> torch.Tensor:
    variant = _attn2_variant(kv_cache, q_len, window, max_seq_len)
    name = backends.resolve("attn2", y.device, backend, **variant)
    check_attn2_metadata(y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                         workspace_bytes=_workspace_need(name, seq_lens.shape[0], variant), k_scale=k_scale,
                         v_scale=v_scale)
    if contents_checked(name, y.device):
        check_attn2_contents(page_table, seq_lens, kv_cache, q_len, window, max_seq_len, k_scale, v_scale)
    return _run_attn2(name, y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                      k_scale, v_scale)


def _workspace_need(name: str, num_requests: int, variant: dict) -> int:
    if name != "cutedsl":
        return 0
    from .cutedsl import attn2_plan   # (the workspace's layout is the same for either cache dtype)
    return attn2_plan.workspace_bytes(num_requests, variant["kv_heads"], variant["q_len"], variant["window"],
                                      variant["max_seq_len"])


def _run_attn2(name, y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
               k_scale=None, v_scale=None):
    """attn2's body on backend `name`, its inputs checked."""
    r = seq_lens.shape[0]
    if name == "reference":
        return attn2_ref(y, kv_cache, page_table, seq_lens, q_len=q_len, window=window, scale=scale,
                         k_scale=k_scale, v_scale=v_scale)
    out = y.new_empty((y.shape[0], GROUP * kv_cache.shape[1] * HEAD_DIM))
    if r == 0:
        return out
    from .cutedsl import launch as kernel
    kernel.launch_attn2(y, kv_cache, page_table, seq_lens, out, workspace, error_flag(y.device),
                        q_len=q_len, window=window, scale=scale, max_seq_len=max_seq_len, k_scale=k_scale,
                        v_scale=v_scale)
    return out


_attn2_op = torch.library.custom_op("muse::_attn2", _attn2_impl, mutates_args=("workspace",))
_attn2_op.register_fake(attn2_fake)


def _attn2_composite(y, kv_cache, page_table, seq_lens, workspace=None, *, q_len, window, scale, max_seq_len,
                     k_scale=None, v_scale=None, backend=None):
    check_inference_only("attn2", y=y)
    if workspace is None:
        # correct but costs an allocation and a memset per call: a deployment passes its own
        workspace = attn2_workspace(y.device, seq_lens.shape[0], kv_cache.shape[1], q_len, window, max_seq_len)
    return torch.ops.muse._attn2(y, kv_cache, page_table, seq_lens, workspace, k_scale, v_scale, q_len=q_len,
                                 window=window, scale=scale, max_seq_len=max_seq_len, backend=backend)


def _qkv_front_public_fake(x, weight, positions, slots, cos_sin, kv_cache, *, k_scale=None, v_scale=None,
                           backend=None):
    """The public op's fake where C++ defines it: the composite's refusal of autograd (a traced
    call never runs the composite), then the internal op's fake. Likewise for attn2."""
    check_inference_only("qkv_front", x=x, weight=weight, cos_sin=cos_sin)
    return qkv_front_fake(x, weight, positions, slots, cos_sin, kv_cache)


def _attn2_public_fake(y, kv_cache, page_table, seq_lens, workspace=None, *, q_len, window, scale, max_seq_len,
                       k_scale=None, v_scale=None, backend=None):
    check_inference_only("attn2", y=y)
    return attn2_fake(y, kv_cache, page_table, seq_lens, workspace, q_len=q_len, window=window, scale=scale,
                      max_seq_len=max_seq_len)


# ----------------------------------------------------------------------------- a layer step's checks
def _check_step_impl(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                     cos_sin: Optional[torch.Tensor], kv_cache: torch.Tensor, page_table: torch.Tensor,
                     seq_lens: torch.Tensor, workspace: Optional[torch.Tensor], k_scale: Optional[torch.Tensor],
                     v_scale: Optional[torch.Tensor], q_len: int, window: int, scale: float, max_seq_len: int,
                     max_batch: int, cache_dtype: torch.dtype, backend: Optional[str]) -> None:
    """A compiled layer step's checks, as the first op of its graph (MuseAttentionDecode.forward):
    everything check_step checks, when the step runs, before qkv_front writes. It writes nothing;
    kv_cache is declared mutated so that the graph keeps it, and keeps it before the ops that
    write the cache (an op without outputs or mutations would be dead code to the compiler)."""
    check_step(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, q_len=q_len,
               window=window, scale=scale, max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale,
               max_batch=max_batch, cache_dtype=cache_dtype, backend=backend)


_check_step_op = torch.library.custom_op("muse::_check_step", _check_step_impl, mutates_args=("kv_cache",))
_check_step_op.register_fake(lambda *args, **kwargs: None)   # checks run when the step runs (docs/DESIGN.md section 8)


_LIB = torch.library.Library("muse", "FRAGMENT")
_COMPOSITES = {"qkv_front": (_qkv_front_composite, _qkv_front_public_fake),
               "attn2": (_attn2_composite, _attn2_public_fake)}
# The C++ ops (csrc_shims/, muse_ops/cutedsl/shims.py), where built: they define the public schemas
# and their CUDA kernels; Python then registers the rest of each op (below).
CPP = shims.load()
if not CPP:
    for _name, (_composite, _) in _COMPOSITES.items():
        _LIB.define(SCHEMAS[_name])
        _LIB.impl(_name, _composite, "CompositeImplicitAutograd")
else:
    set_flag_source(shims.error_flag)   # one error flag per device, the C++ side's
    for _name, (_composite, _fake) in _COMPOSITES.items():
        # what the C++ kernel hands back (see shims.py): the composite, under its own name
        _LIB.define(SCHEMAS[_name].replace(f"{_name}(", f"_{_name}_py(", 1))
        _LIB.impl(f"_{_name}_py", _composite, "CompositeImplicitAutograd")
        _LIB.impl(_name, _composite, "CPU")      # the reference, through the internal op
        torch.library.register_fake(f"muse::{_name}", _fake)

    @torch.ops.muse.attn2.default.py_impl(torch._C.DispatchKey.CompositeImplicitAutograd)
    def _attn2_traced(y, kv_cache, page_table, seq_lens, workspace=None, *, q_len, window, scale, max_seq_len,
                      k_scale=None, v_scale=None, backend=None):
        """Tracing only (eager calls never see Python kernels): a call without a workspace is
        traced as the composite (a fresh workspace, then the internal op), because Inductor
        cannot re-inplace a mutated optional argument that is None; with one it stays the public
        op, so the compiled graph calls the C++ kernel."""
        if workspace is None:
            return _attn2_composite(y, kv_cache, page_table, seq_lens, None, q_len=q_len, window=window,
                                    scale=scale, max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale,
                                    backend=backend)
        return NotImplemented

# the overloads' dispatcher entries, called without OpOverload.__call__'s Python frame (eager
# only: traced calls go through the OpOverload, which Dynamo knows)
_QKV_FRONT_CALL = torch.ops.muse.qkv_front.default._op
_ATTN2_CALL = torch.ops.muse.attn2.default._op
_LAYER_STEP = torch.ops.muse._shims_layer_step.default._op if CPP else None


# ----------------------------------------------------------------------------- public functions
def _plain_eager(*tensors) -> bool:
    """Whether a call may run the op body directly instead of through the dispatcher.

    The custom-op boundary (autograd wrapper, ADInplaceOrView, redispatch) costs more than the
    whole body on the host (measured on the CPU machine: ~190 us of a 235 us call), and users
    without CUDA graphs pay it on every step. So plain eager calls skip it, as quack's
    _EagerBypassOp does; anything that traces, records or differentiates goes through the
    registered op: torch.compile, an active dispatch or function mode (fake tensors, export,
    functionalization), tensor subclasses, and inputs that require grad (the registered op
    refuses them, saying the ops are inference-only)."""
    if torch.compiler.is_compiling() or _dispatch_mode() is not None or torch._C._is_torch_function_mode_enabled():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN_TYPES or (grad and t.requires_grad)):
            return False
    return True


# nn.Parameter (MuseAttentionDecode's weight) is a Tensor subclass with torch-function dispatch
# disabled: as plain as a Tensor for this purpose (measured on the H200, the layer's eager step
# went through the dispatcher for its weight alone)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _scale_arguments(op: str, k_scale, v_scale) -> None:
    """The scales are tensors (the schema's Tensor?): say so in the package's words, not the
    dispatcher's, where a plain float is passed."""
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise MuseInputError(f"muse::{op}: {name} must be a float32 tensor (or None), got {type(t).__name__} "
                                 f"{t!r}; e.g. torch.tensor([{t!r}], device=kv_cache.device)")


def qkv_front(x, weight, positions, slots, cos_sin, kv_cache, *, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """y [M, 1152*Hkv] = q' | k' | v | gate of x [M, 8192] (docs/DESIGN.md section 4); writes the
    new keys and values into kv_cache [pages, Hkv, 16, 128] at slots (slot < 0: no insert). An
    FP8 (float8_e4m3fn) cache gets e4m3(k' / k_scale) | e4m3(v / v_scale) (section 3b)."""
    if k_scale is not None or v_scale is not None:
        _scale_arguments("qkv_front", k_scale, v_scale)
    if CPP and kv_cache.is_cuda and not torch.compiler.is_compiling():
        # the C++ op checks and launches (or hands the call back to Python)
        if backend is None and k_scale is None and v_scale is None:   # (a keyword costs the parser ~0.5 us)
            return _QKV_FRONT_CALL(x, weight, positions, slots, cos_sin, kv_cache)
        return _QKV_FRONT_CALL(x, weight, positions, slots, cos_sin, kv_cache, k_scale=k_scale, v_scale=v_scale,
                               backend=backend)
    if _plain_eager(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale):
        return _qkv_front_impl(x, weight, positions, slots, cos_sin, kv_cache, k_scale=k_scale, v_scale=v_scale,
                               backend=backend)
    return torch.ops.muse.qkv_front(x, weight, positions, slots, cos_sin, kv_cache, k_scale=k_scale,
                                    v_scale=v_scale, backend=backend)


def attn2(y, kv_cache, page_table, seq_lens, *, q_len: int, window: int, scale: float, max_seq_len: int,
          workspace: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
          v_scale: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """out [q_len*R, 512*Hkv] = sigmoid(gate) * rmsnorm(paged causal attention of y's q rows)
    (docs/DESIGN.md section 5); y is qkv_front's output for the block. An FP8 cache is read as
    float(e4m3) * k_scale (keys) and * v_scale (values)."""
    if k_scale is not None or v_scale is not None:
        _scale_arguments("attn2", k_scale, v_scale)
    if CPP and kv_cache.is_cuda and not torch.compiler.is_compiling():
        if backend is None and k_scale is None and v_scale is None:
            return _ATTN2_CALL(y, kv_cache, page_table, seq_lens, workspace, q_len=q_len, window=window,
                               scale=scale, max_seq_len=max_seq_len)
        return _ATTN2_CALL(y, kv_cache, page_table, seq_lens, workspace, q_len=q_len, window=window, scale=scale,
                           max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale, backend=backend)
    if _plain_eager(y, kv_cache, page_table, seq_lens, workspace, k_scale, v_scale):
        if workspace is None:
            workspace = attn2_workspace(y.device, seq_lens.shape[0], kv_cache.shape[1], q_len, window, max_seq_len)
        return _attn2_impl(y, kv_cache, page_table, seq_lens, workspace, q_len=q_len, window=window,
                           scale=scale, max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale, backend=backend)
    return torch.ops.muse.attn2(y, kv_cache, page_table, seq_lens, workspace, q_len=q_len, window=window,
                                scale=scale, max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale,
                                backend=backend)


def attn2_workspace_bytes(num_requests: int, kv_heads: int, q_len: int, window: int, max_seq_len: int,
                          device) -> int:
    """Bytes of workspace attn2 needs on `device` for this deployment (0 where the reference runs).
    num_requests may be symbolic (a traced call with dynamic shapes); the deployment is not."""
    variant = {"kv_heads": int(kv_heads), "q_len": int(q_len), "window": int(window), "max_seq_len": int(max_seq_len)}
    ok, _ = backends.cutedsl_support("attn2", torch.device(device), **variant)   # (the workspace of either cache dtype)
    if not ok:
        return 0
    from .cutedsl import attn2_plan
    return attn2_plan.workspace_bytes(num_requests, **variant)


def attn2_workspace(device, num_requests: int, kv_heads: int, q_len: int, window: int,
                    max_seq_len: int) -> torch.Tensor:
    """A zero-initialised workspace for every attn2 call of a deployment with up to num_requests
    requests per step. Allocate it once and pass it each step (CUDA graphs need it persistent:
    the kernel's arrival counters reset themselves to zero after each launch). It is an ordinary
    tensor even when allocated under torch.inference_mode(), so it serves calls in any mode."""
    size = attn2_workspace_bytes(num_requests, kv_heads, q_len, window, max_seq_len, device)
    with torch.inference_mode(False):
        return torch.zeros(torch.sym_max(size, 16), dtype=torch.uint8, device=device)


def check_step(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, *, q_len: int,
               window: int, scale: float, max_seq_len: int, k_scale=None, v_scale=None, max_batch: int | None = None,
               cache_dtype: torch.dtype | None = None, backend: str | None = None, record: bool = False) -> tuple[str, str]:
    """Every check of a layer step (qkv_front then attn2) before its first write: metadata always
    (attn2's workspace, where given, against what its backend needs for this batch included; the
    batch against max_batch), contents where a backend that will run checks them: both ops'
    contents, and that every token that inserts sits at its request's position and its request's
    slot (check_step_tokens). The step's y is qkv_front's output, so attn2's checks on it follow
    from x and weight. Returns the two backends (recorded as last_backend with record=True:
    run_step runs them)."""
    check_step_metadata(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace,
                        q_len, window, scale, max_seq_len, k_scale, v_scale, max_batch, cache_dtype)
    dev = x.device
    variant = _attn2_variant(kv_cache, q_len, window, max_seq_len)
    front = backends.resolve("qkv_front", dev, backend, record=record, **_qkv_front_variant(kv_cache, cos_sin))
    attn = backends.resolve("attn2", dev, backend, record=record, **variant)
    if workspace is not None:
        check_workspace_size(workspace, _workspace_need(attn, seq_lens.shape[0], variant))
    if contents_checked(front, dev) or contents_checked(attn, dev):
        check_qkv_front_contents(positions, slots, cos_sin, kv_cache, k_scale, v_scale)
        check_attn2_contents(page_table, seq_lens, kv_cache, q_len, window, max_seq_len, k_scale, v_scale)
        check_step_tokens(positions, slots, page_table, seq_lens, q_len)
    return front, attn


def run_step(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, *, q_len: int,
             window: int, scale: float, max_seq_len: int, k_scale=None, v_scale=None, max_batch: int | None = None,
             cache_dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor | None:
    """A layer step (qkv_front, then attn2 on its y) in a plain eager call, every check before the
    first write. Where the C++ ops serve the device: the whole step in one C++ call (its two plans,
    then both launches); where that declines (having written nothing), the whole check in Python,
    then the two ops. Otherwise every check once (check_step), then both Python bodies. Returns
    None where the call is not plain eager (tracing, a dispatch mode, inputs that require grad):
    the caller then checks the step and calls the registered ops."""
    if not _plain_eager(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, k_scale,
                        v_scale):
        return None
    kw = dict(q_len=q_len, window=window, scale=scale, max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale,
              backend=backend)
    layer = dict(max_batch=max_batch, cache_dtype=cache_dtype)
    if CPP and kv_cache.is_cuda:
        if (max_batch is not None and seq_lens.shape[0] > max_batch) or (
                cache_dtype is not None and kv_cache.dtype != cache_dtype):
            check_step(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, **layer,
                       **kw)   # raises: the C++ step knows neither the layer's bound nor its dtype
        out = _LAYER_STEP(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, q_len,
                          window, scale, max_seq_len, k_scale, v_scale, backend)
        if out is not None:
            return out
        check_step(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, **layer, **kw)
        y = qkv_front(x, weight, positions, slots, cos_sin, kv_cache, k_scale=k_scale, v_scale=v_scale,
                      backend=backend)
        return attn2(y, kv_cache, page_table, seq_lens, workspace=workspace, **kw)
    if workspace is None:
        workspace = attn2_workspace(x.device, seq_lens.shape[0], kv_cache.shape[1], q_len, window, max_seq_len)
    front, attn = check_step(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace,
                             **layer, **kw, record=True)
    y = _run_qkv_front(front, x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale)
    return _run_attn2(attn, y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                      k_scale, v_scale)


def prepare(config: DeploymentConfig, device, backend: str | None = None) -> dict:
    """Compile, or load from the disk cache, every kernel variant a deployment may launch (every
    M of qkv_front, every batch of attn2), before its first step, on the backend each op will
    run (`backend` as the ops take it: a requested backend that cannot run raises here). Returns
    {"backends": {op: name}, "variants": [{"op", "variant", "how", "seconds"}, ...]}: how is
    "aot", "compiled", "loaded" (disk) or "memory"; the reference backend has nothing to prepare."""
    device = torch.device(device)
    fp8 = config.cache_dtype == torch.float8_e4m3fn
    variants = {"qkv_front": {"kv_heads": config.kv_heads, "rope": config.rope, "fp8": fp8},
                "attn2": {"kv_heads": config.kv_heads, "q_len": config.q_len, "window": config.window,
                          "max_seq_len": config.max_seq_len, "fp8": fp8}}
    report = {"backends": {}, "variants": []}
    for op, variant in variants.items():
        name = backends.resolve(op, device, backend, record=False, **variant)
        report["backends"][op] = name
        if name == "cutedsl":
            from .cutedsl import launch
            report["variants"] += launch.prepare(op, **variant)
    return report
