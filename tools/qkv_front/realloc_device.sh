# GPU machine (carry .device): register reallocation as it was before the plan took it (a producer
# warpgroup that gives its registers to two consumer warpgroups, so two-head whole-K tiles reach
# 224 tokens; the forty-fourth session's first call), checked and timed, most important first; logs under $OUT.
#   1. its GPU test (the same bits as the default variant at Hkv 1, 2, 4, also with weight multicast);
#   2. ab.py at Hkv 2 M=1024, 1536, 2048 and Hkv 1 M=1536: the plan, 160 x 2 (the largest whole-K
#      two-head tile without it), 160, 192 and 224 x 2 with it (224 with weight multicast too), cuBLAS;
#   3. compute-sanitizer synccheck and racecheck of a reallocated tile (tools/qkv_front/sanitize_case.py
#      from case 14).
#   bash tools/qkv_front/realloc_device.sh
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
gpu_tests_part realloc 120 tests/test_qkv_front_cutedsl.py -k register_reallocation
R="'whole_k': True, 'register_reallocation': True"
V="{};{'tile': (160, 2), 'whole_k': True};{'tile': (160, 2), $R};{'tile': (192, 2), $R};{'tile': (224, 2), $R};{'tile': (224, 2), $R, 'w_multicast': True}"
ab_part realloc_h2 2 1024,1536,2048 5 150
ab_part realloc_h1 1 1536 5 80
sanitize_part 14 120 synccheck racecheck
