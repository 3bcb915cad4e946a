"""Bench cases (docs/DESIGN.md section 14), their inputs and the bytes each op must move.

attn2: q_len 8, Hkv 2, page 16, bf16; (B, L, window) below plus a mixed batch (B=64, L uniform in
[512, 32768], seed 1234); then plain decode (q_len 1) and other tensor-parallel widths (Hkv 1, 4,
16: TP16, TP4, TP1), spelled (B, L, window, q_len, Hkv). qkv_front: M tokens, Hkv 2, RoPE on (a
sliding layer's front, the one with the longer epilogue). The layer cases are in bench/layer.py.

The cache dtype is a dimension of the attn2 and layer cases (`attn2_case(spec, cache_dtype=...)`,
the bench's --cache-dtype): "bf16", or "fp8" (float8_e4m3fn, docs/DESIGN.md section 3b; the case
name ends in " fp8"). An FP8 case's cache holds e4m3(N(0,1) / scale): k_scale one float for the
tensor (FP8_K_SCALE), v_scale one per KV head (fp8_scales), so the dequantized keys and values are
N(0,1) as in the bf16 cases, and neither scale is 1. That split is the one every peer takes
through its own arguments: FlashInfer's k_scale is one float (folded into its softmax scale) and
its v_scale multiplies its output (a per-head tensor broadcasts), FA3's descales are per (request,
KV head); muse takes either per tensor or per head. Its bytes count the KV rows at 1 byte per
element, plus the two scales.

Inputs are built as n rotating sets: attn2 sets share one page pool, each set's requests on
their own scattered pages (so a set's pages are distinct from every other set's), and each set
has its own y; qkv_front sets each have their own weight copy, x and slots. n is chosen so that
the bytes one pass over all sets touches are >= ROTATE_L2X times L2 (capped by memory and a
node count); where one set alone is larger than that, n = 1 (noted in the row).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from muse_ops.config import DEFAULT_SCALE, FP8_MAX, GROUP, HEAD_DIM, HIDDEN, PAGE_SIZE, proj_cols

KV_HEADS = 2
Q_LEN = 8
ROTATE_L2X = 4          # pass over >= 4x L2 between two uses of one set
MAX_SETS = 512
POOL_BYTES_CAP = 12 << 30   # one layout's page pool (muse's; FA4's and Flex's copies are the same size)
MIXED_SEED = 1234

ATTN2_CASES = [(1, 512, 0), (1, 8192, 0), (8, 2048, 0), (8, 8192, 0), (8, 16384, 0), (8, 32768, 0),
               (32, 4096, 0), (64, 8192, 0), (128, 16384, 0),
               (16, 65536, 0), (1, 8192, 2048), (8, 8192, 2048), (64, 8192, 2048), (128, 16384, 2048),
               (1, 131072, 0), ("mixed64", 32768, 0),
               # plain decode (q_len 1)
               (1, 8192, 0, 1, 2), (32, 4096, 0, 1, 2), (128, 16384, 0, 1, 2), (128, 16384, 2048, 1, 2),
               # TP16 / TP4 / TP1 widths
               (1, 8192, 0, 8, 1), (1, 8192, 0, 8, 4), (1, 8192, 0, 8, 16),
               (32, 4096, 0, 8, 1), (32, 4096, 0, 8, 4), (32, 4096, 0, 8, 16)]
QKV_CASES = [1, 8, 16, 64, 72, 128, 136, 200, 256, 300, 512, 768, 1024, 1536, 2048, (8, 1), (8, 4), (8, 16),
             (512, 1), (1024, 1), (512, 4), (1024, 4), (512, 8), (1024, 8), (256, 16), (512, 16), (1024, 16)]
# M, or (M, Hkv); Hkv 2 otherwise; 72, 136, 200 and 300 (9, 17, 25 and 37.5 verify requests) end in a partial
# token tile; (512, 4) and (256, 16): the verify batches of the B=64 and B=32 layer rows at TP4 / TP1, where
# the K split is 1; 128 to 2048 and (512 | 1024, Hkv): the serving batch sizes (16 to 256 verify requests)
# --suite serving (issue 49): qkv_front from 128 tokens at every Hkv beside cuBLAS's matmul alone
SERVING_QKV_CASES = [128, 256, 512, 768, 1024, 1536, 2048, (512, 1), (1024, 1), (512, 4), (1024, 4), (512, 8),
                     (1024, 8), (256, 16), (512, 16), (1024, 16)]
QUICK_CPU_ATTN2 = [(1, 64, 0), (2, 40, 16)]
QUICK_CPU_QKV = [1, 8]
QUICK_GPU_ATTN2 = [(1, 512, 0), (1, 8192, 0), (64, 8192, 2048), ("mixed64", 32768, 0)]
QUICK_GPU_QKV = [8, 64, 512]
# The FP8 suite (--suite fp8, issue 48's targets): verify and decode at B=128 L=16384, the long
# contexts, TP1's Hkv 16, B=64 and B=1 at L=8192, one sliding case; the layer's are in bench/layer.py
FP8_ATTN2_CASES = [(128, 16384, 0), (128, 16384, 0, 1, 2), (16, 65536, 0), (8, 32768, 0), (32, 4096, 0, 8, 16),
                   (64, 8192, 0), (1, 8192, 0), (64, 8192, 2048)]

CACHE_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
ELEMENT_BYTES = {"bf16": 2, "fp8": 1}
FP8_K_SCALE = 6.0 / FP8_MAX      # keys: one scale for the tensor, amax 6 (of N(0,1)) at e4m3's 448
FP8_V_AMAX = (5.0, 6.0, 7.0, 8.0)   # values: one scale per KV head, amax 5-8 cycling over the heads


def fp8_scales(kv_heads: int) -> tuple[list[float], list[float]]:
    """(k_scale, v_scale) of an FP8 case: k one float (per tensor), v one per KV head; every
    value other than 1, and such that float(e4m3(x / scale)) * scale is N(0,1) for x ~ N(0,1)."""
    return [FP8_K_SCALE], [FP8_V_AMAX[h % len(FP8_V_AMAX)] / FP8_MAX for h in range(kv_heads)]


def parse_cache_dtypes(text: str) -> list[str]:
    """"bf16,fp8" -> ["bf16", "fp8"] (the bench's --cache-dtype), checked."""
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in CACHE_DTYPES]
    if bad or not out:
        raise ValueError(f"--cache-dtype: a comma list of {sorted(CACHE_DTYPES)}, got {text!r}")
    return out


def pages_for(n: int) -> int:
    return -(-n // PAGE_SIZE)


@dataclass
class Attn2Case:
    name: str
    lens: list[int]
    window: int
    max_seq_len: int
    kv_heads: int = KV_HEADS
    q_len: int = Q_LEN
    scale: float = DEFAULT_SCALE
    cache_dtype: str = "bf16"          # "bf16" or "fp8" (float8_e4m3fn with scales)

    @property
    def batch(self) -> int:
        return len(self.lens)

    @property
    def fp8(self) -> bool:
        return self.cache_dtype == "fp8"

    @property
    def dtype(self) -> torch.dtype:
        return CACHE_DTYPES[self.cache_dtype]

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.cache_dtype]

    @property
    def scales(self) -> tuple[list[float], list[float]] | tuple[None, None]:
        """(k_scale, v_scale) as lists of floats for an FP8 case, (None, None) for bf16."""
        return fp8_scales(self.kv_heads) if self.fp8 else (None, None)

    def scale_bytes(self) -> int:
        """The fp32 scales an FP8 call reads (0 for bf16)."""
        k, v = self.scales
        return 4 * (len(k) + len(v)) if self.fp8 else 0

    @property
    def base_name(self) -> str:
        """The name without the cache dtype: the same case in bf16 and in FP8."""
        return self.name.removesuffix(" fp8")

    def needed_keys(self, L: int) -> int:
        """Keys some query row of a request of length L sees (window-limited)."""
        return L if self.window == 0 else min(L, self.window + self.q_len - 1)

    def kv_bytes(self) -> int:
        """The KV rows some query row sees: rows x Hkv x 128 elements x (2 bytes bf16, 1 FP8)."""
        return sum(self.needed_keys(L) for L in self.lens) * self.kv_heads * 2 * HEAD_DIM * self.element_bytes

    def bytes(self) -> int:
        """KV rows needed x Hkv x 128 x element size (256 B bf16, 128 B FP8) + y's q and gate
        columns in + out + page-table entries (+ an FP8 case's two scales)."""
        hq = GROUP * self.kv_heads
        rows = self.batch * self.q_len
        io = rows * (2 * hq * HEAD_DIM * 2) + rows * hq * HEAD_DIM * 2
        pt = sum(pages_for(self.needed_keys(L)) + 1 for L in self.lens) * 4
        return self.kv_bytes() + io + pt + self.scale_bytes()

    def flops(self) -> float:
        """Q K^T and P V of every query row over the keys it sees (the wgmma's zero rows of a
        decode block are not counted: they are the kernel's choice, not the op's work)."""
        hq = GROUP * self.kv_heads
        return sum(4.0 * self.q_len * hq * HEAD_DIM * self.needed_keys(L) for L in self.lens)


def case_suffix(window: int, q_len: int, kv_heads: int, cache_dtype: str = "bf16") -> str:
    return ((f" W={window}" if window else "") + (" decode" if q_len == 1 else "")
            + (f" Hkv={kv_heads}" if kv_heads != KV_HEADS else "") + (" fp8" if cache_dtype == "fp8" else ""))


def attn2_case(spec, cache_dtype: str = "bf16") -> Attn2Case:
    """A case from (B, L, W[, q_len[, Hkv]]): the numbers left out take their defaults; the cache
    dtype "bf16" or "fp8"."""
    spec = tuple(spec)
    assert 3 <= len(spec) <= 5, spec
    assert cache_dtype in CACHE_DTYPES, cache_dtype
    b, L, w, q_len, kv_heads = spec + (Q_LEN, KV_HEADS)[len(spec) - 3:]
    suffix = case_suffix(w, q_len, kv_heads, cache_dtype)
    if b == "mixed64":
        g = torch.Generator().manual_seed(MIXED_SEED)
        lens = torch.randint(512, L + 1, (64,), generator=g).tolist()
        return Attn2Case(f"mixed B=64 L~U[512,{L}]" + suffix, lens, w, L, kv_heads=kv_heads, q_len=q_len,
                         cache_dtype=cache_dtype)
    return Attn2Case(f"B={b} L={L}" + suffix, [L] * b, w, L, kv_heads=kv_heads, q_len=q_len, cache_dtype=cache_dtype)


@dataclass
class QkvCase:
    m: int
    kv_heads: int = KV_HEADS
    rope: bool = True
    cache_dtype: str = "bf16"          # the cache it inserts into (the layer's FP8 cases: "fp8")

    @property
    def name(self) -> str:
        return (f"M={self.m}" + (f" Hkv={self.kv_heads}" if self.kv_heads != KV_HEADS else "")
                + (" fp8" if self.cache_dtype == "fp8" else ""))

    def bytes(self) -> int:
        """weight (N x 8192 x 2) + x + y + cache rows (Hkv x 128 x element size; an FP8 insert also
        reads its two scales)."""
        n = proj_cols(self.kv_heads)
        rows = self.m * self.kv_heads * 2 * HEAD_DIM * ELEMENT_BYTES[self.cache_dtype]
        scales = 4 * sum(map(len, fp8_scales(self.kv_heads))) if self.cache_dtype == "fp8" else 0
        return n * HIDDEN * 2 + self.m * HIDDEN * 2 + self.m * n * 2 + rows + scales

    def flops(self) -> float:
        """The projection's 2 M N K (the epilogue's norm and RoPE are a few FLOPs per output)."""
        return 2.0 * self.m * HIDDEN * proj_cols(self.kv_heads)


def qkv_case(spec) -> QkvCase:
    m, kv_heads = spec if isinstance(spec, tuple) else (spec, KV_HEADS)
    return QkvCase(m, kv_heads=kv_heads)


def rotation_sets(per_set_touched: int, per_set_pool: int, l2: int, max_sets: int = MAX_SETS) -> int:
    want = max(1, math.ceil(ROTATE_L2X * l2 / max(per_set_touched, 1)))
    by_mem = max(1, POOL_BYTES_CAP // max(per_set_pool, 1))
    return int(max(1, min(want, by_mem, max_sets)))


@dataclass
class Attn2Inputs:
    case: Attn2Case
    kv_cache: torch.Tensor                  # [pool, Hkv, 16, 128], bf16 or float8_e4m3fn
    page_tables: list[torch.Tensor]         # per set, int32 [B, max_pages]
    seq_lens: torch.Tensor                  # int32 [B] (same lengths in every set)
    ys: list[torch.Tensor]                  # per set, bf16 [B*q_len, N]
    sets: int
    note: str = ""
    extra: dict = field(default_factory=dict)
    k_scale: torch.Tensor | None = None     # FP8: fp32 [1] (per tensor)
    v_scale: torch.Tensor | None = None     # FP8: fp32 [Hkv] (per KV head)


FILL_CHUNK_BYTES = 256 << 20   # fp32 staging per chunk when an FP8 pool is filled


def fill_fp8_cache(kv: torch.Tensor, k_scale: list[float], v_scale: list[float], generator) -> None:
    """Fill an e4m3 cache [pages, Hkv, 16, 128] with e4m3(x / scale), x ~ N(0,1), keys by k_scale
    and values by v_scale (one value, or one per KV head), saturated to +-448 as qkv_front stores
    them; chunk by chunk through fp32."""
    pages, kvh = kv.shape[0], kv.shape[1]
    dev = kv.device
    ks = torch.tensor(k_scale, dtype=torch.float32, device=dev).reshape(-1).expand(kvh)[None, :, None, None]
    vs = torch.tensor(v_scale, dtype=torch.float32, device=dev).reshape(-1).expand(kvh)[None, :, None, None]
    step = max(1, FILL_CHUNK_BYTES // (kvh * PAGE_SIZE * 2 * HEAD_DIM * 4))
    raw = kv.view(torch.uint8)
    for p0 in range(0, pages, step):
        n = min(step, pages - p0)
        f = torch.empty((n, kvh, PAGE_SIZE, 2 * HEAD_DIM), dtype=torch.float32, device=dev).normal_(generator=generator)
        f[..., :HEAD_DIM] /= ks
        f[..., HEAD_DIM:] /= vs
        raw[p0:p0 + n] = f.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        del f


def build_attn2(case: Attn2Case, device, l2: int, sets: int | None = None, seed: int = 0) -> Attn2Inputs:
    g = torch.Generator().manual_seed(seed)
    kvh = case.kv_heads
    need = [pages_for(L) for L in case.lens]
    pps = sum(need)
    page_bytes = kvh * PAGE_SIZE * 2 * HEAD_DIM * case.element_bytes
    touched = case.bytes()
    if sets is None:
        sets = rotation_sets(touched, pps * page_bytes, l2)
    pool = sets * pps
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    kv = torch.empty((pool, kvh, PAGE_SIZE, 2 * HEAD_DIM), dtype=case.dtype, device=device)
    k_scale = v_scale = None
    if case.fp8:
        ks, vs = case.scales
        fill_fp8_cache(kv, ks, vs, dev_gen)
        k_scale = torch.tensor(ks, dtype=torch.float32, device=device)
        v_scale = torch.tensor(vs, dtype=torch.float32, device=device)
    else:
        kv.normal_(generator=dev_gen)
    perm = torch.randperm(pool, generator=g).to(torch.int32)
    width = pages_for(case.max_seq_len)
    tables, ys = [], []
    n = proj_cols(kvh)
    for s in range(sets):
        t = torch.full((case.batch, width), -1, dtype=torch.int32)
        start = s * pps
        for r, k in enumerate(need):
            t[r, :k] = perm[start:start + k]
            start += k
        tables.append(t.to(device))
        ys.append(torch.randn((case.batch * case.q_len, n), generator=g).to(torch.bfloat16).to(device))
    seq = torch.tensor(case.lens, dtype=torch.int32, device=device)
    rot = sets * touched
    note = f"{sets} sets, {rot / 2**20:.0f} MiB rotated"
    if rot < ROTATE_L2X * l2:
        note += " (one pass < 4x L2: sets capped by memory)" if sets > 1 else \
            (" (one pool, larger than L2)" if touched > l2 else " (one set, fits L2: warm)")
    return Attn2Inputs(case, kv, tables, seq, ys, sets, note, k_scale=k_scale, v_scale=v_scale)


# ----------------------------------------------------------------------------- KV capacity
# How many tokens a GPU's KV cache holds, per layer and rank (the table the bench prints beside
# the FP8 rows): a GPU's memory as marketed (80 GB: the H100; 141 GB: the H200), taken in GiB as
# their HBM is sized (the H100's 80 GB are 80 GiB), KV_FRACTION of it for the KV cache (weights,
# activations and workspaces in the rest), all of it given to one layer's cache; a token of one
# layer on one rank is Hkv x 128 elements (K and V, 64 each). A model of n attention layers holds
# 1/n of these tokens per layer.
GPU_MEMORY_GB = (80, 141)
KV_FRACTION = 0.90
TOKENS_KV_HEADS = (2, 16)


def kv_cache_tokens(memory_gb: float, kv_heads: int, cache_dtype: str, fraction: float = KV_FRACTION) -> int:
    """Tokens of one layer's cache (per rank) in `fraction` of `memory_gb` GiB:
    bytes / (Hkv x 128 x element size)."""
    cache_bytes = int(memory_gb * 2**30 * fraction)
    return cache_bytes // (kv_heads * 2 * HEAD_DIM * ELEMENT_BYTES[cache_dtype])


def kv_tokens_table(memory_gb=GPU_MEMORY_GB, kv_heads=TOKENS_KV_HEADS, fraction: float = KV_FRACTION) -> list[dict]:
    return [{"gpu_gb": m, "kv_heads": h, "fraction": fraction,
             "bytes_per_token": {d: h * 2 * HEAD_DIM * ELEMENT_BYTES[d] for d in CACHE_DTYPES},
             "tokens": {d: kv_cache_tokens(m, h, d, fraction) for d in CACHE_DTYPES}}
            for m in memory_gb for h in kv_heads]


def format_kv_tokens_table(rows: list[dict] | None = None) -> str:
    rows = kv_tokens_table() if rows is None else rows
    frac = rows[0]["fraction"] if rows else KV_FRACTION
    lines = [f"### KV cache capacity: tokens per layer and rank ({frac:.0%} of the GPU's memory for the cache, "
             "all of it one layer's)",
             "| GPU memory | Hkv | bytes / token bf16 | bytes / token fp8 | tokens bf16 | tokens fp8 | fp8 / bf16 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        t, b = r["tokens"], r["bytes_per_token"]
        lines.append(f"| {r['gpu_gb']} GB | {r['kv_heads']} | {b['bf16']} | {b['fp8']} | {t['bf16']:,} | "
                     f"{t['fp8']:,} | {t['fp8'] / t['bf16']:.2f} |")
    return "\n".join(lines)


@dataclass
class QkvInputs:
    case: QkvCase
    xs: list[torch.Tensor]
    weights: list[torch.Tensor]
    positions: list[torch.Tensor]
    slots: list[torch.Tensor]
    cos_sin: torch.Tensor | None
    kv_cache: torch.Tensor
    sets: int
    note: str = ""


def build_qkv(case: QkvCase, device, l2: int, sets: int | None = None, seed: int = 0) -> QkvInputs:
    from muse_ops.reference import rope_cos_sin
    g = torch.Generator().manual_seed(seed)
    n = proj_cols(case.kv_heads)
    wbytes = n * HIDDEN * 2
    if sets is None:
        sets = rotation_sets(case.bytes(), wbytes, l2, max_sets=64)
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    weights = []
    for _ in range(sets):
        w = torch.empty((n, HIDDEN), dtype=torch.bfloat16, device=device)
        w.normal_(0.0, HIDDEN ** -0.5, generator=dev_gen)
        weights.append(w)
    xs = [torch.randn((case.m, HIDDEN), generator=g).to(torch.bfloat16).to(device) for _ in range(sets)]
    pages = max(16, pages_for(sets * case.m) * 2)
    kv = torch.zeros((pages, case.kv_heads, PAGE_SIZE, 2 * HEAD_DIM), dtype=torch.bfloat16, device=device)
    perm = torch.randperm(pages * PAGE_SIZE, generator=g)
    slots = [perm[s * case.m:(s + 1) * case.m].to(device) for s in range(sets)]
    positions = [torch.randint(0, 32768, (case.m,), generator=g).to(device) for _ in range(sets)]
    cos_sin = rope_cos_sin(32768, device=device) if case.rope else None
    note = f"{sets} weight copies, {sets * case.bytes() / 2**20:.0f} MiB rotated"
    return QkvInputs(case, xs, weights, positions, slots, cos_sin, kv, sets, note)
