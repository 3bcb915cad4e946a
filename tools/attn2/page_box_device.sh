# GPU machine (carry .device): Attn2Config.page_box (an FP8 cache's pages staged as one 2 KB TMA box
# each instead of a K and a V box of 1 KB) in one call: the kernel with and without it over both
# layouts (tools/attn2/ab.py, 3 rounds, the bits compared), its GPU test, then memcheck and
# racecheck on the FP8 sanitize cases with it. Logs under $OUT. (The loads alone with each box
# shape: tools/attn2/step_parts_device.sh.)
#   bash tools/attn2/page_box_device.sh
. .device/prelude.sh && . tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
export AB_ROUNDS=3 AB_VARIANTS='[("fp8", None, {"fp8": 1}), ("page_box", None, {"fp8": 1, "page_box": True})]'
AB_CASES='[(128,16384,0,None),(16,65536,0,None),(8,32768,0,None),(64,8192,0,None),(1,8192,0,None)]' timeout 240 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/page_box_verify.log; grep -E "^AB|Error|Traceback" $OUT/page_box_verify.log
AB_QLEN=1 AB_CASES='[(128,16384,0,None),(16,65536,0,None)]' timeout 120 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/page_box_decode.log; grep -E "^AB|Error|Traceback" $OUT/page_box_decode.log
timeout 150 python3 -m pytest -q tests/test_attn2_cutedsl.py -k "page_box" -p no:cacheprovider 2>&1 | grep -Ev "$F" > $OUT/page_box_tests.log; tail -2 $OUT/page_box_tests.log
# the sanitize cases' variants compile once outside the tools (compiling an FP8 variant under memcheck
# reports host-side cuGetProcAddress errors, not device ones), then run under each
SANITIZE_DTYPES=fp8 SANITIZE_KNOBS='{"page_box": True}' timeout 150 python3 tools/attn2/sanitize_case.py > $OUT/page_box_sanitize_plain.log 2>&1
for tool in memcheck racecheck; do
  SANITIZE_DTYPES=fp8 SANITIZE_KNOBS='{"page_box": True}' timeout 150 compute-sanitizer --tool $tool python3 tools/attn2/sanitize_case.py 2>&1 | grep -Ev "$F" > $OUT/page_box_$tool.log
  echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/page_box_$tool.log | tail -1)"
done
true
