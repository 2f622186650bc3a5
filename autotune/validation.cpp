#include "autotune/validation.h"

#include <chrono>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "codegen/feature_params.h"
#include "common/numeric.h"
#include "reference/reference.h"
#include "runtime/attention_runner.h"

namespace lunajit {
namespace {

// Element bytes of `values` in `dtype`; `values` is rounded in place to what
// the dtype represents, so the reference sees the kernel's exact inputs.
std::vector<uint8_t> encode(std::vector<double>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * dtype_bytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    switch (dtype) {
      case DType::fp32:
        std::memcpy(&out[i * 4], &f, 4);
        values[i] = f;
        break;
      case DType::fp16: {
        const uint16_t b = float_to_fp16_bits(f);
        std::memcpy(&out[i * 2], &b, 2);
        values[i] = fp16_bits_to_float(b);
        break;
      }
      case DType::bf16: {
        const uint16_t b = float_to_bf16_bits(f);
        std::memcpy(&out[i * 2], &b, 2);
        values[i] = bf16_bits_to_float(b);
        break;
      }
    }
  }
  return out;
}

double decode(const uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::fp32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::fp16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return fp16_bits_to_float(b);
    }
    case DType::bf16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16_bits_to_float(b);
    }
  }
  return 0;
}

std::vector<double> random_values(size_t n, std::mt19937_64& gen, double scale) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

}  // namespace

double forward_tolerance(DType dtype) { return dtype == DType::fp32 ? 1e-5 : 1e-2; }

Result<CheckReport> check_forward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                  const CheckOptions& opt) {
  const ProblemShape& s = opt.shape;
  if (auto st = validate(s); !st) return st.error();
  const int d = spec.head_dim, dv = spec.value_dim;
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  std::mt19937_64 gen(opt.seed);
  std::vector<double> q = random_values(rows * d, gen, opt.input_scale);
  std::vector<double> k = random_values(rows * d, gen, opt.input_scale);
  std::vector<double> v = random_values(rows * dv, gen, opt.input_scale);
  const std::vector<float> params = init_params(spec, s.heads, opt.seed);
  const std::vector<uint8_t> qb = encode(q, spec.dtype), kb = encode(k, spec.dtype), vb = encode(v, spec.dtype);
  const int eb = dtype_bytes(spec.dtype);

  // Device buffers: either three tensors or one fused [.., d + d + dv] buffer.
  const int64_t fused_width = 2 * d + dv;
  Buffer qkv_buf, q_buf, k_buf, v_buf;
  TensorRef qr{}, kr{}, vr{};
  auto alloc = [&](size_t bytes) { return backend.allocate(bytes); };
  if (opt.layout == InputLayout::fused_qkv) {
    std::vector<uint8_t> fused(rows * fused_width * eb);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&fused[(r * fused_width) * eb], &qb[r * d * eb], d * eb);
      std::memcpy(&fused[(r * fused_width + d) * eb], &kb[r * d * eb], d * eb);
      std::memcpy(&fused[(r * fused_width + 2 * d) * eb], &vb[r * dv * eb], dv * eb);
    }
    auto b = alloc(fused.size());
    if (!b) return b.error();
    qkv_buf = std::move(*b);
    if (auto st = backend.copy_to_device(qkv_buf, fused.data(), fused.size()); !st) return st.error();
    const int64_t sh = fused_width, sn = sh * s.heads, sb = sn * s.seq;
    auto* base = static_cast<uint8_t*>(qkv_buf.as_pointer());
    qr = {base, sb, sn, sh};
    kr = {base + d * eb, sb, sn, sh};
    vr = {base + 2 * d * eb, sb, sn, sh};
  } else {
    auto upload = [&](const std::vector<uint8_t>& host, Buffer& buf, int dim, TensorRef& ref) -> Status {
      auto b = alloc(host.size());
      if (!b) return b.error();
      buf = std::move(*b);
      if (auto st = backend.copy_to_device(buf, host.data(), host.size()); !st) return st;
      ref = {buf.as_pointer(), int64_t(s.seq) * s.heads * dim, int64_t(s.heads) * dim, dim};
      return ok_status();
    };
    if (auto st = upload(qb, q_buf, d, qr); !st) return st.error();
    if (auto st = upload(kb, k_buf, d, kr); !st) return st.error();
    if (auto st = upload(vb, v_buf, dv, vr); !st) return st.error();
  }
  auto o_buf = alloc(rows * dv * eb);
  if (!o_buf) return o_buf.error();
  auto p_buf = alloc(std::max<size_t>(params.size(), 1) * sizeof(float));
  if (!p_buf) return p_buf.error();
  if (!params.empty())
    if (auto st = backend.copy_to_device(*p_buf, params.data(), params.size() * sizeof(float)); !st)
      return st.error();
  const MutableTensorRef orf{o_buf->as_pointer(), int64_t(s.seq) * s.heads * dv, int64_t(s.heads) * dv, dv};

  auto runner = AttentionRunner::create(backend, spec, config, Pass::forward);
  if (!runner) return runner.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = runner->forward(s, qr, kr, vr, orf, p_buf->ptr()); !st) return st.error();
  if (auto st = backend.synchronize(); !st) return st.error();
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<uint8_t> out(rows * dv * eb);
  if (auto st = backend.copy_to_host(out.data(), *o_buf, out.size()); !st) return st.error();

  const reference::AttentionShape rshape{s.batch, s.seq, s.heads};
  const std::vector<double> pd = reference::to_double(params);
  auto ref = reference::linear_attention_forward(opt.reference_spec.value_or(spec), rshape, q, k, v, pd);
  if (!ref) return ref.error();

  CheckReport rep;
  rep.kernel_name = runner->source().name;
  rep.kernel_seconds = std::chrono::duration<double>(t1 - t0).count();
  double se = 0, sr = 0;
  bool finite = true;
  for (int64_t i = 0; i < rows * dv; ++i) {
    const double got = decode(&out[i * eb], spec.dtype);
    const double want = ref->out[i];
    finite &= std::isfinite(got);
    const double e = std::abs(got - want);
    rep.max_abs_error = std::max(rep.max_abs_error, e);
    se += e * e;
    sr += want * want;
  }
  rep.rms_error = std::sqrt(se / double(rows * dv));
  rep.rms_reference = std::sqrt(sr / double(rows * dv));
  rep.rel_rms = rep.rms_reference > 0 ? rep.rms_error / rep.rms_reference : rep.rms_error;
  rep.tolerance = forward_tolerance(spec.dtype);
  rep.pass = finite && rep.rel_rms <= rep.tolerance;
  if (!finite) rep.rel_rms = std::numeric_limits<double>::infinity();
  return rep;
}

}  // namespace lunajit
