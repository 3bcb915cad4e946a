"""Host time per eager call: what a caller pays on the CPU before the GPU sees a launch.

    python -m bench.host [--out FILE.json]

For each op at B = 1 and B = 64 (qkv_front M = 8 and 512; attn2 at L = 512 and 8192) and for a
layer step, N back-to-back calls are timed on the host clock after a sync, N small enough that the
launch queue never fills (so the host, not the GPU, is what is timed), median of 7 repeats, metadata
checks on. Paths:
  torch.ops.muse.*    the public op through the dispatcher (the C++ kernel where the C++ ops are loaded)
  muse_ops.*          the package's Python functions
  python body         the Python host path alone (ops._qkv_front_impl / _attn2_impl: checks, plan,
                      TVM-FFI launch), what muse_ops.* ran before the C++ ops
  tvm-ffi launch      the compiled function called from Python with nothing else
  dispatcher floor    a C++ op with the op's argument list that does nothing (for attn2 also with its
                      workspace not marked mutable): what torch.ops costs before any of our code runs
  layer eager         MuseAttentionDecode.forward in eager mode (the step checked once in Python,
                      then both C++ ops)
  layer compiled      torch.compile(layer) in the default mode (Inductor, no CUDA graphs)
  compiled floor      the same for a module of the layer's state and inputs that writes one input
                      in place and returns one output with two trivial kernels: torch.compile's own cost
The torch.ops.muse.* and muse_ops.* rows also give the C++ fast path's share of a call, split into
its checks and lookups, the guard and the output's allocation, and the kernel call, timed on its
clocked copy (`_shims_*_clocked`: the same code with a host clock). The floors and the clocked
copies are the development library's (csrc_shims/muse_shims_dev.cpp; shims.load_dev builds and
loads it): the package's own ops read no clock.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import muse_ops
from muse_ops import ops
from muse_ops.config import DEFAULT_SCALE, HIDDEN, proj_cols
from muse_ops.cutedsl import launch, runtime, shims
from muse_ops.cutedsl.attn2_plan import launch_config as attn2_config, wave_ctas
from muse_ops.cutedsl.qkv_front_plan import k_split, launch_config as qkv_config
from muse_ops.errors import error_flag
from muse_ops.paged import PagedBatch

KV_HEADS = 2
CALLS = 200
ATTN2_KW = dict(q_len=8, window=0, scale=DEFAULT_SCALE, max_seq_len=16384)   # the deployment attn2 is timed in


def one_at_a_time_us(fn, calls: int = CALLS) -> float:
    """Median host time of single calls, each after a sync (the GPU idle, its queue empty)."""
    fn()
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def host_us(fn, calls: int = CALLS, repeats: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls / 1e3)
        torch.cuda.synchronize()
    return statistics.median(samples)


CLOCK_PARTS = ("cpp", "plan", "alloc", "launch")   # the layout of _shims_clock_stats after each op's call count


def cpp_share(op: str, clocked) -> dict:
    """The C++ fast path's host time per call in us, timed back to back (host_us) on its clocked copy
    `clocked` (a call of `_shims_<op>_clocked`): "cpp" its whole body, "plan" the checks and the
    table lookups, "alloc" the device guard and the output, "launch" the kernel call (the clock's own
    six reads, ~0.15 us, included); {} where no call took the fast path."""
    torch.ops.muse._shims_clock_reset()
    host_us(clocked)
    first = (1 + len(CLOCK_PARTS)) * shims.OPS.index(op)
    calls, *ns = torch.ops.muse._shims_clock_stats()[first:first + 1 + len(CLOCK_PARTS)]
    return {part: v / calls / 1e3 for part, v in zip(CLOCK_PARTS, ns)} if calls else {}


def public_calls(batch: int = 1, length: int = 512) -> dict:
    """The two public ops through torch.ops on _inputs(batch, length), as zero-argument calls (under
    the caller's inference mode); "inputs" holds (batch, cache, x, weight, workspace, y, attn2's keywords)."""
    b, cache, x, w, ws = _inputs(batch, length)
    kw = ATTN2_KW
    y = torch.ops.muse.qkv_front(x, w, b.positions, b.slots, None, cache)
    return {"qkv_front": lambda: torch.ops.muse.qkv_front(x, w, b.positions, b.slots, None, cache),
            "attn2": lambda: torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, ws, **kw),
            "inputs": (b, cache, x, w, ws, y, kw)}


class _CompileFloor(torch.nn.Module):
    """torch.compile's own per-call cost for a step of the layer's shape: the same module state
    and inputs, one input written in place, one output, and no muse op (two trivial kernels)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, positions, slots, kv_cache, page_table, seq_lens):
        kv_cache[0, 0, 0, :8].copy_(x[0, :8])
        return x[:, :1024] * 2


def prepared_layer(weight: torch.Tensor) -> "muse_ops.MuseAttentionDecode":
    """A full-attention MuseAttentionDecode of the deployment attn2 is timed in (ATTN2_KW), with
    this fused weight, its variants prepared."""
    cfg = muse_ops.DeploymentConfig.full(kv_heads=KV_HEADS, max_seq_len=ATTN2_KW["max_seq_len"], max_batch=128)
    layer = muse_ops.MuseAttentionDecode(cfg, device="cuda")
    layer.prepare()
    layer.qkv_weight.data.copy_(weight)
    return layer


def _inputs(batch: int, length: int):
    gen = torch.Generator().manual_seed(batch)
    lengths = [length] * batch
    b = PagedBatch.build(lengths, batch * (length // 16 + 2), 8, generator=gen, device="cuda")
    cache = muse_ops.allocate_kv_cache(batch * (length // 16 + 2), KV_HEADS, device="cuda")
    cache.normal_()
    x = torch.randn(8 * batch, HIDDEN, generator=gen).to("cuda", torch.bfloat16)
    w = (torch.randn(proj_cols(KV_HEADS), HIDDEN, generator=gen) / HIDDEN ** 0.5).to("cuda", torch.bfloat16)
    ws = muse_ops.attn2_workspace("cuda", 128, KV_HEADS, 8, 0, 16384)
    return b, cache, x, w, ws


def measure() -> list[dict]:
    rows = []
    kw = ATTN2_KW
    if shims.loaded():
        shims.load_dev()   # the floors and the clocked copies of the fast path
    for batch, length in ((1, 512), (64, 8192)):
        b, cache, x, w, ws = _inputs(batch, length)
        with torch.inference_mode():
            y = torch.ops.muse.qkv_front(x, w, b.positions, b.slots, None, cache)
            torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, ws, **kw)
            flag = error_flag(x.device)
            qfn = launch.compile_qkv_front(qkv_config(x.shape[0], KV_HEADS, False, b.positions.dtype, b.slots.dtype))
            acfg = attn2_config(batch, KV_HEADS, 8, 0, 16384)
            afn = launch.compile_attn2(acfg)
            dummy = runtime.dummy_tensor(x.device)
            yq = torch.empty_like(y)
            out = torch.empty(y.shape[0], 512 * KV_HEADS, dtype=torch.bfloat16, device="cuda")
            split, wave = k_split(KV_HEADS), wave_ctas(x.device)
            paths = {
                "qkv_front": {
                    "torch.ops.muse.qkv_front": lambda: torch.ops.muse.qkv_front(x, w, b.positions, b.slots, None, cache),
                    "muse_ops.qkv_front": lambda: muse_ops.qkv_front(x, w, b.positions, b.slots, None, cache),
                    "python body": lambda: ops._qkv_front_impl(x, w, b.positions, b.slots, None, cache),
                    "tvm-ffi launch": lambda: qfn(x, w, b.positions, b.slots, dummy, cache, yq, flag, split),
                    "dispatcher floor": lambda: torch.ops.muse._shims_null(x, w, b.positions, b.slots, None, cache),
                },
                "attn2": {
                    "torch.ops.muse.attn2": lambda: torch.ops.muse.attn2(y, cache, b.page_table, b.seq_lens, ws, **kw),
                    "muse_ops.attn2": lambda: muse_ops.attn2(y, cache, b.page_table, b.seq_lens, workspace=ws, **kw),
                    "python body": lambda: ops._attn2_impl(y, cache, b.page_table, b.seq_lens, ws, **kw),
                    "tvm-ffi launch": lambda: afn(y, cache, b.page_table, b.seq_lens, out, ws, flag, DEFAULT_SCALE,
                                                  16384, wave),
                    "dispatcher floor": lambda: torch.ops.muse._shims_null_attn2(y, cache, b.page_table, b.seq_lens,
                                                                                 ws, **kw),
                    "dispatcher floor, workspace not (a!)": lambda: torch.ops.muse._shims_null_attn2_const(
                        y, cache, b.page_table, b.seq_lens, ws, **kw),
                },
            }
            clocked = {"qkv_front": lambda: torch.ops.muse._shims_qkv_front_clocked(x, w, b.positions, b.slots, None,
                                                                                    cache),
                       "attn2": lambda: torch.ops.muse._shims_attn2_clocked(y, cache, b.page_table, b.seq_lens, ws,
                                                                            **kw)}
            if not shims.loaded():
                del paths["qkv_front"]["dispatcher floor"]
                del paths["attn2"]["dispatcher floor"], paths["attn2"]["dispatcher floor, workspace not (a!)"]
            for op, fns in paths.items():
                share = cpp_share(op, clocked[op]) if shims.loaded() else {}
                for name, fn in fns.items():
                    row = {"op": op, "B": batch, "L": length, "path": name, "host_us": host_us(fn)}
                    if name.startswith(("torch.ops", "muse_ops")):   # the C++ body's share of it
                        row.update({f"{part}_us": v for part, v in share.items()})
                    row["single_us"] = one_at_a_time_us(fn)
                    rows.append(row)
        layer = prepared_layer(w)
        args = (x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
        with torch.inference_mode():
            rows.append({"op": "layer", "B": batch, "L": length, "path": "layer eager",
                         "host_us": host_us(lambda: layer(*args)), "single_us": one_at_a_time_us(lambda: layer(*args))})
            compiled = torch.compile(layer)
            for _ in range(3):
                compiled(*args)
            floor = torch.compile(_CompileFloor(layer))
            for _ in range(3):
                floor(*args)
            rows.append({"op": "layer", "B": batch, "L": length, "path": "compiled floor (default mode)",
                         "host_us": host_us(lambda: floor(*args)), "single_us": one_at_a_time_us(lambda: floor(*args))})
            rows.append({"op": "layer", "B": batch, "L": length, "path": "layer compiled (default mode)",
                         "host_us": host_us(lambda: compiled(*args)),
                         "single_us": one_at_a_time_us(lambda: compiled(*args))})
    return rows


def table(rows) -> str:
    lines = ["| op | B | L | path | us / call, back to back | us, one call after a sync | in the C++ kernel "
             "(back to back) | its checks and plan | guard and allocation | launch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: f"{v:.1f}" if v is not None else ""   # noqa: E731
    lines += [f"| {r['op']} | {r['B']} | {r['L']} | {r['path']} | {r['host_us']:.1f} | {fmt(r.get('single_us'))} | "
              f"{fmt(r.get('cpp_us'))} | {fmt(r.get('plan_us'))} | {fmt(r.get('alloc_us'))} | "
              f"{fmt(r.get('launch_us'))} |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = measure()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shims": shims.status(),
            "stats": shims.stats(), "calls": CALLS}
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(json.dumps(meta))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
