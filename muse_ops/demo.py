"""`python -m muse_ops demo`: a few speculative-verify steps of a TP8-sized layer (Hkv 2).

Random weights, a paged cache holding requests of different lengths, sliding and full layers;
each step runs MuseAttentionDecode (qkv_front then attn2), prints its time and backend, and the
last step of each layer is checked against the float64 evaluation of muse_ops.testing. On a GPU,
the layer's step is then timed by CUDA-graph replay. The side-by-side comparison with the stock
serving path is the bench's (`python -m muse_ops bench --cases layer`, in a source checkout).
--cache-dtype fp8 runs the layers on a float8_e4m3fn cache with the given dequantization scales.
"""
from __future__ import annotations

import argparse
import time

import torch

from . import backends
from .config import HIDDEN, DeploymentConfig
from .testing import attn2_f64, qkv_front_f64, tolerance_report
from .module import MuseAttentionDecode
from .paged import PagedBatch, allocate_kv_cache, block_positions, block_slots


CACHE_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def run_demo(device: str = "auto", steps: int = 3, lengths=(40, 333, 1500, 2600), seed: int = 0,
             backend: str | None = None, cache_dtype: str = "bf16", k_scale: float = 1.0,
             v_scale: float = 1.0) -> bool:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA GPU"
                           + ("; it is a CPU-only build" if torch.version.cuda is None else ""))
    dtype = CACHE_DTYPES[cache_dtype]
    fp8 = dtype == torch.float8_e4m3fn
    scales = dict(k_scale=k_scale, v_scale=v_scale) if fp8 else {}
    gen = torch.Generator().manual_seed(seed)
    q_len, kv_heads, max_seq_len = 8, 2, 4096
    num_pages = 2048
    print(f"muse_ops demo on {dev}: Hkv={kv_heads}, q_len={q_len}, requests of lengths {list(lengths)} "
          f"(+{q_len} per step), {cache_dtype} cache" + (f" (k_scale {k_scale}, v_scale {v_scale})" if fp8 else ""))
    ok_all = True
    for name, cfg in (("sliding", DeploymentConfig.sliding(kv_heads=kv_heads, max_seq_len=max_seq_len,
                                                           max_batch=len(lengths), cache_dtype=dtype)),
                      ("full", DeploymentConfig.full(kv_heads=kv_heads, max_seq_len=max_seq_len,
                                                     max_batch=len(lengths), cache_dtype=dtype))):
        torch.manual_seed(seed)
        layer = MuseAttentionDecode(cfg, device=dev, backend=backend, **scales)
        report = layer.prepare()
        built = ", ".join(f"{how} {sum(1 for v in report['variants'] if v['how'] == how)}"
                          for how in ("compiled", "loaded", "memory")
                          if any(v["how"] == how for v in report["variants"]))
        print(f"[{name} layer] backends: {report['backends']}" + (f"; kernel variants: {built}" if built else ""))
        cache = allocate_kv_cache(num_pages, kv_heads, device=dev, dtype=dtype)
        # history: N(0,1) keys and values (stored as e4m3 of value / scale in an FP8 cache)
        history = torch.randn(cache.shape, device=dev)
        if fp8:
            history[..., :64] /= k_scale
            history[..., 64:] /= v_scale
        cache.copy_(history.to(dtype))
        lens = list(lengths)
        batch = PagedBatch.build([n + steps * q_len for n in lens], num_pages, q_len, generator=gen, device=dev)
        for step in range(steps):
            cur = torch.tensor([n + (step + 1) * q_len for n in lens], dtype=torch.int32, device=dev)
            b = PagedBatch(seq_lens=cur, page_table=batch.page_table, positions=block_positions(cur, q_len),
                           slots=block_slots(batch.page_table, cur, q_len))
            x = torch.randn(len(lens) * q_len, HIDDEN, generator=gen).to(dev, torch.bfloat16)
            if step == steps - 1:
                y64 = qkv_front_f64(x, layer.qkv_weight.detach(), b.positions, layer.cos_sin, kv_heads)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = layer(x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            note = "  (first call: includes one-time imports and setup)" if step == 0 else ""
            print(f"  step {step}: {ms:8.2f} ms  qkv_front={backends.last_backend('qkv_front')} "
                  f"attn2={backends.last_backend('attn2')}{note}")
        ref = attn2_f64(y64.to(torch.bfloat16).to(dev), cache, b.page_table, b.seq_lens,
                        q_len=q_len, window=cfg.window, scale=cfg.scale, k_scale=layer.k_scale,
                        v_scale=layer.v_scale)
        rep = tolerance_report(out, ref)
        ok, max_err, mean_err = rep["ok"], rep["max_abs"], rep["mean_abs"]
        ok_all &= ok
        print(f"  last step vs float64: max |err| {max_err:.2e}, mean |err| {mean_err:.2e} -> "
              f"{'OK' if ok else 'FAIL'}")
        if dev.type == "cuda":
            print("  " + step_time(layer, x, b, cache))
    print("demo: " + ("all checks passed" if ok_all else "CHECK FAILED"))
    if dev.type == "cuda":
        print("(the stock serving path beside it: python -m muse_ops bench --cases layer, in a source checkout)")
    return ok_all


def step_time(layer: MuseAttentionDecode, x, batch: PagedBatch, cache, replays: int = 50) -> str:
    """One line: the layer's step on these inputs by CUDA-graph replay (warm caches), us."""
    args = (x, batch.positions, batch.slots, cache.clone(), batch.page_table, batch.seq_lens)
    stream = torch.cuda.Stream()
    with torch.inference_mode():
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(*args)                                  # compiled and warm before the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(*args)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return f"step time: {start.elapsed_time(end) * 1e3 / replays:.1f} us (CUDA-graph replay, warm L2)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m muse_ops demo", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--backend", choices=backends.BACKENDS, default=None)
    p.add_argument("--cache-dtype", choices=sorted(CACHE_DTYPES), default="bf16")
    p.add_argument("--k-scale", type=float, default=1.0, help="FP8 cache: the keys' dequantization scale")
    p.add_argument("--v-scale", type=float, default=1.0, help="FP8 cache: the values' dequantization scale")
    a = p.parse_args(argv)
    return 0 if run_demo(a.device, a.steps, backend=a.backend, cache_dtype=a.cache_dtype, k_scale=a.k_scale,
                         v_scale=a.v_scale) else 1
