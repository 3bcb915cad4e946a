"""The plan's qkv_front tile (wave_tile with whole-K tiles) against the cluster-only choice
(wave_tile over CLUSTER_WAVE_TILES, the plan before whole-K tiles) and cuBLAS's matmul, per (Hkv,
M) of AB_CASES, at the bench's cold-weight inputs: 3 interleaved rounds, medians; the two tiles'
y bits compared. GPU machine, after .device/prelude.sh and tools/device_env.sh:
    AB_CASES=2:640,2:1280,1:2048 python3 tools/qkv_front/plan_ab.py"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench import cases as C, timing as T  # noqa: E402
from muse_ops.cutedsl import qkv_front_plan as Q  # noqa: E402
from muse_ops.cutedsl.dev import launch_qkv_front  # noqa: E402
from muse_ops.errors import error_flag  # noqa: E402


def old_tile(m, h):
    return Q.tile_for(m, h) if m <= Q.WAVE_TILES_ABOVE else Q.wave_tile(m, h, Q.CLUSTER_WAVE_TILES)


cases = [tuple(int(v) for v in c.split(":")) for c in os.environ["AB_CASES"].split(",")]
dev = torch.device("cuda")
err = error_flag(dev)
for h, m in cases:
    new, old = Q.tile_for(m, h), old_tile(m, h)
    case = C.QkvCase(m, kv_heads=h)
    inp = C.build_qkv(case, dev, T.l2_bytes(dev))
    ys = [torch.empty(m, inp.weights[0].shape[0], dtype=torch.bfloat16, device=dev) for _ in range(inp.sets)]
    variants = [None] + ([{"tile": (old.tokens, old.heads)}] if old != new else [])
    graphs, outs = [], []
    for v in variants:
        def fn(i, v=v):
            launch_qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], inp.cos_sin, inp.kv_cache,
                             ys[i], err, override=v)
            return ys[i]
        outs.append(fn(0).clone())
        graphs.append(T.capture_calls(fn, inp.sets))
    same = all(torch.equal(o.view(torch.int16), outs[0].view(torch.int16)) for o in outs)
    cub = T.capture_calls(lambda i: torch.matmul(inp.xs[i], inp.weights[i].t()), inp.sets)
    times, cub_times = T.round_robin_us(graphs, cub, inp.sets)
    med = [statistics.median(t) for t in times + [cub_times]]
    old_us = med[1] if len(med) == 3 else med[0]
    line = (f"Hkv {h:2d} M {m:5d} new {new.tokens}x{new.heads}{'W' if new.whole_k else 'C'} {med[0]:8.2f}  "
            f"old {old.tokens}x{old.heads}C {old_us:8.2f}  cublas {med[-1]:8.2f}  new/old {med[0] / old_us:.3f} "
            f"new/cublas {med[0] / med[-1]:.3f} bits {'same' if same else 'DIFFERENT'}")
    print(line, flush=True)
    del graphs, cub, inp, ys
