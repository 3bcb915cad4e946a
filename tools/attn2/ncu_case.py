"""One eager attn2 case for ncu: python3 tools/attn2/ncu_case.py B L W [cfg-override as k=v ...]
Builds the case of cases.bench_case (scattered pages, Hkv 2, q_len 8), launches 3 times."""
import sys
import os
sys.path.insert(0, os.path.dirname(__file__))
import cases

B, L, W = (int(x) for x in sys.argv[1:4])
over = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (a.split("=") for a in sys.argv[4:])}
us, fl, by = cases.bench_case(B, L, W, over=over, reps=3)
print(f"case {(B, L, W)} {over}: {us:.2f} us, floor {fl:.2f}", flush=True)
