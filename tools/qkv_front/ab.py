"""Interleaved A/B timing of qkv_front variants (overrides of the launch config) and cuBLAS, one
CUDA graph per (M, variant) over rotating weight copies, timed round-robin (AB_ROUNDS rounds,
bench/timing.round_robin_us; median of the rounds' medians). AB_M: M values; AB_VARIANTS:
';'-separated override dicts in Python syntax ({} = the default; "no_rope": True launches
without cos_sin, unchecked; "kernel": "path/to/copy.py" compiles a copy of the kernel module
instead, an A/B of two sources; "split": S forces another K split, which changes the bits by
design). Checks every variant's y against
float64 (within tolerance) and against the first variant's bits first (a variant with
"epilogue": False or "no_rope" is not checked). GPU machine, after
.device/prelude.sh and tools/device_env.sh:
    AB_M=8,16 AB_VARIANTS="{};{'mma_lag': 1}" python3 tools/qkv_front/ab.py"""
import ast
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench import cases as C, timing as T  # noqa: E402
from muse_ops.cutedsl.dev import kernel_copy, launch_qkv_front  # noqa: E402
from muse_ops.errors import error_flag  # noqa: E402
from muse_ops.testing import qkv_front_f64, tolerance_report  # noqa: E402

ms = [int(v) for v in os.environ.get("AB_M", "8").split(",")]
variants = [ast.literal_eval(v) for v in os.environ.get("AB_VARIANTS", "{}").split(";")]
rounds = int(os.environ.get("AB_ROUNDS", "3"))
kv_heads = int(os.environ.get("AB_HKV", "2"))
dev = torch.device("cuda")
err = error_flag(dev)
for m in ms:
    case = C.QkvCase(m, kv_heads=kv_heads)
    inp = C.build_qkv(case, dev, T.l2_bytes(dev))
    ys = [torch.empty(m, inp.weights[0].shape[0], dtype=torch.bfloat16, device=dev) for _ in range(inp.sets)]
    ref64 = qkv_front_f64(inp.xs[0], inp.weights[0], inp.positions[0], inp.cos_sin, kv_heads)
    graphs, base = [], None
    for v in variants:
        def fn(i, v=v):
            over = dict(v)
            cos_sin = None if over.pop("no_rope", False) else inp.cos_sin   # development: RoPE off
            kernel = over.pop("kernel", None)
            launch_qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], cos_sin,
                             inp.kv_cache, ys[i], err, override=over,
                             kernel=kernel_copy(kernel) if kernel else None)
            return ys[i]
        y0 = fn(0).clone()
        if v.get("epilogue", True) and not v.get("no_rope"):
            rep = tolerance_report(y0, ref64)
            same = "" if base is None else (" same bits" if torch.equal(y0.view(torch.int16), base.view(torch.int16))
                                           else " DIFFERENT bits")
            base = y0 if base is None else base
            print(f"M={m} {v}: within tolerance {rep['ok']} (max {rep['max_abs']:.2e}){same}", flush=True)
        graphs.append(T.capture_calls(fn, inp.sets))
    cub = T.capture_calls(lambda i: torch.matmul(inp.xs[i], inp.weights[i].t()), inp.sets)
    times, cub_times = T.round_robin_us(graphs, cub, inp.sets, rounds)
    times.append(cub_times)
    for v, t in zip(variants + ["cublas matmul"], times):
        print(f"M={m:4d} {str(v):60s} {statistics.median(t):8.2f} us  ({' '.join(f'{x:.2f}' for x in t)})", flush=True)
    del graphs, cub, inp, ys
    torch.cuda.empty_cache()
print("error flag", int(err.item()))
