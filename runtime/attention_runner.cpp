#include "runtime/attention_runner.h"

#include <fmt/format.h>

namespace lunajit {

Result<AttentionRunner> AttentionRunner::create(Backend& backend, const AttentionSpec& spec,
                                                const TileConfig& config, Pass pass) {
  auto src = generate(spec, config, pass);
  if (!src) return src.error();
  auto module = backend.load(*src);
  if (!module) return module.error();
  return AttentionRunner(backend, std::move(*module));
}

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

Status AttentionRunner::forward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k,
                                const TensorRef& v, const MutableTensorRef& o, DevicePtr params,
                                DevicePtr cu_seqlens) {
  if (source().pass != Pass::forward)
    return Error::invalid(fmt::format("{}: forward() called on a {} runner", source().name, to_string(source().pass)));
  auto plan = plan_launches(spec(), config(), Pass::forward, shape);
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
  args.cu_seqlens = reinterpret_cast<const int*>(cu_seqlens);
  return launch_plan(*plan, &args);
}

Status AttentionRunner::backward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k,
                                 const TensorRef& v, const TensorRef& o, const TensorRef& dout,
                                 const MutableTensorRef& dq, const MutableTensorRef& dk, const MutableTensorRef& dv,
                                 DevicePtr params, DevicePtr dparams, DevicePtr cu_seqlens) {
  if (source().pass != Pass::backward)
    return Error::invalid(fmt::format("{}: backward() called on a {} runner", source().name, to_string(source().pass)));
  auto plan = plan_launches(spec(), config(), Pass::backward, shape);
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
  args.cu_seqlens = reinterpret_cast<const int*>(cu_seqlens);
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
