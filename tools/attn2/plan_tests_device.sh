# GPU machine (carry .device): the record of a change to attn2's plan in one call (under 600 s), for one
# cache dtype (DTYPE, fp8 by default): its attn2 GPU tests (tests/test_attn2_cutedsl.py; fp8: with the
# development knobs' test, and tests/test_fp8.py: both ops, the needle at L = 131072, batch
# invariance), then compute-sanitizer memcheck, racecheck and synccheck on tools/attn2/sanitize_case.py's
# cases of that dtype (every layout, decode and verify, a window). Logs under $OUT. (Called
# fp8_plan_tests_device.sh, FP8 only, until the forty-eighth session.)
#   bash tools/attn2/plan_tests_device.sh; DTYPE=bf16 bash tools/attn2/plan_tests_device.sh
. .device/prelude.sh && . tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop|DEBUG'
DTYPE=${DTYPE:-fp8}
case $DTYPE in
fp8) K="fp8 or development_knobs" ;;
bf16) K="not fp8 and not development_knobs" ;;
*) echo "DTYPE must be fp8 or bf16" >&2; exit 2 ;;
esac
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q tests/test_attn2_cutedsl.py -k "$K" \
  -p no:cacheprovider -W ignore --durations=3 > $OUT/pytest_attn2_$DTYPE.log 2>&1
echo "attn2 $DTYPE tests rc=$?"; grep -Ev "$F" $OUT/pytest_attn2_$DTYPE.log | tail -6
if [ $DTYPE = fp8 ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu tests/test_fp8.py -p no:cacheprovider -W ignore --durations=3 \
    > $OUT/pytest_fp8.log 2>&1
  echo "test_fp8 rc=$?"; grep -Ev "$F" $OUT/pytest_fp8.log | tail -6
fi
export SANITIZE_DTYPES=$DTYPE
# compile the cases' variants outside the tools first (see tools/attn2/page_box_device.sh)
timeout 120 python3 tools/attn2/sanitize_case.py > $OUT/san_plain.log 2>&1; echo "sanitize cases plain rc=$?"
for t in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $t python3 tools/attn2/sanitize_case.py > $OUT/san_attn2_${DTYPE}_$t.log 2>&1
  echo "== attn2 $DTYPE $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_attn2_${DTYPE}_$t.log | tail -1)"
done
true
