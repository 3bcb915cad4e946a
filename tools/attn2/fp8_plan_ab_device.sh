# GPU machine (carry .device): an FP8 cache's development knobs (attn2_plan.FP8_DECODE_KNOBS) each set
# the other way, with tools/attn2/ab.py (3 rounds, interleaved; bits compared; the tree's node size:
# tools/attn2/tree_ab_device.sh):
#   fp8        the plan's variant
#   flip_pb    Attn2Config.page_box the other way (verify: one box a page; decode: two)
#   flip_rot   Attn2Config.refill_warp the other way (verify: each warp in turn; decode: warp 0)
# verify at B=128 L=16384, B=16 L=65536, B=64 and B=32 L=16384, B=8 L=32768, B=16 L=12288; decode at
# B=128 and B=32 L=16384, B=16 L=65536, B=8 L=32768 and B=1 L=32768, with bf16 beside. The forty-seventh
# session's two calls that chose the plan timed the same variants under other names, with a node per 64
# steps beside them (RESULTS.md).
#   bash tools/attn2/fp8_plan_ab_device.sh
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/attn2/ab_helpers.sh
export AB_ROUNDS=3 PYTHONUNBUFFERED=1
flip() {   # the variant's knobs set the other way (attn2_plan.flipped_knobs), as an override dict
  python3 -c "from muse_ops.cutedsl.attn2_plan import flipped_knobs as f; k = f($1, True); print({'fp8': 1, '$2': k['$2']})"
}
for q_len in 8 1; do
  V="(\"fp8\", None, {\"fp8\": 1}), (\"flip_pb\", None, $(flip $q_len page_box)), (\"flip_rot\", None, $(flip $q_len refill_warp))"
  if [ $q_len = 8 ]; then
    C='[(128,16384,0,None),(16,65536,0,None),(64,16384,0,None),(32,16384,0,None),(8,32768,0,None),(16,12288,0,None)]'
  else
    V="$V, (\"bf16\", None, {})"
    C='[(128,16384,0,None),(16,65536,0,None),(32,16384,0,None),(8,32768,0,None),(1,32768,0,None)]'
  fi
  AB_QLEN=$q_len AB_VARIANTS="[$V]" AB_CASES="$C" timeout 280 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/fp8_plan_ab_q$q_len.log
  echo "q_len $q_len"; grep -E "^AB|Error|Traceback" $OUT/fp8_plan_ab_q$q_len.log
done
true
