# GPU machine (carry .device): the reduction tree's node size, the plan's (a node per 128 ring steps,
# attn2_plan.NODE_MIN_STEPS, both cache dtypes) beside a node per 64 steps (the bf16 tree before the
# forty-eighth session), with tools/attn2/ab.py (3 rounds, interleaved; bits compared: the trees
# differ from L = 12288 to 65535). The forty-eighth session ran an earlier form of this script (at
# 0675efc, with the two-chunk wide layout's variants, since removed) and then PART 3 (at 6fafe66):
# bench/RESULTS.md, that session's section (its PART 3, bf16's GPU tests and memcheck, is now
# `DTYPE=bf16 bash tools/attn2/plan_tests_device.sh`). Two calls of under 600 s each:
#   PART=1 bash tools/attn2/tree_ab_device.sh    verify at L=16384 B=128, 64, 32, 16; L=32768 B=16, 8;
#            L=12288 B=16; decode at L=16384 B=128 and 32 and L=32768 B=8
#   PART=2 bash tools/attn2/tree_ab_device.sh    one to 24 requests at L = 16384 to 65536 and the mixed
#            batch (64 requests, L ~ U[512, 32768]), verify and decode
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/attn2/ab_helpers.sh
export AB_ROUNDS=3 PYTHONUNBUFFERED=1
V='("bf16", None, {}), ("bf16_nms64", None, {"node_min_steps": 64}), ("fp8", None, {"fp8": 1}), ("fp8_nms64", None, {"fp8": 1, "node_min_steps": 64})'
case ${PART:-1} in
1)
  ab tree_ab_verify 8 "[(128,16384,0,None),(64,16384,0,None),(32,16384,0,None),(16,16384,0,None),(16,32768,0,None),(8,32768,0,None),(16,12288,0,None)]" 330
  ab tree_ab_decode 1 "[(128,16384,0,None),(32,16384,0,None),(8,32768,0,None)]" 170 ;;
2)
  ab tree_ab_small 8 '[(1,16384,0,None),(1,32768,0,None),(2,65536,0,None),(4,16384,0,None),(4,32768,0,None),(12,16384,0,None),(24,24576,0,None),("mixed",0,0,None)]' 250
  ab tree_ab_small_decode 1 '[(1,32768,0,None),(4,16384,0,None),("mixed",0,0,None)]' 120 ;;
esac
true
