// The package library's registrations, and nothing else: the public schemas of muse::qkv_front and
// muse::attn2 (character for character muse_ops.ops.SCHEMAS: tests/test_shims.py), their CUDA
// kernels (muse_shims.h, instantiated in muse_shims.cpp), the layer step in one call, and the ops
// through which Python hands over the plan's tables and kernels. Python registers the CPU and Meta
// implementations (the reference and the fakes) on the same public ops. The development ops are
// muse_shims_dev.cpp's, in a library of their own.
#include "muse_shims.h"

TORCH_LIBRARY(muse, m) {
  using namespace muse_shims;
  m.def("qkv_front(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, Tensor(a!) kv_cache, "
        "*, Tensor? k_scale=None, Tensor? v_scale=None, str? backend=None) -> Tensor");
  m.def("attn2(Tensor y, Tensor kv_cache, Tensor page_table, Tensor seq_lens, Tensor(a!)? workspace=None, *, "
        "int q_len, int window, float scale, int max_seq_len, Tensor? k_scale=None, Tensor? v_scale=None, "
        "str? backend=None) -> Tensor");
  // MuseAttentionDecode's eager step (ops.run_step). Positional scalars: each keyword costs the
  // Python argument parser ~0.5 us.
  m.def("_shims_layer_step(Tensor x, Tensor weight, Tensor positions, Tensor slots, Tensor? cos_sin, "
        "Tensor(a!) kv_cache, Tensor page_table, Tensor seq_lens, Tensor(b!)? workspace, int q_len, int window, "
        "float scale, int max_seq_len, Tensor? k_scale, Tensor? v_scale, str? backend) -> Tensor?");
  // what Python hands over (muse_ops/cutedsl/shims.py): a row of the plan's tables, TVM-FFI's C
  // API, a kernel by its key; or an ahead-of-time library and its table
  m.def("_shims_table(str row) -> ()", &set_table);
  m.def("_shims_set_ffi(str libtvm_ffi) -> ()", &set_ffi);
  m.def("_shims_add_kernel(str key, int function) -> ()", &add_kernel);
  m.def("_shims_load_library(str library) -> str", &load_library);
  m.def("_shims_set_backend(str? name) -> ()", &set_backend);
  m.def("_shims_note_python(int op) -> ()", &note_python);
  m.def("_shims_stats() -> int[]", &stats);
  m.def("_shims_clear() -> ()", &clear);
  m.def("_shims_error_flag(int device) -> Tensor", &error_flag);
}

TORCH_LIBRARY_IMPL(muse, CUDA, m) {
  m.impl("qkv_front", &muse_shims::qkv_front_cuda);
  m.impl("attn2", &muse_shims::attn2_cuda);
  m.impl("_shims_layer_step", &muse_shims::layer_step);
}
