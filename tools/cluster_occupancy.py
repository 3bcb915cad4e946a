"""How many clusters of each size the GPU holds at once when every CTA takes one SM (about 200 KB
of shared memory, as qkv_front's CTAs): cuOccupancyMaxActiveClusters on an empty kernel.
A K split S at Hkv 2 needs 36 clusters of S CTAs (or 18 of 2S with two head groups a cluster).

usage: [SMEM_KB="200,92"] [THREADS=288] [CLUSTERS="1,2,4,8"] python3 tools/cluster_occupancy.py
(attn2's occupancy caps: SMEM_KB="124,92,60,48,41.6" THREADS=128, attn2_plan.OCCUPANCY_SMEM_BYTES.)"""
import os

import torch
from cuda.bindings import driver as cu

PTX = b""".version 8.0
.target sm_90a
.address_size 64
.visible .entry empty() { ret; }
"""


def check(res):
    res = res if isinstance(res, tuple) else (res,)
    if res[0] != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(res[0])
    return res[1] if len(res) == 2 else res[1:]


def main():
    torch.zeros(1, device="cuda")           # a context
    mod = check(cu.cuModuleLoadData(PTX))
    fn = check(cu.cuModuleGetFunction(mod, b"empty"))
    threads = int(os.environ.get("THREADS", "288"))
    sizes = [int(c) for c in os.environ.get("CLUSTERS", ",".join(map(str, range(1, 17)))).split(",")]
    check(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
    for kb in os.environ.get("SMEM_KB", "200").split(","):
        smem = int(float(kb) * 1024)
        check(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
        for size in sizes:
            cfg = cu.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = size * 64, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
            cfg.sharedMemBytes = smem
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = size, 1, 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
            try:
                n = check(cu.cuOccupancyMaxActiveClusters(fn, cfg))
                print(f"smem {kb:>5s} KB, {threads} threads, cluster {size:2d}: {n} clusters at once ({n * size} CTAs)")
            except RuntimeError as exc:
                print(f"smem {kb:>5s} KB, cluster {size:2d}: {exc}")


if __name__ == "__main__":
    main()
