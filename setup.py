"""pip install -e .            the package (pure Python; runs on the reference backend anywhere)
pip install -e .[cuda]      + nvidia-cutlass-dsl and apache-tvm-ffi for the CuTe DSL kernels (sm_90)
pip install -e .[cuda13]    the same with the DSL's CUDA 13 toolkit too (used where the driver runs CUDA 13)
pip install -e .[test]      + what the test suite needs (pytest, hypothesis, triton for the stock-path tests)
pip install -e .[bench]     + pytest-benchmark (peers such as flash-attn-4 are optional)

The C++ ops (csrc_shims/: the public ops' CUDA kernels in C++, a few microseconds of host time a
call) are built where a C++ compiler, torch and apache-tvm-ffi are installed, either with
    python -m muse_ops build-shims                        (after any of the installs above), or
    MUSE_OPS_BUILD_SHIMS=1 pip install --no-build-isolation -e ".[cuda]"   (torch's CppExtension)
Without them everything works; the ops' host path is then Python (docs/DESIGN.md section 16).
"""
import os
import re
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# the C++ ops (the package library: muse_shims.cpp + muse_bindings.cpp) and the development
# library (muse_shims_dev.cpp), all with their shared header
SHIMS_SOURCES = ["csrc_shims/muse_shims.cpp", "csrc_shims/muse_bindings.cpp"]
SHIMS_FILES = [*SHIMS_SOURCES, "csrc_shims/muse_shims.h", "csrc_shims/muse_shims_dev.cpp"]
HERE = Path(__file__).parent


def _version() -> str:
    """The one version string, muse_ops.__version__, read from the file (importing the package here
    would import torch, which a build environment need not have)."""
    text = (HERE / "muse_ops" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"', text, flags=re.M)
    if found is None:
        raise RuntimeError("muse_ops/__init__.py has no line `__version__ = \"X.Y.Z\"`")
    return found.group(1)


class BuildPyWithShimsSource(build_py):
    """An installed package carries the C++ sources in muse_ops/csrc/, so that
    `python -m muse_ops build-shims` works where no checkout lies beside it (a wheel); an
    editable install reads the checkout's csrc_shims/ instead (muse_ops.cutedsl.shims.SOURCE_DIRS)."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "muse_ops" / "csrc"
        target.mkdir(parents=True, exist_ok=True)
        for source in SHIMS_FILES:
            shutil.copyfile(source, target / Path(source).name)


def _shims_extension() -> dict:
    """MUSE_OPS_BUILD_SHIMS=1: build the C++ ops (SHIMS_SOURCES) as muse_ops/_shims*.so with torch's
    CppExtension (no Python binding: the package loads it with torch.ops.load_library, so it does
    not link libtorch_python and a C++ program can load it too). Every build ships the source."""
    commands = {"build_py": BuildPyWithShimsSource}
    if os.environ.get("MUSE_OPS_BUILD_SHIMS") != "1":
        return {"cmdclass": commands}
    import tvm_ffi
    from torch.utils.cpp_extension import BuildExtension, CppExtension
    ext = CppExtension("muse_ops._shims", SHIMS_SOURCES, py_limited_api=True,
                       include_dirs=[tvm_ffi.libinfo.find_include_path()], extra_compile_args=["-O2", "-std=c++20"])
    return {"ext_modules": [ext], "cmdclass": {**commands, "build_ext": BuildExtension}}


setup(
    name="muse_ops",
    version=_version(),
    description="Fused attention ops (QKV front, paged verify/decode attention) of Muse Spark for Hopper GPUs",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    # no project_urls: the package has no public home page yet, and metadata URLs must be absolute
    # (README.md, docs/DESIGN.md and bench/RESULTS.md travel with every clone and sdist)
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Environment :: GPU :: NVIDIA CUDA",
    ],
    packages=find_packages(include=["muse_ops", "muse_ops.*"]),
    python_requires=">=3.10",
    # numpy: torch warns at import ("Failed to initialize NumPy") where it is missing
    install_requires=["torch>=2.9", "numpy"],
    extras_require={
        "cuda": ["nvidia-cutlass-dsl==4.8.1", "apache-tvm-ffi>=0.1.15"],
        # the same with the DSL's CUDA 13 toolkit beside its default CUDA 12 one: on a driver that
        # runs CUDA 13 the DSL compiles with CUDA 13's ptxas, which makes the FP8 attn2 variants
        # 3-11% faster (bench/RESULTS.md); elsewhere it keeps CUDA 12's
        "cuda13": ["nvidia-cutlass-dsl[cu13]==4.8.1", "apache-tvm-ffi>=0.1.15"],
        # triton runs the stock-path epilogues of tests/test_stock_triton.py (its interpreter on a CPU);
        # its wheels declare no dependency on torch, so this never pulls another torch
        "test": ["pytest>=8", "hypothesis>=6.100", "triton>=3.2; platform_system == 'Linux'"],
        "bench": ["pytest-benchmark>=4"],
    },
    **_shims_extension(),
)
