"""FlashInfer as a bench peer: paged attention over its own HND K/V caches (bench/contenders.py
times it alone and with the Triton norm-gate; bench/layer.py uses it in the stock layer path).

What runs (FlashInfer 0.7.2, kernels prebuilt for sm_90a, JIT off):
  verify (q_len 8)  BatchPrefillWithPagedKVCacheWrapper(backend="fa2"), causal (FlashInfer aligns
                    the causal mask to the end of the KV, as the verify block needs), GQA
  decode (q_len 1)  BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) (its prefill kernel
                    in decode form: the faster of its two decode paths on every case measured)
  window W          window_left = W - 1 (a query sees itself and the W - 1 keys before it)

Caches: separate contiguous K and V [pages, Hkv, 16, 64] (HND, one 2 KB block per page and head,
1 KB in FP8), holding the same rows as muse's [pages, Hkv, 16, 128] cache.

FP8 (float8_e4m3fn) caches, q and o bf16: the bundle's prebuilt kernels hold e4m3 KV without a
window only (batch_prefill fa2 and batch_decode, use_swa False; JIT is off), so a sliding FP8 case
is absent. FlashInfer takes its scales as run() arguments: k_scale one float (multiplied into
sm_scale on the host, nothing on the GPU), v_scale one float or a tensor that multiplies the
output after the kernel (`out *= v_scale`, FlashInfer's own extra elementwise kernel, timed with
it): the bench's per-KV-head v_scale goes as a [Hq, 1] tensor (each query head its KV head's
scale), a per-KV-head k_scale is refused (one float only).

Rotating input sets: every set of a bench case has the same request lengths and its own pages, so
FlashInfer's plan (its split of the work, a function of the lengths alone) is the same for every
set; one wrapper is planned once and each set's run reads that set's page-index array (the
wrapper's index buffer is pointed at it before the run is captured). Plan time is outside the
timing, as in a serving engine that plans once per step before replaying its graph.
"""
from __future__ import annotations

import torch

from muse_ops.config import GROUP, HEAD_DIM, PAGE_SIZE

FLOAT_WORKSPACE = 128 << 20     # FlashInfer's recommended split-KV scratch
E4M3 = torch.float8_e4m3fn


class Absent(Exception):
    """FlashInfer cannot run here; the message says why."""


def flashinfer():
    try:
        import flashinfer as fi
    except Exception as exc:
        raise Absent(f"flashinfer not importable ({type(exc).__name__}: {exc})")
    return fi


def version() -> str | None:
    try:
        return flashinfer().__version__
    except Absent:
        return None


def hnd_caches(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's K and V caches [pages, Hkv, 16, 64], contiguous, holding kv_cache's rows (of
    either dtype: an e4m3 cache is copied as its bytes)."""
    raw = kv_cache.view(torch.uint8) if kv_cache.dtype == E4M3 else kv_cache
    k, v = raw[..., :HEAD_DIM].contiguous(), raw[..., HEAD_DIM:].contiguous()
    return (k.view(E4M3), v.view(E4M3)) if kv_cache.dtype == E4M3 else (k, v)


def fp8_scales(k_scale: torch.Tensor, v_scale: torch.Tensor, kv_heads: int) -> tuple[float, "float | torch.Tensor"]:
    """FlashInfer's (k_scale, v_scale) run() arguments for muse's fp32 scales (1 or Hkv elements):
    k_scale a float (one value; per-KV-head keys it cannot take), v_scale a float, or a [Hq, 1]
    fp32 tensor on the scales' device where it differs between KV heads."""
    ks = k_scale.detach().float().cpu().reshape(-1)
    if not bool((ks == ks[0]).all()):
        raise Absent("FlashInfer takes one k_scale (a float folded into sm_scale); this case scales keys per KV head")
    vs = v_scale.detach().float().reshape(-1)
    if bool((vs == vs[0]).all()):
        return float(ks[0]), float(vs[0])
    return float(ks[0]), vs.expand(kv_heads).repeat_interleave(GROUP).reshape(-1, 1).contiguous()


def paged_indices(page_table: torch.Tensor, seq_lens: torch.Tensor):
    """(indptr, indices, last_page_len), int32 on the table's device, of padded page tables."""
    lens = seq_lens.long().cpu()
    need = (lens + PAGE_SIZE - 1) // PAGE_SIZE
    table = page_table.cpu()
    indices = torch.cat([table[r, :int(n)] for r, n in enumerate(need)]).to(torch.int32)
    indptr = torch.zeros(len(need) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(need, 0)
    last = (lens - (need - 1) * PAGE_SIZE).to(torch.int32)
    dev = page_table.device
    return indptr.to(dev), indices.to(dev), last.to(dev)


class PagedAttention:
    """One FlashInfer attention of a bench case: run(q, set_index) -> o [B*q_len, Hq, 64] bf16.
    An e4m3 cache takes k_scale (float) and v_scale (float or [Hq, 1] tensor): fp8_scales."""

    def __init__(self, page_tables: list[torch.Tensor], seq_lens: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, *, q_len: int, q_heads: int, kv_heads: int, window: int, scale: float,
                 workspace: torch.Tensor | None = None, k_scale: float | None = None, v_scale=None):
        kv_dtype = k_cache.dtype
        if kv_dtype == E4M3 and window:
            raise Absent("FlashInfer 0.7.2's prebuilt sm_90a kernels hold an e4m3 KV cache without a window only "
                         "(JIT off): no sliding-window FP8 kernel")
        fi = flashinfer()
        dev = k_cache.device
        self.k, self.v, self.q_len = k_cache, v_cache, q_len
        self.scales = {"k_scale": k_scale, "v_scale": v_scale} if kv_dtype == E4M3 else {}
        ws = workspace if workspace is not None else torch.zeros(FLOAT_WORKSPACE, dtype=torch.uint8, device=dev)
        index_sets = [paged_indices(t, seq_lens) for t in page_tables]
        indptr, indices0, last = index_sets[0]
        self.indices = [ix for _, ix, _ in index_sets]
        window_left = window - 1 if window else -1
        b = seq_lens.shape[0]
        if q_len == 1:
            self.wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="HND", use_tensor_cores=True)
            self.wrapper.plan(indptr, indices0, last, q_heads, kv_heads, HEAD_DIM, PAGE_SIZE,
                              window_left=window_left, q_data_type=torch.bfloat16, kv_data_type=kv_dtype,
                              sm_scale=scale)
        else:
            self.wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout="HND", backend="fa2")
            qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * q_len
            self.wrapper.plan(qo_indptr, indptr, indices0, last, q_heads, kv_heads, HEAD_DIM, PAGE_SIZE,
                              causal=True, sm_scale=scale, window_left=window_left, q_data_type=torch.bfloat16,
                              kv_data_type=kv_dtype)

    def run(self, q: torch.Tensor, i: int) -> torch.Tensor:
        self.wrapper._paged_kv_indices_buf = self.indices[i]   # this set's pages (same plan: same lengths)
        return self.wrapper.run(q, (self.k, self.v), **self.scales)
