# the last device call of a session: GPU tests, qkv_front sanitizers, the full bench. Logs under $OUT.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH MUSE_OPS_CACHE_DIR=/tmp/muse_cache
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop|generate_mlir'
timeout 240 python3 -m pytest -q -m gpu tests -p no:cacheprovider -W ignore > $OUT/pytest_gpu.log 2>&1; echo "pytest gpu rc=$?"; grep -Ev "$F" $OUT/pytest_gpu.log | tail -6
for t in memcheck racecheck synccheck; do timeout 100 compute-sanitizer --tool $t --report-api-errors no python3 tools/qkv_front_dev/sanitize_case.py > $OUT/san_qkv_$t.log 2>&1; echo "== qkv $t rc=$?"; tail -1 $OUT/san_qkv_$t.log; done
timeout 260 python3 -m muse_ops bench --json $OUT/bench.json --markdown $OUT/bench.md --budget-s 230 > $OUT/bench.log 2>&1; echo "bench rc=$?"; grep -A14 "### qkv_front" $OUT/bench.md
