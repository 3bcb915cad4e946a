# Issue 48's FP8 bench on the GPU machine in one call (under 5 minutes on an H100): the bench's
# --suite fp8 (attn2 verify and decode at B=128 L=16384, B=16 L=65536, B=8 L=32768, B=32 L=4096 Hkv 16,
# B=64 and B=1 at L=8192, sliding B=64 L=8192; the layer at B=1, 8, 32, 64, 128, L=8192, full and
# sliding), each case with a bf16 and an FP8 cache, beside the peers; JSON, log and markdown (its
# "FP8 cache beside bf16" tables and the KV capacity table) under $OUT, the tables printed at the end.
#
#   bash tools/bench_fp8_device.sh              the CuTe DSL bundle (carry .device): muse's kernels,
#                                               FlashInfer (bf16, and e4m3 where it has a kernel), the
#                                               stock layer path on FlashInfer
#   MODE=fa3 bash tools/bench_fp8_device.sh     DSL-free over the AOT library with FA3 (and FlashInfer
#                                               where carried): tools/fa3_device_env.sh says what to
#                                               build and carry
#
# Knobs: BENCH_BUDGET (s, default 210: no contender starts after it; the rest are marked skipped, the
# JSON keeps every row run) and BENCH_TIMEOUT (default 255); CASES: case-name fragments separated by
# ";" to rerun a part (CASES="B=128 L=16384;B=1 L=8192": those cases of both ops; CASES="layer;W=2048":
# the sliding layer rows; "attn2" / "layer" pick an op, the other fragments its cases); CHECK=0 skips the
# float64 checks; CONTENDERS: contender-name fragments separated by spaces, instead of the mode's.
# Two runs' JSON render as one section (the second's contenders join as columns):
#   python -m muse_ops bench --render bench_fp8.json bench_fp8_fa3.json
# but a cell is comparable with another only where both came from the same GPU (the header says which).
MODE=${MODE:-dsl}
case $MODE in
dsl)
  . .device/prelude.sh
  . tools/device_env.sh
  TAG=fp8
  DEFAULT_CONTENDERS="muse:cutedsl muse:default flashinfer stock" ;;
fa3)
  . tools/fa3_device_env.sh
  TAG=fp8_fa3
  DEFAULT_CONTENDERS="muse:cutedsl muse:default fa3 flashinfer stock" ;;
*) echo "MODE must be dsl or fa3" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
ARGS=()
[ "${CHECK:-1}" = 0 ] && ARGS+=(--no-check)
if [ -n "${CASES:-}" ]; then
  IFS=';' read -ra _cases <<< "$CASES"
  ARGS+=(--cases "${_cases[@]}")
fi
read -ra _contenders <<< "${CONTENDERS:-$DEFAULT_CONTENDERS}"
timeout "${BENCH_TIMEOUT:-255}" python3 -m muse_ops bench --suite fp8 --cache-dtype bf16,fp8 \
  --contenders "${_contenders[@]}" "${ARGS[@]}" \
  --budget-s "${BENCH_BUDGET:-210}" --json "$OUT/bench_$TAG.json" --markdown "$OUT/bench_$TAG.md" \
  > "$OUT/bench_$TAG.log" 2>&1
echo "bench rc=$?"
grep -E "muse_ops bench on|floors:|CHECK FAILED|ERROR|skipped|done" "$OUT/bench_$TAG.log" | tail -24
if [ -f "$OUT/bench_$TAG.md" ]; then
  # the FP8 tables and the capacity table (the whole markdown is under $OUT)
  awk '/^### (attn2|layer): FP8 cache beside bf16/{p=1} /^### KV cache capacity/{p=1} /^Notes:/{p=0} p' "$OUT/bench_$TAG.md"
fi
