# GPU machine (carry .device): why weight multicast made an isolated launch of 112 x 3 whole-K at
# Hkv 2 M=1024 15% faster under ncu but back-to-back graph calls only 1% (bench/RESULTS.md, the
# forty-third session); logs under $OUT.
#   1. ab.py, 7 rounds, with and without multicast, with PDL on (the package's) and off (no
#      overlap of a call's weight loads with the previous call's tail);
#   2. the %globaltimer timeline of both in graph replay (tools/qkv_front/timeline.py): whether
#      the main loop shrinks and something after it grows, or the main loop stays.
#   bash tools/qkv_front/multicast_timeline_device.sh
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
W="'tile': (112, 3), 'whole_k': True"
V="{$W};{$W, 'w_multicast': True};{$W, 'pdl': False};{$W, 'w_multicast': True, 'pdl': False}"
ab_part pdl 2 1024,2048 7 120
for mc in False True; do
  TL_M=1024 TL_HKV=2 TL_OUT=$OUT/timeline_mc_$mc TL_OVER="{$W, 'w_multicast': $mc}" timeout 120 \
    python3 tools/qkv_front/timeline.py 2>&1 | grep -Ev "$QF_NOISE" > $OUT/timeline_mc_$mc.log
  echo "== timeline w_multicast=$mc"; grep -E "same bits|min |per call|Error|Traceback" $OUT/timeline_mc_$mc.log | head -16
done
