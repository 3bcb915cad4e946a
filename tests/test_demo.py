"""`python -m muse_ops demo` runs and its float64 check passes."""
import os
import subprocess
import sys


def test_demo_command_runs():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-m", "muse_ops", "demo", "--device", "cpu", "--steps", "2"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "demo: all checks passed" in res.stdout
    assert "attn2=reference" in res.stdout
