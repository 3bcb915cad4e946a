#!/usr/bin/env bash
# On the GPU machine, DSL-free: the ahead-of-time library (tools/aot_device_env.sh), the C++ ops
# built there against its torch, then PART = shims (their GPU tests), host (bench/host.py), gpu
# (the whole GPU suite through them), or all; PART=build stops after the setup, for what runs next in
# the same shell (`PART=build . tools/shims_device_run.sh && python3 tools/host_floors.py`). Logs and
# JSON under $OUT. Carry as tools/aot_device_env.sh says.
# NOSHIMS=1: the same without the C++ ops. MODE=dsl: the CuTe DSL bundle instead (.device/prelude.sh, tools/device_env.sh: carry .device).
set -uo pipefail
if [ "${MODE:-aot}" = dsl ]; then . .device/prelude.sh && . tools/device_env.sh; else . tools/aot_device_env.sh; fi
mkdir -p /tmp/shims
MUSE_OPS_SHIMS=0 python3 -m muse_ops build-shims --output /tmp/shims/libmuse_shims.so > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
export MUSE_OPS_SHIMS=/tmp/shims/libmuse_shims.so
[ "${NOSHIMS:-0}" = 1 ] && export MUSE_OPS_SHIMS=0   # the Python host path alone
python3 -c "import muse_ops; from muse_ops.cutedsl import shims, aot; print('shims:', shims.status()); print('aot:', aot.status())"
PART=${PART:-all}
if [ "$PART" = shims ] || [ "$PART" = all ]; then
  timeout 300 python3 -m pytest -q -x -s tests/test_gpu_shims.py > "$OUT/shims_tests.log" 2>&1; echo "shims tests rc=$?"
  tail -15 "$OUT/shims_tests.log"
fi
if [ "$PART" = host ] || [ "$PART" = all ]; then
  timeout 240 python3 -m bench.host --out "$OUT/host${NOSHIMS:+-noshims}.json" > "$OUT/host.log" 2>&1; echo "host rc=$?"
  tail -25 "$OUT/host.log"
fi
if [ "$PART" = gpu ]; then
  timeout 500 python3 -m pytest -q -m gpu tests > "$OUT/gpu_tests${NOSHIMS:+-noshims}.log" 2>&1; echo "gpu tests rc=$?"
  tail -25 "$OUT/gpu_tests${NOSHIMS:+-noshims}.log"
fi
