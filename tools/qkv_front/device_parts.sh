# Sourced by the qkv_front device scripts (GPU machine, after .device/prelude.sh): the environment
# (tools/device_env.sh), the GPU's name and clock, and the parts those scripts are made of, each
# under its own timeout with its log under $OUT and a short summary on stdout.
. tools/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
# compiler chatter the logs leave out
QF_NOISE='^\s*[|>]|^\s*$|remark|-->|in function|^ptxas|^\s+\^|suggestion|Spilled|reports spill|region, not|live across|expressions or'

# ab_part TAG HKV M_LIST ROUNDS TIMEOUT: tools/qkv_front/ab.py over the variants in $V (";"-separated
# launch-config overrides), the first one's bits checked against each, cuBLAS's matmul beside them
ab_part() {
  AB_HKV=$2 AB_M=$3 AB_ROUNDS=$4 AB_VARIANTS="$V" timeout $5 python3 tools/qkv_front/ab.py 2>&1 \
    | grep -Ev "$QF_NOISE" > $OUT/ab_$1.log
  echo "== ab $1 (Hkv $2)"; grep -E "^M=.* us|DIFFERENT|False|Error|Traceback" $OUT/ab_$1.log \
    | sed "s/'whole_k': True, 'w_multicast': True/wkmc/; s/'whole_k': True/wk/"
}

# sanitize_part FROM TIMEOUT TOOL...: compute-sanitizer over tools/qkv_front/sanitize_case.py's
# cases from the FROM-th on
sanitize_part() {
  local from=$1 limit=$2 tool; shift 2
  for tool in "$@"; do
    SANITIZE_FROM=$from timeout $limit compute-sanitizer --tool $tool python3 tools/qkv_front/sanitize_case.py 2>&1 \
      | grep -Ev "$QF_NOISE" > $OUT/sanitize_${tool}_from$from.log
    echo "== $tool from case $from"; grep -E "ok, flag|ERROR SUMMARY|Error|done" $OUT/sanitize_${tool}_from$from.log | tail -5
  done
}

# gpu_tests_part TAG TIMEOUT PYTEST_ARGS...: the GPU tests named
gpu_tests_part() {
  local tag=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 | grep -Ev "$QF_NOISE" > $OUT/pytest_$tag.log
  echo "== pytest $tag"; tail -3 $OUT/pytest_$tag.log
}
