# device: a change to the qkv_front kernel against OLD, a copy of the kernel module before it (in
# the git-ignored tools/qkv_front_dev/_bounds/: carry it): same bits and timing at every tile
# (ab.py, AB_ROUNDS rounds, old and new interleaved twice), then the qkv_front GPU tests and
# compute-sanitizer on sanitize_case.py. PART=1: the A/B; PART=2: the tests and the sanitizers;
# neither: both. The eighteenth run's blocked push used OLD=tools/qkv_front_dev/_bounds/qkv_old.py.
. .device/prelude.sh && . tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop|warpgroup.arrive'
if [ "${PART:-1}" = 1 ]; then
AB_ROUNDS=${AB_ROUNDS:-5} AB_M=${AB_M:-1,8,16,64,72,128,192,256,300,512,1024} AB_VARIANTS="{'kernel': '$OLD'};{};{'kernel': '$OLD'};{}" \
  timeout 400 python3 tools/qkv_front_dev/ab.py > $OUT/kernel_change_ab.log 2>&1; echo "ab rc=$?"
grep -Ev "$F" $OUT/kernel_change_ab.log | grep -E "DIFFERENT|False|Error|Traceback|^M=|us" | tail -40
fi
if [ "${PART:-2}" = 2 ]; then
timeout 300 python3 -m pytest -q -x tests/test_qkv_front_cutedsl.py -p no:cacheprovider > $OUT/kernel_change_pytest.log 2>&1; tail -2 $OUT/kernel_change_pytest.log
for tool in memcheck racecheck synccheck; do timeout 90 compute-sanitizer --tool $tool python3 tools/qkv_front_dev/sanitize_case.py 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|sanitize_case done" | head -3; done
fi
true
