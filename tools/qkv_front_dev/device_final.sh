# the GPU tests of the package, then compute-sanitizer on the qkv_front and attn2 small cases.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH MUSE_OPS_CACHE_DIR=/tmp/muse_cache
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop'
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu tests -p no:cacheprovider -W ignore > $OUT/pytest_gpu.log 2>&1; echo "pytest gpu rc=$?"; grep -Ev "$F" $OUT/pytest_gpu.log | tail -15
for t in memcheck racecheck synccheck; do timeout 150 compute-sanitizer --tool $t python3 tools/qkv_front_dev/sanitize_case.py > $OUT/san_qkv_$t.log 2>&1; echo "== qkv $t rc=$?"; grep -Ev "$F" $OUT/san_qkv_$t.log | tail -3; done
[ -n "$SAN_ATTN2" ] && for t in memcheck racecheck; do timeout 150 compute-sanitizer --tool $t python3 tools/attn2_dev/sanitize_case.py > $OUT/san_attn2_$t.log 2>&1; echo "== attn2 $t rc=$?"; grep -Ev "$F" $OUT/san_attn2_$t.log | tail -3; done
