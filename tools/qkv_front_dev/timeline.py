"""Where a qkv_front call spends its time: %globaltimer stamps per CTA, for back-to-back calls in
one CUDA graph (development only; the package's kernel is not changed).

Two copies of muse_ops/cutedsl/qkv_front.py are written with stamp stores inserted at the
phase boundaries below (each copy stores to its own buffer, baked in as an address), and the
graph alternates them over rotating weight sets, so after a replay the two buffers hold the last
two calls. Stamps (one thread each, ns of the global timer; its tick is coarse, about 32 ns to a
microsecond by GPU):
  entry      thread 0 at the kernel's start
  wait       the producer warp's lane 0 past griddepcontrol.wait
  issued     the producer's last load issued
  first      consumer thread 0 past the first stage's full barrier
  loop_end   consumer thread 0 with every wgmma complete
  drained    thread 0 past the cluster barrier after the main loop
  pushed     thread 0 past the cluster barrier after the split-K push
  done       thread 0 at the end of its epilogue
The anchors are source lines of the kernel module; a missing anchor stops the tool (the kernel
changed: update the anchors). Env: TL_M (M values), TL_HKV, TL_CALLS (graph calls, even), TL_OUT.
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench import cases as C, timing as T  # noqa: E402
from muse_ops.cutedsl import launch as Q  # noqa: E402
from muse_ops.errors import error_flag  # noqa: E402

PHASES = ("entry", "wait", "issued", "first", "loop_end", "drained", "pushed", "done")
SLOTS = 16          # int64 per CTA: the phases, then the SM id
MAX_CTAS = 4096
SOURCE = os.path.join(os.getcwd(), "muse_ops", "cutedsl", "qkv_front.py")

HELPER = '''

STAMP_BASE = {base}


@cute.jit
def _stamp_value(slot: cutlass.Constexpr[int], value: Int64):
    """value into this CTA's stamp slot (tools/qkv_front_dev/timeline.py)."""
    bx, by, bz = cute.arch.block_idx()
    gx, gy, _ = cute.arch.grid_dim()
    cta = (Int64(bz) * gy + by) * gx + bx
    addr = Int64(STAMP_BASE) + (cta * {slots} + slot) * 8
    cute.arch.inline_ptx("st.global.u64 [{{$r0}}], {{$r1}};", read_only_args=[addr, value])


@cute.jit
def _stamp(slot: cutlass.Constexpr[int]):
    """The global timer into this CTA's stamp slot."""
    _stamp_value(slot, Int64(cute.arch.globaltimer()))
'''

# (anchor lines, text inserted after them at the first line's indentation, or before them with "<")
PATCHES = [
    ('        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())',
     'if tidx == 0:\n    _stamp(0)\n    _stamp_value(8, Int64(cute.arch.smid()))'),
    ('            cute.arch.griddepcontrol_wait()   # x is the previous kernel\'s output',
     'if cute.arch.lane_idx() == 0:\n    _stamp(1)'),
    ('    @cute.jit\n    def load_x(', None),   # the producer's loop ends right before this method
    ('            cute.arch.mbarrier_wait(full + s, (i // stages) % 2)',
     'if i == 0:\n    if wg_tidx + wg == 0:\n        _stamp(3)'),
    ('            acc = self.consume(sW, sX, full, empty, n_k, warp // 4, tidx % 128)',
     'if tidx == 0:\n    _stamp(4)'),
    ('            self.push_partial(acc, sL, warp // 4, tidx % 128, rank, split)',
     '<if tidx == 0:\n    _stamp(5)'),
    ('        cute.arch.cluster_wait()\n        if warp < self.producer_warp:',
     None),
    ('                self.reduce_and_store(sL, sSlot, sPos, mCS, mCache, mY, mErr, split, rank, head_group, tile, tidx)',
     'if tidx == 0:\n    _stamp(7)'),
]


def indent_of(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def patched_source(base: int) -> str:
    src = open(SOURCE).read()
    for anchor, text in PATCHES:
        if src.count(anchor) != 1:
            raise SystemExit(f"timeline: anchor not found exactly once (the kernel changed): {anchor!r}")
        if text is None:
            continue
        before = text.startswith("<")
        text = text.lstrip("<")
        pad = indent_of(anchor.splitlines()[0])   # a call continued on a second line: its first line's
        block = "\n".join(pad + t for t in text.splitlines())
        src = src.replace(anchor, (block + "\n" + anchor) if before else (anchor + "\n" + block))
    # the producer's last load: after its refill loop, i.e. right before load_x's definition
    anchor = '    @cute.jit\n    def load_x('
    src = src.replace(anchor, '        if cute.arch.lane_idx() == 0:\n            _stamp(2)\n\n' + anchor)
    # the cluster barrier after the push: stamp once it is passed
    anchor = '        cute.arch.cluster_wait()\n        if warp < self.producer_warp:'
    src = src.replace(anchor, '        cute.arch.cluster_wait()\n        if tidx == 0:\n            _stamp(6)\n'
                              '        if warp < self.producer_warp:')
    marker = '\n\nclass QkvFrontSm90:'
    return src.replace(marker, HELPER.format(base=base, slots=SLOTS) + marker, 1)


def summary(stamps: torch.Tensor, ctas: int, t0: int) -> list[str]:
    rows = []
    for k, name in enumerate(PHASES):
        v = [(int(s) - t0) / 1e3 for s in stamps[:ctas, k].tolist() if s != 0]
        if not v:
            rows.append(f"  {name:9s} (none)")
            continue
        q = statistics.quantiles(v, n=10) if len(v) > 1 else [v[0]] * 9
        rows.append(f"  {name:9s} min {min(v):7.2f}  p10 {q[0]:7.2f}  med {statistics.median(v):7.2f}  "
                    f"p90 {q[8]:7.2f}  max {max(v):7.2f} us  ({len(v)} CTAs)")
    return rows


def main():
    out_dir = os.environ.get("TL_OUT", "/tmp/qkv_timeline")
    os.makedirs(out_dir, exist_ok=True)
    ms = [int(v) for v in os.environ.get("TL_M", "1,8,16").split(",")]
    kv_heads = int(os.environ.get("TL_HKV", "2"))
    calls = int(os.environ.get("TL_CALLS", "8"))
    dev = torch.device("cuda")
    err = error_flag(dev)
    buf = torch.zeros(2, MAX_CTAS * SLOTS, dtype=torch.int64, device=dev)
    copies = []
    for c in range(2):
        path = os.path.join(out_dir, f"qkv_front_stamps_{c}.py")
        with open(path, "w") as f:
            f.write(patched_source(buf[c].data_ptr()))
        copies.append(Q.kernel_copy(path))
    lines = []
    for m in ms:
        case = C.QkvCase(m, kv_heads=kv_heads)
        inp = C.build_qkv(case, dev, T.l2_bytes(dev))
        n = inp.weights[0].shape[0]
        ys = [torch.empty(m, n, dtype=torch.bfloat16, device=dev) for _ in range(inp.sets)]

        def run(i, kernel=None):
            Q.launch_qkv_front(inp.xs[i], inp.weights[i], inp.positions[i], inp.slots[i], inp.cos_sin,
                               inp.kv_cache, ys[i], err, _kernel=kernel)
            return ys[i]
        ref = run(0).clone()
        for c in range(2):
            same = torch.equal(run(0, copies[c]).view(torch.int16), ref.view(torch.int16))
            lines.append(f"M={m} copy {c}: same bits as the package's kernel: {same}")
        cfg = Q.qkv_front_launch_config(m, kv_heads, True, inp.positions[0].dtype, inp.slots[0].dtype)
        from muse_ops.cutedsl.qkv_front_plan import heads, k_split
        ctas = k_split(kv_heads) * -(-m // cfg.token_tile) * (heads(kv_heads) // cfg.heads_per_cta)
        graph, n_calls = T.capture_calls(lambda i: run(i % inp.sets, copies[i % 2]), max(calls, 2 * inp.sets))
        plain, plain_calls = T.capture_calls(lambda i: run(i % inp.sets), max(calls, 2 * inp.sets))
        t_stamped = T.time_graph_us(graph, n_calls, inp.sets, replays=15)["us"]
        t_plain = T.time_graph_us(plain, plain_calls, inp.sets, replays=15)["us"]
        buf.zero_()
        graph.replay()
        torch.cuda.synchronize()
        st = buf.view(2, MAX_CTAS, SLOTS).cpu()
        last = (n_calls - 1) % 2
        prev = 1 - last
        t0 = int(st[prev, :ctas, 0][st[prev, :ctas, 0] > 0].min())
        lines.append(f"M={m} Hkv={kv_heads} tile {cfg.token_tile}x{cfg.heads_per_cta} {ctas} CTAs: per call "
                     f"{t_stamped:.2f} us stamped, {t_plain:.2f} plain; us from the previous call's first entry")
        lines.append(" previous call:")
        lines += summary(st[prev], ctas, t0)
        lines.append(" last call:")
        lines += summary(st[last], ctas, t0)
        sms = sorted(set(st[last, :ctas, 8].tolist()))
        lines.append(f" last call on {len(sms)} SMs; its CTAs entered from the previous call's last 'done' "
                     f"+ {(int(st[last, :ctas, 0].min()) - int(st[prev, :ctas, 7].max())) / 1e3:.2f} us")
        torch.save({"m": m, "ctas": ctas, "stamps": st[:, :ctas].clone()}, os.path.join(out_dir, f"stamps_m{m}.pt"))
        print("\n".join(lines[-(2 * len(PHASES) + 5):]), flush=True)
        del graph, plain, inp, ys
        torch.cuda.empty_cache()
    lines.append(f"error flag {int(err.item())}")
    with open(os.path.join(out_dir, "timeline.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])


if __name__ == "__main__":
    main()
