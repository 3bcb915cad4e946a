"""The stock epilogues of the peer path, as a serving engine runs them today (SGLang's
FusedQKNorm + store_cache, and rms_norm_gate), written here as two one-launch Triton kernels:

  qk_norm_rope_insert(p, positions, slots, cos_sin, k_cache, v_cache[, k_scale=, v_scale=])
      in place on p = bf16(x @ W^T) [M, N] (the cuBLAS output): per-head RMS norm of the q and k
      heads, interleaved RoPE when cos_sin is given, then k' and v stored at the token's cache slot
      (slot < 0: padding, no store). p becomes y = q' | k' | v | gate, as muse::qkv_front returns it.
      Into float8_e4m3fn caches (the quantizing variant, SGLang's FP8 store): e4m3(k' / k_scale)
      and e4m3(v / v_scale), each scale one float or one per KV head (fp32 tensors), the quotient
      an IEEE fp32 division rounded to nearest even and saturated to +-448: byte for byte torch's
      `(x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)` (muse_ops.reference's
      quantize_rows), y's k' and v columns staying bf16.
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
E4M3 = torch.float8_e4m3fn


if HAVE_TRITON:
    @triton.jit
    def _e4m3_byte(x):
        """The float8_e4m3fn byte of fp32 x: round to nearest even, saturated to +-448 (+-inf too),
        NaN to 0x7F with x's sign, in integer arithmetic (the same bytes in Triton's interpreter,
        whose own fp32 -> fp8 cast drops the carry of a rounding into the exponent, and on the GPU,
        where it is what cvt.rn.satfinite.e4m3x2.f32 stores)."""
        bits = x.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = tl.minimum(tl.abs(x), 448.0)
        ab = a.to(tl.int32, bitcast=True)
        e = ab >> 23                                                 # fp32 biased exponent of |x|
        # normal e4m3 (|x| >= 2^-6): keep 3 of the 23 mantissa bits (RNE; a carry bumps the
        # exponent), rebias 127 -> 7: code = (ab rounded >> 20) - (120 << 3)
        normal = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - 960
        # subnormal (|x| < 2^-6): RNE of |x| / 2^-9 = mant24 >> (141 - e) (0 .. 8; 8 is 2^-6)
        mant = (ab & 0x7FFFFF) | 0x800000
        sh = tl.minimum(141 - e, 31)
        sub = (mant + (1 << (sh - 1)) - 1 + ((mant >> sh) & 1)) >> sh
        code = tl.where(e < 121, sub, normal)
        code = tl.where(x != x, 0x7F, code)
        return (code | sign).to(tl.uint8)

    @triton.jit
    def _qk_norm_rope_insert_kernel(P, stride_pm, POS, SLOT, CS, KC, VC,
                                    kc_sp, kc_sr, kc_sh, vc_sp, vc_sr, vc_sh, M, KS, VS,
                                    HQ: tl.constexpr, HKV: tl.constexpr, ROPE: tl.constexpr,
                                    PAGE: tl.constexpr, EPS: tl.constexpr, BH: tl.constexpr,
                                    FP8: tl.constexpr, KS_PER_HEAD: tl.constexpr, VS_PER_HEAD: tl.constexpr):
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
        if FP8:  # KC, VC are the e4m3 caches' bytes: e4m3(k' / k_scale), e4m3(v / v_scale)
            if KS_PER_HEAD:
                ks = tl.load(KS + kh)
            else:
                ks = tl.load(KS + kh * 0)
            if VS_PER_HEAD:
                vs = tl.load(VS + vh)
            else:
                vs = tl.load(VS + vh * 0)
            sc = tl.where(is_k, ks, vs)
            q8 = _e4m3_byte(tl.math.div_rn(out.to(tl.float32), sc[:, None]))
            tl.store(kptr, q8, mask=(keep & is_k)[:, None])
            tl.store(vptr, q8, mask=(keep & is_v)[:, None])
        else:
            tl.store(kptr, out, mask=(keep & is_k)[:, None])
            tl.store(vptr, out, mask=(keep & is_v)[:, None])

    @triton.jit
    def _quantize_kernel(X, S, OUT, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < N
        x = tl.load(X + i, mask=ok, other=0.0)
        s = tl.load(S + i * 0)
        tl.store(OUT + i, _e4m3_byte(tl.math.div_rn(x, s)), mask=ok)

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


def _scale_arg(scale: torch.Tensor | None, kv_heads: int, what: str) -> tuple[torch.Tensor, bool]:
    """(fp32 tensor, per head?) of an FP8 insert's scale: one element, or one per KV head."""
    if scale is None:
        raise ValueError(f"{what}: an FP8 cache needs its scale (an fp32 tensor of 1 or {kv_heads} elements)")
    assert scale.dtype == torch.float32 and scale.is_contiguous() and scale.numel() in (1, kv_heads), (what, scale)
    return scale, scale.numel() == kv_heads and kv_heads > 1


def qk_norm_rope_insert(p: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                        cos_sin: torch.Tensor | None, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        kv_heads: int, k_scale: torch.Tensor | None = None,
                        v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """In place on p [M, 1152*Hkv] bf16 (row stride free, column stride 1); returns p (now y).

    k_cache, v_cache: 4-d bf16 or float8_e4m3fn views addressed as [page, row-in-page, head, 0:64]
    through their strides: FA4's [pages, 16, Hkv, 64] tensors, FlashInfer's HND [pages, Hkv, 16,
    64] transposed, FA3's per-request [B, Lmax, Hkv, 64] as [B*Lmax/16, 16, Hkv, 64], or for muse's
    cache [pages, Hkv, 16, 128] `kv[..., :64].transpose(1, 2)` and `kv[..., 64:].transpose(1, 2)`.
    e4m3 caches take k_scale and v_scale (fp32, 1 or Hkv elements each): the quantizing variant."""
    _need_triton()
    m = p.shape[0]
    if m == 0:
        return p
    assert p.stride(1) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert k_cache.dtype == v_cache.dtype and k_cache.dtype in (torch.bfloat16, E4M3), k_cache.dtype
    hq = GROUP * kv_heads
    rope = cos_sin is not None
    cs = cos_sin if rope else p  # a dummy pointer, never read
    fp8 = k_cache.dtype == E4M3
    if fp8:
        ks, ks_per_head = _scale_arg(k_scale, kv_heads, "k_scale")
        vs, vs_per_head = _scale_arg(v_scale, kv_heads, "v_scale")
        kc, vc = k_cache.view(torch.uint8), v_cache.view(torch.uint8)   # the kernel stores the bytes
    else:
        assert k_scale is None and v_scale is None, "scales go with an FP8 cache"
        ks = vs = p            # dummy pointers, never read
        ks_per_head = vs_per_head = False
        kc, vc = k_cache, v_cache
    grid = (triton.cdiv(m * (hq + 2 * kv_heads), BLOCK_HEADS),)
    _qk_norm_rope_insert_kernel[grid](
        p, p.stride(0), positions, slots, cs, kc, vc,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), m, ks, vs,
        HQ=hq, HKV=kv_heads, ROPE=rope, PAGE=PAGE_SIZE, EPS=RMS_EPS, BH=BLOCK_HEADS,
        FP8=fp8, KS_PER_HEAD=ks_per_head, VS_PER_HEAD=vs_per_head, num_warps=4)
    return p


def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3(x / scale) of fp32 x (any shape, contiguous) by the insert kernel's own conversion,
    scale an fp32 tensor of one element: what the FP8 insert stores for one value (its tests)."""
    _need_triton()
    assert x.dtype == torch.float32 and scale.dtype == torch.float32 and scale.numel() == 1
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    if x.numel():
        _quantize_kernel[(triton.cdiv(x.numel(), 1024),)](x, scale, out, x.numel(), BLOCK=1024)
    return out.view(E4M3)


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
