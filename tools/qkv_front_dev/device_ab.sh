# qkv_front A/B on the device: AB_SMALL variants at small M, AB_LARGE at large M. Logs under $OUT.
# OLD=path (a copy of the kernel module before a change, in the git-ignored _bounds/: carry it)
# without AB_SMALL: the copy against the package's kernel, each timed twice in alternation (the
# first variant timed at a large M reads high), at SMALL_M (every tile: SMALL_M=1,8,16,64,72,128,
# 192,256,300,512,1024). device_iter.sh runs the qkv_front GPU tests first; device_final.sh the
# sanitizers.
. .device/prelude.sh
[ -n "$OLD" ] && [ -z "$AB_SMALL" ] && AB_SMALL="{'kernel': '$OLD'};{};{'kernel': '$OLD'};{}"
export PYTHONPATH=$PWD:$PYTHONPATH MUSE_OPS_CACHE_DIR=/tmp/muse_cache
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop'
AB_M=${SMALL_M:-1,8,16} AB_VARIANTS="$AB_SMALL" timeout 250 python3 tools/qkv_front_dev/ab.py > $OUT/ab_small.log 2>&1; echo "small rc=$?"; grep -Ev "$F" $OUT/ab_small.log | tail -60
[ -n "$AB_LARGE" ] && { AB_M=${LARGE_M:-256,512} AB_VARIANTS="$AB_LARGE" timeout 200 python3 tools/qkv_front_dev/ab.py > $OUT/ab_large.log 2>&1; echo "large rc=$?"; grep -Ev "$F" $OUT/ab_large.log | tail -40; }
