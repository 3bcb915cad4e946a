# GPU machine (carry .device): qkv_front A/B by tools/qkv_front/ab.py, AB_SMALL variants at the
# SMALL_M values (default 1,8,16), AB_LARGE at LARGE_M (default 256,512). Logs under $OUT.
# OLD=path (a copy of the kernel module before a change, e.g. `git show HEAD:muse_ops/cutedsl/qkv_front.py
# > build/qkv_front_old.py`; build/ is git-ignored, so name it in carry) without AB_SMALL: the copy
# against the package's kernel, each timed twice in alternation (the first variant timed at a large M
# reads high), at SMALL_M (every tile: SMALL_M=1,8,16,64,72,128,192,256,300,512,1024).
#   OLD=build/qkv_front_old.py bash tools/qkv_front/ab_device.sh
. .device/prelude.sh && . tools/device_env.sh
[ -n "$OLD" ] && [ -z "$AB_SMALL" ] && AB_SMALL="{'kernel': '$OLD'};{};{'kernel': '$OLD'};{}"
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|Warning|static loop'
AB_M=${SMALL_M:-1,8,16} AB_VARIANTS="$AB_SMALL" timeout 250 python3 tools/qkv_front/ab.py > $OUT/ab_small.log 2>&1; echo "small rc=$?"; grep -Ev "$F" $OUT/ab_small.log | tail -60
[ -n "$AB_LARGE" ] && { AB_M=${LARGE_M:-256,512} AB_VARIANTS="$AB_LARGE" timeout 200 python3 tools/qkv_front/ab.py > $OUT/ab_large.log 2>&1; echo "large rc=$?"; grep -Ev "$F" $OUT/ab_large.log | tail -40; }
true
