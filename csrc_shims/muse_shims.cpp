// muse_shims: torch.ops.muse.qkv_front and torch.ops.muse.attn2 in C++, launching the CuTe DSL
// kernels through TVM-FFI's C ABI (docs/DESIGN.md section 16). This file is the package library's
// state and what it is handed: the plan's tables (rows, from Python or an ahead-of-time
// library's `.shims` file), the kernels, the counts. The fast path is muse_shims.h; the ops are
// registered by muse_bindings.cpp; development hooks live in muse_shims_dev.cpp, a library of
// its own that the package never loads.
//
// The tables, one row each (muse_ops/cutedsl/shims.py writes them; `_shims_table` and the
// `.shims` file of `_shims_load_library` take the same rows, so a program without Python plans
// exactly as Python does):
//   shims_table FORMAT                         (first row of a `.shims` file)
//   model HIDDEN HEAD_DIM PAGE_SIZE CACHE_ROW
//   cache_dtypes NAME...                       (torch's names; a key's CACHE is an index of these)
//   kv_heads HKV K_SPLIT PROJ_COLS OUT_COLS (M_UPPER TILE)...
//   attn2_deployment Q_LEN WINDOW MAX_SEQ_LEN CACHE WORKSPACE_PER_PAIR...   (one per variant)
//   attn2_plan Q_LEN WINDOW MAX_SEQ_LEN CACHE SM_COUNT WAVE HKV (R_UPPER VARIANT)...
// and the kernels, by key (then a TVM-FFI function from Python, or a symbol in a `.shims` file):
//   qkv_front TILE CACHE ROPE POS64 SLOT64
//   attn2 Q_LEN WINDOW MAX_SEQ_LEN CACHE VARIANT
//
// No CUDA header is needed: the current stream comes from c10's device-guard interface and the
// device attributes from the driver (libcuda.so.1), so the file builds wherever torch does.
#include "muse_shims.h"

#include <c10/core/ScalarType.h>

#include <fstream>
#include <sstream>

// The interface marker muse_ops/cutedsl/shims.py reads from the file before loading it.
extern "C" __attribute__((used, visibility("default"))) const char muse_shims_abi[] =
    "muse_shims_abi=" MUSE_SHIMS_STR(MUSE_SHIMS_ABI) ";";

namespace muse_shims {

constexpr int64_t kTableFormat = 5;   // the first row of a `.shims` file: muse_ops/cutedsl/shims.py TABLE_FORMAT

State& state() {
  static State* s = new State();   // never destroyed: kernels may run during interpreter teardown
  return *s;
}

}  // namespace muse_shims

// The development library (muse_shims_dev.cpp) reads the tables and counts of this one: its State,
// for a library of the same interface version and layout, or null.
extern "C" __attribute__((visibility("default"))) void* muse_shims_state(int abi, size_t state_size) {
  if (abi != MUSE_SHIMS_ABI || state_size != sizeof(muse_shims::State)) return nullptr;
  return &muse_shims::state();
}

namespace muse_shims {

// ------------------------------------------------------------------------- the ops' CUDA kernels
at::Tensor qkv_front_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                          const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin, at::Tensor& kv_cache,
                          const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                          std::optional<c10::string_view> backend) {
  return qkv_front_op<NoClock>(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale, backend);
}

at::Tensor attn2_cuda(const at::Tensor& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                      const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                      int64_t window, double scale, int64_t max_seq_len, const std::optional<at::Tensor>& k_scale,
                      const std::optional<at::Tensor>& v_scale, std::optional<c10::string_view> backend) {
  return attn2_op<NoClock>(y, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len, k_scale,
                           v_scale, backend);
}

// A whole layer step in one call (MuseAttentionDecode's eager step): both plans, i.e. every check
// of the step (attn2's on y follow from qkv_front's: y is [q_len * R, N] by construction), before
// either kernel writes anything; then qkv_front and attn2 on its y. One dispatcher call where the
// step took three. Returns None, having written nothing, where the step cannot take the C++ path:
// the caller then checks it in Python and calls the ops one by one. Counted as a fast call of each op.
std::optional<at::Tensor> layer_step(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                                     const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin,
                                     at::Tensor& kv_cache, const at::Tensor& page_table, const at::Tensor& seq_lens,
                                     const std::optional<at::Tensor>& workspace, int64_t q_len, int64_t window,
                                     double scale, int64_t max_seq_len, const std::optional<at::Tensor>& k_scale,
                                     const std::optional<at::Tensor>& v_scale,
                                     std::optional<c10::string_view> backend) {
  FrontPlan front;
  AttnPlan attn;
  if (plan_qkv_front(x, weight, positions, slots, cos_sin, kv_cache, k_scale, v_scale, backend, front) ||
      plan_attn2(nullptr, kv_cache, page_table, seq_lens, workspace, q_len, window, scale, max_seq_len, k_scale,
                 v_scale, backend, attn) ||
      front.m != q_len * attn.r)
    return std::nullopt;
  NoClock clock(kQkvFront);
  LaunchDevice on_device(kv_cache.device());
  at::Tensor y = qkv_front_output(front);
  at::Tensor out = attn2_output(attn, front.m);
  launch_qkv_front(front, x, weight, positions, slots, cos_sin, kv_cache, y, clock);
  count_fast(kQkvFront);
  launch_attn2(attn, y, kv_cache, page_table, seq_lens, *workspace, scale, max_seq_len, out, clock);
  count_fast(kAttn2);
  return out;
}

// ------------------------------------------------------------------------- the tables
namespace {

std::vector<int64_t> integers(std::istringstream& words, const std::string& row) {
  std::vector<int64_t> out;
  std::string word;
  while (words >> word) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK_VALUE(used == word.size(), "muse shims: not an integer '", word, "' in the row '", row, "'");
    out.push_back(v);
  }
  return out;
}

// (upper, value) pairs from `from` on: ascending uppers, values in [-1, limit).
Runs runs(const std::vector<int64_t>& v, size_t from, int64_t limit, const std::string& row) {
  TORCH_CHECK_VALUE(v.size() >= from && (v.size() - from) % 2 == 0, "muse shims: runs come in pairs: '", row, "'");
  Runs r;
  for (size_t i = from; i < v.size(); i += 2) {
    TORCH_CHECK_VALUE(r.upper.empty() || v[i] > r.upper.back(), "muse shims: runs must ascend: '", row, "'");
    TORCH_CHECK_VALUE(v[i + 1] >= -1 && v[i + 1] < limit, "muse shims: a value out of range in '", row, "'");
    r.upper.push_back(v[i]);
    r.value.push_back(static_cast<int32_t>(v[i + 1]));
  }
  return r;
}

Attn2Deployment* deployment(State& s, const std::vector<int64_t>& v, const std::string& row) {
  TORCH_CHECK_VALUE(v.size() >= 4, "muse shims: a row without its deployment: '", row, "'");
  for (Attn2Deployment& d : s.attn2)
    if (d.q_len == v[0] && d.window == v[1] && d.max_seq_len == v[2] && d.cache == v[3]) return &d;
  return nullptr;
}

void release(State& s, Kernel& k) {
  if (k.owned) s.ffi.dec_ref(k.owned);
  k = Kernel{};
}

// Apply one row of the tables (the caller holds the lock).
void apply_row(State& s, const std::string& row) {
  std::istringstream words(row);
  std::string kind;
  words >> kind;
  if (kind == "cache_dtypes") {
    std::array<int8_t, kScalarTypes> codes;
    codes.fill(-1);
    int code = 0;
    for (std::string name; words >> name; ++code) {
      const auto& known = c10::getStringToDtypeMap();
      auto it = known.find(name);
      TORCH_CHECK_VALUE(it != known.end(), "muse shims: no dtype named '", name, "'");
      TORCH_CHECK_VALUE(code < kMaxCacheDtypes, "muse shims: more than ", kMaxCacheDtypes, " cache dtypes");
      codes[static_cast<size_t>(it->second)] = static_cast<int8_t>(code);
    }
    s.cache_code = codes;
    return;
  }
  const std::vector<int64_t> v = integers(words, row);
  if (kind == "shims_table") {
    TORCH_CHECK_VALUE(v.size() == 1 && v[0] == kTableFormat, "muse shims: a table of format ", v.empty() ? 0 : v[0],
                      "; this library reads format ", kTableFormat, " (rebuild one or the other)");
  } else if (kind == "model") {
    TORCH_CHECK_VALUE(v.size() == 4, "muse shims: '", row, "'");
    s.model = Model{v[0], v[1], v[2], v[3]};
  } else if (kind == "kv_heads") {
    TORCH_CHECK_VALUE(v.size() >= 4 && v[0] >= 1 && v[0] < 4096 && v[1] >= 1, "muse shims: '", row, "'");
    if (static_cast<int64_t>(s.kv_heads.size()) <= v[0]) s.kv_heads.resize(v[0] + 1);
    s.kv_heads[v[0]] = KvHeadsTable{v[1], v[2], v[3], runs(v, 4, kMaxTiles, row)};
  } else if (kind == "attn2_deployment") {
    TORCH_CHECK_VALUE(v.size() >= 5, "muse shims: a deployment without variants: '", row, "'");
    Attn2Deployment* d = deployment(s, v, row);
    if (!d) {
      s.attn2.emplace_back();
      d = &s.attn2.back();
      d->q_len = v[0], d->window = v[1], d->max_seq_len = v[2], d->cache = v[3];
    }
    d->workspace_per_pair.assign(v.begin() + 4, v.end());
    for (size_t i = d->workspace_per_pair.size(); i < d->kernels.size(); ++i) release(s, d->kernels[i]);
    d->kernels.resize(d->workspace_per_pair.size());
  } else if (kind == "attn2_plan") {
    TORCH_CHECK_VALUE(v.size() >= 7 && v[6] >= 1 && v[6] < 4096, "muse shims: '", row, "'");
    Attn2Deployment* d = deployment(s, v, row);
    TORCH_CHECK_VALUE(d, "muse shims: a plan before its attn2_deployment row: '", row, "'");
    auto plan = std::find_if(d->plans.begin(), d->plans.end(), [&](const Attn2Plan& p) { return p.sm_count == v[4]; });
    if (plan == d->plans.end()) {
      d->plans.emplace_back();
      plan = d->plans.end() - 1;
      plan->sm_count = v[4];
    }
    plan->wave = v[5];
    if (static_cast<int64_t>(plan->by_kv_heads.size()) <= v[6]) plan->by_kv_heads.resize(v[6] + 1);
    plan->by_kv_heads[v[6]] = runs(v, 7, static_cast<int64_t>(d->kernels.size()), row);
  } else {
    TORCH_CHECK_VALUE(false, "muse shims: unknown table row '", row, "'");
  }
}

// The slot a kernel key names (the caller holds the lock).
Kernel& kernel_slot(State& s, const std::string& key) {
  std::istringstream words(key);
  std::string kind;
  words >> kind;
  const std::vector<int64_t> v = integers(words, key);
  if (kind == "qkv_front") {
    TORCH_CHECK_VALUE(v.size() == 5 && v[0] >= 0 && v[0] < kMaxTiles && v[1] >= 0 && v[1] < kMaxCacheDtypes,
                      "muse shims: bad qkv_front key '", key, "'");
    return s.qkv[qkv_key(v[0], v[1], v[2] != 0, v[3] != 0, v[4] != 0)];
  }
  TORCH_CHECK_VALUE(kind == "attn2" && v.size() == 5, "muse shims: bad kernel key '", key, "'");
  Attn2Deployment* d = deployment(s, v, key);
  TORCH_CHECK_VALUE(d && v[4] >= 0 && v[4] < static_cast<int64_t>(d->kernels.size()),
                    "muse shims: a kernel of no registered deployment variant: '", key, "'");
  return d->kernels[v[4]];
}

void set_kernel(State& s, const std::string& key, Kernel k) {
  Kernel& slot = kernel_slot(s, key);
  release(s, slot);
  slot = k;
}

}  // namespace

void set_table(std::string row) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  apply_row(s, row);
}

void set_ffi(std::string libtvm_ffi) {
  void* h = dlopen(libtvm_ffi.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(h, "muse shims: cannot load ", libtvm_ffi, ": ", dlerror());
  State& s = state();
  std::unique_lock lock(s.mutex);
  s.ffi.resolve(h);
}

// A variant Python compiled or loaded: a TVM-FFI Function (we hold a reference to it).
void add_kernel(std::string key, int64_t function) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  TORCH_CHECK(s.ffi.ready(), "muse shims: TVM-FFI not resolved (call _shims_set_ffi first)");
  auto handle = reinterpret_cast<TVMFFIObjectHandle>(static_cast<intptr_t>(function));
  TORCH_CHECK(handle && TVMFFIObjectGetTypeIndex(handle) == kTVMFFIFunction, "muse shims: not a TVM-FFI Function");
  Kernel k;
  k.call = TVMFFIFunctionGetCellPtr(handle)->safe_call;
  k.self = handle;
  k.owned = handle;
  set_kernel(s, key, k);   // checks the key before taking the reference
  s.ffi.inc_ref(handle);
}

// `library`: an ahead-of-time kernel library (muse_ops/cutedsl/aot.py) and its table
// `<stem>.shims`: the rows above, a kernel key's row ending with its symbol.
std::string load_library(std::string library) {
  State& s = state();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK_VALUE(handle, "muse shims: cannot load ", library, ": ", dlerror());
  const std::string table = library.substr(0, library.rfind('.')) + ".shims";
  std::ifstream in(table);
  TORCH_CHECK_VALUE(in, "muse shims: no table ", table, " beside ", library);
  std::unique_lock lock(s.mutex);
  s.ffi.resolve(handle);
  s.libraries.push_back(handle);
  int64_t kernels = 0, rows = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (rows++ == 0)
      TORCH_CHECK_VALUE(line.rfind("shims_table ", 0) == 0, "muse shims: ", table, " does not start with its format");
    if (line.rfind("qkv_front ", 0) == 0 || line.rfind("attn2 ", 0) == 0) {
      const size_t space = line.rfind(' ');
      const std::string symbol = line.substr(space + 1);
      void* f = dlsym(handle, ("__tvm_ffi_" + symbol).c_str());
      TORCH_CHECK_VALUE(f, "muse shims: ", library, " lacks ", symbol);
      Kernel k;
      k.call = reinterpret_cast<TVMFFISafeCallType>(f);
      set_kernel(s, line.substr(0, space), k);
      ++kernels;
    } else {
      apply_row(s, line);
    }
  }
  TORCH_CHECK_VALUE(s.ffi.ready(), "muse shims: ", library, " does not bring TVM-FFI's C API with it");
  s.library_status = library + " (" + std::to_string(kernels) + " kernels, " + std::to_string(s.attn2.size()) +
                     " attn2 deployments)";
  return s.library_status;
}

void set_backend(std::optional<std::string> name) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  s.forced_backend = std::move(name);
}

void note_python(int64_t op) { state().last_fast[op != 0].store(false, std::memory_order_relaxed); }

// Forget every kernel (the functions may be freed); the tables stay (they are plan facts).
void clear() {
  State& s = state();
  std::unique_lock lock(s.mutex);
  for (auto& k : s.qkv) release(s, k);
  for (auto& d : s.attn2)
    for (auto& k : d.kernels) release(s, k);
}

// [C++ calls, Python calls] of qkv_front and attn2, whether each one's last call was C++'s, and the
// kernels held: qkv_front variants, attn2 deployments, attn2 variants.
std::vector<int64_t> stats() {
  State& s = state();
  std::shared_lock lock(s.mutex);
  int64_t qkv = 0, attn = 0;
  for (auto& k : s.qkv) qkv += k.call != nullptr;
  for (auto& d : s.attn2)
    for (auto& k : d.kernels) attn += k.call != nullptr;
  return {s.fast[0].load(), s.slow[0].load(), s.fast[1].load(), s.slow[1].load(), s.last_fast[0].load(),
          s.last_fast[1].load(), qkv, static_cast<int64_t>(s.attn2.size()), attn};
}

at::Tensor error_flag(int64_t index) {
  State& s = state();
  std::shared_lock lock(s.mutex);
  Device& d = device_state(s, static_cast<int>(index));
  TORCH_CHECK_VALUE(d.supported, "muse shims: device ", index, ": ", d.why);
  return d.error_flag;
}

}  // namespace muse_shims
