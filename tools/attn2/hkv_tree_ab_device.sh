# GPU machine (carry .device): the reduction tree at Hkv 16 (TP1), where a batch holds 8x the
# (request, KV head) pairs of Hkv 2 at the same B: the plan's coarse tree there
# (attn2_plan.COARSE_TREE: one node below 128 steps, a node per 256 steps) beside the default tree
# (two nodes from 64 steps, a node per 128) and the default with one node below 128 steps (t128),
# through the tree's knobs (Attn2Config.two_node_steps, node_min_steps), with tools/attn2/ab.py (3
# rounds, interleaved), bf16 and FP8; then the coarse tree's GPU tests. One call of under 600 s:
#   bash tools/attn2/hkv_tree_ab_device.sh
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
export AB_ROUNDS=3 PYTHONUNBUFFERED=1 AB_HKV=${AB_HKV:-16}
D='"two_node_steps": 64, "node_min_steps": 128'
T='"two_node_steps": 128, "node_min_steps": 128'
V="(\"default\", None, {$D}), (\"plan\", None, {}), (\"t128\", None, {$T}),
   (\"fp8_default\", None, {\"fp8\": 1, $D}), (\"fp8\", None, {\"fp8\": 1}), (\"fp8_t128\", None, {\"fp8\": 1, $T})"
TWO='["default","plan","fp8_default","fp8"]'
ab() {   # ab LOG QLEN CASES TIMEOUT
  AB_QLEN=$2 AB_VARIANTS="[$V]" AB_CASES="$3" timeout $4 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/$1.log
  echo "$1"; grep -E "^AB|Error|Traceback" $OUT/$1.log
}
ab hkv_tree_verify 8 "[(32,4096,0,None),(8,4096,0,$TWO),(1,4096,0,$TWO),(4,32768,0,$TWO),(2,65536,0,$TWO),([512,1024,2048,3000,4096,6000,8192,12000,16384,30000,4500,5000],0,0,$TWO)]" 270
ab hkv_tree_decode 1 "[(32,4096,0,$TWO),(4,32768,0,$TWO)]" 80
timeout 130 python3 -m pytest -q tests/test_attn2_cutedsl.py -k coarse_tree -p no:cacheprovider -W ignore \
  > $OUT/pytest_coarse_tree.log 2>&1
echo "coarse tree tests rc=$?"; grep -Ev "$F" $OUT/pytest_coarse_tree.log | tail -8
true
