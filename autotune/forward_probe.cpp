#include "autotune/forward_probe.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codegen/feature_params.h"
#include "common/numeric.h"
#include "reference/reference.h"
#include "runtime/attention_runner.h"

namespace lunajit {

std::vector<uint8_t> encode_rounded(std::vector<double>& values, DType dtype) {
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

std::vector<double> decode_values(const std::vector<uint8_t>& bytes, DType dtype) {
  const int eb = dtype_bytes(dtype);
  std::vector<double> out(bytes.size() / eb);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = &bytes[i * eb];
    if (dtype == DType::fp32) {
      float f;
      std::memcpy(&f, p, 4);
      out[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, p, 2);
      out[i] = dtype == DType::fp16 ? fp16_bits_to_float(b) : bf16_bits_to_float(b);
    }
  }
  return out;
}

Result<DeviceTensor> make_device_tensor(Backend& backend, const ProblemShape& s, int dim, DType dtype) {
  auto b = backend.allocate(size_t(s.batch) * s.seq * s.heads * dim * dtype_bytes(dtype));
  if (!b) return b.error();
  DeviceTensor t;
  t.buf = std::move(*b);
  if (auto st = backend.fill_zero(t.buf); !st) return st.error();
  t.ref = {t.buf.as_pointer(), int64_t(s.seq) * s.heads * dim, int64_t(s.heads) * dim, dim};
  return t;
}

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
  p.q_bytes_ = encode_rounded(p.q_, spec.dtype);
  p.k_bytes_ = encode_rounded(p.k_, spec.dtype);
  p.v_bytes_ = encode_rounded(p.v_, spec.dtype);
  return p;
}

Result<ForwardProbe::DeviceInputs> ForwardProbe::upload(Backend& backend) const {
  const ProblemShape& s = options_.shape;
  const int d = spec_.head_dim, dv = spec_.value_dim;
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  const int eb = dtype_bytes(spec_.dtype);
  DeviceInputs in;
  auto upload_bytes = [&](const void* host, size_t bytes, Buffer& buf) -> Status {
    auto b = backend.allocate(std::max<size_t>(bytes, 1));
    if (!b) return b.error();
    buf = std::move(*b);
    if (bytes > 0) return backend.copy_to_device(buf, host, bytes);
    return ok_status();
  };
  if (options_.layout == InputLayout::fused_qkv) {
    // One [batch, seq, heads, d + d + dv] buffer, as a fused QKV projection writes it.
    const int64_t width = 2 * d + dv;
    std::vector<uint8_t> fused(rows * width * eb);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&fused[(r * width) * eb], &q_bytes_[r * d * eb], d * eb);
      std::memcpy(&fused[(r * width + d) * eb], &k_bytes_[r * d * eb], d * eb);
      std::memcpy(&fused[(r * width + 2 * d) * eb], &v_bytes_[r * dv * eb], dv * eb);
    }
    if (auto st = upload_bytes(fused.data(), fused.size(), in.qkv); !st) return st.error();
    const int64_t sh = width, sn = sh * s.heads, sb = sn * s.seq;
    auto* base = static_cast<uint8_t*>(in.qkv.as_pointer());
    in.q = {base, sb, sn, sh};
    in.k = {base + d * eb, sb, sn, sh};
    in.v = {base + 2 * d * eb, sb, sn, sh};
  } else {
    auto contiguous = [&](const std::vector<uint8_t>& host, Buffer& buf, int dim, TensorRef& ref) -> Status {
      if (auto st = upload_bytes(host.data(), host.size(), buf); !st) return st;
      ref = {buf.as_pointer(), int64_t(s.seq) * s.heads * dim, int64_t(s.heads) * dim, dim};
      return ok_status();
    };
    if (auto st = contiguous(q_bytes_, in.q_buf, d, in.q); !st) return st.error();
    if (auto st = contiguous(k_bytes_, in.k_buf, d, in.k); !st) return st.error();
    if (auto st = contiguous(v_bytes_, in.v_buf, dv, in.v); !st) return st.error();
  }
  if (auto st = upload_bytes(params_.data(), params_.size() * sizeof(float), in.params); !st) return st.error();
  return in;
}

Result<std::vector<double>> ForwardProbe::run(Backend& backend, const TileConfig& config,
                                              double* kernel_seconds) const {
  const ProblemShape& s = options_.shape;
  auto in = upload(backend);
  if (!in) return in.error();
  auto o = make_device_tensor(backend, s, spec_.value_dim, spec_.dtype);
  if (!o) return o.error();
  auto runner = AttentionRunner::create(backend, spec_, config, Pass::forward);
  if (!runner) return runner.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = runner->forward(s, in->q, in->k, in->v, o->ref, in->params.ptr()); !st) return st.error();
  if (auto st = backend.synchronize(); !st) return st.error();
  if (kernel_seconds != nullptr)
    *kernel_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<uint8_t> out(o->buf.bytes());
  if (auto st = backend.copy_to_host(out.data(), o->buf, out.size()); !st) return st.error();
  return decode_values(out, spec_.dtype);
}

Result<std::vector<double>> ForwardProbe::reference() const {
  const ProblemShape& s = options_.shape;
  const reference::AttentionShape rshape{s.batch, s.seq, s.heads};
  auto r = reference::linear_attention_forward(options_.reference_spec.value_or(spec_), rshape, q_, k_, v_,
                                               reference::to_double(params_));
  if (!r) return r.error();
  return std::move(r->out);
}

ErrorStats measure_error(const std::vector<double>& got, const std::vector<double>& want) {
  ErrorStats e;
  double se = 0, sr = 0;
  const size_t n = std::min(got.size(), want.size());
  e.size_mismatch = got.size() != want.size();
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) {
      ++e.nonfinite;
      continue;
    }
    const double diff = std::abs(got[i] - want[i]);
    e.max_abs_error = std::max(e.max_abs_error, diff);
    se += diff * diff;
    sr += want[i] * want[i];
  }
  const double count = std::max<double>(double(n), 1);
  e.rms_error = std::sqrt(se / count);
  e.rms_reference = std::sqrt(sr / count);
  // A non-finite value is an infinite error, never "max abs error 0".
  if (e.nonfinite > 0 || e.size_mismatch) {
    e.max_abs_error = std::numeric_limits<double>::infinity();
    e.rms_error = std::numeric_limits<double>::infinity();
  }
  return e;
}

CheckReport compare_outputs(const std::vector<double>& got, const std::vector<double>& want, DType dtype) {
  const ErrorStats e = measure_error(got, want);
  CheckReport rep;
  rep.max_abs_error = e.max_abs_error;
  rep.rms_error = e.rms_error;
  rep.rms_reference = e.rms_reference;
  rep.nonfinite = e.nonfinite;
  rep.rel_rms = rep.rms_reference > 0 ? rep.rms_error / rep.rms_reference : rep.rms_error;
  rep.tolerance = forward_tolerance(dtype);
  rep.pass = e.finite() && rep.rel_rms <= rep.tolerance;
  return rep;
}

}  // namespace lunajit
