"""pytest bench --benchmark-only: GPU benchmarks through pytest-benchmark (skipped without CUDA)."""
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: the benchmarks run on the GPU machine")
    for item in items:
        item.add_marker(skip)
