"""examples/speculative_verify.py: a few layers in a speculative-verify loop under torch.compile,
requests joining and leaving through muse_ops.PageAllocator; compiled once (the batch is padded
to a fixed size), and the compiled step agrees with the eager one. CPU (reference) here; the GPU
run carries the gpu marker."""
import pytest
import torch

from scenario import load_example


def _example():
    return load_example("speculative_verify")


def _run(device):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert _example().run(device=device, layers=2, steps=4, batch=3)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1, "the step recompiled"


def test_example_verify_loop_cpu():
    _run("cpu")


@pytest.mark.gpu
def test_example_verify_loop_gpu():
    _run("cuda")
