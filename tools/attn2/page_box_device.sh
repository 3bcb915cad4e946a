# GPU machine (carry .device): memcheck and racecheck on the FP8 sanitize cases under a development
# knob, Attn2Config.page_box by default (an FP8 cache's pages staged as one 2 KB TMA box each: FP8
# decode's default, verify's knob); SANITIZE_KNOBS='{"refill_warp": -1}' for another. The knobs'
# timings: tools/attn2/fp8_plan_ab_device.sh; the defaults' sanitizers: plan_tests_device.sh.
# Logs under $OUT.
#   bash tools/attn2/page_box_device.sh
. .device/prelude.sh && . tools/device_env.sh
. tools/attn2/ab_helpers.sh
export SANITIZE_DTYPES=fp8 SANITIZE_KNOBS="${SANITIZE_KNOBS:-{\"page_box\": True\}}"
# the sanitize cases' variants compile once outside the tools (compiling an FP8 variant under memcheck
# reports host-side cuGetProcAddress errors, not device ones), then run under each
timeout 150 python3 tools/attn2/sanitize_case.py > $OUT/knob_sanitize_plain.log 2>&1
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool python3 tools/attn2/sanitize_case.py 2>&1 | grep -Ev "$F" > $OUT/knob_$tool.log
  echo "$tool ($SANITIZE_KNOBS): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/knob_$tool.log | tail -1)"
done
true
