"""pip install -e .            the package (pure Python; runs on the reference backend anywhere)
pip install -e .[cuda]      + nvidia-cutlass-dsl and apache-tvm-ffi for the CuTe DSL kernels (sm_90)
pip install -e .[test]      + pytest, hypothesis
pip install -e .[bench]     + pytest-benchmark (peers such as flash-attn-4 and triton are optional)
"""
from setuptools import find_packages, setup

setup(
    name="muse_ops",
    version="0.1.0",
    description="Fused attention ops (QKV front, paged verify/decode attention) of Muse Spark for Hopper",
    packages=find_packages(include=["muse_ops", "muse_ops.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.9"],
    extras_require={
        "cuda": ["nvidia-cutlass-dsl==4.8.1", "apache-tvm-ffi>=0.1.15"],
        "test": ["pytest>=8", "hypothesis>=6.100", "numpy"],
        "bench": ["pytest-benchmark>=4"],
    },
)
