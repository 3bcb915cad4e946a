# GPU machine (carry .device): the reduction tree at Hkv 16 (TP1), where a batch holds 8x the
# (request, KV head) pairs of Hkv 2 at the same B, beside coarser trees through the tree's knobs
# (Attn2Config.two_node_steps, node_min_steps), with tools/attn2/ab.py (3 rounds, interleaved),
# bf16 and FP8. Variants: plan; t128 (one node below 128 steps, L < 8192); t128n256 (that, and a
# node per 256 steps: 2 nodes from 128 to 767 steps). One call of under 600 s:
#   bash tools/attn2/hkv_tree_ab_device.sh
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
export AB_ROUNDS=3 PYTHONUNBUFFERED=1 AB_HKV=${AB_HKV:-16}
V='("plan", None, {}), ("t128", None, {"two_node_steps": 128}), ("t128n256", None, {"two_node_steps": 128, "node_min_steps": 256}),
   ("fp8", None, {"fp8": 1}), ("fp8_t128", None, {"fp8": 1, "two_node_steps": 128}),
   ("fp8_t128n256", None, {"fp8": 1, "two_node_steps": 128, "node_min_steps": 256})'
T128='["plan","t128","fp8","fp8_t128"]'
N256='["plan","t128n256","fp8","fp8_t128n256"]'
ab() {   # ab LOG QLEN CASES TIMEOUT
  AB_QLEN=$2 AB_VARIANTS="[$V]" AB_CASES="$3" timeout $4 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/$1.log
  echo "$1"; grep -E "^AB|Error|Traceback" $OUT/$1.log
}
ab hkv_tree_verify 8 "[(32,4096,0,$T128),(8,4096,0,$T128),(2,4096,0,$T128),(1,4096,0,$T128),(4,32768,0,$N256),(1,32768,0,$N256),(2,65536,0,$N256),([512,1024,2048,3000,4096,6000,8192,12000,16384,30000,4500,5000],0,0,None)]" 420
ab hkv_tree_decode 1 "[(32,4096,0,$T128),(4,32768,0,$N256)]" 120
true
