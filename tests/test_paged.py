"""muse_ops.PageAllocator: pages for growing requests, released and reused; padding requests."""
import pytest
import torch

import muse_ops
from muse_ops.testing import assert_close, attn2_f64


def test_allocator_grows_releases_and_pads():
    pool = muse_ops.PageAllocator(12, 4, generator=torch.Generator().manual_seed(1))
    pool.reserve("a", 20)                     # 2 pages
    pool.reserve("b", 16)                     # 1 page
    pool.reserve("a", 40)                     # grows to 3 pages, keeps its first 2
    b = pool.batch(["a", "b"], q_len=8, pad_to=3)
    table = b.page_table
    assert b.seq_lens.tolist() == [40, 16, 8]
    assert (table[0, :3] > 0).all() and table[0, 3] == -1 and (table[1, :1] > 0).all()
    assert table[2].tolist() == [0, -1, -1, -1]                       # the padding request: dummy page
    assert (b.slots.view(3, 8)[2] == -1).all()                        # and no insert
    used = set(table[:2][table[:2] >= 0].tolist())
    assert len(used) == 4 and 0 not in used and pool.free_pages() == 11 - 4
    pool.release("a")
    assert pool.free_pages() == 11 - 1
    pool.reserve("c", 64)                      # reuses the freed pages
    pool.reserve("d", 64)
    assert pool.free_pages() == 2
    with pytest.raises(RuntimeError, match="out of pages"):
        pool.reserve("e", 64)
    with pytest.raises(ValueError, match="table holds"):
        pool.reserve("f", 16 * 5)


def test_a_padded_step_computes_the_real_requests_exactly():
    """The real requests of a padded batch get what they get alone; the padding rows are finite."""
    gen = torch.Generator().manual_seed(3)
    pool = muse_ops.PageAllocator(40, 8, generator=gen)
    cache = muse_ops.allocate_kv_cache(40, 1)
    for req, length in (("a", 100), ("b", 33)):
        pool.reserve(req, length)
    cache[1:].normal_(generator=gen)          # page 0, the dummy, stays zero
    y = torch.randn(4 * 8, 1152, generator=gen).to(torch.bfloat16)
    kw = dict(q_len=8, window=0, scale=0.68, max_seq_len=128)
    padded = pool.batch(["a", "b"], 8, pad_to=4)
    out = muse_ops.attn2(y, cache, padded.page_table, padded.seq_lens, **kw)
    alone = pool.batch(["a", "b"], 8)
    real = muse_ops.attn2(y[:16].contiguous(), cache, alone.page_table, alone.seq_lens, **kw)
    assert torch.equal(out[:16], real) and torch.isfinite(out.float()).all()
    assert_close(real, attn2_f64(y[:16], cache, alone.page_table, alone.seq_lens, q_len=8, window=0, scale=0.68))
