import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import torch
from muse_ops.cutedsl import attn2 as A
from test_attn2_cutedsl import make_case, ref_float64, run_kernel, check_close, SCALE
torch.set_printoptions(precision=2, linewidth=250)
print("NO_SWIZZLE", A._NO_SWIZZLE)
q_len, W, hkv = 1, 0, 1
y, cache, pt, seq = make_case([1], hkv, q_len, seed=1)
page = pt[0, 0].long()
cache[page, 0, 0, 64:] = (torch.arange(64, device="cuda") + 1).to(torch.bfloat16)
out, ws, err = run_kernel(A, y, cache, pt, seq, q_len=q_len, window=W, max_seq_len=1 << 17)
r = out[0, :64].double() / torch.sigmoid(y[0, 640:704].double())
v = torch.arange(64, device="cuda").double() + 1
print("recovered v (should be 1..64):", (r * (v.square().mean().sqrt())).cpu())
for L in (8, 100):
    y, cache, pt, seq = make_case([L], hkv, 8, seed=2)
    outs = [run_kernel(A, y, cache, pt, seq, q_len=8, window=0, max_seq_len=1 << 17)[0] for _ in range(4)]
    torch.cuda.synchronize()
    ref = ref_float64(y, cache, pt, seq, q_len=8, window=0, scale=SCALE)
    print("L", L, "check", check_close(outs[0], ref), "ndiff", [int((o != outs[0]).sum()) for o in outs])
