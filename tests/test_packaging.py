"""Packaging as a user meets it (CPU, offline, a few seconds):
- the README's set-up commands install torch only where none is importable, and their pip steps
  leave an installed torch alone, whatever its build (a CUDA build is simulated by a torch
  distribution record ahead of site-packages: pip resolves against it, nothing imports it);
- the version has one source, muse_ops.__version__, which setup.py reads and the installed
  distribution reports;
- the distribution's metadata carries no repository-relative URLs, and the README as its
  markdown long description."""
import email.parser
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import muse_ops

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# pip's words for "no candidate here": with --no-index only what is installed (or in a configured
# find-links folder) can satisfy a requirement, so an environment without the extras cannot resolve
OFFLINE_MISSES = ("No matching distribution found", "Could not find a version", "ResolutionImpossible")


def readme_commands() -> list[str]:
    """The bash blocks of the README's set-up section, in order (the demo's, then the tests')."""
    section = README.read_text().split("## A fresh machine", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    return commands


def steps(command: str) -> list[str]:
    """A one-line command as [step, operator, step, ...], split on the shell's && and ||."""
    return re.split(r"\s+(&&|\|\|)\s+", command.strip())


def torch_step(command: str) -> str:
    """The command's first step: install torch only where none is importable."""
    parts = steps(command)
    assert parts[0] == 'python -c "import torch" 2>/dev/null' and parts[1] == "||", parts[:2]
    assert parts[2].startswith("pip install torch==") and parts[3] == "&&", parts[2:4]
    return " ".join(parts[:3])


def pip_install_args(command: str) -> list[str]:
    """The arguments of the command's `pip install` steps other than the torch one."""
    parts = steps(command)[4:]
    return [shlex.split(p)[2:] for p in parts[::2] if p.startswith("pip install ")]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MUSE_OPS_BUILD_SHIMS", "PYTHONPATH")}
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


@pytest.mark.parametrize("which", [0, 1], ids=["demo", "tests"])
@pytest.mark.parametrize("torch_importable", [True, False], ids=["torch-installed", "no-torch"])
def test_readme_torch_step_installs_torch_only_where_none_is_importable(tmp_path, which, torch_importable):
    """The README's first step, run by bash as written, with `python` this interpreter and `pip` a
    stub that records its arguments: pip is not called where torch imports, and is asked for the
    pinned torch where it does not (a `torch` package that fails to import stands for none)."""
    step = torch_step(readme_commands()[which])
    bin_dir, log = tmp_path / "bin", tmp_path / "pip.log"
    bin_dir.mkdir()
    _executable(bin_dir / "python", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    _executable(bin_dir / "pip", f'#!/bin/sh\necho "$@" >> {shlex.quote(str(log))}\n')
    env = _env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    if not torch_importable:
        (tmp_path / "no_torch" / "torch").mkdir(parents=True)
        (tmp_path / "no_torch" / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
        env["PYTHONPATH"] = str(tmp_path / "no_torch")
    res = subprocess.run(["bash", "-c", step], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    if torch_importable:
        assert calls == [], f"`{step}` called pip although torch imports: {calls}"
    else:
        assert calls == ["install " + step.split("pip install ", 1)[1]], calls


@pytest.mark.parametrize("which", [0, 1], ids=["demo", "tests"])
@pytest.mark.parametrize("installed", [None, "2.13.0+cu130", "2.10.0+cu128"],
                         ids=["this-torch", "cuda-2.13", "cuda-2.10"])
def test_readme_pip_steps_keep_an_installed_torch(tmp_path, which, installed):
    """`pip install --dry-run --report` of the README's pip steps (`-e .`, `-e ".[cuda,test,bench]"`)
    in this environment, offline (--no-index, this environment's setuptools): pip plans to install
    muse_ops at muse_ops.__version__ and no torch, whether the installed torch is this one or a CUDA
    build of 2.13 or of an older release that satisfies torch>=2.9."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed: pip cannot build muse_ops' metadata offline "
                    "(without build isolation)")
    env = _env()
    if installed is not None:
        fake = tmp_path / "site" / f"torch-{installed}.dist-info"
        fake.mkdir(parents=True)
        (fake / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {installed}\n")
        (fake / "RECORD").write_text("")
        env["PYTHONPATH"] = str(tmp_path / "site")
        seen = subprocess.run([sys.executable, "-m", "pip", "show", "torch"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60).stdout
        if f"Version: {installed}" not in seen:
            pytest.skip(f"this pip does not take a torch record on PYTHONPATH for the installed torch "
                        f"(`pip show torch` says {seen.splitlines()[1:2]}): cannot simulate another build")
    for args in pip_install_args(readme_commands()[which]):
        report = tmp_path / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--report", str(report), "--quiet",
               "--no-index", "--no-build-isolation", *args]
        res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if res.returncode != 0 and any(m in res.stderr for m in OFFLINE_MISSES):
            last = res.stderr.strip().splitlines()[-1]
            pytest.skip(f"pip cannot resolve `pip install {shlex.join(args)}` offline (--no-index) "
                        f"in this environment: {last}")
        assert res.returncode == 0, res.stderr
        planned = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                   for item in json.loads(report.read_text())["install"]}
        assert "torch" not in planned, (
            f"`pip install {shlex.join(args)}` would replace torch {installed or 'as installed'} "
            f"with {planned['torch']}")
        assert planned.get("muse-ops") == muse_ops.__version__, planned


def _built_metadata(tmp_path) -> email.message.Message:
    """The METADATA setuptools builds from this checkout (PEP 517's prepare_metadata hook, in a
    fresh process that must not import torch: setup.py reads the version from the file)."""
    script = (
        "import sys\n"
        "from setuptools import build_meta\n"
        f"name = build_meta.prepare_metadata_for_build_wheel({str(tmp_path)!r})\n"
        "assert 'torch' not in sys.modules, 'setup.py imported torch'\n"
        "print(name)\n")
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    name = res.stdout.strip().splitlines()[-1]
    return email.parser.Parser().parsestr((tmp_path / name / "METADATA").read_text(encoding="utf-8"))


def test_version_has_one_source(tmp_path):
    """muse_ops.__version__ is the version setup.py builds and the installed distribution reports."""
    version = muse_ops.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?(a|b|rc|dev|post)\d+)*", version), version
    assert _built_metadata(tmp_path)["Version"] == version
    try:
        installed = importlib.metadata.version("muse_ops")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("muse_ops is not installed as a distribution here (only imported from the checkout)")
    assert installed == version, (f"the installed muse_ops says {installed}, the package {version}: "
                                  "reinstall it (pip install -e .)")


def test_metadata_has_no_relative_urls_and_carries_the_readme(tmp_path):
    """`pip show -v muse_ops` lists no repository-relative URL (every URL field absolute, and none
    today: the package has no public home page), and the long description is README.md as
    markdown, whose relative links a repository host resolves."""
    meta = _built_metadata(tmp_path)
    urls = [v.split(",", 1)[-1].strip() for v in meta.get_all("Project-URL", [])]
    urls += [v for key in ("Home-page", "Download-URL") for v in meta.get_all(key, []) if v.strip()]
    relative = [u for u in urls if not re.match(r"[a-z][a-z0-9+.-]*://", u)]
    assert not relative, f"repository-relative URLs in the metadata: {relative}"
    assert meta["Description-Content-Type"].startswith("text/markdown")
    description = meta.get_payload() or meta["Description"] or ""
    assert description.strip() == README.read_text(encoding="utf-8").strip()
    if importlib.util.find_spec("readme_renderer") is not None:   # what PyPI's upload check runs
        from readme_renderer.markdown import render
        assert render(description) is not None
