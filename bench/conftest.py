"""pytest bench --benchmark-only: GPU benchmarks through pytest-benchmark (skipped without CUDA)."""
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: the benchmarks run on the GPU machine")
    here = str(config.rootpath / "bench")
    for item in items:   # a conftest hook sees every item of the session: skip only the bench's own
        if str(item.path).startswith(here):
            item.add_marker(skip)
