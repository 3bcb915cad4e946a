# GPU machine (carry .device): the reduction tree at Hkv 16 (TP1), where a batch holds 8x the
# (request, KV head) pairs of Hkv 2 at the same B: the plan's tree there (attn2_plan.COARSE_TREE:
# one node below 128 steps, L < 8192) beside the default tree of the other deployments (dflt:
# two_node_steps 64), bf16 and FP8, with tools/attn2/ab.py (3 rounds, interleaved); then
# tools/attn2/fp8_hkv16_check.py (FP8 at Hkv 16 with per-head and per-tensor scales against
# float64, on both trees). The forty-ninth session ran it before the
# coarse tree was the plan (bench/RESULTS.md, that session's section). One call of under 600 s:
#   bash tools/attn2/hkv_tree_ab_device.sh
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/attn2/ab_helpers.sh
export AB_ROUNDS=3 PYTHONUNBUFFERED=1 AB_HKV=${AB_HKV:-16}
V='("plan", None, {}), ("dflt", None, {"two_node_steps": 64}),
   ("fp8", None, {"fp8": 1}), ("fp8_dflt", None, {"fp8": 1, "two_node_steps": 64})'
ab hkv_tree_verify 8 "[(32,4096,0,None),(16,6000,0,None),(8,4096,0,None),(4,4096,0,None),(1,4096,0,None),([512,1024,2048,3000,4096,6000,8192,12000,16384,30000,4500,5000],0,0,None)]" 250
ab hkv_tree_decode 1 "[(32,4096,0,None),(8,4096,0,None)]" 80
timeout 150 python3 tools/attn2/fp8_hkv16_check.py 2>&1 | grep -Ev "$F" > $OUT/fp8_hkv16_check.log
echo "fp8_hkv16_check rc=$?"; tail -30 $OUT/fp8_hkv16_check.log
true
