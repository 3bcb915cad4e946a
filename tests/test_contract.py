"""The layer's contract where a user meets it (docs/DESIGN.md section 8): a rejected step writes
nothing, eager or compiled; the package's own error is what a compiled call raises; a token's slot
is its request's own row; a batch larger than the layer's max_batch is an error.

Every test runs on the CPU (reference backend, where contents are always checked) and, where a
GPU is visible, on it with MUSE_OPS_CHECK=1 (the CuTe DSL kernels, contents checked).
"""
import pytest
import torch

import muse_ops
from muse_ops import DeploymentConfig, MuseAttentionDecode, MuseInputError, PagedBatch
from muse_ops.config import PAGE_SIZE

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def checked(monkeypatch, request):
    """Contents checked on the device under test: always on the reference backend (CPU); on the
    GPU with MUSE_OPS_CHECK=1."""
    monkeypatch.setenv("MUSE_OPS_CHECK", "1")


def _layer_step(device, lengths=(40, 75), max_batch=4, window=2048, seed=3):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cfg = DeploymentConfig(kv_heads=1, window=window, max_seq_len=512, max_batch=max_batch)
    layer = MuseAttentionDecode(cfg, device=device)
    num_pages = sum(-(-n // PAGE_SIZE) for n in lengths) + 6
    batch = PagedBatch.build(list(lengths), num_pages, cfg.q_len, generator=gen, device=device)
    cache = muse_ops.allocate_kv_cache(num_pages, 1, device=device)
    cache.normal_(generator=None)
    x = torch.randn(len(lengths) * cfg.q_len, 8192, generator=gen).to(device, torch.bfloat16)
    return layer, cache, batch, x


def _bits(t):
    return t.view(torch.int16).clone()


def _run(layer, compiled, *args):
    fn = torch.compile(layer, fullgraph=True) if compiled else layer
    with torch.inference_mode():
        return fn(*args)


def _expect_rejected(layer, compiled, arg, x, positions, slots, cache, page_table, seq_lens, also: str = ""):
    """The step raises MuseInputError naming arg (and saying `also`), and the cache holds the bits
    it held before."""
    before = _bits(cache)
    with pytest.raises(MuseInputError, match=rf"{arg} must be.*{also}"):
        _run(layer, compiled, x, positions, slots, cache, page_table, seq_lens)
    assert torch.equal(_bits(cache), before), "a rejected step wrote the cache"


# ------------------------------------------------------------------------ 1. no write before a rejection
BAD_CONTENTS = {
    "seq_lens below q_len": ("seq_lens", lambda b: b.seq_lens.__setitem__(1, 7)),
    "page past the cache": ("page_table", lambda b: b.page_table.__setitem__((1, 0), 10_000)),
    "seq_lens past max_seq_len": ("seq_lens", lambda b: b.seq_lens.__setitem__(0, 600)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", sorted(BAD_CONTENTS))
def test_rejected_step_writes_nothing(device, compiled, case, checked):
    """A step with bad contents raises before qkv_front writes the block's rows, compiled too
    (the compiled graph's first op checks the step; on today's main it raised after the write)."""
    torch._dynamo.reset()
    layer, cache, b, x = _layer_step(device)
    arg, spoil = BAD_CONTENTS[case]
    spoil(b)
    _expect_rejected(layer, compiled, arg, x, b.positions, b.slots, cache, b.page_table, b.seq_lens)


# ------------------------------------------------------------------------ 2. the package's own error, compiled
BAD_METADATA = {
    "x float32": ("x", lambda a: a.update(x=a["x"].float())),
    "positions float": ("positions", lambda a: a.update(positions=a["positions"].float())),
    "page_table int64": ("page_table", lambda a: a.update(page_table=a["page_table"].long())),
    "slots too short": ("slots", lambda a: a.update(slots=a["slots"][:3])),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("case", sorted(BAD_METADATA))
def test_compiled_layer_raises_muse_input_error(device, fullgraph, case):
    """Under torch.compile a bad argument raises MuseInputError itself (not torch's
    TorchRuntimeError around it, as on today's main), with fullgraph on or off, and the cache is
    left as it was."""
    torch._dynamo.reset()
    layer, cache, b, x = _layer_step(device)
    args = dict(x=x, positions=b.positions, slots=b.slots, kv_cache=cache, page_table=b.page_table,
                seq_lens=b.seq_lens)
    arg, spoil = BAD_METADATA[case]
    spoil(args)
    before = _bits(cache)
    fn = torch.compile(layer, fullgraph=fullgraph)
    with pytest.raises(MuseInputError, match=rf"{arg} must be"), torch.inference_mode():
        fn(**args)
    assert torch.equal(_bits(cache), before)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_ops_raise_muse_input_error(device):
    """The ops called from compiled code raise MuseInputError too, before writing."""
    torch._dynamo.reset()
    layer, cache, b, x = _layer_step(device)
    before = _bits(cache)

    def front(x, positions):
        return muse_ops.qkv_front(x, layer.qkv_weight, positions, b.slots, layer.cos_sin, cache)

    def attention(y, seq_lens):
        return torch.ops.muse.attn2(y, cache, b.page_table, seq_lens, layer.workspace, q_len=8, window=2048,
                                    scale=0.68, max_seq_len=512)

    with torch.inference_mode():
        with pytest.raises(MuseInputError, match="x must be"):
            torch.compile(front, fullgraph=True)(x.float(), b.positions)
        with pytest.raises(MuseInputError, match="positions must be"):
            torch.compile(front, fullgraph=True)(x, b.positions.float())
        y = muse_ops.qkv_front(x, layer.qkv_weight, b.positions, b.slots, layer.cos_sin, cache.clone())
        with pytest.raises(MuseInputError, match="seq_lens must be"):
            torch.compile(attention, fullgraph=True)(y, b.seq_lens.long())
    assert torch.equal(_bits(cache), before)


# ------------------------------------------------------------------------ 3. a token's slot is its request's
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_slot_in_another_request_is_rejected(device, compiled, checked):
    """Request 0's token writing into a row of request 1's page is refused before anything is
    written (on today's main the layer wrote it: one request's step overwrote another's cache)."""
    torch._dynamo.reset()
    layer, cache, b, x = _layer_step(device)
    other_page = int(b.page_table[1, 0])
    b.slots[3] = other_page * PAGE_SIZE + 5          # request 1's token 5, which it holds
    _expect_rejected(layer, compiled, "slots", x, b.positions, b.slots, cache, b.page_table, b.seq_lens)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_position_off_its_request_is_rejected(device, compiled, checked):
    """A token whose position is not L - q_len + t of its request (here one step older, with the
    slot of that older position, a pair that is consistent by itself) is refused."""
    torch._dynamo.reset()
    layer, cache, b, x = _layer_step(device)
    i = 8 + 2                                         # request 1, token 2
    pos = int(b.positions[i]) - 8
    b.positions[i] = pos
    b.slots[i] = int(b.page_table[1, pos // PAGE_SIZE]) * PAGE_SIZE + pos % PAGE_SIZE
    _expect_rejected(layer, compiled, "positions", x, b.positions, b.slots, cache, b.page_table, b.seq_lens)


@pytest.mark.parametrize("device", DEVICES)
def test_padding_requests_pass_the_token_checks(device, checked):
    """A batch padded with padding requests (page table [0, -1, ...], slots -1) is accepted in
    checked mode, and its real requests' rows are written."""
    gen = torch.Generator().manual_seed(2)
    cfg = DeploymentConfig(kv_heads=1, window=0, max_seq_len=512, max_batch=4)
    layer = MuseAttentionDecode(cfg, device=device)
    alloc = muse_ops.PageAllocator(32, cfg.max_pages, generator=gen)
    alloc.reserve("a", 50)
    alloc.reserve("b", 17)
    b = alloc.batch(["a", "b"], cfg.q_len, pad_to=4, device=device)
    cache = muse_ops.allocate_kv_cache(32, 1, device=device)
    x = torch.randn(32, 8192, generator=gen).to(device, torch.bfloat16)
    with torch.inference_mode():
        out = layer(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
    assert torch.isfinite(out[:16].float()).all()
    page = alloc.pages("a")[49 // PAGE_SIZE]
    assert cache[page, 0, 49 % PAGE_SIZE].float().abs().sum() > 0, "request a's last token was not inserted"


# ------------------------------------------------------------------------ 4. more requests than max_batch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_batch_larger_than_max_batch_is_an_error(device, compiled):
    """A layer built for max_batch = 2 refuses 3 requests with an error naming seq_lens and the
    bound, on every backend, before anything is written (on today's main the CPU accepted it
    without a word: the reference needs no workspace)."""
    torch._dynamo.reset()
    layer, cache, b, x = _layer_step(device, lengths=(40, 75, 20), max_batch=2)
    _expect_rejected(layer, compiled, "seq_lens", x, b.positions, b.slots, cache, b.page_table, b.seq_lens,
                     also="max_batch = 2")
