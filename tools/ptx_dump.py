"""Dump the PTX of every variant CI compiles (both ops, `registry.ci_variants`) for sm_90a on this
machine (no GPU needed), one folder per variant named by its config, for `tools/ptx_identity.sh`.

    python tools/ptx_dump.py DIR [attn2|qkv_front ...]

A refactor that claims "same code" diffs a dump before it against one after it:
    tools/ptx_identity.sh BEFORE_DIR AFTER_DIR
"""
import dataclasses
import hashlib
import os
import sys
import time

# Config fields added after dumps were first taken, with the default that generates the code as
# before: left out of a folder's name where they hold that default, so a dump from before a field
# existed still compares with one after it.
LATER_FIELDS = {"fp8": False, "x_multicast": False, "whole_k": False, "w_multicast": False,
                "register_reallocation": False, "page_box": False, "refill_warp": 0,
                "landing_barriers": False}


def variant_name(op: str, cfg) -> str:
    fields = [f for f in dataclasses.fields(cfg)
              if not (f.name in LATER_FIELDS and getattr(cfg, f.name) == LATER_FIELDS[f.name])]
    text = f"{type(cfg).__name__}(" + ", ".join(f"{f.name}={getattr(cfg, f.name)!r}" for f in fields) + ")"
    return f"{op}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def main() -> None:
    dump = os.path.abspath(sys.argv[1])
    ops = sys.argv[2:] or ["attn2", "qkv_front"]
    os.environ["MUSE_OPS_CACHE_DIR"] = "off"      # compile everything, write nothing to the disk cache
    from muse_ops.cutedsl import registry
    for op in ops:
        kernel = registry.family(op).kernel_module()
        for cfg in registry.ci_variants(op):
            name = variant_name(op, cfg)
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
