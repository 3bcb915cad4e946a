"""The stock epilogues of the peer path, as a serving engine runs them today (SGLang's
FusedQKNorm + store_cache, and rms_norm_gate), written here as two one-launch Triton kernels:

  qk_norm_rope_insert(p, positions, slots, cos_sin, k_cache, v_cache)
      in place on p = bf16(x @ W^T) [M, N] (the cuBLAS output): per-head RMS norm of the q and k
      heads, interleaved RoPE when cos_sin is given, then k' and v stored at the token's cache slot
      (slot < 0: padding, no store). p becomes y = q' | k' | v | gate, as muse::qkv_front returns it.
  norm_gate(o, y) -> out
      out = bf16(sigmoid(gate) * rmsnorm(o)) per 64-wide head, o the attention output [M, Hq*64]
      (bf16, as FlashAttention returns it), gate read from y's gate columns.

Numerics follow muse_ops.reference (docs/DESIGN.md sections 4 and 5): fp32 math, the normed head
rounded to bf16 before RoPE, RoPE rounded to bf16. The caches are addressed through strides, so
the same kernel fills FlashAttention's [pages, 16, Hkv, 64] K and V caches or the two halves of
muse's [pages, Hkv, 16, 128] cache. Each program handles BH (token, head) pairs as a [BH, 64]
tile: 16-byte vector loads and stores, one launch for any M.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Without a GPU Triton can only interpret; the kernels read this when they are decorated.
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
    TRITON_VERSION = triton.__version__
except Exception as _exc:  # not installed, or a broken install
    triton = tl = None
    HAVE_TRITON = False
    TRITON_VERSION = None
    TRITON_IMPORT_ERROR = f"{type(_exc).__name__}: {_exc}"
else:
    TRITON_IMPORT_ERROR = None

from muse_ops.config import GROUP, HEAD_DIM, PAGE_SIZE, RMS_EPS

BLOCK_HEADS = 16   # (token, head) pairs per program: a [16, 64] tile, 128 threads x 8 values


if HAVE_TRITON:
    @triton.jit
    def _qk_norm_rope_insert_kernel(P, stride_pm, POS, SLOT, CS, KC, VC,
                                    kc_sp, kc_sr, kc_sh, vc_sp, vc_sr, vc_sh, M,
                                    HQ: tl.constexpr, HKV: tl.constexpr, ROPE: tl.constexpr,
                                    PAGE: tl.constexpr, EPS: tl.constexpr, BH: tl.constexpr):
        HEADS: tl.constexpr = HQ + 2 * HKV                     # q, k, v heads (gate untouched)
        idx = tl.program_id(0) * BH + tl.arange(0, BH)
        tok = idx // HEADS
        head = idx % HEADS
        valid = tok < M
        col = tl.arange(0, 64)
        ptr = P + tok[:, None].to(tl.int64) * stride_pm + head[:, None] * 64 + col[None, :]
        x = tl.load(ptr, mask=valid[:, None], other=0.0).to(tl.float32)
        is_qk = head < HQ + HKV
        inv = tl.rsqrt(tl.sum(x * x, 1) / 64.0 + EPS)
        n = (x * inv[:, None]).to(tl.bfloat16).to(tl.float32)
        if ROPE:  # interleaved pairs (2i, 2i+1): the partner is column col ^ 1 (an L1 hit)
            xp = tl.load(ptr + ((col ^ 1) - col)[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            npart = (xp * inv[:, None]).to(tl.bfloat16).to(tl.float32)
            pos = tl.load(POS + tok, mask=valid, other=0).to(tl.int64)
            cs_row = CS + pos[:, None] * 64 + (col // 2)[None, :]
            c = tl.load(cs_row, mask=valid[:, None], other=1.0)
            s = tl.load(cs_row + 32, mask=valid[:, None], other=0.0)
            even = (col % 2 == 0)[None, :]
            n = tl.where(even, n * c - npart * s, n * c + npart * s)
        out = tl.where(is_qk[:, None], n, x).to(tl.bfloat16)
        tl.store(ptr, out, mask=(valid & is_qk)[:, None])
        slot = tl.load(SLOT + tok, mask=valid, other=-1).to(tl.int64)
        keep = valid & (slot >= 0)
        page = slot // PAGE
        row = slot % PAGE
        is_k = (head >= HQ) & (head < HQ + HKV)
        is_v = head >= HQ + HKV
        kh = tl.where(is_k, head - HQ, 0).to(tl.int64)
        vh = tl.where(is_v, head - HQ - HKV, 0).to(tl.int64)
        kptr = KC + page[:, None] * kc_sp + row[:, None] * kc_sr + kh[:, None] * kc_sh + col[None, :]
        vptr = VC + page[:, None] * vc_sp + row[:, None] * vc_sr + vh[:, None] * vc_sh + col[None, :]
        tl.store(kptr, out, mask=(keep & is_k)[:, None])
        tl.store(vptr, out, mask=(keep & is_v)[:, None])

    @triton.jit
    def _norm_gate_kernel(O, stride_om, Y, stride_ym, OUT, stride_outm, M, GATE_COL: tl.constexpr,
                          HQ: tl.constexpr, EPS: tl.constexpr, BH: tl.constexpr):
        idx = tl.program_id(0) * BH + tl.arange(0, BH)
        tok = (idx // HQ).to(tl.int64)
        head = idx % HQ
        valid = (idx // HQ) < M
        col = tl.arange(0, 64)
        off = head[:, None] * 64 + col[None, :]
        o = tl.load(O + tok[:, None] * stride_om + off, mask=valid[:, None], other=0.0).to(tl.float32)
        g = tl.load(Y + tok[:, None] * stride_ym + GATE_COL + off, mask=valid[:, None], other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(o * o, 1) / 64.0 + EPS)
        out = o * inv[:, None] * tl.sigmoid(g)
        tl.store(OUT + tok[:, None] * stride_outm + off, out.to(tl.bfloat16), mask=valid[:, None])


def _need_triton():
    if not HAVE_TRITON:
        raise RuntimeError(f"triton is not importable: {TRITON_IMPORT_ERROR}")


def qk_norm_rope_insert(p: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                        cos_sin: torch.Tensor | None, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        kv_heads: int) -> torch.Tensor:
    """In place on p [M, 1152*Hkv] bf16 (row stride free, column stride 1); returns p (now y).

    k_cache, v_cache: 4-d bf16 views addressed as [page, row-in-page, head, 0:64] through their
    strides: FA4's [pages, 16, Hkv, 64] tensors, or for muse's cache [pages, Hkv, 16, 128]
    `kv[..., :64].transpose(1, 2)` and `kv[..., 64:].transpose(1, 2)`."""
    _need_triton()
    m = p.shape[0]
    if m == 0:
        return p
    assert p.stride(1) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    hq = GROUP * kv_heads
    rope = cos_sin is not None
    cs = cos_sin if rope else p  # a dummy pointer, never read
    grid = (triton.cdiv(m * (hq + 2 * kv_heads), BLOCK_HEADS),)
    _qk_norm_rope_insert_kernel[grid](
        p, p.stride(0), positions, slots, cs, k_cache, v_cache,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), m,
        HQ=hq, HKV=kv_heads, ROPE=rope, PAGE=PAGE_SIZE, EPS=RMS_EPS, BH=BLOCK_HEADS, num_warps=4)
    return p


def norm_gate(o: torch.Tensor, y: torch.Tensor, kv_heads: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [M, Hq*64] = bf16(sigmoid(gate) * rmsnorm(o)); o [M, Hq*64] (or [.., Hq, 64] contiguous
    per row), gate = y[:, (Hq + 2Hkv)*64:]."""
    _need_triton()
    hq = GROUP * kv_heads
    m = y.shape[0]
    o = o.reshape(m, hq * HEAD_DIM)
    if out is None:
        out = torch.empty((m, hq * HEAD_DIM), dtype=torch.bfloat16, device=y.device)
    if m == 0:
        return out
    assert o.stride(1) == 1 and y.stride(1) == 1 and out.stride(1) == 1
    grid = (triton.cdiv(m * hq, BLOCK_HEADS),)
    _norm_gate_kernel[grid](o, o.stride(0), y, y.stride(0), out, out.stride(0), m,
                            GATE_COL=(hq + 2 * kv_heads) * HEAD_DIM, HQ=hq, EPS=RMS_EPS,
                            BH=BLOCK_HEADS, num_warps=4)
    return out


def fa_cache_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Strided [pages, 16, Hkv, 64] K and V views of muse's [pages, Hkv, 16, 128] cache."""
    return kv_cache[..., :HEAD_DIM].transpose(1, 2), kv_cache[..., HEAD_DIM:].transpose(1, 2)
