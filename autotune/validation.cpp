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


// Random q, k, v (rounded to the dtype) on the device, in the requested layout.
struct DeviceInputs {
  std::vector<double> q, k, v;  // what the reference sees
  std::vector<float> params;
  Buffer qkv, qb, kb, vb, params_buf;
  TensorRef q_ref{}, k_ref{}, v_ref{};
};

Result<DeviceInputs> make_inputs(Backend& backend, const AttentionSpec& spec, const CheckOptions& opt,
                                 std::mt19937_64& gen) {
  const ProblemShape& s = opt.shape;
  const int d = spec.head_dim, dv = spec.value_dim;
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  DeviceInputs in;
  in.q = random_values(rows * d, gen, opt.input_scale);
  in.k = random_values(rows * d, gen, opt.input_scale);
  in.v = random_values(rows * dv, gen, opt.input_scale);
  in.params = init_params(spec, s.heads, opt.seed);
  const std::vector<uint8_t> qb = encode(in.q, spec.dtype), kb = encode(in.k, spec.dtype),
                             vb = encode(in.v, spec.dtype);
  const int eb = dtype_bytes(spec.dtype);
  if (opt.layout == InputLayout::fused_qkv) {
    const int64_t width = 2 * d + dv;
    std::vector<uint8_t> fused(rows * width * eb);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&fused[(r * width) * eb], &qb[r * d * eb], d * eb);
      std::memcpy(&fused[(r * width + d) * eb], &kb[r * d * eb], d * eb);
      std::memcpy(&fused[(r * width + 2 * d) * eb], &vb[r * dv * eb], dv * eb);
    }
    auto b = backend.allocate(fused.size());
    if (!b) return b.error();
    in.qkv = std::move(*b);
    if (auto st = backend.copy_to_device(in.qkv, fused.data(), fused.size()); !st) return st.error();
    const int64_t sh = width, sn = sh * s.heads, sb = sn * s.seq;
    auto* base = static_cast<uint8_t*>(in.qkv.as_pointer());
    in.q_ref = {base, sb, sn, sh};
    in.k_ref = {base + d * eb, sb, sn, sh};
    in.v_ref = {base + 2 * d * eb, sb, sn, sh};
  } else {
    auto upload = [&](const std::vector<uint8_t>& host, Buffer& buf, int dim, TensorRef& ref) -> Status {
      auto b = backend.allocate(host.size());
      if (!b) return b.error();
      buf = std::move(*b);
      if (auto st = backend.copy_to_device(buf, host.data(), host.size()); !st) return st;
      ref = {buf.as_pointer(), int64_t(s.seq) * s.heads * dim, int64_t(s.heads) * dim, dim};
      return ok_status();
    };
    if (auto st = upload(qb, in.qb, d, in.q_ref); !st) return st.error();
    if (auto st = upload(kb, in.kb, d, in.k_ref); !st) return st.error();
    if (auto st = upload(vb, in.vb, dv, in.v_ref); !st) return st.error();
  }
  auto p = backend.allocate(std::max<size_t>(in.params.size(), 1) * sizeof(float));
  if (!p) return p.error();
  in.params_buf = std::move(*p);
  if (!in.params.empty())
    if (auto st = backend.copy_to_device(in.params_buf, in.params.data(), in.params.size() * sizeof(float)); !st)
      return st.error();
  return in;
}

// A contiguous [batch, seq, heads, dim] device tensor of the I/O dtype.
struct DeviceTensor {
  Buffer buf;
  MutableTensorRef ref{};
  TensorRef cref() const { return {ref.data, ref.stride_batch, ref.stride_seq, ref.stride_head}; }
};

Result<DeviceTensor> make_tensor(Backend& backend, const ProblemShape& s, int dim, DType dtype) {
  auto b = backend.allocate(size_t(s.batch) * s.seq * s.heads * dim * dtype_bytes(dtype));
  if (!b) return b.error();
  DeviceTensor t;
  t.buf = std::move(*b);
  if (auto st = backend.fill_zero(t.buf); !st) return st.error();
  t.ref = {t.buf.as_pointer(), int64_t(s.seq) * s.heads * dim, int64_t(s.heads) * dim, dim};
  return t;
}

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

std::vector<double> decode_all(const std::vector<uint8_t>& bytes, DType dtype) {
  const int eb = dtype_bytes(dtype);
  std::vector<double> out(bytes.size() / eb);
  for (size_t i = 0; i < out.size(); ++i) out[i] = decode(&bytes[i * eb], dtype);
  return out;
}

}  // namespace

double forward_tolerance(DType dtype) { return dtype == DType::fp32 ? 1e-5 : 1e-2; }

double parameter_gradient_tolerance(DType dtype) { return dtype == DType::fp32 ? 1e-5 : 3e-2; }



Result<CheckReport> check_forward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                  const CheckOptions& opt) {
  const ProblemShape& s = opt.shape;
  if (auto st = validate(s); !st) return st.error();
  std::mt19937_64 gen(opt.seed);
  auto in = make_inputs(backend, spec, opt, gen);
  if (!in) return in.error();
  const int dv = spec.value_dim;
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  const int eb = dtype_bytes(spec.dtype);
  auto o = make_tensor(backend, s, dv, spec.dtype);
  if (!o) return o.error();

  auto runner = AttentionRunner::create(backend, spec, config, Pass::forward);
  if (!runner) return runner.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = runner->forward(s, in->q_ref, in->k_ref, in->v_ref, o->ref, in->params_buf.ptr()); !st)
    return st.error();
  if (auto st = backend.synchronize(); !st) return st.error();
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<uint8_t> out(rows * dv * eb);
  if (auto st = backend.copy_to_host(out.data(), o->buf, out.size()); !st) return st.error();

  const reference::AttentionShape rshape{s.batch, s.seq, s.heads};
  const std::vector<double> pd = reference::to_double(in->params);
  auto ref = reference::linear_attention_forward(opt.reference_spec.value_or(spec), rshape, in->q, in->k, in->v, pd);
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

Result<BackwardCheckReport> check_backward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                           const CheckOptions& opt) {
  const ProblemShape& s = opt.shape;
  if (auto st = validate(s); !st) return st.error();
  std::mt19937_64 gen(opt.seed);
  auto in = make_inputs(backend, spec, opt, gen);
  if (!in) return in.error();
  const int d = spec.head_dim, dv = spec.value_dim;
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  std::vector<double> dout = random_values(rows * dv, gen, 1.0);
  const std::vector<uint8_t> dout_bytes = encode(dout, spec.dtype);

  auto o = make_tensor(backend, s, dv, spec.dtype);
  auto g = make_tensor(backend, s, dv, spec.dtype);
  auto dq = make_tensor(backend, s, d, spec.dtype);
  auto dk = make_tensor(backend, s, d, spec.dtype);
  auto dvt = make_tensor(backend, s, dv, spec.dtype);
  for (auto* t : {&o, &g, &dq, &dk, &dvt})
    if (!*t) return t->error();
  if (auto st = backend.copy_to_device(g->buf, dout_bytes.data(), dout_bytes.size()); !st) return st.error();
  const size_t param_floats = std::max<size_t>(in->params.size(), 1);
  auto dparams = backend.allocate(param_floats * sizeof(float));
  if (!dparams) return dparams.error();
  if (auto st = backend.fill_zero(*dparams); !st) return st.error();

  // The forward with the forward's default config for this arch-independent
  // check: the backward consumes o whatever config produced it.
  auto fwd = AttentionRunner::create(backend, spec, default_config(spec, arch_from_sm(90).value_or_throw()),
                                     Pass::forward);
  if (!fwd) return fwd.error();
  if (auto st = fwd->forward(s, in->q_ref, in->k_ref, in->v_ref, o->ref, in->params_buf.ptr()); !st)
    return st.error();
  auto bwd = AttentionRunner::create(backend, spec, config, Pass::backward);
  if (!bwd) return bwd.error();
  if (auto st = backend.synchronize(); !st) return st.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = bwd->backward(s, in->q_ref, in->k_ref, in->v_ref, o->cref(), g->cref(), dq->ref, dk->ref, dvt->ref,
                              in->params_buf.ptr(), dparams->ptr());
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
  rep.dparams.resize(in->params.size());
  if (auto st = backend.copy_to_host(rep.dq.data(), dq->buf, rep.dq.size()); !st) return st.error();
  if (auto st = backend.copy_to_host(rep.dk.data(), dk->buf, rep.dk.size()); !st) return st.error();
  if (auto st = backend.copy_to_host(rep.dv.data(), dvt->buf, rep.dv.size()); !st) return st.error();
  if (!rep.dparams.empty())
    if (auto st = backend.copy_to_host(rep.dparams.data(), *dparams, rep.dparams.size() * sizeof(float)); !st)
      return st.error();

  const reference::AttentionShape rshape{s.batch, s.seq, s.heads};
  const std::vector<double> pd = reference::to_double(in->params);
  auto ref = reference::linear_attention_backward(opt.reference_spec.value_or(spec), rshape, in->q, in->k, in->v,
                                                  pd, dout);
  if (!ref) return ref.error();
  rep.tensors.push_back(compare("dq", decode_all(rep.dq, spec.dtype), ref->dq, rep.tolerance));
  rep.tensors.push_back(compare("dk", decode_all(rep.dk, spec.dtype), ref->dk, rep.tolerance));
  rep.tensors.push_back(compare("dv", decode_all(rep.dv, spec.dtype), ref->dv, rep.tolerance));
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
