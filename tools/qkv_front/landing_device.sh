# GPU machine (carry .device): qkv_front's landing barriers (QkvFrontConfig.landing_barriers: the
# split-K push as st.async into per-chunk barriers, each epilogue pass waiting for its own chunk)
# against the plan's variant without them, timed in alternation by tools/qkv_front/ab.py (bits
# checked against the first variant and float64) at the split-cluster
# rows of issue 49 and a split-of-1 control (Hkv 4: plain stores in both), and the qkv_front GPU
# tests (PART=ab, about 9 minutes); then the GPU tests again, memcheck and
# synccheck of the sanitizer cases (PART=check, about 9); the ncu of Hkv 2 M=512 (PART=ncu).
#   [MID=build/copy.py] PART=ab bash tools/qkv_front/landing_device.sh
. .device/prelude.sh && . tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop'
V="{};{'landing_barriers': True};{};{'landing_barriers': True}"
# MID=path: a copy of the kernel module with the knob, timed as a third contender (three-way A/B)
[ -n "$MID" ] && V="{};{'landing_barriers': True};{'kernel': '$MID', 'landing_barriers': True};{};{'landing_barriers': True};{'kernel': '$MID', 'landing_barriers': True}"
ab() {   # ab HKV M,... TIMEOUT
  AB_HKV=$1 AB_M=$2 AB_ROUNDS=${AB_ROUNDS:-5} AB_VARIANTS="$V" timeout $3 python3 tools/qkv_front/ab.py > $OUT/ab_hkv$1.log 2>&1
  echo "Hkv $1 rc=$?"; grep -Ev "$F" $OUT/ab_hkv$1.log | grep -E "^M=|Error|Traceback|DIFFERENT|False" | tail -40
}
if [ "$PART" = ab ]; then
ab 2 64,256,512 130
ab 1 512 55
ab 16 256 65
ab 4 256 45
timeout ${TESTS_S:-200} python3 -m pytest -q -m gpu tests/test_qkv_front_cutedsl.py -k "landing_barriers or bit_identical_across_m" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -Ev "$F" $OUT/tests.log | tail -5
elif [ "$PART" = check ]; then
timeout 240 python3 -m pytest -q -m gpu tests/test_qkv_front_cutedsl.py -x -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -Ev "$F" $OUT/tests.log | tail -5
for tool in memcheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/qkv_front/sanitize_case.py > $OUT/$tool.log 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Traceback" $OUT/$tool.log | tail -3
done
else
bash tools/qkv_front/ncu.sh 512 2
fi
true
