"""Input checks of both ops (docs/DESIGN.md section 8), shared by the real ops and their fakes.

`check_*_metadata` reads only dtype, shape, device and strides: it is free (no sync), works on
fake tensors, and runs on every call. `check_*_contents` reads values (a host sync): the
reference backend runs it on every eager call, the GPU backend when MUSE_OPS_CHECK=1. Both raise
MuseInputError naming the argument and what was expected, before anything is written.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .config import CACHE_DTYPES, CACHE_ROW, HEAD_DIM, HIDDEN, PAGE_SIZE, SUPPORTED_Q_LENS, proj_cols
from .errors import MuseInputError

_INDEX_DTYPES = (torch.int32, torch.int64)
_CACHE_DTYPE_NAMES = " or ".join(str(d) for d in CACHE_DTYPES)


def _fail(op: str, arg: str, expected: str, got) -> None:
    raise MuseInputError(f"muse::{op}: {arg} must be {expected}, got {got}")


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype} {list(t.shape)} strides {list(t.stride())} on {t.device}"


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor) or t.device.type == "meta"


def _check_tensor(op: str, arg: str, t, dtypes, ndim: int, device: torch.device | None, aligned: bool = True) -> None:
    """aligned: the data tensors are read in 16-byte vectors; index tensors element by element."""
    if not isinstance(t, torch.Tensor):
        _fail(op, arg, "a tensor", type(t).__name__)
    if t.dtype not in dtypes:
        _fail(op, arg, " or ".join(str(d) for d in dtypes), _describe(t))
    if t.dim() != ndim:
        _fail(op, arg, f"{ndim}-D", _describe(t))
    if device is not None and t.device != device:
        _fail(op, arg, f"on {device} (the device of the other inputs)", _describe(t))
    if not t.is_contiguous():
        _fail(op, arg, "contiguous", _describe(t))
    if aligned and t.numel() and not _is_fake(t) and t.data_ptr() % 16:
        _fail(op, arg, "16-byte aligned", f"address {t.data_ptr():#x}")


def check_kv_cache(op: str, kv_cache: torch.Tensor) -> int:
    """bf16 or float8_e4m3fn [pages, Hkv, 16, 128], contiguous and aligned; returns Hkv."""
    _check_tensor(op, "kv_cache", kv_cache, CACHE_DTYPES, 4, None)
    pages, kv_heads, rows, width = kv_cache.shape
    if rows != PAGE_SIZE or width != CACHE_ROW or kv_heads < 1 or pages < 1:
        _fail(op, "kv_cache", f"{_CACHE_DTYPE_NAMES} [pages >= 1, Hkv >= 1, {PAGE_SIZE}, {CACHE_ROW}]",
              _describe(kv_cache))
    return kv_heads


def check_scales(op: str, kv_cache: torch.Tensor, k_scale, v_scale) -> None:
    """The dequantization scales of an FP8 cache (docs/DESIGN.md section 3b): each None (1.0) or
    a contiguous float32 tensor on the cache's device of one element (per tensor) or [Hkv] (per KV
    head). A bf16 cache takes none: it holds the keys and values themselves."""
    kv_heads = kv_cache.shape[1]
    for arg, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            continue
        if kv_cache.dtype == torch.bfloat16:
            _fail(op, arg, "None for a bf16 kv_cache (scales dequantize a float8_e4m3fn cache)", _describe(t)
                  if isinstance(t, torch.Tensor) else type(t).__name__)
        if not isinstance(t, torch.Tensor):
            _fail(op, arg, "a float32 tensor (or None)", type(t).__name__)
        if t.dtype != torch.float32 or t.device != kv_cache.device or not t.is_contiguous():
            _fail(op, arg, f"a contiguous float32 tensor on {kv_cache.device}", _describe(t))
        if not (t.numel() == 1 and t.dim() <= 1) and tuple(t.shape) != (kv_heads,):
            _fail(op, arg, f"one element (per tensor) or [{kv_heads}] (per KV head, Hkv from kv_cache)", _describe(t))


def check_scale_contents(op: str, k_scale, v_scale) -> None:
    """Scales are positive and finite (a host sync: checked where contents are checked)."""
    for arg, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None or t.numel() == 0:
            continue
        bad = ~(torch.isfinite(t) & (t > 0))
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0, 0])
            _fail(op, arg, "positive and finite", f"{float(t.flatten()[i])} at index {i}")


def check_qkv_front_metadata(x, weight, positions, slots, cos_sin, kv_cache, k_scale=None, v_scale=None) -> None:
    op = "qkv_front"
    kv_heads = check_kv_cache(op, kv_cache)
    check_scales(op, kv_cache, k_scale, v_scale)
    dev = kv_cache.device
    _check_tensor(op, "x", x, (torch.bfloat16,), 2, dev)
    m = x.shape[0]
    if x.shape[1] != HIDDEN:
        _fail(op, "x", f"bf16 [M, {HIDDEN}]", _describe(x))
    n = proj_cols(kv_heads)
    _check_tensor(op, "weight", weight, (torch.bfloat16,), 2, dev)
    if tuple(weight.shape) != (n, HIDDEN):
        _fail(op, "weight", f"bf16 [{n}, {HIDDEN}] (1152 * Hkv rows, Hkv = {kv_heads} from kv_cache)",
              _describe(weight))
    for arg, t in (("positions", positions), ("slots", slots)):
        _check_tensor(op, arg, t, _INDEX_DTYPES, 1, dev, aligned=False)
        if t.shape[0] != m:
            _fail(op, arg, f"[M] with M = {m} (rows of x)", _describe(t))
    if cos_sin is not None:
        _check_tensor(op, "cos_sin", cos_sin, (torch.float32,), 2, dev)
        if cos_sin.shape[1] != HEAD_DIM or cos_sin.shape[0] < 1:
            _fail(op, "cos_sin", f"float32 [max_positions, {HEAD_DIM}] (cos | sin)", _describe(cos_sin))


def check_qkv_front_contents(positions, slots, cos_sin, kv_cache, k_scale=None, v_scale=None) -> None:
    op = "qkv_front"
    check_scale_contents(op, k_scale, v_scale)
    capacity = kv_cache.shape[0] * PAGE_SIZE
    if slots.numel():
        bad = slots >= capacity
        if bool(bad.any()):
            _fail(op, "slots", f"< {capacity} (num_pages * 16) or negative for padding",
                  f"{int(slots[bad][0])} at index {int(bad.nonzero()[0, 0])}")
        kept = slots[slots >= 0]
        if kept.unique().numel() != kept.numel():
            _fail(op, "slots", "distinct (two tokens cannot write one cache row)", "a repeated slot")
    if cos_sin is not None and positions.numel():
        bad = (positions < 0) | (positions >= cos_sin.shape[0])
        if bool(bad.any()):
            _fail(op, "positions", f"in [0, {cos_sin.shape[0]}) (rows of cos_sin)",
                  f"{int(positions[bad][0])} at index {int(bad.nonzero()[0, 0])}")


def _check_attn2_arguments(kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                           workspace_bytes: int = 0, k_scale=None, v_scale=None) -> int:
    """Everything of attn2's metadata but y; returns R."""
    op = "attn2"
    check_kv_cache(op, kv_cache)
    check_scales(op, kv_cache, k_scale, v_scale)
    dev = kv_cache.device
    if q_len not in SUPPORTED_Q_LENS:
        _fail(op, "q_len", f"one of {SUPPORTED_Q_LENS}", q_len)
    if window < 0:
        _fail(op, "window", "0 (full attention) or a positive number of tokens", window)
    if max_seq_len < q_len:
        _fail(op, "max_seq_len", f">= q_len ({q_len})", max_seq_len)
    if not (scale > 0 and scale < float("inf")):
        _fail(op, "scale", "a positive finite float", scale)
    _check_tensor(op, "seq_lens", seq_lens, (torch.int32,), 1, dev, aligned=False)
    r = seq_lens.shape[0]
    _check_tensor(op, "page_table", page_table, (torch.int32,), 2, dev, aligned=False)
    if page_table.shape[0] != r:
        _fail(op, "page_table", f"int32 [R, max_pages] with R = {r} (length of seq_lens)", _describe(page_table))
    if r and page_table.shape[1] < 1:
        _fail(op, "page_table", "at least one page wide", _describe(page_table))
    if workspace is not None:
        _check_tensor(op, "workspace", workspace, (torch.uint8,), 1, dev)
    check_workspace_size(workspace, workspace_bytes)
    return r


def check_workspace_size(workspace, workspace_bytes: int) -> None:
    """attn2's workspace holds at least what the backend that will run needs (0: none)."""
    if workspace_bytes and (workspace is None or workspace.numel() < workspace_bytes):
        got = "None" if workspace is None else f"{workspace.numel()} bytes"
        _fail("attn2", "workspace", f"a zero-initialised uint8 tensor of >= {workspace_bytes} bytes for this "
              "batch (muse_ops.attn2_workspace builds one; a layer sizes it by its max_batch)", got)


def check_attn2_metadata(y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                         workspace_bytes: int = 0, k_scale=None, v_scale=None) -> None:
    op = "attn2"
    r = _check_attn2_arguments(kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                               workspace_bytes, k_scale, v_scale)
    kv_heads = kv_cache.shape[1]
    n = proj_cols(kv_heads)
    _check_tensor(op, "y", y, (torch.bfloat16,), 2, kv_cache.device)
    if tuple(y.shape) != (q_len * r, n):
        _fail(op, "y", f"bf16 [q_len * R, {n}] = [{q_len * r}, {n}] (Hkv = {kv_heads} from kv_cache)", _describe(y))


def check_step_metadata(x, weight, positions, slots, cos_sin, kv_cache, page_table, seq_lens, workspace, q_len,
                        window, scale, max_seq_len, k_scale=None, v_scale=None, max_batch: int | None = None,
                        cache_dtype: torch.dtype | None = None) -> None:
    """A layer step's metadata (qkv_front, then attn2 on its y): y is [M, N] by construction, so
    what attn2 asks of y is asked of x: M = q_len * R. A layer also passes its bound on R
    (max_batch, which sized its workspace) and its cache dtype; None skips either."""
    check_qkv_front_metadata(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale)
    if cache_dtype is not None and kv_cache.dtype != cache_dtype:
        _fail("qkv_front", "kv_cache", f"{cache_dtype} (the layer's DeploymentConfig.cache_dtype)",
              _describe(kv_cache))
    r = _check_attn2_arguments(kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                               k_scale=k_scale, v_scale=v_scale)
    if x.shape[0] != q_len * r:
        _fail("attn2", "x", f"[q_len * R, {HIDDEN}] = [{q_len * r}, {HIDDEN}] rows (R = {r} from seq_lens)",
              _describe(x))
    if max_batch is not None and r > max_batch:
        _fail("attn2", "seq_lens", f"at most max_batch = {max_batch} requests (the layer's DeploymentConfig."
              "max_batch, which sized its workspace)", f"{r} requests")


def check_step_tokens(positions, slots, page_table, seq_lens, q_len: int) -> None:
    """A layer step's tokens belong to their requests (a host sync: checked where contents are
    checked): token i = r q_len + t of a request of length L that inserts (slot >= 0) sits at
    position L - q_len + t, and its slot is that position's row of the request's own pages,
    page_table[r, pos // 16] * 16 + pos % 16. So one request's step never writes another's rows.
    Run after check_attn2_contents (L and the pages it uses are valid). Padding tokens (slot < 0)
    write nothing and are not checked."""
    if slots.numel() == 0:
        return
    pos = seq_lens.long()[:, None] - q_len + torch.arange(q_len, device=seq_lens.device)[None, :]   # [R, q_len]
    page = torch.gather(page_table.long(), 1, pos // PAGE_SIZE)
    want_slots = (page * PAGE_SIZE + pos % PAGE_SIZE).reshape(-1)
    kept = slots.reshape(-1) >= 0
    bad = kept & (positions.reshape(-1).long() != pos.reshape(-1))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        _fail("qkv_front", "positions", "L - q_len + t for token t of each request (the block's positions)",
              f"{int(positions[i])} at index {i} (request {i // q_len}, token {i % q_len}: expected "
              f"{int(pos.reshape(-1)[i])})")
    bad = kept & (slots.reshape(-1).long() != want_slots)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        _fail("qkv_front", "slots", "page_table[r, pos // 16] * 16 + pos % 16 for token t of request r at "
              "position pos (the request's own row), or negative for padding",
              f"{int(slots[i])} at index {i} (request {i // q_len}, token {i % q_len}: expected "
              f"{int(want_slots[i])})")


def check_attn2_contents(page_table, seq_lens, kv_cache, q_len, window, max_seq_len, k_scale=None,
                         v_scale=None) -> None:
    op = "attn2"
    check_scale_contents(op, k_scale, v_scale)
    if seq_lens.numel() == 0:
        return
    bad = (seq_lens < q_len) | (seq_lens > max_seq_len)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        _fail(op, "seq_lens", f"in [q_len, max_seq_len] = [{q_len}, {max_seq_len}]",
              f"{int(seq_lens[i])} for request {i}")
    width = page_table.shape[1]
    too_long = seq_lens > width * PAGE_SIZE
    if bool(too_long.any()):
        i = int(too_long.nonzero()[0, 0])
        _fail(op, "page_table", f"wide enough for every request ({width} pages hold {width * PAGE_SIZE} tokens)",
              f"L = {int(seq_lens[i])} for request {i}")
    # The pages a request reads: from its first row's first visible key to its last key.
    first = (seq_lens - q_len - window + 1).clamp(min=0) // PAGE_SIZE if window else torch.zeros_like(seq_lens)
    page = torch.arange(width, device=page_table.device)[None, :]
    used = (page >= first[:, None]) & (page < ((seq_lens + PAGE_SIZE - 1) // PAGE_SIZE)[:, None])
    bad = used & ((page_table < 0) | (page_table >= kv_cache.shape[0]))
    if bool(bad.any()):
        r, p = (int(v) for v in bad.nonzero()[0])
        _fail(op, "page_table", f"in [0, {kv_cache.shape[0]}) (num_pages) for every page a request uses",
              f"{int(page_table[r, p])} at [{r}, {p}]")
