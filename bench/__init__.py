"""muse_ops benchmarks (docs/DESIGN.md section 14): `python -m muse_ops bench` (bench/run.py) prints the
side-by-side table of muse_ops' backends, the stock peers (cuBLAS + Triton epilogue, FlashInfer,
FlashAttention-3 and -4 + Triton norm-gate, Flex attention) and the floors, each attn2 and layer case
with a bf16 and an FP8 KV cache; `pytest bench --benchmark-only` runs the same contenders through
pytest-benchmark. Part of the source checkout, not of the installed package."""
