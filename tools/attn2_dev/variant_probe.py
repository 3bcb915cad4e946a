"""attn2 launch-config variants against the host's pick, each case first checked for bits (every
variant's output against the pick's, behind one qkv_front), then timed in a layer step
(tools/attn2_dev/layer_variants.py) and alone. Two probes (bench/RESULTS.md):
- stages (twenty-third run): the KV ring depth under the occupancy caps (attn2_plan.CAPPED_RING_STAGES),
  2 stages and the deepest ring the cap's shared memory holds;
- early (twenty-fourth run): the register budget of a capped variant (attn2_plan.CAPPED_REGISTER_Q_LENS:
  the pick against the other budget) and the ring prologue's old rows before the PDL wait
  (Attn2Config.early_ring).

CPU:  MUSE_OPS_CACHE_DIR=... CUTE_DSL_ARCH=sm_90a python tools/attn2_dev/variant_probe.py precompile PROBE
GPU:  python tools/attn2_dev/variant_probe.py run PROBE      [PROBE_CASES="[(B, L, W[, q_len, Hkv]), ...]"]
"""
import os
import sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench import layer as LY
from muse_ops.cutedsl import attn2_plan as P, qkv_front_plan as QP, launch

SM = 132
CASES = {
    "stages": [(1, 8192, 0), (2, 8192, 0), (4, 8192, 0), (16, 8192, 0), (24, 8192, 0), (32, 8192, 0),
               (48, 8192, 0), (1, 16384, 0), (1, 8192, 2048), (8, 8192, 2048), (64, 8192, 2048),
               (16, 8192, 0, 1, 2), (4, 8192, 0, 1, 2), (32, 4096, 0, 8, 1), (32, 4096, 0, 8, 4), (8, 8192, 0)],
    "early": [(1, 8192, 0), (2, 8192, 0), (4, 8192, 0), (8, 8192, 0), (16, 8192, 0), (32, 8192, 0),
              (48, 8192, 0), (64, 8192, 0), (128, 8192, 0), (1, 16384, 0), (1, 8192, 2048), (8, 8192, 2048),
              (64, 8192, 2048), (1, 8192, 0, 1, 2), (4, 8192, 0, 1, 2), (16, 8192, 0, 1, 2),
              (64, 8192, 0, 1, 2), (32, 4096, 0, 8, 1)],
}


def stage_variants(a, pick):
    """2 stages and the deepest ring the pick's cap holds (uncapped picks: the pick alone)."""
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
    return out


def early_variants(a, pick):
    """The other register budget where a cap applies (the cap's, or 5 / 4 CTAs an SM's), and the
    early ring prologue; each alone too."""
    out = {"pick": (None, None)}
    if pick.ctas_per_sm:
        uncapped = P._config(a.q_len, a.window, a.max_seq_len, pick.layout).min_blocks
        other = uncapped if pick.min_blocks == pick.ctas_per_sm else pick.ctas_per_sm
        out[f"regs@{other}"] = (None, {"min_blocks": other})
    out["early"] = (None, {"early_ring": True})
    out["alone"] = ("skip", None)
    out["alone early"] = ("skip", {"early_ring": True})
    return out


PROBES = {"stages": stage_variants, "early": early_variants}


def variants(spec, probe):
    """(attn2 case, the host's pick, {label: (qkv_front override, attn2 override)})."""
    a = LY.layer_case(spec).attn
    pick = P.launch_config(a.batch, a.kv_heads, a.q_len, a.window, a.max_seq_len, None, SM)
    return a, pick, PROBES[probe](a, pick)


def cases(probe):
    return eval(os.environ["PROBE_CASES"]) if os.environ.get("PROBE_CASES") else CASES[probe]


def precompile(probe):
    n = 0
    seen = set()
    for spec in cases(probe):
        a, pick, vs = variants(spec, probe)
        print(spec, pick.layout, "cap", pick.ctas_per_sm, list(vs), flush=True)
        for qo, ao in vs.values():
            cfgs = []
            if qo != "skip":
                cfgs.append(("qkv_front", QP.launch_config(a.batch * a.q_len, a.kv_heads,
                                                           LY.layer_case(spec).config.rope, torch.int64,
                                                           torch.int64, qo)))
            if ao != "skip":
                cfgs.append(("attn2", P.launch_config(a.batch, a.kv_heads, a.q_len, a.window, a.max_seq_len,
                                                       ao, SM)))
            for fam, c in cfgs:
                if c not in seen:
                    seen.add(c); launch.COMPILE[fam](c); n += 1
    print(n, "compiled")


def run(probe):
    import layer_variants as LV
    dev = torch.device("cuda")
    bad = 0
    for spec in cases(probe):
        # bits: every variant against the pick, each in a layer step (qkv_front then attn2, back to
        # back) whose new tokens' cache rows were NaN before it: a variant that read them before
        # qkv_front's insert landed (early_ring) would show it
        _, _, vs = variants(spec, probe)
        rig = LV.LayerRig(spec, dev, sets=1)
        kv = rig.inp.kv.kv_cache
        slots = rig.inp.slots[0].long()
        slots = slots[slots >= 0]
        outs = []
        for _, ao in vs.values():
            if ao != "skip":
                kv[slots // 16, :, slots % 16, :] = float("nan")
                rig.outs[0].fill_(float("nan"))
                rig.step(None, ao)(0)
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
    for spec in cases(probe):
        a, pick, vs = variants(spec, probe)
        LV.VARIANTS = vs
        print(f"{pick.layout} cap {pick.ctas_per_sm} stages {pick.stages} " + LV.run_case(spec, dev), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    {"precompile": precompile, "run": run}[sys.argv[1]](sys.argv[2])
