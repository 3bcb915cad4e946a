"""The package on a CUDA device (whatever backend the default picks there): the layer step against
float64, CUDA-graph capture replayed with new inputs, torch.compile. Skipped without CUDA."""
import pytest
import torch

import muse_ops
from muse_ops import DeploymentConfig, MuseAttentionDecode, PagedBatch

from muse_ops.testing import assert_close, attn2_f64, qkv_front_f64
from scenario import attn2_inputs

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _layer(cfg, seed):
    torch.manual_seed(seed)
    layer = MuseAttentionDecode(cfg, device=DEV).eval()
    backend = layer.prepare()
    return layer, backend


def _check_step(layer, cfg, x, b, cache, out):
    y64 = qkv_front_f64(x.cpu(), layer.qkv_weight.detach().cpu(), b.positions.cpu(),
                           None if layer.cos_sin is None else layer.cos_sin.cpu(), cfg.kv_heads)
    ref = attn2_f64(y64.to(torch.bfloat16), cache.cpu(), b.page_table.cpu(), b.seq_lens.cpu(), q_len=cfg.q_len, window=cfg.window, scale=cfg.scale)
    assert_close(out, ref)


@pytest.mark.parametrize("window", [0, 2048])
def test_gpu_reference_attn2_matches_float64(window):
    gen = torch.Generator().manual_seed(21)
    y, cache, b = attn2_inputs([8, 100, 3000, 2049], 8, 2, gen)
    out = muse_ops.attn2(y.to(DEV), cache.to(DEV), b.page_table.to(DEV), b.seq_lens.to(DEV), q_len=8,
                         window=window, scale=0.684, max_seq_len=4096, backend="reference")
    assert_close(out, attn2_f64(y, cache, b.page_table, b.seq_lens, q_len=8, window=window, scale=0.684))


@pytest.mark.parametrize("window", [0, 2048])
def test_gpu_module_cuda_graph_replays_new_inputs(window):
    cfg = DeploymentConfig(kv_heads=2, window=window, max_seq_len=8192, max_batch=4)
    layer, backend = _layer(cfg, 31)
    gen = torch.Generator().manual_seed(32)
    num_pages = 2048
    cache = muse_ops.allocate_kv_cache(num_pages, 2, device=DEV)
    cache.normal_()
    width = cfg.max_pages
    # static buffers the graph reads; each replay gets new contents
    x = torch.empty(32, 8192, dtype=torch.bfloat16, device=DEV)
    pos = torch.empty(32, dtype=torch.int64, device=DEV)
    slots = torch.empty(32, dtype=torch.int64, device=DEV)
    table = torch.empty(4, width, dtype=torch.int32, device=DEV)
    lens = torch.empty(4, dtype=torch.int32, device=DEV)

    def load(lengths):
        b = PagedBatch.build(lengths, num_pages, 8, max_pages=width, generator=gen, device=DEV)
        x.copy_(torch.randn(32, 8192, generator=gen).to(torch.bfloat16))
        pos.copy_(b.positions); slots.copy_(b.slots); table.copy_(b.page_table); lens.copy_(b.seq_lens)
        return b

    load([50, 60, 70, 80])
    with torch.inference_mode():
        layer(x, pos, slots, cache, table, lens)  # warm up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x, pos, slots, cache, table, lens)
        for lengths in ([8, 777, 4000, 8192], [3000, 16, 2100, 9]):
            b = load(lengths)
            graph.replay()
            torch.cuda.synchronize()
            _check_step(layer, cfg, x, b, cache, out)
    print(f"backend {backend}")


def test_gpu_module_compiles():
    cfg = DeploymentConfig.sliding(kv_heads=2, max_seq_len=4096, max_batch=2)
    layer, _ = _layer(cfg, 41)
    gen = torch.Generator().manual_seed(42)
    b = PagedBatch.build([100, 2500], 1024, 8, generator=gen, device=DEV)
    cache = muse_ops.allocate_kv_cache(1024, 2, device=DEV)
    cache.normal_()
    x = torch.randn(16, 8192, generator=gen).to(DEV, torch.bfloat16)
    c_eager = cache.clone()
    with torch.no_grad():
        eager = layer(x, b.positions, b.slots, c_eager, b.page_table, b.seq_lens)
        out = torch.compile(layer, fullgraph=True)(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert torch.equal(out, eager) and torch.equal(cache, c_eager)
