"""Dump the PTX of every variant CI compiles (both ops, `registry.ci_variants`) for sm_90a on this
machine (no GPU needed), one folder per variant named by its config, for `tools/ptx_identity.sh`.

    python tools/ptx_dump.py DIR [attn2|qkv_front ...]

A refactor that claims "same code" diffs a dump before it against one after it:
    tools/ptx_identity.sh BEFORE_DIR AFTER_DIR
"""
import hashlib
import os
import sys
import time


def main() -> None:
    dump = os.path.abspath(sys.argv[1])
    ops = sys.argv[2:] or ["attn2", "qkv_front"]
    os.environ["MUSE_OPS_CACHE_DIR"] = "off"      # compile everything, write nothing to the disk cache
    from muse_ops.cutedsl import registry
    for op in ops:
        kernel = registry.family(op).kernel_module()
        for cfg in registry.ci_variants(op):
            name = f"{op}-{hashlib.sha1(repr(cfg).encode()).hexdigest()[:12]}"
            folder = os.path.join(dump, name)
            os.makedirs(folder, exist_ok=True)   # the DSL writes no PTX into a missing folder
            with open(os.path.join(folder, "config.txt"), "w") as f:
                f.write(repr(cfg) + "\n")
            t = time.perf_counter()
            kernel._compile(cfg, f"--keep-ptx --dump-dir={folder}")
            ptx = [f for f in os.listdir(folder) if f.endswith(".ptx")]
            assert len(ptx) == 1, (folder, ptx)
            os.replace(os.path.join(folder, ptx[0]), os.path.join(folder, "kernel.ptx"))   # one name per variant
            print(f"{name} {time.perf_counter() - t:.1f}s {cfg}", flush=True)


if __name__ == "__main__":
    main()
