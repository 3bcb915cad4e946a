"""python -m muse_ops bench [--device cuda|cpu] [--quick | --suite fp8 | --suite serving] [--cache-dtype bf16,fp8] [--json PATH]
                          [--markdown PATH] [--cases ...] [--contenders ...] [--reverse-order]

The side-by-side table of docs/DESIGN.md section 14: each case timed by CUDA-graph replay over rotating
input sets (cold L2, see bench/timing.py and bench/cases.py), for every muse_ops backend and the
peers (bench/contenders.py), with the floors measured in the same run.

On a GPU (about 2-4 minutes on an H200):

    python -m muse_ops bench --json bench.json --markdown bench.md

--budget-s (default 0: none) stops starting new contenders after that many seconds and marks the
rest "skipped", for runs under a time limit; the JSON and markdown are saved after every case, so
a run cut short keeps its rows. Several JSON files (e.g. a rerun of skipped cases with --cases)
merge into one markdown section:

    python -m muse_ops bench --render bench.json [more.json] [--append bench/RESULTS.md]   (newest first)

--cases picks cases by name fragment (e.g. --cases "B=1 " "W=2048" "M=8" "fp8"); "attn2" / "qkv_front"
/ "layer" select a whole op. --quick: a few cases. On CPU (--device cpu) tiny cases run on the
reference with wall-clock timing, only to exercise this code (CI).

--cache-dtype (default bf16,fp8): the KV cache dtypes of the attn2 and layer cases, each case once
per dtype (an FP8 case's name ends in " fp8"; bench/cases.py says what its cache and scales hold;
its floor counts the KV at 1 byte per element). Where both ran, a table sets each FP8 row beside
its bf16 row (muse FP8 and its floor, muse bf16, the FP8 / bf16 speed-up, every FP8 peer) and the
KV capacity table (tokens per layer in 80 and 141 GB) follows. --suite fp8: issue 48's case list
(bench/cases.py FP8_ATTN2_CASES, bench/layer.py FP8_LAYER_CASES; no qkv_front, no chain);
tools/bench_fp8_device.sh runs it on the GPU machine. --suite serving: issue 49's case list
(bench/cases.py SERVING_QKV_CASES beside cuBLAS's matmul alone, bench/layer.py SERVING_LAYER_CASES;
no attn2, no chain).

On a GPU a case captures every contender's graph, then times them side by side in rotating order
(bench/timing.interleaved_us: one after another, a slot's reading depends on what ran before it);
--reverse-order builds and checks them last to first, ours last (how the thirty-eighth session
found the first slot reading low).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path

import torch

from . import cases as C
from . import chain as CH
from . import contenders as K
from . import fa3_peer, flashinfer_peer
from . import layer as LY
from . import timing as T

PEERS_ATTN2 = ("flashinfer+normgate", "fa4+normgate", "flex(paged)")   # flex(contig), fa3(contig) are bounds
PEERS_QKV = ("cublas+triton", "compile(ref)")   # "cublas" (the matmul alone) is a bound, not a peer path
BUILDERS = {"attn2": K.build_attn2_contender, "qkv_front": K.build_qkv_contender, "layer": LY.build_layer_contender}
TABLES = (("attn2", "attn2_names"), ("qkv_front", "qkv_names"), ("layer", "layer_names"))
UNCHECKED = ("fa4 (attn only)", "flashinfer (attn only)", "fa3(contig) (attn only)", "cublas")
OURS = ("muse:cutedsl", K.MUSE_DEFAULT, "muse:reference")   # "ours": the first of these with a time
# the FP8 table's peer columns (those of them in the run; its best-peer ratio reads the paged peers above)
FP8_PEERS = {"attn2": ("flashinfer+normgate", "flashinfer (attn only)", "fa3(contig)+normgate",
                       "fa3(contig) (attn only)"),
             "layer": ("stock", "stock(fa3)")}
CHECK_MAX_TOKENS = 1 << 21     # compare against the float64 evaluation up to this many cached tokens


def environment(device) -> dict:
    env = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
           "device": str(device)}
    try:
        import subprocess as sp
        # "-dirty" when the tree differs from HEAD (a copy of a working tree, as the GPU machine
        # gets, can carry a stale HEAD): the kernel-source fingerprint below names what ran
        env["commit"] = os.environ.get("MUSE_BENCH_COMMIT") or sp.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True,
            timeout=5).stdout.strip() or None
    except Exception:
        env["commit"] = None
    from muse_ops.cutedsl.compile_cache import source_fingerprint
    env["kernel_sources"] = source_fingerprint()   # hash of the kernel sources (no cutlass import)
    if torch.device(device).type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda,
                   l2_mib=round(T.l2_bytes(device) / 2**20, 1))
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except Exception:
            env["driver"] = None
    else:
        env.update(gpu=None, driver=None, cpu=platform.processor() or platform.machine())
    try:
        import cutlass
        from muse_ops.cutedsl.compile_cache import dsl_toolkit
        env["cutedsl"] = getattr(cutlass, "__version__", None)
        if env["cutedsl"] is None:
            from importlib.metadata import version
            env["cutedsl"] = version("nvidia-cutlass-dsl")
        env["cutedsl"] += f" ({dsl_toolkit()})"     # the CUDA toolkit flavor whose ptxas compiles
    except Exception as exc:
        env["cutedsl"] = f"absent ({type(exc).__name__})"
    from muse_ops.cutedsl import aot
    env["aot"] = aot.status()      # the ahead-of-time library in use (and the flavor it was built by), or why none
    env["fa4"] = K.fa4_version() or "absent"
    env["flashinfer"] = flashinfer_peer.version() or "absent"
    env["fa3"] = fa3_peer.version() or "absent"
    from . import stock_triton
    env["triton"] = stock_triton.TRITON_VERSION or "absent"
    return env


def _select(names, wanted):
    if not wanted:
        return names
    return [n for n in names if any(w in n for w in wanted)]


def _err(kind, out, ref):
    from muse_ops.testing import layer_tolerance_report, tolerance_report
    return (layer_tolerance_report if kind == "layer" else tolerance_report)(out, ref.double())


def run_case(kind, case, inp, names, device, cpu: bool, check: bool, ref_fn, log, deadline=None) -> dict:
    row = {"case": case.name, "bytes": case.bytes(), "sets": inp.sets, "note": inp.note, "results": {},
           "eager_us": {}, "check": {}, "cache_dtype": getattr(case, "cache_dtype", "bf16"),
           "base": getattr(case, "base_name", case.name), "ran": {}}
    row["flops"] = case.flops()
    # (bytes, FLOPs) per kernel: one kernel unless the case says otherwise (the layer's two)
    row["kernels"] = case.kernels() if hasattr(case, "kernels") else [(row["bytes"], row["flops"])]
    ref = None
    import time
    # (name, (graph, calls), fn) of each contender, timed side by side at the end; fn stays
    # referenced until then: a graph does not keep alive the tensors its closure owns (outputs,
    # workspaces), and once freed the next contender's allocations take their memory
    captured = []
    for name in names:
        if deadline is not None and time.perf_counter() > deadline:
            row["results"][name] = {"skipped": "time budget (--budget-s) spent: rerun with --cases"}
            log(f"  {case.name:28s} {name:18s} skipped: time budget")
            continue
        try:
            dup = K.duplicate_of(name, kind, case, device, names)
            if dup:
                raise K.Absent(dup)
            fn = BUILDERS[kind](name, inp, device)
            out = None
            if check and ref_fn is not None:
                if ref is None:
                    ref = ref_fn()
                out = fn(0)
                if name not in UNCHECKED:   # bounds that compute part of the op only
                    row["check"][name] = _err(kind, out, ref)
            if name.startswith("muse:"):   # which backend ran each op (muse_ops.last_backend)
                if out is None:
                    fn(0)
                row["ran"][name] = K.ran_backends(kind)
            if cpu:
                row["results"][name] = {"us": T.cpu_time_us(fn, inp.sets)}
                log(f"  {case.name:28s} {name:18s} {row['results'][name]['us']:10.2f} us")
            else:
                captured.append((name, T.capture_calls(fn, inp.sets), fn))
                if name.startswith("muse:"):
                    row["eager_us"][name] = T.eager_time_us(fn, inp.sets)
        except K.Absent as exc:
            row["results"][name] = {"absent": str(exc)}
            log(f"  {case.name:28s} {name:18s} absent: {exc}")
        except Exception as exc:  # a peer that fails is reported, the run goes on
            row["results"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            log(f"  {case.name:28s} {name:18s} ERROR {type(exc).__name__}: {str(exc)[:300]}")
            if os.environ.get("MUSE_BENCH_TRACE"):
                traceback.print_exc()
        finally:
            if not cpu:
                torch.cuda.synchronize()
    if captured:   # every contender's graph, in rotating order (T.interleaved_us says why)
        try:
            timed = T.interleaved_us([g for _, g, _ in captured], inp.sets)
        except Exception as exc:
            timed = [{"error": f"timing: {type(exc).__name__}: {str(exc)[:300]}"} for _ in captured]
        for (name, _, _), res in zip(captured, timed):
            row["results"][name] = res
            rounds = " ".join(f"{t:.2f}" for t in res.get("rounds", []))
            log(f"  {case.name:28s} {name:18s} {res.get('us', float('nan')):10.2f} us  (rounds {rounds})")
        del captured
        torch.cuda.synchronize()
    return row


def summarize(row, floors, peers) -> None:
    res = row["results"]
    ours = next((n for n in OURS if "us" in res.get(n, {})), None)
    row["ours"] = ours
    if floors:
        bw = row["bytes"] / (floors["hbm_tbps"] * 1e12) * 1e6
        row["floor_bw_us"] = bw
        row["floor_us"] = max(bw, floors["node_us"])
        if floors.get("tensor_tflops") and row.get("kernels"):
            row["bound_us"], row["bound_by"] = kernel_bound(row["kernels"], floors)
    if ours:
        o = res[ours]["us"]
        if floors:
            row["ours_over_floor"] = o / row["floor_us"]
            if "bound_us" in row:
                row["ours_over_bound"] = o / row["bound_us"]
        peer_times = [(res[p]["us"], p) for p in peers if "us" in res.get(p, {})]
        if peer_times:
            best, who = min(peer_times)
            row["best_peer"], row["best_peer_over_ours"] = who, best / o


def kernel_bound(kernels, floors) -> tuple[float, str]:
    """The time the op's kernels need one after another, each at the slower of moving its bytes
    at the measured copy bandwidth and doing its FLOPs at the measured matmul rate (at least one
    graph node), and which of the two bounds each kernel ("hbm" / "tensor", joined by "+")."""
    total, by = 0.0, []
    for nbytes, flops in kernels:
        hbm = nbytes / (floors["hbm_tbps"] * 1e12) * 1e6
        tensor = flops / (floors["tensor_tflops"] * 1e12) * 1e6
        total += max(hbm, tensor)
        by.append("hbm" if hbm >= tensor else "tensor")
    return max(total, floors["node_us"]), "+".join(by)


def ran_label(row, name) -> str:
    """What a muse contender ran, where its name does not say it: muse:default's backends
    ("reference", "qkv_front cutedsl, attn2 reference"); "" for muse:<backend> running that."""
    ran = {op: b for op, b in (row.get("ran", {}).get(name) or {}).items() if b}
    if not ran:
        return ""
    named = name.split(":", 1)[1] if name.startswith("muse:") else None
    if named != "default" and all(b == named for b in ran.values()):
        return ""
    if len(set(ran.values())) == 1:
        return next(iter(ran.values()))
    return ", ".join(f"{op} {b}" for op, b in ran.items())


def ours_cell(row) -> str:
    """"ours" of a row with what ran where it is not the CuTe DSL kernels ("412.0 (reference)",
    "88.1 (qkv_front cutedsl, attn2 reference)"); "absent" / "-" where no muse contender has a time."""
    o = row.get("ours") if row else None
    if not o:
        return "absent" if row and row.get("results") else "-"
    ran = {op: b for op, b in (row.get("ran", {}).get(o) or {}).items() if b}
    if not ran:
        ran = {"": o.split(":", 1)[1]}
    kinds = set(ran.values())
    if kinds == {"cutedsl"}:
        label = ""
    elif len(kinds) == 1:
        label = next(iter(kinds))
    else:
        label = ", ".join(f"{op} {b}" for op, b in ran.items())
    return f"{row['results'][o]['us']:.1f}" + (f" ({label})" if label else "")


def us_cell(row, name) -> str:
    v = row["results"].get(name, {})
    if "us" in v:
        label = ran_label(row, name)
        return f"{v['us']:.1f}" + (f" ({label})" if label else "")
    return "absent" if "absent" in v else ("error" if "error" in v else ("skipped" if "skipped" in v else "-"))


def format_table(rows, names, title) -> str:
    cell = us_cell
    head = ["case"] + names + ["floor us", "ours/floor", "bound us", "ours/bound", "best peer/ours", "eager ours us"]
    lines = [f"{title}", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        eager = r["eager_us"].get(r.get("ours") or "", None)
        lines.append("| " + " | ".join([r["case"]] + [cell(r, n) for n in names] + [
            f"{r['floor_us']:.1f}" if "floor_us" in r else "-",
            f"{r['ours_over_floor']:.2f}" if "ours_over_floor" in r else "-",
            f"{r['bound_us']:.1f} ({r['bound_by']})" if "bound_us" in r else "-",
            f"{r['ours_over_bound']:.2f}" if "ours_over_bound" in r else "-",
            f"{r['best_peer_over_ours']:.2f} ({r['best_peer']})" if "best_peer_over_ours" in r else "-",
            f"{eager:.1f}" if eager is not None else "-"]) + " |")
    return "\n".join(lines)


def fp8_pairs(rows) -> list[tuple[dict | None, dict]]:
    """(bf16 row or None, FP8 row) per case of a table that has FP8 rows, in the table's order."""
    by_base = {}
    for r in rows:
        dtype = r.get("cache_dtype") or ("fp8" if r["case"].endswith(" fp8") else "bf16")
        base = r.get("base") or r["case"].removesuffix(" fp8")
        by_base.setdefault(base, {})[dtype] = r
    return [(d.get("bf16"), d["fp8"]) for d in by_base.values() if "fp8" in d]


def format_fp8_table(op: str, rows, names, title: str) -> str | None:
    """Each FP8 row beside its bf16 row: muse FP8 us (and what ran), its floor and ratio (the KV at
    1 byte per element), muse bf16 us and the speed-up bf16 / FP8, every FP8 peer's us in the run
    (the layer: the stock paths at bf16 too), the best paged peer / ours. None without FP8 rows."""
    pairs = fp8_pairs(rows)
    if not pairs:
        return None
    peers = [n for n in FP8_PEERS[op] if n in names]

    def ours_us(r):
        o = r.get("ours") if r else None
        return r["results"][o]["us"] if o else None

    def f(v, fmt="{:.1f}"):
        return fmt.format(v) if v is not None else "-"
    head = ["case", "muse FP8 us", "FP8 floor us", "FP8 ours/floor", "FP8 bound us", "muse bf16 us",
            "bf16 / FP8"] + [f"{n} FP8" for n in peers]
    if op == "layer":
        head += [f"{n} bf16" for n in peers]
    head += ["best paged peer / ours (FP8)"]
    lines = [title, "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b, r8 in pairs:
        o8, o16 = ours_us(r8), ours_us(b)
        cells = [r8.get("base") or r8["case"].removesuffix(" fp8"), ours_cell(r8),
                 f(r8.get("floor_us")), f(r8.get("ours_over_floor"), "{:.2f}"),
                 f"{r8['bound_us']:.1f} ({r8['bound_by']})" if "bound_us" in r8 else "-",
                 ours_cell(b) if b else "-", f"{o16 / o8:.2f}" if o16 and o8 else "-"]
        cells += [us_cell(r8, n) for n in peers]
        if op == "layer":
            cells += [us_cell(b, n) if b else "-" for n in peers]
        cells.append(f"{r8['best_peer_over_ours']:.2f} ({r8['best_peer']})" if "best_peer_over_ours" in r8 else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fp8_sections(result) -> list[str]:
    """The FP8 tables of a result (attn2, layer) and the KV capacity table, where it has FP8 rows."""
    out = []
    for op, key in (("attn2", "attn2_names"), ("layer", "layer_names")):
        t = format_fp8_table(op, result.get(op) or [], result.get(key) or [],
                             f"### {op}: FP8 cache beside bf16 (us)")
        if t:
            out.append(t)
    if out:
        out.append(C.format_kv_tokens_table(result.get("kv_tokens") or C.kv_tokens_table()))
    return out


def notes(result) -> list[str]:
    out = [
        "Times: median us per call over >= 20 CUDA-graph replays (after >= 30 ms of untimed ones), each "
        "replay running the op once per rotating input set (distinct KV pages / weight copies, together >= 4x L2) so the data comes from HBM, "
        f"the sets cycled to at least {T.MIN_CALLS} calls per graph so the graph-launch gap is amortised; "
        "the 'sets' note of each row says how many (one pool larger than L2 where several copies do not fit).",
        "floor us = max(bytes / measured HBM copy bandwidth, one CUDA-graph node); attn2 bytes = KV rows each "
        "request needs (window-limited) x Hkv x 256 B + y's q and gate columns + out + page-table entries; "
        "qkv_front bytes = weight + x + y + inserted cache rows.",
        "bound us: the op's kernels one after another, each at the slower of its bytes at the HBM copy "
        "bandwidth and its FLOPs at the measured bf16 matmul rate (the projection's 2 M N K; attn2's Q K^T "
        "and P V over the keys each row sees), named by which bounds each kernel (hbm / tensor; the layer: "
        "qkv_front+attn2, y written by one and read by the other). Where a kernel is tensor-bound the "
        "bytes floor is not reachable.",
        "ours = muse:cutedsl where it runs, else muse:reference. best peer/ours > 1: ours is faster. "
        "eager ours us: per-call time of back-to-back eager calls (host path included).",
        "fa4: flash_attn.cute.flash_attn_varlen_func, paged (page 16, own [pages,16,Hkv,64] K/V caches), causal, "
        "GQA packed, window (W-1, 0); on sm_90 FA4 has no split-KV (num_splits=1; its interface asserts on more), "
        "so one CTA walks a request's whole KV. fa4+normgate adds the Triton rms-norm x sigmoid(gate) kernel "
        "(bench/stock_triton.py); fa4 (attn only) is the attention alone.",
        "flex(paged): flex_attention under torch.compile (decode kernel, split KV), paged like torch's "
        "PagedAttention helper (physical [1,Hkv,pages*16,64] K/V, page-sized KV blocks, physical-to-logical "
        "mask_mod), norm x sigmoid(gate) fused by inductor; its block mask is built per step outside the timing. "
        "flex(contig): the same on contiguous per-request K/V gathered beforehand (block 128), an optimistic "
        "bound for Flex that no paged server gets; it is not counted as a peer in best peer/ours.",
        "flashinfer: FlashInfer 0.7.2 (kernels prebuilt for sm_90a) over its own contiguous HND [pages,Hkv,16,64] "
        "K/V caches: the fa2 prefill kernel, causal, for the verify block; its tensor-core decode for q_len 1; "
        "window_left W-1; planned once per case outside the timing (bench/flashinfer_peer.py). "
        "flashinfer+normgate adds the Triton norm-gate, flashinfer (attn only) is the attention alone.",
        "layer: one step of an attention layer, x -> out before o_proj (bench/layer.py). muse = "
        "MuseAttentionDecode.forward (qkv_front, attn2); stock = cuBLAS matmul, the Triton q/k-norm + RoPE + "
        "insert, FlashInfer, the Triton norm-gate, in one graph. Floor: weight + KV + x + out bytes. Full "
        "layers have no RoPE, sliding ones (W=2048) do. best peer/ours is stock/ours.",
        "cublas+triton: torch.matmul then the Triton q/k-norm + RoPE + cache-insert kernel (in place). "
        "cublas: torch.matmul alone (the projection without its epilogue), a bound that is not counted as a peer. "
        "qkv_front cases run a sliding layer's front (RoPE on); Hkv 2 unless the case names another.",
    ]
    if any(fp8_pairs(result.get(op) or []) for op in ("attn2", "layer")):
        ks, vs = C.fp8_scales(4)
        out += [
            "FP8 rows (case name ending in fp8): a float8_e4m3fn KV cache holding e4m3(x / scale), x ~ N(0,1); "
            f"k_scale one value for the tensor ({ks[0]:.5f} = 6/448), v_scale one per KV head "
            f"({', '.join(f'{v:.5f}' for v in vs)} cycling = 5-8/448): every dequantized value N(0,1)-like and "
            "no scale 1. Their floor and bound count the KV rows (and the layer's inserted rows) at 1 byte per "
            "element, plus the scales; bf16 / FP8 is muse's bf16 time over its FP8 time on the same case. "
            "muse:default is muse with no backend named (what ran: in brackets, from muse_ops.last_backend; "
            "absent where a muse:<backend> of the run times the same call).",
            "FlashInfer FP8: the same prebuilt fa2 kernels (verify) and tensor-core decode on e4m3 HND K/V, bf16 q "
            "and o, its k_scale (one float, folded into sm_scale) and v_scale (a [Hq, 1] tensor: FlashInfer's own "
            "`out *= v_scale` after the kernel, timed); no window (no e4m3 sliding-window kernel prebuilt for "
            "sm_90a). The stock FP8 layer inserts with the Triton kernel's quantizing variant (e4m3(k'/k_scale), "
            "e4m3(v/v_scale), the bytes of torch's conversion).",
            "fa3(contig): FlashAttention-3's forward (fa3-fwd wheel: paged KV and local attention compiled out) on "
            "contiguous per-request K/V [B, Lmax, Hkv, 64] with cache_seqlens, causal, num_splits by its heuristic; "
            "FP8 as SGLang runs it: q, k, v in e4m3 with q_descale (ones), k_descale, v_descale per request and KV "
            "head, q cast per call in +normgate and beforehand in (attn only). No paging, so a bound for FA3 like "
            "flex(contig), not counted in best peer / ours; stock(fa3) is the stock layer with it.",
            f"KV capacity: a GPU's memory as marketed taken in GiB (the H100's 80 GB are 80 GiB), "
            f"{C.KV_FRACTION:.0%} of it for the KV cache, all of it one layer's, per rank: tokens = bytes / "
            "(Hkv x 128 x element size); a model of n attention layers holds 1/n of that per layer.",
        ]
    if result.get("device_type") == "cpu":
        out.insert(0, "CPU run: tiny cases on the reference, wall-clock; exercises the code only.")
    return out


def merge_rows(rows: list, more: list, commit) -> list:
    """Rows of `more` join `rows`; a case present in both keeps its first measurements and takes from
    the later run only the contenders that have no time yet (a rerun of failed or skipped ones)."""
    by_case = {r["case"]: r for r in rows}
    out = list(rows)
    for r in more:
        old = by_case.get(r["case"])
        if old is None:
            out.append(r)
            continue
        filled = [n for n, v in r["results"].items() if "us" in v and "us" not in old["results"].get(n, {})]
        for n in filled:
            old["results"][n] = r["results"][n]
            if n in r.get("check", {}):
                old.setdefault("check", {})[n] = r["check"][n]
        if filled:
            old["note"] += f"; {', '.join(filled)} from a rerun at commit {commit}"
    return out


def render_markdown(result: dict) -> str:
    env = result["env"]
    fl = result.get("floors") or {}
    lines = [f"## {env.get('date')} — {env.get('gpu') or env.get('device')}", "",
             f"GPU {env.get('gpu')}, driver {env.get('driver')}, CUDA {env.get('cuda')}, torch {env.get('torch')}, "
             f"CuTe DSL {env.get('cutedsl')}, FA4 {env.get('fa4')}, FlashInfer {env.get('flashinfer')}, "
             f"FA3 {env.get('fa3', 'absent')}, Triton {env.get('triton')}, "
             f"commit {env.get('commit')}, kernel sources {env.get('kernel_sources')}, "
             f"ahead-of-time library {env.get('aot', 'not recorded')}.", ""]
    if fl:
        rate = f"; bf16 matmul {fl['tensor_tflops']:.0f} TFLOPS" if fl.get("tensor_tflops") else ""
        lines += [f"Measured: HBM copy {fl['hbm_tbps']:.2f} TB/s{rate}; one CUDA-graph node {fl['node_us']:.2f} us.", ""]
    for op, key in TABLES:
        names = result.get(key)
        if result.get(op):
            lines += [format_table(result[op], names, f"### {op} (us)"), ""]
            bad = [(r["case"], n) for r in result[op] for n, c in r.get("check", {}).items() if not c["ok"]]
            if bad:
                lines += [f"Outside the tolerance of docs/DESIGN.md section 9 (vs float64): {bad}", ""]
            elif not any(r.get("check") for r in result[op]):
                lines += ["No output was compared with the float64 evaluation in this run (--no-check).", ""]
            else:
                lines += ["Every checked contender's output is within docs/DESIGN.md section 9's tolerance of the "
                          "float64 evaluation (the bounds, fa4 (attn only), flashinfer (attn only), fa3(contig) (attn "
                          "only) and cublas, compute part of the op and are not checked).", ""]
            errs = [(r["case"], n, v.get("absent") or v.get("error") or v.get("skipped")) for r in result[op]
                    for n, v in r["results"].items() if "us" not in v]
            seen = set()
            for case, n, why in errs:
                if (n, why) not in seen:
                    seen.add((n, why))
                    lines.append(f"- {n}: {why} (first at {case})")
            if errs:
                lines.append("")
            lines += [f"- {r['case']}: {r['note']}" for r in result[op]] + [""]
    for t in fp8_sections(result):
        lines += [t, ""]
    if result.get("chain"):
        lines += [CH.format_chain(result["chain"]), "", CH.__doc__.split("\n\n")[1].replace("\n", " "), ""]
    lines += ["Notes:", ""] + [f"- {n}" for n in notes(result)] + [""]
    return "\n".join(lines)


def add_newest_run(path: Path, section: str) -> None:
    """Put a dated section into a results file whose runs go newest first (bench/RESULTS.md):
    before its first dated section ("## 2..."), or at the end where it has none."""
    lines = path.read_text().split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("## 2")), None)
    if at is None:
        path.write_text("\n".join(lines).rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n")
    else:
        path.write_text("\n".join(lines[:at] + section.rstrip("\n").split("\n") + [""] + lines[at:]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m muse_ops bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--quick", action="store_true", help="a few cases")
    ap.add_argument("--suite", choices=("fp8", "serving"), default=None,
                    help="a named case list: fp8 = issue 48's attn2 and layer cases (no qkv_front, no chain); "
                         "serving = issue 49's qkv_front and layer cases (no attn2, no chain)")
    ap.add_argument("--cache-dtype", default="bf16,fp8",
                    help="KV cache dtypes of the attn2 and layer cases, comma-separated: bf16, fp8 (default both)")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--markdown", default=None, help="write the dated RESULTS.md section here")
    ap.add_argument("--cases", nargs="*", default=None, help="case-name fragments, or attn2 / qkv_front / layer")
    ap.add_argument("--contenders", nargs="*", default=None, help="contender-name fragments")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop starting new contenders after this many seconds and mark the rest skipped "
                         "(0: no limit)")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the float64 evaluation")
    ap.add_argument("--reverse-order", action="store_true",
                    help="build, check and capture each case's contenders last to first (ours last; they are "
                         "then timed side by side in rotating order; the tables keep their columns)")
    ap.add_argument("--render", nargs="*", default=None, help="render JSON result(s) as one markdown section (no run)")
    ap.add_argument("--append", default=None,
                    help="with --render: add the section to this file as its newest run (above its first dated one)")
    a = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731

    if a.render:
        parts = []
        for path in a.render:
            with open(path) as f:
                parts.append(json.load(f))
        merged = parts[0]
        for p in parts[1:]:  # e.g. `--cases attn2` and `--cases qkv_front` run as two commands
            for op, names in TABLES:
                if merged.get(op) and merged.get(names):   # the first run's columns, then the others' new ones
                    merged[names] = merged[names] + [n for n in p.get(names) or [] if n not in merged[names]]
                else:
                    merged[names] = p.get(names)
                merged[op] = merge_rows(merged.get(op, []), p.get(op, []), p["env"].get("commit"))
            merged["chain"] = merged.get("chain") or p.get("chain")
        if not merged["env"].get("commit"):  # the GPU machine's copy has no .git: stamp the rendering checkout's
            try:
                c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                   timeout=5).stdout.strip()
                merged["env"]["commit"] = f"{c} (checkout that rendered it)" if c else None
            except Exception:
                pass
        md = render_markdown(merged)
        if a.append:
            add_newest_run(Path(a.append), md)
        else:
            print(md)
        return 0

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cpu = device.type == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("muse_ops bench: CUDA requested but not available", file=sys.stderr)
        return 2
    import muse_ops  # noqa: F401  registers the ops

    ops = {"attn2", "qkv_front", "layer", "chain"}
    wanted = a.cases
    if wanted:
        ops_named = ops.intersection(wanted)
        frag = [w for w in wanted if w not in ops]
        if ops_named and not frag:
            ops, wanted = ops_named, None
        elif ops_named:
            ops = ops_named
            wanted = frag
    try:
        dtypes = C.parse_cache_dtypes(a.cache_dtype)
    except ValueError as exc:
        print(f"muse_ops bench: {exc}", file=sys.stderr)
        return 2
    if cpu:
        attn_specs, qkv_specs, layer_specs = C.QUICK_CPU_ATTN2, C.QUICK_CPU_QKV, C.QUICK_CPU_ATTN2[:1]
        ops.discard("chain")
    elif a.suite == "fp8":
        attn_specs, qkv_specs, layer_specs = C.FP8_ATTN2_CASES, [], LY.FP8_LAYER_CASES
        ops.discard("chain")
    elif a.suite == "serving":
        attn_specs, qkv_specs, layer_specs = [], C.SERVING_QKV_CASES, LY.SERVING_LAYER_CASES
        ops.discard("chain")
    elif a.quick:
        attn_specs, qkv_specs, layer_specs = C.QUICK_GPU_ATTN2, C.QUICK_GPU_QKV, LY.QUICK_GPU_LAYER
    else:
        attn_specs, qkv_specs, layer_specs = C.ATTN2_CASES, C.QKV_CASES, LY.LAYER_CASES
    # each attn2 / layer case once per cache dtype, side by side
    attn_cases = [C.attn2_case(s, d) for s in attn_specs for d in dtypes] if "attn2" in ops else []
    qkv_cases = [C.qkv_case(m) for m in qkv_specs] if "qkv_front" in ops else []
    layer_cases = [LY.layer_case(s, d) for s in layer_specs for d in dtypes] if "layer" in ops else []
    if wanted:
        attn_cases = [c for c in attn_cases if any(w in c.name for w in wanted)]
        qkv_cases = [c for c in qkv_cases if any(w in c.name for w in wanted)]
        layer_cases = [c for c in layer_cases if any(w in c.name for w in wanted)]

    env = environment(device)
    log(f"muse_ops bench on {env.get('gpu') or device}: torch {env['torch']}, CuTe DSL {env['cutedsl']}, "
        f"FA4 {env['fa4']}, FlashInfer {env['flashinfer']}, FA3 {env['fa3']}, Triton {env['triton']}; "
        f"cache dtypes {', '.join(dtypes)}")
    floors = None
    l2 = T.l2_bytes(device) if not cpu else 1
    if not cpu:
        floors = {"hbm_tbps": T.measure_hbm_tbps(device), "node_us": T.measure_graph_node_us(device),
                  "tensor_tflops": T.measure_tensor_tflops(device)}
        log(f"floors: HBM copy {floors['hbm_tbps']:.2f} TB/s, bf16 matmul {floors['tensor_tflops']:.0f} TFLOPS, "
            f"one graph node {floors['node_us']:.2f} us, "
            f"L2 {l2 / 2**20:.0f} MiB")
    check = not a.no_check
    attn_names = K.attn2_contenders(device)
    qkv_names = K.qkv_contenders(device)
    layer_names = LY.layer_contenders(device)
    if a.contenders:
        attn_names = [n for n in attn_names if any(w in n for w in a.contenders)]
        qkv_names = [n for n in qkv_names if any(w in n for w in a.contenders)]
        layer_names = [n for n in layer_names if any(w in n for w in a.contenders)]
    result = {"env": env, "floors": floors, "device_type": device.type, "attn2_names": attn_names,
              "qkv_names": qkv_names, "layer_names": layer_names, "attn2": [], "qkv_front": [], "layer": [],
              "chain": [], "cache_dtypes": dtypes, "kv_tokens": C.kv_tokens_table()}

    from muse_ops.testing import attn2_f64, qkv_front_f64
    import time
    t_start = time.perf_counter()
    deadline = None if a.budget_s <= 0 else t_start + a.budget_s

    def save():  # after every case, so a run cut short still leaves its rows under $OUT
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
        if a.markdown:
            os.makedirs(os.path.dirname(os.path.abspath(a.markdown)), exist_ok=True)
            with open(a.markdown, "w") as f:
                f.write(render_markdown(result))

    def out_of_time(op, case, names):
        if deadline is None or time.perf_counter() <= deadline:
            return False
        result[op].append({"case": case.name, "bytes": case.bytes(), "sets": 0, "note": "not run (time budget)",
                           "results": {n: {"skipped": "time budget (--budget-s) spent: rerun with --cases"}
                                       for n in names}, "eager_us": {}, "check": {}, "ran": {},
                           "cache_dtype": getattr(case, "cache_dtype", "bf16"),
                           "base": getattr(case, "base_name", case.name)})
        log(f"  {case.name:28s} skipped: time budget")
        return True

    def qkv_ref(case, inp):   # the float64 evaluation of set 0's y
        return lambda: qkv_front_f64(inp.xs[0], inp.weights[0], inp.positions[0], inp.cos_sin, case.kv_heads)

    def attn_ref(case, inp):
        if sum(case.lens) > CHECK_MAX_TOKENS:
            return None
        return lambda: attn2_f64(inp.ys[0], inp.kv_cache, inp.page_tables[0], inp.seq_lens,
                                 q_len=case.q_len, window=case.window, scale=case.scale, k_scale=inp.k_scale,
                                 v_scale=inp.v_scale)

    def layer_ref(case, inp):
        if sum(case.attn.lens) > CHECK_MAX_TOKENS:
            return None
        return LY.layer_reference(inp)

    for op, op_cases, names, build, ref_for, peers in (
            ("qkv_front", qkv_cases, qkv_names, C.build_qkv, qkv_ref, PEERS_QKV),
            ("attn2", attn_cases, attn_names, C.build_attn2, attn_ref, PEERS_ATTN2),
            ("layer", layer_cases, layer_names, LY.build_layer, layer_ref, LY.PEERS_LAYER)):
        for case in op_cases:
            log(f"[{time.perf_counter() - t_start:6.1f} s] {op} {case.name}")
            if out_of_time(op, case, names):
                continue
            inp = build(case, device, l2, sets=2 if cpu else None)
            order = names[::-1] if a.reverse_order else names
            row = run_case(op, case, inp, order, device, cpu, check, ref_for(case, inp), log, deadline)
            summarize(row, floors, peers)
            result[op].append(row)
            del inp
            if not cpu:
                torch.cuda.empty_cache()
            save()

    if "chain" in ops and (not wanted or any("chain" in w for w in a.cases)):
        log(f"[{time.perf_counter() - t_start:6.1f} s] chain")
        try:
            result["chain"] = CH.run_chain(device, log)
        except Exception as exc:
            log(f"  chain ERROR {type(exc).__name__}: {str(exc)[:300]}")
        save()
    log(f"[{time.perf_counter() - t_start:6.1f} s] done")
    print()
    for op, key in TABLES:
        if result[op]:
            print(format_table(result[op], result[key], f"{op} (us)"))
            print()
    for t in fp8_sections(result):
        print(t)
        print()
    if result["chain"]:
        print(CH.format_chain(result["chain"]))
        print()
    for op, _ in TABLES:
        for r in result[op]:
            for n, c in r["check"].items():
                if not c["ok"]:
                    print(f"CHECK FAILED {op} {r['case']} {n}: {c}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
