# one device call: checks + bench, pytest, sanitizers. Logs under $OUT.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas'
python3 tools/attn2_dev/run_dev.py check bench 2>&1 | grep -Ev "$F" > $OUT/bench.log; tail -30 $OUT/bench.log
timeout 200 python3 -m pytest -q -x tests/test_attn2_cutedsl.py -p no:cacheprovider 2>&1 | grep -Ev "$F" > $OUT/pytest.log; tail -8 $OUT/pytest.log
for t in memcheck racecheck; do timeout 120 compute-sanitizer --tool $t python3 tools/attn2_dev/sanitize_case.py 2>&1 | grep -Ev "$F" > $OUT/san_$t.log; echo "== $t"; tail -4 $OUT/san_$t.log; done
