# GPU machine (carry .device): Attn2Config.node_cta (one deep CTA a node, its two subs in turn; the
# deep pair's bits) and Attn2Config.fine_nodes 4 (a tree of at least min(n_steps // 64, 4) nodes:
# four nodes from L = 16384, a node per 128 steps beyond 512 steps) beside the plan, with
# tools/attn2/ab.py (3 rounds, interleaved), bf16 and FP8. Variants: plan; fine (fine_nodes 4, the
# host's layout); fine_nc (fine_nodes 4, deep with node_cta); nc (the plan's tree, deep with node_cta).
# Two calls of under 600 s each:
#   PART=1 bash tools/attn2/node_cta_ab_device.sh   the GPU bit test of node_cta, then verify at L=16384
#            B=128, 64, 32, 16 and the mixed batch (64 requests, L ~ U[512, 32768])
#   PART=2 bash tools/attn2/node_cta_ab_device.sh   decode at L=16384 B=128 and 16 and the mixed batch;
#            verify B=32 L=4096 at Hkv 16 and B=24 L=24576
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
export AB_ROUNDS=3 PYTHONUNBUFFERED=1
N='"layout": "deep", "node_cta": True'
V="(\"plan\", None, {}), (\"fine\", None, {\"fine_nodes\": 4}), (\"fine_nc\", None, {\"fine_nodes\": 4, $N}), (\"nc\", None, {$N}),
   (\"fp8\", None, {\"fp8\": 1}), (\"fp8_fine\", None, {\"fp8\": 1, \"fine_nodes\": 4}),
   (\"fp8_fine_nc\", None, {\"fp8\": 1, \"fine_nodes\": 4, $N}), (\"fp8_nc\", None, {\"fp8\": 1, $N})"
ALL=None
THREE='["plan","fine","fine_nc","fp8","fp8_fine","fp8_fine_nc"]'
TWO='["plan","fine","fp8","fp8_fine"]'
NC='["plan","nc","fp8","fp8_nc"]'
ab() {   # ab LOG QLEN CASES TIMEOUT [HKV]
  AB_HKV=${5:-2} AB_QLEN=$2 AB_VARIANTS="[$V]" AB_CASES="$3" timeout $4 python3 tools/attn2/ab.py 2>&1 | grep -Ev "$F" > $OUT/$1.log
  echo "$1"; grep -E "^AB|Error|Traceback" $OUT/$1.log
}
case ${PART:-1} in
1)
  timeout 200 python3 -m pytest -q tests/test_attn2_cutedsl.py -k node_cta -p no:cacheprovider -W ignore \
    > $OUT/pytest_node_cta.log 2>&1
  echo "node_cta tests rc=$?"; grep -Ev "$F" $OUT/pytest_node_cta.log | tail -8
  ab node_cta_ab_verify 8 "[(128,16384,0,$ALL),(64,16384,0,$THREE),(32,16384,0,$THREE),(16,16384,0,$TWO),(\"mixed\",0,0,$THREE)]" 370 ;;
2)
  ab node_cta_ab_decode 1 "[(128,16384,0,$ALL),(16,16384,0,$TWO),(\"mixed\",0,0,$THREE)]" 250
  ab node_cta_ab_hkv16 8 "[(32,4096,0,$NC)]" 90 16
  ab node_cta_ab_24 8 "[(24,24576,0,$TWO)]" 90 ;;
esac
true
