// The op's dispatch, its input checks, and the kernel paths: an autograd
// Function whose forward and backward run the generated kernels through
// AttentionRunner (host emulation for CPU tensors, NVRTC/CUDA for CUDA tensors);
// with options.kernel_backward = false the backward recomputes the forward with
// the ATen path and differentiates it instead.
//
// Runners are cached per (device, spec, tile config, pass): creating one generates and
// loads (JIT-compiles, through the binary cache) the kernels, seconds on the host.
// A runner owns a workspace, so each is used under its own mutex.
//
// Tuning: the kernel paths take options.config, else the tuning database's
// choice for (spec, pass, shape bucket) (autotune/tuner.h choose_config: exact
// bucket, nearest, else default_config): the CUDA device's own database, or
// for the host emulator the model-ranked one of sm_90 (whose limits it runs
// under). Every config the tuner stores has passed the reference check.
#include "torch_binding/linear_attention.h"

#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune/timer.h"
#include "autotune/tuner.h"
#include "common/input_limits.h"
#include "cache/binary_cache.h"
#include "cache/tuning_db.h"
#include "codegen/feature_params.h"
#include "reference/recurrent_state.h"
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
                        const TileConfig& config, Pass pass) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<RunnerSlot>> slots;
  const std::string key =
      device_key + "|" + canonical_json(spec) + "|" + config.to_string() + "|" + std::string(to_string(pass));
  std::lock_guard lock(mutex);
  auto& slot = slots[key];
  if (!slot) {
    auto runner = AttentionRunner::create(backend, spec, config, pass);
    TORCH_CHECK(runner.ok(), "linear_attention: could not build the ", std::string(to_string(spec.family)), " ",
                std::string(to_string(pass)), " kernels for ", device_key, " (config ", config.to_string(), "): ", runner.error().message);
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

TensorRef tensor_ref(const Tensor& t) { return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)}; }
MutableTensorRef mutable_ref(const Tensor& t) { return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)}; }
DevicePtr device_ptr(const Tensor& t) { return t.numel() ? reinterpret_cast<DevicePtr>(t.data_ptr()) : DevicePtr(0); }
ProblemShape problem_shape(const Tensor& q) {
  return {static_cast<int>(q.size(0)), static_cast<int>(q.size(2)), static_cast<int>(q.size(1))};
}

// Where kernels of one call run: the backend, the runner-cache key of its
// device, and (CUDA) the stream handshake around the launches.
struct KernelTarget {
  Backend* backend = nullptr;
  std::string device_key;
  std::optional<Arch> arch;  // nullopt: the host emulator (sm_90 limits)
};

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
#endif

KernelTarget kernel_target(AttentionPath path, const Tensor& q) {
  if (path == AttentionPath::host_kernels) return {&host_backend(), "host", std::nullopt};
#if LUNAJIT_TORCH_CUDA
  CudaBackend& b = cuda_backend(q.device().index());
  return {&b, q.device().str(), b.arch()};
#else
  TORCH_CHECK(false, "linear_attention: the cuda_kernels path is not compiled in (LibTorch without CUDA)");
  return {};
#endif
}

// The arch a target's configs are chosen for: the GPU's, or sm_90's limits for the host emulator.
Arch target_arch(const KernelTarget& target) {
  static const Arch sm90 = arch_from_sm(90).value_or_throw();
  return target.arch ? *target.arch : sm90;
}

// One database per device, opened once per process (a lookup reads memory);
// tune_attention tunes into the same object, so what it stores is what the
// kernel paths then look up. Call with db_mutex() held.
std::mutex& db_mutex() {
  static std::mutex m;
  return m;
}
TuningDb& device_db(const KernelTarget& target) {
  static std::map<std::string, std::unique_ptr<TuningDb>> dbs;
  auto& db = dbs[target.device_key];
  if (!db) {
    DeviceFingerprint fp = model_fingerprint(target_arch(target));
#if LUNAJIT_TORCH_CUDA
    if (target.arch) fp = device_fingerprint(static_cast<CudaBackend*>(target.backend)->device());
#endif
    db = std::make_unique<TuningDb>(BinaryCache::default_dir(), fp);
  }
  return *db;
}

TileConfig kernel_config(const KernelTarget& target, const AttentionSpec& spec, const LinearAttentionOptions& opts,
                         Pass pass, const ProblemShape& shape) {
  if (opts.config) return *opts.config;
  std::lock_guard lock(db_mutex());
  return choose_config(device_db(target), spec, pass, shape, target_arch(target)).config;
}

// Runs `launch` on the target. On CUDA: under the tensor's device guard, and
// ordered with LibTorch's current stream. CudaBackend launches on the legacy
// default stream (runtime/cuda/cuda_backend.h), which orders with LibTorch's
// default stream but not with its pool streams (created non-blocking): on such a
// current stream we wait for it before the launches and for the kernels after.
// TODO(runtime): a stream argument on Backend::launch, to launch on the current
// stream directly without the two synchronizations.
template <class Launch>
void run_on(const KernelTarget& target, AttentionPath path, const Tensor& q, Launch&& launch) {
  auto check = [&](const Status& st) {
    TORCH_CHECK(st.ok(), "linear_attention (", std::string(to_string(path)), "): ", st.error().message);
  };
  if (path == AttentionPath::host_kernels) {
    check(launch());
    return;
  }
#if LUNAJIT_TORCH_CUDA
  const c10::cuda::CUDAGuard guard(q.device());
  const auto stream = at::cuda::getCurrentCUDAStream(q.device().index());
  const bool default_stream = stream == at::cuda::getDefaultCUDAStream(q.device().index());
  if (!default_stream) stream.synchronize();
  check(launch());
  if (!default_stream) check(target.backend->synchronize());
#endif
}

// A packed variable-length batch as the kernels see it (ForwardArgs::cu_seqlens):
// the offsets on the tensors' device, and the problem shape (sequences, heads,
// longest length). Undefined cu: the equal-length batch of q.
struct Varlen {
  Tensor cu;           // int32 [num_seqs + 1], contiguous, on q's device; undefined: none
  int64_t max_len = 0;
};

ProblemShape kernel_shape(const Tensor& q, const Varlen& vl) {
  if (!vl.cu.defined()) return problem_shape(q);
  return {static_cast<int>(vl.cu.numel() - 1), static_cast<int>(q.size(2)), static_cast<int>(vl.max_len)};
}

// o = the forward kernels on q, k, v (already checked: spec dtype, unit stride in
// dim, the target's device).
Tensor forward_kernels(AttentionPath path, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                       const AttentionSpec& spec, const LinearAttentionOptions& opts, const Varlen& vl = {}) {
  const KernelTarget target = kernel_target(path, q);
  const ProblemShape shape = kernel_shape(q, vl);
  RunnerSlot& slot = runner_slot(*target.backend, target.device_key, spec,
                                 kernel_config(target, spec, opts, Pass::forward, shape), Pass::forward);
  Tensor o = torch::empty({q.size(0), q.size(1), q.size(2), spec.value_dim}, q.options());
  run_on(target, path, q, [&] {
    std::lock_guard lock(slot.mutex);
    return slot.runner->forward(shape, tensor_ref(q), tensor_ref(k), tensor_ref(v), mutable_ref(o),
                                device_ptr(params), StateRefs{}, vl.cu.defined() ? device_ptr(vl.cu) : DevicePtr(0));
  });
  return o;
}

// {dq, dk, dv, dparams} from the backward kernels (Pass::backward). dparams is
// fp32 shaped like params; zero for fixed tensors and parameter-free families.
variable_list backward_kernels(AttentionPath path, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                               const Tensor& params, const Tensor& dout, const AttentionSpec& spec,
                               const LinearAttentionOptions& opts, const Varlen& vl = {}) {
  const KernelTarget target = kernel_target(path, q);
  const ProblemShape shape = kernel_shape(q, vl);
  RunnerSlot& slot = runner_slot(*target.backend, target.device_key, spec,
                                 kernel_config(target, spec, opts, Pass::backward, shape), Pass::backward);
  Tensor dq = torch::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options());
  Tensor dk = torch::empty({k.size(0), k.size(1), k.size(2), k.size(3)}, k.options());
  Tensor dv = torch::empty({v.size(0), v.size(1), v.size(2), v.size(3)}, v.options());
  Tensor dparams = torch::zeros_like(params, torch::MemoryFormat::Contiguous);
  run_on(target, path, q, [&] {
    std::lock_guard lock(slot.mutex);
    return slot.runner->backward(shape, tensor_ref(q), tensor_ref(k), tensor_ref(v), tensor_ref(o),
                                 tensor_ref(dout), mutable_ref(dq), mutable_ref(dk), mutable_ref(dv),
                                 device_ptr(params), device_ptr(dparams), StateGradRefs{},
                                 vl.cu.defined() ? device_ptr(vl.cu) : DevicePtr(0));
  });
  return {dq, dk, dv, dparams};
}

// The ATen path on a packed batch: each non-empty sequence alone, concatenated
// along the tokens (cu: the host offsets, validated).
Tensor aten_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params, const AttentionSpec& spec,
                   int64_t chunk, const std::vector<int64_t>& cu) {
  std::vector<Tensor> parts;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    if (len == 0) continue;
    parts.push_back(aten::linear_attention(q.narrow(1, cu[s], len), k.narrow(1, cu[s], len), v.narrow(1, cu[s], len),
                                           params, spec, chunk));
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts, 1);
}

std::vector<int64_t> host_offsets(const Tensor& cu) {
  const Tensor c = cu.to(torch::kCPU, torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// ---- gradients -------------------------------------------------------------

// Gradients by recomputing the forward with the ATen path (any device) and
// differentiating it: exact for the function the kernels compute, up to fp32
// rounding order. Used when options.kernel_backward is false.
variable_list aten_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                            const AttentionSpec& spec, const Tensor& grad_out, int64_t chunk,
                            const std::array<bool, 4>& needs, const Tensor& cu_seqlens = {}) {
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
  const Tensor o = (cu_seqlens.defined()
                        ? aten_varlen(leaf[0], leaf[1], leaf[2], leaf[3], spec, chunk, host_offsets(cu_seqlens))
                        : aten::linear_attention(leaf[0], leaf[1], leaf[2], leaf[3], spec, chunk))
                       .to(q.scalar_type());
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
                        const AttentionSpec& spec, const LinearAttentionOptions& opts, AttentionPath path,
                        int64_t max_len) {
    const Varlen vl{opts.cu_seqlens, max_len};
    Tensor o = forward_kernels(path, q, k, v, params, spec, opts, vl);
    ctx->saved_data["cu_seqlens"] = opts.cu_seqlens.defined() ? opts.cu_seqlens : Tensor();
    ctx->saved_data["max_len"] = max_len;
    ctx->save_for_backward({q, k, v, params, o});
    ctx->saved_data["spec"] = canonical_json(spec);
    ctx->saved_data["chunk"] = opts.chunk;
    ctx->saved_data["path"] = static_cast<int64_t>(path);
    ctx->saved_data["kernel_backward"] = opts.kernel_backward;
    ctx->saved_data["config"] = opts.config ? opts.config->to_json().dump() : std::string();
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const AttentionSpec spec = spec_from_string(ctx->saved_data["spec"].toStringRef()).value_or_throw();
    const auto path = static_cast<AttentionPath>(ctx->saved_data["path"].toInt());
    const Tensor grad = grad_outputs[0].contiguous();
    const std::array<bool, 4> needs{ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2),
                                    ctx->needs_input_grad(3)};
    const c10::IValue& cu_saved = ctx->saved_data["cu_seqlens"];
    const Tensor cu_seqlens = cu_saved.isTensor() ? cu_saved.toTensor() : Tensor();
    variable_list grads;
    if (ctx->saved_data["kernel_backward"].toBool()) {
      LinearAttentionOptions opts;
      if (const std::string& c = ctx->saved_data["config"].toStringRef(); !c.empty())
        opts.config = tile_config_from_string(c, TileConfig()).value_or_throw();
      const Varlen vl{cu_seqlens, ctx->saved_data["max_len"].toInt()};
      grads = backward_kernels(path, saved[0], saved[1], saved[2], saved[4], saved[3], grad, spec, opts, vl);
      for (int i = 0; i < 4; ++i)
        if (!needs[i]) grads[i] = Tensor();
      if (grads[3].defined()) grads[3] = grads[3].to(saved[3].scalar_type());
    } else {
      grads = aten_backward(saved[0], saved[1], saved[2], saved[3], spec, grad, ctx->saved_data["chunk"].toInt(),
                            needs, cu_seqlens);
    }
    grads.resize(8);  // spec, options, path and max_len get no gradient
    return grads;
  }
};

// ---- carried state and decoding (docs/MATH.md §1a, §3) ----------------------

DevicePtr ptr_or_null(const Tensor& t) { return t.defined() && t.numel() ? device_ptr(t) : DevicePtr(0); }

// Causal kernels with state: forward returns {o, S_T, z_T}; backward feeds the
// final state's gradient into the reverse scan and returns the initial state's.
// Absent initial state: empty tensors (numel 0), which the kernels read as zero.
class KernelStatefulAttention : public torch::autograd::Function<KernelStatefulAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& params, const Tensor& S0, const Tensor& z0, const AttentionSpec& spec,
                               const LinearAttentionOptions& opts, AttentionPath path) {
    const KernelTarget target = kernel_target(path, q);
    RunnerSlot& slot = runner_slot(*target.backend, target.device_key, spec,
                                   kernel_config(target, spec, opts, Pass::forward, problem_shape(q)), Pass::forward);
    Tensor o = torch::empty({q.size(0), q.size(1), q.size(2), spec.value_dim}, q.options());
    const auto fopts = q.options().dtype(torch::kFloat);
    Tensor S = torch::empty({q.size(0), q.size(2), spec.feature_dim(), spec.value_dim}, fopts);
    Tensor z = torch::empty({q.size(0), q.size(2), spec.feature_dim()}, fopts);
    run_on(target, path, q, [&] {
      std::lock_guard lock(slot.mutex);
      return slot.runner->forward(problem_shape(q), tensor_ref(q), tensor_ref(k), tensor_ref(v), mutable_ref(o),
                                  device_ptr(params),
                                  StateRefs{ptr_or_null(S0), ptr_or_null(z0), device_ptr(S), device_ptr(z)});
    });
    ctx->save_for_backward({q, k, v, params, o, S0, z0});
    ctx->saved_data["spec"] = canonical_json(spec);
    ctx->saved_data["chunk"] = opts.chunk;
    ctx->saved_data["path"] = static_cast<int64_t>(path);
    ctx->saved_data["kernel_backward"] = opts.kernel_backward;
    ctx->saved_data["config"] = opts.config ? opts.config->to_json().dump() : std::string();
    return {o, S, z};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const AttentionSpec spec = spec_from_string(ctx->saved_data["spec"].toStringRef()).value_or_throw();
    const auto path = static_cast<AttentionPath>(ctx->saved_data["path"].toInt());
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &params = saved[3], &o = saved[4], &S0 = saved[5],
                 &z0 = saved[6];
    const Tensor dout = grad_outputs[0].defined() ? grad_outputs[0].contiguous() : torch::zeros_like(o);
    const Tensor dS = grad_outputs[1].defined() ? grad_outputs[1].to(torch::kFloat).contiguous() : Tensor();
    const Tensor dz = grad_outputs[2].defined() ? grad_outputs[2].to(torch::kFloat).contiguous() : Tensor();
    variable_list grads(9);
    if (!ctx->saved_data["kernel_backward"].toBool()) {
      // Recompute with ATen and differentiate (any device).
      torch::AutoGradMode enable(true);
      const Tensor in[6] = {q, k, v, params, S0, z0};
      Tensor leaf[6];
      std::vector<Tensor> wrt;
      for (int i = 0; i < 6; ++i) {
        leaf[i] = in[i].detach().requires_grad_(ctx->needs_input_grad(i) && in[i].numel() > 0);
        if (leaf[i].requires_grad()) wrt.push_back(leaf[i]);
      }
      if (wrt.empty()) return grads;
      auto [ao, aS, az] = aten::linear_attention_with_state(leaf[0], leaf[1], leaf[2], leaf[3], spec,
                                                             S0.numel() ? leaf[4] : Tensor(),
                                                             z0.numel() ? leaf[5] : Tensor(),
                                                             ctx->saved_data["chunk"].toInt());
      std::vector<Tensor> outs{ao.to(q.scalar_type())}, gouts{dout};
      if (dS.defined()) outs.push_back(aS), gouts.push_back(dS.to(aS.scalar_type()));
      if (dz.defined()) outs.push_back(az), gouts.push_back(dz.to(az.scalar_type()));
      const variable_list g = torch::autograd::grad(outs, wrt, gouts, false, false, /*allow_unused=*/true);
      size_t j = 0;
      for (int i = 0; i < 6; ++i)
        if (leaf[i].requires_grad()) {
          grads[i] = g[j++];
          if (!grads[i].defined()) grads[i] = torch::zeros_like(in[i]);
        }
      return grads;
    }
    LinearAttentionOptions opts;
    if (const std::string& c = ctx->saved_data["config"].toStringRef(); !c.empty())
      opts.config = tile_config_from_string(c, TileConfig()).value_or_throw();
    const KernelTarget target = kernel_target(path, q);
    RunnerSlot& slot = runner_slot(*target.backend, target.device_key, spec,
                                   kernel_config(target, spec, opts, Pass::backward, problem_shape(q)), Pass::backward);
    Tensor dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
    Tensor dparams = torch::zeros({params.numel()}, params.options().dtype(torch::kFloat));
    Tensor dS0, dz0;
    if (S0.numel()) dS0 = torch::empty_like(S0);
    if (z0.numel()) dz0 = torch::empty_like(z0);
    run_on(target, path, q, [&] {
      std::lock_guard lock(slot.mutex);
      return slot.runner->backward(problem_shape(q), tensor_ref(q), tensor_ref(k), tensor_ref(v), tensor_ref(o),
                                   tensor_ref(dout), mutable_ref(dq), mutable_ref(dk), mutable_ref(dv),
                                   device_ptr(params), device_ptr(dparams),
                                   StateGradRefs{ptr_or_null(S0), ptr_or_null(z0), ptr_or_null(dS), ptr_or_null(dz),
                                                 ptr_or_null(dS0), ptr_or_null(dz0)});
    });
    grads[0] = dq;
    grads[1] = dk;
    grads[2] = dv;
    grads[3] = params.numel() ? dparams.to(params.scalar_type()) : Tensor();
    grads[4] = dS0;
    grads[5] = dz0;
    for (int i = 0; i < 6; ++i)
      if (!ctx->needs_input_grad(i)) grads[i] = Tensor();
    return grads;
  }
};

// The decode runner of (backend, spec, config), created on first use.
RunnerSlot& decode_runner_slot(Backend& backend, const std::string& device_key, const AttentionSpec& spec,
                               const TileConfig& config) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<RunnerSlot>> slots;
  const std::string key = device_key + "|" + canonical_json(spec) + "|" + config.to_string();
  std::lock_guard lock(mutex);
  auto& slot = slots[key];
  if (!slot) {
    auto runner = AttentionRunner::create_decode(backend, spec, config);
    TORCH_CHECK(runner.ok(), "linear_attention_step: could not build the decode kernel for ", device_key, ": ",
                runner.error().message);
    auto s = std::make_unique<RunnerSlot>();
    s->runner = std::make_unique<AttentionRunner>(std::move(runner).value());
    slot = std::move(s);
  }
  return *slot;
}

// Spec support and the state tensors' checks, naming `what` (the argument).
void check_state(const char* fn, const char* what, const LinearAttentionState& st, const AttentionSpec& spec,
                 const Tensor& q, bool kernels) {
  if (!st.defined()) return;
  TORCH_CHECK(st.S.defined() && st.z.defined(), fn, ": ", what, " needs both S and z (or neither), got ",
              st.S.defined() ? "S only" : "z only");
  const int64_t B = q.size(0), H = q.size(2), D = spec.feature_dim(), dv = spec.value_dim;
  TORCH_CHECK(st.S.dim() == 4 && st.S.size(0) == B && st.S.size(1) == H && st.S.size(2) == D && st.S.size(3) == dv,
              fn, ": ", what, ".S must be [batch, heads, D, dv] = [", B, ", ", H, ", ", D, ", ", dv, "], got ",
              shape_string(st.S));
  TORCH_CHECK(st.z.dim() == 3 && st.z.size(0) == B && st.z.size(1) == H && st.z.size(2) == D, fn, ": ", what,
              ".z must be [batch, heads, D] = [", B, ", ", H, ", ", D, "], got ", shape_string(st.z));
  for (const Tensor* t : {&st.S, &st.z}) {
    const char* name = t == &st.S ? ".S" : ".z";
    TORCH_CHECK(t->device() == q.device(), fn, ": ", what, name, " is on ", t->device(), " but q is on ", q.device());
    const bool fp64_ok = !kernels && q.scalar_type() == torch::kDouble;
    TORCH_CHECK(t->scalar_type() == torch::kFloat || (fp64_ok && t->scalar_type() == torch::kDouble), fn, ": ", what,
                name, " must be float32", fp64_ok ? " or float64" : "", " (the state is kept in fp32), got ",
                t->scalar_type());
  }
}

void check_state_spec(const char* fn, const char* field, const AttentionSpec& spec) {
  const Status st = reference::check_state_support(spec, field);
  TORCH_CHECK(st.ok(), fn, ": ", st.ok() ? std::string() : st.error().message);
}

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

namespace {

// Whether the kernel paths run cross-attention (seq_q != seq_k): through the
// carried-state kernels, so not performer (nor cosformer, rejected for
// cross-attention on every path) and without a key mask.
bool cross_on_kernels(const AttentionSpec& spec, const Tensor& key_mask) {
  return spec.family != Family::performer && spec.family != Family::cosformer && !key_mask.defined();
}

}  // namespace

void check_linear_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                                   const AttentionSpec& spec, AttentionPath path, bool check_finite,
                                   const Tensor& key_mask) {
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
    TORCH_CHECK(a.t.size(0) == q.size(0), "linear_attention: ", a.name, " has batch ", a.t.size(0), " but q has ",
                q.size(0));
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
  TORCH_CHECK(v.size(1) == k.size(1) && v.size(2) == k.size(2), "linear_attention: v has [seq, heads] = [",
              v.size(1), ", ", v.size(2), "] but k has [", k.size(1), ", ", k.size(2), "]");
  TORCH_CHECK(q.size(2) % k.size(2) == 0, "linear_attention: k and v have ", k.size(2),
              " heads, which does not divide q's ", q.size(2),
              " heads (grouped-query attention needs heads_q = g * heads_kv)");
  if (k.size(1) != q.size(1)) {
    TORCH_CHECK(!spec.causal, "linear_attention: causal attention needs seq_q == seq_k, got seq_q = ", q.size(1),
                " and seq_k = ", k.size(1), " (cross-attention of different lengths is non-causal only)");
    TORCH_CHECK(spec.family != Family::cosformer, "linear_attention: family cosformer needs seq_q == seq_k, got ",
                q.size(1), " and ", k.size(1), " (its features depend on the position and sequence length)");
    TORCH_CHECK(!kernels || cross_on_kernels(spec, key_mask), "linear_attention: path ",
                std::string(to_string(path)), " runs cross-attention (seq_q = ", q.size(1), ", seq_k = ", k.size(1),
                ") through the carried-state kernels, ",
                key_mask.defined() ? std::string("which take no key_mask")
                                   : "which family " + std::string(to_string(spec.family)) +
                                         " lacks (its key stabiliser is a max over all keys)",
                "; use path aten");
  }
  if (key_mask.defined()) {
    TORCH_CHECK(key_mask.scalar_type() == torch::kBool, "linear_attention: key_mask must be bool (true = real key, "
                "false = padding), got ", key_mask.scalar_type());
    TORCH_CHECK(key_mask.dim() == 2 && key_mask.size(0) == k.size(0) && key_mask.size(1) == k.size(1),
                "linear_attention: key_mask must be [batch, seq_k] = [", k.size(0), ", ", k.size(1), "], got ",
                shape_string(key_mask));
    TORCH_CHECK(key_mask.device() == q.device(), "linear_attention: key_mask is on ", key_mask.device(),
                " but q is on ", q.device());
    // Kernel paths, cosformer and causal performer serve key_mask by packing
    // (linear_attention), which needs seq_q == seq_k: checked above for kernel
    // paths, causal specs and cosformer.
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

std::vector<int64_t> check_cu_seqlens(const Tensor& cu, const Tensor& q, const Tensor& k, const Tensor& v) {
  TORCH_CHECK(cu.scalar_type() == torch::kInt, "linear_attention: cu_seqlens must be int32 (fla's convention), got ",
              cu.scalar_type());
  TORCH_CHECK(cu.dim() == 1, "linear_attention: cu_seqlens must be 1-D [num_seqs + 1], got shape ", shape_string(cu));
  TORCH_CHECK(cu.numel() >= 2, "linear_attention: cu_seqlens must hold num_seqs + 1 >= 2 offsets, got ", cu.numel());
  TORCH_CHECK(cu.device() == q.device(), "linear_attention: cu_seqlens is on ", cu.device(), " but q is on ",
              q.device());
  TORCH_CHECK(q.size(0) == 1, "linear_attention: with cu_seqlens, q, k and v must be packed as [1, total_tokens, "
              "heads, dim], got q of batch ", q.size(0), " (shape ", shape_string(q), ")");
  TORCH_CHECK(k.size(1) == q.size(1) && v.size(1) == q.size(1), "linear_attention: with cu_seqlens, q, k and v must "
              "have the same tokens, got seq ", q.size(1), ", ", k.size(1), " and ", v.size(1));
  const std::vector<int64_t> c = host_offsets(cu);
  TORCH_CHECK(c[0] == 0, "linear_attention: cu_seqlens[0] = ", c[0], ", must be 0");
  for (size_t i = 1; i < c.size(); ++i)
    TORCH_CHECK(c[i] >= c[i - 1], "linear_attention: cu_seqlens must be non-decreasing, got cu_seqlens[", i,
                "] = ", c[i], " < cu_seqlens[", i - 1, "] = ", c[i - 1]);
  TORCH_CHECK(c.back() == q.size(1), "linear_attention: cu_seqlens[", c.size() - 1, "] = ", c.back(),
              ", must equal the total tokens q.size(1) = ", q.size(1));
  return c;
}

Tensor repeat_kv_heads(const Tensor& t, int64_t heads) {
  const int64_t g = heads / t.size(2);
  return g == 1 ? t : t.repeat_interleave(g, 2);
}

Tensor linear_attention(const Tensor& q, const Tensor& k_in, const Tensor& v_in, const Tensor& feature_params,
                        const AttentionSpec& spec, const LinearAttentionOptions& options) {
  AttentionPath path = resolve_path(options.path, q.defined() ? q.device() : torch::Device(torch::kCPU));
  // What the kernels do not run (cross-attention of performer, or with a key
  // mask) takes the ATen path when the caller left the choice.
  const bool cross = q.defined() && k_in.defined() && q.dim() == 4 && k_in.dim() == 4 && q.size(1) != k_in.size(1);
  if (options.path == AttentionPath::automatic && cross && !cross_on_kernels(spec, options.key_mask))
    path = AttentionPath::aten;
  check_linear_attention_inputs(q, k_in, v_in, feature_params, spec, path, options.check_finite, options.key_mask);
  TORCH_CHECK(options.chunk >= 1, "linear_attention: options.chunk must be >= 1, got ", options.chunk);
  const bool kernels = path == AttentionPath::host_kernels || path == AttentionPath::cuda_kernels;
  if (options.key_mask.defined()) {
    TORCH_CHECK(!options.cu_seqlens.defined(), "linear_attention: give key_mask or cu_seqlens, not both (a packed "
                "batch has no padding)");
    const bool position_dependent = spec.family == Family::cosformer || (spec.causal && spec.family == Family::performer);
    if (!cross && (kernels || position_dependent)) {
      // Pack the real tokens of each row into one sequence of a packed batch.
      const Tensor& mask = options.key_mask;
      const int64_t B = q.size(0), N = q.size(1), H = q.size(2);
      const Tensor idx = mask.reshape({-1}).nonzero().squeeze(1);
      Tensor cu = torch::zeros({B + 1}, mask.options().dtype(torch::kInt));
      cu.narrow(0, 1, B).copy_(mask.sum(1).cumsum(0));
      const int64_t total = idx.numel();
      const auto out_options = q.options();
      if (total == 0) return torch::zeros({B, N, H, spec.value_dim}, out_options);
      auto pack = [&](const Tensor& t) { return t.reshape({B * N, t.size(2), t.size(3)}).index_select(0, idx).unsqueeze(0); };
      LinearAttentionOptions packed = options;
      packed.key_mask = Tensor();
      packed.cu_seqlens = cu;
      const Tensor o = linear_attention(pack(q), pack(k_in), pack(v_in), feature_params, spec, packed);
      return torch::zeros({B * N, H, spec.value_dim}, o.options()).index_copy(0, idx, o.squeeze(0)).reshape(
          {B, N, H, spec.value_dim});
    }
  }
  std::vector<int64_t> cu_host;
  int64_t max_len = 0;
  if (options.cu_seqlens.defined()) {
    cu_host = check_cu_seqlens(options.cu_seqlens, q, k_in, v_in);
    for (size_t s = 0; s + 1 < cu_host.size(); ++s) max_len = std::max(max_len, cu_host[s + 1] - cu_host[s]);
  }
  const Tensor k = repeat_kv_heads(k_in, q.size(2)), v = repeat_kv_heads(v_in, q.size(2));
  if (path == AttentionPath::aten) {
    const Tensor params = feature_params.defined() ? feature_params : torch::empty({0}, q.options());
    if (options.cu_seqlens.defined()) return aten_varlen(q, k, v, params, spec, options.chunk, cu_host).to(q.scalar_type());
    return aten::linear_attention(q, k, v, params, spec, options.chunk, options.key_mask).to(q.scalar_type());
  }
  const Tensor params = feature_params.defined() ? feature_params : torch::empty({0}, q.options().dtype(torch::kFloat));
  if (cross) {
    LinearAttentionOptions o = options;
    o.path = path;
    return output_from_state_kernels(q, params, spec, packed_state_kernels(k_in, v_in, params, spec, q.size(2), o), o);
  }
  if (options.cu_seqlens.defined()) {
    LinearAttentionOptions o = options;
    o.cu_seqlens = options.cu_seqlens.contiguous();
    return KernelLinearAttention::apply(q, k, v, params, spec, o, path, max_len);
  }
  return KernelLinearAttention::apply(q, k, v, params, spec, options, path, int64_t(0));
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

LinearAttentionStateOutput linear_attention_with_state(const Tensor& q, const Tensor& k_in, const Tensor& v_in,
                                                       const Tensor& feature_params, const AttentionSpec& spec,
                                                       const LinearAttentionState& initial_state,
                                                       bool output_final_state,
                                                       const LinearAttentionOptions& options) {
  const char* fn = "linear_attention_with_state";
  check_state_spec(fn, initial_state.defined() ? "initial_state" : "output_final_state", spec);
  TORCH_CHECK(!options.key_mask.defined(), fn, ": key_mask cannot be combined with initial_state / "
              "output_final_state (not implemented: the kernels have no masked form); pass each sequence's real "
              "tokens, batch by equal lengths");
  const AttentionPath path = resolve_path(options.path, q.defined() ? q.device() : torch::Device(torch::kCPU));
  check_linear_attention_inputs(q, k_in, v_in, feature_params, spec, path, options.check_finite);
  TORCH_CHECK(options.chunk >= 1, fn, ": options.chunk must be >= 1, got ", options.chunk);
  const bool kernels = path != AttentionPath::aten;
  check_state(fn, "initial_state", initial_state, spec, q, kernels);
  const Tensor k = repeat_kv_heads(k_in, q.size(2)), v = repeat_kv_heads(v_in, q.size(2));
  LinearAttentionStateOutput res;
  if (!kernels) {
    const Tensor params = feature_params.defined() ? feature_params : torch::empty({0}, q.options());
    auto [o, S, z] = aten::linear_attention_with_state(q, k, v, params, spec, initial_state.S, initial_state.z,
                                                       options.chunk);
    res.out = o.to(q.scalar_type());
    if (output_final_state) res.final_state = {S, z};
    return res;
  }
  const Tensor params =
      feature_params.defined() ? feature_params : torch::empty({0}, q.options().dtype(torch::kFloat));
  const auto empty = torch::empty({0}, q.options().dtype(torch::kFloat));
  const variable_list r = KernelStatefulAttention::apply(
      q, k, v, params, initial_state.defined() ? initial_state.S.contiguous() : empty,
      initial_state.defined() ? initial_state.z.contiguous() : empty, spec, options, path);
  res.out = r[0];
  if (output_final_state) res.final_state = {r[1], r[2]};
  return res;
}

Tensor packed_state_kernels(const Tensor& k, const Tensor& v, const Tensor& feature_params, const AttentionSpec& spec,
                            int64_t heads, const LinearAttentionOptions& options) {
  TORCH_CHECK(options.path == AttentionPath::host_kernels || options.path == AttentionPath::cuda_kernels,
              "packed_state_kernels: options.path must be host_kernels or cuda_kernels, got ",
              std::string(to_string(options.path)));
  TORCH_CHECK(k.defined() && k.dim() == 4 && heads >= 1 && heads % k.size(2) == 0, "packed_state_kernels: k must be "
              "4-D [batch, seq_k, heads_kv, head_dim] with heads_kv dividing heads = ", heads);
  AttentionSpec causal = spec;
  causal.causal = true;
  LinearAttentionOptions op = options;
  op.key_mask = Tensor();
  op.cu_seqlens = Tensor();
  // The stand-in queries' outputs are dropped; the final state does not depend on them.
  const LinearAttentionStateOutput r =
      linear_attention_with_state(repeat_kv_heads(k, heads).detach(), k, v, feature_params, causal, {}, true, op);
  return spec.normalize ? torch::cat({r.final_state.S, r.final_state.z.unsqueeze(-1)}, -1) : r.final_state.S;
}

Tensor output_from_state_kernels(const Tensor& q, const Tensor& feature_params, const AttentionSpec& spec,
                                 const Tensor& packed_state, const LinearAttentionOptions& options) {
  const char* fn = "output_from_state_kernels";
  TORCH_CHECK(options.path == AttentionPath::host_kernels || options.path == AttentionPath::cuda_kernels, fn,
              ": options.path must be host_kernels or cuda_kernels, got ", std::string(to_string(options.path)));
  TORCH_CHECK(q.defined() && q.dim() == 4, fn, ": q must be 4-D [batch, seq_q, heads, head_dim]");
  const int64_t B = q.size(0), H = q.size(2), D = spec.feature_dim(), dv = spec.value_dim;
  const int64_t cols = dv + (spec.normalize ? 1 : 0);
  TORCH_CHECK(packed_state.defined() && packed_state.dim() == 4 && packed_state.size(0) == B &&
                  packed_state.size(1) == H && packed_state.size(2) == D && packed_state.size(3) == cols,
              fn, ": the packed state must be [batch, heads, D, dv", spec.normalize ? " + 1" : "", "] = [", B, ", ", H,
              ", ", D, ", ", cols, "], got ", shape_string(packed_state));
  TORCH_CHECK(cols <= limits::kValueDim.hi, fn, ": a normalized readout is a pass of value_dim dv + 1 = ", cols,
              ", above the kernels' limit of ", limits::kValueDim.hi, "; use value_dim <= ", limits::kValueDim.hi - 1,
              " or path aten");
  AttentionSpec readout = spec;
  readout.causal = true;
  readout.normalize = false;
  readout.value_dim = int(cols);
  readout.dtype = DType::fp32;
  LinearAttentionOptions op = options;
  op.config.reset();  // a spec of its own: its tuned or default config
  op.key_mask = Tensor();
  op.cu_seqlens = Tensor();
  const Tensor q32 = q.to(torch::kFloat);
  const Tensor zeros_v = torch::zeros({B, q.size(1), H, cols}, q32.options());
  const Tensor state = packed_state.to(torch::kFloat).contiguous();
  const LinearAttentionState seed{state, torch::zeros({B, H, D}, state.options())};
  const Tensor num = linear_attention_with_state(q32, q32.detach(), zeros_v, feature_params, readout, seed, false, op).out;
  const Tensor out = spec.normalize ? num.narrow(-1, 0, dv) / (num.narrow(-1, dv, 1) + spec.eps) : num;
  return out.to(q.scalar_type());
}

std::vector<TunedConfig> tune_attention(const AttentionSpec& spec, const std::vector<ProblemShape>& shapes,
                                        AttentionPath path, const torch::Device& device,
                                        const TuneAttentionOptions& options) {
  const char* fn = "tune_attention";
  TORCH_CHECK(path == AttentionPath::host_kernels || path == AttentionPath::cuda_kernels, fn,
              ": path must be host_kernels or cuda_kernels (what is tuned is the kernels), got ",
              std::string(to_string(path)));
  TORCH_CHECK(!shapes.empty(), fn, ": no shapes to tune");
  for (const ProblemShape& sh : shapes)
    TORCH_CHECK(sh.batch >= 1 && sh.heads >= 1 && sh.seq >= 1, fn, ": shape (batch ", sh.batch, ", heads ", sh.heads,
                ", seq ", sh.seq, ") must have every size >= 1");
  const Status valid = validate(spec);
  TORCH_CHECK(valid.ok(), fn, ": spec: ", valid.ok() ? "" : valid.error().message);
  const Status env = BinaryCache::check_environment();
  TORCH_CHECK(env.ok(), fn, ": ", env.ok() ? "" : env.error().message);
  const Tensor probe = torch::empty({0}, torch::TensorOptions().device(device));
  TORCH_CHECK(path != AttentionPath::host_kernels || device.is_cpu(), fn, ": path host_kernels tunes for CPU "
              "tensors, device is ", device.str());
  const KernelTarget target = kernel_target(path, probe);
  TuneOptions opt;
  opt.arch = target_arch(target);
  opt.shapes = shapes;
  opt.passes = options.passes;
  opt.top_k = options.top_k;
  opt.threads = options.threads;
  opt.retune = options.retune;
  std::vector<TunedConfig> out;
  opt.on_result = [&](const TuneResult& r) {
    out.push_back({r.pass, r.shape, r.chosen, r.method, r.from_db, r.saved});
  };
  std::lock_guard lock(db_mutex());
  TuningDb& db = device_db(target);
  std::unique_ptr<Timer> timer;
  Backend* timing = nullptr;
#if LUNAJIT_TORCH_CUDA
  if (path == AttentionPath::cuda_kernels) {
    timer = make_cuda_event_timer(*static_cast<CudaBackend*>(target.backend));
    timing = target.backend;
  }
#endif
  // On a GPU the candidates are checked and timed there; on the host checked
  // by the emulator, on a host backend of the tune's own (as `lunajit tune`
  // does: the kernels it loads go with it), and ranked by the cost model for sm_90.
  std::unique_ptr<Backend> own_host;
  if (path == AttentionPath::host_kernels) own_host = make_host_backend();
  Tuner tuner(db, own_host ? *own_host : *target.backend, opt, timer.get(), timing);
  auto results = tuner.tune(spec);
  TORCH_CHECK(results.ok(), fn, ": ", results.ok() ? "" : results.error().message);
  return out;
}

LinearAttentionStepOutput linear_attention_step(const Tensor& q, const Tensor& k_in, const Tensor& v_in,
                                                const Tensor& feature_params, const AttentionSpec& spec,
                                                const LinearAttentionState& state,
                                                const LinearAttentionOptions& options) {
  const char* fn = "linear_attention_step";
  check_state_spec(fn, "state", spec);
  const AttentionPath path = resolve_path(options.path, q.defined() ? q.device() : torch::Device(torch::kCPU));
  check_linear_attention_inputs(q, k_in, v_in, feature_params, spec, path, options.check_finite);
  TORCH_CHECK(q.size(1) == 1, fn, ": q, k, v must hold one token per sequence ([batch, 1, heads, dim]), got seq ",
              q.size(1), " (use linear_attention_with_state for a prompt)");
  const bool kernels = path != AttentionPath::aten;
  check_state(fn, "state", state, spec, q, kernels);
  const Tensor k = repeat_kv_heads(k_in, q.size(2)), v = repeat_kv_heads(v_in, q.size(2));
  LinearAttentionStepOutput res;
  if (!kernels) {
    const Tensor params = feature_params.defined() ? feature_params : torch::empty({0}, q.options());
    auto [o, S, z] = aten::linear_attention_step(q, k, v, params, spec, state.S, state.z);
    res.out = o.to(q.scalar_type());
    res.state = {S, z};
    return res;
  }
  if (torch::GradMode::is_enabled())
    for (const Tensor* t : {&q, &k_in, &v_in, &feature_params, &state.S, &state.z})
      TORCH_CHECK(!(t->defined() && t->requires_grad()), fn, ": path ", std::string(to_string(path)),
                  " runs the decode kernel, which has no backward; use path aten for gradients, or torch.no_grad()");
  const Tensor params =
      feature_params.defined() ? feature_params : torch::empty({0}, q.options().dtype(torch::kFloat));
  const auto fopts = q.options().dtype(torch::kFloat);
  const int64_t B = q.size(0), H = q.size(2), D = spec.feature_dim(), dv = spec.value_dim;
  // The kernel updates the state in place: on copies, so the caller's state is unchanged.
  Tensor S = state.defined() ? state.S.detach().clone(at::MemoryFormat::Contiguous) : torch::zeros({B, H, D, dv}, fopts);
  Tensor z = state.defined() ? state.z.detach().clone(at::MemoryFormat::Contiguous) : torch::zeros({B, H, D}, fopts);
  Tensor o = torch::empty({B, 1, H, dv}, q.options());
  const KernelTarget target = kernel_target(path, q);
  const TileConfig config = options.config ? *options.config
                                           : kernel_config(target, spec, options, Pass::forward, problem_shape(q));
  RunnerSlot& slot = decode_runner_slot(*target.backend, target.device_key, spec, config);
  run_on(target, path, q, [&] {
    std::lock_guard lock(slot.mutex);
    return slot.runner->decode(problem_shape(q), tensor_ref(q), tensor_ref(k), tensor_ref(v), mutable_ref(o),
                               device_ptr(params), device_ptr(S), device_ptr(z));
  });
  res.out = o;
  res.state = {S, z};
  return res;
}

}  // namespace lunajit
