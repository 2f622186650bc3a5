#include "runtime/attention_runner.h"

#include <fmt/format.h>

#include "codegen/decode_source.h"

namespace lunajit {

Result<AttentionRunner> AttentionRunner::create(Backend& backend, const AttentionSpec& spec,
                                                const TileConfig& config, Pass pass) {
  auto src = generate(spec, config, pass);
  if (!src) return src.error();
  auto module = backend.load(*src);
  if (!module) return module.error();
  return AttentionRunner(backend, std::move(*module));
}

Result<AttentionRunner> AttentionRunner::create_decode(Backend& backend, const AttentionSpec& spec,
                                                       const TileConfig& config) {
  auto src = generate_decode(spec, config);
  if (!src) return src.error();
  auto module = backend.load(*src);
  if (!module) return module.error();
  return AttentionRunner(backend, std::move(*module));
}

namespace {
bool has_state(const StateRefs& s) { return s.initial_S || s.initial_z || s.final_S || s.final_z; }
bool has_state(const StateGradRefs& s) {
  return s.initial_S || s.initial_z || s.dfinal_S || s.dfinal_z || s.dinitial_S || s.dinitial_z;
}
}  // namespace

Result<float*> AttentionRunner::workspace(int64_t floats) {
  const std::size_t bytes = static_cast<std::size_t>(floats) * sizeof(float);
  if (bytes == 0) return static_cast<float*>(nullptr);
  if (workspace_.bytes() < bytes) {
    auto buf = backend_->allocate(bytes);
    if (!buf) return buf.error();
    workspace_ = std::move(*buf);
  }
  return static_cast<float*>(workspace_.as_pointer());
}

Status AttentionRunner::launch_plan(const LaunchPlan& plan, void* args) {
  void* params[] = {args};
  for (const auto& l : plan.launches) {
    const KernelEntry* entry = source().entry(l.role);
    if (entry == nullptr)
      return Error::failure(fmt::format("{}: no kernel for role '{}' in the generated source", source().name, l.role));
    LaunchConfig cfg;
    cfg.grid = {l.grid[0], l.grid[1], l.grid[2]};
    cfg.block = {l.threads, 1, 1};
    cfg.dynamic_smem = static_cast<unsigned>(l.smem_bytes);
    if (auto st = backend_->launch(*module_, entry->name_expression, cfg, params); !st) return st;
  }
  return ok_status();
}

int AttentionRunner::splits_for(const ProblemShape& shape) {
  const std::array<int, 3> key{shape.batch, shape.heads, shape.seq};
  if (auto it = splits_.find(key); it != splits_.end()) return it->second;
  if (splits_.size() >= 256) splits_.clear();  // many shapes (packed batches' longest lengths): bounded
  return splits_[key] = backend_->plan_splits(*module_, shape);
}

Status AttentionRunner::forward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k,
                                const TensorRef& v, const MutableTensorRef& o, DevicePtr params,
                                const StateRefs& state, DevicePtr cu_seqlens) {
  if (source().pass != Pass::forward || source().entry("decode_step") != nullptr)
    return Error::invalid(fmt::format("{}: forward() called on a {} runner", source().name,
                                      source().entry("decode_step") ? "decode" : to_string(source().pass)));
  if (has_state(state))
    if (auto st = check_decode_support(spec()); !st)
      return Error::invalid(fmt::format("{}: carried state: {}", source().name, st.error().message));
  auto plan = plan_launches(spec(), config(), Pass::forward, shape, splits_for(shape));
  if (!plan) return plan.error();
  auto ws = workspace(plan->workspace_floats);
  if (!ws) return ws.error();
  ForwardArgs args{};
  args.problem = {shape.batch, shape.heads, shape.seq};
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.params = reinterpret_cast<const float*>(params);
  args.workspace = *ws;
  args.initial_S = reinterpret_cast<const float*>(state.initial_S);
  args.initial_z = reinterpret_cast<const float*>(state.initial_z);
  args.final_S = reinterpret_cast<float*>(state.final_S);
  args.final_z = reinterpret_cast<float*>(state.final_z);
  args.cu_seqlens = reinterpret_cast<const int*>(cu_seqlens);
  args.splits = plan->splits;
  return launch_plan(*plan, &args);
}

Status AttentionRunner::decode(const ProblemShape& shape, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                               const MutableTensorRef& o, DevicePtr params, DevicePtr state_S, DevicePtr state_z) {
  if (source().entry("decode_step") == nullptr)
    return Error::invalid(fmt::format("{}: decode() called on a runner without the decode kernel (create_decode)",
                                      source().name));
  if (shape.seq != 1)
    return Error::invalid(fmt::format("{}: decode: seq must be 1 (one new token per sequence), got {}", source().name,
                                      shape.seq));
  if (state_S == 0 || state_z == 0)
    return Error::invalid(fmt::format("{}: decode: state_S and state_z are required (zeros for an empty prefix)",
                                      source().name));
  auto plan = plan_decode(spec(), config(), shape);
  if (!plan) return plan.error();
  DecodeArgs args{};
  args.problem = {shape.batch, shape.heads, 1};
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.params = reinterpret_cast<const float*>(params);
  args.state_S = reinterpret_cast<float*>(state_S);
  args.state_z = reinterpret_cast<float*>(state_z);
  return launch_plan(*plan, &args);
}

Status AttentionRunner::backward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k,
                                 const TensorRef& v, const TensorRef& o, const TensorRef& dout,
                                 const MutableTensorRef& dq, const MutableTensorRef& dk, const MutableTensorRef& dv,
                                 DevicePtr params, DevicePtr dparams, const StateGradRefs& state,
                                 DevicePtr cu_seqlens) {
  if (source().pass != Pass::backward)
    return Error::invalid(fmt::format("{}: backward() called on a {} runner", source().name, to_string(source().pass)));
  if (has_state(state))
    if (auto st = check_decode_support(spec()); !st)
      return Error::invalid(fmt::format("{}: carried state: {}", source().name, st.error().message));
  auto plan = plan_launches(spec(), config(), Pass::backward, shape, splits_for(shape));
  if (!plan) return plan.error();
  auto ws = workspace(plan->workspace_floats);
  if (!ws) return ws.error();
  BackwardArgs args{};
  args.problem = {shape.batch, shape.heads, shape.seq};
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.dout = dout;
  args.dq = dq;
  args.dk = dk;
  args.dv = dv;
  args.params = reinterpret_cast<const float*>(params);
  args.dparams = reinterpret_cast<float*>(dparams);
  args.workspace = *ws;
  args.initial_S = reinterpret_cast<const float*>(state.initial_S);
  args.initial_z = reinterpret_cast<const float*>(state.initial_z);
  args.dfinal_S = reinterpret_cast<const float*>(state.dfinal_S);
  args.dfinal_z = reinterpret_cast<const float*>(state.dfinal_z);
  args.dinitial_S = reinterpret_cast<float*>(state.dinitial_S);
  args.dinitial_z = reinterpret_cast<float*>(state.dinitial_z);
  args.cu_seqlens = reinterpret_cast<const int*>(cu_seqlens);
  args.splits = plan->splits;
  return launch_plan(*plan, &args);
}

Status AttentionRunner::feature_map(const ProblemShape& shape, const TensorRef& x, DevicePtr phi, DevicePtr params,
                                    bool is_query) {
  if (source().pass != Pass::feature_map)
    return Error::invalid(
        fmt::format("{}: feature_map() called on a {} runner", source().name, to_string(source().pass)));
  auto plan = plan_launches(spec(), config(), Pass::feature_map, shape);
  if (!plan) return plan.error();
  auto ws = workspace(plan->workspace_floats);
  if (!ws) return ws.error();
  FeatureMapArgs args{};
  args.problem = {shape.batch, shape.heads, shape.seq};
  args.x = x;
  args.phi = reinterpret_cast<float*>(phi);
  args.params = reinterpret_cast<const float*>(params);
  args.key_stab = *ws;
  args.is_query = is_query ? 1 : 0;
  // Queries need no key stabiliser: skip key_stab_kernel for them.
  if (is_query && spec().family == Family::performer) plan->launches.erase(plan->launches.begin());
  return launch_plan(*plan, &args);
}

}  // namespace lunajit
