"""FlashAttention-3's forward (the `fa3-fwd` wheel) as a bench peer: `flash_attn_with_kvcache` over
contiguous per-request K/V caches with `cache_seqlens` (bench/contenders.py times it alone and with
the Triton norm-gate; bench/layer.py puts it in a stock layer path).

The wheel (PyPI fa3-fwd 0.0.3, cp39-abi3, built on torch's stable ABI against CUDA 13) ships three
modules: `fa3_fwd._C` (the kernels, registered as torch.ops.fa3_fwd), `fa3_fwd_interface` (upstream
FA3's hopper/flash_attn_interface.py renamed) and `fa3_fwd_config` (its build flags). The interface
imports the upstream name `flash_attn_config` (in round_up_headdim, at call time), so the config
module is aliased under that name before the interface is imported. Its build compiles out the
backward, paged KV, local (sliding-window) attention and fp16: so FA3 runs here on contiguous
per-request caches [B, Lmax, Hkv, 64] (gathered from the bench's pages outside the timing: a
layout no paged server has, so an optimistic bound for FA3, not counted as a peer in best
peer / ours), full attention only (a sliding case is absent, the flag named).

What runs: causal (FA3 aligns the mask to the end of each request's cache_seqlens keys, as the
verify block needs), GQA (packed by its heuristics), num_splits=0 (its own split heuristic),
q (B, q_len, Hq, 64) read straight from y's q columns (strided rows). FP8 as SGLang runs it on an
FP8 cache: q, k and v all float8_e4m3fn (q cast with torch's `.to()`, which the timed
"+normgate" path does per call and the "attn only" timing leaves out), with q_descale (ones: the
cast is unscaled), k_descale and v_descale (per request and KV head, the caches' scales), output
bf16. Installed on the GPU machine by tools/fa3_device_env.sh.
"""
from __future__ import annotations

import importlib
import sys

import torch

from muse_ops.config import HEAD_DIM, PAGE_SIZE

E4M3 = torch.float8_e4m3fn
INTERFACE = "fa3_fwd_interface"
CONFIG = "fa3_fwd_config"
UPSTREAM_CONFIG = "flash_attn_config"


class Absent(Exception):
    """FA3 cannot run here (or not this case); the message says why."""


def interface():
    """The wheel's fa3_fwd_interface module, its config aliased as flash_attn_config first."""
    try:
        config = importlib.import_module(CONFIG)
    except Exception as exc:
        raise Absent(f"fa3-fwd not importable ({type(exc).__name__}: {exc}); tools/fa3_device_env.sh installs it")
    sys.modules[UPSTREAM_CONFIG] = config    # the interface imports the upstream name
    try:
        return importlib.import_module(INTERFACE)
    except Exception as exc:
        raise Absent(f"{INTERFACE} not importable ({type(exc).__name__}: {str(exc)[:200]})")


def build_flags() -> dict:
    try:
        return dict(importlib.import_module(CONFIG).CONFIG["build_flags"])
    except Exception as exc:
        raise Absent(f"fa3-fwd not importable ({type(exc).__name__}: {exc}); tools/fa3_device_env.sh installs it")


def version() -> str | None:
    try:
        from importlib.metadata import version as v
        return v("fa3_fwd")
    except Exception:
        try:
            build_flags()
            return "?"
        except Absent:
            return None


def check_case(window: int) -> None:
    """Absent where the wheel's build cannot run the case."""
    flags = build_flags()
    if window and flags.get("FLASHATTENTION_DISABLE_LOCAL"):
        raise Absent("the fa3-fwd wheel is built with FLASHATTENTION_DISABLE_LOCAL: no sliding window")


def padded_len(lens) -> int:
    """The contiguous caches' length: the longest request, in whole pages."""
    return -(-max(lens) // PAGE_SIZE) * PAGE_SIZE


def contiguous_caches(kv_cache: torch.Tensor, page_table: torch.Tensor, lens) -> tuple[torch.Tensor, torch.Tensor]:
    """FA3's K and V caches [B, Lmax, Hkv, 64] (Lmax = padded_len(lens)), contiguous, holding
    request b's token t at [b, t] (muse's [pages, Hkv, 16, 128] cache gathered through its page
    table; an e4m3 cache moves as its bytes). Rows past a request's length hold whatever its
    table's clamped entries point at; FA3 reads only cache_seqlens of them."""
    b = page_table.shape[0]
    pages = padded_len(lens) // PAGE_SIZE
    kvh = kv_cache.shape[1]
    raw = kv_cache.view(torch.uint8) if kv_cache.dtype == E4M3 else kv_cache
    g = raw[page_table[:, :pages].clamp(min=0).long()]                   # [B, P, Hkv, 16, 128]
    g = g.permute(0, 1, 3, 2, 4).reshape(b, pages * PAGE_SIZE, kvh, 2 * HEAD_DIM)
    k, v = g[..., :HEAD_DIM].contiguous(), g[..., HEAD_DIM:].contiguous()
    del g
    return (k.view(E4M3), v.view(E4M3)) if kv_cache.dtype == E4M3 else (k, v)


def descales(scale: torch.Tensor, batch: int, kv_heads: int) -> torch.Tensor:
    """FA3's descale argument: fp32 (batch, Hkv), contiguous, from a scale of 1 or Hkv elements."""
    return scale.float().reshape(1, -1).expand(batch, kv_heads).contiguous()


class ContigAttention:
    """One FA3 attention of a bench case over its contiguous per-set caches:
    run(q [B, q_len, Hq, 64], i) -> o [B, q_len, Hq, 64] bf16; q in the cache's dtype."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], seq_lens: torch.Tensor, *,
                 q_len: int, kv_heads: int, window: int, scale: float, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None):
        check_case(window)
        self.fa3 = interface()
        self.k, self.v = k_caches, v_caches
        self.seq_lens = seq_lens.to(torch.int32).contiguous()
        self.scale, self.q_len = scale, q_len
        self.window = (window - 1, 0) if window else (-1, -1)
        b = seq_lens.shape[0]
        self.fp8 = k_caches[0].dtype == E4M3
        self.descale = {}
        if self.fp8:
            ones = torch.ones(1, dtype=torch.float32, device=seq_lens.device)
            self.descale = {"q_descale": descales(ones, b, kv_heads), "k_descale": descales(k_scale, b, kv_heads),
                            "v_descale": descales(v_scale, b, kv_heads)}

    def run(self, q: torch.Tensor, i: int) -> torch.Tensor:
        return self.fa3.flash_attn_with_kvcache(q, self.k[i], self.v[i], cache_seqlens=self.seq_lens,
                                                softmax_scale=self.scale, causal=True, window_size=self.window,
                                                **self.descale)
