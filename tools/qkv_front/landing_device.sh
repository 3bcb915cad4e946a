# GPU machine (carry .device; MID too when given): qkv_front's landing barriers
# (QkvFrontConfig.landing_barriers, a development knob: the peers' split-K pushes as st.async into
# the owner's per-chunk barriers, each epilogue pass waiting for its own chunk) against the plan's
# variant without them, at issue 49's split-cluster rows (Hkv 2 M=64-512, Hkv 1 M=512, Hkv 16
# M=256) and a split-of-1 control (Hkv 4 M=256: plain stores and the cluster barrier in both);
# MID=path adds a copy of the kernel module with the knob as a third contender (e.g. the form
# whose own share also crossed the cluster as st.async). Then the GPU test of the knob's bits.
# Part "check" (a second call): the qkv_front GPU tests and three sanitizers of the knob's cases;
# part "timeline": the phase stamps at Hkv 2 M=256 and 512 with and without it; part "ncu": Hkv 2
# M=512 under ncu beside cuBLAS.
#   bash tools/qkv_front/landing_device.sh ab; ... check; ... timeline; ... ncu
. .device/prelude.sh && . tools/qkv_front/device_parts.sh
LB="'landing_barriers': True"
V="{};{$LB};{};{$LB}"
[ -n "$MID" ] && V="{};{$LB};{'kernel': '$MID', $LB};{};{$LB};{'kernel': '$MID', $LB}"
if [ "$1" = ab ]; then
ab_part landing_h2 2 64,256,512 5 130
ab_part landing_h1 1 512 5 55
ab_part landing_h16 16 256 5 65
ab_part landing_h4 4 256 5 45
gpu_tests_part landing 150 tests/test_qkv_front_cutedsl.py -k "landing_barriers or bit_identical_across_m"
fi
if [ "$1" = check ]; then
gpu_tests_part qkv_front 240 tests/test_qkv_front_cutedsl.py
sanitize_part 17 100 memcheck synccheck racecheck
fi
if [ "$1" = timeline ]; then
for over in "{}" "{$LB}"; do
  TL_M=256,512 TL_HKV=2 TL_OVER="$over" TL_OUT=$OUT/timeline_$([ "$over" = "{}" ] && echo plan || echo landing) \
    timeout 200 python3 tools/qkv_front/timeline.py 2>&1 | grep -Ev "$QF_NOISE" | tail -30
done
fi
if [ "$1" = ncu ]; then
bash tools/qkv_front/ncu.sh 512 2
fi
true
