// A verify step of one full-attention Muse Spark layer (TP8: two KV heads) from a C++ program
// with no Python: load the C++ ops and an ahead-of-time kernel library, build a paged batch of
// three requests, run muse::qkv_front then muse::attn2 through the dispatcher, and save inputs and
// outputs (torch::pickle_save, which torch.load reads) for tests/test_gpu_shims.py to check
// against float64.
//
//   verify_step LIBMUSE_SHIMS.so LIBMUSE_KERNELS.so OUT.pt
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kHidden = 8192, kKvHeads = 2, kQLen = 8, kPages = 512, kPageSize = 16;
constexpr int64_t kMaxSeqLen = 8192;
constexpr double kScale = 5.473 / 8.0;

c10::OperatorHandle op(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LIBMUSE_SHIMS.so LIBMUSE_KERNELS.so OUT.pt\n", argv[0]);
    return 2;
  }
  // Loading the shims registers torch.ops.muse.* (their static TORCH_LIBRARY initialisers).
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  std::string loaded = op("muse::_shims_load_library").typed<std::string(std::string)>().call(argv[2]);
  std::printf("kernels: %s\n", loaded.c_str());

  c10::InferenceMode inference;
  at::manual_seed(0);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  // Three requests; each step appends q_len = 8 draft tokens to what the cache holds.
  const std::vector<int64_t> lengths = {100, 777, 3000};
  const int64_t requests = lengths.size(), tokens = requests * kQLen;
  const int64_t width = (kMaxSeqLen + kPageSize - 1) / kPageSize;
  at::Tensor order = at::randperm(kPages, at::kInt);   // scattered pages
  at::Tensor page_table = at::zeros({requests, width}, at::kInt);
  at::Tensor positions = at::empty({tokens}, at::kLong), slots = at::empty({tokens}, at::kLong);
  int64_t next = 0;
  for (int64_t r = 0; r < requests; ++r) {
    const int64_t pages = (lengths[r] + kPageSize - 1) / kPageSize;
    for (int64_t p = 0; p < pages; ++p) page_table[r][p] = order[next++];
    for (int64_t t = 0; t < kQLen; ++t) {
      const int64_t pos = lengths[r] - kQLen + t;
      positions[r * kQLen + t] = pos;
      slots[r * kQLen + t] = page_table[r][pos / kPageSize].item<int64_t>() * kPageSize + pos % kPageSize;
    }
  }
  at::Tensor seq_lens = at::tensor(std::vector<int32_t>(lengths.begin(), lengths.end()), at::kInt);
  at::Tensor x = at::randn({tokens, kHidden}).to(at::kBFloat16);
  at::Tensor weight = (at::randn({1152 * kKvHeads, kHidden}) / std::sqrt(double(kHidden))).to(at::kBFloat16);
  at::Tensor cache = at::randn({kPages, kKvHeads, kPageSize, 128}).to(at::kBFloat16);

  at::Tensor x_d = x.to(cuda), weight_d = weight.to(cuda), positions_d = positions.to(cuda), slots_d = slots.to(cuda);
  at::Tensor cache_d = cache.to(cuda), page_table_d = page_table.to(cuda), seq_lens_d = seq_lens.to(cuda);
  // attn2's workspace: zeroed once, kept for every step (a deployment sizes it by its largest batch)
  at::Tensor workspace = at::zeros({64 << 20}, cuda.dtype(at::kByte));

  // (k_scale and v_scale: None for a bf16 cache)
  auto qkv_front = op("muse::qkv_front")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const std::optional<at::Tensor>&, at::Tensor&, const std::optional<at::Tensor>&,
                                         const std::optional<at::Tensor>&, std::optional<c10::string_view>)>();
  auto attn2 = op("muse::attn2")
                   .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const std::optional<at::Tensor>&, int64_t, int64_t, double, int64_t,
                                     const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                     std::optional<c10::string_view>)>();
  at::Tensor y = qkv_front.call(x_d, weight_d, positions_d, slots_d, std::nullopt, cache_d, std::nullopt, std::nullopt,
                                std::nullopt);
  at::Tensor out = attn2.call(y, cache_d, page_table_d, seq_lens_d, workspace, kQLen, 0, kScale, kMaxSeqLen,
                              std::nullopt, std::nullopt, std::nullopt);
  std::vector<int64_t> stats = op("muse::_shims_stats").typed<std::vector<int64_t>()>().call();
  at::Tensor flag = op("muse::_shims_error_flag").typed<at::Tensor(int64_t)>().call(0);
  std::printf("launched from C++: qkv_front %lld attn2 %lld; device error flag %d\n", (long long)stats[0],
              (long long)stats[2], flag.item<int>());

  c10::Dict<std::string, at::Tensor> step;
  step.insert("x", x);
  step.insert("weight", weight);
  step.insert("positions", positions);
  step.insert("slots", slots);
  step.insert("page_table", page_table);
  step.insert("seq_lens", seq_lens);
  step.insert("cache_before", cache);
  step.insert("cache_after", cache_d.cpu());
  step.insert("y", y.cpu());
  step.insert("out", out.cpu());
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(step));
  std::ofstream(argv[3], std::ios::binary).write(bytes.data(), bytes.size());
  return 0;
}
