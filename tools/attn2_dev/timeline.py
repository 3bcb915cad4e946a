"""Where a launch's time goes: per-CTA %globaltimer stamps (thread 0) at the kernel's phase
boundaries, from the last call of a CUDA graph (like run_dev.py's timing).

    python3 tools/attn2_dev/timeline.py make         # CPU: write .device/attn2_tl.py, an
                                                     # instrumented copy of muse_ops/cutedsl/attn2.py
    python3 tools/attn2_dev/timeline.py run          # device: print the phase table
env TLC: cases [(B, L, W), ...]; TLV: config overrides [{"layout": "wide"}, ...]; TL_SRC: the
kernel file to instrument (default muse_ops'); TL_OUT: the instrumented copy.
The copy is made by inserting stamps after anchor lines of attn2.py; an anchor that moved fails
loudly. The stamps live in an extra workspace region; %globaltimer ticks in 0.256 us steps on the
H200, so phases are also stamped in SM cycles (clock64, exact within a CTA); with %smid the run
shows which SMs host two working CTAs. The kernel is otherwise unchanged (a few % slower)."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
OUT_FILE = os.environ.get("TL_OUT", os.path.join(ROOT, ".device", "attn2_tl.py"))
NS = 32     # stamp slots per CTA: globaltimer in 0..15 (13: %smid), clock64 in 16..31
NAMES = {0: "start", 1: "L", 2: "pt+Q", 3: "kv0", 4: "loop", 8: "sync", 9: "sX", 10: "clbar1",
         11: "dsmem", 5: "clbar2", 12: "part", 6: "ticket", 7: "end"}
ORDER = [0, 1, 2, 3, 4, 8, 9, 10, 11, 5, 12, 6, 7]


def make():
    src = open(os.environ.get("TL_SRC", os.path.join(ROOT, "muse_ops", "cutedsl", "attn2.py"))).read()

    def rep(a, b):
        nonlocal src
        assert src.count(a) == 1, ("anchor moved", a[:70], src.count(a))
        src = src.replace(a, b)

    def st(i, ind):
        return (f"{ind}if tidx == 0:\n{ind}    dbg[cta_d, {i}] = cute.arch.globaltimer()\n"
                f"{ind}    dbg[cta_d, {16 + i}] = cute.arch.clock64()\n")
    rep("    return off, n_cnt, (off + 4 * nslot * cfg.mr * 2 + 4 * n_cnt + 15) // 16 * 16",
        "    return off, n_cnt, (off + 4 * nslot * cfg.mr * 2 + 8 * NSTAMP * num_requests * kv_heads"
        " * cfg.cs * cfg.cl_max + 4 * n_cnt + 15) // 16 * 16")
    rep("RESCALE_SLACK = 8.0", f"RESCALE_SLACK = 8.0\nNSTAMP = {NS}")
    rep("            L = mSeq[r]\n            bad_len",
        "            off_d = 4 * (R * hkv * self.SLOTS) * MR * (HEAD_DIM + 2)\n"
        "            dbg = cute.make_tensor(cute.recast_ptr(mWs.iterator + off_d, dtype=Int64),\n"
        "                                   cute.make_layout((R * hkv * self.CS * self.CL_MAX, NSTAMP), stride=(NSTAMP, 1)))\n"
        "            cta_d = (r * hkv + g) * (self.CS * self.CL_MAX) + s\n"
        + st(0, " " * 12) + "            if tidx == 0:\n                dbg[cta_d, 13] = Int64(cute.arch.smid())\n"
        + "            L = mSeq[r]\n            bad_len")
    rep("                if cl < n_cl:\n                    # every CTA",
        "                if tidx == 0:\n                    dbg[cta_d, 1] = cute.arch.globaltimer() + Int64(L - L)\n"
        "                    dbg[cta_d, 17] = cute.arch.clock64()\n"
        "                if cl < n_cl:\n                    # every CTA")
    a = "                    cute.arch.sync_threads()               # sQ, sPT and the mbarriers visible\n"
    rep(a, a + st(2, " " * 20))
    a = "                        cute.arch.mbarrier_wait(full + st, (k // NST) % 2)\n"
    rep(a, a + "                        if k == 0:\n" + st(3, " " * 28))
    a = "                    cute.arch.sync_threads()      # every wgmma read of the rings is done: reuse them\n"
    rep(a, st(4, " " * 20) + a + st(8, " " * 20))
    a = ("                    cute.arch.cluster_arrive()       # release my sX / sXm to the cluster\n"
         "                    cute.arch.cluster_wait()\n")
    rep(a, st(9, " " * 20) + a + st(10, " " * 20))
    a = "                    cute.arch.cluster_arrive_relaxed()\n"
    rep(a, st(11, " " * 20) + a)
    a = "                    writes_out = Int32(1)      # n_cl == 1"
    rep(a, st(5, " " * 20) + a)
    a = "                        cute.arch.sync_threads()\n                        if tidx == 0:\n                            old = "
    rep(a, "                        cute.arch.sync_threads()\n" + st(12, " " * 24)
        + "                        if tidx == 0:\n                            old = ")
    a = "                        writes_out = sFlag[0]\n"
    rep(a, a + st(6, " " * 24))
    a = "                        _epilogue(om, gt, mOut, row_g, qcol, m_act, CPTM, TPRM)\n"
    rep(a, a + st(7, " " * 20))
    os.makedirs(os.path.dirname(OUT_FILE), exist_ok=True)
    open(OUT_FILE, "w").write(src)
    print("wrote", OUT_FILE)


def probe(RD, B, L, W, over):
    """One case: time its graph, then read the stamps its last call left (run_dev's inputs)."""
    case = RD.build_case(B, L, W, over=over)
    us = RD.graph_us(case, replays=7)
    cfg = case.cfg
    hkv = case.y.shape[1] // 1152
    dbg_off = 4 * B * hkv * cfg.slots * cfg.mr * 66        # the stamps follow the partials
    n_dbg = B * hkv * cfg.cs * cfg.cl_max
    d = case.ws[dbg_off:dbg_off + 8 * NS * n_dbg].view(torch.int64).view(-1, NS).cpu()
    d = d[d[:, 0] > 0]
    t0 = d[:, 0].min().item()
    work = d[d[:, 4] > 0]
    line = (f"TL {str((B, L, W)):16s} {str(over):24s} graph {us:6.2f} us/call  span "
            f"{(d[:, 7].max().item() - t0) / 1e3:6.2f}  CTAs {len(d)} working {len(work)}\n   at (median/max us):")
    deltas, prev = "   phase (SM cycles from the previous stamp, median/max):", None
    for j in ORDER:
        col = work[:, j]
        if (col > 0).any():
            v = (col[col > 0].double() - t0) / 1e3
            line += f" {NAMES[j]} {v.median().item():.2f}/{v.max().item():.2f}"
            if prev is not None:
                ok = (work[:, prev] > 0) & (col > 0)
                dc = (work[ok, 16 + j] - work[ok, 16 + prev]).double()     # SM cycles, exact
                deltas += f" {NAMES[j]} {dc.median().item():.0f}/{dc.max().item():.0f}"
            prev = j
    print(line + "\n" + deltas, flush=True)
    # placement: SMs that host more than one working CTA, and the slowest CTAs with their SM
    sm = work[:, 13]
    per_sm = torch.bincount(sm, minlength=int(sm.max()) + 1)
    ids = d[:, 4] > 0
    idx = torch.nonzero(ids).flatten()
    print(f"   SMs used {int((per_sm > 0).sum())}, hosting 2+ working CTAs: {int((per_sm > 1).sum())}", flush=True)
    for col, name in ((4, "loop"), (7, "end")):
        v = work[:, col].clone()
        v[v == 0] = t0
        for i in torch.argsort(v, descending=True)[:4].tolist():
            row = work[i]
            ph = " ".join(f"{NAMES[j]} {(row[j].item() - t0) / 1e3:.2f}" for j in (0, 3, 4, 10, 11, 6, 7) if row[j] > 0)
            print(f"   slowest by {name}: cta {int(idx[i])} sm {int(row[13])} (x{int(per_sm[row[13]])}) {ph}", flush=True)


def run():
    os.environ["ATTN2_FILE"] = OUT_FILE      # run_dev times the instrumented copy
    sys.path.insert(0, HERE)
    import run_dev as RD
    for (B, L, W) in eval(os.environ.get("TLC", "[(1, 512, 0), (1, 8192, 0), (64, 8192, 0)]")):
        for over in eval(os.environ.get("TLV", "[{}]")):
            probe(RD, B, L, W, over)


if __name__ == "__main__":
    {"make": make, "run": run}[sys.argv[1]]()
