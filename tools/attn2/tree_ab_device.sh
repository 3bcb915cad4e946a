# GPU machine (carry .device): the reduction tree's node size per cache dtype, each beside the plan's,
# with tools/attn2/ab.py (3 rounds, interleaved; the trees' bits differ from L = 12288 to 65535):
#   bf16: a node per 64 steps (NODE_MIN_STEPS, the plan) against 128 (FP8's since the forty-seventh
#         session, where the wide layout's 4-step chunks were too short for their fixed costs: does
#         bf16's B=8 L=32768, 70.9 us against FlashInfer's 68.2, gain the same way?)
#   fp8:  a node per 128 steps (FP8_NODE_MIN_STEPS, the plan) against 64, over the batch sizes between
#         the measured win (B >= 64 at L=16384) and loss (B=16-32), to place the crossover
# verify at L=16384 B=128, 96, 64, 48, 32, 16; L=32768 B=16, 8, 4; L=12288 B=64; decode at
# L=16384 B=128, 64, 32 and L=32768 B=8.
#   bash tools/attn2/tree_ab_device.sh
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
export AB_ROUNDS=3 PYTHONUNBUFFERED=1
V='("bf16", None, {}), ("bf16_nms128", None, {"node_min_steps": 128}), ("fp8", None, {"fp8": 1}), ("fp8_nms64", None, {"fp8": 1, "node_min_steps": 64})'
C='[(128,16384,0,None),(96,16384,0,None),(64,16384,0,None),(48,16384,0,None),(32,16384,0,None),(16,16384,0,None),(16,32768,0,None),(8,32768,0,None),(4,32768,0,None),(64,12288,0,None)]'
AB_VARIANTS="[$V]" AB_CASES="$C" timeout 330 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/tree_ab_verify.log
echo "verify"; grep -E "^AB|Error|Traceback" $OUT/tree_ab_verify.log
AB_QLEN=1 AB_VARIANTS="[$V]" AB_CASES='[(128,16384,0,None),(64,16384,0,None),(32,16384,0,None),(8,32768,0,None)]' \
  timeout 200 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/tree_ab_decode.log
echo "decode"; grep -E "^AB|Error|Traceback" $OUT/tree_ab_decode.log
true
