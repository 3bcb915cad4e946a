# GPU machine: ncu's per-instruction (SASS) stall samples of one kernel launch (the third matching one),
# as csv under $OUT for a diff between two versions on the CPU, and its warp-state summary:
#   bash tools/ncu_sass.sh TAG "B L W" [k=v overrides]     attn2 (tools/attn2/ncu_case.py; ATTN2_FILE=a kernel copy)
#   KERNEL=QkvFront CASE="tools/qkv_front/ncu_case.py 8" bash tools/ncu_sass.sh TAG      any other case
tag="$1"; shift
if [ -n "${CASE:-}" ]; then cmd="python3 $CASE"; else c="$1"; shift; cmd="python3 tools/attn2/ncu_case.py $c $*"; fi
timeout 200 ncu --clock-control none -k "regex:${KERNEL:-Attn2}" --launch-skip 2 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --import-source no -o "$OUT/rep_$tag" \
  $cmd > "$OUT/ncu_$tag.log" 2>&1
ncu -i "$OUT/rep_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$tag.csv" 2>&1
ncu -i "$OUT/rep_$tag.ncu-rep" --page details --section WarpStateStats > "$OUT/wss_$tag.txt" 2>&1
rm -f "$OUT/rep_$tag.ncu-rep"
grep -E "case " "$OUT/ncu_$tag.log"; wc -l "$OUT/src_$tag.csv"; grep -E "Stall|Cycles" "$OUT/wss_$tag.txt" | head -8
