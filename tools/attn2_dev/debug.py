import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import torch
from muse_ops.cutedsl import attn2 as A
from test_attn2_cutedsl import make_case, ref_float64, run_kernel, check_close, SCALE
torch.set_printoptions(precision=3, linewidth=200)
for q_len, W, hkv, lens, mode in [(8, 0, 1, [8], "v1"), (8, 0, 1, [8], "rand"), (8, 0, 1, [32], "rand"), (8, 0, 1, [100], "rand"),
                                  (8, 0, 1, [600], "rand"), (8, 0, 1, [5000], "rand"), (1, 0, 1, [1], "rand"), (1, 0, 1, [100], "rand")]:
    y, cache, pt, seq = make_case(lens, hkv, q_len, seed=1, window=W)
    if mode == "v1":
        cache[..., 64:] = torch.where(torch.isnan(cache[..., 64:]), cache[..., 64:], torch.ones_like(cache[..., 64:]))
    outs = []
    for rep in range(2):
        out, ws, err = run_kernel(A, y, cache, pt, seq, q_len=q_len, window=W, max_seq_len=1 << 17)
        torch.cuda.synchronize(); outs.append(out)
    ref = ref_float64(y, cache, pt, seq, q_len=q_len, window=W, scale=SCALE)
    d = (outs[0].double() - ref).abs().nan_to_num(99)
    print(mode, q_len, lens, "plan", A._split_plan(A._config(q_len, W, 1 << 17), lens[0]), "det", torch.equal(outs[0], outs[1]),
          "err", int(err.item()))
    print(" max err per (token, head):\n", d.view(q_len, 8 * hkv, 64).amax(-1).cpu())
    print(" max err per col block of 8:", d.view(-1, 8, 8).amax((0, 2)).cpu())
    if mode == "v1":
        print(" out/sig(gate) row0:", (outs[0][0, :16].double() / torch.sigmoid(y[0, 640 * hkv:640 * hkv + 16].double())).cpu())
