#include "report/measure.h"

#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "codegen/feature_params.h"
#include "codegen/generator.h"
#include "common/numeric.h"
#include "lunajit/kernel_args.cuh"
#include "runtime/cuda/cuda_backend.h"

namespace lunajit::report {
namespace {

// Seeded N(0, 1) values in `dtype`'s bytes.
std::vector<uint8_t> random_tensor(int64_t elements, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> out(static_cast<size_t>(elements) * dtype_bytes(dtype));
  for (int64_t i = 0; i < elements; ++i) {
    const float f = normal(rng);
    switch (dtype) {
      case DType::fp32: std::memcpy(&out[i * 4], &f, 4); break;
      case DType::fp16: {
        const uint16_t b = float_to_fp16_bits(f);
        std::memcpy(&out[i * 2], &b, 2);
        break;
      }
      case DType::bf16: {
        const uint16_t b = float_to_bf16_bits(f);
        std::memcpy(&out[i * 2], &b, 2);
        break;
      }
    }
  }
  return out;
}

Result<Buffer> upload(Backend& b, const void* data, size_t bytes) {
  auto buf = b.allocate(std::max<size_t>(bytes, 4));
  if (!buf) return buf.error();
  if (bytes > 0)
    if (auto st = b.copy_to_device(*buf, data, bytes); !st) return st.error();
  return buf;
}

Result<Buffer> zeros(Backend& b, size_t bytes) {
  auto buf = b.allocate(std::max<size_t>(bytes, 4));
  if (!buf) return buf.error();
  if (auto st = b.fill_zero(*buf); !st) return st.error();
  return buf;
}

// [batch, seq, heads, dim] contiguous strides.
TensorRef tensor_ref(const Buffer& buf, const ProblemShape& s, int dim) {
  return TensorRef{buf.as_pointer(), int64_t(s.seq) * s.heads * dim, int64_t(s.heads) * dim, dim};
}

}  // namespace

Result<std::map<std::string, KernelTiming>> measure_pass(CudaBackend& gpu, const AttentionSpec& spec,
                                                         const TileConfig& config, Pass pass,
                                                         const ProblemShape& shape, int repeats) {
  auto src = generate(spec, config, pass);
  if (!src) return src.error();
  auto module = gpu.load(*src);
  if (!module) return module.error();
  auto plan = plan_launches(spec, config, pass, shape, gpu.plan_splits(**module, shape));
  if (!plan) return plan.error();

  const int64_t tokens = int64_t(shape.batch) * shape.seq * shape.heads;
  std::vector<float> params = init_params(spec, shape.heads);
  auto q = upload(gpu, random_tensor(tokens * spec.head_dim, spec.dtype, 1).data(),
                  tokens * spec.head_dim * dtype_bytes(spec.dtype));
  auto k = upload(gpu, random_tensor(tokens * spec.head_dim, spec.dtype, 2).data(),
                  tokens * spec.head_dim * dtype_bytes(spec.dtype));
  auto v = upload(gpu, random_tensor(tokens * spec.value_dim, spec.dtype, 3).data(),
                  tokens * spec.value_dim * dtype_bytes(spec.dtype));
  auto p = upload(gpu, params.data(), params.size() * sizeof(float));
  const size_t out_bytes = pass == Pass::feature_map ? size_t(tokens) * spec.feature_dim() * 4
                                                     : size_t(tokens) * spec.value_dim * dtype_bytes(spec.dtype);
  auto o = zeros(gpu, out_bytes);
  auto ws = zeros(gpu, size_t(plan->workspace_floats) * 4);
  for (auto* r : {&q, &k, &v, &p, &o, &ws})
    if (!*r) return r->error();
  // The backward's own tensors: the upstream gradient (random; o stays zero:
  // only the causal performer reads it), dq, dk, dv and the fp32 parameter
  // gradient. Each kernel is timed alone, repeated: the in-place scans then
  // scan their own output again, which changes values, not the work.
  const bool backward = pass == Pass::backward;
  const size_t qk_bytes = size_t(tokens) * spec.head_dim * dtype_bytes(spec.dtype);
  const size_t v_bytes = size_t(tokens) * spec.value_dim * dtype_bytes(spec.dtype);
  auto dout = backward ? upload(gpu, random_tensor(tokens * spec.value_dim, spec.dtype, 4).data(), v_bytes)
                       : zeros(gpu, 4);
  auto dq = zeros(gpu, backward ? qk_bytes : 4);
  auto dk = zeros(gpu, backward ? qk_bytes : 4);
  auto dv = zeros(gpu, backward ? v_bytes : 4);
  auto dp = zeros(gpu, backward ? params.size() * sizeof(float) : 4);
  for (auto* r : {&dout, &dq, &dk, &dv, &dp})
    if (!*r) return r->error();
  auto mutable_ref = [](const Buffer& buf, const ProblemShape& s, int dim) {
    const TensorRef t = tensor_ref(buf, s, dim);
    return MutableTensorRef{buf.as_pointer(), t.stride_batch, t.stride_seq, t.stride_head};
  };

  ForwardArgs fa{};
  FeatureMapArgs ma{};
  BackwardArgs ba{};
  void* args[1];
  if (backward) {
    ba.problem = {shape.batch, shape.heads, shape.seq};
    ba.q = tensor_ref(*q, shape, spec.head_dim);
    ba.k = tensor_ref(*k, shape, spec.head_dim);
    ba.v = tensor_ref(*v, shape, spec.value_dim);
    ba.o = tensor_ref(*o, shape, spec.value_dim);
    ba.dout = tensor_ref(*dout, shape, spec.value_dim);
    ba.dq = mutable_ref(*dq, shape, spec.head_dim);
    ba.dk = mutable_ref(*dk, shape, spec.head_dim);
    ba.dv = mutable_ref(*dv, shape, spec.value_dim);
    ba.params = static_cast<const float*>(p->as_pointer());
    ba.dparams = static_cast<float*>(dp->as_pointer());
    ba.workspace = static_cast<float*>(ws->as_pointer());
    ba.splits = plan->splits;
    args[0] = &ba;
  } else if (pass == Pass::feature_map) {
    ma.problem = {shape.batch, shape.heads, shape.seq};
    ma.x = tensor_ref(*k, shape, spec.head_dim);
    ma.phi = static_cast<float*>(o->as_pointer());
    ma.params = static_cast<const float*>(p->as_pointer());
    ma.key_stab = static_cast<float*>(ws->as_pointer());
    ma.is_query = 0;
    args[0] = &ma;
  } else {
    fa.problem = {shape.batch, shape.heads, shape.seq};
    fa.q = tensor_ref(*q, shape, spec.head_dim);
    fa.k = tensor_ref(*k, shape, spec.head_dim);
    fa.v = tensor_ref(*v, shape, spec.value_dim);
    const TensorRef out = tensor_ref(*o, shape, spec.value_dim);
    fa.o = MutableTensorRef{o->as_pointer(), out.stride_batch, out.stride_seq, out.stride_head};
    fa.params = static_cast<const float*>(p->as_pointer());
    fa.workspace = static_cast<float*>(ws->as_pointer());
    fa.splits = plan->splits;
    args[0] = &fa;
  }

  auto launch = [&](const KernelLaunch& l) -> Status {
    const KernelEntry* entry = src->entry(l.role);
    if (!entry) return Error::failure(fmt::format("{}: no kernel for role '{}'", src->name, l.role));
    LaunchConfig cfg;
    cfg.grid = {l.grid[0], l.grid[1], l.grid[2]};
    cfg.block = {l.threads, 1, 1};
    cfg.dynamic_smem = static_cast<unsigned>(l.smem_bytes);
    return gpu.launch(**module, entry->name_expression, cfg, args);
  };
  for (const auto& l : plan->launches)  // warm-up: fills the workspace, loads caches
    if (auto st = launch(l); !st) return st.error();
  if (auto st = gpu.synchronize(); !st) return st.error();

  std::map<std::string, KernelTiming> out;
  for (const auto& l : plan->launches) {
    auto ms = gpu.time_ms([&]() -> Status {
      for (int r = 0; r < repeats; ++r)
        if (auto st = launch(l); !st) return st;
      return ok_status();
    });
    if (!ms) return ms.error();
    out[l.role] = KernelTiming{*ms / repeats, repeats};
  }
  return out;
}

}  // namespace lunajit::report
