# qkv_front A/B on the device: AB_SMALL variants at small M, AB_LARGE at large M. Logs under $OUT.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH MUSE_OPS_CACHE_DIR=/tmp/muse_cache
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop'
AB_M=${SMALL_M:-1,8,16} AB_VARIANTS="$AB_SMALL" timeout 250 python3 tools/qkv_front_dev/ab.py > $OUT/ab_small.log 2>&1; echo "small rc=$?"; grep -Ev "$F" $OUT/ab_small.log | tail -60
[ -n "$AB_LARGE" ] && { AB_M=${LARGE_M:-256,512} AB_VARIANTS="$AB_LARGE" timeout 200 python3 tools/qkv_front_dev/ab.py > $OUT/ab_large.log 2>&1; echo "large rc=$?"; grep -Ev "$F" $OUT/ab_large.log | tail -40; }
