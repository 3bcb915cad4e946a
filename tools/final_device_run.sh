# One device call: the full bench table (checks every contender against the reference), then the
# GPU tests. Logs, JSON and the markdown section land in $OUT.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH
F='^\s*[|>]|remark|-->|in function|^ptxas'
timeout 330 python3 -m muse_ops bench --json $OUT/bench.json --markdown $OUT/bench.md --budget-s ${BENCH_BUDGET:-280} > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep -Ev "$F" $OUT/bench.log | tail -45
timeout ${TEST_TIMEOUT:-130} python3 -m pytest -q -m gpu tests -p no:cacheprovider > $OUT/pytest_gpu.log 2>&1
echo "pytest rc=$?"; grep -Ev "$F" $OUT/pytest_gpu.log | tail -12
