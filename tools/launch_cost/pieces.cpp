// Host cost of the pieces of a kernel launch, for tools/launch_cost/run.py (tools only; loaded with
// ctypes into a process whose CUDA context torch made current). Each hb_* function times its own
// loop of 200 calls per round and returns the median ns per call:
//   hb_setup(smem)              load an empty sm_90a kernel (PTX), allow `smem` dynamic bytes
//   hb_launch(mode, smem, n)    cuLaunchKernelEx of it on a grid of 2 x 8 CTAs; mode bit 1: a 2-CTA
//                               cluster, bit 2: the PDL attribute (what the muse kernels launch with)
//   hb_encode(n)                cuTensorMapEncodeTiled of a 4-D bf16 map
//   hb_ctx(n)                   cuCtxGetCurrent + cuCtxGetDevice
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>
static const char* kPtx = R"(
.version 8.0
.target sm_90a
.address_size 64
.visible .entry noop(.param .align 64 .b8 p[640]) { ret; }
)";
static CUfunction fn; static CUstream stream; static CUdeviceptr buf;
static double now() { return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
extern "C" int hb_setup(int smem) {
  CUcontext ctx; if (cuCtxGetCurrent(&ctx) || !ctx) return 1;
  CUmodule m; if (cuModuleLoadData(&m, kPtx)) return 2;
  if (cuModuleGetFunction(&fn, m, "noop")) return 3;
  if (cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)) return 4;
  if (cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)) return 5;
  if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) return 6;
  if (cuMemAlloc(&buf, 1 << 26)) return 7;
  return 0;
}
// mode bits: 1 cluster 2, 2 PDL attr ; returns median ns per launch over rounds of 200
extern "C" double hb_launch(int mode, int smem, int rounds) {
  alignas(64) unsigned char params[640]; std::memset(params, 0, sizeof params);
  void* args[] = {params};
  std::vector<double> per;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    for (int i = 0; i < 200; ++i) {
      CUlaunchAttribute attrs[2]; int n = 0;
      if (mode & 1) { attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; attrs[n].value.clusterDim.x = 2; attrs[n].value.clusterDim.y = 1; attrs[n].value.clusterDim.z = 1; ++n; }
      if (mode & 2) { attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; attrs[n].value.programmaticStreamSerializationAllowed = 1; ++n; }
      CUlaunchConfig c{}; c.gridDimX = 2; c.gridDimY = 8; c.gridDimZ = 1; c.blockDimX = 128; c.blockDimY = 1; c.blockDimZ = 1;
      c.sharedMemBytes = smem; c.hStream = stream; c.attrs = attrs; c.numAttrs = n;
      if (cuLaunchKernelEx(&c, fn, args, nullptr)) return -1;
    }
    double t1 = now();
    cuStreamSynchronize(stream);
    per.push_back((t1 - t0) / 200);
  }
  std::sort(per.begin(), per.end()); return per[per.size() / 2];
}
extern "C" double hb_encode(int rounds) {
  std::vector<double> per;
  alignas(64) CUtensorMap map;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    for (int i = 0; i < 200; ++i) {
      cuuint64_t dims[4] = {128, 16, 2, 1000};
      cuuint64_t strides[3] = {256, 4096, 8192};
      cuuint32_t box[4] = {64, 16, 1, 1};
      cuuint32_t es[4] = {1, 1, 1, 1};
      if (cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void*)buf, dims, strides, box, es,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)) return -1;
    }
    per.push_back((now() - t0) / 200);
  }
  std::sort(per.begin(), per.end()); return per[per.size() / 2];
}
extern "C" double hb_ctx(int rounds) {   // cost of cuCtxGetCurrent + cuCtxGetDevice pair
  std::vector<double> per; CUcontext c; CUdevice d;
  for (int r = 0; r < rounds; ++r) { double t0 = now(); for (int i = 0; i < 200; ++i) { cuCtxGetCurrent(&c); cuCtxGetDevice(&d); } per.push_back((now() - t0) / 200); }
  std::sort(per.begin(), per.end()); return per[per.size() / 2];
}
