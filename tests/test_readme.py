"""The README's Python examples run as written (every name defined), in order, on this machine."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run_as_written():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2, "the README lost its examples"
    namespace = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    out, same = namespace["out"], namespace["same"]
    assert out.shape == (24, 1024) and bool(same.eq(out).all())
