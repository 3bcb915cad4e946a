# GPU machine (carry .device): what each part of attn2's FP8 step costs (tools/attn2/step_parts.py's
# copies, timing only) beside the kernel over e4m3 and bf16 caches, verify at B=128 L=16384 and
# B=16 L=65536, then decode at B=128 L=16384 (tools/attn2/ab.py, 3 rounds). Logs under $OUT.
#   bash tools/attn2/step_parts_device.sh
. .device/prelude.sh && . tools/device_env.sh
. tools/attn2/ab_helpers.sh
python3 tools/attn2/step_parts.py build/step_parts > /dev/null || exit 1
P=build/step_parts/attn2_parts
# the loads-only copies at 4 CTAs an SM, as many as the kernel holds (their registers would allow 5)
export AB_ROUNDS=3 AB_VARIANTS="[(\"fp8\", None, {\"fp8\": 1}), (\"noconv\", \"${P}_noconv.py\", {\"fp8\": 1}), (\"nosoftmax\", \"${P}_nosoftmax.py\", {\"fp8\": 1}), (\"loads\", \"${P}_loads.py\", {\"fp8\": 1, \"ctas_per_sm\": 4}), (\"loads2k\", \"${P}_loads.py\", {\"fp8\": 1, \"ctas_per_sm\": 4, \"page_box\": True}), (\"bf16\", None, {})]"
AB_CASES='[(128,16384,0,None),(16,65536,0,None)]' timeout 240 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/step_parts_verify.log; grep -E "^AB|Error|Traceback" $OUT/step_parts_verify.log
AB_QLEN=1 AB_CASES='[(128,16384,0,None)]' timeout 150 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/step_parts_decode.log; grep -E "^AB|Error|Traceback" $OUT/step_parts_decode.log
true
