# The GPU record of a session, in two device calls (each under the 600 s limit); logs under $OUT.
#   PART=tests  the GPU tests, the demo, prepare cold then warm, compute-sanitizer memcheck on qkv_front
#   PART=bench  the full bench table (attn2, qkv_front, layer, the PDL chain), JSON + markdown
. .device/prelude.sh
. tools/device_env.sh
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop|DEBUG'
if [ "${PART:-tests}" = tests ]; then
  timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu tests -p no:cacheprovider -W ignore --durations=5 > $OUT/pytest_gpu.log 2>&1
  echo "pytest gpu rc=$?"; grep -Ev "$F" $OUT/pytest_gpu.log | tail -14
  timeout 120 python3 -m muse_ops demo > $OUT/demo.log 2>&1; echo "demo rc=$?"; grep -Ev "$F" $OUT/demo.log | tail -14
  for c in cold warm; do
    [ $c = cold ] && rm -rf /tmp/prep_cache
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
  done
  timeout 150 compute-sanitizer --tool memcheck python3 tools/qkv_front_dev/sanitize_case.py > $OUT/san_qkv_memcheck.log 2>&1
  echo "== qkv memcheck rc=$?"; grep -Ev "$F" $OUT/san_qkv_memcheck.log | tail -3
else
  timeout ${BENCH_TIMEOUT:-560} python3 -m muse_ops bench --json $OUT/bench.json --markdown $OUT/bench.md \
    --budget-s ${BENCH_BUDGET:-480} > $OUT/bench.log 2>&1
  echo "bench rc=$?"; grep -E "CHECK FAILED|ERROR|skipped|done" $OUT/bench.log | tail -20
fi
