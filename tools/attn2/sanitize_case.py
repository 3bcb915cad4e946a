"""Small launches for compute-sanitizer (memcheck / racecheck / synccheck), every layout: cluster
DSMEM merges, the level-2 merge (L=5000: 2 nodes, 4 subs; L=16500: 4 nodes of 4-step chunks), tail
page, one-token request; a window deployment (W=1024: one node). GPU machine:
compute-sanitizer --tool racecheck python3 tools/attn2/sanitize_case.py (PART=sanitize tools/device_run.sh
runs every tool on both ops' cases)."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import torch
from muse_ops.cutedsl import attn2 as A
from test_attn2_cutedsl import make_case, run_kernel, check_close, SCALE
from muse_ops.testing import attn2_f64
for q_len in (8, 1):
    y, cache, pt, seq = make_case([q_len, 100, 1200, 5000, 16500], 1, q_len, seed=4)
    for window in (0, 1024):
        for layout in A.deployment_layouts(window):
            out, ws, err = run_kernel(A, y, cache, pt, seq, q_len=q_len, window=window, max_seq_len=32768, layout=layout)
            torch.cuda.synchronize()
            print("sanitize case q_len", q_len, "window", window, layout,
                  check_close(out, attn2_f64(y, cache, pt, seq, q_len=q_len, window=window, scale=SCALE)),
                  int(err.item()))
