"""Device run: where do the layouts' outputs differ, and does it follow the data or the batch?
For each case (B, L, W) (Hkv 2, q_len 8; DIAG_CASES, default the four below) deep and wide run
once on the same inputs; the line names the outputs that differ (requests, heads, largest
difference). For a case that differs, the first differing request alone, the first 16 requests
and the first four differing ones are run again in both layouts: whether the layouts still
differ there, and whether each layout gives the same bits alone as in the batch."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import run_dev  # noqa: E402
import torch  # noqa: E402

CASES = eval(os.environ.get("DIAG_CASES", "[(32, 8192, 2048), (64, 8192, 2048), (32, 8192, 0), (64, 2048, 0)]"))


def run(B, L, W, layout, y, cache, pt, seq):
    case = run_dev.build_case(B, L, W, over={"layout": layout}, msl=L)
    run_dev.launch.launch_attn2(y, cache, pt, seq, case.out, case.ws, case.err, **case.kw)
    torch.cuda.synchronize()
    return case.out.clone()


def bits(t):
    return t.view(torch.int16)


for (B, L, W) in CASES:
    base = run_dev.build_case(B, L, W, over={"layout": "deep"}, msl=L)
    cache, pt = base.pools[0]
    d = run(B, L, W, "deep", base.y, cache, pt, base.seq)
    w = run(B, L, W, "wide", base.y, cache, pt, base.seq)
    diff = bits(d) != bits(w)
    reqs = sorted({r // 8 for r in diff.any(1).nonzero().flatten().tolist()})
    heads = sorted({int(c) // 64 for c in diff.any(0).nonzero().flatten()})
    print(f"{(B, L, W)}: {int(diff.sum())} elements differ, requests {reqs[:20]}{'...' if len(reqs) > 20 else ''}, "
          f"heads {heads}, max |d-w| {float((d.float() - w.float()).abs().max()):.3g}", flush=True)
    if not reqs:
        continue
    for sub in ([reqs[0]], list(range(min(16, B))), reqs[:4]):
        idx = torch.tensor(sub, device="cuda")
        rows = (idx[:, None] * 8 + torch.arange(8, device="cuda")).flatten()
        ys, pts, seqs = base.y[rows].contiguous(), pt[idx].contiguous(), base.seq[idx].contiguous()
        d2 = run(len(sub), L, W, "deep", ys, cache, pts, seqs)
        w2 = run(len(sub), L, W, "wide", ys, cache, pts, seqs)
        print(f"   requests {sub[:6]}{'...' if len(sub) > 6 else ''} alone (B={len(sub)}): wide==deep "
              f"{torch.equal(bits(d2), bits(w2))}, deep alone == deep in batch {torch.equal(bits(d2), bits(d[rows]))}, "
              f"wide alone == wide in batch {torch.equal(bits(w2), bits(w[rows]))}", flush=True)
