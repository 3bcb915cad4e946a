# device: ncu per-instruction (SASS) stall samples of one attn2 case, as csv for a diff on the CPU:
#   bash ncu_source.sh TAG "B L W" [k=v overrides]   (ATTN2_FILE=a kernel copy, as ncu_case.py)
tag="$1"; c="$2"; shift 2
timeout 200 ncu --clock-control none -k regex:Attn2 --launch-skip 2 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --import-source no -o "$OUT/rep_$tag" \
  python3 tools/attn2_dev/ncu_case.py $c "$@" > "$OUT/ncu_$tag.log" 2>&1
ncu -i "$OUT/rep_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$tag.csv" 2>&1
ncu -i "$OUT/rep_$tag.ncu-rep" --page details --section WarpStateStats > "$OUT/wss_$tag.txt" 2>&1
rm -f "$OUT/rep_$tag.ncu-rep"
grep -E "case " "$OUT/ncu_$tag.log"; wc -l "$OUT/src_$tag.csv"; grep -E "Stall|Cycles" "$OUT/wss_$tag.txt" | head -8
