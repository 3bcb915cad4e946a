"""attn2's timing cases on the GPU, for tools/attn2/ab.py and ncu_case.py: the kernel module
(muse_ops' own, or the copy of attn2.py at ATTN2_FILE, compiled from its own source), a case's
inputs with a cold KV cache (scattered pages in pools that together exceed 200 MB; bf16, or e4m3
with the override fp8=1) and its
per-call time by CUDA-graph replay (bench.timing). ab.py sets A and KERNEL per variant."""
import math
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from bench import timing as T  # noqa: E402
from test_attn2_cutedsl import SCALE  # noqa: E402


def load_kernel(path=None):
    """The attn2 kernel module: muse_ops' own, or the copy at path (A/B of two versions)."""
    if path is None:
        from muse_ops.cutedsl import attn2
        return attn2
    from muse_ops.cutedsl.dev import kernel_copy
    return kernel_copy(path)


A = load_kernel(os.environ.get("ATTN2_FILE"))
from muse_ops.cutedsl.dev import launch_attn2  # noqa: E402
KERNEL = A if os.environ.get("ATTN2_FILE") else None   # a copy: compiled from its own source

dev = "cuda"


def build_case(B, L, window, q_len=8, hkv=2, lens=None, over=None, msl=1 << 18):
    """Inputs of one timing case: page pools that together exceed 200 MB (cold KV), the rest, and
    a workspace sized for the layout the launch will use."""
    lens = lens or [L] * B
    over = dict(over or {})
    fp8 = bool(over.get("fp8", False))      # an e4m3 cache (override fp8=1), scales None
    cfg = A.launch_config(B, hkv, q_len, window, msl, over)
    npg = [(l + 15) // 16 for l in lens]
    first = [max(0, l - q_len - window + 1) // 16 if window else 0 for l in lens]
    vis = sum(n - f for n, f in zip(npg, first))
    pool_bytes = vis * hkv * 16 * 128 * (1 if fp8 else 2)
    n_pools = max(1, min(16, math.ceil(200e6 / pool_bytes)))
    width = max(npg) + 1
    pools = []
    for i in range(n_pools):
        cache = torch.randn(vis + 8, hkv, 16, 128, device=dev, dtype=torch.bfloat16)
        if fp8:
            cache = cache.to(torch.float8_e4m3fn)
        perm = torch.randperm(vis + 8, device=dev).to(torch.int32)
        pt = torch.full((B, width), -1, dtype=torch.int32, device=dev)
        o = 0
        for r in range(B):
            n = npg[r] - first[r]
            pt[r, first[r]:npg[r]] = perm[o:o + n]
            o += n
        pools.append((cache, pt))
    return SimpleNamespace(
        pools=pools, pool_bytes=pool_bytes, cfg=cfg,
        seq=torch.tensor(lens, dtype=torch.int32, device=dev),
        y=torch.randn(q_len * B, 1152 * hkv, device=dev).to(torch.bfloat16),
        out=torch.empty(q_len * B, 512 * hkv, device=dev, dtype=torch.bfloat16),
        ws=torch.zeros(A.workspace_layout(cfg, B, hkv)[2], dtype=torch.uint8, device=dev),
        err=torch.zeros(1, dtype=torch.int32, device=dev),
        kw=dict(q_len=q_len, window=window, scale=SCALE, max_seq_len=msl, override=over))


def graph_us(case, reps=20, replays=5):
    """Per-call us (median) of one CUDA graph of max(reps, pools) launches cycling the pools
    (bench.timing's capture and timer)."""
    def one_call(i):
        c, p = case.pools[i]
        launch_attn2(case.y, c, p, case.seq, case.out, case.ws, case.err, kernel=KERNEL, **case.kw)
    return T.graph_time_us(one_call, len(case.pools), replays=replays, min_calls=reps)["us"]


def bench_case(B, L, window, q_len=8, hkv=2, lens=None, over=None, reps=20, msl=1 << 18):
    case = build_case(B, L, window, q_len, hkv, lens, over, msl)
    us = graph_us(case, reps)
    assert int(case.err.item()) == 0, case.err
    return us, case.pool_bytes / 4.1e12 * 1e6, case.pool_bytes
