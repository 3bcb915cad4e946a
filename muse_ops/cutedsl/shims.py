"""The C++ ops (csrc_shims/muse_shims.cpp): build, load and feed them. No cutlass import.

Loaded, the C++ library owns the public schemas `muse::qkv_front` and `muse::attn2` and their
CUDA kernels: an eager call on a GPU checks its metadata and launches its kernel in C++ (a few
microseconds of host time) where the Python host path takes tens. What the C++ path does not serve
goes to the Python implementation (`muse::_qkv_front_py` / `muse::_attn2_py`, registered by
ops.py): bad metadata (so errors are the package's own), checked mode, another backend, inputs
that require grad, an empty batch, and variants not yet registered here. Python registers each
variant when it first compiles or loads it (`offer_*`, and `prepare` offers every variant of a
deployment), so after a deployment's first step of each shape, or after prepare, every call takes
the C++ path. `stats()` counts both paths; `last_backend` reads which one ran last.

Where the library comes from (MUSE_OPS_SHIMS):
  unset      muse_ops/_shims*.so or muse_ops/libmuse_shims.so if one was built, else none
  0 / off    never load it (the pure-Python ops)
  PATH       this library (an error if it does not load)
Build it with `python -m muse_ops build-shims` (g++ against the installed torch, into
muse_ops/libmuse_shims.so) or `MUSE_OPS_BUILD_SHIMS=1 pip install --no-build-isolation -e .`
(torch's CppExtension). It needs torch's headers and apache-tvm-ffi's C headers, no CUDA toolkit,
and must be built against the torch it runs with. A library that fails to load is reported
(logger "muse_ops", `status()`), never silently skipped.
"""
from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch

ENV = "MUSE_OPS_SHIMS"
ABI = 6     # muse_shims_abi in csrc_shims/muse_shims.cpp
LIBRARY_NAME = "libmuse_shims.so"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Where the C++ source is: the checkout's csrc_shims/ (an editable install), else the copy that
# setup.py's build_py puts into an installed package (a wheel has no csrc_shims/ beside it).
SOURCES = (PACKAGE_DIR.parent / "csrc_shims" / "muse_shims.cpp", PACKAGE_DIR / "csrc" / "muse_shims.cpp")
OPS = ("qkv_front", "attn2")

log = logging.getLogger("muse_ops")
_state = {"loaded": False, "why": "not loaded yet", "path": None}
_offered: dict = {}     # registration key -> the function object (kept alive while C++ holds it)


def _find() -> Path | None:
    env = os.environ.get(ENV, "").strip()
    if env:
        return None if env.lower() in ("0", "off", "no") else Path(env)
    for pattern in ("_shims*.so", LIBRARY_NAME):
        found = sorted(PACKAGE_DIR.glob(pattern))
        if found:
            return found[0]
    return None


@functools.lru_cache(maxsize=1)
def load() -> bool:
    """Load the C++ ops once per process (before ops.py defines anything); whether they loaded."""
    path = _find()
    if path is None:
        _state["why"] = (f"disabled (${ENV}={os.environ.get(ENV)})" if os.environ.get(ENV, "").strip()
                         else "no C++ library built (python -m muse_ops build-shims)")
        return False
    named = bool(os.environ.get(ENV, "").strip())
    try:
        marker = f"muse_shims_abi={ABI};".encode()
        if marker not in path.read_bytes():
            raise RuntimeError(f"built from other sources (no {marker.decode()} marker): rebuild it with "
                               "`python -m muse_ops build-shims`")
        torch.ops.load_library(str(path))
    except Exception as exc:  # noqa: BLE001  (reported, and the Python ops serve)
        _state["why"] = f"{path} failed to load ({type(exc).__name__}: {exc})"
        if named:
            raise RuntimeError(f"${ENV}={path}: {_state['why']}") from exc
        log.warning("muse_ops: the C++ ops are not used: %s", _state["why"])
        return False
    try:
        _configure("")
    except Exception as exc:
        # the library has defined the public schemas by now, so the Python ops cannot take over
        raise RuntimeError(f"{path} loaded but did not accept the plan's tables ({type(exc).__name__}: "
                           f"{exc}): rebuild it with `python -m muse_ops build-shims`, or set ${ENV}=0") from exc
    _state.update(loaded=True, path=path, why=f"{path}")
    return True


def loaded() -> bool:
    return _state["loaded"]


def status() -> str:
    """Which C++ library serves the ops, or why none does."""
    return _state["why"]


def _configure(libtvm_ffi: str) -> None:
    """Hand the C++ side the plan's tables (and, once a variant is offered, TVM-FFI's library)."""
    from . import attn2_plan, qkv_front_plan
    tiles = qkv_front_plan.TILES
    torch.ops.muse._shims_configure([limit for limit, *_ in tiles], [t for _, t, _, _ in tiles],
                                    [h for _, _, h, _ in tiles], attn2_plan.WIDE_MAX_PAIRS,
                                    attn2_plan.WIDE_MAX_PAIRS_WINDOW, attn2_plan.OCCUPANCY_MAX_CAP["wide"],
                                    attn2_plan.OCCUPANCY_MAX_CAP["deep"], libtvm_ffi)


@functools.lru_cache(maxsize=1)
def _ffi_configured() -> None:
    import tvm_ffi
    _configure(str(tvm_ffi.libinfo.find_libtvm_ffi()))


def _handle(fn) -> int | None:
    import tvm_ffi
    if not isinstance(fn, tvm_ffi.Function):
        fn = getattr(fn, "_tvm_ffi_function", None)
    return fn.__chandle__() if isinstance(fn, tvm_ffi.Function) else None


def offer_qkv_front(cfg, fn) -> None:
    """Let the C++ path launch this qkv_front variant (a default variant of the plan)."""
    from .qkv_front_plan import TILES
    key = ("qkv_front", cfg)
    if not loaded() or key in _offered:
        return
    tile = next((i for i, (_, t, h, k) in enumerate(TILES) if (t, h, k) == (cfg.token_tile, cfg.heads_per_cta,
                                                                             cfg.k_tiles_per_stage)), None)
    handle = _handle(fn)
    if tile is None or handle is None:
        return
    _ffi_configured()
    torch.ops.muse._shims_add_qkv_front(tile, cfg.rope, cfg.pos_dtype == "int64", cfg.slot_dtype == "int64", handle)
    _offered[key] = fn


def offer_attn2(cfg, max_seq_len: int, fn) -> None:
    """Let the C++ path launch this attn2 variant for the deployment (q_len, window, max_seq_len)."""
    key = ("attn2", cfg.q_len, cfg.window, int(max_seq_len), cfg.layout, cfg.ctas_per_sm)
    if not loaded() or key in _offered:
        return
    handle = _handle(fn)
    if handle is None:
        return
    _ffi_configured()
    torch.ops.muse._shims_add_attn2(cfg.q_len, cfg.window, int(max_seq_len), cfg.wide, cfg.ctas_per_sm, cfg.slots,
                                    cfg.ctas_per_pair, cfg.cluster_size, handle)
    _offered[key] = fn


def clear() -> None:
    """Forget every registered variant (compile_cache.clear_memory: the functions may be freed)."""
    if loaded():
        torch.ops.muse._shims_clear()
    _offered.clear()


def set_backend(name: str | None) -> None:
    if loaded():
        torch.ops.muse._shims_set_backend(name)


def note_python(op: str) -> None:
    """A call of `op` ran in Python (last_backend then reads Python's record)."""
    if loaded():
        torch.ops.muse._shims_note_python(OPS.index(op))


def last_was_cpp(op: str) -> bool:
    return loaded() and bool(torch.ops.muse._shims_stats()[4 + OPS.index(op)])


def stats() -> dict:
    """Calls served by the C++ path ("cpp") and handed to Python ("python") per op, the C++ path's
    mean host time per call ("cpp_us": the whole C++ kernel; "launch_us": its kernel call; means
    over the "clocked" calls, those made while set_clock(True); a layer step in one C++ call
    counts for both ops but is not clocked), and the variants registered ("qkv_front variants",
    "attn2 deployments")."""
    if not loaded():
        return {}
    s = torch.ops.muse._shims_stats()

    def per_op(i: int) -> dict:   # the layout of _shims_stats (csrc_shims/muse_shims.cpp, stats)
        n, clocked = s[2 * i], s[16 + i]
        ns = {"cpp_ns": s[8 + i], "launch_ns": s[10 + i], "plan_ns": s[12 + i], "alloc_ns": s[14 + i]}
        us = {k.replace("_ns", "_us"): (round(ns[k] / clocked / 1e3, 2) if clocked else None)
              for k in ("cpp_ns", "launch_ns")}
        return {"cpp": n, "python": s[2 * i + 1], "clocked": clocked, **us, **ns}
    return {op: per_op(i) for i, op in enumerate(OPS)} | {"qkv_front variants": s[6], "attn2 deployments": s[7]}


def set_clock(on: bool) -> None:
    """Whether the C++ path times its parts (stats()'s "*_ns"; off by default: the clock reads
    cost ~0.15 us a call). The call counts are kept either way."""
    if loaded():
        torch.ops.muse._shims_set_clock(bool(on))


def error_flag(device: torch.device) -> torch.Tensor | None:
    """The C++ side's error flag of `device` (the one its kernels write), or None."""
    if not loaded() or device.type != "cuda":
        return None
    try:
        return torch.ops.muse._shims_error_flag(device.index)
    except Exception:  # noqa: BLE001  (an unsupported device: the Python flag serves)
        return None


# ------------------------------------------------------------------------------------ build
def source() -> Path:
    """The C++ source this package builds (SOURCES: the checkout's, else the installed copy)."""
    for path in SOURCES:
        if path.is_file():
            return path
    raise RuntimeError("the C++ source muse_shims.cpp is in neither " + " nor ".join(map(str, SOURCES))
                       + ": reinstall muse_ops from a checkout or an sdist")


def build_command(output: Path) -> list[str]:
    from torch.utils import cpp_extension
    try:
        import tvm_ffi
    except ImportError as exc:
        raise RuntimeError("building the C++ ops needs apache-tvm-ffi's C headers: "
                           "pip install 'muse_ops[cuda]' (or apache-tvm-ffi)") from exc
    cmd = [os.environ.get("CXX", "g++"), "-std=c++20", "-O2", "-fPIC", "-shared", "-Wall", str(source()), "-o",
           str(output), f"-I{tvm_ffi.libinfo.find_include_path()}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    cmd += [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    return cmd


def build(output: Path | None = None) -> Path:
    """Compile csrc_shims/muse_shims.cpp against the installed torch (default: into the package,
    where `load` finds it)."""
    output = Path(output) if output else PACKAGE_DIR / LIBRARY_NAME
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    command = build_command(partial)
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError as exc:
        raise RuntimeError(f"no C++ compiler {command[0]!r} (set CXX to one that takes -std=c++20)") from exc
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{command[0]} failed with exit status {exc.returncode} (its messages are above); "
                           f"the command: {' '.join(command)}") from exc
    os.replace(partial, output)    # never rewrite in place a library this process may have loaded
    return output


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m muse_ops.cutedsl.shims", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the C++ ops against the installed torch")
    b.add_argument("--output", default=None, help=f"default: muse_ops/{LIBRARY_NAME}")
    a = ap.parse_args(argv)
    print(build(a.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
