"""The C++ ops on the CPU (csrc_shims/, muse_ops.cutedsl.shims): the schemas they define are
muse_ops.ops.SCHEMAS, their plan formulas agree with the Python plan modules over wide grids, the
ahead-of-time build writes the table they read, and the package without them (MUSE_OPS_SHIMS=0)
or with a broken one behaves as documented. CI builds the library (.ci/run); where it is not built
the tests that need it skip, saying so."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from muse_ops import ops
from muse_ops.cutedsl import attn2_plan, qkv_front_plan, shims

ROOT = Path(__file__).resolve().parents[1]
needs_shims = pytest.mark.skipif(not shims.loaded(), reason=f"no C++ ops: {shims.status()}")


@needs_shims
def test_shims_define_the_python_schemas():
    for name, schema in ops.SCHEMAS.items():
        assert str(getattr(torch.ops.muse, name).default._schema) == f"muse::{schema}"


@needs_shims
def test_shims_plan_formulas_match_the_plan_modules():
    plan = torch.ops.muse._shims_plan
    for kv_heads in range(1, 300):
        assert plan("k_split", [kv_heads]) == qkv_front_plan.k_split(kv_heads), kv_heads
    for kv_heads in (1, 2, 3, 4, 5, 7, 8, 16):   # K splits 3, 3, 2, 1, 1, 1, 2, 2 (wave_tile above 256 tokens)
        for m in list(range(1, 1100)) + [4096, 1 << 20]:
            tile = qkv_front_plan.tile_for(m, kv_heads)
            index = next(i for i, (_, t, h, k) in enumerate(qkv_front_plan.TILES) if (t, h, k) == tile)
            assert plan("tile", [m, kv_heads]) == index, (m, kv_heads)
    for q_len in (1, 8):
        for window in (0, 2048):
            for msl in (512, 8192, 262144):
                cfg = attn2_plan._config(q_len, window, msl)
                for requests in (1, 3, 8, 17, 64, 128, 1000):
                    for kv_heads in (1, 2, 4, 16):
                        assert plan("workspace_bytes", [requests, kv_heads, cfg.slots, q_len]) == \
                            attn2_plan.workspace_bytes(requests, kv_heads, q_len, window, msl)
                        wide = attn2_plan.choose_layout(requests, kv_heads, window) == "wide"
                        assert plan("wide", [requests, kv_heads, window]) == wide
    for max_cap in (attn2_plan.OCCUPANCY_MAX_CAP["wide"], attn2_plan.OCCUPANCY_MAX_CAP["deep"]):
        for ctas in (1, 16, 64, 66, 67, 115, 116, 128, 132, 133, 230, 231, 256, 264, 265, 345, 346, 396, 397, 460, 461, 528, 1000):
            for cluster in (2, 4, 8):
                for sms in (0, 78, 114, 132):
                    assert plan("occupancy_cap", [ctas, cluster, sms, max_cap]) == \
                        attn2_plan.occupancy_cap(ctas, cluster, sms, max_cap), (ctas, cluster, sms, max_cap)


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


def test_aot_build_writes_the_shims_table():
    cfgs = qkv_front_plan.ci_variants()
    from muse_ops.cutedsl import aot
    fake = {repr(("qkv_front", c, "")): f"muse_q{i}" for i, c in enumerate(cfgs)}
    a = attn2_plan._config(8, 0, 8192, "wide")
    fake[repr(("attn2", a.compile_key, ""))] = "muse_a"
    table = aot.shims_table(fake).splitlines()
    assert table[1] == "tiles " + " ".join(str(limit) for limit, *_ in qkv_front_plan.TILES)
    assert sum(line.startswith("qkv_front ") for line in table) == len(cfgs)
    capped = attn2_plan._config(8, 0, 8192, "wide", ctas_per_sm=1)
    fake[repr(("attn2", capped.compile_key, ""))] = "muse_a1"
    table = aot.shims_table(fake).splitlines()
    assert f"occupancy {attn2_plan.OCCUPANCY_MAX_CAP['wide']} {attn2_plan.OCCUPANCY_MAX_CAP['deep']}" in table
    assert f"attn2 8 0 8192 1 0 {a.slots} {a.ctas_per_pair} {a.cluster_size} muse_a" in table
    assert f"attn2 8 0 8192 1 1 {a.slots} {a.ctas_per_pair} {a.cluster_size} muse_a1" in table
    # every qkv_front line names the tile its config has
    for line in table:
        if line.startswith("qkv_front "):
            _, tile, rope, pos64, slot64, name = line.split()
            cfg = cfgs[int(name[len("muse_q"):])]
            _, t, h, k = qkv_front_plan.TILES[int(tile)]
            assert (t, h, k) == (cfg.token_tile, cfg.heads_per_cta, cfg.k_tiles_per_stage)
            assert (int(rope), int(pos64), int(slot64)) == (cfg.rope, cfg.pos_dtype == "int64",
                                                            cfg.slot_dtype == "int64")


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=300)


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


def test_an_installed_package_carries_the_cpp_source(tmp_path):
    """setup.py's build_py puts csrc_shims/muse_shims.cpp into the package (what a wheel or an sdist
    install holds), byte for byte; a checkout's own file comes first."""
    built = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(built)], cwd=ROOT, check=True,
                   capture_output=True)
    packaged = built / "muse_ops" / "csrc" / "muse_shims.cpp"
    assert packaged.read_bytes() == (ROOT / "csrc_shims" / "muse_shims.cpp").read_bytes()
    assert shims.source() == ROOT / "csrc_shims" / "muse_shims.cpp"   # this checkout's, first


def test_build_shims_reads_the_packaged_source_without_a_checkout(monkeypatch, tmp_path):
    """Where no checkout lies beside the package, build-shims compiles the packaged copy; with
    neither, it says where it looked."""
    packaged = tmp_path / "muse_ops" / "csrc" / "muse_shims.cpp"
    monkeypatch.setattr(shims, "SOURCES", (tmp_path / "csrc_shims" / "muse_shims.cpp", packaged))
    with pytest.raises(RuntimeError, match="muse_shims.cpp is in neither"):
        shims.source()
    packaged.parent.mkdir(parents=True)
    packaged.write_text("// a copy\n")
    assert shims.source() == packaged
    pytest.importorskip("tvm_ffi")
    assert str(packaged) in shims.build_command(tmp_path / "out.so")
