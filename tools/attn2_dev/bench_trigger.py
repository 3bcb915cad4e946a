"""Device run: the PDL trigger rule on the bench's own contender (op path, bench inputs). Graphs
captured with attn2.wave_ctas forced to each value (0: never trigger; 132: a grid of at most one
wide CTA per SM; the default 2 per SM), timed in turn for AB_ROUNDS rounds, median us.
usage: python3 tools/attn2_dev/bench_trigger.py   (env TRIG_CASES, TRIG_VALUES; TRIG_REF=1: the
float64 reference and an empty_cache before each timing, as the bench's check leaves the GPU)"""
import os, statistics
import torch
from bench import cases as C, contenders as K, timing as T
from muse_ops.cutedsl import attn2 as A
from muse_ops.reference import attn2_ref

dev = torch.device("cuda")
default = A.wave_ctas
values = eval(os.environ.get("TRIG_VALUES", "[0, 132, None]"))       # None: the default rule
for spec in eval(os.environ.get("TRIG_CASES", "[(1, 8192, 0), (8, 2048, 0), (1, 512, 0)]")):
    case = C.attn2_case(spec)
    inp = C.build_attn2(case, dev, T.l2_bytes(dev))
    fn = K.build_attn2_contender("muse:cutedsl", inp, dev)
    graphs = {}
    for v in values:
        A.wave_ctas = default if v is None else (lambda d, v=v: v)
        fn(0)
        graphs[v] = T.capture_calls(fn, inp.sets)
    A.wave_ctas = default
    ts = {v: [] for v in values}
    for _ in range(int(os.environ.get("AB_ROUNDS", "5"))):
        for v, (graph, calls) in graphs.items():
            if os.environ.get("TRIG_REF"):
                ref = attn2_ref(inp.ys[0], inp.kv_cache, inp.page_tables[0], inp.seq_lens, q_len=case.q_len,
                                window=case.window, scale=case.scale)
                float(ref.float().abs().mean())
                ref = None
                torch.cuda.empty_cache()
            ts[v].append(T.time_graph_us(graph, calls, inp.sets)["us"])
    print(f"TRIG {str(spec):18s} sets {inp.sets:3d} | " + " | ".join(
        f"{'rule' if v is None else v} {statistics.median(t):7.2f} ({min(t):.2f}-{max(t):.2f})"
        for v, t in ts.items()), flush=True)
    graphs = inp = fn = None
    torch.cuda.empty_cache()
