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


def _cli(*args, env_extra=None):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "muse_ops", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd="/")


def test_cli_unknown_command_and_backend_errors_are_one_line():
    res = _cli("foo")
    assert res.returncode == 2 and "unknown command 'foo'" in res.stderr
    if not __import__("torch").cuda.is_available():
        res = _cli("demo", "--device", "cpu", "--steps", "1", env_extra={"MUSE_OPS_BACKEND": "cutedsl"})
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert res.stderr.strip().count("\n") == 0 and "cutedsl backend was requested but cannot run" in res.stderr
    res = _cli("bench", "--help")   # from outside the checkout
    assert res.returncode == 0 and "--budget-s" in res.stdout and "machine" not in res.stdout
