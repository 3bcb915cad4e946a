"""Device run: correctness smoke + timing table of the CuTe attn2 kernel (CUDA graphs, cold L2).
usage: python3 tools/attn2_dev/run_dev.py [check] [bench] [tune]
env: TUNE_VARIANTS / TUNE_CASES (python literals), ATTN2_FILE (time another copy of attn2.py)."""
import os, sys, time, math
from types import SimpleNamespace
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import torch
from bench import timing as T


def load_kernel(path=None):
    """The attn2 kernel module: muse_ops' own, or the copy at path (A/B of two versions)."""
    if path is None:
        from muse_ops.cutedsl import attn2
        return attn2
    from muse_ops.cutedsl.launch import kernel_copy
    return kernel_copy(path)


A = load_kernel(os.environ.get("ATTN2_FILE"))
from muse_ops.cutedsl import launch  # noqa: E402
KERNEL = A if os.environ.get("ATTN2_FILE") else None   # a copy: compiled from its own source
from test_attn2_cutedsl import make_case, run_kernel, check_close, counters_zero, SCALE
from muse_ops.testing import attn2_f64

dev = "cuda"


def run_checks():
    t0 = time.time()
    for q_len in (8, 1):
        for window in (0, 2048):
            for cfg in A.deployment_variants(2, q_len, window, 1 << 17):
                launch.compile_attn2(cfg, _kernel=KERNEL)
    print(f"compile 8 variants {time.time()-t0:.1f}s", flush=True)
    for (q_len, window, hkv, lens) in [
            (8, 0, 2, [8, 9, 17, 100, 2049, 8192, 40000]), (8, 2048, 2, [8, 2057, 5000, 33333]),
            (1, 0, 4, [1, 2, 17, 4096, 100000]), (1, 2048, 2, [1, 2049, 9000]), (8, 0, 1, [12345]),
            (8, 0, 2, [8, 512, 1024, 1025, 2048, 4096, 65536, 65537, 131072])]:
        msl = 1 << 17
        kw = dict(q_len=q_len, window=window, max_seq_len=msl)
        y, cache, pt, seq = make_case(lens, hkv, q_len, seed=1, window=window)
        ref = attn2_f64(y, cache, pt, seq, q_len=q_len, window=window, scale=SCALE)
        outs = []
        for layout in A.deployment_layouts(window):
            out, ws, err = run_kernel(A, y, cache, pt, seq, layout=layout, **kw)
            out2, _, _ = run_kernel(A, y, cache, pt, seq, ws=ws, err=err, layout=layout, **kw)
            torch.cuda.synchronize()
            nbad, mx, mean = check_close(out, ref)
            same = torch.equal(out.view(torch.int16), out2.view(torch.int16))
            outs.append(out)
            print(f"CHECK {layout} q_len={q_len} W={window} hkv={hkv} lens={lens}: bad={nbad} max={mx:.3g} "
                  f"mean={mean:.3g} err={int(err.item())} cnt0={counters_zero(A, ws, len(lens), hkv, q_len, window, msl)} "
                  f"det={same}", flush=True)
        if len(outs) > 1:
            print(f"CHECK layouts bit-identical: {torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))}",
                  flush=True)


def build_case(B, L, window, q_len=8, hkv=2, lens=None, over=None, msl=1 << 18):
    """Inputs of one timing case: page pools that together exceed 200 MB (cold KV), the rest, and
    a workspace sized for the layout the launch will use."""
    lens = lens or [L] * B
    over = dict(over or {})
    cfg = A.launch_config(B, hkv, q_len, window, msl, over)
    npg = [(l + 15) // 16 for l in lens]
    first = [max(0, l - q_len - window + 1) // 16 if window else 0 for l in lens]
    vis = sum(n - f for n, f in zip(npg, first))
    pool_bytes = vis * hkv * 16 * 256
    n_pools = max(1, min(16, math.ceil(200e6 / pool_bytes)))
    width = max(npg) + 1
    pools = []
    for i in range(n_pools):
        cache = torch.randn(vis + 8, hkv, 16, 128, device=dev, dtype=torch.bfloat16)
        perm = torch.randperm(vis + 8, device=dev).to(torch.int32)
        pt = torch.full((B, width), -1, dtype=torch.int32, device=dev)
        o = 0
        for r in range(B):
            n = npg[r] - first[r]
            pt[r, first[r]:npg[r]] = perm[o:o + n]
            o += n
        pools.append((cache, pt))
    return SimpleNamespace(
        pools=pools, pool_bytes=pool_bytes, cfg=cfg,
        seq=torch.tensor(lens, dtype=torch.int32, device=dev),
        y=torch.randn(q_len * B, 1152 * hkv, device=dev).to(torch.bfloat16),
        out=torch.empty(q_len * B, 512 * hkv, device=dev, dtype=torch.bfloat16),
        ws=torch.zeros(A.workspace_layout(cfg, B, hkv)[2], dtype=torch.uint8, device=dev),
        err=torch.zeros(1, dtype=torch.int32, device=dev),
        kw=dict(q_len=q_len, window=window, scale=SCALE, max_seq_len=msl, _cfg_override=over))


def graph_us(case, reps=20, replays=5):
    """Per-call us (median) of one CUDA graph of max(reps, pools) launches cycling the pools
    (bench.timing's capture and timer)."""
    def one_call(i):
        c, p = case.pools[i]
        launch.launch_attn2(case.y, c, p, case.seq, case.out, case.ws, case.err, _kernel=KERNEL, **case.kw)
    return T.graph_time_us(one_call, len(case.pools), replays=replays, min_calls=reps)["us"]


def bench_case(B, L, window, q_len=8, hkv=2, lens=None, over=None, reps=20, msl=1 << 18):
    case = build_case(B, L, window, q_len, hkv, lens, over, msl)
    us = graph_us(case, reps)
    assert int(case.err.item()) == 0, case.err
    return us, case.pool_bytes / 4.1e12 * 1e6, case.pool_bytes


def main(what):
    print(torch.cuda.get_device_name(), A.can_implement(torch.device("cuda"), 2, 8, 0, 1 << 17), flush=True)
    if "check" in what:
        run_checks()
    cases = [(1, 512, 0), (1, 8192, 0), (8, 2048, 0), (32, 4096, 0), (64, 8192, 0), (128, 16384, 0),
             (16, 65536, 0), (64, 8192, 2048), (128, 16384, 2048), (1, 131072, 0)]
    if "bench" in what:
        print(f"{'case (B,L,W) q_len8 Hkv2':28s} {'us':>8s} {'floor':>8s} {'ratio':>6s}  MB", flush=True)
        for (B, L, W) in cases:
            us, fl, by = bench_case(B, L, W)
            print(f"BENCH {str((B, L, W)):22s} {us:8.2f} {fl:8.2f} {us/fl:6.2f}  {by/1e6:.1f}", flush=True)
        g = torch.Generator().manual_seed(0)
        lens = [int(x) for x in torch.randint(512, 32769, (64,), generator=g)]
        us, fl, by = bench_case(64, 0, 0, lens=lens)
        print(f"BENCH {'mixed B64 512..32k':22s} {us:8.2f} {fl:8.2f} {us/fl:6.2f}  {by/1e6:.1f}", flush=True)
        for (B, L, W) in [(1, 8192, 0), (64, 8192, 0), (128, 16384, 2048)]:
            us, fl, by = bench_case(B, L, W, q_len=1)
            print(f"BENCH q_len1 {str((B, L, W)):15s} {us:8.2f} {fl:8.2f} {us/fl:6.2f}  {by/1e6:.1f}", flush=True)
    if "tune" in what:
        # TUNE_VARIANTS / TUNE_CASES: python literals (lists of config overrides / (B, L, W) cases)
        variants = eval(os.environ.get("TUNE_VARIANTS", "[{}]"))
        tcases = eval(os.environ.get("TUNE_CASES", "None")) or cases
        for (B, L, W) in tcases:
            for over in variants:
                us, fl, by = bench_case(B, L, W, over=over, msl=L)     # the bench's deployment: L
                print(f"TUNE {str((B, L, W)):20s} {str(over):48s} {us:8.2f} floor {fl:7.2f} ratio {us/fl:5.2f}", flush=True)


if __name__ == "__main__":
    main(set(sys.argv[1:]) or {"check", "bench"})
