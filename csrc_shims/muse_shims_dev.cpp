// muse_shims_dev: development hooks for the C++ ops, in a library of their own that the package
// never loads (built only on request: `python -m muse_ops build-shims --dev`, or
// muse_ops.cutedsl.shims.load_dev(), which builds it where it is missing or stale and attaches it to
// the package's library). Who uses it: bench/host.py and tools/host_floors.py (host time),
// tests/test_shims.py (the C++ lookups and metadata checks against the Python plan).
//
// - `_shims_null*`: ops with the public ops' argument lists that do nothing: the dispatcher's own
//   cost of a call (for attn2 also with its workspace not marked mutable).
// - `_shims_qkv_front_clocked` / `_shims_attn2_clocked`: the package's fast path (muse_shims.h) with
//   a host clock (t0 entry, after the plan, after the allocation, around the kernel call); read by
//   `_shims_clock_stats`. The package's own ops carry no clock.
// - `_shims_lookup`, `_shims_check_*`: the lookups and metadata checks of the fast path on the
//   tables the package's library holds, for the tests.
// It reads the package library's tables through its State (`muse_shims_state`, for a library of
// the same interface version and layout only), attached by `_shims_dev_attach`.
#include "muse_shims.h"

#include <chrono>

extern "C" __attribute__((used, visibility("default"))) const char muse_shims_dev_abi[] =
    "muse_shims_dev_abi=" MUSE_SHIMS_STR(MUSE_SHIMS_ABI) ";";

namespace muse_shims {
namespace {
State* attached = nullptr;
}  // namespace

State& state() {
  TORCH_CHECK(attached, "muse shims dev: not attached to the C++ ops (muse_ops.cutedsl.shims.load_dev)");
  return *attached;
}

namespace {

std::string attach(std::string library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  TORCH_CHECK(handle, "muse shims dev: ", library, " is not loaded in this process (load the C++ ops first)");
  auto get = reinterpret_cast<void* (*)(int, size_t)>(dlsym(handle, "muse_shims_state"));
  void* found = get ? get(MUSE_SHIMS_ABI, sizeof(State)) : nullptr;
  dlclose(handle);   // the reference RTLD_NOLOAD took
  TORCH_CHECK(found, "muse shims dev: ", library, " is of another interface version or layout than this development ",
              "library: rebuild both (python -m muse_ops build-shims; python -m muse_ops build-shims --dev)");
  attached = static_cast<State*>(found);
  return "attached to " + library;
}

// ------------------------------------------------------------------------- the host clock
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Clocked {
  std::atomic<int64_t> calls[2] = {0, 0};
  std::atomic<int64_t> total_ns[2] = {0, 0};    // the C++ kernel's whole body
  std::atomic<int64_t> plan_ns[2] = {0, 0};     // the checks and the lookups
  std::atomic<int64_t> alloc_ns[2] = {0, 0};    // the device guard and the output's allocation
  std::atomic<int64_t> launch_ns[2] = {0, 0};   // the kernel call (stream set, call, stream restored)
};

Clocked& clocked() {
  static Clocked c;
  return c;
}

// The fast path's clock (six reads a call, ~0.15 us): only fast calls are counted.
struct HostClock {
  int op;
  int64_t t0, t1 = 0, t2 = 0, t3 = 0, launch = 0;
  explicit HostClock(int op) : op(op), t0(now_ns()) {}
  void planned() { t1 = now_ns(); }
  void allocated() { t2 = now_ns(); }
  void launch_begin() { t3 = now_ns(); }
  void launch_end() { launch += now_ns() - t3; }
  void done() {
    const int64_t t = now_ns();
    Clocked& c = clocked();
    c.calls[op].fetch_add(1, std::memory_order_relaxed);
    c.total_ns[op].fetch_add(t - t0, std::memory_order_relaxed);
    c.plan_ns[op].fetch_add(t1 - t0, std::memory_order_relaxed);
    c.alloc_ns[op].fetch_add(t2 - t1, std::memory_order_relaxed);
    c.launch_ns[op].fetch_add(launch, std::memory_order_relaxed);
  }
};

// [calls, total ns, plan ns, alloc ns, launch ns] of qkv_front, then of attn2
std::vector<int64_t> clock_stats() {
  Clocked& c = clocked();
  std::vector<int64_t> out;
  for (int op = 0; op < 2; ++op)
    for (auto* v : {&c.calls[op], &c.total_ns[op], &c.plan_ns[op], &c.alloc_ns[op], &c.launch_ns[op]})
      out.push_back(v->load());
  return out;
}

void clock_reset() {
  Clocked& c = clocked();
  for (int op = 0; op < 2; ++op)
    for (auto* v : {&c.calls[op], &c.total_ns[op], &c.plan_ns[op], &c.alloc_ns[op], &c.launch_ns[op]}) v->store(0);
}

// ------------------------------------------------------------------------- lookups and checks (tests)
// The fast path's lookups on the package library's tables; -1 where they cover nothing.
int64_t lookup(std::string what, std::vector<int64_t> a) {
  State& s = state();
  std::shared_lock lock(s.mutex);
  auto arity = [&](size_t n) { TORCH_CHECK_VALUE(a.size() == n, "muse shims dev: ", what, " takes ", n, " integers"); };
  if (what == "k_split" || what == "proj_cols" || what == "out_cols") {
    arity(1);
    const KvHeadsTable* t = kv_heads_table(s, a[0]);
    if (!t) return -1;
    return what == "k_split" ? t->k_split : what == "proj_cols" ? t->proj_cols : t->out_cols;
  }
  if (what == "qkv_front_tile") {   // M, Hkv
    arity(2);
    const KvHeadsTable* t = kv_heads_table(s, a[1]);
    return t ? t->tiles.at(a[0]) : -1;
  }
  if (what == "attn2_variant" || what == "attn2_workspace" || what == "attn2_wave") {
    // q_len, window, max_seq_len, cache, SM count[, R, Hkv]
    arity(what == "attn2_wave" ? 5 : 7);
    const Attn2Deployment* d = find_deployment(s, a[0], a[1], a[2], a[3]);
    const Attn2Plan* p = d ? find_plan(*d, a[4]) : nullptr;
    if (!p) return -1;
    if (what == "attn2_wave") return p->wave;
    const int v = variant_of(*d, *p, a[5], a[6]);
    if (v < 0) return -1;
    return what == "attn2_variant" ? v : workspace_need(*d, v, a[5], a[6]);
  }
  TORCH_CHECK_VALUE(false, "muse shims dev: no lookup ", what);
}

// The fast path's metadata checks on any device: "" where they pass, else what fails.
std::string check_qkv_front(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& positions,
                            const at::Tensor& slots, const std::optional<at::Tensor>& cos_sin,
                            const at::Tensor& kv_cache) {
  State& s = state();
  std::shared_lock lock(s.mutex);
  CallShape c;
  const char* why = qkv_front_metadata(s, x, weight, positions, slots, cos_sin, kv_cache, c);
  return why ? why : "";
}

std::string check_attn2(const std::optional<at::Tensor>& y, const at::Tensor& kv_cache, const at::Tensor& page_table,
                        const at::Tensor& seq_lens, const std::optional<at::Tensor>& workspace, int64_t q_len,
                        double scale) {
  State& s = state();
  std::shared_lock lock(s.mutex);
  CallShape c;
  const char* why = attn2_metadata(s, y.has_value() ? &*y : nullptr, kv_cache, page_table, seq_lens, workspace, q_len,
                                   scale, c);
  return why ? why : "";
}

}  // namespace
}  // namespace muse_shims

// The schemas of the null and clocked ops are the public ones' under other names (tests/test_shims.py).
TORCH_LIBRARY_FRAGMENT(muse, m) {
  using namespace muse_shims;
  m.def("_shims_dev_attach(str library) -> str", &attach);
  m.def("_shims_null(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, Tensor(a!) kv_cache, "
        "*, Tensor? k_scale=None, Tensor? v_scale=None, str? backend=None) -> Tensor");
  m.def("_shims_null_attn2(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, Tensor(a!)? workspace=None, "
        "*, int q_len, int window, float scale, int max_seq_len, Tensor? k_scale=None, Tensor? v_scale=None, "
        "str? backend=None) -> Tensor");
  m.def("_shims_null_attn2_const(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, "
        "Tensor? workspace=None, *, int q_len, int window, float scale, int max_seq_len, Tensor? k_scale=None, Tensor? v_scale=None, "
        "str? backend=None) -> Tensor");
  m.def("_shims_qkv_front_clocked(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, "
        "Tensor(a!) kv_cache, *, Tensor? k_scale=None, Tensor? v_scale=None, str? backend=None) -> Tensor");
  m.def("_shims_attn2_clocked(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, "
        "Tensor(a!)? workspace=None, *, int q_len, int window, float scale, int max_seq_len, Tensor? k_scale=None, "
        "Tensor? v_scale=None, str? backend=None) -> Tensor");
  m.def("_shims_clock_stats() -> int[]", &clock_stats);
  m.def("_shims_clock_reset() -> ()", &clock_reset);
  m.def("_shims_lookup(str what, int[] args) -> int", &lookup);
  m.def("_shims_check_qkv_front(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, "
        "Tensor kv_cache) -> str",
        &check_qkv_front);
  m.def("_shims_check_attn2(Tensor? y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, Tensor? workspace, "
        "int q_len, float scale) -> str",
        &check_attn2);
}

TORCH_LIBRARY_IMPL(muse, CUDA, m) {
  using namespace muse_shims;
  m.impl("_shims_null", [](const at::Tensor& x, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, at::Tensor&, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, std::optional<c10::string_view>) { return x; });
  const auto null_attn2 = [](const at::Tensor& y, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const std::optional<at::Tensor>&, int64_t, int64_t, double, int64_t,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                             std::optional<c10::string_view>) { return y; };
  m.impl("_shims_null_attn2", null_attn2);
  m.impl("_shims_null_attn2_const", null_attn2);
  m.impl("_shims_qkv_front_clocked", &qkv_front_op<HostClock>);
  m.impl("_shims_attn2_clocked", &attn2_op<HostClock>);
}
