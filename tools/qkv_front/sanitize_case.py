"""A small qkv_front case of each variant family for compute-sanitizer (memcheck, racecheck,
synccheck): M = 3 (8-token tile), 40 (64), 100 (128, one head a CTA), 300 (192, two heads), each
checked against float64; RoPE on, padding slots, Hkv 2 and 1 (3-CTA split-K clusters), and M = 40
at Hkv 8 (2-CTA clusters, 288 CTAs). GPU machine: compute-sanitizer --tool memcheck python3
tools/qkv_front/sanitize_case.py (PART=sanitize tools/device_run.sh runs every tool on both ops' cases)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from test_qkv_front_cutedsl import POSITIONS, check_against_float64, make_inputs, run  # noqa: E402

from muse_ops.cutedsl import qkv_front as Q  # noqa: E402
from muse_ops.reference import rope_cos_sin  # noqa: E402

cs = rope_cos_sin(POSITIONS, device="cuda")
for m, kv_heads in ((3, 2), (40, 2), (100, 1), (300, 2), (40, 8)):
    x, w, pos, slots, cache = make_inputs(m, kv_heads, seed=m, pad=m // 4)
    before = cache.clone()
    y, err = run(Q, x, w, pos, slots, cs, cache)
    torch.cuda.synchronize()
    check_against_float64(x, w, pos, slots, cs, before, cache, y, kv_heads)
    print(f"M={m} Hkv={kv_heads} ok, flag {int(err.item())}", flush=True)
print("sanitize_case done")
