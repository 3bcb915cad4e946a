"""The C++ ops (csrc_shims/, muse_ops.cutedsl.shims) on the GPU: once a variant is registered, eager
calls of torch.ops.muse.* and muse_ops.* launch it from C++, with the same bits as the Python host
path, the same errors (handed back to Python before anything is written), the device error flag,
CUDA graphs and torch.compile; calls outside Python's tables go to Python; the development
library's clocked ops run the same fast path; and the C++ example runs a layer step from a program
without Python. Skipped without CUDA or without the C++ library."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import muse_ops
from muse_ops import errors, ops
from muse_ops.config import DEFAULT_SCALE
from muse_ops.cutedsl import shims
from muse_ops.paged import PagedBatch
from muse_ops.reference import rope_cos_sin
from muse_ops.testing import assert_close, assert_layer_close, attn2_f64, qkv_front_f64
from scenario import attn2_inputs, qkv_front_inputs

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _loaded():
    if not shims.loaded():
        pytest.skip(f"no C++ ops: {shims.status()}")


def _bits(t):
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _front_case(m, kv_heads, rope, index_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = qkv_front_inputs(m, kv_heads, gen, device="cuda")
    num_pages = 64
    slots = torch.randperm(num_pages * 16, generator=gen)[:m].to(index_dtype)
    slots[::5] = -1                                     # padding rows: no insert
    positions = torch.randint(0, 4096, (m,), generator=gen).to(index_dtype)
    cos_sin = rope_cos_sin(4096, device="cuda") if rope else None
    cache = torch.randn(num_pages, kv_heads, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    return x, w, positions.cuda(), slots.cuda(), cos_sin, cache


def _counts(op):
    s = shims.stats()[op]
    return s["cpp"], s["python"]


@pytest.mark.parametrize("m,kv_heads,rope,index_dtype", [(1, 2, True, torch.int64), (8, 2, False, torch.int32),
                                                        (64, 1, True, torch.int64), (300, 4, True, torch.int32)])
def test_gpu_shims_qkv_front_matches_the_python_path(m, kv_heads, rope, index_dtype):
    x, w, positions, slots, cos_sin, cache = _front_case(m, kv_heads, rope, index_dtype, seed=m)
    with torch.inference_mode():
        torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache.clone())   # registers the variant
        cpp0, py0 = _counts("qkv_front")
        cache_cpp, cache_py = cache.clone(), cache.clone()
        y_cpp = torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache_cpp)
        y_mod = muse_ops.qkv_front(x, w, positions, slots, cos_sin, cache_cpp.clone())
        assert _counts("qkv_front") == (cpp0 + 2, py0), "the C++ path did not serve both calls"
        assert muse_ops.last_backend("qkv_front") == "cutedsl"
        y_py = ops._run_qkv_front("cutedsl", x, w, positions, slots, cos_sin, cache_py)   # the Python host path
    torch.cuda.synchronize()
    assert torch.equal(_bits(y_cpp), _bits(y_py)) and torch.equal(_bits(y_cpp), _bits(y_mod))
    assert torch.equal(_bits(cache_cpp), _bits(cache_py))
    y64 = qkv_front_f64(x, w, positions, cos_sin, kv_heads)
    assert_close(y_cpp, y64, "y")
    untouched = torch.ones(cache.shape[0] * 16, dtype=torch.bool, device="cuda")
    untouched[slots[slots >= 0].long()] = False
    flat = lambda c: c.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)   # noqa: E731
    assert torch.equal(_bits(flat(cache_cpp)[untouched]), _bits(flat(cache)[untouched])), "rows outside the slots changed"


@pytest.mark.parametrize("q_len,window,lengths", [(8, 0, [100, 3000, 70]), (1, 0, [5000]), (8, 2048, [9000, 40]),
                                                  (8, 0, [300] * 20)])
def test_gpu_shims_attn2_matches_the_python_path(q_len, window, lengths):
    gen = torch.Generator().manual_seed(len(lengths) + q_len)
    y, cache, b = attn2_inputs(lengths, q_len, 2, gen, device="cuda")
    page_table, seq_lens = b.page_table.cuda(), b.seq_lens.cuda()
    kw = dict(q_len=q_len, window=window, scale=DEFAULT_SCALE, max_seq_len=16384)
    ws = muse_ops.attn2_workspace("cuda", 32, 2, q_len, window, 16384)
    with torch.inference_mode():
        torch.ops.muse.attn2(y, cache, page_table, seq_lens, ws, **kw)     # registers the variant
        cpp0, py0 = _counts("attn2")
        out_cpp = torch.ops.muse.attn2(y, cache, page_table, seq_lens, ws, **kw)
        out_mod = muse_ops.attn2(y, cache, page_table, seq_lens, workspace=ws, **kw)
        assert _counts("attn2") == (cpp0 + 2, py0)
        out_py = ops._run_attn2("cutedsl", y, cache, page_table, seq_lens, ws, q_len, window, DEFAULT_SCALE, 16384)
    torch.cuda.synchronize()
    assert torch.equal(_bits(out_cpp), _bits(out_py)) and torch.equal(_bits(out_cpp), _bits(out_mod))
    ref = attn2_f64(y, cache, page_table, seq_lens, q_len=q_len, window=window, scale=DEFAULT_SCALE)
    assert_close(out_cpp, ref, "out")


def test_gpu_shims_refusals_are_the_packages_errors_and_write_nothing():
    x, w, positions, slots, cos_sin, cache = _front_case(8, 2, True, torch.int64, seed=5)
    before = cache.clone()
    with torch.inference_mode():
        torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache.clone())
        with pytest.raises(muse_ops.MuseInputError, match="weight"):
            torch.ops.muse.qkv_front(x, w[:-64], positions, slots, cos_sin, cache)
        with pytest.raises(muse_ops.MuseInputError, match="positions"):
            torch.ops.muse.qkv_front(x, w, positions[:-1], slots, cos_sin, cache)
        with pytest.raises(muse_ops.MuseInputError, match="x must be contiguous"):
            torch.ops.muse.qkv_front(x.t().contiguous().t(), w, positions, slots, cos_sin, cache)
    with pytest.raises(muse_ops.MuseInputError, match="inference-only"):
        torch.ops.muse.qkv_front(x, w.clone().requires_grad_(), positions, slots, cos_sin, cache)
    torch.cuda.synchronize()
    assert torch.equal(_bits(cache), _bits(before)), "a refused call wrote the cache"
    y, kv, b = attn2_inputs([100], 8, 2, torch.Generator().manual_seed(1), device="cuda")
    kw = dict(q_len=8, window=0, scale=DEFAULT_SCALE, max_seq_len=4096)
    with torch.inference_mode(), pytest.raises(muse_ops.MuseInputError, match="workspace"):
        torch.ops.muse.attn2(y, kv, b.page_table.cuda(), b.seq_lens.cuda(), torch.zeros(16, dtype=torch.uint8,
                             device="cuda"), **kw)


def test_gpu_shims_backend_selection_and_checked_mode(monkeypatch):
    x, w, positions, slots, cos_sin, cache = _front_case(8, 2, True, torch.int64, seed=6)
    with torch.inference_mode():
        torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache)
        cpp0, py0 = _counts("qkv_front")
        torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache, backend="reference")
        assert muse_ops.last_backend("qkv_front") == "reference"
        muse_ops.set_backend("reference")
        try:
            torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache)
            assert muse_ops.last_backend("qkv_front") == "reference"
        finally:
            muse_ops.set_backend(None)
        monkeypatch.setenv("MUSE_OPS_CHECK", "1")
        bad = slots.clone()
        bad[0] = cache.shape[0] * 16          # past the cache: checked mode raises before writing
        with pytest.raises(muse_ops.MuseInputError, match="slots"):
            torch.ops.muse.qkv_front(x, w, positions, bad, cos_sin, cache)
        monkeypatch.delenv("MUSE_OPS_CHECK")
        assert _counts("qkv_front") == (cpp0, py0 + 3)
        errors.device_errors("cuda")
        torch.ops.muse.qkv_front(x, w, positions, bad, cos_sin, cache)   # unchecked: the kernel flags it
        assert _counts("qkv_front")[0] == cpp0 + 1
        assert errors.device_errors("cuda") & errors.BAD_SLOT


def test_gpu_shims_calls_outside_the_tables_go_to_python():
    """Where Python's tables do not cover a call (more tokens or requests than they plan, an FP8
    cache), the C++ path hands it to Python, which plans it: the same bits as the Python path."""
    m = shims.TABLE_MAX_TOKENS + 1
    gen = torch.Generator().manual_seed(21)
    x, w = qkv_front_inputs(m, 1, gen, device="cuda")
    pages = m // 16 + 8
    slots = torch.randperm(pages * 16, generator=gen)[:m].cuda()
    positions = torch.randint(0, 4096, (m,), generator=gen).cuda()
    cache = torch.randn(pages, 1, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    with torch.inference_mode():
        torch.ops.muse.qkv_front(x, w, positions, slots, None, cache.clone())     # compiles the variant
        cpp0, py0 = _counts("qkv_front")
        cache_cpp, cache_py = cache.clone(), cache.clone()
        y = torch.ops.muse.qkv_front(x, w, positions, slots, None, cache_cpp)
        assert _counts("qkv_front") == (cpp0, py0 + 1), "a call past the tables took the C++ path"
        assert muse_ops.last_backend("qkv_front") == "cutedsl"
        y_py = ops._run_qkv_front("cutedsl", x, w, positions, slots, None, cache_py)
    torch.cuda.synchronize()
    assert torch.equal(_bits(y), _bits(y_py)) and torch.equal(_bits(cache_cpp), _bits(cache_py))

    r = shims.TABLE_MAX_REQUESTS + 1
    y, kv, b = attn2_inputs([20] * r, 1, 1, torch.Generator().manual_seed(22), device="cuda")
    page_table, seq_lens = b.page_table.cuda(), b.seq_lens.cuda()
    kw = dict(q_len=1, window=0, scale=DEFAULT_SCALE, max_seq_len=4096)
    ws = muse_ops.attn2_workspace("cuda", r, 1, 1, 0, 4096)
    with torch.inference_mode():
        torch.ops.muse.attn2(y, kv, page_table, seq_lens, ws, **kw)
        cpp0, py0 = _counts("attn2")
        out = torch.ops.muse.attn2(y, kv, page_table, seq_lens, ws, **kw)
        assert _counts("attn2") == (cpp0, py0 + 1), "a batch past the tables took the C++ path"
        out_py = ops._run_attn2("cutedsl", y, kv, page_table, seq_lens, ws, 1, 0, DEFAULT_SCALE, 4096)
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(out_py))

    x, w, positions, slots, _, cache = _front_case(8, 2, False, torch.int64, seed=23)
    fp8 = cache.to(torch.float8_e4m3fn)
    scale = torch.ones(2, device="cuda")
    fp8_cpp, fp8_py = fp8.clone(), fp8.clone()
    with torch.inference_mode():
        cpp0, py0 = _counts("qkv_front")
        y = torch.ops.muse.qkv_front(x, w, positions, slots, None, fp8_cpp, k_scale=scale, v_scale=scale)
        # Python runs the FP8 cache on the CuTe DSL kernel's FP8 variant
        assert _counts("qkv_front") == (cpp0, py0 + 1) and muse_ops.last_backend("qkv_front") == "cutedsl"
        y_py = ops._run_qkv_front("cutedsl", x, w, positions, slots, None, fp8_py, scale, scale)
    torch.cuda.synchronize()
    assert torch.equal(_bits(y), _bits(y_py)) and torch.equal(_bits(fp8_cpp), _bits(fp8_py))


def test_gpu_shims_development_library_times_the_fast_path(tmp_path):
    """The development library's clocked ops run the package's fast path (the same bits, counted as
    C++ calls) with a host clock; its floors return at once. The package's ops read no clock."""
    shims.load_dev(tmp_path / shims.DEV_LIBRARY_NAME)
    x, w, positions, slots, cos_sin, cache = _front_case(8, 2, True, torch.int64, seed=24)
    y2, kv, b = attn2_inputs([100, 3000], 8, 2, torch.Generator().manual_seed(25), device="cuda")
    page_table, seq_lens = b.page_table.cuda(), b.seq_lens.cuda()
    kw = dict(q_len=8, window=0, scale=DEFAULT_SCALE, max_seq_len=4096)
    ws = muse_ops.attn2_workspace("cuda", 8, 2, 8, 0, 4096)
    with torch.inference_mode():
        torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache.clone())
        torch.ops.muse.attn2(y2, kv, page_table, seq_lens, ws, **kw)
        torch.ops.muse._shims_clock_reset()
        front0, attn0 = _counts("qkv_front"), _counts("attn2")
        y = torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache.clone())
        y_clocked = torch.ops.muse._shims_qkv_front_clocked(x, w, positions, slots, cos_sin, cache.clone())
        out = torch.ops.muse.attn2(y2, kv, page_table, seq_lens, ws, **kw)
        out_clocked = torch.ops.muse._shims_attn2_clocked(y2, kv, page_table, seq_lens, ws, **kw)
        assert _counts("qkv_front")[0] == front0[0] + 2 and _counts("attn2")[0] == attn0[0] + 2
        assert torch.ops.muse._shims_null(x, w, positions, slots, cos_sin, cache) is not None
        assert torch.ops.muse._shims_null_attn2(y2, kv, page_table, seq_lens, ws, **kw) is not None
    torch.cuda.synchronize()
    assert torch.equal(_bits(y), _bits(y_clocked)) and torch.equal(_bits(out), _bits(out_clocked))
    stats = torch.ops.muse._shims_clock_stats()
    for op in range(2):    # [calls, total, plan, alloc, launch] ns of each op: one clocked call each
        calls, total, plan, alloc, launch = stats[5 * op:5 * op + 5]
        assert calls == 1 and min(plan, alloc, launch) > 0 and total >= plan + alloc + launch, stats


def _layer_step(cfg, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layer = muse_ops.MuseAttentionDecode(cfg, device="cuda")
    layer.prepare()
    b = PagedBatch.build(lengths, 1024, cfg.q_len, generator=gen, device="cuda")
    cache = muse_ops.allocate_kv_cache(1024, cfg.kv_heads, device="cuda")
    cache.normal_(generator=torch.Generator("cuda").manual_seed(seed))
    x = torch.randn(cfg.q_len * len(lengths), 8192, generator=gen).to("cuda", torch.bfloat16)
    return layer, b, cache, x


def test_gpu_shims_graph_and_compile_launch_from_cpp():
    cfg = muse_ops.DeploymentConfig.sliding(kv_heads=2, max_seq_len=8192, max_batch=4)
    layer, b, cache, x = _layer_step(cfg, [100, 3000, 5000], seed=7)
    args = (b.positions, b.slots)
    with torch.inference_mode():
        eager_cache = cache.clone()
        eager = layer(x, *args, eager_cache, b.page_table, b.seq_lens)
        # CUDA graph of the C++ path
        graph_cache = cache.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(x, *args, graph_cache.clone(), b.page_table, b.seq_lens)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        cpp0 = _counts("qkv_front")[0]
        with torch.cuda.graph(g):
            captured = layer(x, *args, graph_cache, b.page_table, b.seq_lens)
        assert _counts("qkv_front")[0] == cpp0 + 1, "the capture did not go through the C++ path"
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(_bits(captured), _bits(eager)) and torch.equal(_bits(graph_cache), _bits(eager_cache))
        # torch.compile (default mode): the compiled graph calls the public ops, i.e. the C++ kernels
        compiled = torch.compile(layer, fullgraph=True)
        comp_cache = cache.clone()
        compiled(x, *args, comp_cache.clone(), b.page_table, b.seq_lens)
        cpp0 = _counts("attn2")[0]
        out = compiled(x, *args, comp_cache, b.page_table, b.seq_lens)
        assert _counts("attn2")[0] == cpp0 + 1
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(eager)) and torch.equal(_bits(comp_cache), _bits(eager_cache))
    y64 = qkv_front_f64(x, layer.qkv_weight.detach(), b.positions, layer.cos_sin, 2)
    ref = attn2_f64(y64.to(torch.bfloat16), eager_cache, b.page_table, b.seq_lens, q_len=8, window=cfg.window,
                    scale=cfg.scale)
    assert_layer_close(eager, ref)


def test_gpu_shims_layer_step_is_one_cpp_call_with_the_ops_bits():
    """MuseAttentionDecode's eager step runs as one C++ call (muse::_shims_layer_step): the bits of
    y's consumer (out) and of the cache equal those of the two ops called one by one; a step whose
    inputs are wrong is refused by the package's checks before anything is written."""
    cfg = muse_ops.DeploymentConfig.full(kv_heads=2, max_seq_len=8192, max_batch=4)
    layer, b, cache, x = _layer_step(cfg, [40, 2100, 8000], seed=11)
    args = (b.positions, b.slots)
    with torch.inference_mode():
        layer(x, *args, cache.clone(), b.page_table, b.seq_lens)     # every variant registered
        step_cache, ops_cache = cache.clone(), cache.clone()
        front0, attn0 = _counts("qkv_front"), _counts("attn2")
        out = layer(x, *args, step_cache, b.page_table, b.seq_lens)
        assert _counts("qkv_front") == (front0[0] + 1, front0[1]) and _counts("attn2") == (attn0[0] + 1, attn0[1])
        y = torch.ops.muse.qkv_front(x, layer.qkv_weight, *args, None, ops_cache)
        out_ops = torch.ops.muse.attn2(y, ops_cache, b.page_table, b.seq_lens, layer.workspace, q_len=8, window=0,
                                       scale=cfg.scale, max_seq_len=8192)
        bad_cache = cache.clone()
        with pytest.raises(muse_ops.MuseInputError, match="page_table"):
            layer(x, *args, bad_cache, b.page_table[:2], b.seq_lens)
        with pytest.raises(muse_ops.MuseInputError, match="positions"):
            layer(x, b.positions[:-1], b.slots, bad_cache, b.page_table, b.seq_lens)
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(out_ops)) and torch.equal(_bits(step_cache), _bits(ops_cache))
    assert not torch.equal(_bits(step_cache), _bits(cache)), "the step inserted nothing"
    assert torch.equal(_bits(bad_cache), _bits(cache)), "a refused step wrote the cache"


def _example_build(tmp_path) -> Path:
    from torch.utils import cpp_extension
    exe = tmp_path / "verify_step"
    lib = Path(shims.status().split(" ")[0])
    cmd = [os.environ.get("CXX", "g++"), "-std=c++20", "-O2", str(ROOT / "csrc_shims/examples/verify_step.cpp"),
           "-o", str(exe)] + [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-L{p}" for p in cpp_extension.library_paths()] + [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    cmd += ["-Wl,--no-as-needed", "-ltorch", "-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda", "-lc10", "-ldl",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-DMUSE_SHIMS_DEFAULT=\"{lib}\""]
    subprocess.run(cmd, check=True)
    return exe


def test_gpu_shims_cpp_example_runs_a_verify_step(tmp_path):
    library = os.environ.get("MUSE_OPS_AOT_LIBRARY")
    if not library:
        pytest.skip("the example loads an ahead-of-time library ($MUSE_OPS_AOT_LIBRARY)")
    exe = _example_build(tmp_path)
    dump = tmp_path / "step.pt"
    import tvm_ffi
    # the library's kernels call TVM-FFI's C API: a C++ deployment puts libtvm_ffi.so on the loader's path
    env = {**os.environ, "LD_LIBRARY_PATH": f"{Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent}:"
           f"{os.environ.get('LD_LIBRARY_PATH', '')}"}
    run = subprocess.run([str(exe), shims.status().split(" ")[0], library, str(dump)], capture_output=True, text=True,
                         env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "launched from C++: qkv_front 1 attn2 1" in run.stdout, run.stdout
    step = torch.load(dump, weights_only=False)   # written by the example above
    x, w = step["x"].cuda(), step["weight"].cuda()
    positions, page_table, seq_lens = step["positions"].cuda(), step["page_table"].cuda(), step["seq_lens"].cuda()
    kv_heads = step["cache_before"].shape[1]
    y64 = qkv_front_f64(x, w, positions, None, kv_heads)     # a full-attention layer: no RoPE
    assert_close(step["y"].cuda(), y64, "y (C++ example)")
    ref = attn2_f64(y64.to(torch.bfloat16), step["cache_after"].cuda(), page_table, seq_lens, q_len=8, window=0,
                    scale=DEFAULT_SCALE)
    assert_layer_close(step["out"].cuda(), ref, "out (C++ example)")
    print(run.stdout, file=sys.stderr)


def test_gpu_shims_opcheck_on_the_cpp_kernels():
    """torch.library.opcheck of both public ops on CUDA, where their kernels are C++: schema,
    fake against real, and AOT dispatch with dynamic shapes."""
    x, w, positions, slots, cos_sin, cache = _front_case(16, 2, True, torch.int64, seed=11)
    with torch.inference_mode():
        torch.ops.muse.qkv_front(x, w, positions, slots, cos_sin, cache.clone())
    torch.library.opcheck(torch.ops.muse.qkv_front.default, (x, w, positions, slots, cos_sin, cache))
    y, kv, b = attn2_inputs([100, 700], 8, 2, torch.Generator().manual_seed(12), device="cuda")
    kv = torch.nan_to_num(kv)    # opcheck compares outputs
    ws = muse_ops.attn2_workspace("cuda", 8, 2, 8, 0, 4096)
    kw = dict(q_len=8, window=0, scale=DEFAULT_SCALE, max_seq_len=4096)
    cpp0 = _counts("attn2")[0]
    torch.library.opcheck(torch.ops.muse.attn2.default, (y, kv, b.page_table.cuda(), b.seq_lens.cuda(), ws),
                          kw)
    assert _counts("attn2")[0] > cpp0, "opcheck never reached the C++ kernel"
