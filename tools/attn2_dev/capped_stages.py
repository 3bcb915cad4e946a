"""attn2's KV ring depth under the occupancy caps (attn2_plan.CAPPED_RING_STAGES): for each case
with a cap, the host's pick against 2 stages and the deepest ring the cap's shared memory holds,
in a layer step (tools/attn2_dev/layer_variants.py) and alone; first every variant's bits against
the pick's, behind one qkv_front. The twenty-third run's probe (bench/RESULTS.md).

CPU:  MUSE_OPS_CACHE_DIR=... CUTE_DSL_ARCH=sm_90a python tools/attn2_dev/capped_stages.py precompile
GPU:  python tools/attn2_dev/capped_stages.py run
"""
import os
import sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench import layer as LY
from muse_ops.cutedsl import attn2_plan as P, qkv_front_plan as QP, launch

CASES = [(1, 8192, 0), (2, 8192, 0), (4, 8192, 0), (16, 8192, 0), (24, 8192, 0), (32, 8192, 0),
         (48, 8192, 0), (1, 16384, 0), (1, 8192, 2048), (8, 8192, 2048), (64, 8192, 2048),
         (16, 8192, 0, 1, 2), (4, 8192, 0, 1, 2), (32, 4096, 0, 8, 1), (32, 4096, 0, 8, 4), (8, 8192, 0)]
SM = 132


def variants(spec):
    """(attn2 case, the host's pick, {label: (qkv_front override, attn2 override)})."""
    a = LY.layer_case(spec).attn
    pick = P.launch_config(a.batch, a.kv_heads, a.q_len, a.window, a.max_seq_len, None, SM)
    out = {"pick": (None, None)}
    if pick.ctas_per_sm:
        budget = P.OCCUPANCY_SMEM_BYTES[pick.ctas_per_sm]
        fits = [s for s in range(2, 8)
                if P._config(a.q_len, a.window, a.max_seq_len, pick.layout, stages=s).smem_bytes <= budget]
        if pick.wide:   # a wide CTA has at most chunk_max steps
            fits = [s for s in fits if s <= pick.chunk_max]
        for s in sorted({2, fits[-1]} - {pick.stages}):
            out[f"st{s}"] = (None, {"stages": s})
        out["alone"] = ("skip", None)
        if fits[-1] != pick.stages:
            out[f"alone st{fits[-1]}"] = ("skip", {"stages": fits[-1]})
    return a, pick, out


def precompile():
    n = 0
    seen = set()
    for spec in CASES:
        a, pick, vs = variants(spec)
        print(spec, pick.layout, "cap", pick.ctas_per_sm, list(vs), flush=True)
        for qo, ao in vs.values():
            cfgs = []
            if qo != "skip":
                cfgs.append(("qkv_front", QP.launch_config(a.batch * a.q_len, LY.layer_case(spec).config.rope,
                                                           torch.int64, torch.int64, qo)))
            if ao != "skip":
                cfgs.append(("attn2", P.launch_config(a.batch, a.kv_heads, a.q_len, a.window, a.max_seq_len,
                                                       ao, SM)))
            for fam, c in cfgs:
                if c not in seen:
                    seen.add(c); launch.COMPILE[fam](c); n += 1
    print(n, "compiled")


def run():
    import layer_variants as LV
    dev = torch.device("cuda")
    bad = 0
    for spec in CASES:   # bits: every stage count against the pick, behind one qkv_front
        _, _, vs = variants(spec)
        rig = LV.LayerRig(spec, dev, sets=1)
        rig.step(None, "skip")(0)
        outs = []
        for _, ao in vs.values():
            if ao != "skip":
                rig.outs[0].fill_(float("nan"))
                rig.step("skip", ao)(0)
                outs.append(rig.outs[0].clone())
        torch.cuda.synchronize()
        same = all(torch.equal(outs[0].view(torch.int16), o.view(torch.int16)) for o in outs)
        finite = bool(torch.isfinite(outs[0].float()).all())
        flag = int(rig.err.item())
        bad += (not same) or (not finite) or flag != 0
        print(f"CHECK {rig.case.name:28s} {len(outs)} variants same bits {same} finite {finite} "
              f"error flag {flag}", flush=True)
        del rig
        torch.cuda.empty_cache()
    print("CHECK FAILURES", bad, flush=True)
    for spec in CASES:
        a, pick, vs = variants(spec)
        LV.VARIANTS = vs
        print(f"{pick.layout} cap {pick.ctas_per_sm} stages {pick.stages} " + LV.run_case(spec, dev), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    {"precompile": precompile, "run": run}[sys.argv[1]]()
