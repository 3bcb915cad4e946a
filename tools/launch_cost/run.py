"""Host cost of the pieces of a launch, beside the C++ ops' own kernel call, in one process:
the driver's cuLaunchKernelEx of an empty kernel (plain, with a 2-CTA cluster, with cluster and
PDL), cuTensorMapEncodeTiled, and the shims' measured kernel call (the DSL's generated launch
function) for attn2 and qkv_front. Run on the GPU machine by `tools/launch_cost/run.sh pieces`."""
import ctypes
import statistics
import sys

import torch

from bench.host import public_calls, timed_with_cpp_share

ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
pieces = ctypes.CDLL(sys.argv[1])
for name in ("hb_launch", "hb_encode", "hb_ctx"):
    getattr(pieces, name).restype = ctypes.c_double
torch.zeros(1, device="cuda")
assert pieces.hb_setup(100 * 1024) == 0
rows = {k: [] for k in ("attn2 op (us)", "attn2 C++ body", "attn2 DSL launch fn", "qkv_front op", "qkv_front C++ body",
                        "qkv_front DSL launch fn", "cuLaunchKernelEx plain", "cuLaunchKernelEx cluster 2",
                        "cuLaunchKernelEx cluster 2 + PDL", "cuTensorMapEncodeTiled", "cuCtxGetCurrent+GetDevice")}
with torch.inference_mode():
    calls = public_calls()
    for _ in range(7):
        for op in ("attn2", "qkv_front"):
            us, share = timed_with_cpp_share(op, calls[op])
            rows[f"{op} op" + (" (us)" if op == "attn2" else "")].append(us)
            rows[f"{op} C++ body"].append(share["cpp"])
            rows[f"{op} DSL launch fn"].append(share["launch"])
        for mode, name in ((0, "plain"), (1, "cluster 2"), (3, "cluster 2 + PDL")):
            rows[f"cuLaunchKernelEx {name}"].append(pieces.hb_launch(mode, 100 * 1024, 7) / 1e3)
        rows["cuTensorMapEncodeTiled"].append(pieces.hb_encode(7) / 1e3)
        rows["cuCtxGetCurrent+GetDevice"].append(pieces.hb_ctx(7) / 1e3)
for k, v in rows.items():
    print(f"{k:36s} {statistics.median(v):6.2f}  ({' '.join(f'{t:.2f}' for t in v)})")
