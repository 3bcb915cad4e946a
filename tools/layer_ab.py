"""GPU machine: one layer step (qkv_front then attn2, launched directly on the bench's rotating
inputs, bench/layer.py) under launch-config variants of either kernel, interleaved round after
round in one process; each kernel alone too. Prints one line per case, us per step (medians).

usage: [LAYER_CASES="[(1, 8192, 0), ...]"] [LAYER_VARIANTS="{...}"] [LAYER_ROUNDS=5]
       python3 tools/layer_ab.py
A case is a bench spec (B, L, W[, q_len[, Hkv]]) or (B, L, W, q_len, Hkv, max_seq_len). A variant
is (qkv_front override, attn2 override[, path of an attn2 kernel copy]); an override is a
launch-config dict, None (the host's pick) or "skip" (leave that kernel out).
The defaults are the twenty-first run's check of attn2's occupancy caps (bench/RESULTS.md)."""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench import cases as C, layer as LY, timing as T  # noqa: E402
from muse_ops import attn2_workspace  # noqa: E402
from muse_ops.config import proj_cols  # noqa: E402
from muse_ops.cutedsl.dev import kernel_copy, launch_attn2, launch_qkv_front  # noqa: E402
from muse_ops.errors import error_flag  # noqa: E402
from muse_ops.reference import rope_cos_sin  # noqa: E402

CASES = eval(os.environ.get("LAYER_CASES", "[(1, 8192, 0), (2, 8192, 0), (1, 16384, 0), (1, 8192, 2048), "
                                           "(2, 8192, 2048), (1, 8192, 0, 1, 2), (16, 8192, 0, 1, 2), "
                                           "(8, 8192, 0), (1, 8192, 0, 8, 1), (1, 8192, 0, 8, 4)]"))
NO_CAP = {"ctas_per_sm": 0}
VARIANTS = eval(os.environ.get("LAYER_VARIANTS", "None")) or {
    "host's pick": (None, None),
    "no cap": (None, NO_CAP),
    "no cap, no trigger": ({"trigger": False}, NO_CAP),
    "qkv_front alone": (None, "skip"),
    "attn2 alone": ("skip", None),
    "attn2 alone, no cap": ("skip", NO_CAP),
}
ROUNDS = int(os.environ.get("LAYER_ROUNDS", "5"))


def layer_case(spec):
    if len(spec) < 6:
        return LY.layer_case(spec)
    b, L, w, q_len, kv_heads, max_seq_len = spec
    return LY.LayerCase(C.Attn2Case(f"B={b} L={L} W={w} q_len={q_len} Hkv={kv_heads} max_seq_len={max_seq_len}",
                                    [L] * b, w, max_seq_len, kv_heads=kv_heads, q_len=q_len))


class LayerRig:
    """A case's rotating layer inputs (bench/layer.py), with a y and an out per set, and the launch
    of one step under a variant."""

    def __init__(self, spec, device, sets: int | None = None):
        self.case = layer_case(spec)
        a = self.attn = self.case.attn
        self.inp = LY.build_layer(self.case, device, T.l2_bytes(device), sets=sets)
        self.ws = attn2_workspace(device, a.batch, a.kv_heads, a.q_len, a.window, a.max_seq_len)
        self.cos_sin = rope_cos_sin(a.max_seq_len, device=device) if self.case.config.rope else None
        self.err = error_flag(device)
        rows = a.batch * a.q_len
        self.ys = [torch.empty((rows, proj_cols(a.kv_heads)), dtype=torch.bfloat16, device=device)
                   for _ in range(self.inp.sets)]
        self.outs = [torch.empty((rows, a.kv_heads * 512), dtype=torch.bfloat16, device=device)
                     for _ in range(self.inp.sets)]

    def step(self, front_over, attn_over, attn_copy=None):
        """fn(i): set i's qkv_front (into ys[i]) then attn2 (into outs[i]); an override "skip"
        leaves that kernel out."""
        kernel = kernel_copy(attn_copy) if attn_copy else None
        inp, a = self.inp, self.attn

        def fn(i):
            if front_over != "skip":
                launch_qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], self.cos_sin,
                                 inp.kv.kv_cache, self.ys[i], self.err, override=front_over)
            if attn_over != "skip":
                launch_attn2(self.ys[i], inp.kv.kv_cache, inp.kv.page_tables[i], inp.kv.seq_lens, self.outs[i],
                             self.ws, self.err, q_len=a.q_len, window=a.window, scale=a.scale,
                             max_seq_len=a.max_seq_len, override=attn_over, kernel=kernel)
        return fn


def run_case(spec, device) -> str:
    """One case's line: every variant's median us per step."""
    rig = LayerRig(spec, device)
    case, inp, err = rig.case, rig.inp, rig.err
    fns = {label: rig.step(*variant) for label, variant in VARIANTS.items()}
    for fn in fns.values():
        fn(0)
    torch.cuda.synchronize()
    times = {label: [] for label in fns}
    for _ in range(ROUNDS):
        for label, fn in fns.items():
            times[label].append(T.graph_time_us(fn, inp.sets)["us"])
    return (f"LAYER {case.name:24s} sets {inp.sets} | " + " | ".join(
        f"{label} {statistics.median(ts):6.2f}" for label, ts in times.items()) + f" | error flag {int(err.item())}")


def main():
    device = torch.device("cuda")
    for spec in CASES:
        print(run_case(spec, device), flush=True)
        torch.cuda.empty_cache()   # the case's inputs are gone with its frame


if __name__ == "__main__":
    main()
