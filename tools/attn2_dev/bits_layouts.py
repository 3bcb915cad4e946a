"""Device run: do the layouts give the same bits, and is each deterministic? For each case
(BITS_CASES: [(B, L, W), ...]; Hkv 2, q_len 8), every layout is launched directly (no graph) on the
same inputs with a fresh zeroed workspace, REPEATS times, and each out is compared in bits with
deep's first and with the float64 evaluation (muse_ops.testing.assert_close's tolerance).
Prints one line per (case, layout): bit mismatches against deep, run-to-run mismatches, the
largest error over the tolerance, counters left non-zero."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import run_dev  # noqa: E402
import torch  # noqa: E402
from muse_ops.testing import ATOL, RTOL, attn2_f64  # noqa: E402

REPEATS = int(os.environ.get("REPEATS", "5"))
for (B, L, W) in eval(os.environ["BITS_CASES"]):
    base = run_dev.build_case(B, L, W, over={"layout": "deep"}, msl=L)
    cache, pt = base.pools[0]
    ref64 = attn2_f64(base.y, cache, pt, base.seq, q_len=8, window=W, scale=run_dev.SCALE)
    deep0 = None
    for layout in ("deep", "wide"):
        vs_deep = rerun = 0
        worst = 0.0
        first = None
        for _ in range(REPEATS):
            case = run_dev.build_case(B, L, W, over={"layout": layout}, msl=L)
            run_dev.launch.launch_attn2(base.y, cache, pt, base.seq, case.out, case.ws, case.err, **case.kw)
            torch.cuda.synchronize()
            out = case.out.view(torch.int16).clone()
            deep0 = out if deep0 is None else deep0
            first = out if first is None else first
            vs_deep += int(not torch.equal(out, deep0))
            rerun += int(not torch.equal(out, first))
            err = (case.out.double() - ref64.double()).abs() / (ATOL + RTOL * ref64.double().abs())
            worst = max(worst, float(err.max()))
            zeroed = run_dev.counters_zero(run_dev.A, case.ws, B, 2, 8, W, L)
            assert int(case.err.item()) == 0
        print(f"BITS {str((B, L, W)):20s} {layout}: differs from deep {vs_deep}/{REPEATS}, run to run {rerun}/{REPEATS}, "
              f"worst error / tolerance {worst:.3f}, counters back to zero {zeroed}", flush=True)
