"""Bench cases (docs/DESIGN.md section 14), their inputs and the bytes each op must move.

attn2: q_len 8, Hkv 2, page 16, bf16; (B, L, window) below plus a mixed batch (B=64, L uniform in
[512, 32768], seed 1234); then plain decode (q_len 1) and other tensor-parallel widths (Hkv 1, 4,
16: TP16, TP4, TP1), spelled (B, L, window, q_len, Hkv). qkv_front: M tokens, Hkv 2, RoPE on (a
sliding layer's front, the one with the longer epilogue). The layer cases are in bench/layer.py.

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

from muse_ops.config import DEFAULT_SCALE, GROUP, HEAD_DIM, HIDDEN, PAGE_SIZE, proj_cols

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
QKV_CASES = [1, 8, 16, 64, 72, 136, 200, 256, 300, 512, 1024, (8, 1), (8, 4), (8, 16), (512, 4), (256, 16)]
# M, or (M, Hkv); Hkv 2 otherwise; 72, 136, 200 and 300 (9, 17, 25 and 37.5 verify requests) end in a partial
# token tile; (512, 4) and (256, 16): the verify batches of the B=64 and B=32 layer rows at TP4 / TP1, where
# the K split is 1
QUICK_CPU_ATTN2 = [(1, 64, 0), (2, 40, 16)]
QUICK_CPU_QKV = [1, 8]
QUICK_GPU_ATTN2 = [(1, 512, 0), (1, 8192, 0), (64, 8192, 2048), ("mixed64", 32768, 0)]
QUICK_GPU_QKV = [8, 64, 512]


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

    @property
    def batch(self) -> int:
        return len(self.lens)

    def needed_keys(self, L: int) -> int:
        """Keys some query row of a request of length L sees (window-limited)."""
        return L if self.window == 0 else min(L, self.window + self.q_len - 1)

    def bytes(self) -> int:
        """KV rows needed x Hkv x 256 B + y's q and gate columns in + out + page-table entries."""
        hq = GROUP * self.kv_heads
        kv = sum(self.needed_keys(L) for L in self.lens) * self.kv_heads * 2 * HEAD_DIM * 2
        rows = self.batch * self.q_len
        io = rows * (2 * hq * HEAD_DIM * 2) + rows * hq * HEAD_DIM * 2
        pt = sum(pages_for(self.needed_keys(L)) + 1 for L in self.lens) * 4
        return kv + io + pt

    def flops(self) -> float:
        """Q K^T and P V of every query row over the keys it sees (the wgmma's zero rows of a
        decode block are not counted: they are the kernel's choice, not the op's work)."""
        hq = GROUP * self.kv_heads
        return sum(4.0 * self.q_len * hq * HEAD_DIM * self.needed_keys(L) for L in self.lens)


def case_suffix(window: int, q_len: int, kv_heads: int) -> str:
    return ((f" W={window}" if window else "") + (" decode" if q_len == 1 else "")
            + (f" Hkv={kv_heads}" if kv_heads != KV_HEADS else ""))


def attn2_case(spec) -> Attn2Case:
    """A case from (B, L, W[, q_len[, Hkv]]): the numbers left out take their defaults."""
    spec = tuple(spec)
    assert 3 <= len(spec) <= 5, spec
    b, L, w, q_len, kv_heads = spec + (Q_LEN, KV_HEADS)[len(spec) - 3:]
    suffix = case_suffix(w, q_len, kv_heads)
    if b == "mixed64":
        g = torch.Generator().manual_seed(MIXED_SEED)
        lens = torch.randint(512, L + 1, (64,), generator=g).tolist()
        return Attn2Case(f"mixed B=64 L~U[512,{L}]" + suffix, lens, w, L, kv_heads=kv_heads, q_len=q_len)
    return Attn2Case(f"B={b} L={L}" + suffix, [L] * b, w, L, kv_heads=kv_heads, q_len=q_len)


@dataclass
class QkvCase:
    m: int
    kv_heads: int = KV_HEADS
    rope: bool = True

    @property
    def name(self) -> str:
        return f"M={self.m}" + (f" Hkv={self.kv_heads}" if self.kv_heads != KV_HEADS else "")

    def bytes(self) -> int:
        """weight (N x 8192 x 2) + x + y + cache rows."""
        n = proj_cols(self.kv_heads)
        return n * HIDDEN * 2 + self.m * HIDDEN * 2 + self.m * n * 2 + self.m * self.kv_heads * 2 * HEAD_DIM * 2

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
    kv_cache: torch.Tensor                  # [pool, Hkv, 16, 128]
    page_tables: list[torch.Tensor]         # per set, int32 [B, max_pages]
    seq_lens: torch.Tensor                  # int32 [B] (same lengths in every set)
    ys: list[torch.Tensor]                  # per set, bf16 [B*q_len, N]
    sets: int
    note: str = ""
    extra: dict = field(default_factory=dict)


def build_attn2(case: Attn2Case, device, l2: int, sets: int | None = None, seed: int = 0) -> Attn2Inputs:
    g = torch.Generator().manual_seed(seed)
    kvh = case.kv_heads
    need = [pages_for(L) for L in case.lens]
    pps = sum(need)
    page_bytes = kvh * PAGE_SIZE * 2 * HEAD_DIM * 2
    touched = case.bytes()
    if sets is None:
        sets = rotation_sets(touched, pps * page_bytes, l2)
    pool = sets * pps
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    kv = torch.empty((pool, kvh, PAGE_SIZE, 2 * HEAD_DIM), dtype=torch.bfloat16, device=device)
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
    return Attn2Inputs(case, kv, tables, seq, ys, sets, note)


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
