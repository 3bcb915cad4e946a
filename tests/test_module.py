"""MuseAttentionDecode: eager vs float64, torch.compile(fullgraph) parity with an in-place cache."""
import pytest
import torch
from torch._inductor.utils import run_and_get_code

import muse_ops
from muse_ops import DeploymentConfig, MuseAttentionDecode, PagedBatch

from muse_ops.testing import assert_close, attn2_f64, qkv_front_f64
from scenario import compile_caches_off


def _step(cfg, lengths, seed, o_proj=False):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layer = MuseAttentionDecode(cfg, o_proj=o_proj).eval()
    num_pages = sum(-(-n // 16) for n in lengths) + 5
    batch = PagedBatch.build(lengths, num_pages, cfg.q_len, generator=gen)
    cache = muse_ops.allocate_kv_cache(num_pages, cfg.kv_heads)
    cache.normal_(generator=gen)
    x = torch.randn(len(lengths) * cfg.q_len, 8192, generator=gen).to(torch.bfloat16)
    return layer, cache, batch, x


@pytest.mark.parametrize("window", [0, 2048])
def test_module_step_matches_float64(window):
    cfg = DeploymentConfig(kv_heads=1, window=window, max_seq_len=4096, max_batch=3)
    layer, cache, b, x = _step(cfg, [20, 2100, 300], seed=11)
    with torch.inference_mode():
        out = layer(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    y64 = qkv_front_f64(x, layer.qkv_weight.detach(), b.positions, layer.cos_sin, 1)
    ref = attn2_f64(y64.to(torch.bfloat16), cache, b.page_table, b.seq_lens, q_len=8, window=window, scale=cfg.scale)
    assert_close(out, ref)


def test_module_o_proj_shape():
    cfg = DeploymentConfig(kv_heads=1, window=0, max_seq_len=256, max_batch=2)
    layer, cache, b, x = _step(cfg, [9, 40], seed=3, o_proj=True)
    with torch.inference_mode():
        out = layer(x.view(2, 8, 8192), b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert out.shape == (2, 8, 8192)


def test_module_compiles_fullgraph_with_cache_in_place():
    cfg = DeploymentConfig.sliding(kv_heads=1, max_seq_len=512, max_batch=2)
    layer, cache, b, x = _step(cfg, [37, 100], seed=4)
    eager_cache = cache.clone()
    with torch.no_grad():
        eager = layer(x, b.positions, b.slots, eager_cache, b.page_table, b.seq_lens)
        compiled = torch.compile(layer, fullgraph=True)  # fullgraph: a graph break raises
        ptr = cache.data_ptr()
        with compile_caches_off():   # the code read below is this mode's
            out, code = run_and_get_code(compiled, x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    assert torch.equal(cache.view(torch.int16), eager_cache.view(torch.int16)), "compiled cache write differs"
    assert cache.data_ptr() == ptr
    src = "\n".join(code)
    # the registered ops are in the graph (the eager bypass of ops.py must not leak into tracing):
    # the public ops where the C++ library defines them (their CUDA kernels are C++), else the
    # internal ops the Python composites call
    names = ("qkv_front", "attn2") if muse_ops.ops.CPP else ("_qkv_front", "_attn2")
    assert all(f"torch.ops.muse.{n}.default" in src for n in names), names
    # no clone/copy of the cache: the op writes the graph input itself
    shape = str(tuple(cache.shape))
    assert "copy_" not in src, "the compiled graph copies a buffer (the cache?)"
    assert f"empty_strided_cpu({shape}" not in src, "the compiled graph allocates a cache-sized buffer"
