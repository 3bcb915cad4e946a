# GPU machine (carry .device): the development knob QkvFrontConfig.register_reallocation (a producer
# warpgroup that gives its registers to two consumer warpgroups, so two-head whole-K tiles reach
# 224 tokens) checked and timed, most important first; logs under $OUT.
#   1. its GPU test (the same bits as the default variant at Hkv 1, 2, 4, also with weight multicast);
#   2. ab.py at Hkv 2 M=1024, 1536, 2048 and Hkv 1 M=1536: the plan, 160 x 2 (the largest whole-K
#      two-head tile without it), 160, 192 and 224 x 2 with it (224 with weight multicast too), cuBLAS;
#   3. compute-sanitizer synccheck and racecheck of a reallocated tile (tools/qkv_front/sanitize_case.py).
#   bash tools/qkv_front/realloc_device.sh
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
timeout 120 python3 -m pytest -q -m gpu tests/test_qkv_front_cutedsl.py -k register_reallocation -p no:cacheprovider 2>&1 \
  | grep -Ev "$F" > $OUT/pytest_realloc.log; echo "== pytest"; tail -3 $OUT/pytest_realloc.log
R="'whole_k': True, 'register_reallocation': True"
V="{};{'tile': (160, 2), 'whole_k': True};{'tile': (160, 2), $R};{'tile': (192, 2), $R};{'tile': (224, 2), $R};{'tile': (224, 2), $R, 'w_multicast': True}"
for hm in "2 1024,1536,2048" "1 1536"; do
  set -- $hm
  AB_HKV=$1 AB_M=$2 AB_ROUNDS=5 AB_VARIANTS="$V" timeout 150 python3 tools/qkv_front/ab.py 2>&1 | grep -Ev "$F" > $OUT/ab_realloc_h$1.log
  echo "== Hkv $1"; grep -E "^M=.* us|DIFFERENT|False|Error|Traceback" $OUT/ab_realloc_h$1.log | sed "s/$R/wk+rr/; s/'whole_k': True/wk/"
done
for tool in synccheck racecheck; do
  SANITIZE_FROM=14 timeout 120 compute-sanitizer --tool $tool python3 tools/qkv_front/sanitize_case.py 2>&1 \
    | grep -Ev "$F" > $OUT/sanitize_realloc_$tool.log
  echo "== $tool"; grep -E "ok, flag|ERROR SUMMARY|Error" $OUT/sanitize_realloc_$tool.log | head -3
done
