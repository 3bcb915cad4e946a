"""Device run: muse:cutedsl reads ~10% higher at B=128 W=2048 in the bench's first timing right
after the float64 reference check than in later timings. Is it a transient after the reference
(how long does it last; does a pause remove it)? Per-replay times of the bench's own contender
(op path, bench inputs, one CUDA graph of the bench's calls) after the reference, with and without
a pause; nvidia-smi samples clocks and clock-event reasons every 20 ms into $OUT/smi.csv.
usage: python3 tools/attn2_dev/bench_state.py"""
import os, statistics, subprocess, time
import torch
from bench import cases as C, contenders as K, timing as T
from muse_ops.reference import attn2_ref

dev = torch.device("cuda")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,"
                        "clocks_event_reasons.active", "--format=csv,noheader", "-lms", "20"],
                       stdout=open(os.path.join(os.environ.get("OUT", "/tmp"), "smi.csv"), "w"),
                       stderr=subprocess.STDOUT)
time.sleep(1.0)
case = C.attn2_case((128, 16384, 2048))
inp = C.build_attn2(case, dev, T.l2_bytes(dev))
fn = K.build_attn2_contender("muse:cutedsl", inp, dev)
fn(0)
graph, calls = T.capture_calls(fn, inp.sets)
t0 = time.perf_counter()


def series(tag, n=120):
    ts = T.replay_times_us(graph, calls, n)
    chunks = [statistics.median(ts[i:i + 10]) for i in range(0, n, 10)]
    print(f"[{time.perf_counter() - t0:6.2f}s] {tag:26s} medians of 10 replays: "
          + " ".join(f"{c:.1f}" for c in chunks), flush=True)


def reference():
    ref = attn2_ref(inp.ys[0], inp.kv_cache, inp.page_tables[0], inp.seq_lens, q_len=case.q_len,
                    window=case.window, scale=case.scale)
    float(ref.float().abs().mean())      # the bench's _err syncs like this
    print(f"[{time.perf_counter() - t0:6.2f}s] reference done", flush=True)


series("idle before")
reference()
series("right after the reference")
series("then")
reference()
time.sleep(0.5)
series("after the reference + 0.5 s")
reference()
torch.cuda.empty_cache()
series("after ref + empty_cache")
smi.terminate()
