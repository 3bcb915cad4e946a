"""`python -m muse_ops demo`: a few speculative-verify steps of a TP8-sized layer (Hkv 2).

Random weights, a paged cache holding requests of different lengths, sliding and full layers;
each step runs MuseAttentionDecode (qkv_front then attn2), prints its time and backend, and the
last step of each layer is checked against the float64 evaluation of muse_ops.testing. On a GPU,
the layer's step is then timed by CUDA-graph replay (cold weights and KV) beside the stock path's
(cuBLAS, the Triton q/k-norm + RoPE + insert, FlashInfer, the Triton norm-gate) and the
reference's, with the bench's code (bench/layer.py: part of the source checkout, not installed).
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


def run_demo(device: str = "auto", steps: int = 3, lengths=(40, 333, 1500, 2600), seed: int = 0,
             backend: str | None = None, bench_root=None) -> bool:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    q_len, kv_heads, max_seq_len = 8, 2, 4096
    num_pages = 2048
    print(f"muse_ops demo on {dev}: Hkv={kv_heads}, q_len={q_len}, requests of lengths {list(lengths)} "
          f"(+{q_len} per step)")
    ok_all = True
    for name, cfg in (("sliding", DeploymentConfig.sliding(kv_heads=kv_heads, max_seq_len=max_seq_len,
                                                           max_batch=len(lengths))),
                      ("full", DeploymentConfig.full(kv_heads=kv_heads, max_seq_len=max_seq_len,
                                                     max_batch=len(lengths)))):
        torch.manual_seed(seed)
        layer = MuseAttentionDecode(cfg, device=dev, backend=backend)
        report = layer.prepare()
        built = ", ".join(f"{how} {sum(1 for v in report['variants'] if v['how'] == how)}"
                          for how in ("compiled", "loaded", "memory")
                          if any(v["how"] == how for v in report["variants"]))
        print(f"[{name} layer] backends: {report['backends']}" + (f"; kernel variants: {built}" if built else ""))
        cache = allocate_kv_cache(num_pages, kv_heads, device=dev)
        cache.normal_(generator=None)  # history: N(0,1) keys and values
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
                        q_len=q_len, window=cfg.window, scale=cfg.scale)
        rep = tolerance_report(out, ref)
        ok, max_err, mean_err = rep["ok"], rep["max_abs"], rep["mean_abs"]
        ok_all &= ok
        print(f"  last step vs float64: max |err| {max_err:.2e}, mean |err| {mean_err:.2e} -> "
              f"{'OK' if ok else 'FAIL'}")
        if dev.type == "cuda":
            print("  " + compare_step_times(dev, cfg, [n + steps * q_len for n in lens], bench_root))
    print("demo: " + ("all checks passed" if ok_all else "CHECK FAILED"))
    return ok_all


def compare_step_times(dev, cfg: DeploymentConfig, lengths, root) -> str:
    """One line: this layer's step (requests of these lengths) by CUDA-graph replay, us, for
    muse's default backend, the stock path and the reference; a path that cannot run says why.
    root: the source checkout holding bench/ (None: installed without it)."""
    if root is None:
        return "step time vs the stock path: needs the source checkout's bench/ (not installed)"
    import sys
    sys.path.insert(0, str(root))
    from bench import cases, layer, timing
    from bench.contenders import Absent
    case = layer.LayerCase(cases.Attn2Case("demo", list(lengths), cfg.window, cfg.max_seq_len,
                                           kv_heads=cfg.kv_heads, q_len=cfg.q_len, scale=cfg.scale))
    inp = layer.build_layer(case, dev, timing.l2_bytes(dev))
    cells = []
    for name, label in (("muse:" + backends.last_backend("attn2"), "muse"), ("stock", "stock"),
                        ("muse:reference", "reference")):
        try:
            us = timing.graph_time_us(layer.build_layer_contender(name, inp, dev), inp.sets)["us"]
            cells.append(f"{label} {us:.1f}")
        except Absent as exc:
            cells.append(f"{label}: {exc}")
    return "step time (CUDA graph, cold weights and KV, us): " + " | ".join(cells)


def main(argv=None, bench_root=None) -> int:
    p = argparse.ArgumentParser(prog="python -m muse_ops demo", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--backend", choices=backends.BACKENDS, default=None)
    a = p.parse_args(argv)
    return 0 if run_demo(a.device, a.steps, backend=a.backend, bench_root=bench_root) else 1
