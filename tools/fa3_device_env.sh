# Source on the GPU machine (instead of .device/prelude.sh) for a DSL-free run with FlashAttention-3
# as a peer: tools/aot_device_env.sh (muse's kernels from the ahead-of-time library, the CuTe DSL
# absent), then the fa3-fwd wheel (FA3's forward, PyPI fa3-fwd 0.0.3, 27.6 MB: too large to travel
# beside the DSL bundle in one call's 64 MiB, so it goes with the AOT library), and FlashInfer's
# sm_90a bundle where it was carried too. The checkout, the AOT library, FA3 and FlashInfer on
# PYTHONPATH; $OUT for what comes back.
#
# Before the call, on the CPU machine (the wheel and the library are git-ignored):
#   mkdir -p .whl && cp <where the wheel is>/fa3_fwd-0.0.3-cp39-abi3-manylinux_2_24_x86_64.whl .whl/
#   python -m muse_ops.cutedsl.aot build build/aot --runtime && tar -cJf .device-aot/aot.tar.xz -C build/aot .
#   (with the DSL's cu13 flavor installed: tools/aot_device_env.sh says why)
# Carry (64 MiB in all; FlashInfer's 6.5 MB optional):
#   .device-aot/aot.tar.xz .device/apache_tvm_ffi-*.whl [.device/torch_c_dlpack_ext-*.whl] .whl
#   [.device/flashinfer-0.7.2.post1-sm90a.tar.xz]
#
# FA3 goes to /tmp/fa3-site, not /tmp/site: on a machine still warm from a DSL-bundle run /tmp/site
# holds the CuTe DSL, and putting it on PYTHONPATH would make this run compile instead of loading
# the library (aot_device_env.sh warns when cutlass is importable).
. tools/aot_device_env.sh
# aot_device_env.sh installs the TVM-FFI wheels in one pip call; where torch_c_dlpack_ext's wheel was
# not carried that call installs nothing: install apache_tvm_ffi alone (the dlpack extension is optional)
if ! python3 -c "import tvm_ffi" >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/aot-site .device/apache_tvm_ffi-*.whl
fi
if [ ! -f /tmp/fa3-site/fa3_fwd_interface.py ]; then
  _w=$(ls .whl/fa3_fwd-*.whl 2>/dev/null | head -1)
  if [ -n "$_w" ]; then
    mkdir -p /tmp/fa3-site
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3-site "$_w"
  else
    echo "fa3_device_env: no .whl/fa3_fwd-*.whl carried: FA3 will be reported absent" >&2
  fi
fi
export PYTHONPATH=$PYTHONPATH:/tmp/fa3-site
# FlashInfer (the same unpacking as .device/prelude.sh's, where its bundle was carried or a DSL run
# left it on this machine): its package, small deps and prebuilt sm_90a kernels; JIT stays off
_fi=$(ls .device/flashinfer-*-sm90a.tar.xz 2>/dev/null | head -1)
if [ ! -d /tmp/fi-site/flashinfer ] && [ -n "$_fi" ]; then
  mkdir -p /tmp/fi-site /tmp/fi-unpack && tar -xJf "$_fi" -C /tmp/fi-unpack
  cp -a /tmp/fi-unpack/fi-site/. /tmp/fi-site/
  for d in /tmp/fi-unpack/deps/*/; do   # a dep the machine already has is left as it is
    m=$(basename "$d"); case $m in nvidia_ml_py) m=pynvml;; esac
    python3 -c "import $m" >/dev/null 2>&1 || cp -a "$d". /tmp/fi-site/
  done
  rm -rf /tmp/fi-unpack
fi
if [ -d /tmp/fi-site/flashinfer ]; then
  export FLASHINFER_DISABLE_JIT=1 FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws FLASHINFER_CUDA_ARCH_LIST=9.0a \
         FLASHINFER_DECODE_AUTO_CUDNN=0 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  mkdir -p /tmp/fi-ws
  export PYTHONPATH=$PYTHONPATH:/tmp/fi-site
fi
unset _w _fi
python3 -c "
import importlib, sys
try:
    sys.modules['flash_attn_config'] = importlib.import_module('fa3_fwd_config')
    import fa3_fwd_interface  # noqa: F401
    print('fa3_device_env: FA3 (fa3-fwd) importable')
except Exception as exc:
    print(f'fa3_device_env: FA3 not importable: {type(exc).__name__}: {exc}')
" >&2
true
