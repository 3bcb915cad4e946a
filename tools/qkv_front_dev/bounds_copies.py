"""Timing-only copies of the qkv_front kernel module, for the bounds table of the eleventh run
(bench/RESULTS-archive.md): each loads the first ring's worth of stages as the kernel does, then

    nox     stops loading x (the weights still stream)
    now     stops loading the weights (x still streams)
    noload  stops loading both (the producer only arrives on the full barriers)
    nomma   loads everything but issues no wgmma

Their outputs are wrong by design; time them with the epilogue off. One more copy is exact:

    tiled_weight  reads the weight's memory as [N/64][K/64][64][64] (each TMA box one contiguous
                  8 KB) through a 4-D tensor map over the same logical (N, K); time it with
                  ab.py's {"kernel": ..., "tile_weight": True}, which passes the weights so
                  (fifteenth run: same bits, no faster).

Run on the CPU machine:

    python tools/qkv_front_dev/bounds_copies.py          # writes tools/qkv_front_dev/_bounds/*.py

then on the device (tools/qkv_front_dev/device_ab.sh passes AB_SMALL to ab.py), e.g.

    AB_SMALL="{'epilogue': False};{'epilogue': False, 'kernel': 'tools/qkv_front_dev/_bounds/nomma.py'}"

The copies are made by replacing exact pieces of the committed kernel's text: when the kernel
changes there, this script fails on an assertion instead of writing a copy that times something
else. The output folder is ignored by git."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL = os.path.join(HERE, "..", "..", "muse_ops", "cutedsl", "qkv_front.py")
OUT = os.path.join(HERE, "_bounds")
MODES = ("nox", "now", "noload", "nomma")

# the producer's steady-state loop: the expect_tx and the copies of one stage
STEADY = """            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(
                    full + s, cutlass.min(n_k - i * tiles_per_stage, Int32(tiles_per_stage)) * step_bytes)
            for j in cutlass.range_constexpr(tiles_per_stage):
                if i * tiles_per_stage + j < n_k:
                    kt = kt_lo + i * tiles_per_stage + j
                    for h in cutlass.range_constexpr(heads):
                        cute.copy(tma_w, tWg[None, head_group * heads + h, kt],
                                  tWs[None, (s * tiles_per_stage + j) * heads + h],
                                  tma_bar_ptr=full + s)
                    self.load_x(tma_x, tXs, tXg, boxes, whole, tile, kt, s * tiles_per_stage + j, full + s)
"""
STEADY_BOUNDS = """            steady_bytes = step_bytes
            if const_expr(_BOUNDS == "nox"):
                steady_bytes = heads * HEAD_DIM * K_TILE * 2
            if const_expr(_BOUNDS == "now"):
                steady_bytes = step_bytes - heads * HEAD_DIM * K_TILE * 2
            if const_expr(_BOUNDS == "noload"):
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive(full + s)
            else:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(
                        full + s, cutlass.min(n_k - i * tiles_per_stage, Int32(tiles_per_stage)) * steady_bytes)
                for j in cutlass.range_constexpr(tiles_per_stage):
                    if i * tiles_per_stage + j < n_k:
                        kt = kt_lo + i * tiles_per_stage + j
                        if const_expr(_BOUNDS != "now"):
                            for h in cutlass.range_constexpr(heads):
                                cute.copy(tma_w, tWg[None, head_group * heads + h, kt],
                                          tWs[None, (s * tiles_per_stage + j) * heads + h],
                                          tma_bar_ptr=full + s)
                        if const_expr(_BOUNDS != "nox"):
                            self.load_x(tma_x, tXs, tXg, boxes, whole, tile, kt, s * tiles_per_stage + j, full + s)
"""
GEMM = """                    for kb in cutlass.range_constexpr(K_TILE // 16):
                        cute.gemm("""
GEMM_BOUNDS = """                    for kb in cutlass.range_constexpr(K_TILE // 16 if _BOUNDS != "nomma" else 0):
                        cute.gemm("""
CONSTANTS = '_INDEX = {"int32": Int32, "int64": Int64}\n'
WEIGHT_ATOM = """        tma_w, mW_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mW,"""
WEIGHT_ATOM_TILED = """        mW_tiled = cute.make_tensor(mW.iterator, cute.make_layout(   # memory [N/64][K/64][64][64]
            ((HEAD_DIM, mW.shape[0] // HEAD_DIM), (K_TILE, HIDDEN // K_TILE)),
            stride=((K_TILE, HIDDEN * HEAD_DIM), (1, HEAD_DIM * K_TILE))))
        tma_w, mW_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mW_tiled,"""


def copy_for(source: str, mode: str) -> str:
    for piece in (STEADY, GEMM, CONSTANTS):
        assert source.count(piece) == 1, f"the kernel no longer has this piece:\n{piece}"
    return (source.replace(STEADY, STEADY_BOUNDS).replace(GEMM, GEMM_BOUNDS)
            .replace(CONSTANTS, CONSTANTS + f'_BOUNDS = "{mode}"   # timing only: see tools/qkv_front_dev/bounds_copies.py\n'))


def tiled_weight_copy(source: str) -> str:
    assert source.count(WEIGHT_ATOM) == 1, f"the kernel no longer has this piece:\n{WEIGHT_ATOM}"
    return source.replace(WEIGHT_ATOM, WEIGHT_ATOM_TILED)


def main() -> int:
    source = open(KERNEL).read()
    os.makedirs(OUT, exist_ok=True)
    copies = {mode: copy_for(source, mode) for mode in MODES}
    copies["tiled_weight"] = tiled_weight_copy(source)
    for name, text in copies.items():
        path = os.path.join(OUT, f"{name}.py")
        with open(path, "w") as f:
            f.write(text)
        print(os.path.relpath(path, os.path.join(HERE, "..", "..")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
