#include "autotune/validation.h"

#include <chrono>
#include <cmath>
#include <random>

#include <unistd.h>

#include <fmt/format.h>

#include "codegen/feature_params.h"
#include "common/numeric.h"
#include "reference/reference.h"
#include "autotune/forward_probe.h"
#include "runtime/attention_runner.h"

namespace lunajit {
namespace {

// rel_rms = rms(got - ref) / max(rms(ref), scale): `scale` is the magnitude a
// tensor's rounding error is made of when its exact value cancels (see
// check_backward in validation.h); 0 judges it against its own rms.
TensorError compare(std::string name, const std::vector<double>& got, const std::vector<double>& want,
                    double tolerance, double scale = 0) {
  const ErrorStats s = measure_error(got, want);
  TensorError e;
  e.name = std::move(name);
  e.max_abs_error = s.max_abs_error;
  e.rms_reference = s.rms_reference;
  e.nonfinite = s.nonfinite;
  const double denom = std::max(s.rms_reference, scale);
  // A gradient that is exactly zero in the reference and has no scale (e.g.
  // relu features that are all off) is judged in absolute terms.
  e.rel_rms = denom > 1e-12 ? s.rms_error / denom : s.rms_error;
  e.pass = s.finite() && e.rel_rms <= tolerance;
  return e;
}

// Units of fp32 roundoff (2^-24) of the terms' magnitude allowed to a gradient
// whose exact value cancels (check_backward in validation.h).
constexpr double kParamRoundingUnits = 16;

double rms_of(const std::vector<double>& t) {
  double sq = 0;
  for (double x : t) sq += x * x;
  return t.empty() ? 0.0 : std::sqrt(sq / double(t.size()));
}

// compare(), and a pass within the fp32 rounding floor of the terms (see
// check_backward in validation.h): an error within 16 u of the magnitude of
// the terms the gradient sums is what any fp32 evaluation of them carries.
TensorError compare_with_floor(std::string name, const std::vector<double>& got, const std::vector<double>& want,
                               const std::vector<double>& terms, double tolerance, double scale) {
  TensorError e = compare(std::move(name), got, want, tolerance, scale);
  e.rounding_floor = kParamRoundingUnits * std::ldexp(1.0, -24) * rms_of(terms);
  const double rms_err = measure_error(got, want).rms_error;
  if (!e.pass && e.nonfinite == 0 && std::isfinite(rms_err) && rms_err <= e.rounding_floor) {
    e.pass = true;
    e.within_rounding_floor = true;
  }
  return e;
}

}  // namespace

int64_t check_host_bytes(const AttentionSpec& spec, const ProblemShape& s, bool backward) {
  // Per (batch, token, head) row: q, k, v drawn as doubles and rounded to the
  // I/O dtype, their copies on the backend, the output (kernel and reference,
  // as doubles) and the reference's phi(q), phi(k) in double. The backward adds
  // the upstream gradient, dq, dk, dv in the same forms.
  const int64_t d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim(), eb = dtype_bytes(spec.dtype);
  const int64_t io = 2 * d + dv;
  int64_t per_row = io * (8 + 2 * eb) + dv * (eb + 16) + 2 * D * 8;
  if (backward) per_row += (dv + io) * (8 + 2 * eb) + io * 8;
  const long double rows = (long double)s.batch * s.seq * s.heads;
  const long double bytes = rows * per_row;
  return bytes > (long double)INT64_MAX ? INT64_MAX : static_cast<int64_t>(bytes);
}

Status check_host_memory(const AttentionSpec& spec, const ProblemShape& s, bool backward) {
  if (auto st = validate(s); !st) return st;
  const int64_t need = check_host_bytes(spec, s, backward);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const int64_t have = pages > 0 && page > 0 ? int64_t(pages) * page : INT64_MAX;
  if (need > have)
    return Error::invalid(fmt::format(
        "batch {} heads {} seq {}: the {} check needs about {:.1f} GiB of host memory (inputs, outputs and the "
        "double-precision reference); this machine has {:.1f} GiB; use a smaller shape",
        s.batch, s.heads, s.seq, backward ? "backward" : "forward", double(need) / (1ull << 30),
        double(have) / (1ull << 30)));
  return ok_status();
}

double forward_tolerance(DType dtype) { return dtype == DType::fp32 ? 1e-5 : 1e-2; }

double parameter_gradient_tolerance(DType dtype) { return dtype == DType::fp32 ? 1e-5 : 3e-2; }



Result<CheckReport> check_forward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                  const CheckOptions& opt) {
  if (auto st = check_host_memory(spec, opt.shape, false); !st) return st.error();
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
  if (auto st = check_host_memory(spec, s, true); !st) return st.error();
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
  rep.tensors.push_back(
      compare_with_floor("dq", decode_values(rep.dq, spec.dtype), ref->dq, ref->dq_terms, rep.tolerance, 0));
  rep.tensors.push_back(
      compare_with_floor("dk", decode_values(rep.dk, spec.dtype), ref->dk, ref->dk_terms, rep.tolerance, 0));
  rep.tensors.push_back(
      compare_with_floor("dv", decode_values(rep.dv, spec.dtype), ref->dv, ref->dv_terms, rep.tolerance, 0));
  const ParamLayout layout = param_layout(spec);
  const int blocks = spec.params_per_head ? s.heads : 1;
  // Parameter gradients: judged against the scale of all of them (see the header).
  struct ParamGrad {
    std::string name;
    std::vector<double> got, want, terms;
  };
  std::vector<ParamGrad> params;
  double all_sq = 0;
  size_t all_n = 0;
  for (const auto& t : layout.tensors) {
    if (!t.learned) continue;
    ParamGrad g{"d" + t.name, {}, {}, {}};
    for (int b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t at = b * layout.per_head_floats + t.offset + i;
        g.got.push_back(rep.dparams[at]);
        g.want.push_back(ref->dparams[at]);
        g.terms.push_back(ref->dparams_terms.empty() ? 0.0 : ref->dparams_terms[at]);
        all_sq += ref->dparams[at] * ref->dparams[at];
        ++all_n;
      }
    params.push_back(std::move(g));
  }
  const double scale = all_n ? std::sqrt(all_sq / double(all_n)) : 0.0;
  for (auto& g : params)
    rep.tensors.push_back(compare_with_floor(g.name, g.got, g.want, g.terms, rep.parameter_tolerance, scale));
  rep.pass = true;
  for (const auto& t : rep.tensors) rep.pass &= t.pass;
  return rep;
}

}  // namespace lunajit
