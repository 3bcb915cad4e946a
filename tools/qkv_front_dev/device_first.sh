# first device call of the qkv_front kernel: correctness, then attn2 regression, the op plumbing
# on this torch, then timing. Logs under $OUT.
. .device/prelude.sh
export PYTHONPATH=$PWD:$PYTHONPATH MUSE_OPS_CACHE_DIR=/tmp/muse_cache
F='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas'
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
timeout 200 python3 -m pytest -q -x tests/test_qkv_front_cutedsl.py -p no:cacheprovider > $OUT/qkv_tests.log 2>&1; echo "qkv tests rc=$?"; grep -Ev "$F" $OUT/qkv_tests.log | tail -25
timeout 120 python3 -m pytest -q tests/test_ops.py tests/test_module.py tests/test_qkv_front.py -p no:cacheprovider > $OUT/cpu_tests.log 2>&1; echo "ops tests rc=$?"; grep -Ev "$F" $OUT/cpu_tests.log | tail -8
timeout 150 python3 tools/qkv_front_dev/time_variants.py > $OUT/time.log 2>&1; echo "time rc=$?"; grep -Ev "$F" $OUT/time.log | tail -40
