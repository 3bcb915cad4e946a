// muse_shims: torch.ops.muse.qkv_front and torch.ops.muse.attn2 in C++, launching the
// ahead-of-time CuTe DSL kernels (muse_ops/cutedsl/aot.py) through the TVM-FFI C ABI.
//
// What this file owns (docs/DESIGN.md section 16):
// - The public schemas of both ops (TORCH_LIBRARY(muse)); tests/test_shims.py asserts they equal
//   muse_ops.ops.SCHEMAS. Python registers the CPU and Meta implementations (the reference and the
//   fakes) on these same ops.
// - Their CUDA kernels: a fast path that checks every piece of metadata Python's validation.py
//   checks, picks the variant the Python plan modules would pick, and calls the kernel. No math,
//   no allocation besides the output, no host sync.
// - Anything the fast path does not serve (bad metadata, checked mode, another backend, inputs
//   that require grad, a variant it holds no kernel for, an empty batch) goes to the Python
//   implementation (`muse::_qkv_front_py`, `muse::_attn2_py`), which raises the package's own
//   errors or runs what the call asks for. In a program without Python the same cases raise
//   ValueError naming the reason.
// - `_shims_layer_step`: MuseAttentionDecode's eager step (both ops) in one dispatcher call.
//
// Where the kernels come from: Python registers every variant it compiles or loads (a TVM-FFI
// function handle, kept alive here by a reference), or `_shims_load_library` dlopens an
// ahead-of-time library and reads its table (`<library>.shims`, written by the AOT build). The
// plan decisions that are not in those tables are two formulas, tested against the Python plan
// modules over wide grids (tests/test_shims.py): the K split of a KV-head count and the bytes of
// attn2's workspace.
//
// No CUDA header is needed: the current stream comes from c10's device-guard interface and the
// device attributes from the driver (libcuda.so.1), so the file builds wherever torch does.
#include <torch/library.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
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
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

// The interface version muse_ops/cutedsl/shims.py expects: it reads this marker from the file
// before loading it, so a library built from older sources is never loaded (bump on any change of
// the ops below or of what Python calls).
extern "C" __attribute__((used, visibility("default"))) const char muse_shims_abi[] = "muse_shims_abi=6;";

namespace muse_shims {
namespace {

// ------------------------------------------------------------------------- model constants
// (muse_ops/config.py; a mismatch fails tests/test_shims.py's plan comparisons)
constexpr int64_t kHidden = 8192;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kGroup = 8;
constexpr int64_t kPageSize = 16;
constexpr int64_t kCacheRow = 128;
constexpr int64_t kProjColsPerKvHead = (2 * kGroup + 2) * kHeadDim;   // 1152
constexpr int64_t kSmTarget = 132;      // qkv_front_plan.SM_TARGET
constexpr int64_t kMaxKSplit = 3;       // qkv_front_plan.MAX_K_SPLIT
constexpr int64_t kWaveTilesAbove = 256;   // qkv_front_plan.WAVE_TILES_ABOVE
constexpr int64_t kTileFixedTokens = 48;   // qkv_front_plan.TILE_FIXED_TOKENS
constexpr int64_t kL2ResidentBytes = 50ll << 20;   // qkv_front_plan.L2_RESIDENT_BYTES
constexpr int64_t kL2CostTenths = 11;      // qkv_front_plan.L2_COST_TENTHS
constexpr int64_t kSubChunks = 8;       // attn2_plan.SUB_CHUNKS (arrival counters per pair)

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

struct Attn2Entry {
  Kernel kernel;
  int64_t slots = 0;          // workspace partials per (request, KV head): attn2_plan's cfg.slots
  int64_t ctas_per_pair = 0;  // CTAs per (request, KV head) in the grid: cfg.ctas_per_pair
  int64_t cluster_size = 0;   // cfg.cluster_size
};

constexpr int kMaxTiles = 16;
constexpr int kMaxDevices = 64;

struct Device {
  std::once_flag once;
  bool supported = false;
  int64_t sm_count = 0;
  std::string why;
  c10::Allocator* allocator = nullptr;   // the one at::empty uses on this device (outputs skip the dispatcher)
  at::Tensor error_flag;   // int32 [1]: the kernels OR their error bits in (muse_ops/errors.py)
  at::Tensor dummy;        // float32 [1, 64]: stands in for an absent cos_sin
};

struct State {
  std::shared_mutex mutex;          // guards the tables below (written rarely, read per call)
  Ffi ffi;
  std::vector<int64_t> tile_limits;   // qkv_front_plan.TILES: the largest M of each token tile
  std::vector<int64_t> tile_tokens, tile_heads;   // and its tokens and heads per CTA (wave_tile)
  int64_t wide_max_pairs = 16, wide_max_pairs_window = 32;
  int64_t occupancy_max_cap_wide = 4, occupancy_max_cap_deep = 3;   // attn2_plan.OCCUPANCY_MAX_CAP
  std::array<Kernel, kMaxTiles * 8> qkv{};   // at qkv_index(tile, rope, positions int64, slots int64)
  // (q_len, window, msl, wide, CTAs an SM: the occupancy cap, 0 for none)
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, int64_t>, Attn2Entry> attn2;
  std::vector<void*> libraries;
  std::string library_status = "no ahead-of-time library loaded by the shims";
  std::optional<std::string> forced_backend;   // muse_ops.set_backend
  std::array<Device, kMaxDevices> devices;
  std::atomic<int64_t> fast[2] = {0, 0};
  std::atomic<int64_t> slow[2] = {0, 0};
  std::atomic<bool> last_fast[2] = {false, false};
  // host time of the fast path (the C++ kernel's whole body, and its kernel call alone), in ns,
  // kept only while `clock` is on (bench/host.py: its six clock reads cost ~0.15 us a call)
  std::atomic<bool> clock{false};
  std::atomic<int64_t> clocked[2] = {0, 0};   // the fast calls made with the clock on
  std::atomic<int64_t> fast_ns[2] = {0, 0};
  std::atomic<int64_t> launch_ns[2] = {0, 0};
  std::atomic<int64_t> plan_ns[2] = {0, 0};   // the checks and the variant lookup
  std::atomic<int64_t> alloc_ns[2] = {0, 0};  // the device guard and the output's allocation
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int qkv_index(int64_t tile, bool rope, bool pos64, bool slot64) {
  return static_cast<int>(tile) * 8 + rope * 4 + pos64 * 2 + slot64;
}

State& state() {
  static State* s = new State();   // never destroyed: kernels may run during interpreter teardown
  return *s;
}

// ------------------------------------------------------------------------- devices
Device& device_state(int index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "muse shims: device index ", index, " out of range");
  Device& d = state().devices[index];
  std::call_once(d.once, [&] {
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
    d.dummy = at::zeros({1, kHeadDim}, options.dtype(at::kFloat));
    d.allocator = d.dummy.storage().allocator();   // torch's CUDA allocator, whichever backend it runs
  });
  return d;
}

// A fresh contiguous output on `device`, as at::empty makes it (the same allocator, under the
// caller's device guard) without its two dispatcher hops.
at::Tensor new_output(const Device& device, std::initializer_list<int64_t> sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, device.allocator, c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype,
                                   std::nullopt);
}

// ------------------------------------------------------------------------- the kernel call
DLDataType dl_dtype(at::ScalarType t) {
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
};

// Call `kernel` on torch's current stream of `device` (the kernels read TVM-FFI's environment
// stream, set here around the call and restored after it).
void call(const Kernel& kernel, Args& args, const char* op, int op_index) {
  State& s = state();
  const bool timed = s.clock.load(std::memory_order_relaxed);
  const int64_t t0 = timed ? now_ns() : 0;
  c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(args.device));
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
  TVMFFIStreamHandle previous = nullptr;
  TORCH_CHECK(s.ffi.set_stream(kDLCUDA, args.device, stream, &previous) == 0,
              "muse::", op, ": TVMFFIEnvSetStream failed");
  TVMFFIAny result{};
  result.type_index = kTVMFFINone;
  int rc = kernel.call(kernel.self, args.values, args.count, &result);
  s.ffi.set_stream(kDLCUDA, args.device, previous, nullptr);
  if (timed) s.launch_ns[op_index].fetch_add(now_ns() - t0, std::memory_order_relaxed);
  if (rc != 0) {
    TVMFFIObjectHandle error = nullptr;
    s.ffi.move_error(&error);
    std::string message = "unknown error";
    if (error) {
      TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(error);
      message = std::string(cell->kind.data, cell->kind.size) + ": " +
                std::string(cell->message.data, cell->message.size);
      s.ffi.dec_ref(error);
    }
    TORCH_CHECK(false, "muse::", op, ": the kernel failed: ", message);
  }
}

// ------------------------------------------------------------------------- backend selection
bool env_is(const char* name, std::initializer_list<const char*> accepted) {
  const char* v = std::getenv(name);
  if (!v) v = "";
  for (const char* a : accepted)
    if (std::strcmp(v, a) == 0) return true;
  return false;
}

// Why the call cannot take the fast path for backend reasons (muse_ops/backends.py), or null.
const char* backend_refusal(const std::optional<c10::string_view>& backend) {
  State& s = state();
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
bool tensor_ok(const at::Tensor& t, at::ScalarType dtype, int64_t ndim, const c10::Device& device,
               bool aligned = true) {
  return t.defined() && t.scalar_type() == dtype && t.dim() == ndim && t.device() == device && t.is_contiguous() &&
         (!aligned || t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
}

bool index_ok(const at::Tensor& t, const c10::Device& device) {
  return tensor_ok(t, at::kInt, 1, device, false) || tensor_ok(t, at::kLong, 1, device, false);
}

bool kv_cache_ok(const at::Tensor& kv) {
  return kv.defined() && kv.is_cuda() && tensor_ok(kv, at::kBFloat16, 4, kv.device()) && kv.size(0) >= 1 &&
         kv.size(1) >= 1 && kv.size(2) == kPageSize && kv.size(3) == kCacheRow;
}

bool records_grad(std::initializer_list<const at::Tensor*> tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : tensors)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// ------------------------------------------------------------------------- the plan's formulas
int64_t k_split(int64_t kv_heads) {   // qkv_front_plan.k_split
  const int64_t heads = (2 * kGroup + 2) * kv_heads;
  if (heads > kSmTarget) return 2;      // more than a wave at one CTA a head: halves
  for (int64_t s = kMaxKSplit; s > 1; --s)
    if (heads * s <= kSmTarget) return s;
  return 1;
}

int64_t attn2_workspace_bytes(int64_t requests, int64_t kv_heads, int64_t slots, int64_t q_len) {
  // attn2_plan.workspace_layout: fp32 partials O and (m, l), then the uint32 arrival counters
  const int64_t mr = q_len * kGroup;
  const int64_t nslot = requests * kv_heads * slots;
  const int64_t offset = 4 * nslot * mr * kHeadDim;
  const int64_t counters = requests * kv_heads * kSubChunks;
  return (offset + 4 * nslot * mr * 2 + 4 * counters + 15) / 16 * 16;
}

int wave_tile_index(int64_t m, int64_t kv_heads) {   // qkv_front_plan.wave_tile
  const State& s = state();
  const int64_t heads = (2 * kGroup + 2) * kv_heads;
  const int64_t split = k_split(kv_heads);
  const bool weight_fits_l2 = heads * kHeadDim * kHidden * 2 <= kL2ResidentBytes;
  int best = -1;
  int64_t best_cost = 0;
  for (size_t i = 0; i < s.tile_tokens.size(); ++i) {   // tile_heads has the same length
    if (s.tile_heads[i] != 2) continue;
    const int64_t tokens = s.tile_tokens[i];
    const int64_t ctas = (m + tokens - 1) / tokens * (heads / 2) * split;
    int64_t cost = (ctas + kSmTarget - 1) / kSmTarget * (tokens + kTileFixedTokens) * 10 * kSmTarget;
    if (weight_fits_l2) cost = std::max(cost, kL2CostTenths * ctas * (2 * kHeadDim + tokens));
    if (best < 0 || cost < best_cost || (cost == best_cost && tokens > s.tile_tokens[best])) {
      best = static_cast<int>(i);
      best_cost = cost;
    }
  }
  return best;
}

int tile_index(int64_t m, int64_t kv_heads) {   // qkv_front_plan.tile_for, by the tables Python registered
  if (m > kWaveTilesAbove) {
    const int wave = wave_tile_index(m, kv_heads);
    if (wave >= 0) return wave;
  }
  const auto& limits = state().tile_limits;
  for (size_t i = 0; i < limits.size(); ++i)
    if (m <= limits[i]) return static_cast<int>(i);
  return -1;
}

bool wide_layout(int64_t requests, int64_t kv_heads, int64_t window) {   // attn2_plan.choose_layout
  const State& s = state();
  return requests * kv_heads <= (window > 0 ? s.wide_max_pairs_window : s.wide_max_pairs);
}

// attn2_plan.occupancy_cap: the CTAs an SM a launch allows (1 to max_cap; 0: no cap)
int64_t occupancy_cap(int64_t ctas, int64_t cluster_size, int64_t sm_count, int64_t max_cap) {
  if (sm_count <= 0) return 0;
  const int64_t one_wave = cluster_size <= 2 ? sm_count : sm_count * 7 / 8;   // a GPC holds whole clusters
  for (int64_t cap = 1; cap <= max_cap; ++cap)
    if (ctas <= cap * one_wave) return cap;
  return 0;
}

// ------------------------------------------------------------------------- the Python fallback
std::optional<c10::OperatorHandle> python_op(const char* name) {
  return c10::Dispatcher::singleton().findSchema({name, ""});
}

// The Python implementation `name` of `op`, the call counted as Python's; without Python, the
// refusal as a ValueError naming why the C++ path did not serve the call.
c10::OperatorHandle python_fallback(int op, const char* name, const char* why) {
  State& s = state();
  s.slow[op].fetch_add(1, std::memory_order_relaxed);
  s.last_fast[op].store(false, std::memory_order_relaxed);
  auto handle = python_op(name);
  TORCH_CHECK_VALUE(handle.has_value(), "muse::", op == kQkvFront ? "qkv_front" : "attn2", ": ", why,
                    " (and muse_ops' Python implementation is not loaded)");
  return *handle;
}

at::Tensor qkv_front_python(const char* why, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                            const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin, at::Tensor& kv_cache,
                            std::optional<c10::string_view> backend) {
  return python_fallback(kQkvFront, "muse::_qkv_front_py", why).typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const std::optional<at::Tensor>&, at::Tensor&, std::optional<c10::string_view>)>()
      .call(x, weight, positions, slots, cos_sin, kv_cache, backend);
}

at::Tensor attn2_python(const char* why, const at::Tensor& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                        const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                        int64_t window, double scale, int64_t max_seq_len, std::optional<c10::string_view> backend) {
  return python_fallback(kAttn2, "muse::_attn2_py", why).typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const std::optional<at::Tensor>&, int64_t, int64_t, double, int64_t,
                              std::optional<c10::string_view>)>()
      .call(y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len, backend);
}

// ------------------------------------------------------------------------- the ops
// Each op is a plan (every check of the fast path; null, or why the call goes to Python) and a
// launch. A layer step in one call (layer_step) runs both plans before either op writes anything.
struct FrontPlan {
  Kernel kernel;
  Device* device = nullptr;
  int64_t m = 0, n = 0, kv_heads = 0;
};

const char* plan_qkv_front(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                           const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin,
                           const at::Tensor& kv_cache, const std::optional<c10::string_view>& backend, FrontPlan& p) {
  if (const char* why = backend_refusal(backend)) return why;
  if (!kv_cache_ok(kv_cache)) return "kv_cache metadata";
  const c10::Device device = kv_cache.device();
  p.kv_heads = kv_cache.size(1);
  p.n = kProjColsPerKvHead * p.kv_heads;
  if (!tensor_ok(x, at::kBFloat16, 2, device) || x.size(1) != kHidden) return "x metadata";
  p.m = x.size(0);
  if (p.m == 0) return "an empty batch";
  if (!tensor_ok(weight, at::kBFloat16, 2, device) || weight.size(0) != p.n || weight.size(1) != kHidden)
    return "weight metadata";
  if (!index_ok(positions, device) || positions.size(0) != p.m) return "positions metadata";
  if (!index_ok(slots, device) || slots.size(0) != p.m) return "slots metadata";
  const bool rope = cos_sin.has_value();
  if (rope && (!tensor_ok(*cos_sin, at::kFloat, 2, device) || cos_sin->size(1) != kHeadDim || cos_sin->size(0) < 1))
    return "cos_sin metadata";
  static const at::Tensor undefined;
  if (records_grad({&x, &weight, rope ? &*cos_sin : &undefined})) return "inputs that require grad";
  p.device = &device_state(device.index());
  if (!p.device->supported) return p.device->why.c_str();
  State& s = state();
  std::shared_lock lock(s.mutex);
  const int tile = tile_index(p.m, p.kv_heads);
  if (tile >= 0 && s.ffi.ready())
    p.kernel = s.qkv[qkv_index(tile, rope, positions.scalar_type() == at::kLong, slots.scalar_type() == at::kLong)];
  return p.kernel.call ? nullptr : "no kernel registered for this variant";
}

struct AttnPlan {
  Attn2Entry entry;
  Device* device = nullptr;
  int64_t r = 0, kv_heads = 0;
};

// y may be null (the step gate: y is qkv_front's output, [q_len * R, N] by construction).
const char* plan_attn2(const at::Tensor* y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                       const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                       int64_t window, double scale, int64_t max_seq_len,
                       const std::optional<c10::string_view>& backend, AttnPlan& p) {
  if (const char* why = backend_refusal(backend)) return why;
  if (!kv_cache_ok(kv_cache)) return "kv_cache metadata";
  const c10::Device device = kv_cache.device();
  p.kv_heads = kv_cache.size(1);
  if (q_len != 1 && q_len != 8) return "q_len";
  if (window < 0) return "window";
  if (max_seq_len < q_len) return "max_seq_len";
  if (!(scale > 0 && std::isfinite(scale))) return "scale";
  if (!tensor_ok(seq_lens, at::kInt, 1, device, false)) return "seq_lens metadata";
  p.r = seq_lens.size(0);
  if (p.r == 0) return "an empty batch";
  if (!tensor_ok(page_table, at::kInt, 2, device, false) || page_table.size(0) != p.r || page_table.size(1) < 1)
    return "page_table metadata";
  if (!workspace.has_value()) return "no workspace given";
  if (!tensor_ok(*workspace, at::kByte, 1, device)) return "workspace metadata";
  if (y && (!tensor_ok(*y, at::kBFloat16, 2, device) || y->size(0) != q_len * p.r ||
            y->size(1) != kProjColsPerKvHead * p.kv_heads))
    return "y metadata";
  if (y && records_grad({y})) return "inputs that require grad";
  p.device = &device_state(device.index());
  if (!p.device->supported) return p.device->why.c_str();
  State& s = state();
  {
    std::shared_lock lock(s.mutex);
    const bool wide = wide_layout(p.r, p.kv_heads, window);
    // the grid's shape is the same under every cap: read it from whichever cap is registered
    auto any = s.attn2.lower_bound({q_len, window, max_seq_len, wide, 0});
    if (any != s.attn2.end() && any->first == std::make_tuple(q_len, window, max_seq_len, wide, std::get<4>(any->first)) &&
        s.ffi.ready()) {
      const int64_t cap = occupancy_cap(any->second.ctas_per_pair * p.r * p.kv_heads, any->second.cluster_size,
                                        p.device->sm_count, wide ? s.occupancy_max_cap_wide : s.occupancy_max_cap_deep);
      auto it = s.attn2.find({q_len, window, max_seq_len, wide, cap});
      if (it == s.attn2.end()) return "no kernel registered for this deployment, layout and occupancy cap";
      p.entry = it->second;
    }
  }
  if (!p.entry.kernel.call) return "no kernel registered for this deployment and layout";
  if (workspace->numel() < attn2_workspace_bytes(p.r, p.kv_heads, p.entry.slots, q_len))
    return "workspace too small for this batch";
  return nullptr;
}

void count_fast(int op) {
  State& s = state();
  s.fast[op].fetch_add(1, std::memory_order_relaxed);
  s.last_fast[op].store(true, std::memory_order_relaxed);
}

// The host-time accounting of one fast call: t0 entry, t1 after the plan, t2 after the allocation
// (the clock reads only while State::clock is on; the call counts always).
struct FastCallClock {
  int op;
  bool on = state().clock.load(std::memory_order_relaxed);
  int64_t t0 = on ? now_ns() : 0, t1 = 0, t2 = 0;
  void planned() {
    if (on) t1 = now_ns();
  }
  void allocated() {
    if (on) t2 = now_ns();
  }
  void launched() {
    State& s = state();
    if (on) {
      s.plan_ns[op].fetch_add(t1 - t0, std::memory_order_relaxed);
      s.alloc_ns[op].fetch_add(t2 - t1, std::memory_order_relaxed);
      s.fast_ns[op].fetch_add(now_ns() - t0, std::memory_order_relaxed);
      s.clocked[op].fetch_add(1, std::memory_order_relaxed);
    }
    count_fast(op);
  }
};

// The device guard of a launch, engaged only where the current device is not the inputs' (the
// allocator and the launch use the current one): most calls already run on it, and the guard's
// restore costs a driver query each time.
struct LaunchDevice {
  std::optional<c10::DeviceGuard> guard;
  explicit LaunchDevice(const c10::Device& device) {
    if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice() != device) guard.emplace(device);
  }
};

// The launches of planned calls (the plans passed, the launch device current, the output allocated).
void launch_qkv_front(const FrontPlan& p, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                      const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin, const at::Tensor& kv_cache,
                      const at::Tensor& y) {
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
  args.integer(k_split(p.kv_heads));
  call(p.kernel, args, "qkv_front", kQkvFront);
}

void launch_attn2(const AttnPlan& p, const at::Tensor& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                  const at::Tensor& seq_lens, const at::Tensor& workspace, double scale, int64_t max_seq_len,
                  const at::Tensor& out) {
  Args args;
  args.device = kv_cache.device().index();
  args.tensor(y);
  args.tensor(kv_cache);
  args.tensor(page_table);
  args.tensor(seq_lens);
  args.tensor(out);
  args.tensor(workspace);
  args.tensor(p.device->error_flag);
  args.real(scale);
  args.integer(max_seq_len);
  args.integer(p.device->sm_count);   // attn2_plan.wave_ctas
  call(p.entry.kernel, args, "attn2", kAttn2);
}

// The outputs of planned calls: y [M, N] of qkv_front, out [rows, 512 Hkv] of attn2.
at::Tensor qkv_front_output(const FrontPlan& p) { return new_output(*p.device, {p.m, p.n}, at::kBFloat16); }

at::Tensor attn2_output(const AttnPlan& p, int64_t rows) {
  return new_output(*p.device, {rows, kGroup * p.kv_heads * kHeadDim}, at::kBFloat16);
}

at::Tensor qkv_front_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                          const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin, at::Tensor& kv_cache,
                          std::optional<c10::string_view> backend) {
  FastCallClock clock{kQkvFront};
  FrontPlan p;
  if (const char* why = plan_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, backend, p))
    return qkv_front_python(why, x, weight, positions, slots, cos_sin, kv_cache, backend);
  clock.planned();
  LaunchDevice on_device(kv_cache.device());   // the output and the launch: the inputs' device
  at::Tensor y = qkv_front_output(p);
  clock.allocated();
  launch_qkv_front(p, x, weight, positions, slots, cos_sin, kv_cache, y);
  clock.launched();
  return y;
}

at::Tensor attn2_cuda(const at::Tensor& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                      const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                      int64_t window, double scale, int64_t max_seq_len, std::optional<c10::string_view> backend) {
  FastCallClock clock{kAttn2};
  AttnPlan p;
  if (const char* why = plan_attn2(&y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                                   backend, p))
    return attn2_python(why, y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len,
                        backend);
  clock.planned();
  LaunchDevice on_device(kv_cache.device());
  at::Tensor out = attn2_output(p, y.size(0));
  clock.allocated();
  launch_attn2(p, y, kv_cache, page_table, seq_lens, *workspace, scale, max_seq_len, out);
  clock.launched();
  return out;
}

// A whole layer step in one call (MuseAttentionDecode's eager step): both plans, i.e. every check
// of the step (attn2's on y follow from qkv_front's: y is [q_len * R, N] by construction), before
// either kernel writes anything; then qkv_front and attn2 on its y. One dispatcher call where the
// step took three (a step gate and the two ops, each parsing its arguments). Returns None, having
// written nothing, where the step cannot take the C++ path: the caller then checks it in Python
// and calls the ops one by one. Counted as a fast call of each op, not clocked.
std::optional<at::Tensor> layer_step(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                                     const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin,
                                     at::Tensor& kv_cache, const at::Tensor& page_table, const at::Tensor& seq_lens,
                                     const std::optional<at::Tensor>& workspace, int64_t q_len, int64_t window,
                                     double scale, int64_t max_seq_len, std::optional<c10::string_view> backend) {
  FrontPlan front;
  AttnPlan attn;
  if (plan_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, backend, front) ||
      plan_attn2(nullptr, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len, backend,
                 attn) ||
      front.m != q_len * attn.r)
    return std::nullopt;
  LaunchDevice on_device(kv_cache.device());
  at::Tensor y = qkv_front_output(front);
  at::Tensor out = attn2_output(attn, front.m);
  launch_qkv_front(front, x, weight, positions, slots, cos_sin, kv_cache, y);
  count_fast(kQkvFront);
  launch_attn2(attn, y, kv_cache, page_table, seq_lens, *workspace, scale, max_seq_len, out);
  count_fast(kAttn2);
  return out;
}

// ------------------------------------------------------------------------- registration (Python, tables)
Kernel function_kernel(int64_t handle_value) {
  State& s = state();
  TORCH_CHECK(s.ffi.ready(), "muse shims: TVM-FFI not resolved (call _shims_configure first)");
  auto handle = reinterpret_cast<TVMFFIObjectHandle>(static_cast<intptr_t>(handle_value));
  TORCH_CHECK(handle && TVMFFIObjectGetTypeIndex(handle) == kTVMFFIFunction, "muse shims: not a TVM-FFI Function");
  s.ffi.inc_ref(handle);
  Kernel k;
  k.call = TVMFFIFunctionGetCellPtr(handle)->safe_call;
  k.self = handle;
  k.owned = handle;
  return k;
}

void release(Kernel& k) {
  if (k.owned) state().ffi.dec_ref(k.owned);
  k = Kernel{};
}

void configure(std::vector<int64_t> tile_limits, std::vector<int64_t> tile_tokens, std::vector<int64_t> tile_heads,
               int64_t wide_max_pairs, int64_t wide_max_pairs_window, int64_t occupancy_max_cap_wide,
               int64_t occupancy_max_cap_deep, std::string libtvm_ffi) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  TORCH_CHECK(tile_limits.size() <= static_cast<size_t>(kMaxTiles), "muse shims: too many token tiles");
  TORCH_CHECK(tile_tokens.size() == tile_limits.size() && tile_heads.size() == tile_limits.size(),
              "muse shims: one token count and head count per token tile");
  s.tile_limits = std::move(tile_limits);
  s.tile_tokens = std::move(tile_tokens);
  s.tile_heads = std::move(tile_heads);
  s.wide_max_pairs = wide_max_pairs;
  s.wide_max_pairs_window = wide_max_pairs_window;
  s.occupancy_max_cap_wide = occupancy_max_cap_wide;
  s.occupancy_max_cap_deep = occupancy_max_cap_deep;
  if (!libtvm_ffi.empty()) {
    void* h = dlopen(libtvm_ffi.c_str(), RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(h, "muse shims: cannot load ", libtvm_ffi, ": ", dlerror());
    s.ffi.resolve(h);
  }
}

void set_qkv_front(int64_t tile, bool rope, bool pos64, bool slot64, Kernel k) {
  State& s = state();
  TORCH_CHECK(tile >= 0 && tile < kMaxTiles, "muse shims: tile index ", tile);
  std::unique_lock lock(s.mutex);
  Kernel& slot = s.qkv[qkv_index(tile, rope, pos64, slot64)];
  release(slot);
  slot = k;
}

void set_attn2(int64_t q_len, int64_t window, int64_t max_seq_len, bool wide, int64_t cap, int64_t slots,
               int64_t ctas_per_pair, int64_t cluster_size, Kernel k) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  auto key = std::make_tuple(q_len, window, max_seq_len, wide, cap);
  auto it = s.attn2.find(key);
  if (it != s.attn2.end()) release(it->second.kernel);
  s.attn2[key] = Attn2Entry{k, slots, ctas_per_pair, cluster_size};
}

// `library`: an ahead-of-time kernel library (muse_ops/cutedsl/aot.py); its table `<stem>.shims`
// lists, line by line, `tiles L0 L1 ...`, `wide PAIRS PAIRS_WINDOW`, `occupancy MAX_CAP_WIDE MAX_CAP_DEEP`,
// `qkv_front TILE ROPE POS64 SLOT64 SYMBOL` and
// `attn2 Q_LEN WINDOW MAX_SEQ_LEN WIDE CAP SLOTS CTAS_PER_PAIR CLUSTER_SIZE SYMBOL`.
std::string load_library(std::string library) {
  State& s = state();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK_VALUE(handle, "muse shims: cannot load ", library, ": ", dlerror());
  {
    std::unique_lock lock(s.mutex);
    s.ffi.resolve(handle);
    s.libraries.push_back(handle);
  }
  std::string table = library.substr(0, library.rfind('.')) + ".shims";
  std::ifstream in(table);
  TORCH_CHECK_VALUE(in, "muse shims: no table ", table, " beside ", library);
  auto kernel_of = [&](const std::string& symbol) {
    void* f = dlsym(handle, ("__tvm_ffi_" + symbol).c_str());
    TORCH_CHECK_VALUE(f, "muse shims: ", library, " lacks ", symbol);
    Kernel k;
    k.call = reinterpret_cast<TVMFFISafeCallType>(f);
    return k;
  };
  int64_t qkv = 0, attn = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "tiles") {
      std::vector<int64_t> limits;
      for (int64_t v; words >> v;) limits.push_back(v);
      TORCH_CHECK_VALUE(limits.size() <= static_cast<size_t>(kMaxTiles), "muse shims: too many token tiles in ", table);
      std::unique_lock lock(s.mutex);
      s.tile_limits = limits;
    } else if (kind == "tile_shapes") {   // tokens and heads per CTA of each tile, in pairs
      std::vector<int64_t> tokens, heads;
      for (int64_t t, h; words >> t >> h;) {
        tokens.push_back(t);
        heads.push_back(h);
      }
      std::unique_lock lock(s.mutex);
      s.tile_tokens = tokens;
      s.tile_heads = heads;
    } else if (kind == "wide") {
      std::unique_lock lock(s.mutex);
      words >> s.wide_max_pairs >> s.wide_max_pairs_window;
    } else if (kind == "occupancy") {
      std::unique_lock lock(s.mutex);
      words >> s.occupancy_max_cap_wide >> s.occupancy_max_cap_deep;
    } else if (kind == "qkv_front") {
      int64_t tile, rope, pos64, slot64;
      std::string symbol;
      words >> tile >> rope >> pos64 >> slot64 >> symbol;
      set_qkv_front(tile, rope, pos64, slot64, kernel_of(symbol));
      ++qkv;
    } else if (kind == "attn2") {
      int64_t q_len, window, msl, wide, cap, slots, ctas_per_pair, cluster_size;
      std::string symbol;
      words >> q_len >> window >> msl >> wide >> cap >> slots >> ctas_per_pair >> cluster_size >> symbol;
      set_attn2(q_len, window, msl, wide, cap, slots, ctas_per_pair, cluster_size, kernel_of(symbol));
      ++attn;
    }
  }
  TORCH_CHECK_VALUE(s.ffi.ready(), "muse shims: ", library, " does not bring TVM-FFI's C API with it");
  std::unique_lock lock(s.mutex);
  s.library_status = library + " (" + std::to_string(qkv) + " qkv_front entries, " + std::to_string(attn) +
                     " attn2 deployment entries)";
  return s.library_status;
}

void clear() {
  State& s = state();
  std::unique_lock lock(s.mutex);
  for (auto& k : s.qkv) release(k);
  for (auto& kv : s.attn2) release(kv.second.kernel);
  s.attn2.clear();
}

std::vector<int64_t> stats() {
  State& s = state();
  std::shared_lock lock(s.mutex);
  int64_t qkv = 0;
  for (auto& k : s.qkv) qkv += k.call != nullptr;
  return {s.fast[0].load(), s.slow[0].load(), s.fast[1].load(), s.slow[1].load(), s.last_fast[0].load(),
          s.last_fast[1].load(), qkv, static_cast<int64_t>(s.attn2.size()), s.fast_ns[0].load(),
          s.fast_ns[1].load(), s.launch_ns[0].load(), s.launch_ns[1].load(), s.plan_ns[0].load(),
          s.plan_ns[1].load(), s.alloc_ns[0].load(), s.alloc_ns[1].load(), s.clocked[0].load(), s.clocked[1].load()};
}

int64_t plan(std::string what, std::vector<int64_t> a) {   // the formulas, for the tests
  if (what == "k_split") return k_split(a.at(0));
  if (what == "workspace_bytes") return attn2_workspace_bytes(a.at(0), a.at(1), a.at(2), a.at(3));
  if (what == "tile") return tile_index(a.at(0), a.at(1));   // M, Hkv
  if (what == "wide") return wide_layout(a.at(0), a.at(1), a.at(2));
  if (what == "occupancy_cap") return occupancy_cap(a.at(0), a.at(1), a.at(2), a.at(3));   // ctas, cluster, SMs, max cap
  TORCH_CHECK_VALUE(false, "muse shims: no plan function ", what);
}

}  // namespace
}  // namespace muse_shims

// The public schemas: character for character muse_ops.ops.SCHEMAS (tests/test_shims.py).
TORCH_LIBRARY(muse, m) {
  using namespace muse_shims;
  m.def("qkv_front(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, "
        "Tensor(a!) kv_cache, *, str? backend=None) -> Tensor");
  m.def("attn2(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, Tensor(a!)? workspace=None, *, "
        "int q_len, int window, float scale, int max_seq_len, str? backend=None) -> Tensor");
  m.def("_shims_configure(int[] tile_limits, int[] tile_tokens, int[] tile_heads, int wide_max_pairs, int wide_max_pairs_window, int occupancy_max_cap_wide, "
        "int occupancy_max_cap_deep, str libtvm_ffi) -> ()",
        &configure);
  m.def("_shims_add_qkv_front(int tile, bool rope, bool pos64, bool slot64, int function) -> ()",
        [](int64_t tile, bool rope, bool pos64, bool slot64, int64_t function) {
          set_qkv_front(tile, rope, pos64, slot64, function_kernel(function));
        });
  m.def("_shims_add_attn2(int q_len, int window, int max_seq_len, bool wide, int cap, int slots, int ctas_per_pair, "
        "int cluster_size, int function) -> ()",
        [](int64_t q_len, int64_t window, int64_t msl, bool wide, int64_t cap, int64_t slots, int64_t ctas_per_pair,
           int64_t cluster_size, int64_t function) {
          set_attn2(q_len, window, msl, wide, cap, slots, ctas_per_pair, cluster_size, function_kernel(function));
        });
  m.def("_shims_load_library(str library) -> str", &load_library);
  m.def("_shims_set_backend(str? name) -> ()", [](std::optional<std::string> name) {
    std::unique_lock lock(state().mutex);
    state().forced_backend = std::move(name);
  });
  m.def("_shims_note_python(int op) -> ()",
        [](int64_t op) { state().last_fast[op != 0].store(false, std::memory_order_relaxed); });
  m.def("_shims_stats() -> int[]", &stats);
  m.def("_shims_set_clock(bool on) -> ()", [](bool on) { state().clock.store(on, std::memory_order_relaxed); });
  // positional scalars: each keyword costs the Python argument parser ~0.5 us (bench/RESULTS.md)
  m.def("_shims_layer_step(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, "
        "Tensor(a!) kv_cache, Tensor page_table, Tensor seq_lens, Tensor(b!)? workspace, int q_len, int window, "
        "float scale, int max_seq_len, str? backend) -> Tensor?");
  m.def("_shims_clear() -> ()", &clear);
  // the dispatcher's own cost for qkv_front's argument list (bench/host.py: the floor of a call)
  m.def("_shims_null(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, "
        "Tensor(a!) kv_cache, *, str? backend=None) -> Tensor");
  // the same for attn2's argument list, and with its workspace not marked mutable (which one costs what)
  m.def("_shims_null_attn2(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, Tensor(a!)? workspace=None, "
        "*, int q_len, int window, float scale, int max_seq_len, str? backend=None) -> Tensor");
  m.def("_shims_null_attn2_const(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, Tensor? workspace=None, "
        "*, int q_len, int window, float scale, int max_seq_len, str? backend=None) -> Tensor");
  m.def("_shims_plan(str what, int[] args) -> int", &plan);
  m.def("_shims_error_flag(int device) -> Tensor", [](int64_t index) {
    Device& d = device_state(static_cast<int>(index));
    TORCH_CHECK_VALUE(d.supported, "muse shims: device ", index, ": ", d.why);
    return d.error_flag;
  });
}

TORCH_LIBRARY_IMPL(muse, CUDA, m) {
  m.impl("qkv_front", &muse_shims::qkv_front_cuda);
  m.impl("attn2", &muse_shims::attn2_cuda);
  m.impl("_shims_layer_step", &muse_shims::layer_step);
  m.impl("_shims_null", [](const at::Tensor& x, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, at::Tensor&, std::optional<c10::string_view>) { return x; });
  const auto null_attn2 = [](const at::Tensor& y, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const std::optional<at::Tensor>&, int64_t, int64_t, double, int64_t,
                             std::optional<c10::string_view>) { return y; };
  m.impl("_shims_null_attn2", null_attn2);
  m.impl("_shims_null_attn2_const", null_attn2);
}
