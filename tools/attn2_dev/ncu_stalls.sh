# device: ncu warp-stall breakdown of one attn2 case: bash ncu_stalls.sh "B L W" [k=v overrides]
c="$1"; shift
tag="${c// /_}${*:+_${*// /_}}"
timeout 150 ncu --clock-control none -k regex:Attn2 --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,dram__bytes_read.sum \
  python3 tools/attn2_dev/ncu_case.py $c "$@" > "$OUT/ncu_$tag.log" 2>&1
grep -E "case |Duration|DRAM Throughput|Achieved Occ|Issued Warp|No Eligible|stalled_.*ratio +[0-9.]*[1-9]|inst_executed|dram__bytes" "$OUT/ncu_$tag.log" \
  | grep -vE "ratio +0\.0[0-4]" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -40
