"""Device: how fast the GPU dispatches CTAs and clusters (the wide attn2 grid at B = 4-8 runs
1024-2048 CTAs in clusters of 8). A probe kernel of 128 threads whose CTAs read one word and run
`spin` iterations of a dependent FMA chain (a store that never happens keeps it), on grids of n
clusters of C CTAs with `smem` bytes of dynamic shared memory (which bounds the CTAs an SM
holds); us per launch by CUDA-graph replay of 20 launches. Findings: bench/RESULTS.md, sixteenth run.

    python3 tools/attn2_dev/launch_rate.py            (prints a table)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from muse_ops.cutedsl import runtime
from bench import timing as T


class Probe:
    def __init__(self, cluster: int, smem: int):
        self.cluster, self.smem = cluster, smem

    @cute.jit
    def __call__(self, mX: cute.Tensor, n_clusters: Int32, spin: Int32, stream):
        kw = {}
        if cutlass.const_expr(self.cluster > 1):
            kw["cluster"] = (self.cluster, 1, 1)
        self.kernel(mX, spin).launch(grid=(self.cluster, n_clusters, 1), block=(128, 1, 1),
                                     smem=self.smem, stream=stream, **kw)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, spin: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        t = mX[0]
        for _ in cutlass.range(spin, unroll=1):
            t = t * 0.999 + 0.001
        if tidx == 0:
            if t == Float32(12345.0):      # never: keeps the loop alive
                mX[1] = t


def main():
    dev = torch.device("cuda")
    x = torch.zeros(16, device=dev)
    rows = []
    for cluster in (1, 2, 4, 8):
        for smem in (40 * 1024, 100 * 1024):
            fn = cute.compile(Probe(cluster, smem), runtime.fake_tensor(Float32, (16,), align=16),
                              Int32(1), Int32(0), runtime.env_stream(), options=runtime.compile_options())
            for ctas in (128, 512, 1024, 2048, 4096):
                for spin in (0, 2000):
                    n = ctas // cluster

                    def one(i, fn=fn, n=n, spin=spin):
                        fn(x, n, spin)
                    us = T.graph_time_us(one, 1, replays=5, min_calls=20)["us"]
                    rows.append((cluster, smem // 1024, ctas, spin, us))
                    print(f"cluster {cluster} smem {smem // 1024} KB ctas {ctas} spin {spin}: {us:.2f} us", flush=True)
    print("| cluster | smem KB | spin | " + " | ".join(f"{c} CTAs" for c in (128, 512, 1024, 2048, 4096)) + " |")
    for cluster in (1, 2, 4, 8):
        for smem in (40, 100):
            for spin in (0, 2000):
                vals = [f"{r[4]:.2f}" for r in rows if r[:2] == (cluster, smem) and r[3] == spin]
                print(f"| {cluster} | {smem} | {spin} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main()
