"""pytest bench --benchmark-only -k qkv_front: qkv_front and its peers per M."""
import pytest

from . import cases as C
from . import contenders as K
from ._pb import ident, run

CASES = [C.qkv_case(m) for m in C.QKV_CASES]
NAMES = K.qkv_contenders("cuda")


@pytest.mark.parametrize("name", NAMES, ids=[ident(n) for n in NAMES])
@pytest.mark.parametrize("case", CASES, ids=[ident(c.name) for c in CASES])
def test_qkv_front(benchmark, case, name):
    run(benchmark, "qkv_front", case, C.build_qkv, name)
