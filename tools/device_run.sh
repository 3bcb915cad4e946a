# The GPU machine's record of a change (carry .device; each PART fits one call's 600 s); logs under $OUT.
#   PART=tests     the GPU tests (-m gpu), the demo, prepare() of both deployments cold then warm
#   PART=sanitize  compute-sanitizer memcheck, racecheck and synccheck on both ops' small cases
#                  (tools/qkv_front/sanitize_case.py, tools/attn2/sanitize_case.py)
#   PART=bench     the full bench table (attn2, qkv_front, layer, the PDL chain), JSON + markdown
#   PART=tests bash tools/device_run.sh
. .device/prelude.sh
. tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop|DEBUG'
case "${PART:-tests}" in
tests)
  timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu tests -p no:cacheprovider -W ignore --durations=5 > $OUT/pytest_gpu.log 2>&1
  echo "pytest gpu rc=$?"; grep -Ev "$F" $OUT/pytest_gpu.log | tail -14
  timeout 120 python3 -m muse_ops demo > $OUT/demo.log 2>&1; echo "demo rc=$?"; grep -Ev "$F" $OUT/demo.log | tail -14
  for c in cold warm; do
    [ $c = cold ] && rm -rf /tmp/prep_cache    # a cache of its own on the GPU machine
    MUSE_OPS_CACHE_DIR=/tmp/prep_cache timeout 150 python3 -c "
import time, torch, muse_ops
t = time.perf_counter()
for cfg in (muse_ops.DeploymentConfig.sliding(kv_heads=2), muse_ops.DeploymentConfig.full(kv_heads=2)):
    r = muse_ops.prepare(cfg, 'cuda')
    hows = {}
    for v in r['variants']:
        hows.setdefault((v['op'], v['how']), []).append(v['seconds'])
    print('$c', 'window', cfg.window, {f'{op} {how}': f'{len(s)} variants, {sum(s):.2f} s (max {max(s):.2f})' for (op, how), s in hows.items()})
print('$c total %.2f s for both deployments, CUDA init included' % (time.perf_counter() - t))
" 2>&1 | grep -Ev "$F" | tail -3
  done ;;
sanitize)
  for t in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $t python3 tools/qkv_front/sanitize_case.py > $OUT/san_qkv_$t.log 2>&1
    echo "== qkv_front $t rc=$?"; grep -Ev "$F" $OUT/san_qkv_$t.log | tail -3
  done
  for t in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $t python3 tools/attn2/sanitize_case.py > $OUT/san_attn2_$t.log 2>&1
    echo "== attn2 $t rc=$?"; grep -Ev "$F" $OUT/san_attn2_$t.log | tail -3
  done ;;
bench)
  timeout ${BENCH_TIMEOUT:-560} python3 -m muse_ops bench --cache-dtype ${CACHE_DTYPE:-bf16} --json $OUT/bench.json --markdown $OUT/bench.md \
    --budget-s ${BENCH_BUDGET:-480} > $OUT/bench.log 2>&1
  echo "bench rc=$?"; grep -E "CHECK FAILED|ERROR|skipped|done" $OUT/bench.log | tail -20 ;;
*) echo "PART must be tests, sanitize or bench" >&2; exit 2 ;;
esac
