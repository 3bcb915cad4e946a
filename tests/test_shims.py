"""The C++ ops on the CPU (csrc_shims/, muse_ops.cutedsl.shims): the schemas they define are
muse_ops.ops.SCHEMAS; they hold no plan rule, only Python's tables, and their lookups on those
tables give the plan modules' answers (the development library's `_shims_lookup`); their metadata
checks refuse exactly what validation.py refuses; the ahead-of-time build writes the same tables,
which a program without Python loads; the development hooks are in the development library only;
and the package without them (MUSE_OPS_SHIMS=0) or with a broken one behaves as documented. CI
builds the library (.ci/run) and these tests build the development library; where the library is
not built the tests that need it skip, saying so."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from muse_ops import ops, validation
from muse_ops.config import CACHE_DTYPES, HEAD_DIM, proj_cols
from muse_ops.cutedsl import attn2_plan, qkv_front_plan, shims
from muse_ops.errors import MuseInputError

ROOT = Path(__file__).resolve().parents[1]
needs_shims = pytest.mark.skipif(not shims.loaded(), reason=f"no C++ ops: {shims.status()}")
# (SM count, wave) of the devices the tables are checked for: H100 / H200 SXM, H100 PCIe, H20
DEVICES = tuple((n, shims.wave_ctas_of(n)) for n in (132, 114, 78))
DEPLOYMENTS = [(q_len, window, msl) for q_len in (1, 8) for window in (0, 2048) for msl in (512, 262144)]


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    """The development library, built for this session and attached; the tables pushed (the
    KV-head tables, and DEPLOYMENTS on DEVICES)."""
    if not shims.loaded():
        pytest.skip(f"no C++ ops: {shims.status()}")
    pytest.importorskip("tvm_ffi")
    shims.load_dev(tmp_path_factory.mktemp("shims_dev") / shims.DEV_LIBRARY_NAME)
    shims.configure_tables()
    for deployment in DEPLOYMENTS:
        shims.configure_attn2(*deployment, devices=DEVICES)
    return torch.ops.muse._shims_lookup


@needs_shims
def test_shims_define_the_python_schemas():
    for name, schema in ops.SCHEMAS.items():
        assert str(getattr(torch.ops.muse, name).default._schema) == f"muse::{schema}"


@needs_shims
def test_shims_development_ops_have_the_public_argument_lists(dev):
    """The floors and the clocked ops take exactly the public ops' arguments (the attn2 floor also
    with its workspace not marked mutable), so they time the same dispatcher work."""
    renamed = {"_shims_null": "qkv_front", "_shims_qkv_front_clocked": "qkv_front", "_shims_null_attn2": "attn2",
               "_shims_attn2_clocked": "attn2"}
    for name, public in renamed.items():
        want = ops.SCHEMAS[public].replace(f"{public}(", f"{name}(", 1)
        assert str(getattr(torch.ops.muse, name).default._schema) == f"muse::{want}"
    const = ops.SCHEMAS["attn2"].replace("attn2(", "_shims_null_attn2_const(", 1).replace("Tensor(a!)?", "Tensor?")
    assert str(torch.ops.muse._shims_null_attn2_const.default._schema) == f"muse::{const}"


def test_the_package_library_holds_no_development_hook():
    """The production sources name no development op and read no clock: those are the development
    library's (csrc_shims/muse_shims_dev.cpp), which the package never loads."""
    for path in shims.sources():
        text = path.read_text()
        for hook in ("_shims_null", "_shims_plan", "_shims_clock", "_shims_lookup", "_shims_check", "chrono",
                     "steady_clock", "clock_gettime"):
            assert hook not in text, (path.name, hook)
    header = shims.sources()[0].with_name(shims.HEADER).read_text()
    assert "chrono" not in header and "now_ns" not in header
    assert not hasattr(shims, "set_clock")
    assert shims.DEV_LIBRARY_NAME not in [p.name for p in shims.PACKAGE_DIR.glob("_shims*.so")]


@needs_shims
def test_shims_lookups_give_the_qkv_front_plan(dev):
    lookup = dev
    tiles = {t: i for i, t in enumerate(qkv_front_plan.LAUNCH_TILES)}
    for kv_heads in range(1, shims.TABLE_KV_HEADS + 1):
        assert lookup("k_split", [kv_heads]) == qkv_front_plan.k_split(kv_heads), kv_heads
        assert lookup("proj_cols", [kv_heads]) == proj_cols(kv_heads)
        assert lookup("out_cols", [kv_heads]) == 8 * kv_heads * HEAD_DIM
        for m in range(1, shims.TABLE_MAX_TOKENS + 1):
            assert lookup("qkv_front_tile", [m, kv_heads]) == tiles[qkv_front_plan.tile_for(m, kv_heads)], (m, kv_heads)
        # past the table: Python plans it
        assert lookup("qkv_front_tile", [shims.TABLE_MAX_TOKENS + 1, kv_heads]) == -1
    for kv_heads in (0, shims.TABLE_KV_HEADS + 1, 300):
        assert lookup("k_split", [kv_heads]) == -1 and lookup("qkv_front_tile", [8, kv_heads]) == -1


@needs_shims
def test_shims_lookups_give_the_attn2_plan(dev):
    lookup = dev
    requests = list(range(1, 130)) + [200, 255, 256, 257, 511, 512, 700, shims.TABLE_MAX_REQUESTS]
    for q_len, window, msl in DEPLOYMENTS:
        variants = shims.attn2_variants(q_len, window, msl)
        for sm_count, wave in DEVICES:
            key = [q_len, window, msl, 0, sm_count]
            assert lookup("attn2_wave", key) == wave
            for kv_heads in (1, 2, 3, 4, 16):
                for r in requests:
                    cfg = attn2_plan.launch_config(r, kv_heads, q_len, window, msl, sm_count=sm_count)
                    v = lookup("attn2_variant", key + [r, kv_heads])
                    assert variants[v] == cfg, (q_len, window, msl, sm_count, kv_heads, r)
                    need = max(attn2_plan.workspace_layout(cfg, r, kv_heads)[2],
                               attn2_plan.workspace_bytes(r, kv_heads, q_len, window, msl))
                    assert lookup("attn2_workspace", key + [r, kv_heads]) == need
                assert lookup("attn2_variant", key + [shims.TABLE_MAX_REQUESTS + 1, kv_heads]) == -1
            assert lookup("attn2_variant", key + [1, shims.TABLE_KV_HEADS + 1]) == -1
        # another SM count, or a deployment not registered: no plan (Python plans it)
        assert lookup("attn2_variant", [q_len, window, msl, 0, 100, 1, 2]) == -1
    assert lookup("attn2_variant", [8, 0, 4096, 0, 132, 1, 2]) == -1
    assert lookup("attn2_variant", [8, 0, 512, CACHE_DTYPES.index(torch.float8_e4m3fn), 132, 1, 2]) == -1


def _python_ok(check, *args, **kwargs) -> bool:
    try:
        check(*args, **kwargs)
    except MuseInputError:
        return False
    return True


def _misaligned(shape, dtype):
    flat = torch.zeros(int(torch.tensor(shape).prod()) + 1, dtype=dtype)
    return flat[1:].view(shape)    # contiguous, 2 or 4 bytes past a 16-byte boundary


@needs_shims
def test_shims_metadata_checks_refuse_what_validation_refuses(dev):
    """The C++ fast path's metadata checks (what decides "serve or hand to Python") pass exactly
    the calls validation.py passes, on the sizes Python handed over."""
    m, kv_heads = 3, 2
    n = proj_cols(kv_heads)
    base = dict(x=torch.zeros(m, 8192, dtype=torch.bfloat16), weight=torch.zeros(n, 8192, dtype=torch.bfloat16),
                positions=torch.arange(m), slots=torch.arange(m), cos_sin=torch.zeros(16, HEAD_DIM),
                kv_cache=torch.zeros(4, kv_heads, 16, 128, dtype=torch.bfloat16))
    cases = {
        "valid": {}, "no cos_sin": dict(cos_sin=None),
        "int32 indices": dict(positions=torch.arange(m, dtype=torch.int32), slots=torch.arange(m, dtype=torch.int32)),
        "fp8 cache": dict(kv_cache=torch.zeros(4, kv_heads, 16, 128, dtype=torch.float8_e4m3fn)),
        "x float32": dict(x=torch.zeros(m, 8192)), "x hidden": dict(x=torch.zeros(m, 4096, dtype=torch.bfloat16)),
        "x strided": dict(x=torch.zeros(8192, m, dtype=torch.bfloat16).t()),
        "x misaligned": dict(x=_misaligned((m, 8192), torch.bfloat16)),
        "x meta": dict(x=torch.zeros(m, 8192, dtype=torch.bfloat16, device="meta")),
        "weight rows": dict(weight=torch.zeros(proj_cols(1), 8192, dtype=torch.bfloat16)),
        "weight dtype": dict(weight=torch.zeros(n, 8192, dtype=torch.float16)),
        "positions int16": dict(positions=torch.arange(m, dtype=torch.int16)),
        "positions length": dict(positions=torch.arange(m + 1)),
        "positions 2-D": dict(positions=torch.zeros(m, 1, dtype=torch.long)),
        "slots float": dict(slots=torch.zeros(m)), "slots strided": dict(slots=torch.arange(2 * m)[::2]),
        "cos_sin float64": dict(cos_sin=torch.zeros(16, HEAD_DIM, dtype=torch.float64)),
        "cos_sin width": dict(cos_sin=torch.zeros(16, 32)), "cos_sin empty": dict(cos_sin=torch.zeros(0, HEAD_DIM)),
        "cache dtype": dict(kv_cache=torch.zeros(4, kv_heads, 16, 128)),
        "cache page": dict(kv_cache=torch.zeros(4, kv_heads, 8, 128, dtype=torch.bfloat16)),
        "cache row": dict(kv_cache=torch.zeros(4, kv_heads, 16, 64, dtype=torch.bfloat16)),
        "cache pages": dict(kv_cache=torch.zeros(0, kv_heads, 16, 128, dtype=torch.bfloat16)),
        "cache 3-D": dict(kv_cache=torch.zeros(4, 16, 128, dtype=torch.bfloat16)),
        "cache misaligned": dict(kv_cache=_misaligned((4, kv_heads, 16, 128), torch.bfloat16)),
    }
    for name, change in cases.items():
        args = {**base, **change}
        cpp = torch.ops.muse._shims_check_qkv_front(*args.values())
        assert (cpp == "") == _python_ok(validation.check_qkv_front_metadata, *args.values()), (name, cpp)
    assert torch.ops.muse._shims_check_qkv_front(*base.values()) == ""

    r, q_len = 3, 8
    base = dict(y=torch.zeros(q_len * r, n, dtype=torch.bfloat16), kv_cache=base["kv_cache"],
                page_table=torch.zeros(r, 4, dtype=torch.int32), seq_lens=torch.full((r,), 20, dtype=torch.int32),
                workspace=torch.zeros(4096, dtype=torch.uint8))
    cases = {
        "valid": {}, "no workspace": dict(workspace=None),
        "empty batch": dict(y=torch.zeros(0, n, dtype=torch.bfloat16), page_table=torch.zeros(0, 0, dtype=torch.int32),
                            seq_lens=torch.zeros(0, dtype=torch.int32)),
        "scale 0": dict(scale=0.0), "scale inf": dict(scale=float("inf")), "scale nan": dict(scale=float("nan")),
        "seq_lens int64": dict(seq_lens=torch.full((r,), 20)),
        "seq_lens 2-D": dict(seq_lens=torch.zeros(r, 1, dtype=torch.int32)),
        "page_table int64": dict(page_table=torch.zeros(r, 4, dtype=torch.long)),
        "page_table rows": dict(page_table=torch.zeros(r + 1, 4, dtype=torch.int32)),
        "page_table width": dict(page_table=torch.zeros(r, 0, dtype=torch.int32)),
        "page_table strided": dict(page_table=torch.zeros(4, r, dtype=torch.int32).t()),
        "workspace int8": dict(workspace=torch.zeros(4096, dtype=torch.int8)),
        "workspace 2-D": dict(workspace=torch.zeros(64, 64, dtype=torch.uint8)),
        "workspace misaligned": dict(workspace=_misaligned((4096,), torch.uint8)),
        "y rows": dict(y=torch.zeros(q_len * r + 1, n, dtype=torch.bfloat16)),
        "y cols": dict(y=torch.zeros(q_len * r, n - 64, dtype=torch.bfloat16)),
        "y float32": dict(y=torch.zeros(q_len * r, n)),
        "cache dtype": dict(kv_cache=torch.zeros(4, kv_heads, 16, 128, dtype=torch.float16)),
    }
    for name, change in cases.items():
        scale = change.pop("scale", 0.68)
        args = {**base, **change}
        cpp = torch.ops.muse._shims_check_attn2(*args.values(), q_len, scale)
        python = _python_ok(validation.check_attn2_metadata, *args.values(), q_len, 0, scale, 4096)
        assert (cpp == "") == python, (name, cpp)


def test_aot_build_writes_the_shims_table():
    """The table beside an ahead-of-time library holds the rows Python hands the C++ side (so a
    program without Python plans identically) and a key row per kernel it holds."""
    from muse_ops.cutedsl import aot
    cfgs = qkv_front_plan.ci_variants()
    fake = {repr(("qkv_front", c, "")): f"muse_q{i}" for i, c in enumerate(cfgs)}
    wide = attn2_plan._config(8, 0, 8192, "wide")
    capped = attn2_plan._config(8, 0, 8192, "wide", ctas_per_sm=1)
    fake[repr(("attn2", wide.compile_key, ""))] = "muse_a"
    fake[repr(("attn2", capped.compile_key, ""))] = "muse_a1"
    devices = ((132, shims.wave_ctas_of(132)),)
    rows = aot.shims_table(fake, max_seq_lens=(8192,), sm_counts=(132,)).splitlines()
    rows = [row for row in rows if not row.startswith("#")]
    assert rows[0] == f"shims_table {shims.TABLE_FORMAT}"
    tables = [row for row in rows[1:] if not row.startswith(("qkv_front ", "attn2 "))]
    assert tables == shims.model_rows() + shims.kv_heads_rows() + shims.attn2_rows(8, 0, 8192, devices)
    kernels = [row.split() for row in rows if row.startswith(("qkv_front ", "attn2 "))]
    assert sum(k[0] == "qkv_front" for k in kernels) == len(cfgs)
    for *key, name in kernels:
        if key[0] == "qkv_front":
            assert " ".join(key) == shims.qkv_front_key(cfgs[int(name[len("muse_q"):])])
    variants = shims.attn2_variants(8, 0, 8192)
    assert [" ".join(k) for k in kernels if k[0] == "attn2"] == [
        f"{shims.attn2_key(8, 0, 8192, variants.index(wide))} muse_a",
        f"{shims.attn2_key(8, 0, 8192, variants.index(capped))} muse_a1"]


@needs_shims
def test_a_program_without_python_loads_the_tables_of_an_ahead_of_time_library(dev, tmp_path):
    """`_shims_load_library` reads the `.shims` table beside a kernel library (here a stand-in
    whose kernels do nothing) into the same tables and kernels Python would register: in a fresh
    process (its kernels must not serve anything else), its lookups are the plan's."""
    tvm_ffi = pytest.importorskip("tvm_ffi")
    from muse_ops.cutedsl import aot
    cfgs = qkv_front_plan.ci_variants()
    entries = {repr(("qkv_front", c, "")): f"muse_q{i}" for i, c in enumerate(cfgs)}
    variants = shims.attn2_variants(8, 0, 8192)
    entries |= {repr(("attn2", c.compile_key, "")): f"muse_a{i}" for i, c in enumerate(variants)}
    source = tmp_path / "kernels.cpp"
    source.write_text("".join(f'extern "C" int __tvm_ffi_{name}(void*, const void*, int, void*) {{ return 0; }}\n'
                              for name in entries.values()))
    library = tmp_path / aot.LIBRARY_NAME
    ffi_dir = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    subprocess.run([os.environ.get("CXX", "g++"), "-shared", "-fPIC", str(source), "-o", str(library),
                    f"-L{ffi_dir}", "-Wl,--no-as-needed", "-ltvm_ffi", f"-Wl,-rpath,{ffi_dir}"], check=True)
    aot.shims_table_path(library).write_text(aot.shims_table(entries, max_seq_lens=(8192,), sm_counts=(132,)))
    run = _python(
        "import torch\nfrom muse_ops import ops\n"
        "from muse_ops.cutedsl import shims, qkv_front_plan as q, attn2_plan as a\n"
        f"shims.load_dev({str(shims._dev['path'])!r})\n"
        f"print(torch.ops.muse._shims_load_library({str(library)!r}))\n"
        "s, L = shims.stats(), torch.ops.muse._shims_lookup\n"
        f"assert s['qkv_front variants'] == {len(cfgs)} and s['attn2 variants'] == {len(variants)}, s\n"
        "tiles = {t: i for i, t in enumerate(q.LAUNCH_TILES)}\n"
        "for kv in (1, 2, 16):\n"
        "    assert L('k_split', [kv]) == q.k_split(kv)\n"
        "    assert all(L('qkv_front_tile', [m, kv]) == tiles[q.tile_for(m, kv)] for m in range(1, 1500))\n"
        "    for r in range(1, 200):\n"
        "        v = L('attn2_variant', [8, 0, 8192, 0, 132, r, kv])\n"
        f"        assert shims.attn2_variants(8, 0, 8192)[v] == a.launch_config(r, kv, 8, 0, 8192, sm_count=132)\n"
        "print('ok')")
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr
    assert "attn2 deployments" in run.stdout


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=300)


@needs_shims
def test_shims_serve_cpu_and_meta_through_python():
    """The CPU kernel is the Python reference and Meta the fake, on the C++-defined ops."""
    from scenario import qkv_front_inputs
    gen = torch.Generator().manual_seed(0)
    x, w = qkv_front_inputs(3, 1, gen)
    positions, slots = torch.arange(3), torch.tensor([0, 5, -1])
    cache = torch.zeros(4, 1, 16, 128, dtype=torch.bfloat16)
    with torch.inference_mode():
        y = torch.ops.muse.qkv_front(x, w, positions, slots, None, cache)
    assert y.shape == (3, 1152) and cache.view(-1, 128)[5].abs().sum() > 0
    meta = torch.ops.muse.qkv_front(x.to("meta"), w.to("meta"), positions.to("meta"), slots.to("meta"), None,
                                    cache.to("meta"))
    assert meta.device.type == "meta" and meta.shape == (3, 1152)


def test_without_shims_python_defines_the_ops():
    run = _python("import torch, muse_ops\n"
                  "from muse_ops import ops\n"
                  "from muse_ops.cutedsl import shims\n"
                  "assert not ops.CPP and 'disabled' in shims.status(), shims.status()\n"
                  "for n, s in ops.SCHEMAS.items():\n"
                  "    assert str(getattr(torch.ops.muse, n).default._schema) == 'muse::' + s\n"
                  "print('ok')", MUSE_OPS_SHIMS="0")
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr


def test_a_named_shims_library_that_does_not_load_is_an_error():
    run = _python("import muse_ops", MUSE_OPS_SHIMS="/nonexistent/libmuse_shims.so")
    assert run.returncode != 0 and "MUSE_OPS_SHIMS=/nonexistent/libmuse_shims.so" in run.stderr, run.stderr


def test_a_library_from_other_sources_is_not_loaded(tmp_path):
    """A library without this package's interface marker (an older build) is refused before it
    is loaded: named by $MUSE_OPS_SHIMS it is an error saying how to rebuild."""
    stale = tmp_path / "libmuse_shims.so"
    stale.write_bytes(b"\x7fELF not the shims")
    run = _python("import muse_ops", MUSE_OPS_SHIMS=str(stale))
    assert run.returncode != 0 and "built from other sources" in run.stderr and "build-shims" in run.stderr, run.stderr


def test_an_installed_package_carries_the_cpp_sources(tmp_path):
    """setup.py's build_py puts csrc_shims/'s sources into the package (what a wheel or an sdist
    install holds), byte for byte; a checkout's own files come first."""
    built = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(built)], cwd=ROOT, check=True,
                   capture_output=True)
    for name in (shims.HEADER, *shims.LIBRARY_SOURCES, *shims.DEV_SOURCES):
        packaged = built / "muse_ops" / "csrc" / name
        assert packaged.read_bytes() == (ROOT / "csrc_shims" / name).read_bytes(), name
    assert shims.sources() == [ROOT / "csrc_shims" / name for name in shims.LIBRARY_SOURCES]   # this checkout's


def test_build_shims_reads_the_packaged_sources_without_a_checkout(monkeypatch, tmp_path):
    """Where no checkout lies beside the package, build-shims compiles the packaged copies; with
    neither, it says where it looked."""
    packaged = tmp_path / "muse_ops" / "csrc"
    monkeypatch.setattr(shims, "SOURCE_DIRS", (tmp_path / "csrc_shims", packaged))
    with pytest.raises(RuntimeError, match="are in neither"):
        shims.sources()
    packaged.mkdir(parents=True)
    for name in (shims.HEADER, *shims.LIBRARY_SOURCES, *shims.DEV_SOURCES):
        (packaged / name).write_text("// a copy\n")
    assert shims.sources() == [packaged / name for name in shims.LIBRARY_SOURCES]
    assert shims.sources(dev=True) == [packaged / name for name in shims.DEV_SOURCES]
    pytest.importorskip("tvm_ffi")
    command = shims.build_command(tmp_path / "out.so")
    assert all(str(packaged / name) in command for name in shims.LIBRARY_SOURCES)
    assert str(packaged / shims.DEV_SOURCES[0]) in shims.build_command(tmp_path / "dev.so", dev=True)
