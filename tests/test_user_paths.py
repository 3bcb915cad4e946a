"""The package as a user meets it: a rejected layer step writes nothing; the layer compiles and
runs in default grad mode and a backward says the ops are inference-only; the device error flag
and the buffers work from any grad / inference mode; torch.ops.muse.attn2 without a workspace,
eager and compiled. On the CPU (reference backend); the GPU variants carry the gpu marker."""
import pytest
import torch
from torch._inductor.utils import run_and_get_code

import muse_ops
from muse_ops import DeploymentConfig, MuseAttentionDecode, MuseInputError, PagedBatch
from muse_ops.testing import assert_close, attn2_f64, qkv_front_f64

from scenario import attn2_inputs, compile_caches_off


def _layer_step(device="cpu", window=0, seed=1, lengths=(20, 300, 77)):
    cfg = DeploymentConfig(kv_heads=1, window=window, max_seq_len=512, max_batch=len(lengths))
    torch.manual_seed(seed)
    layer = MuseAttentionDecode(cfg, device=device)
    gen = torch.Generator().manual_seed(seed)
    num_pages = sum(-(-n // 16) for n in lengths) + 4
    batch = PagedBatch.build(list(lengths), num_pages, cfg.q_len, generator=gen, device=device)
    cache = muse_ops.allocate_kv_cache(num_pages, cfg.kv_heads, device=device)
    cache.normal_(generator=torch.Generator(device=device).manual_seed(seed))
    x = torch.randn(len(lengths) * cfg.q_len, 8192, generator=gen).to(device, torch.bfloat16)
    return cfg, layer, batch, cache, x


def _bits(t):
    return t.view(torch.int16).clone()


REJECTED = {
    "seq_lens below q_len": lambda b, c: b.seq_lens.__setitem__(1, 5),
    "seq_lens above max_seq_len": lambda b, c: b.seq_lens.__setitem__(2, 600),
    "page outside the cache": lambda b, c: b.page_table.__setitem__((1, 3), c.shape[0] + 2),
    "page_table dtype": lambda b, c: setattr(b, "page_table", b.page_table.long()),
    "seq_lens rows": lambda b, c: setattr(b, "seq_lens", b.seq_lens[:2]),
}


def _rejected_step_writes_nothing(device, case):
    cfg, layer, b, cache, x = _layer_step(device)
    REJECTED[case](b, cache)
    before = _bits(cache)
    with pytest.raises(MuseInputError):
        with torch.inference_mode():
            layer(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert torch.equal(_bits(cache), before), "a rejected step changed the cache"


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_rejected_layer_step_leaves_the_cache_bit_identical(case):
    _rejected_step_writes_nothing("cpu", case)


def test_layer_batch_beyond_its_workspace_is_rejected_before_writing(monkeypatch):
    """More requests than the layer's workspace holds, where attn2 runs the kernel backend (which
    needs a workspace; the resolution is simulated here, the check is the real one): the step's
    checks refuse it, naming the workspace, before qkv_front inserts anything. Before this check
    was part of the step, qkv_front wrote the cache and attn2 then raised."""
    from muse_ops import backends
    monkeypatch.setattr(backends, "resolve",
                        lambda op, device, requested, record=True, **v: "cutedsl" if op == "attn2" else "reference")
    cfg, layer, b, cache, x = _layer_step("cpu")      # the layer's CPU workspace: 16 bytes
    before = _bits(cache)
    with pytest.raises(MuseInputError, match="workspace"):
        with torch.inference_mode():
            layer(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert torch.equal(_bits(cache), before), "a rejected step changed the cache"


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(REJECTED))
def test_rejected_layer_step_checked_mode_gpu(case, monkeypatch):
    monkeypatch.setenv("MUSE_OPS_CHECK", "1")
    _rejected_step_writes_nothing("cuda", case)


def test_layer_compiles_and_runs_in_default_grad_mode():
    cfg, layer, b, cache, x = _layer_step(window=2048)
    assert torch.is_grad_enabled()
    assert not any(p.requires_grad for p in layer.parameters())
    eager_cache = cache.clone()
    eager = layer(x, b.positions, b.slots, eager_cache, b.page_table, b.seq_lens)
    assert not eager.requires_grad
    compiled = torch.compile(layer, fullgraph=True)(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert torch.equal(_bits(compiled), _bits(eager)) and torch.equal(_bits(cache), _bits(eager_cache))
    y64 = qkv_front_f64(x, layer.qkv_weight, b.positions, layer.cos_sin, cfg.kv_heads)
    assert_close(compiled, attn2_f64(y64.to(torch.bfloat16), cache, b.page_table, b.seq_lens, q_len=cfg.q_len,
                                     window=cfg.window, scale=cfg.scale))


def test_ops_asked_for_a_backward_say_they_are_inference_only():
    gen = torch.Generator().manual_seed(2)
    y, cache, b = attn2_inputs([40, 9], 8, 1, gen)
    kw = dict(q_len=8, window=0, scale=0.68, max_seq_len=256)
    for call in (lambda t: muse_ops.attn2(t, cache, b.page_table, b.seq_lens, **kw),
                 lambda t: torch.ops.muse.attn2(t, cache, b.page_table, b.seq_lens, **kw)):
        with pytest.raises(MuseInputError, match="inference-only"):
            call(y.clone().requires_grad_(True))
    w = torch.randn(1152, 8192, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(2, 8192, dtype=torch.bfloat16)
    idx = torch.tensor([3, 4])
    with pytest.raises(MuseInputError, match="inference-only"):
        torch.ops.muse.qkv_front(x, w, idx, idx, None, cache)
    with torch.no_grad():   # no grad mode, nothing recorded: fine
        torch.ops.muse.qkv_front(x, w, idx, idx, None, cache)


def test_error_flag_and_buffers_work_from_any_mode():
    dev = torch.device("cpu")
    from muse_ops import errors
    errors._flags.pop(dev, None)
    with torch.inference_mode():            # a serving loop's first call allocates the flag
        flag = errors.error_flag(dev)
        flag.fill_(errors.BAD_SLOT)
        layer = MuseAttentionDecode(DeploymentConfig(kv_heads=1, max_seq_len=128, max_batch=2))
    assert not flag.is_inference() and not layer.workspace.is_inference()
    assert muse_ops.device_errors(dev) == errors.BAD_SLOT   # read and reset outside inference mode
    assert muse_ops.device_errors(dev) == 0
    flag.fill_(errors.BAD_PAGE)
    with pytest.raises(muse_ops.MuseDeviceError, match="page_table"):
        muse_ops.raise_device_errors(dev)
    with torch.inference_mode():
        assert muse_ops.device_errors(dev) == 0
    ws = muse_ops.attn2_workspace(dev, 2, 1, 8, 0, 128)
    with torch.inference_mode():
        ws2 = muse_ops.attn2_workspace(dev, 2, 1, 8, 0, 128)
    ws.zero_(), ws2.zero_()                 # both ordinary tensors


def test_torch_ops_attn2_without_a_workspace_eager_and_compiled():
    gen = torch.Generator().manual_seed(4)
    y, cache, b = attn2_inputs([50, 8, 130], 8, 2, gen)
    cache = torch.nan_to_num(cache)
    kw = dict(q_len=8, window=0, scale=5.473 / 8, max_seq_len=1024)
    ws = muse_ops.attn2_workspace("cpu", 3, 2, 8, 0, 1024)
    ref = attn2_f64(y, cache, b.page_table, b.seq_lens, q_len=8, window=0, scale=kw["scale"])
    plain = torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, **kw)
    assert_close(plain, ref)
    with_ws = torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, ws, **kw)
    assert torch.equal(_bits(plain), _bits(with_ws))
    # what the compiled graph calls: without a workspace the composite (a fresh workspace, then
    # the internal op); with one, the public op where the C++ ops define it (its C++ kernel) and
    # the internal op where Python does (ops.py, _attn2_traced)
    with_workspace_op = "torch.ops.muse.attn2.default(" if muse_ops.ops.CPP else "torch.ops.muse._attn2.default("
    for fn, op in ((lambda: torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, **kw),
                    "torch.ops.muse._attn2.default("),
                   (lambda: torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, workspace=ws, **kw),
                    with_workspace_op)):
        torch._dynamo.reset()
        with compile_caches_off():
            out, code = run_and_get_code(torch.compile(fn, fullgraph=True))
        assert torch.equal(_bits(out), _bits(plain))
        src = "\n".join(code)
        assert op in src, op
        assert "copy_" not in src, "the compiled graph copies a buffer (the workspace?)"
    torch.library.opcheck(torch.ops.muse._attn2.default, (y, cache, b.page_table, b.seq_lens, ws),
                          dict(backend="reference", **kw))
