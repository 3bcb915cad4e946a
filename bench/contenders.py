"""The contenders of each op, side by side in one run.

Each contender is built for one case's inputs and returns fn(i) -> output of input set i (the
timing rotates over sets), or raises Absent(reason) when it cannot run here (not installed, not
this device): it is then reported as absent, never faked.

Every attn2 and layer case comes with a bf16 or an FP8 (float8_e4m3fn) cache (bench/cases.py);
an FP8 case's contenders read its cache with its scales (k per tensor, v per KV head), and a peer
that cannot run an FP8 cache (or this one's window) is absent, saying why.

attn2 (y, paged cache -> out):
  muse:<backend>     muse_ops.attn2, every available backend (cutedsl, reference)
  muse:default       muse_ops.attn2 with no backend named: the package's own pick (the row's "ran"
                     says which, from muse_ops.last_backend); bench/run.py reports it absent where
                     it picks one backend whose own muse:<backend> is in the run (the same call)
  fa4+normgate       FlashAttention-4 (flash_attn.cute.flash_attn_varlen_func) paged (page 16, its
                     own [pages, 16, Hkv, 64] K and V caches holding the same data), causal, GQA,
                     window (W-1, 0); then bench/stock_triton.norm_gate. sm_90: FA4 has no split-KV
                     (num_splits=1, its default; its interface asserts on more), which is how it runs.
  fa4 (attn only)    the same FA4 call without the epilogue (FA4's own attention time)
  flex(paged)        torch.nn.attention.flex_attention under torch.compile (its decode kernel
                     splits KV), paged the way torch's PagedAttention helper pages it: one
                     physical [1, Hkv, pages*16, 64] K/V, a BlockMask whose KV blocks are pages
                     (block 16) holding each request's physical pages, and a mask_mod mapping
                     physical to logical positions; the norm x sigmoid(gate) in the same compiled
                     function. The block mask's tensors are built per step outside the timed region.
  flex(contig)       the same on contiguous per-request K/V [B, Hkv, Lmax, 64] gathered beforehand
                     (block 128): no paging cost, labelled an optimistic bound for Flex.
  flashinfer+normgate  FlashInfer 0.7.2 (bench/flashinfer_peer.py: fa2 prefill kernel, causal, for the
                     verify block; its tensor-core decode for q_len 1) over its own HND K/V caches,
                     then the Triton norm-gate; flashinfer (attn only) is the attention alone. FP8:
                     the same kernels on e4m3 K/V (bf16 q), its k_scale / v_scale arguments; no
                     window (no such prebuilt kernel).
  fa3(contig)+normgate  FlashAttention-3's forward (bench/fa3_peer.py, the fa3-fwd wheel: paged KV and
                     local attention compiled out) over contiguous per-request K/V gathered beforehand,
                     cache_seqlens, causal; FP8 with q, k, v in e4m3 and its descales as SGLang runs
                     it (q cast per call); then the Triton norm-gate. Full attention only. An optimistic
                     layout (no paging), so not counted in best peer / ours, like flex(contig).
  fa3(contig) (attn only)  the same FA3 call alone (FP8: q cast beforehand)
qkv_front (x, W -> y, cache insert):
  muse:<backend>     muse_ops.qkv_front, every available backend
  cublas+triton      torch.matmul (cuBLAS) then bench/stock_triton.qk_norm_rope_insert (in place,
                     inserting into FA4-layout K/V caches)
  cublas             torch.matmul alone (no epilogue): a bound, not counted as a peer
  compile(ref)       torch.compile of muse_ops' reference qkv_front
"""
from __future__ import annotations

import torch

from muse_ops.config import GROUP, HEAD_DIM, PAGE_SIZE

from . import fa3_peer, flashinfer_peer, stock_triton
from .cases import Attn2Inputs, QkvInputs

E4M3 = torch.float8_e4m3fn
MUSE_DEFAULT = "muse:default"
FA3_NAMES = ("fa3(contig)+normgate", "fa3(contig) (attn only)")


class Absent(Exception):
    """The contender cannot run here; the message says why."""


def muse_backend(name: str) -> str | None:
    """"muse:cutedsl" -> "cutedsl"; "muse:default" -> None (the package picks)."""
    backend = name.split(":", 1)[1]
    return None if backend == "default" else backend


OPS_OF = {"attn2": ("attn2",), "qkv_front": ("qkv_front",), "layer": ("qkv_front", "attn2")}


def default_backends(kind: str, case, device) -> dict[str, str]:
    """{op: the backend muse_ops runs it on here when none is named} for a case of `kind` (a probe:
    nothing runs, nothing is logged)."""
    from muse_ops import backends
    dev = torch.device(device)
    a = case.attn if kind == "layer" else case
    out = {}
    if kind in ("qkv_front", "layer"):
        rope = case.config.rope if kind == "layer" else case.rope
        out["qkv_front"] = backends.resolve("qkv_front", dev, None, record=False, kv_heads=a.kv_heads, rope=rope,
                                            fp8=a.cache_dtype == "fp8")
    if kind in ("attn2", "layer"):
        out["attn2"] = backends.resolve("attn2", dev, None, record=False, kv_heads=a.kv_heads, q_len=a.q_len,
                                        window=a.window, max_seq_len=a.max_seq_len, fp8=a.fp8)
    return out


def ran_backends(kind: str) -> dict[str, str | None]:
    """{op: muse_ops.last_backend(op)}: what the last eager call of a muse contender ran."""
    import muse_ops
    return {op: muse_ops.last_backend(op) for op in OPS_OF[kind]}


def duplicate_of(name: str, kind: str, case, device, names) -> str | None:
    """Why muse:default need not be timed: the package picks one backend for every op of the case
    and that backend's own contender is in the run (None: time it)."""
    if name != MUSE_DEFAULT:
        return None
    picks = set(default_backends(kind, case, device).values())
    if len(picks) == 1 and f"muse:{next(iter(picks))}" in names:
        return f"the package's default runs every op here on {next(iter(picks))}: muse:{next(iter(picks))} times it"
    return None


# ----------------------------------------------------------------------------- helpers
def fa4_module():
    try:
        from flash_attn.cute import flash_attn_varlen_func
        import flash_attn.cute as fac
    except Exception as exc:
        raise Absent(f"flash_attn.cute not importable ({type(exc).__name__}: {exc})")
    return flash_attn_varlen_func, getattr(fac, "__version__", "?")


def fa4_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("flash-attn-4")
    except Exception:
        try:
            return fa4_module()[1]
        except Absent:
            return None


def muse_backends(device, op: str, **variant) -> dict:
    import muse_ops
    return muse_ops.available_backends(device, op=op, **variant)


def fa_layout(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FA4's own contiguous [pages, 16, Hkv, 64] K and V caches, holding kv_cache's data."""
    k, v = stock_triton.fa_cache_views(kv_cache)
    return k.contiguous(), v.contiguous()


# ----------------------------------------------------------------------------- attn2
def attn2_contenders(device) -> list[str]:
    names = ["muse:cutedsl", MUSE_DEFAULT, "muse:reference"]
    if torch.device(device).type == "cuda":
        names += ["flashinfer+normgate", "flashinfer (attn only)", *FA3_NAMES, "fa4+normgate", "fa4 (attn only)",
                  "flex(paged)", "flex(contig)"]
    return names


def build_attn2_contender(name: str, inp: Attn2Inputs, device):
    c = inp.case
    if name.startswith("muse:"):
        import muse_ops
        backend = muse_backend(name)
        variant = dict(kv_heads=c.kv_heads, q_len=c.q_len, window=c.window, max_seq_len=c.max_seq_len, fp8=c.fp8)
        if backend is not None:
            ok, why = muse_backends(device, "attn2", **variant).get(backend, (False, "unknown backend"))
            if not ok:
                raise Absent(why)
        ws = muse_ops.attn2_workspace(device, c.batch, c.kv_heads, c.q_len, c.window, c.max_seq_len)
        # The kernel is compiled (or loaded from the AOT library) outside the timing by the first,
        # untimed call bench/run.py makes: the one variant this case launches. (muse_ops.prepare
        # would also build every variant of the deployment's qkv_front, for both index dtypes: minutes
        # of compiling for FP8, and variants a DSL-free AOT library need not hold.)
        ks, vs = inp.k_scale, inp.v_scale

        def fn(i):
            return muse_ops.attn2(inp.ys[i], inp.kv_cache, inp.page_tables[i], inp.seq_lens, q_len=c.q_len,
                                  window=c.window, scale=c.scale, max_seq_len=c.max_seq_len, workspace=ws,
                                  k_scale=ks, v_scale=vs, backend=backend)
        return fn

    if torch.device(device).type != "cuda":
        raise Absent("needs CUDA")
    hq = GROUP * c.kv_heads

    if name in FA3_NAMES:
        return _fa3(name, inp)
    if c.fp8 and (name.startswith("fa4") or name.startswith("flex")):
        raise Absent("bf16 caches only here (FA4's paged kernel and flex_attention read K/V of q's dtype; "
                     "no e4m3 cache with scales)")

    if name.startswith("fa4"):
        fa, _ = fa4_module()
        if not stock_triton.HAVE_TRITON and name == "fa4+normgate":
            raise Absent(f"triton missing for the norm-gate kernel ({stock_triton.TRITON_IMPORT_ERROR})")
        if "fa_k" not in inp.extra:
            inp.extra["fa_k"], inp.extra["fa_v"] = fa_layout(inp.kv_cache)
            inp.extra["fa_pt"] = [t.clamp(min=0) for t in inp.page_tables]
        k, v, pts = inp.extra["fa_k"], inp.extra["fa_v"], inp.extra["fa_pt"]
        window = (c.window - 1, 0) if c.window else (None, None)
        with_epilogue = name == "fa4+normgate"

        def fn(i):
            y = inp.ys[i]
            q = y[:, :hq * HEAD_DIM].view(c.batch, c.q_len, hq, HEAD_DIM)
            o = fa(q, k, v, seqused_k=inp.seq_lens, page_table=pts[i], max_seqlen_q=c.q_len,
                   max_seqlen_k=c.max_seq_len, softmax_scale=c.scale, causal=True, window_size=window)
            if isinstance(o, tuple):
                o = o[0]
            o = o.reshape(c.batch * c.q_len, hq * HEAD_DIM)
            return stock_triton.norm_gate(o, y, c.kv_heads) if with_epilogue else o
        return fn

    if name.startswith("flashinfer"):
        return _flashinfer(name, inp)
    if name == "flex(paged)":
        return _flex_paged(inp, device)
    if name == "flex(contig)":
        return _flex_contig(inp, device)
    raise Absent(f"unknown contender {name}")


def _flashinfer(name: str, inp: Attn2Inputs):
    c = inp.case
    hq = GROUP * c.kv_heads
    if name == "flashinfer+normgate" and not stock_triton.HAVE_TRITON:
        raise Absent(f"triton missing for the norm-gate kernel ({stock_triton.TRITON_IMPORT_ERROR})")
    try:
        scales = {}
        if c.fp8:
            ks, vs = flashinfer_peer.fp8_scales(inp.k_scale, inp.v_scale, c.kv_heads)
            scales = {"k_scale": ks, "v_scale": vs}
            if c.window:   # say why before copying the caches
                raise flashinfer_peer.Absent("FlashInfer 0.7.2's prebuilt sm_90a kernels hold an e4m3 KV cache "
                                             "without a window only (JIT off): no sliding-window FP8 kernel")
        if "fi_k" not in inp.extra:
            inp.extra["fi_k"], inp.extra["fi_v"] = flashinfer_peer.hnd_caches(inp.kv_cache)
        attn = flashinfer_peer.PagedAttention(inp.page_tables, inp.seq_lens, inp.extra["fi_k"], inp.extra["fi_v"],
                                              q_len=c.q_len, q_heads=hq, kv_heads=c.kv_heads, window=c.window,
                                              scale=c.scale, **scales)
    except flashinfer_peer.Absent as exc:
        raise Absent(str(exc))
    with_epilogue = name == "flashinfer+normgate"

    def fn(i):
        y = inp.ys[i]
        o = attn.run(y[:, :hq * HEAD_DIM].view(c.batch * c.q_len, hq, HEAD_DIM), i)
        return stock_triton.norm_gate(o, y, c.kv_heads) if with_epilogue else o.reshape(-1, hq * HEAD_DIM)
    return fn


def fa3_caches(inp: Attn2Inputs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """FA3's contiguous per-set K and V caches of a case (built once, kept in inp.extra)."""
    if "fa3_k" not in inp.extra:
        ks, vs = [], []
        for t in inp.page_tables:
            k, v = fa3_peer.contiguous_caches(inp.kv_cache, t, inp.case.lens)
            ks.append(k)
            vs.append(v)
        inp.extra["fa3_k"], inp.extra["fa3_v"] = ks, vs
    return inp.extra["fa3_k"], inp.extra["fa3_v"]


def _fa3(name: str, inp: Attn2Inputs):
    c = inp.case
    hq = GROUP * c.kv_heads
    with_epilogue = name == "fa3(contig)+normgate"
    if with_epilogue and not stock_triton.HAVE_TRITON:
        raise Absent(f"triton missing for the norm-gate kernel ({stock_triton.TRITON_IMPORT_ERROR})")
    try:
        fa3_peer.check_case(c.window)
        fa3_peer.interface()                     # absent before the caches are copied
        k, v = fa3_caches(inp)
        attn = fa3_peer.ContigAttention(k, v, inp.seq_lens, q_len=c.q_len, kv_heads=c.kv_heads, window=c.window,
                                        scale=c.scale, k_scale=inp.k_scale, v_scale=inp.v_scale)
    except fa3_peer.Absent as exc:
        raise Absent(str(exc))

    def q_of(y):
        return y[:, :hq * HEAD_DIM].view(c.batch, c.q_len, hq, HEAD_DIM)
    q8 = None
    if c.fp8 and not with_epilogue:     # the attention alone: q's e4m3 cast outside the timing
        q8 = [q_of(y).to(E4M3) for y in inp.ys]

    def fn(i):
        y = inp.ys[i]
        q = q_of(y)
        if c.fp8:
            q = q8[i] if q8 is not None else q.to(E4M3)
        o = attn.run(q, i).reshape(c.batch * c.q_len, hq * HEAD_DIM)
        return stock_triton.norm_gate(o, y, c.kv_heads) if with_epilogue else o
    return fn


def _flex_api():
    """torch's flex_attention module, after a dynamo reset: each case compiles its own step at its
    own static shapes, and without the reset the shared code object of `step` reaches dynamo's
    recompile limit after 8 cases (fullgraph then fails)."""
    torch._dynamo.reset()
    try:
        import torch.nn.attention.flex_attention as flex
    except Exception as exc:
        raise Absent(f"flex_attention not importable ({exc})")
    return flex


def _flex_paged(inp: Attn2Inputs, device):
    flex = _flex_api()
    BlockMask, flex_attention = flex.BlockMask, flex.flex_attention
    c = inp.case
    hq, kvh, ql, W = GROUP * c.kv_heads, c.kv_heads, c.q_len, c.window
    pool = inp.kv_cache.shape[0]
    # The physical K/V in Flex's layout [1, Hkv, pool*16, 64] (torch PagedAttention's cache shape).
    if "flex_k" not in inp.extra:
        inp.extra["flex_k"] = inp.kv_cache[..., :HEAD_DIM].permute(1, 0, 2, 3).reshape(1, kvh, pool * PAGE_SIZE, HEAD_DIM).contiguous()
        inp.extra["flex_v"] = inp.kv_cache[..., HEAD_DIM:].permute(1, 0, 2, 3).reshape(1, kvh, pool * PAGE_SIZE, HEAD_DIM).contiguous()
    K, V = inp.extra["flex_k"], inp.extra["flex_v"]
    lens = inp.seq_lens.long()
    # Per set: physical_to_logical [B, pool] and the page-granular block mask (partial + full).
    metas = []
    ar = torch.arange(pool, device=device)
    for pt in inp.page_tables:
        B, P = pt.shape
        lp = torch.arange(P, device=device)[None, :].expand(B, P)
        used = pt >= 0
        p2l = torch.full((B, pool), -1, dtype=torch.int32, device=device)
        p2l.scatter_(1, pt.clamp(min=0).long(), torch.where(used, lp, -1).to(torch.int32))
        first_pos = lens - ql                                          # the block's first query position
        last_pos = lens - 1
        lo = torch.zeros_like(lens) if W == 0 else (first_pos - W + 1).clamp(min=0)
        page_lo, page_hi = lo // PAGE_SIZE, last_pos // PAGE_SIZE     # pages some row sees
        seen = used & (lp >= page_lo[:, None]) & (lp <= page_hi[:, None])
        # full: every key of the page visible to every query row
        full = seen & (lp * PAGE_SIZE + PAGE_SIZE - 1 <= first_pos[:, None])
        if W:
            full &= lp * PAGE_SIZE > (last_pos[:, None] - W)
        part = seen & ~full

        def pack(sel):
            # ordered physical page lists padded to the pool width (flex wants >= KV blocks)
            key = torch.where(sel, lp, P + lp)                          # selected first, in order
            order = key.argsort(dim=1)
            phys = torch.gather(pt.clamp(min=0), 1, order)
            idx = torch.zeros((B, 1, 1, pool), dtype=torch.int32, device=device)
            idx[:, 0, 0, :P] = phys
            return sel.sum(1, dtype=torch.int32).view(B, 1, 1), idx
        kn, ki = pack(part)
        fn_, fi = pack(full)
        metas.append((kn, ki, fn_, fi, p2l))
    del ar
    scale = c.scale
    kv_len = pool * PAGE_SIZE

    def step(y, K, V, kn, ki, fn_, fi, p2l, lens):
        B = lens.shape[0]
        q = y[:, :hq * HEAD_DIM].view(B, ql, hq, HEAD_DIM).transpose(1, 2)

        def mask(b, h, qi, kv):
            lpg = p2l[b, kv // PAGE_SIZE]
            lk = lpg * PAGE_SIZE + kv % PAGE_SIZE
            pos = lens[b] - ql + qi
            ok = (lpg >= 0) & (lk <= pos)
            if W:
                ok = ok & (lk > pos - W)
            return ok
        bm = BlockMask.from_kv_blocks(kn, ki, fn_, fi, BLOCK_SIZE=(128, PAGE_SIZE), mask_mod=mask,
                                      seq_lengths=(ql, kv_len), compute_q_blocks=False)
        o = flex_attention(q, K, V, block_mask=bm, scale=scale, enable_gqa=True)   # [B, Hq, ql, 64]
        return _norm_gate_torch(o, y, B, ql, hq, kvh)

    compiled = torch.compile(step, fullgraph=True, dynamic=False)

    def fn(i):
        return compiled(inp.ys[i], K, V, *metas[i], inp.seq_lens)
    return fn


def _norm_gate_torch(o, y, B, ql, hq, kvh):
    o = o.transpose(1, 2).reshape(B * ql, hq, HEAD_DIM).to(torch.bfloat16).float()
    gate = y[:, (hq + 2 * kvh) * HEAD_DIM:].float().view(B * ql, hq, HEAD_DIM)
    out = torch.sigmoid(gate) * o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5)
    return out.to(torch.bfloat16).view(B * ql, hq * HEAD_DIM)


def _flex_contig(inp: Attn2Inputs, device):
    """Flex on contiguous per-request K/V [B, Hkv, Lmax, 64] (each set gathered from its pages
    beforehand): no paging cost at all, an optimistic bound for Flex."""
    flex = _flex_api()
    BlockMask, create_block_mask, flex_attention = flex.BlockMask, flex.create_block_mask, flex.flex_attention
    c = inp.case
    hq, kvh, ql, W = GROUP * c.kv_heads, c.kv_heads, c.q_len, c.window
    B = c.batch
    lmax = max(c.lens)
    P = pages_needed = -(-lmax // PAGE_SIZE)
    lens = inp.seq_lens
    sets = []
    for pt in inp.page_tables:
        g = inp.kv_cache[pt[:, :P].clamp(min=0).long()]                       # [B, P, Hkv, 16, 128]
        g = g.permute(0, 2, 1, 3, 4).reshape(B, kvh, P * PAGE_SIZE, 2 * HEAD_DIM)
        k, v = g[..., :HEAD_DIM].contiguous(), g[..., HEAD_DIM:].contiguous()
        del g

        def m(b, h, qi, kv, lens=lens):
            pos = lens[b] - ql + qi
            ok = kv <= pos
            if W:
                ok = ok & (kv > pos - W)
            return ok
        bm = create_block_mask(m, B, None, ql, P * PAGE_SIZE, device=device, BLOCK_SIZE=128)
        sets.append((k, v, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices))
    del pages_needed
    scale, kv_len = c.scale, P * PAGE_SIZE

    def step(y, k, v, kn, ki, fn_, fi, lens):
        q = y[:, :hq * HEAD_DIM].view(B, ql, hq, HEAD_DIM).transpose(1, 2)

        def mask(b, h, qi, kv):
            pos = lens[b] - ql + qi
            ok = kv <= pos
            if W:
                ok = ok & (kv > pos - W)
            return ok
        bm = BlockMask.from_kv_blocks(kn, ki, fn_, fi, BLOCK_SIZE=(128, 128), mask_mod=mask,
                                      seq_lengths=(ql, kv_len), compute_q_blocks=False)
        o = flex_attention(q, k, v, block_mask=bm, scale=scale, enable_gqa=True)
        return _norm_gate_torch(o, y, B, ql, hq, kvh)

    compiled = torch.compile(step, fullgraph=True, dynamic=False)

    def fn(i):
        return compiled(inp.ys[i], *sets[i], lens)
    return fn


# ----------------------------------------------------------------------------- qkv_front
def qkv_contenders(device) -> list[str]:
    names = ["muse:cutedsl", "muse:reference"]
    if torch.device(device).type == "cuda":
        names += ["cublas+triton", "cublas", "compile(ref)"]
    return names


def build_qkv_contender(name: str, inp: QkvInputs, device):
    c = inp.case
    if name.startswith("muse:"):
        import muse_ops
        backend = name.split(":", 1)[1]
        ok, why = muse_backends(device, "qkv_front").get(backend, (False, "unknown backend"))
        if not ok:
            raise Absent(why)

        def fn(i):
            return muse_ops.qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], inp.cos_sin,
                                      inp.kv_cache, backend=backend)
        return fn
    if torch.device(device).type != "cuda":
        raise Absent("needs CUDA")
    if name == "cublas+triton":
        if not stock_triton.HAVE_TRITON:
            raise Absent(f"triton not importable ({stock_triton.TRITON_IMPORT_ERROR})")
        kc, vc = fa_layout(inp.kv_cache)

        def fn(i):
            p = torch.matmul(inp.xs[i], inp.weights[i].t())
            return stock_triton.qk_norm_rope_insert(p, inp.positions[i], inp.slots[i], inp.cos_sin, kc, vc,
                                                    c.kv_heads)
        return fn
    if name == "cublas":   # the projection alone: a bound for any path that starts with cuBLAS
        return lambda i: torch.matmul(inp.xs[i], inp.weights[i].t())
    if name == "compile(ref)":
        from muse_ops.reference import qkv_front_ref
        compiled = torch.compile(qkv_front_ref, dynamic=False)
        cache = inp.kv_cache.clone()

        def fn(i):
            return compiled(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], inp.cos_sin, cache)
        return fn
    raise Absent(f"unknown contender {name}")
