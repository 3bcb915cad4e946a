# GPU machine (carry .device and the copy): the package's attn2 against another version of its kernel
# module, a copy at $OLD (e.g. `git show HEAD:muse_ops/cutedsl/attn2.py > build/attn2_old.py`; build/ is
# git-ignored, so name it in carry): the stack of layers (tools/chain_ab.py), attn2 alone
# (tools/attn2/ab.py, 5 rounds), then the attn2 GPU tests (TESTS=0: not). Logs under $OUT.
#   OLD=build/attn2_old.py bash tools/attn2/ab_device.sh
. .device/prelude.sh && . tools/device_env.sh
. tools/attn2/ab_helpers.sh
OLD=${OLD:?a copy of the kernel module to compare against}
CHAIN_OLD=$OLD timeout 300 python3 tools/chain_ab.py 2>&1 | grep -Ev "$F" > $OUT/chain_ab.log; grep -E "^CHAIN|Error|Traceback" $OUT/chain_ab.log
export AB_ROUNDS=5 AB_VARIANTS="[(\"old\", \"$OLD\", {}), (\"new\", None, {})]"
export AB_CASES='[(1,8192,0,None),(4,8192,0,None),(8,8192,0,None),(16,8192,0,None),(64,8192,0,None),(8,2048,0,None),(8,8192,2048,None),(64,8192,2048,None)]'
timeout 240 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/ab.log; grep -E "^AB|Error|Traceback" $OUT/ab.log
[ "${TESTS:-1}" = 1 ] && { timeout 200 python3 -m pytest -q -x tests/test_attn2_cutedsl.py -p no:cacheprovider 2>&1 | grep -Ev "$F" > $OUT/pytest.log; tail -3 $OUT/pytest.log; }
true
