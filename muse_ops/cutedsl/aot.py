"""Ahead-of-time kernels: every variant a deployment launches, exported by the CuTe DSL (its
TVM-FFI export) and linked into one shared library, so a deployment runs the kernels with
neither the DSL compiler nor compile time at start-up (`prepare` becomes a load).

Build it where the DSL is installed (a CPU machine will do: the kernels compile for sm_90a there):

    python -m muse_ops.cutedsl.aot build DIR [--runtime]

DIR then holds `libmuse_kernels_sm90a.so` and its manifest `libmuse_kernels_sm90a.json` (the
variants it holds, the fingerprint of the kernel sources they were built from, and the DSL's CUDA
toolkit flavor that compiled them: build with `nvidia-cutlass-dsl[cu13]` for machines whose
driver runs CUDA 13, whose ptxas makes the FP8 attn2 variants faster; on a machine without a
driver the DSL takes the newest flavor installed); with
--runtime also the DSL's runtime library `libcute_dsl_runtime.so`, which the kernels call
(found next to the library through its RUNPATH; otherwise on the loader's path). Run with

    MUSE_OPS_AOT_LIBRARY=DIR/libmuse_kernels_sm90a.so

and only apache-tvm-ffi (with torch-c-dlpack-ext) besides torch: compile_cache asks the library
before its disk cache and before compiling. A variant the library lacks is compiled as before
where the DSL is importable, and is an error naming the variant where it is not. A library built
from other kernel sources than the installed ones is not used (its status says so), so it can
never run stale code. Nothing here imports cutlass except `build`.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LIBRARY_ENV = "MUSE_OPS_AOT_LIBRARY"
LIBRARY_NAME = "libmuse_kernels_sm90a.so"
RUNTIME_NAME = "libcute_dsl_runtime.so"
FORMAT = 2
# the max_seq_lens of the attn2 deployments a library holds by default (deployment_keys)
DEPLOYMENT_MAX_SEQ_LENS = (512, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
# the SM counts the C++ ops' table plans attn2 for (the sm_90 parts: H100 / H200 SXM and NVL, H100
# PCIe, H20); on a device of another count a call is planned by Python (without Python: refused)
SHIMS_SM_COUNTS = (132, 114, 78)


def manifest_path(library: Path) -> Path:
    return library.with_suffix(".json")


def shims_table_path(library: Path) -> Path:
    return library.with_suffix(".shims")


def shims_table(entries: dict, max_seq_lens=DEPLOYMENT_MAX_SEQ_LENS, sm_counts=SHIMS_SM_COUNTS) -> str:
    """The table the C++ ops read when a program without Python loads the library
    (csrc_shims/muse_shims.cpp, `_shims_load_library`): the rows Python hands them
    (muse_ops/cutedsl/shims.py: the model's sizes, the KV-head tables, and each attn2 deployment
    the library holds a variant of, planned for devices of sm_counts SMs), then a row per kernel
    held, its key and its symbol."""
    from . import shims
    rows = [f"# muse_ops shims table: the plan's tables and the variants of {LIBRARY_NAME}",
            f"shims_table {shims.TABLE_FORMAT}", *shims.model_rows(), *shims.kv_heads_rows()]
    for key, name in entries.items():
        if key.startswith("('qkv_front'"):
            cfg = _qkv_front_configs().get(key)
            kernel = shims.qkv_front_key(cfg) if cfg is not None else None
            if kernel is not None:
                rows.append(f"{kernel} {name}")
    devices = [(n, shims.wave_ctas_of(n)) for n in sm_counts]
    for q_len in (1, 8):
        for window in (0, 2048):
            for msl in max_seq_lens:
                names = [entries.get(repr(("attn2", cfg.compile_key, "")))
                         for cfg in shims.attn2_variants(q_len, window, msl)]
                if any(names):
                    rows += shims.attn2_rows(q_len, window, msl, devices)
                    rows += [f"{shims.attn2_key(q_len, window, msl, i)} {name}" for i, name in enumerate(names) if name]
    return "\n".join(rows) + "\n"


def _qkv_front_configs() -> dict:
    from . import qkv_front_plan
    return {repr(("qkv_front", cfg, "")): cfg for cfg in qkv_front_plan.ci_variants()}


def symbol(key) -> str:
    from .compile_cache import _entry_name
    return f"muse_{_entry_name(key)}"


class _Library:
    def __init__(self):
        self.path: Path | None = None
        self.entries: dict = {}
        self.module = None
        self.functions: dict = {}
        self.why = ""


@functools.lru_cache(maxsize=1)
def _library() -> _Library:
    lib = _Library()
    env = os.environ.get(LIBRARY_ENV, "").strip()
    if not env:
        lib.why = f"none configured (${LIBRARY_ENV} unset)"
        return lib
    path = Path(env)
    try:
        manifest = json.loads(manifest_path(path).read_text())
    except Exception as exc:  # noqa: BLE001
        lib.why = f"{path}: no readable manifest {manifest_path(path).name} ({type(exc).__name__}: {exc})"
        return lib
    from .compile_cache import source_fingerprint
    if manifest.get("format") != FORMAT or manifest.get("fingerprint") != source_fingerprint():
        lib.why = (f"{path}: built from other kernel sources (fingerprint {manifest.get('fingerprint')}, "
                   f"installed {source_fingerprint()}): not used")
        return lib
    try:
        import tvm_ffi
        lib.module = tvm_ffi.load_module(str(path))
    except Exception as exc:  # noqa: BLE001
        lib.why = f"{path}: failed to load ({type(exc).__name__}: {exc})"
        return lib
    lib.path, lib.entries = path, manifest["entries"]
    lib.why = f"{path} ({len(lib.entries)} variants, built by the DSL's {manifest.get('cuda_toolkit', '?')})"
    return lib


def available() -> bool:
    return _library().module is not None


def status() -> str:
    """Which library serves variants, or why none does (for reports and error messages)."""
    return _library().why


def lookup(key):
    """The library's function for `key`, or None."""
    lib = _library()
    if lib.module is None:
        return None
    name = lib.entries.get(repr(key))
    if name is None:
        return None
    fn = lib.functions.get(name)
    if fn is None:
        fn = lib.functions[name] = lib.module[name]
    return fn


def reset() -> None:
    """Forget the loaded library (tests: the next lookup reads the environment again)."""
    _library.cache_clear()


# ------------------------------------------------------------------------------------ build
def deployment_keys(max_seq_lens=DEPLOYMENT_MAX_SEQ_LENS):
    """(key, config, family) of what a library holds by default: every qkv_front variant CI
    compiles (every tile, RoPE on / off, both index dtypes; the FP8 cache's with int64 indices)
    and the attn2 variants of Hkv-any deployments with q_len 1 and 8, windows 0 and 2048, bf16
    and FP8 caches, over these max_seq_lens (a variant covers a range of them: duplicates are
    dropped)."""
    from . import attn2_plan, qkv_front_plan
    out, seen = [], set()
    for cfg in qkv_front_plan.ci_variants():
        out.append((("qkv_front", cfg, ""), cfg, "qkv_front"))
    for q_len in (1, 8):
        for window in (0, 2048):
            for msl in max_seq_lens:
                for cfg in (attn2_plan.deployment_variants(2, q_len, window, msl)
                            + attn2_plan.deployment_variants(2, q_len, window, msl, fp8=True)
                            + attn2_plan.deployment_variants(attn2_plan.COARSE_TREE_KV_HEADS, q_len, window, msl)
                            + attn2_plan.deployment_variants(attn2_plan.COARSE_TREE_KV_HEADS, q_len, window, msl,
                                                             fp8=True)):
                    key = ("attn2", cfg.compile_key, "")
                    if key not in seen:
                        seen.add(key)
                        out.append((key, cfg, "attn2"))
    return out


def build(directory, with_runtime: bool = False, keys=None, log=print) -> Path:
    """Compile every variant of `keys` (deployment_keys() by default), export each under its own
    symbol and link them into DIR/libmuse_kernels_sm90a.so with its manifest. Needs the CuTe DSL
    and a C++ linker (g++ or $CXX)."""
    import cutlass
    import tvm_ffi
    from cutlass.cute.export import aot_config
    from . import attn2, qkv_front
    from .compile_cache import dsl_toolkit, source_fingerprint
    from .runtime import COMPILE_ARCH
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    keys = deployment_keys() if keys is None else keys
    kernels = {"qkv_front": qkv_front, "attn2": attn2}
    entries = {}
    with tempfile.TemporaryDirectory() as tmp:
        objects = []
        for i, (key, cfg, fam) in enumerate(keys):
            fn = kernels[fam]._compile(cfg, "")
            name = symbol(key)
            obj = Path(tmp) / f"{name}.o"
            fn.export_to_c(object_file_path=str(obj), function_name=name)
            objects.append(str(obj))
            entries[repr(key)] = name
            if log and (i + 1) % 10 == 0:
                log(f"  exported {i + 1} / {len(keys)}")
        library = directory / LIBRARY_NAME
        ffi_dir = str(Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent)
        cmd = ([os.environ.get("CXX", "g++"), "-shared", "-o", str(library), *objects,
                f"-L{aot_config.get_libdir()}", "-lcute_dsl_runtime", f"-L{ffi_dir}", "-ltvm_ffi",
                "-Wl,-rpath,$ORIGIN"])
        subprocess.run(cmd, check=True)
    manifest = {"format": FORMAT, "fingerprint": source_fingerprint(), "arch": COMPILE_ARCH,
                "cutlass": getattr(cutlass, "__version__", "?"), "tvm_ffi": getattr(tvm_ffi, "__version__", "?"),
                # the toolkit flavor whose ptxas made the code (compile_cache.dsl_toolkit); with
                # --runtime its runtime library comes along, and a cu13 one needs a CUDA 13 driver
                "cuda_toolkit": dsl_toolkit(), "runtime": RUNTIME_NAME, "entries": entries}
    manifest_path(library).write_text(json.dumps(manifest, indent=1) + "\n")
    shims_table_path(library).write_text(shims_table(entries))
    if with_runtime:
        shutil.copy2(Path(aot_config.get_libdir()) / RUNTIME_NAME, directory / RUNTIME_NAME)
    return library


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m muse_ops.cutedsl.aot", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile, export and link every deployment variant")
    b.add_argument("directory")
    b.add_argument("--runtime", action="store_true", help=f"copy the DSL's {RUNTIME_NAME} next to the library")
    a = ap.parse_args(argv)
    os.environ.setdefault("MUSE_OPS_CACHE_DIR", "off")
    lib = build(a.directory, with_runtime=a.runtime)
    print(f"{lib}: {len(json.loads(manifest_path(lib).read_text())['entries'])} variants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
