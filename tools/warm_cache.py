"""Fill a muse_ops compile cache on this (CPU) machine with the CuTe DSL variants the GPU tests
and the bench launch, so a fresh GPU machine loads them instead of compiling (1-3 s each):

    MUSE_OPS_CACHE_DIR=build/muse_cache_ship CUTE_DSL_ARCH=sm_90a python tools/warm_cache.py
    tar -cJf .device/muse_cache.tar.xz -C build/muse_cache_ship .

and on the GPU machine tools/device_env.sh unpacks .device/muse_cache.tar.xz into
$MUSE_OPS_CACHE_DIR (once per machine). The cache directory is keyed by the kernel sources and
the DSL / TVM-FFI versions (muse_ops/cutedsl/compile_cache.py), so a stale archive is simply not
used.
"""
import sys
import time

from muse_ops.cutedsl import aot, launch


def main() -> int:
    """The variants an ahead-of-time library holds (aot.deployment_keys), into the disk cache."""
    t0 = time.perf_counter()
    keys = aot.deployment_keys()
    for _, cfg, family in keys:
        launch.COMPILE[family](cfg)
    print(f"{len(keys)} variants, {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
