// muse_shims.h: the fast path of torch.ops.muse.qkv_front and torch.ops.muse.attn2 in C++, shared by
// the library the package loads (muse_shims.cpp, registered by muse_bindings.cpp) and the
// development library (muse_shims_dev.cpp, which times the same code). docs/DESIGN.md section 16.
//
// The fast path checks a call's metadata (what validation.py checks, on the sizes Python hands
// over), looks its plan up in the tables Python hands over, allocates the output and launches the
// CuTe DSL kernel through TVM-FFI's C ABI. It decides nothing itself: every plan decision (the K
// split, the token tile of M tokens, the attn2 variant of R requests on a device of N SMs, the
// workspace a batch needs, the kernel's wave argument) is a row of Python's tables
// (muse_ops/cutedsl/shims.py builds them from the plan modules; the ahead-of-time library's
// `.shims` file carries the same rows). Whatever the tables do not cover, and every call the fast
// path does not serve, goes to the Python implementation, which plans it (or, without Python, is a
// ValueError naming why).
//
// The op bodies are templates over a clock policy: the package's library instantiates them with
// NoClock (empty, inlined away: no clock read and no branch on the fast path), the development
// library with its host clock.
#pragma once

#include <torch/library.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

// The interface version: muse_ops/cutedsl/shims.py reads `muse_shims_abi=N;` from the library file
// before loading it, and the development library attaches only to a library of its own version.
// Bump it on any change of the ops, of what Python calls, or of State's layout below.
#define MUSE_SHIMS_ABI 8
#define MUSE_SHIMS_STR2(x) #x
#define MUSE_SHIMS_STR(x) MUSE_SHIMS_STR2(x)

namespace muse_shims {

enum Op { kQkvFront = 0, kAttn2 = 1 };

// ------------------------------------------------------------------------- TVM-FFI and the driver
using SetStreamFn = int (*)(int32_t, int32_t, TVMFFIStreamHandle, TVMFFIStreamHandle*);
using MoveErrorFn = void (*)(TVMFFIObjectHandle*);
using RefFn = int (*)(TVMFFIObjectHandle);
using CuDeviceGetFn = int (*)(int*, int);
using CuDeviceGetAttributeFn = int (*)(int*, int, int);

struct Ffi {
  SetStreamFn set_stream = nullptr;
  MoveErrorFn move_error = nullptr;
  RefFn inc_ref = nullptr;
  RefFn dec_ref = nullptr;
  bool ready() const { return set_stream && move_error && inc_ref && dec_ref; }
  void resolve(void* handle) {
    if (!handle) return;
    if (!set_stream) set_stream = reinterpret_cast<SetStreamFn>(dlsym(handle, "TVMFFIEnvSetStream"));
    if (!move_error) move_error = reinterpret_cast<MoveErrorFn>(dlsym(handle, "TVMFFIErrorMoveFromRaised"));
    if (!inc_ref) inc_ref = reinterpret_cast<RefFn>(dlsym(handle, "TVMFFIObjectIncRef"));
    if (!dec_ref) dec_ref = reinterpret_cast<RefFn>(dlsym(handle, "TVMFFIObjectDecRef"));
  }
};

// A callable kernel variant: a TVM-FFI safe call and its self handle (a Function object we hold a
// reference to, or null for a symbol of a dlopened library, whose generated code ignores it).
struct Kernel {
  TVMFFISafeCallType call = nullptr;
  void* self = nullptr;
  TVMFFIObjectHandle owned = nullptr;
};

// ------------------------------------------------------------------------- the tables (Python's)
// A step function of one integer, as Python hands it over: value[i] for the first i with
// x <= upper[i] (upper ascending), -1 past the last (the table does not cover x).
struct Runs {
  std::vector<int64_t> upper;
  std::vector<int32_t> value;
  int32_t at(int64_t x) const {
    const auto it = std::lower_bound(upper.begin(), upper.end(), x);
    return it == upper.end() ? -1 : value[it - upper.begin()];
  }
};

// The model's sizes the metadata checks compare against (muse_ops/config.py).
struct Model {
  int64_t hidden = 0, head_dim = 0, page_size = 0, cache_row = 0;
};

// One KV-head count (Hkv) the tables cover: its sizes, its K split, and the token tile (an index
// of qkv_front_plan.TILES) of a launch of M tokens.
struct KvHeadsTable {
  int64_t k_split = 0;     // 0: this Hkv is not covered
  int64_t proj_cols = 0;   // N of qkv_front's y (and attn2's y)
  int64_t out_cols = 0;    // columns of attn2's out
  Runs tiles;              // by M
};

// attn2's plan of one deployment on a device of sm_count SMs: the variant (an index of the
// deployment's variants) of a launch of R requests, per Hkv, and the kernel's wave argument.
struct Attn2Plan {
  int64_t sm_count = 0, wave = 0;
  std::vector<Runs> by_kv_heads;   // index Hkv; by R
};

// One attn2 deployment (q_len, window, max_seq_len, cache dtype): its variants' kernels and the
// workspace each needs per (request, KV head) pair, and its plan per SM count.
struct Attn2Deployment {
  int64_t q_len = 0, window = 0, max_seq_len = 0, cache = 0;
  std::vector<int64_t> workspace_per_pair;   // per variant
  std::vector<Kernel> kernels;               // per variant
  std::vector<Attn2Plan> plans;              // per SM count
};

constexpr int kMaxTiles = 24;        // token tiles a qkv_front key may name (at least the plan's LAUNCH_TILES)
constexpr int kMaxCacheDtypes = 4;   // cache dtypes a key may name (bf16, float8_e4m3fn, ...)
constexpr int kMaxDevices = 64;
constexpr size_t kScalarTypes = static_cast<size_t>(c10::ScalarType::NumOptions);

// A qkv_front variant's slot: (token tile, cache dtype, RoPE, int64 positions, int64 slots).
inline int qkv_key(int64_t tile, int64_t cache, bool rope, bool pos64, bool slot64) {
  return static_cast<int>(((tile * kMaxCacheDtypes + cache) * 2 + rope) * 4 + pos64 * 2 + slot64);
}

struct Device {
  std::once_flag once;
  bool supported = false;
  int64_t sm_count = 0;   // the key of attn2's plans (a device fact: the driver's)
  std::string why;
  c10::Allocator* allocator = nullptr;   // the one at::empty uses on this device (outputs skip the dispatcher)
  at::Tensor error_flag;   // int32 [1]: the kernels OR their error bits in (muse_ops/errors.py)
  at::Tensor dummy;        // float32 [1, head_dim]: stands in for an absent cos_sin
};

struct State {
  std::shared_mutex mutex;   // guards the tables (written rarely, read per call)
  Ffi ffi;
  Model model;
  std::array<int8_t, kScalarTypes> cache_code;   // a dtype's index among the cache dtypes, or -1
  std::vector<KvHeadsTable> kv_heads;            // index Hkv
  std::array<Kernel, kMaxTiles * kMaxCacheDtypes * 8> qkv{};   // at qkv_key
  std::vector<Attn2Deployment> attn2;
  std::vector<void*> libraries;
  std::string library_status = "no ahead-of-time library loaded by the shims";
  std::optional<std::string> forced_backend;   // muse_ops.set_backend
  std::array<Device, kMaxDevices> devices;
  std::atomic<int64_t> fast[2] = {0, 0};
  std::atomic<int64_t> slow[2] = {0, 0};
  std::atomic<bool> last_fast[2] = {false, false};
  State() { cache_code.fill(-1); }
};

// The package's library: its own State; the development library: the package library's.
State& state();

// ------------------------------------------------------------------------- table lookups
inline const KvHeadsTable* kv_heads_table(const State& s, int64_t kv_heads) {
  if (kv_heads < 1 || kv_heads >= static_cast<int64_t>(s.kv_heads.size())) return nullptr;
  const KvHeadsTable& t = s.kv_heads[kv_heads];
  return t.k_split > 0 ? &t : nullptr;
}

inline const Attn2Deployment* find_deployment(const State& s, int64_t q_len, int64_t window, int64_t max_seq_len,
                                              int64_t cache) {
  for (const Attn2Deployment& d : s.attn2)
    if (d.q_len == q_len && d.window == window && d.max_seq_len == max_seq_len && d.cache == cache) return &d;
  return nullptr;
}

inline const Attn2Plan* find_plan(const Attn2Deployment& d, int64_t sm_count) {
  for (const Attn2Plan& p : d.plans)
    if (p.sm_count == sm_count) return &p;
  return nullptr;
}

// The variant of a launch of `requests` requests at kv_heads, or -1 where the plan has none.
inline int variant_of(const Attn2Deployment& d, const Attn2Plan& p, int64_t requests, int64_t kv_heads) {
  if (kv_heads < 1 || kv_heads >= static_cast<int64_t>(p.by_kv_heads.size())) return -1;
  const int v = p.by_kv_heads[kv_heads].at(requests);
  return v < static_cast<int>(d.kernels.size()) ? v : -1;
}

inline int64_t workspace_need(const Attn2Deployment& d, int variant, int64_t requests, int64_t kv_heads) {
  return requests * kv_heads * d.workspace_per_pair[variant];
}

// ------------------------------------------------------------------------- devices
inline Device& device_state(State& s, int index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "muse shims: device index ", index, " out of range");
  Device& d = s.devices[index];
  std::call_once(d.once, [&] {
    TORCH_CHECK(s.model.head_dim > 0, "muse shims: no model sizes yet (configure or load a library first)");
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    auto get = cuda ? reinterpret_cast<CuDeviceGetFn>(dlsym(cuda, "cuDeviceGet")) : nullptr;
    auto attr = cuda ? reinterpret_cast<CuDeviceGetAttributeFn>(dlsym(cuda, "cuDeviceGetAttribute")) : nullptr;
    int dev = 0, major = 0, minor = 0, sms = 0;
    if (!get || !attr || get(&dev, index) != 0 || attr(&major, 75, dev) != 0 || attr(&minor, 76, dev) != 0 ||
        attr(&sms, 16, dev) != 0) {
      d.why = "the CUDA driver did not answer for this device";
      return;
    }
    d.sm_count = sms;
    d.supported = major == 9 && minor == 0;
    if (!d.supported) {
      d.why = "needs compute capability 9.0 (sm_90a), device has " + std::to_string(major) + "." +
              std::to_string(minor);
      return;
    }
    c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    c10::InferenceMode normal_tensors(false);   // errors.device_errors resets the flag in any mode
    auto options = at::TensorOptions().device(device);
    d.error_flag = at::zeros({1}, options.dtype(at::kInt));
    d.dummy = at::zeros({1, s.model.head_dim}, options.dtype(at::kFloat));
    d.allocator = d.dummy.storage().allocator();   // torch's CUDA allocator, whichever backend it runs
  });
  return d;
}

// A fresh contiguous output on `device`, as at::empty makes it (the same allocator, under the
// caller's device guard) without its two dispatcher hops.
inline at::Tensor new_output(const Device& device, std::initializer_list<int64_t> sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, device.allocator, c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype,
                                   std::nullopt);
}

// ------------------------------------------------------------------------- the kernel call
inline DLDataType dl_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return {kDLBfloat, 16, 1};
    case at::kFloat: return {kDLFloat, 32, 1};
    case at::kInt: return {kDLInt, 32, 1};
    case at::kLong: return {kDLInt, 64, 1};
    case at::kByte: return {kDLUInt, 8, 1};
    default: TORCH_CHECK(false, "muse shims: no DLPack dtype for ", t);
  }
}

// A DLTensor view of a contiguous tensor, with compact row-major strides (what the kernels were
// compiled against; a contiguous torch tensor may carry any stride on a dimension of size 1).
struct DlView {
  DLTensor tensor;
  int64_t strides[4];
  void set(const at::Tensor& t, int device) {
    const int64_t ndim = t.dim();
    int64_t stride = 1;
    for (int64_t i = ndim - 1; i >= 0; --i) {
      strides[i] = stride;
      stride *= t.size(i);
    }
    tensor.data = t.data_ptr();
    tensor.device = {kDLCUDA, device};
    tensor.ndim = static_cast<int32_t>(ndim);
    tensor.dtype = dl_dtype(t.scalar_type());
    tensor.shape = const_cast<int64_t*>(t.sizes().data());
    tensor.strides = strides;
    tensor.byte_offset = 0;
  }
};

struct Args {
  static constexpr int kMax = 12;
  TVMFFIAny values[kMax];
  DlView views[kMax];
  int count = 0;
  int device = 0;
  void tensor(const at::Tensor& t) {
    views[count].set(t, device);
    values[count] = TVMFFIAny{};
    values[count].type_index = kTVMFFIDLTensorPtr;
    values[count].v_ptr = &views[count].tensor;
    ++count;
  }
  void integer(int64_t v) {
    values[count] = TVMFFIAny{};
    values[count].type_index = kTVMFFIInt;
    values[count].v_int64 = v;
    ++count;
  }
  void real(double v) {
    values[count] = TVMFFIAny{};
    values[count].type_index = kTVMFFIFloat;
    values[count].v_float64 = v;
    ++count;
  }
  // an argument the variant compiled as None (a bf16 cache's k_scale and v_scale): it is still in
  // the compiled function's signature and must be passed as None
  void none() {
    values[count] = TVMFFIAny{};
    values[count].type_index = kTVMFFINone;
    ++count;
  }
};

// The package's clock: none (every hook an empty inline function).
struct NoClock {
  explicit NoClock(int) {}
  void planned() {}
  void allocated() {}
  void launch_begin() {}
  void launch_end() {}
  void done() {}
};

// Call `kernel` on torch's current stream of `device` (the kernels read TVM-FFI's environment
// stream, set here around the call and restored after it).
template <class Clock>
void call(const Ffi& ffi, const Kernel& kernel, Args& args, const char* op, Clock& clock) {
  clock.launch_begin();
  c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(args.device));
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
  TVMFFIStreamHandle previous = nullptr;
  TORCH_CHECK(ffi.set_stream(kDLCUDA, args.device, stream, &previous) == 0, "muse::", op,
              ": TVMFFIEnvSetStream failed");
  TVMFFIAny result{};
  result.type_index = kTVMFFINone;
  int rc = kernel.call(kernel.self, args.values, args.count, &result);
  ffi.set_stream(kDLCUDA, args.device, previous, nullptr);
  clock.launch_end();
  if (rc != 0) {
    TVMFFIObjectHandle error = nullptr;
    ffi.move_error(&error);
    std::string message = "unknown error";
    if (error) {
      TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(error);
      message = std::string(cell->kind.data, cell->kind.size) + ": " +
                std::string(cell->message.data, cell->message.size);
      ffi.dec_ref(error);
    }
    TORCH_CHECK(false, "muse::", op, ": the kernel failed: ", message);
  }
}

// ------------------------------------------------------------------------- backend selection
inline bool env_is(const char* name, std::initializer_list<const char*> accepted) {
  const char* v = std::getenv(name);
  if (!v) v = "";
  for (const char* a : accepted)
    if (std::strcmp(v, a) == 0) return true;
  return false;
}

// Why the call cannot take the fast path for backend reasons (muse_ops/backends.py), or null.
inline const char* backend_refusal(const State& s, const std::optional<c10::string_view>& backend) {
  if (backend.has_value()) {
    if (*backend != "cutedsl") return "backend= names another backend";
  } else if (s.forced_backend.has_value()) {
    if (*s.forced_backend != "cutedsl") return "set_backend() names another backend";
  } else if (!env_is("MUSE_OPS_BACKEND", {"", "cutedsl"})) {
    return "MUSE_OPS_BACKEND names another backend";
  }
  if (!env_is("MUSE_OPS_CHECK", {"", "0"})) return "checked mode (MUSE_OPS_CHECK) reads contents";
  return nullptr;
}

// ------------------------------------------------------------------------- metadata (validation.py)
// The checks that decide "serve or hand to Python" (tests/test_shims.py holds them to
// validation.py's), on the sizes of Python's tables. Any failure goes to Python, which raises the
// package's own error.
inline bool tensor_ok(const at::Tensor& t, at::ScalarType dtype, int64_t ndim, const c10::Device& device,
                      bool aligned = true) {
  return t.defined() && t.scalar_type() == dtype && t.dim() == ndim && t.device() == device && t.is_contiguous() &&
         (!aligned || t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
}

inline bool index_ok(const at::Tensor& t, const c10::Device& device) {
  return tensor_ok(t, at::kInt, 1, device, false) || tensor_ok(t, at::kLong, 1, device, false);
}

// kv_cache: a cache dtype [pages >= 1, Hkv >= 1, page_size, cache_row], contiguous and aligned;
// its cache code (the dtype's index among the cache dtypes), or -1.
inline int kv_cache_code(const State& s, const at::Tensor& kv) {
  if (!kv.defined()) return -1;
  const int code = s.cache_code[static_cast<size_t>(kv.scalar_type())];
  if (code < 0 || !tensor_ok(kv, kv.scalar_type(), 4, kv.device()) || kv.size(0) < 1 || kv.size(1) < 1 ||
      kv.size(2) != s.model.page_size || kv.size(3) != s.model.cache_row)
    return -1;
  return code;
}

// The cache dtype whose kernels the launches below call: bf16 (an FP8 cache's kernels take
// k_scale and v_scale; there are none yet, so FP8 calls and any call with scales go to Python).
inline bool launches_cache(const at::Tensor& kv, const std::optional<at::Tensor>& k_scale,
                           const std::optional<at::Tensor>& v_scale) {
  return kv.scalar_type() == at::kBFloat16 && !k_scale.has_value() && !v_scale.has_value();
}

inline bool records_grad(std::initializer_list<const at::Tensor*> tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : tensors)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

struct CallShape {
  int64_t rows = 0;   // qkv_front: M; attn2: R
  int64_t kv_heads = 0;
  int cache = -1;
  const KvHeadsTable* table = nullptr;
};

// The cache both ops read: its dtype's code and its KV-head count's table, or what fails.
inline const char* cache_metadata(const State& s, const at::Tensor& kv_cache, CallShape& c) {
  c.cache = kv_cache_code(s, kv_cache);
  if (c.cache < 0) return "kv_cache metadata";
  c.kv_heads = kv_cache.size(1);
  c.table = kv_heads_table(s, c.kv_heads);
  if (!c.table) return "a KV-head count outside the plan's tables";
  return nullptr;
}

// validation.check_qkv_front_metadata (scales aside: the plan refuses any): null, or what fails.
inline const char* qkv_front_metadata(const State& s, const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& positions, const at::Tensor& slots,
                                      const std::optional<at::Tensor>& cos_sin, const at::Tensor& kv_cache,
                                      CallShape& c) {
  if (const char* why = cache_metadata(s, kv_cache, c)) return why;
  const c10::Device device = kv_cache.device();
  if (!tensor_ok(x, at::kBFloat16, 2, device) || x.size(1) != s.model.hidden) return "x metadata";
  c.rows = x.size(0);
  if (!tensor_ok(weight, at::kBFloat16, 2, device) || weight.size(0) != c.table->proj_cols ||
      weight.size(1) != s.model.hidden)
    return "weight metadata";
  if (!index_ok(positions, device) || positions.size(0) != c.rows) return "positions metadata";
  if (!index_ok(slots, device) || slots.size(0) != c.rows) return "slots metadata";
  if (cos_sin.has_value() && (!tensor_ok(*cos_sin, at::kFloat, 2, device) || cos_sin->size(1) != s.model.head_dim ||
                              cos_sin->size(0) < 1))
    return "cos_sin metadata";
  return nullptr;
}

// validation.check_attn2_metadata on the tensors (y may be null: a layer step's y is qkv_front's
// output, [q_len * R, N] by construction). The deployment's arguments (q_len, window,
// max_seq_len) are checked by its lookup: Python registers valid deployments only.
inline const char* attn2_metadata(const State& s, const at::Tensor* y, const at::Tensor& kv_cache,
                                  const at::Tensor& page_table, const at::Tensor& seq_lens,
                                  const std::optional<at::Tensor>& workspace, int64_t q_len, double scale,
                                  CallShape& c) {
  if (const char* why = cache_metadata(s, kv_cache, c)) return why;
  const c10::Device device = kv_cache.device();
  if (!(scale > 0 && std::isfinite(scale))) return "scale";
  if (!tensor_ok(seq_lens, at::kInt, 1, device, false)) return "seq_lens metadata";
  c.rows = seq_lens.size(0);
  if (!tensor_ok(page_table, at::kInt, 2, device, false) || page_table.size(0) != c.rows ||
      (c.rows && page_table.size(1) < 1))
    return "page_table metadata";
  if (workspace.has_value() && !tensor_ok(*workspace, at::kByte, 1, device)) return "workspace metadata";
  if (y && (!tensor_ok(*y, at::kBFloat16, 2, device) || y->size(0) != q_len * c.rows ||
            y->size(1) != c.table->proj_cols))
    return "y metadata";
  return nullptr;
}

// ------------------------------------------------------------------------- the Python fallback
// The Python implementation `name` of `op`, the call counted as Python's; without Python, the
// refusal as a ValueError naming why the C++ path did not serve the call.
inline c10::OperatorHandle python_fallback(int op, const char* name, const char* why) {
  State& s = state();
  s.slow[op].fetch_add(1, std::memory_order_relaxed);
  s.last_fast[op].store(false, std::memory_order_relaxed);
  auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  TORCH_CHECK_VALUE(handle.has_value(), "muse::", op == kQkvFront ? "qkv_front" : "attn2", ": ", why,
                    " (and muse_ops' Python implementation is not loaded)");
  return *handle;
}

inline at::Tensor qkv_front_python(const char* why, const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& positions, const at::Tensor& slots,
                                   const std::optional<at::Tensor>& cos_sin, at::Tensor& kv_cache,
                                   const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                                   std::optional<c10::string_view> backend) {
  return python_fallback(kQkvFront, "muse::_qkv_front_py", why)
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const std::optional<at::Tensor>&, at::Tensor&, const std::optional<at::Tensor>&,
                        const std::optional<at::Tensor>&, std::optional<c10::string_view>)>()
      .call(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale, backend);
}

inline at::Tensor attn2_python(const char* why, const at::Tensor& y, const at::Tensor& kv_cache,
                               const at::Tensor& page_table, const at::Tensor& seq_lens,
                               const std::optional<at::Tensor>& workspace, int64_t q_len, int64_t window, double scale,
                               int64_t max_seq_len, const std::optional<at::Tensor>& k_scale,
                               const std::optional<at::Tensor>& v_scale, std::optional<c10::string_view> backend) {
  return python_fallback(kAttn2, "muse::_attn2_py", why)
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const std::optional<at::Tensor>&, int64_t, int64_t, double, int64_t,
                        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                        std::optional<c10::string_view>)>()
      .call(y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len, k_scale, v_scale,
            backend);
}

// ------------------------------------------------------------------------- the plans (lookups)
// Each op is a plan (every check of the fast path and the table lookups; null, or why the call
// goes to Python) and a launch. A layer step in one call runs both plans before either op writes.
struct FrontPlan {
  Kernel kernel;
  Device* device = nullptr;
  int64_t m = 0, n = 0, k_split = 0;
};

inline const char* plan_qkv_front(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                                  const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin,
                                  const at::Tensor& kv_cache, const std::optional<at::Tensor>& k_scale,
                                  const std::optional<at::Tensor>& v_scale,
                                  const std::optional<c10::string_view>& backend, FrontPlan& p) {
  State& s = state();
  std::shared_lock lock(s.mutex);
  if (const char* why = backend_refusal(s, backend)) return why;
  CallShape c;
  if (const char* why = qkv_front_metadata(s, x, weight, positions, slots, cos_sin, kv_cache, c)) return why;
  if (!launches_cache(kv_cache, k_scale, v_scale)) return "an FP8 cache or scales (no FP8 kernels in C++ yet)";
  if (c.rows == 0) return "an empty batch";
  static const at::Tensor undefined;
  if (records_grad({&x, &weight, cos_sin.has_value() ? &*cos_sin : &undefined})) return "inputs that require grad";
  if (!kv_cache.is_cuda()) return "not a CUDA call";
  p.device = &device_state(s, kv_cache.device().index());
  if (!p.device->supported) return p.device->why.c_str();
  const int tile = c.table->tiles.at(c.rows);
  if (tile < 0) return "more tokens than the plan's table covers";
  if (!s.ffi.ready()) return "TVM-FFI not resolved yet";
  p.kernel = s.qkv[qkv_key(tile, c.cache, cos_sin.has_value(), positions.scalar_type() == at::kLong,
                           slots.scalar_type() == at::kLong)];
  if (!p.kernel.call) return "no kernel registered for this variant";
  p.m = c.rows;
  p.n = c.table->proj_cols;
  p.k_split = c.table->k_split;
  return nullptr;
}

struct AttnPlan {
  Kernel kernel;
  Device* device = nullptr;
  int64_t r = 0, out_cols = 0, wave = 0;
};

inline const char* plan_attn2(const at::Tensor* y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                              const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                              int64_t window, double scale, int64_t max_seq_len,
                              const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                              const std::optional<c10::string_view>& backend, AttnPlan& p) {
  State& s = state();
  std::shared_lock lock(s.mutex);
  if (const char* why = backend_refusal(s, backend)) return why;
  CallShape c;
  if (const char* why = attn2_metadata(s, y, kv_cache, page_table, seq_lens, workspace, q_len, scale, c)) return why;
  if (!launches_cache(kv_cache, k_scale, v_scale)) return "an FP8 cache or scales (no FP8 kernels in C++ yet)";
  if (c.rows == 0) return "an empty batch";
  if (!workspace.has_value()) return "no workspace given";
  if (y && records_grad({y})) return "inputs that require grad";
  if (!kv_cache.is_cuda()) return "not a CUDA call";
  p.device = &device_state(s, kv_cache.device().index());
  if (!p.device->supported) return p.device->why.c_str();
  const Attn2Deployment* d = find_deployment(s, q_len, window, max_seq_len, c.cache);
  if (!d) return "no attn2 deployment registered for this (q_len, window, max_seq_len)";
  const Attn2Plan* plan = find_plan(*d, p.device->sm_count);
  if (!plan) return "no attn2 plan for this device's SM count";
  const int variant = variant_of(*d, *plan, c.rows, c.kv_heads);
  if (variant < 0) return "a batch the plan's table does not cover";
  p.kernel = d->kernels[variant];
  if (!p.kernel.call || !s.ffi.ready()) return "no kernel registered for this variant";
  if (workspace->numel() < workspace_need(*d, variant, c.rows, c.kv_heads)) return "workspace too small for this batch";
  p.r = c.rows;
  p.out_cols = c.table->out_cols;
  p.wave = plan->wave;
  return nullptr;
}

inline void count_fast(int op) {
  State& s = state();
  s.fast[op].fetch_add(1, std::memory_order_relaxed);
  s.last_fast[op].store(true, std::memory_order_relaxed);
}

// The device guard of a launch, engaged only where the current device is not the inputs' (the
// allocator and the launch use the current one): most calls already run on it, and the guard's
// restore costs a driver query each time.
struct LaunchDevice {
  std::optional<c10::DeviceGuard> guard;
  explicit LaunchDevice(const c10::Device& device) {
    if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice() != device) guard.emplace(device);
  }
};

// ------------------------------------------------------------------------- the launches
// Of planned calls: the plans passed, the launch device current, the output allocated.
template <class Clock>
void launch_qkv_front(const FrontPlan& p, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                      const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin, const at::Tensor& kv_cache,
                      const at::Tensor& y, Clock& clock) {
  Args args;
  args.device = kv_cache.device().index();
  args.tensor(x);
  args.tensor(weight);
  args.tensor(positions);
  args.tensor(slots);
  args.tensor(cos_sin.has_value() ? *cos_sin : p.device->dummy);
  args.tensor(kv_cache);
  args.tensor(y);
  args.tensor(p.device->error_flag);
  args.none();   // k_scale, v_scale: None in a bf16 cache's variant
  args.none();
  args.integer(p.k_split);
  call(state().ffi, p.kernel, args, "qkv_front", clock);
}

template <class Clock>
void launch_attn2(const AttnPlan& p, const at::Tensor& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                  const at::Tensor& seq_lens, const at::Tensor& workspace, double scale, int64_t max_seq_len,
                  const at::Tensor& out, Clock& clock) {
  Args args;
  args.device = kv_cache.device().index();
  args.tensor(y);
  args.tensor(kv_cache);
  args.tensor(page_table);
  args.tensor(seq_lens);
  args.tensor(out);
  args.tensor(workspace);
  args.tensor(p.device->error_flag);
  args.none();   // k_scale, v_scale: None in a bf16 cache's variant
  args.none();
  args.real(scale);
  args.integer(max_seq_len);
  args.integer(p.wave);
  call(state().ffi, p.kernel, args, "attn2", clock);
}

// The outputs of planned calls: y [M, N] of qkv_front, out [rows, out_cols] of attn2.
inline at::Tensor qkv_front_output(const FrontPlan& p) { return new_output(*p.device, {p.m, p.n}, at::kBFloat16); }

inline at::Tensor attn2_output(const AttnPlan& p, int64_t rows) {
  return new_output(*p.device, {rows, p.out_cols}, at::kBFloat16);
}

// ------------------------------------------------------------------------- the ops' CUDA kernels
template <class Clock>
at::Tensor qkv_front_op(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                        const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin, at::Tensor& kv_cache,
                        const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                        std::optional<c10::string_view> backend) {
  Clock clock(kQkvFront);
  FrontPlan p;
  if (const char* why = plan_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale, backend, p))
    return qkv_front_python(why, x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale, backend);
  clock.planned();
  LaunchDevice on_device(kv_cache.device());   // the output and the launch: the inputs' device
  at::Tensor y = qkv_front_output(p);
  clock.allocated();
  launch_qkv_front(p, x, weight, positions, slots, cos_sin, kv_cache, y, clock);
  count_fast(kQkvFront);
  clock.done();
  return y;
}

template <class Clock>
at::Tensor attn2_op(const at::Tensor& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                    const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                    int64_t window, double scale, int64_t max_seq_len, const std::optional<at::Tensor>& k_scale,
                    const std::optional<at::Tensor>& v_scale, std::optional<c10::string_view> backend) {
  Clock clock(kAttn2);
  AttnPlan p;
  if (const char* why = plan_attn2(&y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                                   k_scale, v_scale, backend, p))
    return attn2_python(why, y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                        k_scale, v_scale, backend);
  clock.planned();
  LaunchDevice on_device(kv_cache.device());
  at::Tensor out = attn2_output(p, y.size(0));
  clock.allocated();
  launch_attn2(p, y, kv_cache, page_table, seq_lens, *workspace, scale, max_seq_len, out, clock);
  count_fast(kAttn2);
  clock.done();
  return out;
}

// ------------------------------------------------------------------------- the package library's entry points
// (muse_shims.cpp; registered as ops by muse_bindings.cpp)
at::Tensor qkv_front_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                          const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin, at::Tensor& kv_cache,
                          const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                          std::optional<c10::string_view> backend);
at::Tensor attn2_cuda(const at::Tensor& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                      const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                      int64_t window, double scale, int64_t max_seq_len, const std::optional<at::Tensor>& k_scale,
                      const std::optional<at::Tensor>& v_scale, std::optional<c10::string_view> backend);
std::optional<at::Tensor> layer_step(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                                     const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin,
                                     at::Tensor& kv_cache, const at::Tensor& page_table, const at::Tensor& seq_lens,
                                     const std::optional<at::Tensor>& workspace, int64_t q_len, int64_t window,
                                     double scale, int64_t max_seq_len, const std::optional<at::Tensor>& k_scale,
                                     const std::optional<at::Tensor>& v_scale, std::optional<c10::string_view> backend);
void set_table(std::string row);
void set_ffi(std::string libtvm_ffi);
void add_kernel(std::string key, int64_t function);
std::string load_library(std::string library);
void set_backend(std::optional<std::string> name);
void note_python(int64_t op);
std::vector<int64_t> stats();
void clear();
at::Tensor error_flag(int64_t device);

}  // namespace muse_shims
