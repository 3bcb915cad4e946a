// LD_PRELOAD probe (tools only): times the CUDA-runtime calls the DSL's generated launch function
// makes per call, and can route its cudaLaunchKernelEx to the driver's cuLaunchKernelEx instead
// (probe_mode(1)), to measure what the runtime layer costs for the real kernels.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>

namespace {
std::atomic<int> g_mode{0};
std::atomic<long long> g_ns[3], g_n[3];   // 0 launch, 1 getdevice, 2 getstream
long long now() { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void* sym(const char* env, const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f) return f;
  const char* path = std::getenv(env);
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  f = h ? dlsym(h, name) : nullptr;
  if (!f) { std::fprintf(stderr, "probe: cannot resolve %s\n", name); std::abort(); }
  return f;
}
}

extern "C" {
__attribute__((visibility("default"))) void probe_mode(int m) { g_mode = m; }
__attribute__((visibility("default"))) void probe_read(long long* out) {
  for (int i = 0; i < 3; ++i) { out[2 * i] = g_ns[i]; out[2 * i + 1] = g_n[i]; }
}
__attribute__((visibility("default"))) int _cudaLaunchKernelEx(const cudaLaunchConfig_t* c, const void* func, void** args) {
  using Fn = int (*)(const cudaLaunchConfig_t*, const void*, void**);
  static Fn real = reinterpret_cast<Fn>(sym("PROBE_RUNTIME", "_cudaLaunchKernelEx"));
  long long t0 = now();
  int rc;
  if (g_mode.load(std::memory_order_relaxed) == 0) {
    rc = real(c, func, args);
  } else {
    CUlaunchConfig d{};
    d.gridDimX = c->gridDim.x; d.gridDimY = c->gridDim.y; d.gridDimZ = c->gridDim.z;
    d.blockDimX = c->blockDim.x; d.blockDimY = c->blockDim.y; d.blockDimZ = c->blockDim.z;
    d.sharedMemBytes = static_cast<unsigned>(c->dynamicSmemBytes);
    d.hStream = reinterpret_cast<CUstream>(c->stream);
    d.attrs = reinterpret_cast<CUlaunchAttribute*>(c->attrs);   // the same layout and IDs
    d.numAttrs = c->numAttrs;
    using Launch = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
    static Launch launch = reinterpret_cast<Launch>(dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuLaunchKernelEx"));
    rc = launch(&d, reinterpret_cast<CUfunction>(const_cast<void*>(func)), args, nullptr);
  }
  g_ns[0] += now() - t0; g_n[0] += 1;
  return rc;
}
__attribute__((visibility("default"))) int _cudaGetDevice(int* d) {
  using Fn = int (*)(int*);
  static Fn real = reinterpret_cast<Fn>(sym("PROBE_RUNTIME", "_cudaGetDevice"));
  long long t0 = now();
  int rc = real(d);
  g_ns[1] += now() - t0; g_n[1] += 1;
  return rc;
}
__attribute__((visibility("default"))) void* TVMFFIEnvGetStream(int32_t type, int32_t id) {
  using Fn = void* (*)(int32_t, int32_t);
  static Fn real = reinterpret_cast<Fn>(sym("PROBE_TVMFFI", "TVMFFIEnvGetStream"));
  long long t0 = now();
  void* s = real(type, id);
  g_ns[2] += now() - t0; g_n[2] += 1;
  return s;
}
}
