# GPU machine (carry .device's prelude.sh, the CuTe DSL bundle and the two TVM-FFI wheels): issue 49's
# weight multicast (QkvFrontConfig.w_multicast) measured, most important first, each part under its
# own timeout so that a hang costs only its part; logs under $OUT (the forty-third session's call 1).
#   1. Hkv 2 (M=1024, 2048, 512): the plan's tile, whole-K tiles with and without weight multicast
#      (tools/qkv_front/ab.py: cuBLAS's matmul beside them, every variant's bits against the plan's);
#   2. the GPU test of both multicast forms (weight alone, weight + x);
#   3. Hkv 4 and 8 at M=1024, the same variants;
#   4. weight + x multicast (clusters of 2 token tiles x 2 head groups) at Hkv 2 M=1024, last: its
#      cluster of 4 is the least tried;
#   5. more rows for the plan's grid_cost (Hkv 2 M=768 and 1536, Hkv 1 and 16 M=1024), if time is left.
#   bash tools/qkv_front/multicast_device.sh
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
W="'whole_k': True"; MC="'whole_k': True, 'w_multicast': True"
V="{};{'tile': (112, 3), $W};{'tile': (112, 3), $MC};{'tile': (96, 3), $W};{'tile': (96, 3), $MC};{'tile': (160, 2), $W};{'tile': (160, 2), $MC};{'tile': (128, 2), $MC}"
ab_part h2 2 1024,2048,512 3 120
gpu_tests_part multicast 120 tests/test_qkv_front_cutedsl.py -k weight_multicast
ab_part h4 4 1024 3 60
ab_part h8 8 1024 3 60
V_ALL=$V
V="{};{'tile': (112, 3), $MC};{'tile': (112, 3), $MC, 'x_multicast': True}"
ab_part h2_xw 2 1024,2048 3 50
V=$V_ALL
ab_part h2_fit 2 768,1536 3 60
ab_part h1_fit 1 1024 3 40
ab_part h16_fit 16 1024 3 60
