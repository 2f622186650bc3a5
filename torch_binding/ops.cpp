// The TorchScript custom ops of lunajit (torch.ops.lunajit.*), registered with
// TORCH_LIBRARY in liblunajit_torch.so: the library `import lunajit` loads into
// PyTorch (python/lunajit/), usable as well from C++ and TorchScript.
//
//   linear_attention(q, k, v, params, spec, path, chunk, config, kernel_backward, check_finite, key_mask)
//       the op of torch_binding/linear_attention.h (key_mask: bool [batch,
//       seq_k], true = real key; k, v may have fewer heads (GQA) and, non-causal,
//       another length than q). Registered for the Autograd
//       dispatch key (differentiable in q, k, v and params: the ATen path
//       through ATen's autograd, the kernel paths through their
//       autograd::Function with the backward kernels) and for
//       CompositeExplicitAutograd (inference mode, no_grad below autograd).
//   linear_attention_state(q, k, v, params, spec, initial_S, initial_z, path, chunk, config, kernel_backward)
//       -> (o, final_S, final_z): causal attention carrying state
//       (linear_attention_with_state; differentiable in the initial state too)
//   linear_attention_step(q, k, v, params, spec, S, z, path, config) -> (o, S', z')
//       one decoding step (linear_attention_step; the decode kernel on kernel paths)
//   feature_map(x, params, spec, query)      phi(x) (ATen, differentiable)
//   linear_attention_weights(q, k, params, spec, key_mask)   the O(n^2) weights
//                                            [batch, heads, seq_q, seq_k] (ATen)
//   init_feature_params(spec, heads, seed)   codegen's init_params as a tensor
//   param_layout(spec)                       the flat layout as JSON
//   canonical_spec(spec) / default_spec(family)   validated canonical spec JSON
//   tune(spec, shapes, arch, backend, pass, max_candidates, retune)   the tuner; JSON
//   report(spec, archs, shapes, out, measure, compile, config)        a kernel report; JSON
//   build_info()                             versions this library was built with
//
// `spec` is spec JSON text or a spec file (codegen load_spec). Every bad
// argument is a c10::Error (Python RuntimeError; ValueError for bad option
// values) carrying the C++ message; nothing aborts the interpreter.
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/library.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "autotune/tuner.h"
#include "cache/binary_cache.h"
#include "cache/tuning_db.h"
#include "codegen/feature_params.h"
#include "report/kernel_report.h"
#include "report/render.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/host/host_backend.h"
#include "torch_binding/linear_attention.h"

namespace lunajit {
namespace {

using nlohmann::json;
using torch::Tensor;

// Library errors (Result::value_or_throw) become c10::Error with their message.
template <class T>
T unwrap(Result<T> r, const char* what) {
  TORCH_CHECK_VALUE(r.ok(), what, ": ", r.ok() ? std::string() : r.error().message);
  return std::move(r).value();
}

// Parsed specs by their text: a Python call passes the same JSON each time.
AttentionSpec parse_spec(const std::string& text) {
  static std::mutex mutex;
  static std::map<std::string, AttentionSpec> cache;
  std::lock_guard lock(mutex);
  if (auto it = cache.find(text); it != cache.end()) return it->second;
  AttentionSpec spec = unwrap(load_spec(text), "lunajit: spec");
  const Status valid = validate(spec);
  TORCH_CHECK_VALUE(valid.ok(), "lunajit: spec: ", valid.ok() ? std::string() : valid.error().message);
  if (cache.size() > 256) cache.clear();
  cache.emplace(text, spec);
  return spec;
}

AttentionPath parse_path(const std::string& s) {
  for (AttentionPath p : {AttentionPath::automatic, AttentionPath::aten, AttentionPath::host_kernels,
                          AttentionPath::cuda_kernels})
    if (to_string(p) == s) return p;
  TORCH_CHECK_VALUE(false, "linear_attention: path = \"", s,
                    "\" is not one of automatic, aten, host_kernels, cuda_kernels");
  return AttentionPath::automatic;
}

Tensor linear_attention_op(const Tensor& q, const Tensor& k, const Tensor& v, const c10::optional<Tensor>& params,
                           const std::string& spec_text, const std::string& path, int64_t chunk,
                           const std::string& config, bool kernel_backward, bool check_finite,
                           const c10::optional<Tensor>& key_mask, const c10::optional<Tensor>& cu_seqlens) {
  const AttentionSpec spec = parse_spec(spec_text);
  LinearAttentionOptions opts;
  opts.path = parse_path(path);
  TORCH_CHECK_VALUE(chunk >= 1, "linear_attention: chunk must be >= 1, got ", chunk);
  opts.chunk = chunk;
  opts.kernel_backward = kernel_backward;
  opts.check_finite = check_finite;
  if (!config.empty()) opts.config = unwrap(tile_config_from_string(config, TileConfig()), "linear_attention: config");
  if (key_mask) opts.key_mask = *key_mask;
  if (cu_seqlens) opts.cu_seqlens = *cu_seqlens;
  return linear_attention(q, k, v, params ? *params : Tensor(), spec, opts);
}

LinearAttentionOptions state_options(const std::string& path, int64_t chunk, const std::string& config,
                                     bool kernel_backward) {
  LinearAttentionOptions opts;
  opts.path = parse_path(path);
  TORCH_CHECK_VALUE(chunk >= 1, "linear_attention: chunk must be >= 1, got ", chunk);
  opts.chunk = chunk;
  opts.kernel_backward = kernel_backward;
  if (!config.empty()) opts.config = unwrap(tile_config_from_string(config, TileConfig()), "linear_attention: config");
  return opts;
}

LinearAttentionState state_of(const c10::optional<Tensor>& S, const c10::optional<Tensor>& z) {
  return {S ? *S : Tensor(), z ? *z : Tensor()};
}

std::tuple<Tensor, Tensor, Tensor> linear_attention_state_op(
    const Tensor& q, const Tensor& k, const Tensor& v, const c10::optional<Tensor>& params,
    const std::string& spec_text, const c10::optional<Tensor>& initial_S, const c10::optional<Tensor>& initial_z,
    const std::string& path, int64_t chunk, const std::string& config, bool kernel_backward) {
  const LinearAttentionStateOutput r =
      linear_attention_with_state(q, k, v, params ? *params : Tensor(), parse_spec(spec_text),
                                  state_of(initial_S, initial_z), true,
                                  state_options(path, chunk, config, kernel_backward));
  return {r.out, r.final_state.S, r.final_state.z};
}

std::tuple<Tensor, Tensor, Tensor> linear_attention_step_op(const Tensor& q, const Tensor& k, const Tensor& v,
                                                            const c10::optional<Tensor>& params,
                                                            const std::string& spec_text,
                                                            const c10::optional<Tensor>& S,
                                                            const c10::optional<Tensor>& z, const std::string& path,
                                                            const std::string& config) {
  const LinearAttentionStepOutput r = linear_attention_step(q, k, v, params ? *params : Tensor(),
                                                            parse_spec(spec_text), state_of(S, z),
                                                            state_options(path, 64, config, true));
  return {r.out, r.state.S, r.state.z};
}

// The weights of aten::linear_attention_weights, with the op's input checks
// (a stand-in v, as feature_map) and k repeated to q's heads for GQA.
Tensor linear_attention_weights_op(const Tensor& q, const Tensor& k, const c10::optional<Tensor>& params,
                                   const std::string& spec_text, const c10::optional<Tensor>& key_mask) {
  const AttentionSpec spec = parse_spec(spec_text);
  TORCH_CHECK(k.defined() && k.dim() == 4, "linear_attention_weights: k must be 4-D [batch, seq, heads, head_dim]");
  const Tensor v_like = k.new_empty({1, 1, 1, spec.value_dim}).expand({k.size(0), k.size(1), k.size(2),
                                                                       spec.value_dim});
  const Tensor p = params ? *params : Tensor();
  const Tensor mask = key_mask ? *key_mask : Tensor();
  check_linear_attention_inputs(q, k, v_like, p, spec, AttentionPath::aten, false, mask);
  TORCH_CHECK(!mask.defined() || !(spec.family == Family::cosformer || (spec.causal && spec.family == Family::performer)),
              "linear_attention_weights: key_mask is not supported for cosformer and causal performer (their "
              "features depend on the positions the mask removes); call it per sequence on the real tokens");
  return aten::linear_attention_weights(q, repeat_kv_heads(k, q.size(2)), p.defined() ? p : torch::empty({0}, q.options()),
                                        spec, mask);
}

Tensor feature_map_op(const Tensor& x, const c10::optional<Tensor>& params, const std::string& spec, bool query) {
  return lunajit::feature_map(x, params ? *params : Tensor(), parse_spec(spec),
                     query ? aten::FeatureRole::query : aten::FeatureRole::key);
}

Tensor init_feature_params_op(const std::string& spec, int64_t heads, int64_t seed) {
  TORCH_CHECK_VALUE(heads >= 1, "init_feature_params: heads must be >= 1, got ", heads);
  TORCH_CHECK_VALUE(seed >= 0, "init_feature_params: seed must be >= 0, got ", seed);
  return init_feature_params(parse_spec(spec), heads, static_cast<uint64_t>(seed));
}

std::string param_layout_op(const std::string& spec_text) {
  const AttentionSpec spec = parse_spec(spec_text);
  const ParamLayout layout = param_layout(spec);
  json tensors = json::array();
  for (const auto& t : layout.tensors)
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"learned", t.learned}});
  return json{{"per_head_floats", layout.per_head_floats}, {"params_per_head", spec.params_per_head},
              {"tensors", tensors}}
      .dump();
}

std::string canonical_spec_op(const std::string& spec) { return canonical_json(parse_spec(spec)); }

std::string default_spec_op(const std::string& family) {
  return canonical_json(default_spec(unwrap(parse_family(family), "default_spec")));
}

std::vector<ProblemShape> shapes_of(const std::vector<int64_t>& flat, const char* what) {
  TORCH_CHECK_VALUE(!flat.empty() && flat.size() % 3 == 0, what,
                    ": shapes must be a flat list of (batch, heads, seq) triples, got ", flat.size(), " numbers");
  std::vector<ProblemShape> out;
  for (size_t i = 0; i < flat.size(); i += 3) {
    for (size_t j = 0; j < 3; ++j)
      TORCH_CHECK_VALUE(flat[i + j] >= 1 && flat[i + j] <= (1 << 30), what, ": shape ", i / 3, " has ",
                        j == 0 ? "batch" : j == 1 ? "heads" : "seq", " = ", flat[i + j], " (must be >= 1)");
    ProblemShape s{int(flat[i]), int(flat[i + 1]), int(flat[i + 2])};
    const Status st = validate(s);
    TORCH_CHECK_VALUE(st.ok(), what, ": ", st.ok() ? std::string() : st.error().message);
    out.push_back(s);
  }
  return out;
}

// The tuner as `lunajit tune` runs it (apps/tune_command.cpp): a GPU when there
// is one (measured), else checked on the host and model-ranked for `arch`.
std::string tune_op(const std::string& spec_text, const std::vector<int64_t>& shapes, const std::string& arch_name,
                    const std::string& backend, const std::string& pass, int64_t max_candidates, bool retune) {
  const AttentionSpec spec = parse_spec(spec_text);
  TORCH_CHECK_VALUE(backend == "auto" || backend == "cuda" || backend == "host", "tune: backend = \"", backend,
                    "\" is not one of auto, cuda, host");
  TORCH_CHECK_VALUE(max_candidates >= 0, "tune: max_candidates must be >= 0, got ", max_candidates);
  std::unique_ptr<CudaBackend> gpu;
  if (backend != "host") {
    auto g = CudaBackend::create();
    if (g) gpu = std::move(*g);
    else TORCH_CHECK(backend != "cuda", "tune: ", g.error().message);
  }
  const Arch arch = !arch_name.empty() ? unwrap(parse_arch(arch_name), "tune: arch")
                                       : gpu ? gpu->arch() : arch_from_sm(90).value_or_throw();
  TORCH_CHECK_VALUE(!gpu || arch.sm == gpu->arch().sm, "tune: arch ", arch_name, " but the GPU is ",
                    gpu ? gpu->arch().name() : "", "; pass backend=\"host\" to model-rank another arch");
  DeviceFingerprint fp = gpu ? device_fingerprint(gpu->device()) : model_fingerprint(arch);
  TuningDb db(BinaryCache::default_dir(), fp);
  std::unique_ptr<Backend> host;
  Backend* check_backend = gpu.get();
  if (!gpu) {
    host = make_host_backend();
    check_backend = host.get();
  }
  TuneOptions opt;
  opt.arch = arch;
  opt.shapes = shapes_of(shapes, "tune");
  opt.max_candidates = size_t(max_candidates);
  opt.retune = retune;
  TORCH_CHECK_VALUE(pass == "all" || pass == "forward" || pass == "backward", "tune: pass = \"", pass,
                    "\" is not one of all, forward, backward");
  if (pass != "all") opt.passes = {unwrap(parse_pass(pass), "tune: pass")};
  std::unique_ptr<Timer> timer;
  if (gpu) timer = make_cuda_event_timer(*gpu, {});
  Tuner tuner(db, *check_backend, opt, timer.get(), gpu.get());
  const std::vector<TuneResult> results = unwrap(tuner.tune(spec), "tune");
  json out = json::array();
  for (const auto& r : results) {
    size_t correct = 0;
    for (const auto& c : r.candidates) correct += c.correct;
    out.push_back({{"pass", to_string(r.pass)},
                   {"shape", {r.shape.batch, r.shape.heads, r.shape.seq}},
                   {"key", r.key.to_string()},
                   {"chosen", r.chosen.to_json()},
                   {"method", r.method},
                   {"from_db", r.from_db},
                   {"candidates", r.candidates.size()},
                   {"correct", correct}});
  }
  return json{{"spec", to_json(spec)}, {"arch", arch.name()}, {"device", fp.to_json()},
              {"database", db.file().string()}, {"results", out}}
      .dump();
}

std::string report_op(const std::string& spec_text, const std::string& archs, const std::vector<int64_t>& shapes,
                      const std::string& out, bool measure, bool compile, const std::string& config) {
  const AttentionSpec spec = parse_spec(spec_text);
  report::ReportOptions o;
  if (!config.empty()) {
    // A tile config over every pass's default (`lunajit report --config`).
    o.config = json::parse(config, nullptr, /*allow_exceptions=*/false);
    TORCH_CHECK(!o.config.is_discarded(), "report: config: not JSON: ", config);
  }
  o.archs = unwrap(parse_arch_list(archs), "report: archs");
  o.shapes = shapes_of(shapes, "report");
  o.measure = measure;
  o.compile = compile;
  const json r = unwrap(report::build_report(spec, o), "report");
  if (!out.empty()) {
    const Status st = report::write_report(r, out);
    TORCH_CHECK(st.ok(), "report: ", st.ok() ? std::string() : st.error().message);
  }
  return r.dump();
}

std::string build_info_op() {
  return json{{"lunajit_version", LUNAJIT_VERSION},
              {"torch_version", TORCH_VERSION},
              {"cuda_kernels_compiled", bool(LUNAJIT_TORCH_CUDA)},
              {"cuda_kernels_available", cuda_kernels_available()}}
      .dump();
}

}  // namespace
}  // namespace lunajit

TORCH_LIBRARY(lunajit, m) {
  m.def("linear_attention(Tensor q, Tensor k, Tensor v, Tensor? params, str spec, str path=\"automatic\", "
        "int chunk=64, str config=\"\", bool kernel_backward=True, bool check_finite=False, Tensor? key_mask=None, "
        "Tensor? cu_seqlens=None) -> Tensor");
  m.def("linear_attention_state(Tensor q, Tensor k, Tensor v, Tensor? params, str spec, Tensor? initial_S=None, "
        "Tensor? initial_z=None, str path=\"automatic\", int chunk=64, str config=\"\", bool kernel_backward=True) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("linear_attention_step(Tensor q, Tensor k, Tensor v, Tensor? params, str spec, Tensor? S=None, "
        "Tensor? z=None, str path=\"automatic\", str config=\"\") -> (Tensor, Tensor, Tensor)");
  m.def("feature_map(Tensor x, Tensor? params, str spec, bool query=True) -> Tensor", &lunajit::feature_map_op);
  m.def("linear_attention_weights(Tensor q, Tensor k, Tensor? params, str spec, Tensor? key_mask=None) -> Tensor",
        &lunajit::linear_attention_weights_op);
  m.def("init_feature_params(str spec, int heads, int seed=0) -> Tensor", &lunajit::init_feature_params_op);
  m.def("param_layout(str spec) -> str", &lunajit::param_layout_op);
  m.def("canonical_spec(str spec) -> str", &lunajit::canonical_spec_op);
  m.def("default_spec(str family) -> str", &lunajit::default_spec_op);
  m.def("tune(str spec, int[] shapes, str arch=\"\", str backend=\"auto\", str pass_=\"all\", int max_candidates=0, "
        "bool retune=False) -> str",
        &lunajit::tune_op);
  m.def("report(str spec, str archs, int[] shapes, str out=\"\", bool measure=True, bool compile=True, "
        "str config=\"\") -> str",
        &lunajit::report_op);
  m.def("build_info() -> str", &lunajit::build_info_op);
}

// Autograd: the op's own autograd (ATen autograd or the kernels' Function).
TORCH_LIBRARY_IMPL(lunajit, Autograd, m) {
  m.impl("linear_attention", &lunajit::linear_attention_op);
  m.impl("linear_attention_state", &lunajit::linear_attention_state_op);
  m.impl("linear_attention_step", &lunajit::linear_attention_step_op);
}
// Below autograd (inference mode): the same computation, nothing recorded.
TORCH_LIBRARY_IMPL(lunajit, CompositeExplicitAutograd, m) {
  m.impl("linear_attention", &lunajit::linear_attention_op);
  m.impl("linear_attention_state", &lunajit::linear_attention_state_op);
  m.impl("linear_attention_step", &lunajit::linear_attention_step_op);
}
