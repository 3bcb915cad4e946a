# Source on the GPU machine (instead of .device/prelude.sh) to run from the ahead-of-time kernel
# library with the CuTe DSL absent: only the TVM-FFI wheels and .device-aot/aot.tar.xz (the library,
# its manifest and the DSL's runtime library; built on a CPU machine with
# `python -m muse_ops.cutedsl.aot build DIR --runtime`, then `tar -cJf .device-aot/aot.tar.xz -C DIR .`,
# by the DSL's cu13 flavor (`pip install 'nvidia-cutlass-dsl[cu13]'`: the device's driver runs CUDA 13, and
# the cu12 flavor's ptxas makes the FP8 attn2 variants 3-11% slower; the manifest says which built it);
# kept beside .device/, whose 64 MiB share of a call it would exceed) travel. Carry:
#   .device-aot/aot.tar.xz .device/apache_tvm_ffi-*.whl .device/torch_c_dlpack_ext-*.whl
if [ ! -d /tmp/aot-site/tvm_ffi ]; then
  mkdir -p /tmp/aot-site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/aot-site .device/apache_tvm_ffi-*.whl \
    .device/torch_c_dlpack_ext-*.whl
fi
mkdir -p /tmp/aot && tar -xJf .device-aot/aot.tar.xz -C /tmp/aot
export PYTHONPATH=$PWD:/tmp/aot-site MUSE_OPS_AOT_LIBRARY=/tmp/aot/libmuse_kernels_sm90a.so MUSE_OPS_CACHE_DIR=off
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import cutlass" 2>/dev/null && echo "aot_device_env: cutlass is importable here: not a DSL-free run" >&2
true
