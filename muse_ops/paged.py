"""A small paged-KV-cache helper: allocate the cache and lay out a batch's page tables, slots
and positions, so users and tests do not hand-roll the index arithmetic of docs/DESIGN.md section 3.

A request of length L (cached tokens plus the new block of q_len) keeps token t at physical page
page_table[r, t // 16], row t % 16; its flat cache slot is page * 16 + row. The new block's
tokens are positions L - q_len .. L - 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import CACHE_ROW, PAGE_SIZE


def pages_for(length: int) -> int:
    return -(-length // PAGE_SIZE)


def allocate_kv_cache(num_pages: int, kv_heads: int, device=None, dtype=torch.bfloat16) -> torch.Tensor:
    """A zeroed bf16 [num_pages, kv_heads, 16, 128] cache (K in columns 0:64, V in 64:128)."""
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
