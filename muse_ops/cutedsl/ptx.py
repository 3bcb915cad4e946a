"""Device helpers shared by the package's CuTe DSL kernels: explicit PTX where the bits must not
depend on how the compiler schedules a site, warp reductions, distributed-shared-memory loads,
one wgmma group, and the device error flag.

Why explicit PTX for plain arithmetic: a reduction that several kernels, layouts or thread
mappings must reproduce bit for bit (attn2's folds, qkv_front's split-K sum and norms) has to run
the same instructions at every site. Written as inline PTX, an fma stays one fused fma.rn and a
mul + add pair is never contracted into an fma at one site and left apart at another.

Imported only where cutlass is importable (muse_ops.cutedsl.runtime.import_error() is None).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32


@cute.jit
def pack_x2(lo: Float32, hi: Float32, kind: cutlass.Constexpr[str]) -> Uint32:
    """kind(lo) in the low half, kind(hi) in the high half, kind "bf16" or "f16", round to nearest
    even (no satfinite)."""
    # cvt.rn.bf16x2.f32 d, a, b (and .f16x2) puts a in the HIGH half
    return cute.arch.inline_ptx(f"cvt.rn.{kind}x2.f32 {{$w0}}, {{$r0}}, {{$r1}};",
                                write_only_types=[Uint32], read_only_args=[hi, lo])


@cute.jit
def quad_max(v: Float32) -> Float32:
    """Max over the 4 lanes of a quad (the lanes sharing a row of an MMA C fragment)."""
    v = cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=1))
    return cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=2))


@cute.jit
def quad_sum(v: Float32) -> Float32:
    """Sum over the 4 lanes of a quad, in a fixed butterfly order."""
    v = v + cute.arch.shuffle_sync_bfly(v, offset=1)
    return v + cute.arch.shuffle_sync_bfly(v, offset=2)


@cute.jit
def fma_rn(a: Float32, b: Float32, c: Float32) -> Float32:
    """a * b + c, one rounding."""
    return cute.arch.inline_ptx("fma.rn.f32 {$w0}, {$r0}, {$r1}, {$r2};",
                                write_only_types=[Float32], read_only_args=[a, b, c])


@cute.jit
def mul_rn(a: Float32, b: Float32) -> Float32:
    return cute.arch.inline_ptx("mul.rn.f32 {$w0}, {$r0}, {$r1};",
                                write_only_types=[Float32], read_only_args=[a, b])


@cute.jit
def add_rn(a: Float32, b: Float32) -> Float32:
    return cute.arch.inline_ptx("add.rn.f32 {$w0}, {$r0}, {$r1};",
                                write_only_types=[Float32], read_only_args=[a, b])


@cute.jit
def sub_rn(a: Float32, b: Float32) -> Float32:
    return cute.arch.inline_ptx("sub.rn.f32 {$w0}, {$r0}, {$r1};",
                                write_only_types=[Float32], read_only_args=[a, b])


@cute.jit
def select(t: Int32, a: Float32, b: Float32) -> Float32:
    """a if t != 0 else b, without a branch (so the folds of a DSMEM merge schedule together)."""
    return cute.arch.inline_ptx("{ .reg .pred p; setp.ne.s32 p, {$r2}, 0; selp.f32 {$w0}, {$r0}, {$r1}, p; }",
                                write_only_types=[Float32], read_only_args=[a, b, t])


@cute.jit
def ld_dsmem_f32x2(addr: Int32):
    """Two fp32 at a shared::cluster address (mapa result) of a peer CTA."""
    return cute.arch.inline_ptx("ld.shared::cluster.v2.f32 {{$w0}, {$w1}}, [{$r0}];",
                                write_only_types=[Float32, Float32], read_only_args=[addr])


@cute.jit
def ld_dsmem_f32x4(addr: Int32):
    """Four fp32 at a 16-byte aligned shared::cluster address (a peer CTA's or this CTA's)."""
    return cute.arch.inline_ptx("ld.shared::cluster.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                                write_only_types=[Float32] * 4, read_only_args=[addr])


@cute.jit
def st_dsmem_f32x2(addr: Int32, v0: Float32, v1: Float32):
    """Two fp32 to an 8-byte aligned shared::cluster address (a peer CTA's or this CTA's); no reply."""
    cute.arch.inline_ptx("st.shared::cluster.v2.f32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, v0, v1])


@cute.jit
def st_landing_f32x2(addr: Int32, local: Int32, v0: Float32, v1: Float32, mbar: Int32, mode: Int32):
    """Two fp32 into a landing zone, by mode: 1, as st.async to the 8-byte aligned shared::cluster
    address addr, its 8 bytes completing on the mbarrier at shared::cluster address mbar (in the
    CTA of addr; the cluster must hold more than one CTA); 2, to this CTA's shared::cta address
    local (no signal: the storing thread arrives on the barrier after its stores); 0, to addr with
    st.shared::cluster (no signal)."""
    cute.arch.inline_ptx("{ .reg .pred a, l, c; setp.eq.s32 a, {$r5}, 1; setp.eq.s32 l, {$r5}, 2; "
                         "setp.eq.s32 c, {$r5}, 0; "
                         "@a st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 "
                         "[{$r0}], {{$r2}, {$r3}}, [{$r4}]; "
                         "@l st.shared.v2.f32 [{$r1}], {{$r2}, {$r3}}; "
                         "@c st.shared::cluster.v2.f32 [{$r0}], {{$r2}, {$r3}}; }",
                         read_only_args=[addr, local, v0, v1, mbar, mode])


@cute.jit
def mbarrier_wait_cluster(addr: Int32, parity: Int32):
    """Wait for the phase of parity `parity` of the mbarrier at shared::cta address addr, with
    acquire semantics at cluster scope: what peer CTAs' st.async released into it (at cluster
    scope) is then visible to this thread."""
    cute.arch.inline_ptx("{ .reg .pred P1; LAB_WAIT: "
                         "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [{$r0}], {$r1}, 10000000; "
                         "@P1 bra.uni DONE; bra.uni LAB_WAIT; DONE: }", read_only_args=[addr, parity])


@cute.jit
def wgmma_commit(mma_atom, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor, zero_init: cutlass.Constexpr[bool]):
    """acc (+)= A B over the k blocks of tA / tB, issued as one committed wgmma group and not
    waited for: acc, and the smem tA / tB read, belong to the wgmma until a wait_group."""
    cute.nvgpu.warpgroup.fence()
    mma_atom.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, not zero_init)
    for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        cute.gemm(mma_atom, acc, tA[None, None, kb], tB[None, None, kb], acc)
        mma_atom.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
    cute.nvgpu.warpgroup.commit_group()


@cute.jit
def wgmma_group(mma_atom, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor, zero_init: cutlass.Constexpr[bool]):
    """acc (+)= A B over the k blocks of tA / tB, one wgmma group, waited for."""
    wgmma_commit(mma_atom, acc, tA, tB, zero_init)
    cute.nvgpu.warpgroup.wait_group(0)


@cute.jit
def set_error_bit(mErr: cute.Tensor, bit: cutlass.Constexpr[int]):
    """OR one of muse_ops.errors' bits into the device error flag (int32 [1])."""
    cute.arch.atomic_or(mErr.iterator, Int32(bit), sem="relaxed", scope="gpu")


@cute.jit
def bf16_round(a: Float32) -> Float32:
    """a rounded to bf16 (nearest even), as fp32."""
    return cute.arch.inline_ptx("{ .reg .b16 h; cvt.rn.bf16.f32 h, {$r0}; cvt.f32.bf16 {$w0}, h; }",
                                write_only_types=[Float32], read_only_args=[a])


@cute.jit
def div_rn(a: Float32, b: Float32) -> Float32:
    """a / b, IEEE division rounded to nearest even (what torch computes on the CPU and the GPU)."""
    return cute.arch.inline_ptx("div.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Float32], read_only_args=[a, b])


@cute.jit
def pack_e4m3x4(a0: Float32, a1: Float32, a2: Float32, a3: Float32) -> Uint32:
    """e4m3 of four fp32 in bytes 0..3 (a0 lowest): round to nearest even, saturated to +-448
    (.satfinite: +-inf becomes +-448, NaN stays NaN)."""
    # cvt.rn.satfinite.e4m3x2.f32 d, a, b puts e4m3(a) in the HIGH byte of d
    return cute.arch.inline_ptx(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, {$r1}, {$r0}; "
        "cvt.rn.satfinite.e4m3x2.f32 hi, {$r3}, {$r2}; mov.b32 {$w0}, {lo, hi}; }",
        write_only_types=[Uint32], read_only_args=[a0, a1, a2, a3])


# ---------------------------------------------------------------- e4m3 -> f16 (an FP8 KV cache)
@cute.jit
def e4m3x4_to_f16x4(w: Uint32):
    """Four e4m3 bytes (byte 0 lowest) -> (f16x2 of bytes 0, 1; f16x2 of bytes 2, 3), exact: every
    e4m3 value, subnormals and +-448 included, is an f16 normal, and a NaN byte (0x7F / 0xFF) an
    f16 NaN. One cvt.rn.f16x2.e4m3x2 per two bytes (the byte in the high half of its source
    goes to the high half of its result), where an exact e4m3 -> bf16 takes about 3
    instructions a byte on sm_90 (no such cvt; the f16 -> bf16 step is a quarter-rate F2F)."""
    return cute.arch.inline_ptx(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, {$r0}; "
        "cvt.rn.f16x2.e4m3x2 {$w0}, lo; cvt.rn.f16x2.e4m3x2 {$w1}, hi; }",
        write_only_types=[Uint32, Uint32], read_only_args=[w])


@cute.jit
def exponent_of(a: Float32) -> Int32:
    """floor(log2 |a|) of a normal fp32 from its exponent field: -127 for zero and subnormals,
    128 for inf and NaN."""
    return cute.arch.inline_ptx("{ .reg .b32 t; mov.b32 t, {$r0}; bfe.u32 t, t, 23, 8; sub.s32 {$w0}, t, 127; }",
                                write_only_types=[Int32], read_only_args=[a])


@cute.jit
def pow2(e: Int32) -> Float32:
    """2^e as fp32 for -126 <= e <= 127 (the exponent field written directly: exact)."""
    return cute.arch.inline_ptx("{ .reg .b32 t; add.s32 t, {$r0}, 127; shl.b32 {$w0}, t, 23; }",
                                write_only_types=[Float32], read_only_args=[e])


@cute.jit
def st_shared_v4_b32(addr: Int32, offset: cutlass.Constexpr[int], a: Uint32, b: Uint32, c: Uint32, d: Uint32):
    """Four 32-bit words to the 16-byte aligned shared address addr + offset."""
    cute.arch.inline_ptx(f"st.shared.v4.b32 [{{$r0}}+{offset}], {{{{$r1}}, {{$r2}}, {{$r3}}, {{$r4}}}};",
                         read_only_args=[addr, a, b, c, d])


@cute.jit
def ld_shared_v2_b32(addr: Int32, offset: cutlass.Constexpr[int]):
    """Two 32-bit words at the 8-byte aligned shared address addr + offset."""
    return cute.arch.inline_ptx(f"ld.shared.v2.b32 {{{{$w0}}, {{$w1}}}}, [{{$r0}}+{offset}];",
                                write_only_types=[Uint32] * 2, read_only_args=[addr])
