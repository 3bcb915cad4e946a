"""examples/tensor_parallel.py: a few layers sharded by heads over T ranks (torch.distributed),
requests joining and leaving: step after step, every layer's joined output equals the unfused layer
on one device (separate projections, RMS norms, RoPE, SDPA, o_proj, in float64) within the
contract's layer tolerance, each rank's cache holds that layer's keys and values of its heads, and
the run is bit-identical run to run and on every rank.

CPU: T = 2 and 4 over gloo on the reference backend. GPU: T = 2, 4 and 8 over NCCL on the kernels,
CUDA graphs with the all-reduce inside, where the machine has that many GPUs."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scenario import load_example


def _example():
    return load_example("tensor_parallel")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, world, port, device, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        example = _example()
        kw = dict(device=device, layers=2, steps=4, batch=3, total_kv=8 if device == "cuda" else 4, check=True,
                  log=lambda *_: None)
        first = example.run(rank, world, **kw)
        again = example.run(rank, world, **kw)       # fresh layers, caches and pools: the same bits
        for a, b in zip(first, again):
            assert torch.equal(a.cpu().view(torch.int16), b.cpu().view(torch.int16)), "not identical run to run"
        torch.save([t.cpu() for t in first], os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run_world(world, device, tmp_path):
    mp.spawn(_rank, args=(world, _free_port(), device, str(tmp_path)), nprocs=world, join=True)
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for r in range(1, world):
        for a, b in zip(outs[0], outs[r]):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"rank {r} holds other bits than rank 0"


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_cpu_matches_one_device(world, tmp_path):
    _run_world(world, "cpu", tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_tensor_parallel_gpu_matches_one_device(world, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs, this machine has {torch.cuda.device_count()}")
    _run_world(world, "cuda", tmp_path)
