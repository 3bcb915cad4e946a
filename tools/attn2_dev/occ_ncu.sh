# device: occupancy variant timing + ncu on the current kernel. Logs under $OUT.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas'
python3 - <<'PY' 2>&1 | grep -Ev "$F" | tee $OUT/occ.log
import sys; sys.path.insert(0, "tools/attn2_dev")
import run_dev
for (B, L, W) in [(1, 8192, 0), (32, 4096, 0), (64, 8192, 0), (16, 65536, 0), (64, 8192, 2048)]:
    for over in [dict(), dict(min_blocks=4), dict(min_blocks=4, stages=6), dict(min_blocks=4, s_max=64, min_steps=4)]:
        us, fl, by = run_dev.bench_case(B, L, W, over=over)
        print(f"OCC {str((B, L, W)):20s} {str(over):45s} {us:8.2f} floor {fl:7.2f} ratio {us/fl:5.2f}", flush=True)
PY
for c in "16 65536 0" "1 8192 0"; do
  timeout 150 ncu --clock-control none -k regex:Attn2 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 tools/attn2_dev/ncu_case.py $c > "$OUT/ncu_${c// /_}.log" 2>&1
  grep -E "Duration|Throughput|Registers|Achieved Occ|Theoretical Occ|Block Limit|Issued Ipc|No Eligible|Stall|Warp Cycles|Waves|DRAM|L2 Hit|One or More" "$OUT/ncu_${c// /_}.log" | head -40
done
