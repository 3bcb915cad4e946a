"""Dev check of attn2's converter_warp variant (FP8, deep): against the default FP8 variant's bits
and the float64 oracle, q_len 8 and 1, per-head scales; error flag and workspace counters."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import torch
from muse_ops.cutedsl import attn2 as A, dev
from test_attn2_cutedsl import make_case_fp8, check_close, counters_zero, SCALE, GROUP, HEAD_DIM
from muse_ops.testing import attn2_f64
small = os.environ.get("CONV_SMALL") == "1"
sets = [[0, 100, 1200, 5000, 16500]] if small else [[0, 100, 1200, 5000, 16500], [0] + [int(x) for x in torch.randint(8, 40000, (40,), generator=torch.Generator().manual_seed(3))]]
bad_total = 0
for q_len, lens, window in [(q, l, w) for q in (8, 1) for l in sets for w in (0, 1024)]:
    if True:
        lens = list(lens)
        lens[0] = q_len
        y, cache, pt, seq, ks, vs = make_case_fp8(lens, 2, q_len, seed=5, scales="head")
        outs = {}
        for label, over in (("base", dict(layout="deep")), ("conv", dict(layout="deep", converter_warp=True)),
                            ("conv3", dict(layout="deep", converter_warp=True, stages=3))):
            if small and label == "conv3":
                continue
            R, hkv = seq.shape[0], cache.shape[1]
            out = torch.full((q_len * R, GROUP * hkv * HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=y.device)
            ws = torch.zeros(A.workspace_bytes(R, hkv, q_len, window, 65536), dtype=torch.uint8, device=y.device)
            err = torch.zeros(1, dtype=torch.int32, device=y.device)
            for rep in range(2):
                dev.launch_attn2(y, cache, pt, seq, out, ws, err, q_len=q_len, window=window, scale=SCALE,
                                 max_seq_len=65536, override=over, k_scale=ks, v_scale=vs)
                torch.cuda.synchronize()
                if rep == 0:
                    first = out.clone()
            outs[label] = out.clone()
            same_run = torch.equal(first.view(torch.int16), out.view(torch.int16))
            bad, mx, mean = check_close(out, attn2_f64(y, cache, pt, seq, q_len=q_len, window=window, scale=SCALE,
                                                       k_scale=ks, v_scale=vs))
            zero = counters_zero(A, ws, R, hkv, q_len, window, 65536)
            same_base = torch.equal(outs["base"].view(torch.int16), out.view(torch.int16))
            ok = bad == 0 and same_run and int(err.item()) == 0 and zero and same_base
            bad_total += not ok
            print(f"q_len {q_len} W {window} R {R} {label}: bad {bad} max {mx:.3g} mean {mean:.3g} err {int(err.item())} "
                  f"counters0 {zero} run-to-run {same_run} bits==base {same_base} {'OK' if ok else 'FAIL'}", flush=True)
print("CONV CHECK", "PASS" if bad_total == 0 else f"FAIL {bad_total}")
