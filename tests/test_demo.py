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


def test_cli_errors_on_a_cpu_only_torch_are_one_line():
    """demo --device cuda (and the example) on a torch without CUDA: one line, no traceback;
    demo --backend cutedsl on a CPU fails before printing any backend."""
    import torch
    if torch.cuda.is_available():
        return
    res = _cli("demo", "--device", "cuda")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "sees no CUDA GPU" in res.stderr
    res = _cli("demo", "--device", "cpu", "--backend", "cutedsl", "--steps", "1")
    assert res.returncode == 2 and "cutedsl backend was requested but cannot run" in res.stderr
    assert "reference" not in res.stdout and "backends:" not in res.stdout
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, os.path.join(root, "examples", "speculative_verify.py"), "--device", "cuda"],
                         capture_output=True, text=True, timeout=300, cwd="/",
                         env=dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "sees no CUDA GPU" in res.stderr


def test_demo_runs_an_fp8_cache():
    res = _cli("demo", "--device", "cpu", "--steps", "1", "--cache-dtype", "fp8", "--k-scale", "0.5",
               "--v-scale", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fp8 cache (k_scale 0.5, v_scale 2.0)" in res.stdout and "demo: all checks passed" in res.stdout


def test_the_package_imports_nothing_outside_it():
    """No module of muse_ops imports the checkout's bench/ or tools/ (an installed wheel has
    neither); `python -m muse_ops bench` (__main__.py) is the one command that needs the
    checkout, and says so in one line where it is missing."""
    import ast
    from pathlib import Path
    package = Path(__file__).resolve().parents[1] / "muse_ops"
    for path in package.rglob("*.py"):
        if path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                assert name.split(".")[0] not in ("bench", "tools"), f"{path.name} imports {name}"
