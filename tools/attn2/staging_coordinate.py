"""Write a copy of attn2's kernel module whose FP8 staging ring is addressed by its (page, stage)
coordinate, for tools/attn2/fp8_candidates_device.sh to time and compare in bits against the
kernel (the forty-sixth session wrote it on the CPU; no device machine started that session).

    python3 tools/attn2/staging_coordinate.py [FILE]     (default build/attn2_coord.py)

The kernel's load_step names each TMA box's place in the ring by a page index, stage *
pages_per_step + p. The bf16 ring is one mode of pages, but the FP8 staging ring's layout is
(pages_per_step, stages), so CuTe divides the index back into a coordinate: in the SASS an 8-bit
div/mod per page, about a third of warp 0's refill (163 instructions between the step's S wgmma
and its wait, deep q_len 8, CPU ptxas). The copy passes the coordinate (p, stage) for FP8, the same
address by CuTe's colexicographic index map (linear stage * pages_per_step + p is (p, stage)):
the refill is 119 instructions, no FP8 CI variant spills, bf16 is untouched. If it gives the
kernel's bits and is no slower, the edit belongs in the kernel. The edit names the text it
replaces and fails if the kernel no longer holds it.
"""
import os
import sys

from step_parts import KERNEL, edited   # (this folder: the kernel's path and the anchored edit)

EDIT = ("            page = stage * pages_per_step + p\n",
        "            # the FP8 staging ring is (pages_per_step, stages): addressed by its coordinate\n"
        "            page = (p, stage) if const_expr(self.cfg.fp8) else stage * pages_per_step + p\n")


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join("build", "attn2_coord.py")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(edited(open(KERNEL).read(), [EDIT]))
    print(out)


if __name__ == "__main__":
    main()
