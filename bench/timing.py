"""How the bench times things, and the floors.

GPU: a callable fn(i) runs the op on input set i; one CUDA graph holds fn(0), fn(1), ...,
fn(n-1) over n rotating input sets (each set's KV pages / weights distinct, together several
times L2, so every call reads from HBM), cycled to at least MIN_CALLS calls, and the per-call time
is (graph replay time) / calls, the median over >= 20 replays timed with CUDA events, after at
least WARMUP_S of untimed replays. Launch cost is amortised into graph nodes, as a serving engine
runs a decode step: a graph of one call would add the whole graph-launch gap (2.5-8 us measured
on the H200) to a case whose one set already spans >= 4x L2.
Why the warm-up lasts WARMUP_S and not a few replays: for a few ms after the driver frees a large
allocation, kernels reading a large page pool run slower, and just before the first timed replay
the capture (torch.cuda.graph empties the allocator's cache) frees whatever the float64 check left
there. Measured on the H200 (bench/RESULTS-archive.md, sixth run; muse:cutedsl at B=128 L=16384
W=2048, medians of 10 replays): 46.9 46.6 46.5 then 43.0 43.1 ... after an empty_cache that
freed the reference's temporaries; 42.8 with nothing freed. With 3 warm-up replays the bench read
47.5 for the contender timed right after the check and 43 elsewhere.
CPU: wall clock, median of a few calls (only to exercise the code in CI).
"""
from __future__ import annotations

import statistics
import time

import torch

REPLAYS = 25
WARMUP = 3
WARMUP_S = 0.03         # and at least this long (see above)
MIN_CALLS = 8


def cpu_time_us(fn, n_sets: int, reps: int = 3) -> float:
    fn(0)
    ts = []
    for r in range(reps):
        t0 = time.perf_counter()
        fn(r % n_sets)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def capture_calls(fn, n_sets: int, min_calls: int = MIN_CALLS) -> tuple[torch.cuda.CUDAGraph, int]:
    """Warm fn up outside capture (compiles, allocator, autotune), then capture one CUDA graph of
    max(n_sets, min_calls) calls cycling the sets; returns (graph, calls)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(min(n_sets, 2)):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    calls = max(n_sets, min_calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % n_sets)
    return graph, calls


def replay_times_us(graph: torch.cuda.CUDAGraph, calls: int, replays: int) -> list[float]:
    """Per-call us of each of `replays` replays of graph (calls calls each), CUDA events."""
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / calls)
    return ts


def graph_time_us(fn, n_sets: int, replays: int = REPLAYS, min_calls: int = MIN_CALLS) -> dict:
    """Per-call us of fn over n_sets rotating sets by CUDA-graph replay (median, p20, p80)."""
    graph, calls = capture_calls(fn, n_sets, min_calls)
    res = time_graph_us(graph, calls, n_sets, replays)
    del graph
    return res


def time_graph_us(graph: torch.cuda.CUDAGraph, calls: int, n_sets: int, replays: int = REPLAYS) -> dict:
    """Per-call us of a captured graph of `calls` calls (median, p20, p80), after the warm-up."""
    t_end = time.perf_counter() + WARMUP_S
    done = 0
    while done < WARMUP or time.perf_counter() < t_end:
        graph.replay()
        torch.cuda.synchronize()
        done += 1
    ts = replay_times_us(graph, calls, replays)
    q = statistics.quantiles(ts, n=10)
    return {"us": statistics.median(ts), "p20": q[1], "p80": q[7], "replays": replays, "sets": n_sets,
            "calls": calls}


def _rotated_rounds(graphs: list, n_sets: int, rounds: int, replays: int, reference=None) -> tuple[list, list]:
    """Every per-call us of each captured graph ((graph, calls) pairs) over `rounds` rounds, round r
    timing the graphs in the order rotated by r, after the reference graph where one is given;
    returns (per-graph lists, the reference's list)."""
    per, ref = [[] for _ in graphs], []
    for r in range(rounds):
        if reference is not None:
            ref.append(time_graph_us(*reference, n_sets, replays=replays)["us"])
        for i in range(len(graphs)):
            k = (r + i) % len(graphs)
            per[k].append(time_graph_us(*graphs[k], n_sets, replays=replays)["us"])
    return per, ref


def round_robin_us(graphs: list, reference, n_sets: int, rounds: int = 3, replays: int = 15) -> tuple[list, list]:
    """Interleaved A/B timing of captured graphs ((graph, calls) pairs) beside a reference one
    (cuBLAS, say): every per-call us of each, `rounds` rounds. The reference opens each round and
    the graphs follow from the round's index on, so each follows the reference in one round of
    every len(graphs): a graph timed right after cuBLAS's read up to 20% high (bench/RESULTS.md,
    thirty-seventh session), and a median over the rounds drops that one."""
    return _rotated_rounds(graphs, n_sets, rounds, replays, reference)


def interleaved_us(graphs: list, n_sets: int, rounds: int = 0, replays: int = REPLAYS) -> list[dict]:
    """Per-call us of captured graphs ((graph, calls) pairs) timed side by side, as the bench times
    a case's contenders: `rounds` rounds (0: max(3, len(graphs))), each timing every graph once
    (time_graph_us, its warm-up included), round r in the order rotated by r, so each graph opens
    one round of every len(graphs) (the slot that reads fast) and otherwise follows its neighbour
    in the list. One after another, a slot's reading depends on what ran before it: the first
    graph timed after a case's float64 check read up to 10% low against the same graph timed last
    (bench/RESULTS.md, thirty-eighth session), and a graph right after cuBLAS's up to 20% high
    (thirty-seventh). Per graph: the median of its rounds' medians ("us"), the lowest and highest
    of them ("p20" / "p80")."""
    per, _ = _rotated_rounds(graphs, n_sets, rounds or max(3, len(graphs)), replays)
    return [{"us": statistics.median(p), "p20": min(p), "p80": max(p), "rounds": p, "replays": replays,
             "sets": n_sets, "calls": g[1]} for p, g in zip(per, graphs)]


def eager_time_us(fn, n_sets: int, calls: int = 50) -> float:
    """Per-call time of back-to-back eager calls (host path included: when the host is slower
    than the kernel, this is the host's time per call)."""
    for i in range(n_sets):   # every set once first: a set's first call may do one-time work
        fn(i)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for c in range(calls):
        fn(c % n_sets)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def _median_seconds(fn, runs: int = 12, skipped: int = 2) -> float:
    """Seconds of one eager fn() by CUDA events, the median of the runs after the first `skipped`."""
    ts = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts[skipped:])


def measure_hbm_tbps(device, nbytes: int = 2 << 30) -> float:
    """Copy bandwidth (bytes read + written) of one large device copy, median of 10."""
    n = nbytes // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src))
    return 2 * nbytes / seconds / 1e12


def measure_tensor_tflops(device, n: int = 8192) -> float:
    """Dense bf16 tensor-core rate (TFLOPS) of one large cuBLAS matmul (n x n by n x n, fp32
    accumulation), median of 10: what a kernel's FLOPs are held against. It is below the
    datasheet's peak (989 TFLOPS dense on an H100 / H200 SXM at its boost clock): what this GPU
    sustains under its power limit is the honest ceiling."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    c = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    seconds = _median_seconds(lambda: torch.matmul(a, b, out=c))
    return 2.0 * n ** 3 / seconds / 1e12


def measure_graph_node_us(device, nodes: int = 200) -> float:
    """One CUDA-graph node running a tiny kernel (a 1-element add)."""
    x = torch.zeros(1, device=device)
    return graph_time_us(lambda i: x.add_(1), nodes)["us"]


def l2_bytes(device) -> int:
    try:
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    except Exception:
        return 60 << 20
