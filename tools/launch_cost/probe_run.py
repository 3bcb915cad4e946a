"""With tools/launch_cost/probe.cpp preloaded (`tools/launch_cost/run.sh probe`): per call of each
public op, the host time of the op, of the C++ kernel's DSL launch function, and of the runtime
calls inside it; then the same with the DSL's cudaLaunchKernelEx routed to the driver's
cuLaunchKernelEx (mode 1), rounds interleaved, attn2's output compared bit for bit between the modes."""
import ctypes
import statistics
import sys

import torch

from bench.host import public_calls, timed_with_cpp_share

probe = ctypes.CDLL(sys.argv[1])
counters = (ctypes.c_longlong * 6)()


def read():
    probe.probe_read(counters)
    return list(counters)


rows = {}
with torch.inference_mode():
    calls = public_calls()
    ops = {op: calls[op] for op in ("attn2", "qkv_front")}
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
                p0 = read()
                us, share = timed_with_cpp_share(op, fn)
                p1 = read()
                per = lambda i: (p1[2 * i] - p0[2 * i]) / max(1, p1[2 * i + 1] - p0[2 * i + 1]) / 1e3  # noqa: E731
                for name, v in (("op", us), ("C++ body", share["cpp"]), ("DSL launch fn", share["launch"]),
                                ("its cudaLaunchKernelEx", per(0)), ("its cudaGetDevice", per(1)),
                                ("its TVMFFIEnvGetStream", per(2))):
                    rows.setdefault((op, mode, name), []).append(v)
for (op, mode, name), v in rows.items():
    print(f"{op:10s} {'runtime' if mode == 0 else 'driver ':8s} {name:24s} {statistics.median(v):6.2f}"
          f"  ({' '.join(f'{t:.2f}' for t in v)})")
