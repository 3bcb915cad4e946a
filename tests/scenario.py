"""Random, realistic inputs for the ops: scattered pages in a pool whose unused pages and rows
hold NaN (so a read outside a request shows up), q and k rms-normalised like qkv_front's output;
compiling with Inductor's caches off, for tests that read the generated code; and loading one of
examples/ as a module."""
import contextlib
import importlib.util
from pathlib import Path

import torch

from muse_ops.config import HIDDEN, PAGE_SIZE, proj_cols
from muse_ops.paged import PagedBatch

BF16 = torch.bfloat16


def nan_poisoned_cache(num_pages, kv_heads, batch: PagedBatch, gen, device="cpu"):
    """N(0,1) keys and values in every row a request holds, NaN everywhere else."""
    cache = torch.full((num_pages, kv_heads, PAGE_SIZE, 128), float("nan"), dtype=BF16)
    for r, length in enumerate(batch.seq_lens.tolist()):
        t = torch.arange(length)
        pages = batch.page_table[r].long().cpu()[t // PAGE_SIZE]
        cache[pages, :, t % PAGE_SIZE] = torch.randn(length, kv_heads, 128, generator=gen).to(BF16)
    return cache.to(device)


def attn2_inputs(lengths, q_len, kv_heads, gen, spare_pages=7, device="cpu"):
    """(y, kv_cache, batch): a verify block per request over a scattered, NaN-poisoned cache."""
    need = sum(-(-n // PAGE_SIZE) for n in lengths)
    num_pages = need + spare_pages
    batch = PagedBatch.build(lengths, num_pages, q_len, max_pages=max(-(-n // PAGE_SIZE) for n in lengths) + 2,
                             generator=gen)
    cache = nan_poisoned_cache(num_pages, kv_heads, batch, gen)
    y = torch.randn(q_len * len(lengths), proj_cols(kv_heads), generator=gen) * 1.5
    return y.to(BF16).to(device), cache.to(device), batch


def qkv_front_inputs(m, kv_heads, gen, num_pages=64, device="cpu"):
    x = torch.randn(m, HIDDEN, generator=gen).to(BF16)
    w = (torch.randn(proj_cols(kv_heads), HIDDEN, generator=gen) / HIDDEN ** 0.5).to(BF16)
    return x.to(device), w.to(device)


def compile_caches_off():
    """Inductor's FX-graph and AOT-autograd caches off, for a test that reads the code a compile
    generates: their keys do not tell the C++ ops' registrations from the Python ones (the same
    graph compiles to the public ops' calls in one, the internal ops' in the other), so a graph
    compiled in the other mode (another test, an earlier process: CI runs both modes on one
    machine) came back from the cache in place of this one."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    return stack


def load_example(name: str):
    """examples/<name>.py as a fresh module (the examples are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
