"""Op plumbing: fakes agree with the real ops, opcheck, backend selection, and bad inputs raise
an error naming the argument before anything is written."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import muse_ops
from muse_ops import MuseInputError
from muse_ops.config import PAGE_SIZE

from scenario import attn2_inputs, qkv_front_inputs

ATTN_KW = dict(q_len=8, window=0, scale=0.68, max_seq_len=4096)


@pytest.fixture
def attn_case():
    gen = torch.Generator().manual_seed(5)
    y, cache, batch = attn2_inputs([40, 130], 8, 2, gen)
    return y, torch.nan_to_num(cache), batch  # opcheck compares outputs, NaN pages would not compare


@pytest.fixture
def front_case():
    gen = torch.Generator().manual_seed(6)
    x, w = qkv_front_inputs(8, 2, gen)
    cache = muse_ops.allocate_kv_cache(16, 2)
    positions = torch.arange(100, 108)
    slots = torch.arange(8) * 3 + 1
    return x, w, positions, slots, muse_ops.rope_cos_sin(512), cache


def _meta_of(t):
    return (tuple(t.shape), t.dtype, tuple(t.stride()))


def test_fakes_agree_with_reference(attn_case, front_case):
    y, cache, b = attn_case
    real = torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, None, backend="reference", **ATTN_KW)
    x, w, pos, slots, cs, kv = front_case
    real_y = torch.ops.muse.qkv_front(x, w, pos, slots, cs, kv.clone())
    with FakeTensorMode() as mode:
        fy, fcache, fpt, fsl = (mode.from_tensor(t) for t in (y, cache, b.page_table, b.seq_lens))
        fake = torch.ops.muse.attn2(fy, fcache, fpt, fsl, None, **ATTN_KW)
        fake_y = torch.ops.muse.qkv_front(*(mode.from_tensor(t) for t in (x, w, pos, slots, cs, kv)))
    assert _meta_of(fake) == _meta_of(real)
    assert _meta_of(fake_y) == _meta_of(real_y)


def test_opcheck_attn2(attn_case):
    y, cache, b = attn_case
    for workspace in (None, torch.zeros(64, dtype=torch.uint8)):
        torch.library.opcheck(torch.ops.muse.attn2.default, (y, cache, b.page_table, b.seq_lens, workspace),
                              dict(backend="reference", **ATTN_KW))


def test_opcheck_qkv_front(front_case):
    torch.library.opcheck(torch.ops.muse.qkv_front.default, front_case)


def test_backend_selection_is_explicit(attn_case, monkeypatch):
    y, cache, b = attn_case
    muse_ops.attn2(y, cache, b.page_table, b.seq_lens, **ATTN_KW)
    assert muse_ops.last_backend("attn2") == "reference"          # the only one that runs on a CPU
    with pytest.raises(RuntimeError, match="cutedsl backend was requested but cannot run: cpu device"):
        muse_ops.attn2(y, cache, b.page_table, b.seq_lens, backend="cutedsl", **ATTN_KW)
    monkeypatch.setenv("MUSE_OPS_BACKEND", "cutedsl")
    with pytest.raises(RuntimeError, match="cutedsl backend was requested"):
        muse_ops.attn2(y, cache, b.page_table, b.seq_lens, **ATTN_KW)
    muse_ops.set_backend("reference")                              # beats the environment
    try:
        muse_ops.attn2(y, cache, b.page_table, b.seq_lens, **ATTN_KW)
    finally:
        muse_ops.set_backend(None)
    with pytest.raises(ValueError, match="backend must be one of"):
        muse_ops.attn2(y, cache, b.page_table, b.seq_lens, backend="triton", **ATTN_KW)
    report = muse_ops.available_backends("cpu")
    assert report["reference"][0] and not report["cutedsl"][0] and "cpu" in report["cutedsl"][1]


# ------------------------------------------------------------------------------ bad inputs
def _misaligned(t):
    """Same values and layout, 2 bytes off a 16-byte boundary."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype)
    out = buf[1:1 + t.numel()].view(t.shape)
    out.copy_(t)
    return out


FRONT_BAD = {
    "x dtype": (lambda a: a.update(x=a["x"].float()), "x"),
    "x width": (lambda a: a.update(x=a["x"][:, :4096].contiguous()), "x"),
    "x strided": (lambda a: a.update(x=a["x"].repeat(1, 2)[:, ::2]), "x"),
    "x misaligned": (lambda a: a.update(x=_misaligned(a["x"])), "x"),
    "weight rows": (lambda a: a.update(weight=a["weight"][:1152].contiguous()), "weight"),
    "positions length": (lambda a: a.update(positions=a["positions"][:3]), "positions"),
    "positions dtype": (lambda a: a.update(positions=a["positions"].float()), "positions"),
    "positions past cos_sin": (lambda a: a["positions"].__setitem__(2, 512), "positions"),
    "slots dtype": (lambda a: a.update(slots=a["slots"].to(torch.int16)), "slots"),
    "slot past the cache": (lambda a: a["slots"].__setitem__(5, 16 * PAGE_SIZE), "slots"),
    "slots repeated": (lambda a: a["slots"].__setitem__(5, int(a["slots"][0])), "slots"),
    "cos_sin width": (lambda a: a.update(cos_sin=a["cos_sin"][:, :32].contiguous()), "cos_sin"),
    "cos_sin dtype": (lambda a: a.update(cos_sin=a["cos_sin"].double()), "cos_sin"),
    "kv_cache dtype": (lambda a: a.update(kv_cache=a["kv_cache"].float()), "kv_cache"),
    "kv_cache page size": (lambda a: a.update(kv_cache=torch.zeros(32, 2, 8, 128, dtype=torch.bfloat16)), "kv_cache"),
    "kv_cache heads vs weight": (lambda a: a.update(kv_cache=torch.zeros(16, 4, 16, 128, dtype=torch.bfloat16)), "weight"),
}


@pytest.mark.parametrize("case", sorted(FRONT_BAD))
def test_qkv_front_bad_input_raises_and_leaves_cache(front_case, case):
    x, w, pos, slots, cs, cache = front_case
    cache.normal_()
    args = dict(x=x, weight=w, positions=pos.clone(), slots=slots.clone(), cos_sin=cs, kv_cache=cache)
    mutate, arg = FRONT_BAD[case]
    mutate(args)
    before = args["kv_cache"].clone()
    with pytest.raises(MuseInputError, match=rf"muse::qkv_front: {arg} must be"):
        muse_ops.qkv_front(**args)
    assert torch.equal(args["kv_cache"].view(torch.int16) if args["kv_cache"].dtype == torch.bfloat16
                       else args["kv_cache"], before.view(torch.int16) if before.dtype == torch.bfloat16 else before)


ATTN_BAD = {
    "q_len": (lambda a, k: k.update(q_len=4), "q_len"),
    "window": (lambda a, k: k.update(window=-1), "window"),
    "scale": (lambda a, k: k.update(scale=0.0), "scale"),
    "max_seq_len": (lambda a, k: k.update(max_seq_len=4), "max_seq_len"),
    "seq_lens dtype": (lambda a, k: a.update(seq_lens=a["seq_lens"].long()), "seq_lens"),
    "seq_lens below q_len": (lambda a, k: a["seq_lens"].__setitem__(0, 7), "seq_lens"),
    "seq_lens above max_seq_len": (lambda a, k: k.update(max_seq_len=100), "seq_lens"),
    "page_table dtype": (lambda a, k: a.update(page_table=a["page_table"].long()), "page_table"),
    "page_table rows": (lambda a, k: a.update(page_table=a["page_table"][:1]), "page_table"),
    "page -1 in use": (lambda a, k: a["page_table"].__setitem__((1, 3), -1), "page_table"),
    "page past the pool": (lambda a, k: a["page_table"].__setitem__((0, 0), 10_000), "page_table"),
    "page_table too narrow": (lambda a, k: a.update(page_table=a["page_table"][:, :2].contiguous()), "page_table"),
    "y rows": (lambda a, k: a.update(y=a["y"][:8]), "y"),
    "y columns": (lambda a, k: a.update(y=a["y"][:, :1152].contiguous()), "y"),
    "y misaligned": (lambda a, k: a.update(y=_misaligned(a["y"])), "y"),
    "workspace dtype": (lambda a, k: a.update(workspace=torch.zeros(4, dtype=torch.int32)), "workspace"),
}


@pytest.mark.parametrize("case", sorted(ATTN_BAD))
def test_attn2_bad_input_raises(attn_case, case):
    y, cache, b = attn_case
    args = dict(y=y, kv_cache=cache, page_table=b.page_table.clone(), seq_lens=b.seq_lens.clone())
    kw = dict(ATTN_KW)
    mutate, arg = ATTN_BAD[case]
    mutate(args, kw)
    with pytest.raises(MuseInputError, match=rf"muse::attn2: {arg} must be"):
        muse_ops.attn2(**args, **kw)


def test_attn2_window_pages_before_the_window_are_not_needed():
    """A sliding layer's engine may have freed pages before the window: -1 there is fine."""
    gen = torch.Generator().manual_seed(7)
    y, cache, b = attn2_inputs([700], 8, 1, gen)
    cache[b.page_table[0, 5:30].long()] = float("nan")      # keys 80..479, older than the window too
    b.page_table[0, :5] = -1                                # keys 0..79
    out = muse_ops.attn2(y, cache, b.page_table, b.seq_lens, q_len=8, window=64, scale=0.68, max_seq_len=4096)
    assert torch.isfinite(out.float()).all()


def test_eager_calls_bypass_the_dispatcher_only_when_nothing_traces(attn_case):
    """Plain eager calls run the op body directly (host overhead); fake tensors, grad-requiring
    inputs and traced calls go through the registered op, and both give the same bits."""
    from muse_ops.ops import _plain_eager
    y, cache, b = attn_case
    assert _plain_eager(y, cache, b.page_table, b.seq_lens, None)
    # a module's weight (a Parameter that does not require grad) is plain too; one that requires
    # grad, with grad mode on, is not (the registered op refuses it)
    assert _plain_eager(torch.nn.Parameter(y.clone(), requires_grad=False), cache)
    assert not _plain_eager(torch.nn.Parameter(y.float().clone()), cache)
    assert not _plain_eager(y.clone().requires_grad_(False), cache, torch.ones(1, requires_grad=True))
    with FakeTensorMode() as mode:
        assert not _plain_eager(mode.from_tensor(y))
    direct = muse_ops.attn2(y, cache, b.page_table, b.seq_lens, **ATTN_KW)
    via_op = torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, None, **ATTN_KW)
    assert torch.equal(direct.view(torch.int16), via_op.view(torch.int16))
