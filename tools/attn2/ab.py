"""Device run: interleaved A/B timing of attn2 variants (us, median and range over rounds).
usage: AB_VARIANTS=... AB_CASES=... [AB_ROUNDS=3] python3 tools/attn2/ab.py
  AB_VARIANTS: [(label, kernel module file or None for muse_ops', config override dict), ...]
  AB_CASES:    [(B, L, W, labels or None), ...]; B = "mixed": 64 requests, L ~ U[512, 32768];
               B = a list of lengths: those requests (L unused)
  AB_MSL:      the deployment's max_seq_len for every case (default: L, as in the bench; a list case: its longest)
  AB_QLEN:     the query block (8: verify, the default; 1: decode)
  AB_HKV:      KV heads (default 2)
Every variant of a case is built once (cases.build_case, deployment max_seq_len = L) on the
inputs of the case's first variant of its cache dtype (bf16, or e4m3 with the override fp8=1: a
variant never runs on the other dtype's pools) and timed in turn, round after round, so drifts of
the GPU hit all of them alike; then each variant's out on the first input set is compared in bits
with that first variant's, and the line names those that differ (the layouts compute one tree:
the same bits). The floor printed is the case's KV bytes at the GPU's measured copy rate, per
cache dtype where the case has both."""
import os, sys, statistics
sys.path.insert(0, os.path.dirname(__file__))
import cases
import torch

VARIANTS = eval(os.environ["AB_VARIANTS"])      # [(label, file or None, override dict)]
CASES = eval(os.environ["AB_CASES"])            # [(B, L, W, labels or None)]
ROUNDS = int(os.environ.get("AB_ROUNDS", "3"))
QLEN = int(os.environ.get("AB_QLEN", "8"))
HKV = int(os.environ.get("AB_HKV", "2"))
mods = {f: cases.load_kernel(f) for _, f, _ in VARIANTS}
# the floor printed per case: its KV bytes at this GPU's measured copy rate (bench.timing)
HBM_TBPS = cases.T.measure_hbm_tbps("cuda")
print(f"AB on {torch.cuda.get_device_name()}: HBM copy {HBM_TBPS:.2f} TB/s", flush=True)
g = torch.Generator().manual_seed(0)
MIXED = [int(x) for x in torch.randint(512, 32769, (64,), generator=g)]
for (B, L, W, labels) in CASES:
    # the case's requests: B of length L, the mixed batch, or a list of lengths
    lens = MIXED if B == "mixed" else (B if isinstance(B, list) else None)
    msl = int(os.environ.get("AB_MSL", 0)) or (32768 if B == "mixed" else max(lens) if lens else L)
    name = (len(B), min(B), max(B), W) if isinstance(B, list) else (B, L, W)
    built = []
    first = {}    # cache dtype (fp8 or not) -> the label and case of its first variant, whose inputs the others share
    for (lab, f, over) in VARIANTS:
        if labels and lab not in labels:
            continue
        cases.A, cases.KERNEL = mods[f], (mods[f] if f else None)
        case = cases.build_case(len(lens) if lens else B, L, W, q_len=QLEN, hkv=HKV, lens=lens, over=over, msl=msl)
        fp8 = bool(over.get("fp8", False))
        if fp8 in first:   # the same inputs for every variant of a dtype (their outputs are compared)
            ref = first[fp8][1]
            case.pools, case.y, case.seq = ref.pools, ref.y, ref.seq
        else:
            first[fp8] = (lab, case)
        cases.graph_us(case)          # compile + warm
        built.append((lab, f, case, fp8))
    ts = {lab: [] for lab, _, _, _ in built}
    for _ in range(ROUNDS):
        for lab, f, case, _ in built:
            cases.A, cases.KERNEL = mods[f], (mods[f] if f else None)
            ts[lab].append(cases.graph_us(case))
    outs = {}
    for lab, f, case, _ in built:   # every variant's out on pool 0 (same tree: the same bits)
        cases.A, cases.KERNEL = mods[f], (mods[f] if f else None)
        c, p = case.pools[0]
        cases.launch_attn2(case.y, c, p, case.seq, case.out, case.ws, case.err, kernel=cases.KERNEL, **case.kw)
        outs[lab] = case.out.clone()
        assert int(case.err.item()) == 0
    # against the first variant of the same dtype; a variant of another tree gives other bits: how
    # far (largest |diff| / largest |out|) says if it is rounding
    differ = []
    for lab, _, _, fp8 in built:
        o, r = outs[lab], outs[first[fp8][0]]
        if not torch.equal(o.view(torch.int16), r.view(torch.int16)):
            differ.append(f"{lab} {((o.float() - r.float()).abs().max() / r.float().abs().max()).item():.1e}")
    floors = {fp8: ref.pool_bytes / (HBM_TBPS * 1e12) * 1e6 for fp8, (_, ref) in first.items()}
    floor = (f"floor {next(iter(floors.values())):7.2f}" if len(floors) == 1 else
             f"floor bf16 {floors[False]:.2f} fp8 {floors[True]:.2f}")
    print(f"AB {str(name):22s} {floor} {'same bits' if not differ else 'DIFFERENT bits: ' + ','.join(differ)} | " + " | ".join(
        f"{lab} {statistics.median(ts[lab]):7.2f} ({min(ts[lab]):.2f}-{max(ts[lab]):.2f})" for lab, _, _, _ in built), flush=True)
    del built
    torch.cuda.empty_cache()
