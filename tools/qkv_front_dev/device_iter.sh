# one iteration on the device: the qkv_front GPU tests, then the A/B of device_ab.sh. Logs under $OUT.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH MUSE_OPS_CACHE_DIR=/tmp/muse_cache
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop'
timeout 200 python3 -m pytest -q -x tests/test_qkv_front_cutedsl.py -p no:cacheprovider -W ignore > $OUT/qkv_tests.log 2>&1; echo "qkv tests rc=$?"; grep -Ev "$F" $OUT/qkv_tests.log | tail -6
bash tools/qkv_front_dev/device_ab.sh
