# GPU machine (carry .device's prelude.sh, the CuTe DSL bundle and the two TVM-FFI wheels): issue 49's
# weight multicast (QkvFrontConfig.w_multicast) measured, most important first, each part under its
# own timeout so that a hang costs only its part; logs under $OUT.
#   1. Hkv 2 (M=1024, 2048, 512): the plan's tile, whole-K tiles with and without weight multicast
#      (tools/qkv_front/ab.py: cuBLAS's matmul beside them, every variant's bits against the plan's);
#   2. the GPU test of both multicast forms (weight alone, weight + x);
#   3. Hkv 4 and 8 at M=1024, the same variants;
#   4. weight + x multicast (clusters of 2 token tiles x 2 head groups) at Hkv 2 M=1024, last: its
#      cluster of 4 is the least tried;
#   5. more rows for the plan's grid_cost (Hkv 2 M=768 and 1536, Hkv 1 and 16 M=1024), if time is left.
#   bash tools/qkv_front/multicast_device.sh
. .device/prelude.sh && . tools/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'
W="'whole_k': True"; MC="'whole_k': True, 'w_multicast': True"
V="{};{'tile': (112, 3), $W};{'tile': (112, 3), $MC};{'tile': (96, 3), $W};{'tile': (96, 3), $MC};{'tile': (160, 2), $W};{'tile': (160, 2), $MC};{'tile': (128, 2), $MC}"
sweep() {  # Hkv, M list, timeout, log tag
  AB_HKV=$1 AB_M=$2 AB_ROUNDS=3 AB_VARIANTS="$V" timeout $3 python3 tools/qkv_front/ab.py 2>&1 | grep -Ev "$F" > $OUT/ab_h$1$4.log
  echo "== Hkv $1 $4"; grep -E "^M=.* us|DIFFERENT|False|Error|Traceback" $OUT/ab_h$1$4.log \
    | sed "s/'whole_k': True, 'w_multicast': True/wkmc/; s/'whole_k': True/wk/"
}
sweep 2 1024,2048,512 120
timeout 120 python3 -m pytest -q -m gpu tests/test_qkv_front_cutedsl.py -k "weight_multicast" -p no:cacheprovider 2>&1 \
  | grep -Ev "$F" > $OUT/pytest_multicast.log; tail -3 $OUT/pytest_multicast.log
sweep 4 1024 60
sweep 8 1024 60
V_ALL=$V
V="{};{'tile': (112, 3), $MC};{'tile': (112, 3), $MC, 'x_multicast': True}"
sweep 2 1024,2048 50 _xw
V=$V_ALL
sweep 2 768,1536 60 _fit
sweep 1 1024 40 _fit
sweep 16 1024 60 _fit
true
