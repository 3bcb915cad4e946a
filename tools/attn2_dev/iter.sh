# device: smoke checks, the kernel's GPU tests, then the TUNE_VARIANTS x TUNE_CASES timing table.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^'
python3 tools/attn2_dev/run_dev.py check 2>&1 | grep -Ev "$F" > $OUT/check.log; tail -12 $OUT/check.log
timeout 240 python3 -m pytest -q -x tests/test_attn2_cutedsl.py -p no:cacheprovider 2>&1 | grep -Ev "$F" > $OUT/pytest.log; tail -6 $OUT/pytest.log
[ -n "$TUNE_VARIANTS" ] && python3 tools/attn2_dev/run_dev.py tune 2>&1 | grep -Ev "$F" > $OUT/tune.log; grep -E "TUNE|Error|error" $OUT/tune.log | head -80
