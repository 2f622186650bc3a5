// lunajit run --inputs/--save (apps/run_files.h).
#include "apps/run_files.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codegen/feature_params.h"
#include "codegen/tile_config.h"
#include "common/numeric.h"
#include "io/safetensors.h"
#include "runtime/attention_runner.h"
#include "runtime/backend.h"

namespace lunajit {
namespace {

int fail(const Error& e) {
  std::fprintf(stderr, "lunajit: %s\n", e.message.c_str());
  return e.kind == ErrorKind::invalid_argument ? 2 : 1;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_float(StDType t) {
  return t == StDType::F32 || t == StDType::F64 || t == StDType::F16 || t == StDType::BF16;
}

// Tensor `name` of the file with exactly `want` as shape (and a float dtype).
Result<std::vector<float>> input(const Safetensors& st, const std::string& file, const char* name,
                                 const std::vector<int64_t>& want, const char* meaning) {
  const StTensor* t = st.find(name);
  if (!t) return Error::invalid(fmt::format("--inputs {}: no tensor \"{}\" ({} {})", file, name, meaning, shape_text(want)));
  if (!is_float(t->dtype))
    return Error::invalid(fmt::format("--inputs {}: tensor \"{}\" has dtype {}; allowed: F32, F64, F16, BF16", file,
                                      name, to_string(t->dtype)));
  if (t->shape != want)
    return Error::invalid(fmt::format("--inputs {}: tensor \"{}\" has shape {} but the spec and q need {} ({})", file,
                                      name, shape_text(t->shape), shape_text(want), meaning));
  return t->to_floats();
}

std::vector<std::byte> encode(const std::vector<float>& x, DType t) {
  std::vector<std::byte> out(x.size() * dtype_bytes(t));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::fp32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t b = t == DType::bf16 ? float_to_bf16_bits(x[i]) : float_to_fp16_bits(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

std::vector<float> decode(const std::vector<std::byte>& b, DType t) {
  const size_t n = b.size() / dtype_bytes(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::fp32) {
      std::memcpy(&out[i], b.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = t == DType::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
    }
  }
  return out;
}

struct DeviceTensor {
  Buffer buf;
  int64_t dim = 0;
};

Result<DeviceTensor> upload(Backend& b, const std::vector<std::byte>& bytes, int64_t dim) {
  auto buf = b.allocate(std::max<size_t>(bytes.size(), 1));
  if (!buf) return buf.error();
  if (!bytes.empty())
    if (auto st = b.copy_to_device(*buf, bytes.data(), bytes.size()); !st) return st.error();
  return DeviceTensor{std::move(*buf), dim};
}

Result<std::vector<std::byte>> download(Backend& b, const Buffer& buf, size_t bytes) {
  std::vector<std::byte> out(bytes);
  if (bytes)
    if (auto st = b.copy_to_host(out.data(), buf, bytes); !st) return st.error();
  return out;
}

Status run(const RunFiles& files, const std::string& spec_arg, const std::string& config_json,
           const std::string& arch_name, const std::string& backend_name, bool backward, uint64_t seed,
           bool as_json) {
  auto spec = load_spec(spec_arg);
  if (!spec) return spec.error();
  if (auto st = validate(*spec); !st) return st.error();
  auto arch = parse_arch(arch_name);
  if (!arch) return arch.error();
  auto st = read_safetensors(files.inputs);
  if (!st) return Error::invalid(fmt::format("--inputs: {}", st.error().message));
  const StTensor* qt = st->find("q");
  if (!qt || qt->shape.size() != 4)
    return Error::invalid(fmt::format("--inputs {}: needs a 4-D tensor \"q\" [batch, seq, heads, head_dim = {}]{}",
                                      files.inputs, spec->head_dim, qt ? ", got " + shape_text(qt->shape) : ""));
  const int64_t B = qt->shape[0], N = qt->shape[1], H = qt->shape[2];
  const ProblemShape shape{int(B), int(H), int(N)};
  if (B > (1 << 30) || N > (1 << 30) || H > (1 << 30))
    return Error::invalid(fmt::format("--inputs: q shape {} is too large", shape_text(qt->shape)));
  if (auto s = validate(shape); !s) return Error::invalid(fmt::format("--inputs: q: {}", s.error().message));
  const std::vector<int64_t> qs{B, N, H, spec->head_dim}, vs{B, N, H, spec->value_dim};
  auto q = input(*st, files.inputs, "q", qs, "[batch, seq, heads, head_dim]");
  if (!q) return q.error();
  auto k = input(*st, files.inputs, "k", qs, "[batch, seq, heads, head_dim]");
  if (!k) return k.error();
  auto v = input(*st, files.inputs, "v", vs, "[batch, seq, heads, value_dim]");
  if (!v) return v.error();
  const ParamLayout layout = param_layout(*spec);
  const int64_t nparams = layout.total_floats(*spec, int(H));
  std::vector<float> params;
  if (st->find("params")) {
    auto p = input(*st, files.inputs, "params", {nparams}, "the flat feature-map parameters of the spec");
    if (!p) return p.error();
    params = std::move(*p);
  } else {
    params = init_params(*spec, int(H), seed);
  }
  std::vector<float> dout(size_t(B * N * H * spec->value_dim), 1.0f);
  if (backward && st->find("do")) {
    auto d = input(*st, files.inputs, "do", vs, "the gradient of o");
    if (!d) return d.error();
    dout = std::move(*d);
  }

  auto backend = make_backend(backend_name);
  if (!backend) return backend.error();
  Backend& be = **backend;
  const Pass pass = backward ? Pass::backward : Pass::forward;
  auto fdefault = fitting_default_config(*spec, *arch, Pass::forward);
  if (!fdefault) return fdefault.error();
  auto bdefault = backward ? fitting_default_config(*spec, *arch, Pass::backward) : fdefault;
  if (!bdefault) return bdefault.error();
  TileConfig fconfig = *fdefault, bconfig = *bdefault;
  if (!config_json.empty()) {
    for (auto [c, p] : {std::pair{&fconfig, Pass::forward}, std::pair{&bconfig, Pass::backward}}) {
      if (p == Pass::backward && !backward) continue;
      auto parsed = tile_config_from_string(config_json, *c);
      if (!parsed) return parsed.error();
      if (auto s = can_implement(*spec, *parsed, *arch, p); !s) return s.error();
      *c = *parsed;
    }
  }
  const DType dt = spec->dtype;
  auto dq_in = upload(be, encode(*q, dt), spec->head_dim);
  auto dk_in = upload(be, encode(*k, dt), spec->head_dim);
  auto dv_in = upload(be, encode(*v, dt), spec->value_dim);
  std::vector<std::byte> pbytes(params.size() * 4);
  if (!params.empty()) std::memcpy(pbytes.data(), params.data(), pbytes.size());
  auto dp = upload(be, pbytes, 0);
  const size_t obytes = size_t(B * N * H * spec->value_dim) * dtype_bytes(dt);
  auto dout_dev = upload(be, std::vector<std::byte>(obytes), spec->value_dim);
  for (auto* t : {&dq_in, &dk_in, &dv_in, &dp, &dout_dev})
    if (!*t) return t->error();
  auto ref = [&](const DeviceTensor& t) {
    return TensorRef{t.buf.as_pointer(), N * H * t.dim, H * t.dim, t.dim};
  };
  auto mref = [&](const DeviceTensor& t) {
    return MutableTensorRef{t.buf.as_pointer(), N * H * t.dim, H * t.dim, t.dim};
  };
  auto fwd = AttentionRunner::create(be, *spec, fconfig, Pass::forward);
  if (!fwd) return fwd.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (auto s = fwd->forward(shape, ref(*dq_in), ref(*dk_in), ref(*dv_in), mref(*dout_dev), dp->buf.ptr()); !s)
    return s.error();
  if (auto s = be.synchronize(); !s) return s.error();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Safetensors out;
  out.metadata["lunajit.spec"] = canonical_json(*spec);
  out.metadata["lunajit.config"] = (backward ? bconfig : fconfig).to_string();
  auto o_bytes = download(be, dout_dev->buf, obytes);
  if (!o_bytes) return o_bytes.error();
  out.tensors.push_back(StTensor::from_floats("o", vs, decode(*o_bytes, dt)));
  if (backward) {
    auto g = upload(be, encode(dout, dt), spec->value_dim);
    auto gq = upload(be, std::vector<std::byte>(size_t(B * N * H * spec->head_dim) * dtype_bytes(dt)), spec->head_dim);
    auto gk = upload(be, std::vector<std::byte>(size_t(B * N * H * spec->head_dim) * dtype_bytes(dt)), spec->head_dim);
    auto gv = upload(be, std::vector<std::byte>(obytes), spec->value_dim);
    auto gp = upload(be, std::vector<std::byte>(std::max<size_t>(pbytes.size(), 4)), 0);
    for (auto* t : {&g, &gq, &gk, &gv, &gp})
      if (!*t) return t->error();
    auto bwd = AttentionRunner::create(be, *spec, bconfig, Pass::backward);
    if (!bwd) return bwd.error();
    const auto t1 = std::chrono::steady_clock::now();
    if (auto s = bwd->backward(shape, ref(*dq_in), ref(*dk_in), ref(*dv_in), ref(*dout_dev), ref(*g), mref(*gq),
                               mref(*gk), mref(*gv), dp->buf.ptr(), gp->buf.ptr());
        !s)
      return s.error();
    if (auto s = be.synchronize(); !s) return s.error();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const std::pair<const char*, DeviceTensor*> grads[] = {{"dq", &*gq}, {"dk", &*gk}, {"dv", &*gv}};
    for (const auto& [name, t] : grads) {
      auto b = download(be, t->buf, size_t(B * N * H * t->dim) * dtype_bytes(dt));
      if (!b) return b.error();
      out.tensors.push_back(StTensor::from_floats(name, name[1] == 'v' ? vs : qs,
                                                  decode(*b, dt)));
    }
    if (!params.empty()) {
      auto b = download(be, gp->buf, pbytes.size());
      if (!b) return b.error();
      out.tensors.push_back(StTensor{"dparams", StDType::F32, {nparams}, std::move(*b)});
    }
  }
  if (!files.save.empty())
    if (auto s = write_safetensors(files.save, out); !s) return s.error();
  // Non-finite values (docs/MATH.md "Non-finite values"): the kernels propagate
  // them; count what came in and what came out, and fail when finite inputs
  // gave non-finite results.
  auto nonfinite = [](const std::vector<float>& x) {
    return std::count_if(x.begin(), x.end(), [](float f) { return !std::isfinite(f); });
  };
  const int64_t bad_in = nonfinite(*q) + nonfinite(*k) + nonfinite(*v) + nonfinite(params) +
                         (backward ? nonfinite(dout) : 0);
  nlohmann::json bad_out = nlohmann::json::object();
  int64_t bad_out_total = 0;
  for (const auto& t : out.tensors) {
    if (t.dtype != StDType::F32) continue;
    const int64_t n = nonfinite(t.to_floats());
    bad_out[t.name] = n;
    bad_out_total += n;
  }
  if (as_json) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& t : out.tensors) names.push_back(t.name);
    std::puts(nlohmann::json{{"backend", be.description()}, {"pass", to_string(pass)},
                             {"shape", {B, N, H}}, {"seconds", seconds}, {"saved", files.save}, {"tensors", names},
                             {"nonfinite_inputs", bad_in}, {"nonfinite_outputs", bad_out}}
                  .dump(2)
                  .c_str());
  } else {
    std::printf("%s on %s, batch %lld seq %lld heads %lld from %s: %.3f ms%s%s\n",
                backward ? "forward + backward" : "forward", be.description().c_str(), (long long)B, (long long)N,
                (long long)H, files.inputs.c_str(), seconds * 1e3, files.save.empty() ? "" : "; wrote ",
                files.save.c_str());
    if (bad_in > 0 || bad_out_total > 0) {
      std::printf("non-finite values: %lld in the inputs;", static_cast<long long>(bad_in));
      for (const auto& [name, n] : bad_out.items()) std::printf(" %s %lld", name.c_str(), n.get<long long>());
      std::printf(" in the outputs\n");
    }
  }
  if (bad_in == 0 && bad_out_total > 0)
    return Error::failure(fmt::format("{} output values are NaN or Inf although every input is finite "
                                      "(docs/MATH.md \"Non-finite values\")",
                                      bad_out_total));
  return ok_status();
}

}  // namespace

void add_run_file_options(CLI::App* run, RunFiles& files) {
  run->add_option("--inputs", files.inputs, "safetensors file with q, k, v (and params, do) to run on")
      ->check(CLI::ExistingFile);
  run->add_option("--save", files.save, "write o (and with --backward dq, dk, dv, dparams) to this safetensors file")
      ->needs(run->get_option("--inputs"));
}

int run_with_files(const RunFiles& files, const std::string& spec, const std::string& config_json,
                   const std::string& arch, const std::string& backend, bool backward, uint64_t seed, bool as_json) {
  const Status st = run(files, spec, config_json, arch, backend, backward, seed, as_json);
  return st.ok() ? 0 : fail(st.error());
}

}  // namespace lunajit
