"""Layer cases of the bench: one attention layer's whole decode / verify step, x -> out (before
o_proj), the new keys and values inserted into the paged cache.

Contenders (each in one CUDA graph per replay, over rotating input sets like the op cases):
  muse:<backend>   MuseAttentionDecode.forward (qkv_front then attn2; the step's checks run on the
                   host, outside the graph)
  muse:default     the same with no backend named: each op on the package's own pick (an FP8 layer
                   until attn2's FP8 kernel lands: qkv_front's kernel, attn2's reference); the row's
                   "ran" says which (muse_ops.last_backend); absent where it would time exactly
                   what a muse:<backend> of the run times
  stock            the stock serving path on the kernels available here: cuBLAS (torch.matmul) for
                   the projection, the Triton q/k-norm + RoPE + cache insert (bench/stock_triton.py)
                   into FlashInfer's HND K/V caches, FlashInfer's paged attention (the fastest peer
                   of the attn2 table; bench/flashinfer_peer.py), the Triton norm-gate. FP8: the
                   Triton insert's quantizing variant into e4m3 caches, FlashInfer's e4m3 kernels
                   with its scales (full layers only: no sliding FP8 kernel is prebuilt)
  stock(fa3)       the same with FA3 (bench/fa3_peer.py) for the attention, over contiguous
                   per-request caches the Triton kernel inserts into (FP8: q cast to e4m3 per call,
                   as SGLang runs FA3); full layers only; an optimistic layout, not a peer in
                   best peer / ours
Floor: weight + KV bytes (+ x, out and the inserted rows) at the measured copy bandwidth; an FP8
layer's KV and inserted rows at 1 byte per element.

Cases are (B, L, window, q_len, Hkv): full layers have no RoPE, sliding layers (window 2048) do,
as the model puts them; each in the cache dtypes of the run (bench/cases.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from muse_ops.config import GROUP, HEAD_DIM, HIDDEN, DeploymentConfig, proj_cols

from . import cases as C
from . import flashinfer_peer, stock_triton
from .contenders import MUSE_DEFAULT, Absent, muse_backend

LAYER_CASES = [(1, 8192, 0), (8, 8192, 0), (32, 8192, 0), (64, 8192, 0), (128, 8192, 0),
               (1, 8192, 2048), (8, 8192, 2048), (64, 8192, 2048), (128, 16384, 2048),
               (1, 8192, 0, 1, 2), (1, 8192, 2048, 1, 2), (64, 8192, 0, 1, 2), (128, 16384, 0, 1, 2),
               (1, 8192, 0, 8, 1), (1, 8192, 0, 8, 4), (1, 8192, 0, 8, 16),
               (32, 4096, 0, 8, 1), (32, 4096, 0, 8, 4), (32, 4096, 0, 8, 16)]
QUICK_GPU_LAYER = [(1, 8192, 0), (64, 8192, 0), (128, 16384, 2048)]
# --suite fp8 (issue 48): B = 1, 8, 32, 64, 128 at L=8192, full and sliding
FP8_LAYER_CASES = [(b, 8192, w) for w in (0, 2048) for b in (1, 8, 32, 64, 128)]
# --suite serving (issue 49): B = 1 to 128 at L=8192, full and sliding, and TP1 (Hkv 16) B=32 L=4096
SERVING_LAYER_CASES = [(b, 8192, w) for w in (0, 2048) for b in (1, 8, 32, 64, 128)] + [(32, 4096, 0, 8, 16)]
PEERS_LAYER = ("stock",)


@dataclass
class LayerCase:
    attn: C.Attn2Case

    @property
    def name(self) -> str:
        return self.attn.name

    @property
    def config(self) -> DeploymentConfig:
        a = self.attn
        return DeploymentConfig(kv_heads=a.kv_heads, q_len=a.q_len, window=a.window, max_seq_len=a.max_seq_len,
                                scale=a.scale, max_batch=a.batch, cache_dtype=a.dtype)

    @property
    def base_name(self) -> str:
        return self.attn.base_name

    @property
    def cache_dtype(self) -> str:
        return self.attn.cache_dtype

    def bytes(self) -> int:
        """weight + x + the inserted rows (at the cache's element size) + what attn2 moves (its KV
        rows, y's q and gate columns, out; an FP8 case's scales once)."""
        a = self.attn
        rows = a.batch * a.q_len
        weight = proj_cols(a.kv_heads) * HIDDEN * 2
        inserted = rows * a.kv_heads * 2 * HEAD_DIM * a.element_bytes
        return weight + a.bytes() + rows * HIDDEN * 2 + inserted

    def flops(self) -> float:
        return self.front().flops() + self.attn.flops()

    def front(self) -> C.QkvCase:
        """The layer's qkv_front: its M tokens at the deployment's Hkv."""
        return C.QkvCase(self.attn.batch * self.attn.q_len, kv_heads=self.attn.kv_heads, rope=self.config.rope,
                         cache_dtype=self.attn.cache_dtype)

    def kernels(self) -> list[tuple[int, float]]:
        """(bytes, FLOPs) of each kernel, in order (bench/run.py's bound): qkv_front then attn2,
        each with the bytes it moves (y is written by one and read by the other)."""
        front = self.front()
        return [(front.bytes(), front.flops()), (self.attn.bytes(), self.attn.flops())]


def layer_case(spec, cache_dtype: str = "bf16") -> LayerCase:
    return LayerCase(C.attn2_case(spec, cache_dtype=cache_dtype))


@dataclass
class LayerInputs:
    case: LayerCase
    kv: C.Attn2Inputs                  # the page pool, per-set page tables and the lengths
    weights: list[torch.Tensor]        # per set, [N, 8192]
    xs: list[torch.Tensor]             # per set, [B q_len, 8192]
    positions: list[torch.Tensor]
    slots: list[torch.Tensor]
    sets: int
    note: str = ""
    extra: dict | None = None


def build_layer(case: LayerCase, device, l2: int, sets: int | None = None, seed: int = 0) -> LayerInputs:
    from muse_ops.paged import block_positions, block_slots
    a = case.attn
    n = proj_cols(a.kv_heads)
    wbytes = n * HIDDEN * 2
    pool_per_set = sum(C.pages_for(L) for L in a.lens) * a.kv_heads * 16 * 2 * HEAD_DIM * a.element_bytes
    if sets is None:
        sets = C.rotation_sets(case.bytes(), pool_per_set + wbytes, l2, max_sets=64)
    kv = C.build_attn2(a, device, l2, sets=sets, seed=seed)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    weights = []
    for _ in range(sets):
        w = torch.empty((n, HIDDEN), dtype=torch.bfloat16, device=device)
        w.normal_(0.0, HIDDEN ** -0.5, generator=g)
        weights.append(w)
    rows = a.batch * a.q_len
    xs = [torch.randn((rows, HIDDEN), generator=g, device=device).to(torch.bfloat16) for _ in range(sets)]
    positions = [block_positions(kv.seq_lens, a.q_len) for _ in range(sets)]
    slots = [block_slots(t, kv.seq_lens, a.q_len) for t in kv.page_tables]
    note = f"{sets} sets (weight copy + KV pages each), {sets * case.bytes() / 2**20:.0f} MiB rotated"
    return LayerInputs(case, kv, weights, xs, positions, slots, sets, note, {})


def layer_contenders(device) -> list[str]:
    names = ["muse:cutedsl", MUSE_DEFAULT, "muse:reference"]
    if torch.device(device).type == "cuda":
        names += ["stock", "stock(fa3)"]
    return names


def build_layer_contender(name: str, inp: LayerInputs, device):
    c = inp.case
    a = c.attn
    if name.startswith("muse:"):
        import muse_ops
        backend = muse_backend(name)
        cfg = c.config
        layer_kw = {"kv_heads": a.kv_heads, "q_len": a.q_len, "window": a.window, "max_seq_len": a.max_seq_len,
                    "fp8": a.fp8}
        variants = (("qkv_front", {"kv_heads": a.kv_heads, "rope": cfg.rope, "fp8": a.fp8}), ("attn2", layer_kw))
        for op, variant in variants if backend is not None else ():   # muse:default: whatever the package picks
            ok, why = muse_ops.available_backends(device, op=op, **variant).get(backend, (False, "unknown backend"))
            if not ok:
                raise Absent(f"{op}: {why}")
        k_scale, v_scale = a.scales
        layers = []
        for w in inp.weights:   # one module per set: the set's weight copy is the module's parameter
            layer = muse_ops.MuseAttentionDecode(cfg, device=device, backend=backend, k_scale=k_scale,
                                                 v_scale=v_scale)
            layer.qkv_weight.data = w
            layers.append(layer)
        # no layers[0].prepare(): the first, untimed call (bench/run.py) compiles or loads the two
        # variants this case launches; prepare would build every M tile of qkv_front for both index
        # dtypes (an FP8 layer's int32 ones are in no AOT library)
        for layer in layers[1:]:
            layer.workspace = layers[0].workspace   # one workspace serves every call of the step stream
        cache = inp.kv.kv_cache

        def fn(i):
            with torch.inference_mode():
                return layers[i](inp.xs[i], inp.positions[i], inp.slots[i], cache, inp.kv.page_tables[i],
                                 inp.kv.seq_lens)
        return fn
    if torch.device(device).type != "cuda":
        raise Absent("needs CUDA")
    if name == "stock":
        return _stock(inp, device)
    if name == "stock(fa3)":
        return _stock_fa3(inp, device)
    raise Absent(f"unknown contender {name}")


def _cos_sin(c: LayerCase, device):
    if not c.config.rope:
        return None
    from muse_ops.reference import rope_cos_sin
    return rope_cos_sin(c.attn.max_seq_len, device=device)


def _triton_front(inp: LayerInputs):
    """What both stock paths take from their shared front (cuBLAS, then the Triton q/k-norm + RoPE
    + insert): the attention case, its q heads and the insert's scales (FP8: quantizing); Absent
    without Triton."""
    a = inp.case.attn
    if not stock_triton.HAVE_TRITON:
        raise Absent(f"triton not importable ({stock_triton.TRITON_IMPORT_ERROR})")
    insert_scales = {"k_scale": inp.kv.k_scale, "v_scale": inp.kv.v_scale} if a.fp8 else {}
    return a, GROUP * a.kv_heads, insert_scales


def _stock(inp: LayerInputs, device):
    """cuBLAS -> Triton q/k-norm + RoPE + insert (into FlashInfer's caches; FP8: quantizing) ->
    FlashInfer -> Triton norm-gate."""
    a, hq, insert_scales = _triton_front(inp)
    try:
        scales = {}
        if a.fp8:
            ks, vs = flashinfer_peer.fp8_scales(inp.kv.k_scale, inp.kv.v_scale, a.kv_heads)
            scales = {"k_scale": ks, "v_scale": vs}
            if a.window:   # say why before copying the caches
                raise flashinfer_peer.Absent("FlashInfer 0.7.2's prebuilt sm_90a kernels hold an e4m3 KV cache "
                                             "without a window only (JIT off): no sliding-window FP8 kernel")
        k_cache, v_cache = flashinfer_peer.hnd_caches(inp.kv.kv_cache)
        attn = flashinfer_peer.PagedAttention(inp.kv.page_tables, inp.kv.seq_lens, k_cache, v_cache, q_len=a.q_len,
                                              q_heads=hq, kv_heads=a.kv_heads, window=a.window, scale=a.scale,
                                              **scales)
    except flashinfer_peer.Absent as exc:
        raise Absent(str(exc))
    cos_sin = _cos_sin(inp.case, device)
    k_rows, v_rows = k_cache.transpose(1, 2), v_cache.transpose(1, 2)    # [page, row, head, 64] views

    def fn(i):
        y = torch.matmul(inp.xs[i], inp.weights[i].t())
        stock_triton.qk_norm_rope_insert(y, inp.positions[i], inp.slots[i], cos_sin, k_rows, v_rows, a.kv_heads,
                                         **insert_scales)
        o = attn.run(y[:, :hq * HEAD_DIM].view(-1, hq, HEAD_DIM), i)
        return stock_triton.norm_gate(o, y, a.kv_heads)
    return fn


def fa3_slots(seq_lens: torch.Tensor, q_len: int, padded_len: int) -> torch.Tensor:
    """The block's flat slots in FA3's contiguous caches [B, Lmax, Hkv, 64] seen as pages of 16
    rows: request b's token at position p is row b * Lmax + p (int64 [B * q_len])."""
    from muse_ops.paged import block_positions
    b = seq_lens.shape[0]
    pos = block_positions(seq_lens, q_len).long().view(b, q_len)
    return (torch.arange(b, device=seq_lens.device)[:, None] * padded_len + pos).reshape(-1)


def _stock_fa3(inp: LayerInputs, device):
    """cuBLAS -> Triton q/k-norm + RoPE + insert (into FA3's contiguous per-request caches; FP8:
    quantizing) -> FA3 (FP8: q cast to e4m3) -> Triton norm-gate."""
    from . import fa3_peer
    from .contenders import fa3_caches
    a, hq, insert_scales = _triton_front(inp)
    try:
        fa3_peer.check_case(a.window)
        fa3_peer.interface()
        k, v = fa3_caches(inp.kv)            # own copies per set (the history; the step inserts its block)
        attn = fa3_peer.ContigAttention(k, v, inp.kv.seq_lens, q_len=a.q_len, kv_heads=a.kv_heads, window=a.window,
                                        scale=a.scale, k_scale=inp.kv.k_scale, v_scale=inp.kv.v_scale)
    except fa3_peer.Absent as exc:
        raise Absent(str(exc))
    lmax = k[0].shape[1]
    slots = fa3_slots(inp.kv.seq_lens, a.q_len, lmax)
    paged = [(t.view(-1, C.PAGE_SIZE, a.kv_heads, HEAD_DIM), u.view(-1, C.PAGE_SIZE, a.kv_heads, HEAD_DIM))
             for t, u in zip(k, v)]           # [B * Lmax / 16, 16, Hkv, 64]: the kernel's [page, row, head] addressing
    cos_sin = _cos_sin(inp.case, device)
    e4m3 = torch.float8_e4m3fn

    def fn(i):
        y = torch.matmul(inp.xs[i], inp.weights[i].t())
        stock_triton.qk_norm_rope_insert(y, inp.positions[i], slots, cos_sin, *paged[i], a.kv_heads, **insert_scales)
        q = y[:, :hq * HEAD_DIM].view(a.batch, a.q_len, hq, HEAD_DIM)
        o = attn.run(q.to(e4m3) if a.fp8 else q, i)
        return stock_triton.norm_gate(o.reshape(-1, hq * HEAD_DIM), y, a.kv_heads)
    return fn


def layer_reference(inp: LayerInputs):
    """The float64 evaluation of set 0's step, a thunk the bench calls before the first contender
    runs: qkv_front's y, the block's k | v rows (bf16) written into set 0's slots (what the step
    inserts, so every contender's attention reads the same history plus its own insert), then
    attn2 over that cache."""
    from muse_ops.config import PAGE_SIZE
    from muse_ops.reference import rope_cos_sin
    from muse_ops.testing import attn2_f64, fp8_rows, inserted_rows_f64, qkv_front_f64
    c = inp.case
    a = c.attn

    def ref():
        cos_sin = rope_cos_sin(a.max_seq_len, device=inp.xs[0].device) if c.config.rope else None
        y64 = qkv_front_f64(inp.xs[0], inp.weights[0], inp.positions[0], cos_sin, a.kv_heads)
        slots = inp.slots[0]
        cache = inp.kv.kv_cache
        rows = inserted_rows_f64(y64, a.kv_heads)
        if a.fp8:   # what an FP8 insert stores: e4m3 of the bf16 rows by the scales (its bytes)
            rows = fp8_rows(rows.to(torch.bfloat16), inp.kv.k_scale, inp.kv.v_scale)
            cache.view(torch.uint8)[slots // PAGE_SIZE, :, slots % PAGE_SIZE] = rows.view(torch.uint8)
        else:
            cache[slots // PAGE_SIZE, :, slots % PAGE_SIZE] = rows.to(cache.dtype)
        return attn2_f64(y64.to(torch.bfloat16), cache, inp.kv.page_tables[0], inp.kv.seq_lens,
                         q_len=a.q_len, window=a.window, scale=a.scale, k_scale=inp.kv.k_scale,
                         v_scale=inp.kv.v_scale)
    return ref
