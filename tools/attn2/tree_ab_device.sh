# GPU machine (carry .device): the reduction tree's node size per cache dtype, and the two-chunk wide
# layout, each beside the plan's, with tools/attn2/ab.py (3 rounds, interleaved; bits compared: the
# trees' differ from L = 12288 to 65535, a layout's never):
#   bf16 / fp8          the plan (the forty-seventh session's: bf16 a node per 64 steps, FP8 128; since the
#                       forty-eighth both 128, NODE_MIN_STEPS)
#   bf16_nms128         bf16 at a node per 128 steps (FP8's in the forty-seventh session, where the
#                       wide layout's 4-step chunks were too short for their fixed costs: does bf16's
#                       B=8 L=32768, 70.9 us against FlashInfer's 68.2, gain the same way?)
#   bf16_nms64 / fp8_nms64   a node per 64 steps (PART 3, the tree before the forty-eighth session)
#   bf16_w2 / fp8_w2    the plan's tree in the two-chunk wide layout (Attn2Config.wide_chunks 2: wide's
#                       bits on half its CTAs, deep's registers), where deep runs about two CTAs an SM
# Two calls of under 600 s each (each case compiles its variants' caps):
#   PART=1 bash tools/attn2/tree_ab_device.sh    the two-chunk layout's GPU bit test
#            (test_development_knobs_bit_identical -k wide_chunks); decode at L=16384 B=128 and 32 and
#            L=32768 B=8; verify where the wide layout runs today (B=1 L=8192, B=8 L=8192, B=4 L=32768),
#            the plan's wide beside the two-chunk one
#   PART=2 bash tools/attn2/tree_ab_device.sh    verify at L=16384 B=128, 64, 32, 16; L=32768 B=16, 8;
#            L=12288 B=16
#   PART=3 bash tools/attn2/tree_ab_device.sh    the tree of a node per 128 steps for both dtypes (the
#            plan since the forty-eighth session) against 64 where PART 1 and 2 did not look: one to 12
#            requests at L = 16384 to 65536 and the mixed batch (64 requests, L ~ U[512, 32768]), verify
#            and decode; then bf16's attn2 GPU tests and memcheck on the sanitizer's bf16 cases
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
export AB_ROUNDS=3 PYTHONUNBUFFERED=1
V='("bf16", None, {}), ("bf16_nms128", None, {"node_min_steps": 128}), ("bf16_w2", None, {"layout": "wide", "wide_chunks": 2}), ("fp8", None, {"fp8": 1}), ("fp8_nms64", None, {"fp8": 1, "node_min_steps": 64}), ("fp8_w2", None, {"fp8": 1, "layout": "wide", "wide_chunks": 2})'
T='["bf16", "bf16_nms128", "fp8", "fp8_nms64"]'    # the trees only (B=128: the two-chunk layout has no case there)
W='["bf16", "bf16_w2", "fp8", "fp8_w2"]'           # the layouts only (where the plan runs wide)
if [ "${PART:-1}" = 1 ]; then
  timeout 200 python3 -m pytest -q tests/test_attn2_cutedsl.py -k "development_knobs and wide_chunks" 2>&1 \
    | grep -Ev "$F" > $OUT/wide_chunks_tests.log
  echo "tests"; tail -4 $OUT/wide_chunks_tests.log
  AB_QLEN=1 AB_VARIANTS="[$V]" AB_CASES="[(128,16384,0,$T),(32,16384,0,None),(8,32768,0,None)]" \
    timeout 170 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/tree_ab_decode.log
  echo "decode"; grep -E "^AB|Error|Traceback" $OUT/tree_ab_decode.log
  AB_VARIANTS="[$V]" AB_CASES="[(1,8192,0,$W),(8,8192,0,$W),(4,32768,0,$W)]" \
    timeout 130 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/tree_ab_wide.log
  echo "verify, wide"; grep -E "^AB|Error|Traceback" $OUT/tree_ab_wide.log
elif [ "$PART" = 3 ]; then
  V='("bf16", None, {}), ("bf16_nms64", None, {"node_min_steps": 64}), ("fp8", None, {"fp8": 1}), ("fp8_nms64", None, {"fp8": 1, "node_min_steps": 64})'
  C='[(1,16384,0,None),(1,32768,0,None),(2,65536,0,None),(4,16384,0,None),(4,32768,0,None),(12,16384,0,None),(24,24576,0,None),("mixed",0,0,None)]'
  AB_VARIANTS="[$V]" AB_CASES="$C" timeout 170 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/tree_ab_small.log
  echo "verify"; grep -E "^AB|Error|Traceback" $OUT/tree_ab_small.log
  AB_QLEN=1 AB_VARIANTS="[$V]" AB_CASES='[(1,32768,0,None),(4,16384,0,None),("mixed",0,0,None)]' \
    timeout 80 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/tree_ab_small_decode.log
  echo "decode"; grep -E "^AB|Error|Traceback" $OUT/tree_ab_small_decode.log
  timeout 180 python3 -m pytest -q tests/test_attn2_cutedsl.py -k "not fp8 and not development_knobs" -p no:cacheprovider \
    -W ignore --durations=3 > $OUT/pytest_attn2_bf16.log 2>&1
  echo "attn2 bf16 tests rc=$?"; grep -Ev "$F" $OUT/pytest_attn2_bf16.log | tail -6
  export SANITIZE_DTYPES=bf16
  timeout 60 python3 tools/attn2/sanitize_case.py > $OUT/san_plain.log 2>&1; echo "sanitize cases plain rc=$?"
  timeout 90 compute-sanitizer --tool memcheck python3 tools/attn2/sanitize_case.py > $OUT/san_attn2_bf16_memcheck.log 2>&1
  echo "== attn2 bf16 memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_attn2_bf16_memcheck.log | tail -1)"
else
  C="[(128,16384,0,$T),(64,16384,0,None),(32,16384,0,None),(16,16384,0,None),(16,32768,0,None),(8,32768,0,None),(16,12288,0,None)]"
  AB_VARIANTS="[$V]" AB_CASES="$C" timeout 480 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/tree_ab_verify.log
  echo "verify"; grep -E "^AB|Error|Traceback" $OUT/tree_ab_verify.log
fi
true
