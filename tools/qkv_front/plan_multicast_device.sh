# GPU machine (carry .device): the plan's weight-multicast whole-K tile (WHOLE_K_MULTICAST_TILES,
# 128 x 2) checked and timed, most important first, each part under its own timeout; logs under
# $OUT (the forty-third session's call 2).
#   1. the plan (multicast where it picks 128 x 2) against the same tile without multicast, at the
#      rows the plan gives it: Hkv 2 M = 640 (5 tiles and a helper), 768, 1536, 1700; Hkv 1 M = 1152
#      (9 and a helper), 1536; cuBLAS's matmul beside them (tools/qkv_front/ab.py, same bits checked);
#   2. the qkv_front GPU suite;
#   3. ncu of 112 x 3 whole-K with and without weight multicast at Hkv 2 M = 1024: what the L2
#      bytes cut by multicast did to the L2 throughput and the duration;
#   4. compute-sanitizer memcheck and synccheck on the multicast cases of
#      tools/qkv_front/sanitize_case.py (from case 12).
#   bash tools/qkv_front/plan_multicast_device.sh
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
V="{};{'tile': (128, 2), 'whole_k': True}"
ab_part plan_h2 2 640,768,1536,1700 5 90
ab_part plan_h1 1 1152,1536 5 60
gpu_tests_part qkv_front 120 tests/test_qkv_front_cutedsl.py
for over in "{'tile': (112, 3), 'whole_k': True}" "{'tile': (112, 3), 'whole_k': True, 'w_multicast': True}"; do
  tag=$(echo "$over" | grep -q w_multicast && echo wkmc || echo wk)
  timeout 70 ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:QkvFront \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --metrics lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,sm__cycles_active.avg,smsp__inst_executed.sum \
    python3 tools/qkv_front/ncu_case.py 1024 2 "$over" > $OUT/ncu_$tag.log 2>&1
  echo "== ncu $tag"; grep -E "case |Duration|L2 Cache Throughput|Compute \(SM\)|SM Frequency|lts__t_bytes|lts__t_sectors_srcunit|xbar2l1tex|sm__cycles_active|inst_executed|Max Bandwidth|long_scoreboard|L2 Hit" $OUT/ncu_$tag.log | head -16
done
sanitize_part 12 90 memcheck synccheck
