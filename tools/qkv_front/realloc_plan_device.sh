# GPU machine (carry .device): the plan's reallocated whole-K tiles (two-head tiles from
# REALLOCATE_FROM_TILE tokens reallocate the registers; 192 x 2 and 224 x 2 are launch tiles) against
# the tile the plan took before them, at rows where the pick changed, most important first; logs
# under $OUT. {} is the plan; the other variants are the tiles it picked before (each row's own is
# named in bench/RESULTS.md's forty-fourth section); cuBLAS's matmul beside them.
# Then (part "check", a second call: each part fits a call's 10 minutes) the qkv_front GPU tests and
# compute-sanitizer's synccheck, racecheck and memcheck of the reallocated tiles' cases.
#   bash tools/qkv_front/realloc_plan_device.sh ab; bash tools/qkv_front/realloc_plan_device.sh check
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
if [ "$1" = ab ]; then
WK="'whole_k': True"
V="{};{'tile': (128, 2), $WK, 'w_multicast': True}"
ab_part plan_h2 2 1300,1536 3 90
V="{};{'tile': (160, 2), $WK, 'register_reallocation': False}"
ab_part plan_160 2 1120 3 60
V="{};{'tile': (256, 2)}"
ab_part plan_h4 4 640,1536 3 90
V="{};{'tile': (96, 3), $WK};{'tile': (160, 2), $WK, 'register_reallocation': False};{'tile': (256, 2)}"
ab_part plan_h8 8 1536,1700,2000 3 150
V="{};{'tile': (160, 2), $WK, 'register_reallocation': False};{'tile': (112, 3), $WK};{'tile': (256, 2)}"
ab_part plan_h16 16 1500,1792,2048 3 180
V="{};{'tile': (128, 2)};{'tile': (256, 2)};{'tile': (96, 3), $WK}"
ab_part plan_h3 3 896,1664,2016 3 150
fi
if [ "$1" = check ]; then
gpu_tests_part qkv_front 330 tests/test_qkv_front_cutedsl.py
sanitize_part 14 80 synccheck racecheck memcheck
fi
