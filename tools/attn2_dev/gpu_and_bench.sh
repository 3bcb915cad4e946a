MODE=dsl PART=gpu bash tools/shims_device_run.sh
. .device/prelude.sh && . tools/device_env.sh
timeout 330 python3 -m muse_ops bench --cases layer --contenders muse:cutedsl stock --no-check --json $OUT/bench-layer.json --markdown $OUT/bench-layer.md > $OUT/bench.log 2>&1; echo bench rc=$?
grep -E "^\|" $OUT/bench-layer.md | head -40
