#include "autotune/forward_probe.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codegen/feature_params.h"
#include "common/numeric.h"
#include "reference/reference.h"
#include "runtime/attention_runner.h"

namespace lunajit {
namespace {

// Bytes of `values` in `dtype`, rounding `values` in place to what the dtype holds.
std::vector<uint8_t> encode(std::vector<double>& values, DType dtype) {
  const int eb = dtype_bytes(dtype);
  std::vector<uint8_t> out(values.size() * eb);
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    if (dtype == DType::fp32) {
      std::memcpy(&out[i * 4], &f, 4);
      values[i] = f;
    } else {
      const uint16_t b = dtype == DType::fp16 ? float_to_fp16_bits(f) : float_to_bf16_bits(f);
      std::memcpy(&out[i * 2], &b, 2);
      values[i] = dtype == DType::fp16 ? fp16_bits_to_float(b) : bf16_bits_to_float(b);
    }
  }
  return out;
}

double decode(const uint8_t* p, DType dtype) {
  if (dtype == DType::fp32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return dtype == DType::fp16 ? fp16_bits_to_float(b) : bf16_bits_to_float(b);
}

}  // namespace

Result<ForwardProbe> ForwardProbe::create(const AttentionSpec& spec, const CheckOptions& opt) {
  const ProblemShape& s = opt.shape;
  if (auto st = validate(s); !st) return st.error();
  ForwardProbe p;
  p.spec_ = spec;
  p.options_ = opt;
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  std::mt19937_64 gen(opt.seed);
  std::normal_distribution<double> dist(0.0, opt.input_scale);
  auto draw = [&](int64_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = dist(gen);
    return v;
  };
  p.q_ = draw(rows * spec.head_dim);
  p.k_ = draw(rows * spec.head_dim);
  p.v_ = draw(rows * spec.value_dim);
  p.params_ = init_params(spec, s.heads, opt.seed);
  p.q_bytes_ = encode(p.q_, spec.dtype);
  p.k_bytes_ = encode(p.k_, spec.dtype);
  p.v_bytes_ = encode(p.v_, spec.dtype);
  return p;
}

Result<std::vector<double>> ForwardProbe::run(Backend& backend, const TileConfig& config) const {
  const ProblemShape& s = options_.shape;
  const int eb = dtype_bytes(spec_.dtype);
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  auto upload = [&](const std::vector<uint8_t>& host) -> Result<Buffer> {
    auto b = backend.allocate(std::max<size_t>(host.size(), 1));
    if (!b) return b.error();
    if (!host.empty())
      if (auto st = backend.copy_to_device(*b, host.data(), host.size()); !st) return st.error();
    return std::move(*b);
  };
  auto qb = upload(q_bytes_);
  if (!qb) return qb.error();
  auto kb = upload(k_bytes_);
  if (!kb) return kb.error();
  auto vb = upload(v_bytes_);
  if (!vb) return vb.error();
  std::vector<uint8_t> pbytes(params_.size() * sizeof(float));
  if (!params_.empty()) std::memcpy(pbytes.data(), params_.data(), pbytes.size());
  auto pb = upload(pbytes);
  if (!pb) return pb.error();
  auto ob = backend.allocate(rows * spec_.value_dim * eb);
  if (!ob) return ob.error();
  auto ref = [&](const Buffer& b, int dim) {
    return TensorRef{b.as_pointer(), int64_t(s.seq) * s.heads * dim, int64_t(s.heads) * dim, dim};
  };
  const int dv = spec_.value_dim;
  const MutableTensorRef o{ob->as_pointer(), int64_t(s.seq) * s.heads * dv, int64_t(s.heads) * dv, dv};
  auto runner = AttentionRunner::create(backend, spec_, config, Pass::forward);
  if (!runner) return runner.error();
  if (auto st = runner->forward(s, ref(*qb, spec_.head_dim), ref(*kb, spec_.head_dim), ref(*vb, dv), o, pb->ptr());
      !st)
    return st.error();
  if (auto st = backend.synchronize(); !st) return st.error();
  std::vector<uint8_t> out(rows * dv * eb);
  if (auto st = backend.copy_to_host(out.data(), *ob, out.size()); !st) return st.error();
  std::vector<double> result(rows * dv);
  for (int64_t i = 0; i < rows * dv; ++i) result[i] = decode(&out[i * eb], spec_.dtype);
  return result;
}

Result<std::vector<double>> ForwardProbe::reference() const {
  const ProblemShape& s = options_.shape;
  const reference::AttentionShape rshape{s.batch, s.seq, s.heads};
  auto r = reference::linear_attention_forward(options_.reference_spec.value_or(spec_), rshape, q_, k_, v_,
                                               reference::to_double(params_));
  if (!r) return r.error();
  return std::move(r->out);
}

CheckReport compare_outputs(const std::vector<double>& got, const std::vector<double>& want, DType dtype) {
  CheckReport rep;
  double se = 0, sr = 0;
  bool finite = got.size() == want.size();
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    finite &= std::isfinite(got[i]);
    const double e = std::abs(got[i] - want[i]);
    rep.max_abs_error = std::max(rep.max_abs_error, e);
    se += e * e;
    sr += want[i] * want[i];
  }
  const double count = std::max<double>(double(n), 1);
  rep.rms_error = std::sqrt(se / count);
  rep.rms_reference = std::sqrt(sr / count);
  rep.rel_rms = rep.rms_reference > 0 ? rep.rms_error / rep.rms_reference : rep.rms_error;
  rep.tolerance = forward_tolerance(dtype);
  rep.pass = finite && rep.rel_rms <= rep.tolerance;
  if (!finite) rep.rel_rms = std::numeric_limits<double>::infinity();
  return rep;
}

}  // namespace lunajit
