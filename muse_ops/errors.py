"""Errors the package raises, and the device-side error flag the kernels set.

Metadata (dtype, shape, device, strides, alignment) is checked on every call and raises
MuseInputError before anything is written. Contents (lengths, page indices, slots) cannot be
read on the host without a sync that would break CUDA-graph capture, so the GPU kernels instead
skip what is out of range and OR a bit into a per-device int32 flag; `device_errors()` reads it
(a sync) and `raise_device_errors()` turns it into an exception.
"""
from __future__ import annotations

import threading

import torch

# Bits of the device error flag.
BAD_SEQ_LEN = 1      # a request's L outside [q_len, max_seq_len]: its rows are written as zeros
BAD_PAGE = 2         # a page-table entry outside [0, num_pages): the page is skipped
BAD_SLOT = 4         # a slot at or past num_pages * 16: the insert is skipped
BAD_POSITION = 8     # a position outside cos_sin's rows (RoPE): row 0 is used instead

_FLAG_NAMES = {BAD_SEQ_LEN: "seq_lens outside [q_len, max_seq_len]",
               BAD_PAGE: "page_table entry outside [0, num_pages)",
               BAD_SLOT: "slot outside the cache",
               BAD_POSITION: "position outside cos_sin"}


class MuseInputError(ValueError):
    """An argument of a muse op does not meet the contract; the message names it."""


class MuseDeviceError(RuntimeError):
    """A kernel met out-of-range contents (see the flag bits above) since the last check."""


_flags: dict[torch.device, torch.Tensor] = {}
_lock = threading.Lock()
_flag_source = None   # where the C++ ops are loaded: their flag of a device (set_flag_source)


def set_flag_source(source) -> None:
    """`source(device) -> flag tensor or None`: the flags to share with another launcher (ops.py
    passes the C++ ops' own, so both host paths' kernels write one flag per device)."""
    global _flag_source
    _flag_source = source


def error_flag(device: torch.device) -> torch.Tensor:
    """The int32 [1] flag kernels on `device` OR their error bits into (allocated once, zeroed)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _lock:
        flag = _flags.get(device)
        if flag is None and device.type == "cuda" and _flag_source is not None:
            flag = _flag_source(device)   # the C++ ops' kernels write theirs: share it
            if flag is not None:
                _flags[device] = flag
        if flag is None:
            # an ordinary tensor even when the first call runs under torch.inference_mode(), so
            # device_errors() can read and reset it from any mode
            with torch.inference_mode(False):
                flag = _flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return flag


def device_errors(device: torch.device = "cuda", reset: bool = True) -> int:
    """The error bits recorded on `device` since the last reset (synchronises with the device);
    works in any grad / inference mode."""
    flag = error_flag(device)
    bits = int(flag.item())
    if reset and bits:
        flag.zero_()
    return bits


def describe(bits: int) -> str:
    return "; ".join(name for bit, name in _FLAG_NAMES.items() if bits & bit) or "none"


def raise_device_errors(device: torch.device = "cuda") -> None:
    """Raise MuseDeviceError if any kernel on `device` recorded out-of-range contents."""
    bits = device_errors(device)
    if bits:
        raise MuseDeviceError(f"muse kernels on {device} met invalid inputs: {describe(bits)} (flag {bits})")
