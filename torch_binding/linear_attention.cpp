// The op's dispatch, its input checks, and the kernel paths: an autograd
// Function whose forward runs the generated kernels through AttentionRunner
// (host emulation for CPU tensors, NVRTC/CUDA for CUDA tensors) and whose
// backward is the seam the backward kernels plug into.
//
// Runners are cached per (device, spec, tile config): creating one generates and
// loads (JIT-compiles, through the binary cache) the kernels, seconds on the host.
// A runner owns a workspace, so each is used under its own mutex.
//
// Tuning: the CUDA path takes options.config, else default_config(spec, arch).
// TODO(tuning DB): look the config up in cache/tuning_db.h by (spec hash, pass,
// shape bucket) once that lookup lands, falling back to default_config.
#include "torch_binding/linear_attention.h"

#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "codegen/feature_params.h"
#include "runtime/attention_runner.h"
#include "runtime/host/host_backend.h"

#if LUNAJIT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "runtime/cuda/cuda_backend.h"
#endif

namespace lunajit {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string shape_string(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

torch::ScalarType torch_dtype(DType t) {
  switch (t) {
    case DType::fp32: return torch::kFloat;
    case DType::fp16: return torch::kHalf;
    case DType::bf16: return torch::kBFloat16;
  }
  return torch::kFloat;
}

// ---- runners ---------------------------------------------------------------

struct RunnerSlot {
  std::mutex mutex;
  std::unique_ptr<AttentionRunner> runner;
};

// The runner of (backend, spec, config), created on first use.
RunnerSlot& runner_slot(Backend& backend, const std::string& device_key, const AttentionSpec& spec,
                        const TileConfig& config) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<RunnerSlot>> slots;
  const std::string key = device_key + "|" + canonical_json(spec) + "|" + config.to_string();
  std::lock_guard lock(mutex);
  auto& slot = slots[key];
  if (!slot) {
    auto runner = AttentionRunner::create(backend, spec, config, Pass::forward);
    TORCH_CHECK(runner.ok(), "linear_attention: could not build the ", std::string(to_string(spec.family)),
                " kernels for ", device_key, " (config ", config.to_string(), "): ", runner.error().message);
    auto s = std::make_unique<RunnerSlot>();
    s->runner = std::make_unique<AttentionRunner>(std::move(runner).value());
    slot = std::move(s);
  }
  return *slot;
}

Backend& host_backend() {
  static std::unique_ptr<Backend> backend = make_host_backend();
  return *backend;
}

TileConfig host_config(const AttentionSpec& spec, const LinearAttentionOptions& opts) {
  if (opts.config) return *opts.config;
  // The host emulator has no arch of its own; sm_90's limits are the ones the
  // host tests run the kernels under.
  static const Arch sm90 = arch_from_sm(90).value_or_throw();
  return default_config(spec, sm90);
}

TensorRef tensor_ref(const Tensor& t) { return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)}; }

// o = the forward kernels of `slot` on q, k, v (already checked: spec dtype, unit
// stride in dim, same device as the backend's memory).
Tensor run_forward_kernels(RunnerSlot& slot, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                           const AttentionSpec& spec, AttentionPath path) {
  const ProblemShape shape{static_cast<int>(q.size(0)), static_cast<int>(q.size(2)), static_cast<int>(q.size(1))};
  Tensor o = torch::empty({q.size(0), q.size(1), q.size(2), spec.value_dim}, q.options());
  const MutableTensorRef oref{o.data_ptr(), o.stride(0), o.stride(1), o.stride(2)};
  const DevicePtr p = params.numel() ? reinterpret_cast<DevicePtr>(params.data_ptr()) : DevicePtr(0);
  std::lock_guard lock(slot.mutex);
  const Status st = slot.runner->forward(shape, tensor_ref(q), tensor_ref(k), tensor_ref(v), oref, p);
  TORCH_CHECK(st.ok(), "linear_attention (", std::string(to_string(path)), "): ", st.error().message);
  return o;
}

#if LUNAJIT_TORCH_CUDA
CudaBackend& cuda_backend(int device_index) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<CudaBackend>> backends;
  std::lock_guard lock(mutex);
  auto& b = backends[device_index];
  if (!b) {
    auto created = CudaBackend::create(device_index);
    TORCH_CHECK(created.ok(), "linear_attention (cuda_kernels): ", created.error().message);
    b = std::move(created).value();
  }
  return *b;
}

// CudaBackend launches on the legacy default stream (runtime/cuda/cuda_backend.h),
// which orders with LibTorch's default stream but not with its pool streams
// (created non-blocking). On another current stream we wait for it before the
// launches and for the kernels after them.
// TODO(runtime): a stream argument on Backend::launch, to launch on the current
// stream directly without the two synchronizations.
Tensor cuda_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params, const AttentionSpec& spec,
                    const LinearAttentionOptions& opts) {
  const c10::cuda::CUDAGuard guard(q.device());
  CudaBackend& backend = cuda_backend(q.device().index());
  const TileConfig config = opts.config ? *opts.config : default_config(spec, backend.arch());
  RunnerSlot& slot = runner_slot(backend, q.device().str(), spec, config);
  const auto stream = at::cuda::getCurrentCUDAStream(q.device().index());
  const bool default_stream = stream == at::cuda::getDefaultCUDAStream(q.device().index());
  if (!default_stream) stream.synchronize();
  Tensor o = run_forward_kernels(slot, q, k, v, params, spec, AttentionPath::cuda_kernels);
  if (!default_stream) {
    const Status st = backend.synchronize();
    TORCH_CHECK(st.ok(), "linear_attention (cuda_kernels): ", st.error().message);
  }
  return o;
}
#endif

// ---- gradients -------------------------------------------------------------

// The seam for the backward kernels: returns {dq, dk, dv, dparams} from the
// generated Pass::backward kernels once AttentionRunner::backward exists, and
// nullopt until then (the caller falls back to the ATen recomputation).
// TODO(backward kernels): create a Pass::backward runner for (spec, config) next
// to the forward one and call it here; saved forward state (performer key stab)
// goes through ctx->saved_data.
std::optional<variable_list> kernel_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                                             const AttentionSpec& spec, const Tensor& grad_out, AttentionPath path) {
  return std::nullopt;
}

// Gradients by recomputing the forward with the ATen path (any device) and
// differentiating it: exact for the function the kernels compute, up to fp32
// rounding order.
variable_list aten_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                            const AttentionSpec& spec, const Tensor& grad_out, int64_t chunk,
                            const std::array<bool, 4>& needs) {
  torch::AutoGradMode enable(true);
  const Tensor in[4] = {q, k, v, params};
  Tensor leaf[4];
  std::vector<Tensor> wrt;
  for (int i = 0; i < 4; ++i) {
    leaf[i] = in[i].detach().requires_grad_(needs[i] && in[i].numel() > 0);
    if (leaf[i].requires_grad()) wrt.push_back(leaf[i]);
  }
  variable_list out(4);
  if (wrt.empty()) return out;
  const Tensor o = aten::linear_attention(leaf[0], leaf[1], leaf[2], leaf[3], spec, chunk).to(q.scalar_type());
  const variable_list g = torch::autograd::grad({o}, wrt, {grad_out}, /*retain_graph=*/false, /*create_graph=*/false,
                                                /*allow_unused=*/true);
  size_t j = 0;
  for (int i = 0; i < 4; ++i)
    if (leaf[i].requires_grad()) {
      out[i] = g[j++];
      if (!out[i].defined()) out[i] = torch::zeros_like(in[i]);
    }
  return out;
}

class KernelLinearAttention : public torch::autograd::Function<KernelLinearAttention> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                        const AttentionSpec& spec, const LinearAttentionOptions& opts, AttentionPath path) {
    ctx->save_for_backward({q, k, v, params});
    ctx->saved_data["spec"] = canonical_json(spec);
    ctx->saved_data["chunk"] = opts.chunk;
    ctx->saved_data["path"] = static_cast<int64_t>(path);
    if (path == AttentionPath::host_kernels) {
      RunnerSlot& slot = runner_slot(host_backend(), "host", spec, host_config(spec, opts));
      return run_forward_kernels(slot, q, k, v, params, spec, path);
    }
#if LUNAJIT_TORCH_CUDA
    return cuda_forward(q, k, v, params, spec, opts);
#else
    TORCH_CHECK(false, "linear_attention: the cuda_kernels path is not compiled in (LibTorch without CUDA)");
#endif
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const AttentionSpec spec = spec_from_string(ctx->saved_data["spec"].toStringRef()).value_or_throw();
    const auto path = static_cast<AttentionPath>(ctx->saved_data["path"].toInt());
    const Tensor grad = grad_outputs[0].contiguous();
    variable_list grads;
    if (auto g = kernel_backward(saved[0], saved[1], saved[2], saved[3], spec, grad, path)) {
      grads = std::move(*g);
    } else {
      const std::array<bool, 4> needs{ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2),
                                      ctx->needs_input_grad(3)};
      grads = aten_backward(saved[0], saved[1], saved[2], saved[3], spec, grad, ctx->saved_data["chunk"].toInt(),
                            needs);
    }
    grads.resize(7);  // spec, options and path get no gradient
    return grads;
  }
};

}  // namespace

std::string_view to_string(AttentionPath p) {
  switch (p) {
    case AttentionPath::automatic: return "automatic";
    case AttentionPath::aten: return "aten";
    case AttentionPath::host_kernels: return "host_kernels";
    case AttentionPath::cuda_kernels: return "cuda_kernels";
  }
  return "?";
}

bool cuda_kernels_available() {
#if LUNAJIT_TORCH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

AttentionPath resolve_path(AttentionPath requested, const torch::Device& device) {
  if (requested != AttentionPath::automatic) return requested;
  return device.is_cuda() && LUNAJIT_TORCH_CUDA ? AttentionPath::cuda_kernels : AttentionPath::aten;
}

void check_linear_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                                   const AttentionSpec& spec, AttentionPath path, bool check_finite) {
  const Status valid = validate(spec);
  TORCH_CHECK(valid.ok(), "linear_attention: spec: ", valid.ok() ? "" : valid.error().message);
  const bool kernels = path == AttentionPath::host_kernels || path == AttentionPath::cuda_kernels;
  struct Arg {
    const char* name;
    const Tensor& t;
    int64_t dim;
    const char* dim_name;
  };
  const Arg args[] = {{"q", q, spec.head_dim, "head_dim"}, {"k", k, spec.head_dim, "head_dim"},
                      {"v", v, spec.value_dim, "value_dim"}};
  for (const Arg& a : args) {
    TORCH_CHECK(a.t.defined(), "linear_attention: ", a.name, " is an undefined tensor");
    TORCH_CHECK(a.t.dim() == 4, "linear_attention: ", a.name, " must be 4-D [batch, seq, heads, ", a.dim_name,
                "], got shape ", shape_string(a.t));
    TORCH_CHECK(a.t.size(3) == a.dim, "linear_attention: ", a.name, ".size(3) = ", a.t.size(3), " but the spec's ",
                a.dim_name, " is ", a.dim, " (shape ", shape_string(a.t), ")");
    TORCH_CHECK(a.t.size(0) == q.size(0) && a.t.size(1) == q.size(1) && a.t.size(2) == q.size(2),
                "linear_attention: ", a.name, " has [batch, seq, heads] = ", shape_string(a.t.narrow(3, 0, 0)),
                " but q has ", shape_string(q.narrow(3, 0, 0)));
    TORCH_CHECK(a.t.size(1) >= 1 && a.t.size(0) >= 1 && a.t.size(2) >= 1, "linear_attention: ", a.name,
                " has an empty batch, seq or heads dim: ", shape_string(a.t));
    TORCH_CHECK(a.t.is_floating_point(), "linear_attention: ", a.name, " must be a floating-point tensor, got ",
                a.t.scalar_type());
    TORCH_CHECK(a.t.scalar_type() == q.scalar_type(), "linear_attention: ", a.name, " has dtype ", a.t.scalar_type(),
                " but q has ", q.scalar_type());
    TORCH_CHECK(a.t.device() == q.device(), "linear_attention: ", a.name, " is on ", a.t.device(), " but q is on ",
                q.device());
    TORCH_CHECK(a.t.layout() == torch::kStrided, "linear_attention: ", a.name, " must be a strided (dense) tensor");
    TORCH_CHECK(a.t.stride(3) == 1, "linear_attention: ", a.name,
                " must have unit stride in its last (feature) dim, got stride ", a.t.stride(3),
                " (call .contiguous(), or slice a fused projection along dim 3)");
    if (kernels) {
      TORCH_CHECK(a.t.scalar_type() == torch_dtype(spec.dtype), "linear_attention: ", a.name, " has dtype ",
                  a.t.scalar_type(), " but the spec's dtype is ", std::string(to_string(spec.dtype)), " (path ",
                  std::string(to_string(path)), " runs the kernels generated for spec.dtype)");
    }
  }
  if (path == AttentionPath::host_kernels)
    TORCH_CHECK(q.device().is_cpu(), "linear_attention: path host_kernels needs CPU tensors, q is on ", q.device());
  if (path == AttentionPath::cuda_kernels) {
    TORCH_CHECK(q.device().is_cuda(), "linear_attention: path cuda_kernels needs CUDA tensors, q is on ", q.device());
    TORCH_CHECK(LUNAJIT_TORCH_CUDA, "linear_attention: path cuda_kernels is not compiled in (LibTorch without CUDA)");
  }

  const ParamLayout layout = param_layout(spec);
  const int64_t heads = q.size(2);
  const int64_t expected = layout.total_floats(spec, static_cast<int>(heads));
  if (expected == 0) {
    TORCH_CHECK(!params.defined() || params.numel() == 0, "linear_attention: feature_params: family ",
                std::string(to_string(spec.family)), " has no parameters, got ", params.numel(), " values");
  } else {
    TORCH_CHECK(params.defined(), "linear_attention: feature_params is undefined; family ",
                std::string(to_string(spec.family)), " needs ", expected, " floats (init_feature_params)");
    TORCH_CHECK(params.dim() == 1, "linear_attention: feature_params must be 1-D (the flat layout of "
                "codegen/feature_params.h), got shape ", shape_string(params));
    TORCH_CHECK(params.numel() == expected, "linear_attention: feature_params has ", params.numel(),
                " floats but the spec needs ", expected, " (", layout.per_head_floats, " per block x ",
                spec.params_per_head ? heads : 1, spec.params_per_head ? " heads" : " shared block",
                "); was it made for another spec or head count?");
    TORCH_CHECK(params.is_contiguous(), "linear_attention: feature_params must be contiguous");
    TORCH_CHECK(params.device() == q.device(), "linear_attention: feature_params is on ", params.device(),
                " but q is on ", q.device());
    if (kernels) {
      TORCH_CHECK(params.scalar_type() == torch::kFloat, "linear_attention: feature_params must be float32 on path ",
                  std::string(to_string(path)), ", got ", params.scalar_type());
    } else {
      TORCH_CHECK(params.scalar_type() == torch::kFloat || params.scalar_type() == torch::kDouble,
                  "linear_attention: feature_params must be float32 or float64, got ", params.scalar_type());
    }
  }
  if (check_finite) {
    for (const Arg& a : args)
      TORCH_CHECK(torch::isfinite(a.t).all().item<bool>(), "linear_attention: ", a.name, " contains NaN or Inf");
  }
}

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& feature_params,
                        const AttentionSpec& spec, const LinearAttentionOptions& options) {
  const AttentionPath path = resolve_path(options.path, q.defined() ? q.device() : torch::Device(torch::kCPU));
  check_linear_attention_inputs(q, k, v, feature_params, spec, path, options.check_finite);
  TORCH_CHECK(options.chunk >= 1, "linear_attention: options.chunk must be >= 1, got ", options.chunk);
  if (path == AttentionPath::aten) {
    const Tensor params = feature_params.defined() ? feature_params : torch::empty({0}, q.options());
    return aten::linear_attention(q, k, v, params, spec, options.chunk).to(q.scalar_type());
  }
  const Tensor params = feature_params.defined() ? feature_params : torch::empty({0}, q.options().dtype(torch::kFloat));
  return KernelLinearAttention::apply(q, k, v, params, spec, options, path);
}

Tensor feature_map(const Tensor& x, const Tensor& feature_params, const AttentionSpec& spec, aten::FeatureRole role) {
  TORCH_CHECK(x.defined() && x.dim() == 4, "feature_map: x must be 4-D [batch, seq, heads, head_dim]");
  // A stand-in v of the right shape (stride 0 but in dim 3), so one set of checks serves both.
  const Tensor v_like = x.new_empty({1, 1, 1, spec.value_dim}).expand({x.size(0), x.size(1), x.size(2), spec.value_dim});
  check_linear_attention_inputs(x, x, v_like, feature_params, spec, AttentionPath::aten, false);
  const Tensor params = feature_params.defined() ? feature_params : torch::empty({0}, x.options());
  return aten::feature_map(x, params, spec, role);
}

Tensor init_feature_params(const AttentionSpec& spec, int64_t heads, uint64_t seed) {
  std::vector<float> p = init_params(spec, static_cast<int>(heads), seed);
  return torch::from_blob(p.data(), {static_cast<int64_t>(p.size())}, torch::kFloat).clone();
}

}  // namespace lunajit
