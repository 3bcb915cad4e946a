"""The ahead-of-time kernel library (muse_ops.cutedsl.aot) on the CPU: built from two variants,
loaded in a process where the CuTe DSL cannot be imported, serving those variants to the
compile cache (and refusing the others with a message naming them), and not used once the
kernel sources differ from the ones it was built from. Needs the DSL and a C++ linker to build
(skipped otherwise); the GPU test (test_gpu_aot) runs the kernels from such a library."""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")
if shutil.which(os.environ.get("CXX", "g++")) is None:
    pytest.skip("no C++ linker (g++ or $CXX)", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    from muse_ops.cutedsl import aot, attn2_plan, qkv_front_plan
    q = qkv_front_plan.QkvFrontConfig.create(8, 1, True, "int64", "int64", k_tiles_per_stage=4)
    a = attn2_plan.deployment_variants(2, 8, 0, 8192)[0]
    keys = [(("qkv_front", q, ""), q, "qkv_front"), (("attn2", a.compile_key, ""), a, "attn2")]
    d = tmp_path_factory.mktemp("aot")
    lib = aot.build(d, with_runtime=True, keys=keys, log=None)
    return lib, keys


def _run(code, lib, extra_env=None):
    """code in a fresh process where `import cutlass` fails, with the library configured."""
    block = "import sys; sys.modules['cutlass'] = None; sys.modules['cutlass.cute'] = None\n"
    env = dict(os.environ, MUSE_OPS_AOT_LIBRARY=str(lib), MUSE_OPS_CACHE_DIR="off",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra_env or {}))
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_library_holds_each_variant_under_its_own_symbol(library):
    lib, keys = library
    manifest = json.loads(lib.with_suffix(".json").read_text())
    from muse_ops.cutedsl import aot
    from muse_ops.cutedsl.compile_cache import dsl_toolkit, source_fingerprint
    assert manifest["fingerprint"] == source_fingerprint() and manifest["arch"] == "sm_90a"
    assert manifest["cuda_toolkit"] == dsl_toolkit() and manifest["cuda_toolkit"] in ("cu12", "cu13")
    assert sorted(manifest["entries"]) == sorted(repr(k) for k, _, _ in keys)
    assert len(set(manifest["entries"].values())) == len(keys)
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    for k, _, _ in keys:
        assert f"__tvm_ffi_{aot.symbol(k)}" in nm
    assert (lib.parent / aot.RUNTIME_NAME).exists()


def test_served_without_the_dsl(library):
    lib, keys = library
    code = f"""
from muse_ops.cutedsl import aot, compile_cache, launch, runtime, qkv_front_plan, attn2_plan
assert runtime.import_error() is not None and aot.available(), (runtime.import_error(), aot.status())
assert "built by the DSL's cu1" in aot.status(), aot.status()
keys = {[repr(k) for k, _, _ in keys]!r}
q = qkv_front_plan.QkvFrontConfig.create(8, 1, True, "int64", "int64", k_tiles_per_stage=4)
a = attn2_plan.deployment_variants(2, 8, 0, 8192)[0]
assert repr(("qkv_front", q, "")) in keys and repr(("attn2", a.compile_key, "")) in keys
assert callable(launch.compile_qkv_front(q)) and callable(launch.compile_attn2(a))
assert compile_cache.stats["aot"] == 2, compile_cache.stats
other = qkv_front_plan.QkvFrontConfig.create(16, 1, True, "int64", "int64", k_tiles_per_stage=4)
try:
    launch.compile_qkv_front(other)
except RuntimeError as exc:
    assert "not in the ahead-of-time library" in str(exc) and "token_tile=16" in str(exc), exc
else:
    raise AssertionError("a missing variant must not be compiled without the DSL")
print("ok")
"""
    res = _run(code, lib)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr


def test_stale_library_is_not_used(library, tmp_path):
    lib, _ = library
    stale = tmp_path / lib.name
    shutil.copy2(lib, stale)
    m = json.loads(lib.with_suffix(".json").read_text())
    m["fingerprint"] = "0" * 24
    stale.with_suffix(".json").write_text(json.dumps(m))
    res = _run("from muse_ops.cutedsl import aot\nassert not aot.available()\nprint(aot.status())", stale)
    assert res.returncode == 0 and "other kernel sources" in res.stdout, res.stdout + res.stderr


def test_no_library_configured_says_so():
    from muse_ops.cutedsl import aot
    old = os.environ.pop(aot.LIBRARY_ENV, None)
    try:
        aot.reset()
        assert not aot.available() and "unset" in aot.status()
    finally:
        if old is not None:
            os.environ[aot.LIBRARY_ENV] = old
        aot.reset()


def test_disk_cache_keys_on_the_dsl_toolkit(monkeypatch):
    """The DSL's CUDA 12 and CUDA 13 flavors compile different machine code of one kernel (their
    ptxas): a cache filled by one is never served to the other."""
    from muse_ops.cutedsl import compile_cache
    assert compile_cache.dsl_toolkit() in ("cu12", "cu13")
    seen = {}
    try:
        for flavor in ("cu12", "cu13"):
            monkeypatch.setattr(compile_cache, "dsl_toolkit", lambda f=flavor: f)
            compile_cache.fingerprint.cache_clear()
            seen[flavor] = compile_cache.fingerprint()
    finally:
        compile_cache.fingerprint.cache_clear()
    assert seen["cu12"] != seen["cu13"]
