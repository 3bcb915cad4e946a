"""The kernels from an ahead-of-time library ($MUSE_OPS_AOT_LIBRARY, muse_ops.cutedsl.aot), on the
GPU: every variant a deployment prepares is served by the library (none compiled), and a layer
step through them matches float64. Run with the CuTe DSL absent from the path (tools/aot_device_env.sh)
it also shows that nothing imports cutlass. Skipped without CUDA or without a library."""
import sys

import pytest
import torch

import muse_ops
from muse_ops import DeploymentConfig, MuseAttentionDecode, PagedBatch
from muse_ops.cutedsl import aot, runtime
from muse_ops.testing import assert_layer_close, attn2_f64, qkv_front_f64

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _library():
    if not aot.available():
        pytest.skip(f"no ahead-of-time library: {aot.status()}")


@pytest.mark.parametrize("make", [DeploymentConfig.sliding, DeploymentConfig.full])
def test_gpu_aot_library_serves_the_deployment(make):
    cfg = make(kv_heads=2, max_seq_len=8192, max_batch=8)
    report = muse_ops.prepare(cfg, "cuda")
    assert report["backends"] == {"qkv_front": "cutedsl", "attn2": "cutedsl"}, report
    hows = {v["how"] for v in report["variants"]}
    assert hows <= {"aot", "memory"}, report["variants"]     # memory: served by the library earlier
    torch.manual_seed(3)
    layer = MuseAttentionDecode(cfg, device="cuda")
    gen = torch.Generator().manual_seed(4)
    b = PagedBatch.build([100, 3000, 8192], 2048, 8, generator=gen, device="cuda")
    cache = muse_ops.allocate_kv_cache(2048, 2, device="cuda")
    cache.normal_()
    x = torch.randn(24, 8192, generator=gen).to("cuda", torch.bfloat16)
    with torch.inference_mode():
        out = layer(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert muse_ops.last_backend("qkv_front") == "cutedsl" and muse_ops.last_backend("attn2") == "cutedsl"
    y64 = qkv_front_f64(x, layer.qkv_weight.detach(), b.positions, layer.cos_sin, 2)
    ref = attn2_f64(y64.to(torch.bfloat16), cache, b.page_table, b.seq_lens, q_len=8, window=cfg.window,
                    scale=cfg.scale)
    assert_layer_close(out, ref)
    if runtime.import_error() is not None:      # the DSL is absent: nothing may have imported it
        assert sys.modules.get("cutlass") is None
