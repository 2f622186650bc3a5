#include "autotune/validation.h"

#include <chrono>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "codegen/feature_params.h"
#include "common/numeric.h"
#include "reference/reference.h"
#include "autotune/forward_probe.h"
#include "runtime/attention_runner.h"

namespace lunajit {
namespace {

TensorError compare(std::string name, const std::vector<double>& got, const std::vector<double>& want,
                    double tolerance) {
  TensorError e;
  e.name = std::move(name);
  double se = 0, sr = 0;
  bool finite = true;
  for (size_t i = 0; i < want.size(); ++i) {
    finite &= std::isfinite(got[i]);
    const double diff = std::abs(got[i] - want[i]);
    e.max_abs_error = std::max(e.max_abs_error, diff);
    se += diff * diff;
    sr += want[i] * want[i];
  }
  const double n = std::max<size_t>(want.size(), 1);
  e.rms_reference = std::sqrt(sr / n);
  // A gradient that is exactly zero in the reference (e.g. relu features that
  // are all off) is judged in absolute terms.
  e.rel_rms = e.rms_reference > 1e-12 ? std::sqrt(se / n) / e.rms_reference : std::sqrt(se / n);
  e.pass = finite && e.rel_rms <= tolerance;
  if (!finite) e.rel_rms = std::numeric_limits<double>::infinity();
  return e;
}

}  // namespace

double forward_tolerance(DType dtype) { return dtype == DType::fp32 ? 1e-5 : 1e-2; }

double parameter_gradient_tolerance(DType dtype) { return dtype == DType::fp32 ? 1e-5 : 3e-2; }



Result<CheckReport> check_forward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                  const CheckOptions& opt) {
  auto probe = ForwardProbe::create(spec, opt);
  if (!probe) return probe.error();
  double seconds = 0;
  auto out = probe->run(backend, config, &seconds);
  if (!out) return out.error();
  auto ref = probe->reference();
  if (!ref) return ref.error();
  CheckReport rep = compare_outputs(*out, *ref, spec.dtype);
  rep.kernel_seconds = seconds;
  rep.kernel_name = generate(spec, config, Pass::forward).value_or_throw().name;
  return rep;
}

Result<BackwardCheckReport> check_backward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                           const CheckOptions& opt) {
  const ProblemShape& s = opt.shape;
  if (auto st = validate(s); !st) return st.error();
  auto probe = ForwardProbe::create(spec, opt);
  if (!probe) return probe.error();
  auto in = probe->upload(backend);
  if (!in) return in.error();
  const int d = spec.head_dim, dv = spec.value_dim;
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  // The upstream gradient, from its own stream so the inputs match check_forward's.
  std::mt19937_64 gen(opt.seed ^ 0x9E3779B97F4A7C15ull);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> dout(rows * dv);
  for (auto& x : dout) x = dist(gen);
  const std::vector<uint8_t> dout_bytes = encode_rounded(dout, spec.dtype);

  auto o = make_device_tensor(backend, s, dv, spec.dtype);
  auto g = make_device_tensor(backend, s, dv, spec.dtype);
  auto dq = make_device_tensor(backend, s, d, spec.dtype);
  auto dk = make_device_tensor(backend, s, d, spec.dtype);
  auto dvt = make_device_tensor(backend, s, dv, spec.dtype);
  for (auto* t : {&o, &g, &dq, &dk, &dvt})
    if (!*t) return t->error();
  if (auto st = backend.copy_to_device(g->buf, dout_bytes.data(), dout_bytes.size()); !st) return st.error();
  const size_t param_floats = std::max<size_t>(probe->params().size(), 1);
  auto dparams = backend.allocate(param_floats * sizeof(float));
  if (!dparams) return dparams.error();
  if (auto st = backend.fill_zero(*dparams); !st) return st.error();

  // The forward with the forward's default config for this arch-independent
  // check: the backward consumes o whatever config produced it.
  auto fwd = AttentionRunner::create(backend, spec, default_config(spec, arch_from_sm(90).value_or_throw()),
                                     Pass::forward);
  if (!fwd) return fwd.error();
  if (auto st = fwd->forward(s, in->q, in->k, in->v, o->ref, in->params.ptr()); !st)
    return st.error();
  auto bwd = AttentionRunner::create(backend, spec, config, Pass::backward);
  if (!bwd) return bwd.error();
  if (auto st = backend.synchronize(); !st) return st.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = bwd->backward(s, in->q, in->k, in->v, o->cref(), g->cref(), dq->ref, dk->ref, dvt->ref,
                              in->params.ptr(), dparams->ptr());
      !st)
    return st.error();
  if (auto st = backend.synchronize(); !st) return st.error();
  const auto t1 = std::chrono::steady_clock::now();

  BackwardCheckReport rep;
  rep.kernel_name = bwd->source().name;
  rep.kernel_seconds = std::chrono::duration<double>(t1 - t0).count();
  rep.tolerance = forward_tolerance(spec.dtype);
  rep.parameter_tolerance = parameter_gradient_tolerance(spec.dtype);
  const int eb = dtype_bytes(spec.dtype);
  rep.dq.resize(rows * d * eb);
  rep.dk.resize(rows * d * eb);
  rep.dv.resize(rows * dv * eb);
  rep.dparams.resize(probe->params().size());
  if (auto st = backend.copy_to_host(rep.dq.data(), dq->buf, rep.dq.size()); !st) return st.error();
  if (auto st = backend.copy_to_host(rep.dk.data(), dk->buf, rep.dk.size()); !st) return st.error();
  if (auto st = backend.copy_to_host(rep.dv.data(), dvt->buf, rep.dv.size()); !st) return st.error();
  if (!rep.dparams.empty())
    if (auto st = backend.copy_to_host(rep.dparams.data(), *dparams, rep.dparams.size() * sizeof(float)); !st)
      return st.error();

  const reference::AttentionShape rshape{s.batch, s.seq, s.heads};
  const std::vector<double> pd = reference::to_double(probe->params());
  auto ref = reference::linear_attention_backward(opt.reference_spec.value_or(spec), rshape, probe->q(), probe->k(),
                                                  probe->v(), pd, dout);
  if (!ref) return ref.error();
  rep.tensors.push_back(compare("dq", decode_values(rep.dq, spec.dtype), ref->dq, rep.tolerance));
  rep.tensors.push_back(compare("dk", decode_values(rep.dk, spec.dtype), ref->dk, rep.tolerance));
  rep.tensors.push_back(compare("dv", decode_values(rep.dv, spec.dtype), ref->dv, rep.tolerance));
  const ParamLayout layout = param_layout(spec);
  const int blocks = spec.params_per_head ? s.heads : 1;
  // Parameter gradients: judged against the scale of all of them (see the header).
  std::vector<std::pair<std::string, std::pair<std::vector<double>, std::vector<double>>>> params;
  double all_sq = 0;
  size_t all_n = 0;
  for (const auto& t : layout.tensors) {
    if (!t.learned) continue;
    std::vector<double> got, want;
    for (int b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t at = b * layout.per_head_floats + t.offset + i;
        got.push_back(rep.dparams[at]);
        want.push_back(ref->dparams[at]);
        all_sq += ref->dparams[at] * ref->dparams[at];
        ++all_n;
      }
    params.push_back({"d" + t.name, {std::move(got), std::move(want)}});
  }
  const double scale = all_n ? std::sqrt(all_sq / double(all_n)) : 0.0;
  for (auto& [name, gw] : params) {
    TensorError e = compare(name, gw.first, gw.second, rep.parameter_tolerance);
    if (e.rms_reference < scale && std::isfinite(e.rel_rms)) {
      const double abs_rms = e.rms_reference > 1e-12 ? e.rel_rms * e.rms_reference : e.rel_rms;
      e.rel_rms = abs_rms / scale;
      e.pass = e.rel_rms <= rep.parameter_tolerance;
    }
    rep.tensors.push_back(e);
  }
  rep.pass = true;
  for (const auto& t : rep.tensors) rep.pass &= t.pass;
  return rep;
}

}  // namespace lunajit
