# GPU machine: the FP8 candidates the forty-sixth session built but could not run, in one call,
# each beside today's FP8 kernel (tools/attn2/ab.py, 3 rounds; variants of one tree compared in
# bits, so "same bits" checks the knobs and the copy):
#   page_box       one 2 KB TMA box a page (Attn2Config.page_box)
#   rot            each step's refill issued by another warp in turn (Attn2Config.refill_warp -1)
#   nms128         a node per 128 ring steps instead of 64 (an FP8 step is half a bf16 step's
#                  bytes: half the CTAs, each with bf16's bytes; another tree, so other bits)
#   coord          a copy of the kernel with the FP8 staging ring addressed by its coordinate
#                  (tools/attn2/staging_coordinate.py writes it)
# then the development knobs' GPU test. Logs under $OUT.
#   bash tools/attn2/fp8_candidates_device.sh   (GPU; carry .device)
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
export AB_ROUNDS=3 PYTHONUNBUFFERED=1
V='("fp8", None, {"fp8": 1, "node_min_steps": 64}), ("page_box", None, {"fp8": 1, "page_box": True, "node_min_steps": 64}), ("rot", None, {"fp8": 1, "refill_warp": -1, "node_min_steps": 64}), ("nms128", None, {"fp8": 1, "node_min_steps": 128}), ("pb_rot_nms128", None, {"fp8": 1, "page_box": True, "refill_warp": -1, "node_min_steps": 128})'
python3 tools/attn2/staging_coordinate.py build/attn2_coord.py > /dev/null || exit 1
V="$V"', ("coord", "build/attn2_coord.py", {"fp8": 1, "node_min_steps": 64})'
AB_VARIANTS="[$V]" AB_CASES='[(128,16384,0,None),(16,65536,0,None),(8,32768,0,None),(32,16384,0,None),(1,32768,0,None)]' timeout 300 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/fp8_candidates_verify.log; grep -E "^AB|Error|Traceback" $OUT/fp8_candidates_verify.log
AB_QLEN=1 AB_VARIANTS="[$V, (\"bf16\", None, {})]" AB_CASES='[(128,16384,0,None),(16,65536,0,None)]' timeout 150 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/fp8_candidates_decode.log; grep -E "^AB|Error|Traceback" $OUT/fp8_candidates_decode.log
timeout 140 python3 -m pytest -q tests/test_attn2_cutedsl.py -k "development_knobs" -p no:cacheprovider 2>&1 | grep -Ev "$F" > $OUT/development_knobs_tests.log; tail -2 $OUT/development_knobs_tests.log
true
