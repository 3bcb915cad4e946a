# GPU machine (carry .device): where the L2's x traffic may bind qkv_front (two-head tiles re-read x
# for every head group: at Hkv 16 M=256 the 128 x 2 cluster tile reads about 600 MB of x and 600 MB
# of weight from the L2 for a 302 MB weight): x multicast over pairs of head groups, the 256 x 2
# cluster tile (x read half as often) and weight multicast, against the plan, at Hkv 16, 8 and 4
# from 128 to 512 tokens; then racecheck of the 192 x 2 reallocated case (sanitize case 15). Logs
# under $OUT.
#   bash tools/qkv_front/x_traffic_device.sh
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
WK="'whole_k': True"
V="{};{'x_multicast': True};{'tile': (256, 2)};{'tile': (256, 2), 'x_multicast': True};{'tile': (128, 2), $WK, 'w_multicast': True};{'tile': (128, 2), $WK, 'x_multicast': True}"
ab_part x_h16 16 128,256,512 3 200
ab_part x_h8 8 256,512 3 120
ab_part x_h4 4 512 3 60
sanitize_part 15 240 racecheck
