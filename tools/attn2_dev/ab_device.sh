# device: the package's attn2 against another version of its kernel module (a copy at $OLD, e.g. the
# committed file copied into the git-ignored tools/qkv_front_dev/_bounds/ and named in carry): the
# layer chain (chain_ab.py), attn2 alone (ab.py, 5 rounds), then the attn2 GPU tests (TESTS=0: not)
. .device/prelude.sh && . tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
OLD=${OLD:?a copy of the kernel module to compare against}
CHAIN_OLD=$OLD timeout 300 python3 tools/attn2_dev/chain_ab.py 2>&1 | grep -Ev "$F" > $OUT/chain_ab.log; grep -E "^CHAIN|Error|Traceback" $OUT/chain_ab.log
export AB_ROUNDS=5 AB_VARIANTS="[(\"old\", \"$OLD\", {}), (\"new\", None, {})]"
export AB_CASES='[(1,8192,0,None),(4,8192,0,None),(8,8192,0,None),(16,8192,0,None),(64,8192,0,None),(8,2048,0,None),(8,8192,2048,None),(64,8192,2048,None)]'
timeout 240 python3 tools/attn2_dev/ab.py 2>&1 | grep -Ev "$F" > $OUT/ab.log; grep -E "^AB|Error|Traceback" $OUT/ab.log
[ "${TESTS:-1}" = 1 ] && { timeout 200 python3 -m pytest -q -x tests/test_attn2_cutedsl.py -p no:cacheprovider 2>&1 | grep -Ev "$F" > $OUT/pytest.log; tail -3 $OUT/pytest.log; }
true
