# GPU machine: ncu of qkv_front and of cuBLAS's matmul at one M (the bench's inputs, cold weights:
# tools/qkv_front/ncu_case.py); speed of light, memory, warp state, occupancy; the logs under $OUT:
#   bash tools/qkv_front/ncu.sh M [Hkv]
m=$1
timeout 200 ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:QkvFront \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
  --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio \
  python3 tools/qkv_front/ncu_case.py "$@" > "$OUT/ncu_qkv_$m.log" 2>&1
timeout 200 ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:'gemm|nvjet|sm90' \
  --section SpeedOfLight --section LaunchStats --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  python3 tools/qkv_front/ncu_case.py "$@" > "$OUT/ncu_cublas_$m.log" 2>&1
for f in "$OUT/ncu_qkv_$m.log" "$OUT/ncu_cublas_$m.log"; do echo "== $f"; grep -E "case |Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|dram__|lts__t_sector_hit|Grid Size|Registers|Shared Memory Config|Achieved Occ|Issued Warp|No Eligible|Mem Busy|Max Bandwidth|L1/TEX Hit|L2 Hit|stalled" "$f" | head -30; done
