#!/usr/bin/env bash
# On the GPU machine, DSL-free with the C++ ops (carry as for tools/shims_device_run.sh, MODE=aot):
#   bash tools/launch_cost/run.sh pieces   the driver's launch pieces beside the ops (run.py)
#   bash tools/launch_cost/run.sh probe    the DSL launch function's runtime calls (probe_run.py)
WHAT=${1:-pieces}
PART=build . tools/shims_device_run.sh   # the AOT environment and the C++ ops, built into /tmp/shims
set -e
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
