# GPU machine: ncu's warp-stall breakdown of one attn2 launch (the third of tools/attn2/ncu_case.py's case),
# with its speed of light, occupancy and DRAM bytes; the full report under $OUT:
#   bash tools/attn2/ncu_stalls.sh "B L W" [k=v launch-config overrides]
c="$1"; shift
tag="${c// /_}${*:+_${*// /_}}"; tag="${tag//=/-}"
timeout 150 ncu --clock-control none -k regex:Attn2 --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,dram__bytes_read.sum \
  python3 tools/attn2/ncu_case.py $c "$@" > "$OUT/ncu_$tag.log" 2>&1
grep -E "case |Duration|DRAM Throughput|Achieved Occ|Issued Warp|No Eligible|inst_executed|dram__bytes|Warp Cycles Per Issued" "$OUT/ncu_$tag.log" | head -12
# the stall reasons of at least 0.05 cycles per issued instruction (the metric's value is the last field)
grep "issue_stalled_" "$OUT/ncu_$tag.log" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' \
  | awk '$NF + 0 >= 0.05 {print "   stall", $1, $NF}'
