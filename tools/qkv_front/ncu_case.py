"""One qkv_front case for ncu: python3 tools/qkv_front/ncu_case.py M [Hkv [OVERRIDE]]: the bench's inputs
(cold weights), the default variant (or the launch-config override OVERRIDE, Python syntax, e.g.
"{'tile': (112, 3), 'whole_k': True}") launched 3 times, then cuBLAS's matmul 3 times (for its DRAM
throughput)."""
import ast
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench import cases as C, timing as T  # noqa: E402
from muse_ops.cutedsl.dev import launch_qkv_front  # noqa: E402
from muse_ops.errors import error_flag  # noqa: E402

m = int(sys.argv[1])
kv_heads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
override = ast.literal_eval(sys.argv[3]) if len(sys.argv) > 3 else None
dev = torch.device("cuda")
err = error_flag(dev)
inp = C.build_qkv(C.QkvCase(m, kv_heads=kv_heads), dev, T.l2_bytes(dev))
y = torch.empty(m, inp.weights[0].shape[0], dtype=torch.bfloat16, device=dev)
for i in range(3):
    launch_qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], inp.cos_sin, inp.kv_cache, y, err,
                     override)
for i in range(3):
    torch.matmul(inp.xs[i], inp.weights[i].t())
torch.cuda.synchronize()
print("case", m, kv_heads, override, "error flag", int(err.item()), flush=True)
