"""With tools/launch_cost/probe.cpp preloaded (`tools/launch_cost/run.sh probe`): per call of each
public op, the host time of the op, of the C++ kernel's DSL launch function, and of the runtime
calls inside it; then the same with the DSL's cudaLaunchKernelEx routed to the driver's
cuLaunchKernelEx (mode 1), rounds interleaved, attn2's output compared bit for bit between the modes."""
import ctypes
import statistics
import sys

import torch

from bench.host import DEFAULT_SCALE, _inputs, host_us
from muse_ops.cutedsl import shims

probe = ctypes.CDLL(sys.argv[1])
counters = (ctypes.c_longlong * 6)()


def read():
    probe.probe_read(counters)
    return list(counters)


b, cache, x, w, ws = _inputs(1, 512)
kw = dict(q_len=8, window=0, scale=DEFAULT_SCALE, max_seq_len=16384)
rows = {}
with torch.inference_mode():
    y = torch.ops.muse.qkv_front(x, w, b.positions, b.slots, None, cache)
    ops = {"attn2": lambda: torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, ws, **kw),
           "qkv_front": lambda: torch.ops.muse.qkv_front(x, w, b.positions, b.slots, None, cache)}
    outs = {}
    for mode in (0, 1):
        probe.probe_mode(mode)
        outs[mode] = ops["attn2"]().clone()
        torch.cuda.synchronize()
    print("attn2 output identical across modes:", torch.equal(outs[0], outs[1]), flush=True)
    for _ in range(7):
        for mode in (0, 1):
            probe.probe_mode(mode)
            for op, fn in ops.items():
                s0, p0 = shims.stats()[op], read()
                us = host_us(fn)
                s1, p1 = shims.stats()[op], read()
                n = s1["cpp"] - s0["cpp"]
                per = lambda i: (p1[2 * i] - p0[2 * i]) / max(1, p1[2 * i + 1] - p0[2 * i + 1]) / 1e3  # noqa: E731
                for name, v in (("op", us), ("C++ body", (s1["cpp_ns"] - s0["cpp_ns"]) / n / 1e3),
                                ("DSL launch fn", (s1["launch_ns"] - s0["launch_ns"]) / n / 1e3),
                                ("its cudaLaunchKernelEx", per(0)), ("its cudaGetDevice", per(1)),
                                ("its TVMFFIEnvGetStream", per(2))):
                    rows.setdefault((op, mode, name), []).append(v)
for (op, mode, name), v in rows.items():
    print(f"{op:10s} {'runtime' if mode == 0 else 'driver ':8s} {name:24s} {statistics.median(v):6.2f}"
          f"  ({' '.join(f'{t:.2f}' for t in v)})")
