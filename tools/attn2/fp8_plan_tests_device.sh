# GPU machine (carry .device): the record of a change to attn2's FP8 plan in one call (under 600 s):
# the FP8 GPU tests of attn2 (tests/test_attn2_cutedsl.py -k "fp8 or development_knobs") and of the
# ops (tests/test_fp8.py: both ops, the needle at L = 131072, batch invariance), then
# compute-sanitizer memcheck, racecheck and synccheck on tools/attn2/sanitize_case.py's FP8 cases
# (every layout, decode and verify, a window). Logs under $OUT.
#   bash tools/attn2/fp8_plan_tests_device.sh
. .device/prelude.sh && . tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop|DEBUG'
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q tests/test_attn2_cutedsl.py -k "fp8 or development_knobs" \
  -p no:cacheprovider -W ignore --durations=3 > $OUT/pytest_attn2_fp8.log 2>&1
echo "attn2 fp8 tests rc=$?"; grep -Ev "$F" $OUT/pytest_attn2_fp8.log | tail -6
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu tests/test_fp8.py -p no:cacheprovider -W ignore --durations=3 \
  > $OUT/pytest_fp8.log 2>&1
echo "test_fp8 rc=$?"; grep -Ev "$F" $OUT/pytest_fp8.log | tail -6
export SANITIZE_DTYPES=fp8
# compile the cases' variants outside the tools first (see tools/attn2/page_box_device.sh)
timeout 120 python3 tools/attn2/sanitize_case.py > $OUT/san_plain.log 2>&1; echo "sanitize cases plain rc=$?"
for t in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $t python3 tools/attn2/sanitize_case.py > $OUT/san_attn2_fp8_$t.log 2>&1
  echo "== attn2 fp8 $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_attn2_fp8_$t.log | tail -1)"
done
true
