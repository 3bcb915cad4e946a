"""pytest bench --benchmark-only -k attn2: attn2 and its peers per bench case (bench/cases.py)."""
import pytest

from . import cases as C
from . import contenders as K
from ._pb import ident, run

CASES = [C.attn2_case(s) for s in C.ATTN2_CASES]
NAMES = [n for n in K.attn2_contenders("cuda") if n != K.MUSE_DEFAULT]   # (the default is muse:cutedsl's call)


@pytest.mark.parametrize("name", NAMES, ids=[ident(n) for n in NAMES])
@pytest.mark.parametrize("case", CASES, ids=[ident(c.name) for c in CASES])
def test_attn2(benchmark, case, name):
    run(benchmark, "attn2", case, C.build_attn2, name)
