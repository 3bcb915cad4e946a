"""CPU: every attn2 CuTe DSL variant compiles for sm_90a against fake tensors (skips without cutlass)."""
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")


def test_compile_all_attn2_variants():
    from muse_ops.cutedsl import attn2 as A
    cfgs = A.compile_all_variants_for_ci(max_seq_lens=(2048, 262144))
    assert {(c.q_len, c.window > 0) for c in cfgs} == {(1, False), (1, True), (8, False), (8, True)}


def test_can_implement_never_raises_on_cpu():
    import torch
    from muse_ops.cutedsl import attn2 as A
    ok, why = A.can_implement(torch.device("cpu"), 2, 8, 0, 32768)
    assert not ok and why
