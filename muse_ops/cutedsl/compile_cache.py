"""The compile cache of every CuTe DSL kernel variant: in memory, and on disk across processes.

A variant is compiled once per process at most; with the disk cache it is compiled once per
machine: the compiled object is exported as a relocatable object file (the DSL's TVM-FFI export)
and a later process loads it in milliseconds instead of tracing and compiling it again (1-3 s a
variant). The file name hashes the variant's key (the family, its compile-time parameters, the
compile options) and the directory is named by a fingerprint of everything that could change the
code: every source file of this package's `cutedsl/` folder, the cutlass DSL and TVM-FFI versions
and the CUDA toolkit flavor the DSL loaded (dsl_toolkit). Any edit of a kernel therefore lands in
a new directory, and nothing stale is loaded.

Several processes may compile the same variant at once (a multi-GPU server starting, the test
workers): each entry is written to a private temporary file and renamed into place under an
exclusive file lock; readers take the lock shared. A file that fails to load is removed and the
variant compiled again.

An ahead-of-time library (muse_ops.cutedsl.aot, $MUSE_OPS_AOT_LIBRARY; passed in by the caller,
launch.py) is asked before the disk:
a deployment that ships one needs neither the DSL compiler nor compile time.

Disk location: $MUSE_OPS_CACHE_DIR, else $XDG_CACHE_HOME/muse_ops, else ~/.cache/muse_ops;
MUSE_OPS_CACHE_DIR=off keeps the cache in memory only. Compiles with extra options (dumps of PTX
for development) bypass the disk.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger("muse_ops")

EXPORT_NAME = "muse_kernel"
ENV_DIR = "MUSE_OPS_CACHE_DIR"

_memory: dict = {}
_lock = threading.Lock()
stats = {"aot": 0, "compiled": 0, "loaded": 0, "memory": 0}   # how each lookup was served (tests, prepare)


# The files that decide a variant's generated code: the kernels, their plans (the configs), the
# PTX helpers, the compile options and the model constants, and the error bits the kernels write
# (their values, not errors.py: that file is host code too). The host path (launch, the caches,
# aot, shims) is not among them, so a change there leaves caches and libraries valid.
KERNEL_SOURCES = ("attn2.py", "attn2_plan.py", "ptx.py", "qkv_front.py", "qkv_front_plan.py", "runtime.py",
                  "../config.py")


def _hash_sources(h) -> None:
    from .. import errors
    root = Path(__file__).resolve().parent
    for name in KERNEL_SOURCES:
        h.update(name.encode())
        h.update((root / name).read_bytes())
    h.update(repr((errors.BAD_SEQ_LEN, errors.BAD_PAGE, errors.BAD_SLOT, errors.BAD_POSITION)).encode())


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Hash of this folder's kernel sources alone (what an ahead-of-time library is checked by)."""
    h = hashlib.sha256()
    _hash_sources(h)
    return h.hexdigest()[:24]


def dsl_toolkit() -> str:
    """The CUDA toolkit flavor of the CuTe DSL this process loaded: "cu12" or "cu13" (the DSL
    loads the newest flavor installed that the driver supports: `nvidia-cutlass-dsl` brings cu12,
    its extra `cu13` adds cu13), "?" where it cannot tell. The flavor's ptxas makes the machine
    code, and the two make different code of the same kernel: the FP8 attn2 variants, at the
    register limit, run 3-11% faster built by cu13's (bench/RESULTS.md, thirty-fifth session)."""
    try:
        from cutlass.base_dsl.version_info import CUDA_VERSION   # what the DSL itself loads by
    except Exception:  # noqa: BLE001  (a DSL without it)
        return "?"
    return f"cu{CUDA_VERSION.major}"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """Hash of the kernel sources and the toolchain versions (computed once per process)."""
    import cutlass
    import tvm_ffi
    h = hashlib.sha256()
    # no Python version: an exported object is C (TVM-FFI ABI), so a cache built by one Python
    # (or on a CPU machine, for sm_90a) serves another; the toolkit flavor: another ptxas
    h.update(f"cutlass={getattr(cutlass, '__version__', '?')} tvm_ffi={getattr(tvm_ffi, '__version__', '?')} "
             f"toolkit={dsl_toolkit()}".encode())
    _hash_sources(h)
    return h.hexdigest()[:24]


def cache_dir() -> Path | None:
    env = os.environ.get(ENV_DIR)
    if env is not None and env.strip().lower() in ("", "0", "off", "none"):
        return None
    if env:
        base = Path(env)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "muse_ops"
    return base / "cutedsl" / fingerprint()


@functools.lru_cache(maxsize=1)
def _preload_runtime() -> None:
    """The exported objects call into the DSL runtime library: load it with global symbols first,
    or the dynamic loader cannot resolve them when an object file is loaded from disk."""
    import ctypes
    import cutlass.cute as cute
    for path in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
        if Path(path).exists():
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


@contextlib.contextmanager
def _file_lock(path: Path, exclusive: bool, timeout_s: float = 120.0):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout_s
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out waiting for the compile-cache lock {path}")
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)   # closing releases the lock


def _load(obj: Path):
    import cutlass.cute as cute
    _preload_runtime()
    module = cute.runtime.load_module(str(obj), enable_tvm_ffi=True)
    return getattr(module, EXPORT_NAME)


def _entry_name(key) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def get(key, build: Callable[[], object], *, disk: bool = True, library=None):
    """The compiled function of `key` (a tuple of plain values whose repr names the variant):
    from memory, else `library` (an object with lookup(key) and status(): the ahead-of-time
    library, muse_ops.cutedsl.aot), else the disk cache, else build() (cute.compile) and store it.
    Without the CuTe DSL only the library can serve a key."""
    fn = _memory.get(key)
    if fn is not None:
        stats["memory"] += 1
        return fn
    with _lock:   # one thread compiles a key; the others wait for it
        fn = _memory.get(key)
        if fn is not None:
            return fn
        from . import runtime
        fn = library.lookup(key) if library is not None and disk else None
        how = "aot"
        if fn is None:
            why = runtime.import_error()
            if why is not None:
                lib = library.status() if library is not None else "none"
                raise RuntimeError(f"muse_ops: the kernel variant {key[0]} {key[1]} is not in the ahead-of-time "
                                   f"library ({lib}) and cannot be compiled here: {why}")
            root = cache_dir() if disk else None
            how = "compiled"
            if root is None:
                fn = build()
            else:
                fn, how = _disk_get(root, key, build)
        stats[how] += 1
        _memory[key] = fn
        return fn


def _disk_get(root: Path, key, build):
    root.mkdir(parents=True, exist_ok=True)
    name = _entry_name(key)
    obj, lock = root / f"{name}.o", root / f"{name}.lock"
    with _file_lock(lock, exclusive=False):
        if obj.exists():
            try:
                return _load(obj), "loaded"
            except Exception as exc:  # noqa: BLE001  (truncated or foreign file: rebuild it)
                log.warning("muse_ops: could not load the cached kernel %s (%s); compiling it again", obj, exc)
    with _file_lock(lock, exclusive=True):
        if obj.exists():   # another process exported it meanwhile, or the file above was bad
            try:
                return _load(obj), "loaded"
            except Exception:  # noqa: BLE001
                obj.unlink(missing_ok=True)
        fn = build()
        tmp = root / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp.o"
        try:
            fn.export_to_c(object_file_path=str(tmp), function_name=EXPORT_NAME)
            (root / f"{name}.key").write_text(repr(key) + "\n")
            os.replace(tmp, obj)
        except Exception as exc:  # noqa: BLE001  (a read-only disk must not stop the kernel from running)
            log.warning("muse_ops: could not store the compiled kernel in %s (%s)", root, exc)
        finally:
            tmp.unlink(missing_ok=True)
        return fn, "compiled"


def clear_memory() -> None:
    """Forget the in-memory entries (tests: the next lookup goes to disk)."""
    from . import shims
    shims.clear()   # the C++ ops hold the functions forgotten here
    with _lock:
        _memory.clear()
