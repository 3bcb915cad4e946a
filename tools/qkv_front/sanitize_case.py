"""A small qkv_front case of each variant family for compute-sanitizer (memcheck, racecheck,
synccheck): M = 3 (8-token tile), 40 (64), 100 (128, one head a CTA), 300 (192, two heads), each
checked against float64; RoPE on, padding slots, Hkv 2 and 1 (3-CTA split-K clusters), and M = 40
at Hkv 8 (2-CTA clusters, 288 CTAs); then the development knob x_multicast (clusters of 6 CTAs at
Hkv 2, of 6 with a helper CTA at Hkv 1, of 2 at Hkv 4), whole-K tiles (three heads at Hkv 2 and
4, two-head at Hkv 1 and 8), whole-K weight multicast (128 x 2 at Hkv 2, three token tiles and a
helper CTA; 112 x 3 with x multicast too at Hkv 1, clusters of 2 x 2), register reallocation
(224 x 2 at Hkv 2, a whole and a partial tile; 192 x 2 at Hkv 3, K split 2), the plan's x
multicast tile (128 x 2 at Hkv 8 M=250, clusters of 2 ranks x 2 head groups); the development knob
landing_barriers (the 8-token tile and 256 x 2, a whole and a partial tile, at Hkv 2, the x
multicast tile at Hkv 8, a split of 1 at Hkv 4); last an FP8 cache (M = 40 and 300, per-head
scales). GPU machine:
    compute-sanitizer --tool memcheck python3 tools/qkv_front/sanitize_case.py
(PART=sanitize tools/device_run.sh runs every tool on both ops' cases). SANITIZE_FROM=k starts at
the k-th case (racecheck is slow: the rest of a run that timed out)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from test_qkv_front_cutedsl import (POSITIONS, _fp8_scales, check_against_float64, make_inputs, run,  # noqa: E402
                                    run_fp8)

from muse_ops.config import PAGE_SIZE  # noqa: E402
from muse_ops.cutedsl import qkv_front as Q  # noqa: E402
from muse_ops.reference import rope_cos_sin  # noqa: E402
from muse_ops.testing import assert_close, fp8_rows, inserted_rows_f64, qkv_front_f64  # noqa: E402

cs = rope_cos_sin(POSITIONS, device="cuda")
first = int(os.environ.get("SANITIZE_FROM", "0"))
BF16_CASES = ((3, 2, None), (40, 2, None), (100, 1, None), (300, 2, None), (40, 8, None),
              (300, 2, {"x_multicast": True}), (300, 1, {"x_multicast": True}), (200, 4, {"x_multicast": True}),
              (300, 2, {"whole_k": True, "tile": (96, 3)}), (200, 1, {"whole_k": True, "tile": (160, 2)}),
              (100, 8, {"whole_k": True, "tile": (64, 2)}), (300, 4, {"whole_k": True, "tile": (112, 3)}),
              (300, 2, {"whole_k": True, "tile": (128, 2), "w_multicast": True}),
              (300, 1, {"whole_k": True, "tile": (112, 3), "w_multicast": True, "x_multicast": True}),
              (500, 2, {"whole_k": True, "tile": (224, 2)}), (400, 3, {"whole_k": True, "tile": (192, 2)}),
              (250, 8, None),
              (3, 2, {"landing_barriers": True}), (300, 2, {"tile": (256, 2), "landing_barriers": True}),
              (250, 8, {"landing_barriers": True}), (100, 4, {"landing_barriers": True}))
for i, (m, kv_heads, over) in enumerate(BF16_CASES):
    if i < first:
        continue
    x, w, pos, slots, cache = make_inputs(m, kv_heads, seed=m, pad=m // 4)
    before = cache.clone()
    y, err = run(Q, x, w, pos, slots, cs, cache, override=over)
    torch.cuda.synchronize()
    check_against_float64(x, w, pos, slots, cs, before, cache, y, kv_heads)
    print(f"M={m} Hkv={kv_heads} {over or ''} ok, flag {int(err.item())}", flush=True)
for i, (m, kv_heads) in enumerate(((40, 2), (300, 2)), start=len(BF16_CASES)):
    if i < first:
        continue
    x, w, pos, slots, _ = make_inputs(m, kv_heads, seed=m + 1, pad=m // 4)
    cache = torch.full((max(4, -(-2 * m // PAGE_SIZE)), kv_heads, PAGE_SIZE, 128), 0x7F, dtype=torch.uint8,
                       device="cuda")
    k_scale, v_scale = _fp8_scales("per_head", kv_heads)
    y, err = run_fp8(x, w, pos, slots, cs, cache.view(torch.float8_e4m3fn), k_scale, v_scale)
    torch.cuda.synchronize()
    assert_close(y, qkv_front_f64(x, w, pos, cs, kv_heads), "y")
    want = fp8_rows(inserted_rows_f64(y.double(), kv_heads).to(torch.bfloat16), k_scale, v_scale).view(torch.uint8)
    keep = slots.long() >= 0
    assert torch.equal(cache.permute(0, 2, 1, 3).reshape(-1, kv_heads, 128)[slots.long()[keep]], want[keep])
    print(f"M={m} Hkv={kv_heads} fp8 ok, flag {int(err.item())}", flush=True)
print("sanitize_case done")
