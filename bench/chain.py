"""The PDL chain: qkv_front -> attn2 -> the next layer's qkv_front -> ..., a stack of layers in one
CUDA graph, against the same kernels timed alone.

Both kernels launch with programmatic dependent launch: a grid may start while its predecessor
in the stream runs, and waits (griddepcontrol.wait) before it touches what the predecessor
writes; qkv_front streams its weight before the wait. Whether a stack gains from that (each
kernel's prologue overlapping its predecessor's tail) is what this measures: a CTA of either
kernel can only start where an SM has room, and qkv_front's CTAs take a whole SM each.

Measured per case, per layer (us), LAYERS layers with their own weights and caches (cold, as in a
model, where each layer's weight and KV are read once a step):
  stack, PDL      the stack in one graph (the deployment's kernels)
  stack, no PDL   the same kernels compiled without PDL (each grid starts after the previous ends);
                  and with PDL on one of the two kernels only; without attn2's occupancy caps
                  (attn2_plan.occupancy_cap); and with qkv_front's trigger after the main loop
                  compiled into no token tile (the deployment: every tile) and no cap (attn2 then
                  launches as qkv_front's last CTA exits: the deployment up to the twenty-first run
                  from 64 tokens)
  alone           qkv_front alone + attn2 alone, each in its own graph over the same layers, without
                  PDL (so consecutive calls of one kernel do not overlap either)
x is each layer's own input (the attention output feeds o_proj in a model, not the next
qkv_front); the order of the launches in the stream is what the chain measures.
"""
from __future__ import annotations

import torch

from muse_ops.config import HIDDEN, DeploymentConfig, proj_cols

from . import cases as C
from . import timing as T

LAYERS = 8
CHAIN_CASES = [(1, 8192, 0), (2, 8192, 0), (4, 8192, 0), (8, 8192, 0), (64, 8192, 0)]


def _stack(device, spec, seed=0):
    """LAYERS layers (alternately sliding and full) with their own weight, cache pages and x."""
    from muse_ops import attn2_workspace
    from muse_ops.errors import error_flag
    from muse_ops.paged import block_positions, block_slots
    from muse_ops.reference import rope_cos_sin
    a = C.attn2_case(spec)
    kv = C.build_attn2(a, device, 1, sets=LAYERS, seed=seed)   # one page set per layer
    g = torch.Generator(device=device).manual_seed(seed + 1)
    n = proj_cols(a.kv_heads)
    layers = []
    for i in range(LAYERS):
        window = 2048 if i % 2 == 0 else 0
        cfg = DeploymentConfig(kv_heads=a.kv_heads, q_len=a.q_len, window=window, max_seq_len=a.max_seq_len,
                               max_batch=a.batch)
        w = torch.empty((n, HIDDEN), dtype=torch.bfloat16, device=device).normal_(0.0, HIDDEN ** -0.5, generator=g)
        x = torch.randn((a.batch * a.q_len, HIDDEN), generator=g, device=device).to(torch.bfloat16)
        layers.append({
            "cfg": cfg, "w": w, "x": x, "table": kv.page_tables[i],
            "pos": block_positions(kv.seq_lens, a.q_len), "slots": block_slots(kv.page_tables[i], kv.seq_lens, a.q_len),
            "cos_sin": rope_cos_sin(a.max_seq_len, device=device) if cfg.rope else None,
            "y": torch.empty((a.batch * a.q_len, n), dtype=torch.bfloat16, device=device),
            "out": torch.empty((a.batch * a.q_len, a.kv_heads * 512), dtype=torch.bfloat16, device=device),
            "ws": attn2_workspace(device, a.batch, a.kv_heads, a.q_len, window, a.max_seq_len)})
    return a, kv, layers, error_flag(device)


def run_chain(device, log) -> list[dict]:
    rows = []
    for spec in CHAIN_CASES:
        rows.append(_chain_case(device, spec, log))
        torch.cuda.empty_cache()
    return rows


def _chain_case(device, spec, log) -> dict:
    from muse_ops.cutedsl.dev import launch_attn2, launch_qkv_front
    a, kv, layers, err = _stack(device, spec)

    def front(layer, over):
        launch_qkv_front(layer["x"], layer["w"], layer["pos"], layer["slots"], layer["cos_sin"], kv.kv_cache,
                         layer["y"], err, override=over)

    def attn(layer, over):
        c = layer["cfg"]
        launch_attn2(layer["y"], kv.kv_cache, layer["table"], kv.seq_lens, layer["out"], layer["ws"], err,
                     q_len=c.q_len, window=c.window, scale=c.scale, max_seq_len=c.max_seq_len, override=over)

    def stack(front_over, attn_over):
        def fn(_):
            for layer in layers:
                front(layer, front_over)
                attn(layer, attn_over)
        return fn
    off = {"pdl": False}
    per_layer = lambda fn: T.graph_time_us(fn, 1, min_calls=1)["us"] / LAYERS  # noqa: E731
    res = {"stack_pdl": per_layer(stack(None, None)),
           "stack_no_pdl": per_layer(stack(off, off)),
           "stack_pdl_front_only": per_layer(stack(None, off)),
           "stack_pdl_attn_only": per_layer(stack(off, None)),
           # attn2's early CTAs as many an SM as fit on the SMs qkv_front leaves free
           "stack_no_caps": per_layer(stack(None, {"ctas_per_sm": 0})),
           # qkv_front streams its weight early but lets attn2 launch only when its last CTA exits, so
           # attn2's CTAs are placed on a GPU qkv_front has left, not packed on the SMs it leaves free
           "stack_no_front_trigger": per_layer(stack({"trigger": False}, {"ctas_per_sm": 0})),
           "qkv_front_alone": T.graph_time_us(lambda i: front(layers[i], off), LAYERS)["us"],
           "attn2_alone": T.graph_time_us(lambda i: attn(layers[i], off), LAYERS)["us"]}
    res["alone"] = res["qkv_front_alone"] + res["attn2_alone"]
    log(f"  chain {a.name:20s} stack {res['stack_pdl']:.2f} us/layer (no PDL {res['stack_no_pdl']:.2f}, "
        f"PDL on qkv_front only {res['stack_pdl_front_only']:.2f}, on attn2 only {res['stack_pdl_attn_only']:.2f}, "
        f"no occupancy caps {res['stack_no_caps']:.2f}, "
        f"no qkv_front trigger {res['stack_no_front_trigger']:.2f}), "
        f"alone {res['qkv_front_alone']:.2f} + {res['attn2_alone']:.2f} = {res['alone']:.2f}")
    return {"case": a.name, "layers": LAYERS, **res}


def format_chain(rows) -> str:
    lines = [f"### layer stack: the PDL chain ({rows[0]['layers'] if rows else LAYERS} layers in one graph, us per layer)",
             "| case | stack, PDL | no PDL | PDL on qkv_front only | PDL on attn2 only | no occupancy caps | "
             "no qkv_front trigger, no caps | qkv_front alone | attn2 alone | alone, sum | sum / stack |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['stack_pdl']:.1f} | {r['stack_no_pdl']:.1f} | "
                     f"{r['stack_pdl_front_only']:.1f} | {r['stack_pdl_attn_only']:.1f} | "
                     f"{r.get('stack_no_caps', float('nan')):.1f} | "
                     f"{r.get('stack_no_front_trigger', float('nan')):.1f} | {r['qkv_front_alone']:.1f} | "
                     f"{r['attn2_alone']:.1f} | {r['alone']:.1f} | {r['alone'] / r['stack_pdl']:.2f} |")
    return "\n".join(lines)
