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
    from bench import timing as T
    from muse_ops import attn2_workspace
    from muse_ops.config import proj_cols
    from muse_ops.cutedsl.launch import launch_attn2, launch_qkv_front
    from muse_ops.errors import error_flag
    from muse_ops.reference import rope_cos_sin
    dev = torch.device("cuda")
    bad = 0
    for spec in CASES:   # bits: every stage count against the pick, behind one qkv_front
        a, pick, vs = variants(spec)
        case = LY.layer_case(spec)
        inp = LY.build_layer(case, dev, T.l2_bytes(dev), sets=1)
        ws = attn2_workspace(dev, a.batch, a.kv_heads, a.q_len, a.window, a.max_seq_len)
        cos_sin = rope_cos_sin(a.max_seq_len, device=dev) if case.config.rope else None
        err = error_flag(dev)
        y = torch.empty((a.batch * a.q_len, proj_cols(a.kv_heads)), dtype=torch.bfloat16, device=dev)
        launch_qkv_front(inp.xs[0], inp.weights[0], inp.positions[0], inp.slots[0], cos_sin, inp.kv.kv_cache, y, err)
        outs = []
        for label, (_, ao) in vs.items():
            if ao == "skip":
                continue
            o = torch.full((a.batch * a.q_len, a.kv_heads * 512), float("nan"), dtype=torch.bfloat16, device=dev)
            launch_attn2(y, inp.kv.kv_cache, inp.kv.page_tables[0], inp.kv.seq_lens, o, ws, err, q_len=a.q_len,
                         window=a.window, scale=a.scale, max_seq_len=a.max_seq_len, _cfg_override=ao)
            outs.append(o)
        torch.cuda.synchronize()
        same = all(torch.equal(outs[0].view(torch.int16), o.view(torch.int16)) for o in outs)
        finite = bool(torch.isfinite(outs[0].float()).all())
        bad += (not same) or (not finite) or int(err.item()) != 0
        print(f"CHECK {case.name:28s} {len(outs)} variants same bits {same} finite {finite} "
              f"error flag {int(err.item())}", flush=True)
        del inp
        torch.cuda.empty_cache()
    print("CHECK FAILURES", bad, flush=True)
    for spec in CASES:
        a, pick, vs = variants(spec)
        LV.VARIANTS = vs
        print(f"{pick.layout} cap {pick.ctas_per_sm} stages {pick.stages} " + LV.run_case(spec, dev), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    {"precompile": precompile, "run": run}[sys.argv[1]]()
