"""The C++ ops (csrc_shims/): build, load and feed them. No cutlass import.

Loaded, the C++ library owns the public schemas `muse::qkv_front` and `muse::attn2` and their
CUDA kernels: an eager call on a GPU checks its metadata and launches its kernel in C++ (a few
microseconds of host time) where the Python host path takes tens. What the C++ path does not serve
goes to the Python implementation (`muse::_qkv_front_py` / `muse::_attn2_py`, registered by
ops.py): bad metadata (so errors are the package's own), checked mode, another backend, inputs
that require grad, an empty batch, an FP8 cache, and what its tables do not cover.

Python decides, C++ looks up: the C++ side holds no plan rule. This module hands it the plan's
tables, built from the plan modules (qkv_front_plan, attn2_plan) and config.py, as rows of text
(`_shims_table`; an ahead-of-time library's `.shims` file holds the same rows, so a program without
Python plans identically):
  model, cache_dtypes          the sizes the metadata checks compare against; the cache dtypes a
                               kernel key names by index
  kv_heads (Hkv 1..TABLE_KV_HEADS)
                               the K split, the projection's and attn2's output widths, and the
                               token tile of every M up to TABLE_MAX_TOKENS
  attn2_deployment, attn2_plan (per deployment registered)
                               the workspace each variant needs per (request, KV head) pair, and per
                               device SM count and Hkv the variant of every R up to
                               TABLE_MAX_REQUESTS, with the kernel's wave argument
A call outside the tables (more tokens or requests, another Hkv, a device of another SM count)
goes to Python, which plans it. The kernels follow as Python compiles or loads them (`offer_*`,
and `prepare` offers every variant of a deployment), so after a deployment's first step of each
shape, or after prepare, every call takes the C++ path. `stats()` counts both paths;
`last_backend` reads which one ran last.

Where the library comes from (MUSE_OPS_SHIMS):
  unset      muse_ops/_shims*.so or muse_ops/libmuse_shims.so if one was built, else none
  0 / off    never load it (the pure-Python ops)
  PATH       this library (an error if it does not load)
Build it with `python -m muse_ops build-shims` (g++ against the installed torch, into
muse_ops/libmuse_shims.so) or `MUSE_OPS_BUILD_SHIMS=1 pip install --no-build-isolation -e .`
(torch's CppExtension). It needs torch's headers and apache-tvm-ffi's C headers, no CUDA toolkit,
and must be built against the torch it runs with. A library that fails to load is reported
(logger "muse_ops", `status()`), never silently skipped.

The development library (csrc_shims/muse_shims_dev.cpp: the dispatcher floors, the fast path with a
host clock, the lookups the tests compare with the plan) is built only on request
(`python -m muse_ops build-shims --dev`) and loaded only by `load_dev()` (bench/host.py,
tools/host_floors.py, tests/test_shims.py); the package never loads it.
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
ABI = 8            # MUSE_SHIMS_ABI in csrc_shims/muse_shims.h
TABLE_FORMAT = 5   # kTableFormat in csrc_shims/muse_shims.cpp: the first row of a `.shims` file
LIBRARY_NAME = "libmuse_shims.so"
DEV_LIBRARY_NAME = "libmuse_shims_dev.so"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Where the C++ sources are: the checkout's csrc_shims/ (an editable install), else the copy that
# setup.py's build_py puts into an installed package (a wheel has no csrc_shims/ beside it).
SOURCE_DIRS = (PACKAGE_DIR.parent / "csrc_shims", PACKAGE_DIR / "csrc")
HEADER = "muse_shims.h"
LIBRARY_SOURCES = ("muse_shims.cpp", "muse_bindings.cpp")
DEV_SOURCES = ("muse_shims_dev.cpp",)
OPS = ("qkv_front", "attn2")

# What the tables cover; every call outside them is planned by Python.
TABLE_KV_HEADS = 16         # Hkv 1..16: any tensor-parallel rank of the model (16 KV heads in all)
TABLE_MAX_TOKENS = 4096     # qkv_front launches of up to this many tokens
TABLE_MAX_REQUESTS = 1024   # attn2 launches of up to this many requests

log = logging.getLogger("muse_ops")
_state = {"loaded": False, "why": "not loaded yet", "path": None}
_dev = {"path": None}
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
        _push(model_rows())
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


# ------------------------------------------------------------------------------------ the tables
def _row(kind: str, *values) -> str:
    return " ".join([kind, *(str(int(v)) for v in values)])


def _runs(value, limit: int) -> list[int]:
    """The step function value(1), ..., value(limit) as (upper, value) pairs, flattened: value[i]
    holds for the x <= upper[i] above the previous upper."""
    out: list[int] = []
    for x in range(1, limit + 1):
        v = value(x)
        if out and out[-1] == v:
            out[-2] = x
        else:
            out += [x, v]
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cache_code(dtype: torch.dtype) -> int:
    """A cache dtype's index in the kernel keys (config.CACHE_DTYPES, as the cache_dtypes row names them)."""
    from ..config import CACHE_DTYPES
    return CACHE_DTYPES.index(dtype)


def _cache_dtype(cfg) -> torch.dtype:
    """The cache dtype a variant reads and writes: float8_e4m3fn where its config says fp8 (a config
    without the field is a bf16 cache's)."""
    return torch.float8_e4m3fn if getattr(cfg, "fp8", False) else torch.bfloat16


def model_rows() -> list[str]:
    """The sizes the C++ metadata checks compare against, and the cache dtypes' codes."""
    from ..config import CACHE_DTYPES, CACHE_ROW, HEAD_DIM, HIDDEN, PAGE_SIZE
    return [_row("model", HIDDEN, HEAD_DIM, PAGE_SIZE, CACHE_ROW),
            "cache_dtypes " + " ".join(_dtype_name(d) for d in CACHE_DTYPES)]


def kv_heads_row(kv_heads: int) -> str:
    """Hkv's K split, y's and attn2's output widths, and qkv_front_plan.tile_for of every M up to
    TABLE_MAX_TOKENS (as indices of qkv_front_plan.LAUNCH_TILES, the kernel keys' tiles)."""
    from ..config import HEAD_DIM, proj_cols, q_heads
    from . import qkv_front_plan as plan
    runs = [v for last, tile in plan.tile_runs(kv_heads, TABLE_MAX_TOKENS)
            for v in (last, plan.LAUNCH_TILES.index(tile))]
    return _row("kv_heads", kv_heads, plan.k_split(kv_heads), proj_cols(kv_heads), q_heads(kv_heads) * HEAD_DIM,
                *runs)


def kv_heads_rows() -> list[str]:
    return [kv_heads_row(h) for h in range(1, TABLE_KV_HEADS + 1)]


@functools.lru_cache(maxsize=None)
def attn2_variants(q_len: int, window: int, max_seq_len: int) -> tuple:
    """The deployment's variants, in the order the C++ keys index them (attn2_plan.deployment_variants,
    over every Hkv the tables cover)."""
    from . import attn2_plan
    out: list = []
    for kv_heads in range(1, TABLE_KV_HEADS + 1):
        out += [cfg for cfg in attn2_plan.deployment_variants(kv_heads, q_len, window, max_seq_len) if cfg not in out]
    return tuple(out)


def _workspace_per_pair(cfg, q_len: int, window: int, max_seq_len: int) -> int:
    """Bytes of workspace a launch of variant cfg needs per (request, KV head) pair: the larger of
    its layout's (what the launch checks) and the deployment's workspace_bytes (what the metadata
    check asks), both the plan's functions, linear in the pairs (checked here: the C++ multiplies)."""
    from . import attn2_plan

    def need(requests: int, kv_heads: int) -> int:
        return max(attn2_plan.workspace_layout(cfg, requests, kv_heads)[2],
                   attn2_plan.workspace_bytes(requests, kv_heads, q_len, window, max_seq_len))
    per_pair = need(1, 1)
    for requests in (2, 3, 7, 64, TABLE_MAX_REQUESTS):
        for kv_heads in (1, 2, 3, TABLE_KV_HEADS):
            if need(requests, kv_heads) != requests * kv_heads * per_pair:
                raise RuntimeError(f"attn2's workspace bytes are not linear in (requests x KV heads) for {cfg}: the "
                                   "C++ ops need another form of it (muse_ops/cutedsl/shims.py)")
    return per_pair


def attn2_rows(q_len: int, window: int, max_seq_len: int, devices, cache_dtype=torch.bfloat16) -> list[str]:
    """One attn2 deployment's rows: its variants' workspace per pair, then for each device (SM
    count, attn2_plan.wave_ctas) and Hkv the variant attn2_plan.launch_config picks for every R up
    to TABLE_MAX_REQUESTS (-1 where it is none of the deployment's)."""
    from . import attn2_plan
    variants = attn2_variants(q_len, window, max_seq_len)
    index = {cfg: i for i, cfg in enumerate(variants)}
    deployment = (q_len, window, max_seq_len, cache_code(cache_dtype))
    rows = [_row("attn2_deployment", *deployment,
                 *(_workspace_per_pair(cfg, q_len, window, max_seq_len) for cfg in variants))]
    for sm_count, wave in devices:
        for kv_heads in range(1, TABLE_KV_HEADS + 1):
            runs = _runs(lambda r: index.get(attn2_plan.launch_config(r, kv_heads, q_len, window, max_seq_len,
                                                                      sm_count=sm_count), -1), TABLE_MAX_REQUESTS)
            rows.append(_row("attn2_plan", *deployment, sm_count, wave, kv_heads, *runs))
    return rows


def qkv_front_key(cfg) -> str | None:
    """The C++ key of a qkv_front variant of the plan (None for another config: a dev override)."""
    from . import qkv_front_plan as plan
    tile = cfg.tile
    if tile not in plan.LAUNCH_TILES or cfg != plan.tile_config(tile, cfg.rope, cfg.pos_dtype, cfg.slot_dtype,
                                                                getattr(cfg, "fp8", False)):
        return None
    tile = plan.LAUNCH_TILES.index(tile)
    return _row("qkv_front", tile, cache_code(_cache_dtype(cfg)), cfg.rope, cfg.pos_dtype == "int64",
                cfg.slot_dtype == "int64")


def attn2_key(q_len: int, window: int, max_seq_len: int, variant: int, cache_dtype=torch.bfloat16) -> str:
    """The C++ key of the deployment's variant-th variant (an index of attn2_variants)."""
    return _row("attn2", q_len, window, max_seq_len, cache_code(cache_dtype), variant)


def wave_ctas_of(sm_count: int) -> int:
    """attn2_plan.wave_ctas of a device of sm_count SMs this machine need not have (an
    ahead-of-time library's table plans for several): the plan's function, given the one device
    fact it reads."""
    from unittest import mock
    from . import attn2_plan, runtime
    with mock.patch.object(runtime, "sm_count", lambda device: sm_count):
        return attn2_plan.wave_ctas(torch.device("cuda", 0))


@functools.lru_cache(maxsize=1)
def _devices() -> tuple:
    """(SM count, attn2_plan.wave_ctas) of each kind of CUDA device here."""
    from . import attn2_plan, runtime
    out: list = []
    for i in range(torch.cuda.device_count()):
        device = torch.device("cuda", i)
        fact = (runtime.sm_count(device), attn2_plan.wave_ctas(device))
        if fact not in out:
            out.append(fact)
    return tuple(out)


def _push(rows) -> None:
    for row in rows:
        torch.ops.muse._shims_table(row)


@functools.lru_cache(maxsize=1)
def configure_tables() -> None:
    """Hand the C++ side the KV-head tables (once, before the first kernel: ~0.1 s)."""
    _push(kv_heads_rows())


@functools.lru_cache(maxsize=None)
def configure_attn2(q_len: int, window: int, max_seq_len: int, cache_dtype=torch.bfloat16, devices=None) -> None:
    """Hand the C++ side an attn2 deployment's tables, for the devices here (or these (SM count,
    wave) pairs); once per deployment."""
    _push(attn2_rows(q_len, window, max_seq_len, _devices() if devices is None else devices, cache_dtype))


@functools.lru_cache(maxsize=1)
def _ffi_configured() -> None:
    import tvm_ffi
    torch.ops.muse._shims_set_ffi(str(tvm_ffi.libinfo.find_libtvm_ffi()))
    configure_tables()


def _handle(fn) -> int | None:
    import tvm_ffi
    if not isinstance(fn, tvm_ffi.Function):
        fn = getattr(fn, "_tvm_ffi_function", None)
    return fn.__chandle__() if isinstance(fn, tvm_ffi.Function) else None


def offer_qkv_front(cfg, fn) -> None:
    """Let the C++ path launch this qkv_front variant (a default variant of the plan)."""
    key = ("qkv_front", cfg)
    if not loaded() or key in _offered:
        return
    kernel, handle = qkv_front_key(cfg), _handle(fn)
    if kernel is None or handle is None:
        return
    _ffi_configured()
    torch.ops.muse._shims_add_kernel(kernel, handle)
    _offered[key] = fn


def offer_attn2(cfg, max_seq_len: int, fn) -> None:
    """Let the C++ path launch this attn2 variant for the deployment (q_len, window, max_seq_len)."""
    max_seq_len = int(max_seq_len)
    key = ("attn2", cfg, max_seq_len)
    if not loaded() or key in _offered:
        return
    variants, handle = attn2_variants(cfg.q_len, cfg.window, max_seq_len), _handle(fn)
    if cfg not in variants or handle is None:
        return
    _ffi_configured()
    cache_dtype = _cache_dtype(cfg)
    configure_attn2(cfg.q_len, cfg.window, max_seq_len, cache_dtype)
    torch.ops.muse._shims_add_kernel(attn2_key(cfg.q_len, cfg.window, max_seq_len, variants.index(cfg), cache_dtype),
                                     handle)
    _offered[key] = fn


def clear() -> None:
    """Forget every registered kernel (compile_cache.clear_memory: the functions may be freed); the
    tables stay."""
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
    """Calls served by the C++ path ("cpp") and handed to Python ("python") per op (a layer step in
    one C++ call counts for both ops), and the kernels registered ("qkv_front variants", "attn2
    deployments", "attn2 variants")."""
    if not loaded():
        return {}
    s = torch.ops.muse._shims_stats()   # the layout of csrc_shims/muse_shims.cpp's stats
    return ({op: {"cpp": s[2 * i], "python": s[2 * i + 1]} for i, op in enumerate(OPS)}
            | {"qkv_front variants": s[6], "attn2 deployments": s[7], "attn2 variants": s[8]})


def error_flag(device: torch.device) -> torch.Tensor | None:
    """The C++ side's error flag of `device` (the one its kernels write), or None."""
    if not loaded() or device.type != "cuda":
        return None
    try:
        return torch.ops.muse._shims_error_flag(device.index)
    except Exception:  # noqa: BLE001  (an unsupported device: the Python flag serves)
        return None


# ------------------------------------------------------------------------------------ development library
def load_dev(path: Path | str | None = None) -> Path:
    """Load the development library into this process and attach it to the loaded C++ ops,
    building it first (default: muse_ops/libmuse_shims_dev.so) where it is missing or older than its
    sources: `_shims_null*` (the dispatcher's floor of each op), `_shims_qkv_front_clocked` /
    `_shims_attn2_clocked` (the ops' fast path with a host clock, read by `_shims_clock_stats`),
    `_shims_lookup` and `_shims_check_*` (the C++ lookups and metadata checks, for the tests)."""
    if _dev["path"] is not None:
        return _dev["path"]
    if not loaded():
        raise RuntimeError(f"the development library extends the C++ ops, and none are loaded: {status()}")
    path = Path(path) if path else PACKAGE_DIR / DEV_LIBRARY_NAME
    marker = f"muse_shims_dev_abi={ABI};".encode()
    dev_sources = sources(dev=True)
    newest = max(p.stat().st_mtime for p in (*dev_sources, dev_sources[0].with_name(HEADER)))
    if not path.is_file() or path.stat().st_mtime < newest or marker not in path.read_bytes():
        build(path, dev=True)
    torch.ops.load_library(str(path))
    torch.ops.muse._shims_dev_attach(os.path.realpath(_state["path"]))
    _dev["path"] = path
    return path


# ------------------------------------------------------------------------------------ build
def sources(dev: bool = False) -> list[Path]:
    """The C++ sources of the library (or of the development library) this package builds: the
    checkout's, else the installed copy (SOURCE_DIRS)."""
    names = DEV_SOURCES if dev else LIBRARY_SOURCES
    for directory in SOURCE_DIRS:
        if all((directory / name).is_file() for name in (HEADER, *names)):
            return [directory / name for name in names]
    raise RuntimeError(f"the C++ sources {', '.join((HEADER, *names))} are in neither "
                       + " nor ".join(map(str, SOURCE_DIRS)) + ": reinstall muse_ops from a checkout or an sdist")


def build_command(output: Path, dev: bool = False) -> list[str]:
    from torch.utils import cpp_extension
    try:
        import tvm_ffi
    except ImportError as exc:
        raise RuntimeError("building the C++ ops needs apache-tvm-ffi's C headers: "
                           "pip install 'muse_ops[cuda]' (or apache-tvm-ffi)") from exc
    # hidden visibility: the development library, loaded beside the package's, never binds to its symbols
    cmd = [os.environ.get("CXX", "g++"), "-std=c++20", "-O2", "-fPIC", "-shared", "-Wall", "-fvisibility=hidden",
           "-fvisibility-inlines-hidden", *map(str, sources(dev)), "-o", str(output),
           f"-I{tvm_ffi.libinfo.find_include_path()}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    cmd += [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    return cmd


def build(output: Path | None = None, dev: bool = False) -> Path:
    """Compile the C++ ops (dev: the development library) against the installed torch (default:
    into the package, where `load` / `load_dev` find it)."""
    output = Path(output) if output else PACKAGE_DIR / (DEV_LIBRARY_NAME if dev else LIBRARY_NAME)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    command = build_command(partial, dev)
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError as exc:
        raise RuntimeError(f"no C++ compiler {command[0]!r} (set CXX to one that takes -std=c++20)") from exc
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{command[0]} failed with exit status {exc.returncode} (its messages are above); "
                           f"the command: {' '.join(command)}") from exc
    os.replace(partial, output)    # never rewrite in place a library this process may have loaded
    return output


def _will_load(path: Path) -> str:
    """Whether the package will load the library at `path` at its next import, and why not."""
    env = os.environ.get(ENV, "").strip()
    if env.lower() in ("0", "off", "no"):
        return f"the package will not use it while ${ENV}={env}"
    found = _find()
    if found is None or found.resolve() != path.resolve():
        return (f"the package will not use it: it loads {found} instead" if found is not None else
                f"the package will not use it: it looks in {PACKAGE_DIR} (or ${ENV})")
    return ("the package loads it at its next import (muse_ops.cutedsl.shims.status() says so; "
            f"${ENV}=0 turns it off)")


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m muse_ops", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-shims", aliases=["build"], help="compile the C++ ops against the installed torch",
                       description="Compile the C++ ops (csrc_shims/) against the installed torch and apache-tvm-ffi "
                                   "into the package, where `import muse_ops` loads them (about 15 s).")
    b.add_argument("--dev", action="store_true",
                   help=f"the development library instead (default output muse_ops/{DEV_LIBRARY_NAME}; "
                        "the package never loads it)")
    b.add_argument("--output", default=None, help=f"default: muse_ops/{LIBRARY_NAME}")
    a = ap.parse_args(argv)
    path = Path(build(a.output, dev=a.dev))
    what = "the development library (the bench's host clocks, the tests' lookups)" if a.dev else "the C++ ops"
    print(f"built {what} against torch {torch.__version__}: {path}")
    print("the package never loads the development library" if a.dev else _will_load(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
