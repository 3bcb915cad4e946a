#!/usr/bin/env bash
# On the GPU machine, DSL-free with the C++ ops (carry as for tools/shims_device_run.sh, MODE=aot):
#   bash tools/launch_cost/run.sh pieces   the driver's launch pieces beside the ops (run.py)
#   bash tools/launch_cost/run.sh probe    the DSL launch function's runtime calls (probe_run.py)
set -euo pipefail
WHAT=${1:-pieces}
. tools/aot_device_env.sh
mkdir -p /tmp/shims
MUSE_OPS_SHIMS=0 python3 -m muse_ops build-shims --output /tmp/shims/libmuse_shims.so > "$OUT/build.log" 2>&1
export MUSE_OPS_SHIMS=/tmp/shims/libmuse_shims.so
CUDA_INC=$(dirname "$(command -v nvcc)")/../include
if [ "$WHAT" = probe ]; then
  g++ -O2 -shared -fPIC -I"$CUDA_INC" tools/launch_cost/probe.cpp -o /tmp/shims/libprobe.so -ldl
  export PROBE_RUNTIME=/tmp/aot/libcute_dsl_runtime.so
  PROBE_TVMFFI=$(python3 -c "import tvm_ffi.libinfo as l; print(l.find_libtvm_ffi())")
  export PROBE_TVMFFI
  LD_PRELOAD=/tmp/shims/libprobe.so python3 tools/launch_cost/probe_run.py /tmp/shims/libprobe.so 2>&1 \
    | tee "$OUT/probe.log"
else
  g++ -O2 -shared -fPIC -I"$CUDA_INC" tools/launch_cost/pieces.cpp -o /tmp/shims/libpieces.so
  python3 tools/launch_cost/run.py /tmp/shims/libpieces.so 2>&1 | tee "$OUT/launch_cost.log"
fi
