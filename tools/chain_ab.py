"""GPU machine: the PDL chain (bench/chain.py's stack of LAYERS layers, qkv_front -> attn2 -> ..., in
one CUDA graph, us per layer) with one op (CHAIN_OP: attn2, the default, or qkv_front) from muse_ops
against the same op from a kernel module copy, interleaved round after round in one process; then
every layer's out of both, compared in bits.
usage: CHAIN_OLD=path/to/kernel_copy.py [CHAIN_OP=qkv_front] [CHAIN_CASES="[(1, 8192, 0), ...]"]
       [CHAIN_ROUNDS=5] [CHAIN_OLD_OVER="{...}"] python3 tools/chain_ab.py
CHAIN_OLD_OVER: a launch-config override for the copy's launches (e.g. the tree it was built for)."""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench import chain, timing as T  # noqa: E402
from muse_ops.cutedsl.dev import kernel_copy, launch_attn2, launch_qkv_front  # noqa: E402

OLD = kernel_copy(os.environ["CHAIN_OLD"])
OP = os.environ.get("CHAIN_OP", "attn2")
assert OP in ("attn2", "qkv_front"), OP
CASES = eval(os.environ.get("CHAIN_CASES", "[(1, 8192, 0), (2, 8192, 0), (4, 8192, 0), (8, 8192, 0), "
                                           "(32, 8192, 0), (64, 8192, 0)]"))
ROUNDS = int(os.environ.get("CHAIN_ROUNDS", "5"))
OLD_OVER = eval(os.environ.get("CHAIN_OLD_OVER", "None"))
device = torch.device("cuda")
for spec in CASES:
    a, kv, layers, err = chain._stack(device, spec)
    if OLD_OVER and OP == "attn2":   # the copy's tree may need more workspace slots: one buffer for both
        from muse_ops.cutedsl import attn2_plan as P
        for layer in layers:
            c = layer["cfg"]
            old_bytes = P.workspace_layout(P._config(c.q_len, c.window, c.max_seq_len, **OLD_OVER), a.batch, a.kv_heads)[2]
            layer["ws"] = torch.zeros(max(old_bytes, layer["ws"].numel()), dtype=torch.uint8, device=device)

    def stack(kernel):
        # the copy (and its override) for OP's launches; the other op always from muse_ops
        copy = {"kernel": kernel, "override": OLD_OVER} if kernel is not None else {}
        front_kw, attn_kw = (copy, {}) if OP == "qkv_front" else ({}, copy)

        def fn(_):
            for layer in layers:
                launch_qkv_front(layer["x"], layer["w"], layer["pos"], layer["slots"], layer["cos_sin"],
                                 kv.kv_cache, layer["y"], err, **front_kw)
                c = layer["cfg"]
                launch_attn2(layer["y"], kv.kv_cache, layer["table"], kv.seq_lens, layer["out"], layer["ws"], err,
                             q_len=c.q_len, window=c.window, scale=c.scale, max_seq_len=c.max_seq_len, **attn_kw)
        return fn
    variants = {"old": OLD, "new": None}
    outs = {}
    for label, kernel in variants.items():
        stack(kernel)(0)
        torch.cuda.synchronize()
        outs[label] = [layer["out"].clone() for layer in layers]
    same = all(torch.equal(o.view(torch.int16), n.view(torch.int16)) for o, n in zip(outs["old"], outs["new"]))
    times = {label: [] for label in variants}
    for _ in range(ROUNDS):
        for label, kernel in variants.items():
            times[label].append(T.graph_time_us(stack(kernel), 1, min_calls=1)["us"] / chain.LAYERS)
    print(f"CHAIN {a.name:14s} {'same bits' if same else 'DIFFERENT bits'} | " + " | ".join(
        f"{label} {statistics.median(ts):6.2f} ({min(ts):.2f}-{max(ts):.2f})" for label, ts in times.items())
        + f" | error flag {int(err.item())}", flush=True)
    del layers, kv
    torch.cuda.empty_cache()
