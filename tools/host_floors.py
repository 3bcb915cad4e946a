"""Interleaved host-time rounds of the two public ops (torch.ops.muse.* and muse_ops.*), of the layer's
eager step (one C++ call) against its two ops called one by one, and of the C++ no-op ops with their argument
lists (the dispatcher's floor for each schema), so a slow phase of the machine hits every path
alike: python tools/host_floors.py (B=1 L=512; needs the C++ ops, the checkout on PYTHONPATH). Median of the rounds' medians, us.
The no-op ops are the development library's (csrc_shims/muse_shims_dev.cpp): shims.load_dev builds
and loads it."""
import statistics

import torch

import muse_ops
from bench.host import host_us, prepared_layer, public_calls
from muse_ops.cutedsl import shims


def main() -> None:
    shims.load_dev()   # the _shims_null* floors
    with torch.inference_mode():
        calls = public_calls()
        b, cache, x, w, ws, y, kw = calls["inputs"]
        paths = {
            "torch.ops.muse.qkv_front": calls["qkv_front"],
            "muse_ops.qkv_front": lambda: muse_ops.qkv_front(x, w, b.positions, b.slots, None, cache),
            "qkv_front's floor (_shims_null)": lambda: torch.ops.muse._shims_null(x, w, b.positions, b.slots, None,
                                                                                  cache),
            "torch.ops.muse.attn2": calls["attn2"],
            "muse_ops.attn2": lambda: muse_ops.attn2(y, cache, b.page_table, b.seq_lens, workspace=ws, **kw),
            "attn2's floor (_shims_null_attn2)": lambda: torch.ops.muse._shims_null_attn2(
                y, cache, b.page_table, b.seq_lens, ws, **kw),
            "attn2's floor, workspace not (a!)": lambda: torch.ops.muse._shims_null_attn2_const(
                y, cache, b.page_table, b.seq_lens, ws, **kw),
        }
        layer = prepared_layer(w)
        step = (x, b.positions, b.slots, cache, b.page_table, b.seq_lens)
        layer(*step)
        paths["layer eager (one C++ call)"] = lambda: layer(*step)
        paths["the layer's two ops (muse_ops.*, no step check)"] = lambda: muse_ops.attn2(
            muse_ops.qkv_front(x, w, b.positions, b.slots, None, cache), cache, b.page_table, b.seq_lens,
            workspace=layer.workspace, **kw)
        times = {k: [] for k in paths}
        for _ in range(7):
            for k, fn in paths.items():
                times[k].append(host_us(fn))
    for k, t in times.items():
        print(f"{k:50s} {statistics.median(t):6.2f} us  ({' '.join(f'{v:.1f}' for v in t)})", flush=True)


if __name__ == "__main__":
    main()
