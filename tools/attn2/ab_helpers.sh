# Sourced by the attn2 device scripts (after .device/prelude.sh and tools/device_env.sh): F, the
# filter that drops the DSL's compile chatter from a log, and ab, one tools/attn2/ab.py run over
# the caller's variants $V into $OUT/LOG.log with its A/B lines echoed.
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
ab() {   # ab LOG QLEN CASES TIMEOUT
  AB_QLEN=$2 AB_VARIANTS="[$V]" AB_CASES="$3" timeout $4 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/$1.log
  echo "$1"; grep -E "^AB|Error|Traceback" $OUT/$1.log
}
