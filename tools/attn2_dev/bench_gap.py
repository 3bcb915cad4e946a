"""Device run: why the bench reads higher than tools/attn2_dev. The same kernel launch (no op
dispatch) timed on (1) run_dev's inputs (one y, a pool per set), (2) the bench's inputs (a y per
set, one pool for all sets; bench.cases.build_attn2, bench.timing.graph_time_us), (3) the bench's
inputs with one y for every set. 3 rounds, interleaved, median us.
usage: python3 tools/attn2_dev/bench_gap.py"""
import os, sys, statistics
sys.path.insert(0, os.path.dirname(__file__))
import torch
import run_dev
from bench import cases as C, timing as T
A = run_dev.A
dev = "cuda"
for spec in [(1, 8192, 0), (128, 16384, 2048), (8, 2048, 0)]:
    B, L, W = spec
    rd = run_dev.build_case(B, L, W, msl=L)
    case = C.attn2_case(spec)
    inp = C.build_attn2(case, dev, T.l2_bytes(dev))
    ws = torch.zeros(A.workspace_bytes(B, case.kv_heads, case.q_len, W, L), dtype=torch.uint8, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    out = torch.empty(B * case.q_len, 512 * case.kv_heads, dtype=torch.bfloat16, device=dev)
    kw = dict(q_len=case.q_len, window=W, scale=case.scale, max_seq_len=L)
    def bench_y(i):
        A.launch_attn2(inp.ys[i], inp.kv_cache, inp.page_tables[i], inp.seq_lens, out, ws, err, **kw)
    def bench_fixed_y(i):
        A.launch_attn2(inp.ys[0], inp.kv_cache, inp.page_tables[i], inp.seq_lens, out, ws, err, **kw)
    ts = {"run_dev": [], "bench inputs": [], "bench, one y": []}
    for _ in range(3):
        ts["run_dev"].append(run_dev.graph_us(rd))
        ts["bench inputs"].append(T.graph_time_us(bench_y, inp.sets)["us"])
        ts["bench, one y"].append(T.graph_time_us(bench_fixed_y, inp.sets)["us"])
    assert int(err.item()) == 0 and int(rd.err.item()) == 0
    print(f"GAP {str(spec):18s} sets {inp.sets:3d} | " + " | ".join(
        f"{k} {statistics.median(v):7.2f} ({min(v):.2f}-{max(v):.2f})" for k, v in ts.items()), flush=True)
    rd = inp = None     # free the pools before the next case
    torch.cuda.empty_cache()
