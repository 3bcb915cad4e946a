"""Where a qkv_front call spends its time: %globaltimer stamps per CTA, for back-to-back calls in
one CUDA graph (development only; GPU machine: python3 tools/qkv_front/timeline.py).

The package's kernel compiles the stamps in when its config carries an address
(QkvFrontConfig.stamps; qkv_front_plan.STAMP_PHASES says where each phase is stamped and by whom;
the production variants' PTX is the same with or without this hook). Two stamped variants, each
with its own buffer, alternate in one graph over rotating weight sets, so after a replay the two
buffers hold the last two calls. The global timer's tick is coarse (about 32 ns to a microsecond,
by GPU). Env: TL_M (M values), TL_HKV, TL_CALLS (graph calls, even), TL_OUT (where timeline.txt
and each M's raw stamps go; default $OUT/qkv_timeline), TL_OVER (a launch-config override in
Python syntax for both stamped variants, e.g. "{'mma_lag': 1}": the timeline of a variant; the
plain graph it is compared with stays the default).
"""
import ast
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench import cases as C, timing as T  # noqa: E402
from muse_ops.cutedsl.dev import launch_qkv_front  # noqa: E402
from muse_ops.cutedsl.qkv_front_plan import (STAMP_PHASES, STAMP_SLOTS, STAMP_SM_SLOT, heads, k_split,  # noqa: E402
                                             launch_config)
from muse_ops.errors import error_flag  # noqa: E402

MAX_CTAS = 4096


def summary(stamps: torch.Tensor, ctas: int, t0: int) -> list[str]:
    rows = []
    for k, name in enumerate(STAMP_PHASES):
        v = [(int(s) - t0) / 1e3 for s in stamps[:ctas, k].tolist() if s != 0]
        if not v:
            rows.append(f"  {name:9s} (none)")
            continue
        q = statistics.quantiles(v, n=10) if len(v) > 1 else [v[0]] * 9
        rows.append(f"  {name:9s} min {min(v):7.2f}  p10 {q[0]:7.2f}  med {statistics.median(v):7.2f}  "
                    f"p90 {q[8]:7.2f}  max {max(v):7.2f} us  ({len(v)} CTAs)")
    return rows


def main():
    out_dir = os.environ.get("TL_OUT") or os.path.join(os.environ.get("OUT", "."), "qkv_timeline")
    os.makedirs(out_dir, exist_ok=True)
    ms = [int(v) for v in os.environ.get("TL_M", "1,8,16").split(",")]
    kv_heads = int(os.environ.get("TL_HKV", "2"))
    calls = int(os.environ.get("TL_CALLS", "8"))
    dev = torch.device("cuda")
    err = error_flag(dev)
    buf = torch.zeros(2, MAX_CTAS * STAMP_SLOTS, dtype=torch.int64, device=dev)
    over = ast.literal_eval(os.environ.get("TL_OVER", "{}"))
    stamped = [dict(over, stamps=buf[c].data_ptr()) for c in range(2)]   # launch-config overrides
    lines = []
    for m in ms:
        case = C.QkvCase(m, kv_heads=kv_heads)
        inp = C.build_qkv(case, dev, T.l2_bytes(dev))
        n = inp.weights[0].shape[0]
        ys = [torch.empty(m, n, dtype=torch.bfloat16, device=dev) for _ in range(inp.sets)]

        def run(i, over=None):
            launch_qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], inp.cos_sin,
                             inp.kv_cache, ys[i], err, override=over)
            return ys[i]
        ref = run(0).clone()
        for c in range(2):
            same = torch.equal(run(0, stamped[c]).view(torch.int16), ref.view(torch.int16))
            lines.append(f"M={m} stamped variant {c} {over or ''}: same bits as the plain kernel: {same}")
        cfg = launch_config(m, kv_heads, True, inp.positions[0].dtype, inp.slots[0].dtype,
                            dict(over) or None)   # the stamped variants' tile
        ctas = k_split(kv_heads) * -(-m // cfg.token_tile) * (heads(kv_heads) // cfg.heads_per_cta)
        graph, n_calls = T.capture_calls(lambda i: run(i % inp.sets, stamped[i % 2]), max(calls, 2 * inp.sets))
        plain, plain_calls = T.capture_calls(lambda i: run(i % inp.sets), max(calls, 2 * inp.sets))
        t_stamped = T.time_graph_us(graph, n_calls, inp.sets, replays=15)["us"]
        t_plain = T.time_graph_us(plain, plain_calls, inp.sets, replays=15)["us"]
        buf.zero_()
        graph.replay()
        torch.cuda.synchronize()
        st = buf.view(2, MAX_CTAS, STAMP_SLOTS).cpu()
        last = (n_calls - 1) % 2
        prev = 1 - last
        t0 = int(st[prev, :ctas, 0][st[prev, :ctas, 0] > 0].min())
        lines.append(f"M={m} Hkv={kv_heads} tile {cfg.token_tile}x{cfg.heads_per_cta} {ctas} CTAs: per call "
                     f"{t_stamped:.2f} us stamped, {t_plain:.2f} plain; us from the previous call's first entry")
        lines.append(" previous call:")
        lines += summary(st[prev], ctas, t0)
        lines.append(" last call:")
        lines += summary(st[last], ctas, t0)
        sms = sorted(set(st[last, :ctas, STAMP_SM_SLOT].tolist()))
        lines.append(f" last call on {len(sms)} SMs; its CTAs entered from the previous call's last 'done' "
                     f"+ {(int(st[last, :ctas, 0].min()) - int(st[prev, :ctas, 7].max())) / 1e3:.2f} us")
        torch.save({"m": m, "ctas": ctas, "stamps": st[:, :ctas].clone()}, os.path.join(out_dir, f"stamps_m{m}.pt"))
        print("\n".join(lines[-(2 * len(STAMP_PHASES) + 5):]), flush=True)
        del graph, plain, inp, ys
        torch.cuda.empty_cache()
    lines.append(f"error flag {int(err.item())}")
    with open(os.path.join(out_dir, "timeline.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])


if __name__ == "__main__":
    main()
