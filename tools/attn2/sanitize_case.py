"""Small launches for compute-sanitizer (memcheck / racecheck / synccheck), every layout: cluster
DSMEM merges, the level-2 merge (L=5000: 2 nodes, 4 subs; L=16500: 4 nodes of 4-step chunks), tail
page, one-token request; a window deployment (W=1024: one node); and the same over an FP8 (e4m3)
cache with per-head scales (its staging ring, the conversion into the f16 step buffer, the tail
rows zeroed there, the 0x7F NaN bytes of unused pages and tail rows). GPU machine:
compute-sanitizer --tool racecheck python3 tools/attn2/sanitize_case.py (PART=sanitize tools/device_run.sh
runs every tool on both ops' cases); SANITIZE_DTYPES=fp8 (or bf16) runs one cache dtype only,
SANITIZE_QLENS=1 (or 8) one query length; SANITIZE_KNOBS='{"page_box": True}' adds launch-config overrides
(development knobs) to every launch."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import torch
from muse_ops.cutedsl import attn2 as A
from test_attn2_cutedsl import make_case, make_case_fp8, run_kernel, check_close, SCALE
from muse_ops.testing import attn2_f64
lens = [1, 100, 1200, 5000, 16500]
knobs = eval(os.environ.get("SANITIZE_KNOBS", "None"))
for q_len in [int(x) for x in os.environ.get("SANITIZE_QLENS", "8,1").split(",")]:
    lens[0] = q_len
    for cache_dtype in os.environ.get("SANITIZE_DTYPES", "bf16,fp8").split(","):
        if cache_dtype == "bf16":
            y, cache, pt, seq = make_case(lens, 1, q_len, seed=4)
            ks = vs = None
        else:
            y, cache, pt, seq, ks, vs = make_case_fp8(lens, 2, q_len, seed=5, scales="head")
        for window in (0, 1024):
            for layout in A.deployment_layouts(window):
                out, ws, err = run_kernel(A, y, cache, pt, seq, q_len=q_len, window=window, max_seq_len=32768,
                                          layout=layout, k_scale=ks, v_scale=vs, knobs=knobs)
                torch.cuda.synchronize()
                print("sanitize case", cache_dtype, "q_len", q_len, "window", window, layout,
                      check_close(out, attn2_f64(y, cache, pt, seq, q_len=q_len, window=window, scale=SCALE,
                                                 k_scale=ks, v_scale=vs)),
                      int(err.item()))
