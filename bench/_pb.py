"""Shared pytest-benchmark glue: one contender on one case, timed by CUDA-graph replay over the
case's rotating input sets. pytest-benchmark's own numbers are per round = one replay of the
graph of `calls` calls (extra_info["calls"]: the sets cycled to at least timing.MIN_CALLS); the
per-call CUDA-event median (the number to read), p20/p80, GB/s, floor and ratio to it go into
benchmark.extra_info (--benchmark-json keeps them)."""
from __future__ import annotations

import functools
import re

import pytest
import torch

from . import contenders as K
from . import timing as T


@functools.lru_cache(maxsize=1)
def floors():
    dev = torch.device("cuda")
    return {"hbm_tbps": T.measure_hbm_tbps(dev), "node_us": T.measure_graph_node_us(dev)}


def ident(name: str) -> str:
    """A -k friendly test id: 'B=1 L=8192 W=2048' -> 'B1_L8192_W2048', 'fa4+normgate' -> 'fa4_normgate'."""
    out = re.sub(r"[^A-Za-z0-9]+", "_", name.replace("=", "")).strip("_")
    return out


def run(benchmark, kind, case, build, name):
    dev = torch.device("cuda")
    inp = build(case, dev, T.l2_bytes(dev))
    try:
        fn = (K.build_attn2_contender if kind == "attn2" else K.build_qkv_contender)(name, inp, dev)
    except K.Absent as exc:
        pytest.skip(f"{name}: absent ({exc})")
    graph, calls = T.capture_calls(fn, inp.sets)
    res = T.time_graph_us(graph, calls, inp.sets)
    # pytest-benchmark's own rounds: replays of the same graph as the timing

    def replay():
        graph.replay()
        torch.cuda.synchronize()
    benchmark.pedantic(replay, rounds=20, warmup_rounds=2)
    fl = floors()
    floor_us = max(case.bytes() / (fl["hbm_tbps"] * 1e12) * 1e6, fl["node_us"])
    benchmark.extra_info.update(
        case=case.name, contender=name, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
        cuda_event_median_us=res["us"], p20_us=res["p20"], p80_us=res["p80"], sets=inp.sets,
        note=inp.note, bytes=case.bytes(), gbps=case.bytes() / res["us"] / 1e3, floor_us=floor_us,
        over_floor=res["us"] / floor_us, hbm_tbps=fl["hbm_tbps"], graph_node_us=fl["node_us"],
        calls=calls, per_round="one replay of a graph of `calls` calls (the sets cycled)")
