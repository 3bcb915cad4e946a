"""A small paged-KV-cache helper: allocate the cache and lay out a batch's page tables, slots
and positions, so users and tests do not hand-roll the index arithmetic of docs/DESIGN.md section 3.

A request of length L (cached tokens plus the new block of q_len) keeps token t at physical page
page_table[r, t // 16], row t % 16; its flat cache slot is page * 16 + row. The new block's
tokens are positions L - q_len .. L - 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import CACHE_DTYPES, CACHE_ROW, PAGE_SIZE


def pages_for(length: int) -> int:
    return -(-length // PAGE_SIZE)


def allocate_kv_cache(num_pages: int, kv_heads: int, device=None, dtype=torch.bfloat16) -> torch.Tensor:
    """A zeroed [num_pages, kv_heads, 16, 128] cache (K in columns 0:64, V in 64:128), bf16 or
    torch.float8_e4m3fn (half the bytes: twice the tokens in the same memory)."""
    if dtype not in CACHE_DTYPES:
        raise ValueError(f"dtype must be one of {CACHE_DTYPES}, got {dtype}")
    return torch.zeros((num_pages, kv_heads, PAGE_SIZE, CACHE_ROW), dtype=dtype, device=device)


def random_page_table(seq_lens, num_pages: int, max_pages: int | None = None, generator=None,
                      device=None) -> torch.Tensor:
    """int32 [R, max_pages]: every request gets distinct pages drawn at random from the pool
    (scattered, as in a long-running server); entries past a request's last page are -1."""
    lens = [int(v) for v in seq_lens]
    need = [pages_for(n) for n in lens]
    width = max(max(need, default=1), 1) if max_pages is None else max_pages
    if sum(need) > num_pages:
        raise ValueError(f"the batch needs {sum(need)} pages, the pool has {num_pages}")
    if max(need, default=0) > width:
        raise ValueError(f"max_pages {width} is narrower than the longest request ({max(need)} pages)")
    order = torch.randperm(num_pages, generator=generator)
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    start = 0
    for r, n in enumerate(need):
        table[r, :n] = order[start:start + n].to(torch.int32)
        start += n
    return table.to(device)


def block_positions(seq_lens: torch.Tensor, q_len: int) -> torch.Tensor:
    """int64 [R * q_len]: positions L - q_len .. L - 1 of each request's new block."""
    offs = torch.arange(q_len, device=seq_lens.device)
    return (seq_lens.long()[:, None] - q_len + offs[None, :]).reshape(-1)


def block_slots(page_table: torch.Tensor, seq_lens: torch.Tensor, q_len: int) -> torch.Tensor:
    """int64 [R * q_len]: flat cache slots of each request's new block."""
    pos = block_positions(seq_lens, q_len).view(-1, q_len)
    page = torch.gather(page_table.long(), 1, pos // PAGE_SIZE)
    return (page * PAGE_SIZE + pos % PAGE_SIZE).reshape(-1)


@dataclass
class PagedBatch:
    """Everything a step needs to address the cache for one batch of requests."""

    seq_lens: torch.Tensor     # int32 [R], L including the new block
    page_table: torch.Tensor   # int32 [R, max_pages]
    positions: torch.Tensor    # int64 [R * q_len]
    slots: torch.Tensor        # int64 [R * q_len]

    @classmethod
    def build(cls, seq_lens, num_pages: int, q_len: int, max_pages: int | None = None, generator=None,
              device=None) -> "PagedBatch":
        lens = torch.as_tensor([int(v) for v in seq_lens], dtype=torch.int32)
        if bool((lens < q_len).any()):
            raise ValueError(f"every length must be >= q_len ({q_len}), got {lens.tolist()}")
        table = random_page_table(lens.tolist(), num_pages, max_pages, generator)
        return cls(seq_lens=lens.to(device), page_table=table.to(device),
                   positions=block_positions(lens, q_len).to(device),
                   slots=block_slots(table, lens, q_len).to(device))


class PageAllocator:
    """The pages of one paged cache (shared by every layer's cache of the same shape) for requests
    that grow step by step, join and leave, as a serving engine keeps them.

    Page 0 is reserved as the dummy page of padding requests: a batch padded to a captured size
    (a CUDA graph replays fixed shapes) fills its unused rows with requests of length q_len whose
    page table is [0, -1, ...] and whose slots are -1, so qkv_front inserts nothing for them and
    attn2 reads only the dummy page (keep its rows finite: allocate_kv_cache zeroes the cache).
    Their output rows are meaningless and the caller drops them. Freed pages return to the pool
    and are handed out again (scattered, as in a long-running server)."""

    DUMMY_PAGE = 0

    def __init__(self, num_pages: int, max_pages_per_request: int, generator=None):
        if num_pages < 2:
            raise ValueError("a page pool needs the dummy page and at least one more")
        self.max_pages = max_pages_per_request
        order = torch.randperm(num_pages - 1, generator=generator) + 1
        self._free: list[int] = order.tolist()
        self._pages: dict = {}
        self.lengths: dict = {}

    def free_pages(self) -> int:
        return len(self._free)

    def reserve(self, request, length: int) -> None:
        """Make request hold the pages of `length` tokens (a new request, or one that grew)."""
        pages = self._pages.setdefault(request, [])
        need = pages_for(length)
        if need > self.max_pages:
            raise ValueError(f"request {request!r}: {length} tokens need {need} pages, the table holds {self.max_pages}")
        if need - len(pages) > len(self._free):
            raise RuntimeError(f"the page pool is out of pages ({len(self._free)} free, request {request!r} "
                               f"needs {need - len(pages)} more)")
        while len(pages) < need:
            pages.append(self._free.pop())
        self.lengths[request] = length

    def pages(self, request) -> list[int]:
        """The physical pages of request, in logical order."""
        return list(self._pages[request])

    def release(self, request) -> None:
        """The request left: its pages go back to the pool."""
        self._free.extend(reversed(self._pages.pop(request)))
        del self.lengths[request]

    def batch(self, requests, q_len: int, pad_to: int | None = None, device=None) -> PagedBatch:
        """A step's PagedBatch for `requests` (each holding the pages of its length, which includes
        the step's block), padded with padding requests up to pad_to rows of requests."""
        rows = len(requests) if pad_to is None else pad_to
        if rows < len(requests):
            raise ValueError(f"pad_to={pad_to} is smaller than the batch ({len(requests)} requests)")
        table = torch.full((rows, self.max_pages), -1, dtype=torch.int32)
        lens = torch.full((rows,), q_len, dtype=torch.int32)
        table[len(requests):, 0] = self.DUMMY_PAGE
        for r, req in enumerate(requests):
            pages = self._pages[req]
            table[r, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
            lens[r] = self.lengths[req]
        slots = block_slots(table, lens, q_len)
        slots.view(rows, q_len)[len(requests):] = -1
        return PagedBatch(seq_lens=lens.to(device), page_table=table.to(device),
                          positions=block_positions(lens, q_len).to(device), slots=slots.to(device))
