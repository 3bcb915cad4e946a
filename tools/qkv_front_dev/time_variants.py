"""Time qkv_front variants against cuBLAS (matmul alone) and cuBLAS + the stock Triton epilogue,
side by side in one process: CUDA-graph replay over rotating weight copies (bench.timing), Hkv 2
with RoPE unless QF_HKV / QF_ROPE say otherwise. QF_M: comma-separated M values; QF_TILES: extra
forced (tile x heads) variants, e.g. "128x1,256x2". Prints one line per (M, contender)."""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench import cases as C, contenders as K, timing as T  # noqa: E402
from muse_ops.cutedsl import launch as Q, qkv_front_plan as P  # noqa: E402
from muse_ops.errors import error_flag  # noqa: E402

ms = [int(v) for v in os.environ.get("QF_M", "1,8,16,64,128,256,512").split(",")]
kv_heads = int(os.environ.get("QF_HKV", "2"))
rope = os.environ.get("QF_ROPE", "1") == "1"
tiles = [tuple(int(a) for a in t.split("x")) for t in os.environ.get("QF_TILES", "").split(",") if t]
dev = torch.device("cuda")
l2 = T.l2_bytes(dev)
print(f"qkv_front variants, Hkv {kv_heads}, rope {rope}, k_split {P.k_split(kv_heads)}", flush=True)
for m in ms:
    case = C.QkvCase(m, kv_heads=kv_heads, rope=rope)
    inp = C.build_qkv(case, dev, l2)
    err = error_flag(dev)
    rows = {}
    names = ["muse:cutedsl", "cublas", "cublas+triton"] + [f"tile {t}x{h}" for t, h in tiles]
    for name in names:
        if name == "cublas":
            fn = lambda i: torch.matmul(inp.xs[i], inp.weights[i].t())  # noqa: E731
        elif name.startswith("tile"):
            t, h = (int(v) for v in name.split()[1].split("x"))
            ys = [torch.empty(m, inp.weights[0].shape[0], dtype=torch.bfloat16, device=dev) for _ in range(inp.sets)]

            def fn(i, t=t, h=h, ys=ys):
                Q.launch_qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], inp.cos_sin,
                                   inp.kv_cache, ys[i], err, _cfg_override={"tile": (t, h)})
                return ys[i]
        else:
            fn = K.build_qkv_contender(name, inp, dev)
        res = T.graph_time_us(fn, inp.sets)
        rows[name] = res["us"]
        extra = ""
        if name == "muse:cutedsl":
            extra = f"  eager {T.eager_time_us(fn, inp.sets):.1f} us"
        print(f"M={m:4d} {name:16s} {res['us']:8.2f} us (p20 {res['p20']:.2f} p80 {res['p80']:.2f}){extra}", flush=True)
    floor = case.bytes() / 4.15e12 * 1e6
    print(f"M={m:4d} floor {floor:.2f} us; ours/cublas {rows['muse:cutedsl'] / rows['cublas']:.2f}, "
          f"cublas+triton/ours {rows['cublas+triton'] / rows['muse:cutedsl']:.2f}", flush=True)
    del inp
    torch.cuda.empty_cache()
assert int(error_flag(dev).item()) == 0, "device error flag set"
