"""Fill a muse_ops compile cache on this (CPU) machine with the CuTe DSL variants the GPU tests
and the bench launch, so a fresh GPU machine loads them instead of compiling (1-3 s each):

    MUSE_OPS_CACHE_DIR=/tmp/muse_cache_ship CUTE_DSL_ARCH=sm_90a python tools/warm_cache.py
    tar -cJf .device/muse_cache.tar.xz -C /tmp/muse_cache_ship .

and on the GPU machine `mkdir -p $MUSE_OPS_CACHE_DIR && tar -xJf .device/muse_cache.tar.xz -C
$MUSE_OPS_CACHE_DIR`. The cache directory is keyed by the kernel sources and the DSL / TVM-FFI
versions (muse_ops/cutedsl/compile_cache.py), so a stale archive is simply not used.
"""
import itertools
import sys
import time

from muse_ops.cutedsl import launch, registry

MAX_SEQ_LENS = (512, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def main() -> int:
    t0 = time.perf_counter()
    n = len(launch.compile_all_for_ci("qkv_front"))
    print(f"qkv_front: {n} variants, {time.perf_counter() - t0:.0f} s", flush=True)
    seen = set()
    for q_len, window, msl in itertools.product((1, 8), (0, 2048), MAX_SEQ_LENS):
        for cfg in registry.family("attn2").plan_module().deployment_variants(
                kv_heads=2, q_len=q_len, window=window, max_seq_len=msl):
            if cfg.compile_key not in seen:
                seen.add(cfg.compile_key)
                launch.compile_attn2(cfg)
    print(f"attn2: {len(seen)} variants, {time.perf_counter() - t0:.0f} s total", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
