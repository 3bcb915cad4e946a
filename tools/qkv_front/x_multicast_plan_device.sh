# GPU machine (carry .device): the plan's x multicast tile (128 x 2 at 193-256 tokens where the heads
# exceed a wave, Hkv >= 8) against the same tile without it, at Hkv 8 and 16; then the GPU tests
# that launch it (the x multicast test at Hkv 1, 2, 3, 8 and the serving sizes at Hkv 1-16) and
# compute-sanitizer's memcheck, synccheck and racecheck of its case (sanitize case 16). Logs under $OUT.
#   bash tools/qkv_front/x_multicast_plan_device.sh
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
V="{};{'x_multicast': False}"
ab_part xplan_h16 16 200,256 3 100
ab_part xplan_h8 8 200,256 3 80
gpu_tests_part xplan 150 tests/test_qkv_front_cutedsl.py -k "x_multicast or serving_sizes"
sanitize_part 16 60 memcheck synccheck racecheck
