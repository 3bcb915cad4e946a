"""Write copies of attn2's kernel module with parts of the FP8 step taken out, for timing only (their
outputs are garbage): what each part of the step costs, as the forty-fifth session measured it
(bench/RESULTS.md). CPU or GPU; `tools/attn2/step_parts_device.sh` writes them and times them with
`tools/attn2/ab.py` in one call.

    python3 tools/attn2/step_parts.py [DIR]     (default build/; prints the files written)

The copies, each cumulative over the one before:
  noconv     no conversion and no CTA barrier in the FP8 step (the wgmmas read a stale f16 buffer)
  nosoftmax  also no masks and no online softmax (P is the raw logits)
  loads      also no wgmmas: a step waits for its stage (warp 0 alone, since nothing else keeps the
             warps in step) and refills it; the prologue, page table, merges and writes stay
             (launched with the override page_box, one 2 KB TMA box a page instead of a K and a
             V box of 1 KB: whether the boxes' shape or the tree's per-CTA costs hold the loads
             above the floor; step_parts_device.sh's "loads2k")
Each edit names the text it replaces and fails if the kernel no longer holds it: update the
anchors with the kernel.
"""
import os
import sys

KERNEL = os.path.join(os.path.dirname(__file__), "..", "..", "muse_ops", "cutedsl", "attn2.py")

NOCONV = [
    ("""        if const_expr(self.cfg.fp8):
            self.convert(k, stage, tail_lo)
            cute.arch.fence_view_async_shared()    # generic stores -> the wgmmas (async proxy)
            cute.arch.sync_threads()
""", """        if const_expr(self.cfg.fp8):
            pass   # STEP PARTS: no conversion, no barrier
"""),
    ("""            cute.arch.sync_threads()
            if const_expr(not self.cfg.refill_under_qk):""",
     """            if const_expr(not self.cfg.fp8):
                cute.arch.sync_threads()
            if const_expr(not self.cfg.refill_under_qk):"""),
]
NOSOFTMAX = NOCONV + [
    ("""            if real_rows != 0:
                mask.apply(tSrS, tScS, inv, kbase)
                chunk.update(tSrS, corr, scale_log2)
""", """            if const_expr(not self.cfg.fp8):   # STEP PARTS: no softmax
                if real_rows != 0:
                    mask.apply(tSrS, tScS, inv, kbase)
                    chunk.update(tSrS, corr, scale_log2)
"""),
]
LOADS = NOSOFTMAX + [
    ("""            if const_expr(self.cfg.refill_under_qk):
                wgmma_commit(atom_qk, tSrS, tSrQ, tSrK[None, None, None, mma_stage], True)""",
     """            if const_expr(self.cfg.fp8):
                ring.refill(k_next, steps.count)    # STEP PARTS: no wgmmas
            elif const_expr(self.cfg.refill_under_qk):
                wgmma_commit(atom_qk, tSrS, tSrQ, tSrK[None, None, None, mma_stage], True)"""),
    ("""            wgmma_group(atom_pv, tOrO, tOrP, tOrVt[None, None, None, mma_stage], False)
""", """            if const_expr(not self.cfg.fp8):
                wgmma_group(atom_pv, tOrO, tOrP, tOrVt[None, None, None, mma_stage], False)
"""),
    ("""        cute.arch.mbarrier_wait(self.full + stage, (k // self.cfg.stages) % 2)
        if const_expr(self.cfg.fp8):
            pass""", """        if const_expr(self.cfg.fp8):
            if self.warp == 0:    # STEP PARTS: warp 0 alone waits (nothing keeps the warps in step)
                cute.arch.mbarrier_wait(self.full + stage, (k // self.cfg.stages) % 2)
        else:
            cute.arch.mbarrier_wait(self.full + stage, (k // self.cfg.stages) % 2)
        if const_expr(self.cfg.fp8):
            pass"""),
]
COPIES = {"noconv": NOCONV, "nosoftmax": NOSOFTMAX, "loads": LOADS}


def edited(text: str, edits) -> str:
    """text with each (old, new) edit applied; old must occur exactly once (tools/attn2's copies)."""
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"the kernel holds {text.count(old)} copies of (update the edit):\n{old}")
        text = text.replace(old, new)
    return text


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "build"
    os.makedirs(out, exist_ok=True)
    source = open(KERNEL).read()
    for name, edits in COPIES.items():
        path = os.path.join(out, f"attn2_parts_{name}.py")
        with open(path, "w") as f:
            f.write(edited(source, edits))
        print(path)


if __name__ == "__main__":
    main()
