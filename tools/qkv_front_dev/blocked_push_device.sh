# device: qkv_front's blocked split-K push (8-byte stores, [64][8] slabs) against a copy of the
# kernel before it (tools/qkv_front_dev/_bounds/qkv_old.py, carried): same bits and timing at
# every tile (ab.py, 5 rounds), then the qkv_front GPU tests and compute-sanitizer on
# sanitize_case.py. PART=1: the A/B; PART=2: the tests and the sanitizers; neither: both.
. .device/prelude.sh && . tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop|warpgroup.arrive'
if [ "${PART:-1}" = 1 ]; then
AB_ROUNDS=5 AB_M=${AB_M:-1,8,16,64,72,128,192,256,300,512,1024} AB_VARIANTS="{'kernel': 'tools/qkv_front_dev/_bounds/qkv_old.py'};{}" \
  timeout 400 python3 tools/qkv_front_dev/ab.py > $OUT/blocked_push_ab.log 2>&1; echo "ab rc=$?"
grep -Ev "$F" $OUT/blocked_push_ab.log | grep -E "DIFFERENT|False|Error|Traceback|^M=|us" | tail -40
fi
if [ "${PART:-2}" = 2 ]; then
timeout 300 python3 -m pytest -q -x tests/test_qkv_front_cutedsl.py -p no:cacheprovider > $OUT/blocked_push_pytest.log 2>&1; tail -2 $OUT/blocked_push_pytest.log
for tool in memcheck racecheck synccheck; do timeout 90 compute-sanitizer --tool $tool python3 tools/qkv_front_dev/sanitize_case.py 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|sanitize_case done" | head -3; done
fi
true
