// lunajit::linear_attention against (1) LibTorch autograd through the plain
// composition of tests/torch_binding/plain_composition.h (fp32, forward and the
// gradients of q, k, v and the parameters), (2) the double-precision reference
// (fp64 inputs), (3) central finite differences in fp64 (LibTorch C++ has no
// torch::autograd::gradcheck, so gradcheck() below is the same check by hand),
// (4) the host-emulated kernels (forward and backward kernels); and each bad
// input the op promises to reject.
//
// Tolerances (atol + rtol * max|ref|): fp32 against fp32 composition 2e-5 +
// 2e-4 (different summation orders over n * D terms of O(1) values); fp64
// against the reference 1e-9 (both double, only the order of sums differs);
// finite differences h = 1e-6 with 1e-6 + 1e-4 relative (truncation error h^2
// and rounding 1e-16 / h); kernels fp32 1e-4 + 1e-3 (fp32 kernels vs fp32 ATen).
#include <functional>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checks.h"
#include "codegen/feature_params.h"
#include "plain_composition.h"
#include "reference/reference.h"
#include "torch_binding/linear_attention.h"

#if LUNAJIT_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lunajit {
namespace {

using torch::Tensor;
using testing::expect_close;
using testing::expect_rejected;

// Small specs of every family (and the luna variants), head_dim d, value_dim dv.
std::vector<std::pair<std::string, AttentionSpec>> small_specs(int d, int dv) {
  const std::vector<std::pair<std::string, std::string>> fam = {
      {"luna", R"("luna": {"projections": 3, "channels": 2, "mlp_width": 5})"},
      {"luna_perchannel_gelu_softplus",
       R"("luna": {"projections": 2, "channels": 3, "mlp_width": 4, "shared_channels": false, "activation": "gelu", "output_activation": "softplus"})"},
      {"luna_envelope_silu", R"("luna": {"projections": 2, "channels": 2, "mlp_width": 4, "envelope": true, "activation": "silu", "output_activation": "none"})"},
      {"luna_bank_coef", R"("luna": {"projections": 2, "channels": 8, "variant": "bank_coef"})"},
      {"luna_rff", R"("luna": {"projections": 3, "channels": 2, "variant": "rff"}, "normalize": false)"},
      {"performer", R"("performer": {"features": 6})"},
      {"rff", R"("rff": {"features": 5}, "normalize": false)"},
      {"elu", ""},
      {"relu", ""},
      {"t2r", R"("t2r": {"features": 7})"},
      {"hedgehog", R"("hedgehog": {"features": 8})"},
      {"cosformer", ""},
      {"slay", R"("slay": {"nodes": 2, "anchors": 3, "prf_features": 4})"}};
  std::vector<std::pair<std::string, AttentionSpec>> out;
  for (const auto& [name, extra] : fam) {
    const std::string family = name.substr(0, name.find('_') == std::string::npos ? name.size() : name.find('_'));
    const std::string json = fmt::format(R"({{"family": "{}", "head_dim": {}, "value_dim": {}, "dtype": "fp32"{}{}}})",
                                         family, d, dv, extra.empty() ? "" : ", ", extra);
    auto spec = spec_from_string(json);
    EXPECT_TRUE(spec.ok()) << json << ": " << (spec.ok() ? "" : spec.error().message);
    if (spec.ok()) out.emplace_back(name, *spec);
  }
  return out;
}

struct Case {
  std::string name;
  AttentionSpec spec;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Every small spec x causal x params per head / shared.
std::vector<Case> all_cases(int d, int dv) {
  std::vector<Case> out;
  for (const auto& [name, base] : small_specs(d, dv))
    for (bool causal : {false, true})
      for (bool per_head : {true, false}) {
        AttentionSpec s = base;
        s.causal = causal;
        s.params_per_head = per_head;
        out.push_back({fmt::format("{}_{}_{}", name, causal ? "causal" : "full", per_head ? "perhead" : "shared"), s});
      }
  return out;
}

struct Inputs {
  Tensor q, k, v, params, dout;
};

Inputs random_inputs(const AttentionSpec& spec, int B, int N, int H, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  auto opt = torch::TensorOptions().dtype(dtype);
  Inputs in;
  in.q = torch::randn({B, N, H, spec.head_dim}, opt);
  in.k = torch::randn({B, N, H, spec.head_dim}, opt);
  in.v = torch::randn({B, N, H, spec.value_dim}, opt);
  in.dout = torch::randn({B, N, H, spec.value_dim}, opt);
  in.params = init_feature_params(spec, H, seed).to(dtype);
  return in;
}

// max |a - b| <= atol + rtol * max |b|

// {o, dq, dk, dv, dparams} of fn on leaves copied from `in`, for upstream dout.
std::vector<Tensor> value_and_grads(const Inputs& in,
                                    const std::function<Tensor(Tensor, Tensor, Tensor, Tensor)>& fn) {
  std::vector<Tensor> leaves = {in.q.clone().requires_grad_(), in.k.clone().requires_grad_(),
                                in.v.clone().requires_grad_(), in.params.clone().requires_grad_(in.params.numel() > 0)};
  const Tensor o = fn(leaves[0], leaves[1], leaves[2], leaves[3]);
  (o * in.dout).sum().backward();
  std::vector<Tensor> out{o.detach()};
  for (auto& l : leaves) out.push_back(l.grad().defined() ? l.grad() : torch::zeros_like(l));
  return out;
}

const char* kNames[] = {"o", "dq", "dk", "dv", "dparams"};

class LinearAttentionOp : public ::testing::TestWithParam<Case> {};

TEST_P(LinearAttentionOp, MatchesPlainCompositionAutograd) {
  const AttentionSpec& spec = GetParam().spec;
  const Inputs in = random_inputs(spec, 2, 7, 2, torch::kFloat, 1);
  LinearAttentionOptions opt;
  opt.chunk = 3;  // 7 tokens: three chunks, the last one partial
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, opt);
  });
  const auto want = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return testing::plain_linear_attention(q, k, v, p, spec);
  });
  for (int i = 0; i < 5; ++i) expect_close(got[i], want[i], 2e-5, 2e-4, kNames[i]);
}

TEST_P(LinearAttentionOp, MatchesDoubleReference) {
  const AttentionSpec& spec = GetParam().spec;
  const int B = 2, N = 6, H = 2;
  const Inputs in = random_inputs(spec, B, N, H, torch::kDouble, 2);
  LinearAttentionOptions opt;
  opt.chunk = 4;
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, opt);
  });
  auto vec = [](const Tensor& t) {
    const Tensor c = t.contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  const reference::AttentionShape shape{B, N, H};
  const auto q = vec(in.q), k = vec(in.k), v = vec(in.v), p = vec(in.params), dout = vec(in.dout);
  auto fwd = reference::linear_attention_forward(spec, shape, q, k, v, p);
  ASSERT_TRUE(fwd.ok()) << fwd.error().message;
  auto bwd = reference::linear_attention_backward(spec, shape, q, k, v, p, dout);
  ASSERT_TRUE(bwd.ok()) << bwd.error().message;
  auto as_tensor = [](const std::vector<double>& x, const Tensor& like) {
    return torch::from_blob(const_cast<double*>(x.data()), like.sizes(), torch::kDouble).clone();
  };
  expect_close(got[0], as_tensor(fwd->out, got[0]), 1e-9, 1e-9, "o");
  expect_close(got[1], as_tensor(bwd->dq, got[1]), 1e-9, 1e-9, "dq");
  expect_close(got[2], as_tensor(bwd->dk, got[2]), 1e-9, 1e-9, "dk");
  expect_close(got[3], as_tensor(bwd->dv, got[3]), 1e-9, 1e-9, "dv");
  if (in.params.numel()) expect_close(got[4], as_tensor(bwd->dparams, got[4]), 1e-9, 1e-9, "dparams");
}

// 1 where the flat parameter buffer holds a learned tensor, 0 for fixed ones.
Tensor learned_mask(const AttentionSpec& spec, int64_t heads) {
  const ParamLayout layout = param_layout(spec);
  Tensor block = torch::zeros({layout.per_head_floats}, torch::kDouble);
  for (const auto& t : layout.tensors)
    if (t.learned) block.narrow(0, t.offset, t.numel()).fill_(1.0);
  return block.repeat({spec.params_per_head ? heads : 1});
}

// Central finite differences of sum(dout * f) in fp64 against autograd, for
// every input element (the shapes are tiny). Fixed parameter entries are not
// perturbed: their gradient must be exactly zero (stop-gradient by contract).
void gradcheck(const std::function<Tensor(Tensor, Tensor, Tensor, Tensor)>& fn, const Inputs& in,
               const Tensor& param_mask) {
  const auto analytic = value_and_grads(in, fn);
  const double h = 1e-6;
  torch::NoGradGuard no_grad;
  const Tensor base[4] = {in.q, in.k, in.v, in.params};
  for (int i = 0; i < 4; ++i) {
    if (base[i].numel() == 0) continue;
    Tensor numeric = torch::zeros_like(base[i]);
    for (int64_t j = 0; j < base[i].numel(); ++j) {
      if (i == 3 && param_mask[j].item<double>() == 0) continue;
      Tensor x[4] = {base[0].clone(), base[1].clone(), base[2].clone(), base[3].clone()};
      auto flat = x[i].view({-1});
      const double x0 = flat[j].item<double>();
      flat[j] = x0 + h;
      const double fp = (fn(x[0], x[1], x[2], x[3]) * in.dout).sum().item<double>();
      flat[j] = x0 - h;
      const double fm = (fn(x[0], x[1], x[2], x[3]) * in.dout).sum().item<double>();
      numeric.view({-1})[j] = (fp - fm) / (2 * h);
    }
    expect_close(analytic[i + 1], numeric, 1e-6, 1e-4, std::string("gradcheck ") + kNames[i + 1]);
  }
}

TEST_P(LinearAttentionOp, GradcheckDouble) {
  AttentionSpec spec = GetParam().spec;
  if (spec.family == Family::performer) {
    // Stop-gradient stabilizers equal the true gradient only where they cancel
    // exactly: no kernel_eps, negligible eps (reference/feature_map.h).
    spec.performer.kernel_eps = 0;
    spec.eps = 1e-12;
  }
  const Inputs in = random_inputs(spec, 1, 5, 2, torch::kDouble, 3);
  LinearAttentionOptions opt;
  opt.chunk = 2;
  gradcheck([&](Tensor q, Tensor k, Tensor v, Tensor p) { return linear_attention(q, k, v, p, spec, opt); }, in,
            learned_mask(spec, 2));
}

INSTANTIATE_TEST_SUITE_P(Families, LinearAttentionOp, ::testing::ValuesIn(all_cases(4, 3)),
                         [](const auto& info) { return info.param.name; });


// The host-emulated kernels against the ATen path: forward, and the gradients of
// the backward kernels. Per head params only (the shared case runs the same
// kernels with another block offset), d = dv = 8.
class HostKernelPath : public ::testing::TestWithParam<Case> {};

TEST_P(HostKernelPath, MatchesAtenPath) {
  const AttentionSpec& spec = GetParam().spec;
  const Inputs in = random_inputs(spec, 2, 19, 2, torch::kFloat, 4);
  LinearAttentionOptions host;
  host.path = AttentionPath::host_kernels;
  LinearAttentionOptions aten_opt;
  aten_opt.path = AttentionPath::aten;
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, host);
  });
  const auto want = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, aten_opt);
  });
  for (int i = 0; i < 5; ++i) expect_close(got[i], want[i], 1e-4, 1e-3, std::string("host kernels ") + kNames[i]);
}

TEST_P(HostKernelPath, StridedFusedQkvSlices) {
  // q, k, v as slices of one fused [B, N, H, 2d + dv] projection, no copy.
  const AttentionSpec& spec = GetParam().spec;
  const Inputs in = random_inputs(spec, 2, 9, 2, torch::kFloat, 5);
  const int64_t d = spec.head_dim;
  const Tensor fused = torch::cat({in.q, in.k, in.v}, 3);
  LinearAttentionOptions host;
  host.path = AttentionPath::host_kernels;
  const Tensor o = linear_attention(fused.narrow(3, 0, d), fused.narrow(3, d, d), fused.narrow(3, 2 * d, spec.value_dim),
                                    in.params, spec, host);
  expect_close(o, linear_attention(in.q, in.k, in.v, in.params, spec), 1e-4, 1e-3, "fused qkv o");
}

// Cross-attention (seq_k = 13 != seq_q = 6) on the host kernels: the two-pass
// composition (packed_state_kernels, output_from_state_kernels) against the
// ATen path, forward and every gradient, same tolerance as MatchesAtenPath.
// Causal specs, cosformer and performer are refused on the kernel path with
// the reason (causal and cosformer on every path).
TEST_P(HostKernelPath, CrossAttentionMatchesAtenPath) {
  const AttentionSpec& spec = GetParam().spec;
  Inputs in = random_inputs(spec, 2, 6, 2, torch::kFloat, 6);
  torch::manual_seed(60);
  in.k = torch::randn({2, 13, 1, spec.head_dim});  // and grouped-query: one kv head for two query heads
  in.v = torch::randn({2, 13, 1, spec.value_dim});
  LinearAttentionOptions host;
  host.path = AttentionPath::host_kernels;
  LinearAttentionOptions aten_opt;
  aten_opt.path = AttentionPath::aten;
  auto with = [&](const LinearAttentionOptions& o) {
    return [&spec, o](Tensor q, Tensor k, Tensor v, Tensor p) { return linear_attention(q, k, v, p, spec, o); };
  };
  if (spec.causal || spec.family == Family::cosformer) {
    expect_rejected([&] { with(host)(in.q, in.k, in.v, in.params); }, "needs seq_q == seq_k");
    return;
  }
  if (spec.family == Family::performer) {
    expect_rejected([&] { with(host)(in.q, in.k, in.v, in.params); },
                    "which family performer lacks (its key stabiliser is a max over all keys); use path aten");
    return;
  }
  const auto got = value_and_grads(in, with(host));
  const auto want = value_and_grads(in, with(aten_opt));
  for (int i = 0; i < 5; ++i) expect_close(got[i], want[i], 1e-4, 1e-3, std::string("cross, host kernels ") + kNames[i]);
  LinearAttentionOptions masked = host;
  masked.key_mask = torch::ones({2, 13}, torch::kBool);
  expect_rejected([&] { with(masked)(in.q, in.k, in.v, in.params); }, "which take no key_mask; use path aten");
}

std::vector<Case> kernel_cases() {
  std::vector<Case> out;
  for (auto& c : all_cases(8, 8))
    if (c.spec.params_per_head) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, HostKernelPath, ::testing::ValuesIn(kernel_cases()),
                         [](const auto& info) { return info.param.name; });

// Causal performer: perturbing key j (and value j) leaves o_i and dq_i of rows
// i < j exactly equal, on the ATen path and on the host-emulated kernels.
// Exact: rows i < j compute the same values in the same order; key j enters
// their sums only as exact zeros (a weight exp(-inf) = 0 in the ATen chunk).
// kernel_eps = 0.1 and eps = 1e-3 make a shared key stabiliser move them by percents.
TEST(CausalPerformerNoFutureLeak, AtenAndHostKernelPaths) {
  AttentionSpec spec = small_specs(8, 8)[5].second;
  ASSERT_EQ(spec.family, Family::performer);
  spec.causal = true;
  spec.performer.kernel_eps = 0.1;
  spec.eps = 1e-3;
  const Inputs in = random_inputs(spec, 1, 9, 2, torch::kFloat, 8);
  const int64_t d = spec.head_dim;
  for (AttentionPath path : {AttentionPath::aten, AttentionPath::host_kernels}) {
    LinearAttentionOptions opt;
    opt.path = path;
    opt.chunk = 3;
    auto run = [&](const Inputs& x) {
      return value_and_grads(x, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
        return linear_attention(q, k, v, p, spec, opt);
      });
    };
    const auto base = run(in);
    for (int64_t j : {1, 3, 7}) {
      Inputs pert = in;
      pert.k = in.k.clone();
      pert.v = in.v.clone();
      // k_j' = omega_0 of each head: the largest exponent a key can reach.
      const Tensor omega = in.params.view({2, -1}).narrow(1, param_layout(spec).find("omega")->offset, d);
      pert.k.select(1, j).copy_(omega.unsqueeze(0) * std::pow(double(d), 0.25));
      pert.v.select(1, j).add_(1.0);
      const auto got = run(pert);
      const std::string what = std::string(path == AttentionPath::aten ? "aten" : "host kernels") + " key " +
                               std::to_string(j);
      EXPECT_TRUE(torch::equal(got[0].narrow(1, 0, j), base[0].narrow(1, 0, j))) << what << ": o moved";
      EXPECT_TRUE(torch::equal(got[1].narrow(1, 0, j), base[1].narrow(1, 0, j))) << what << ": dq moved";
      EXPECT_FALSE(torch::equal(got[0].narrow(1, j, 9 - j), base[0].narrow(1, j, 9 - j))) << what << ": vacuous";
    }
  }
}

TEST(HostKernelPath, AtenGradientFallbackMatches) {
  const AttentionSpec spec = small_specs(8, 8).front().second;  // luna
  const Inputs in = random_inputs(spec, 1, 10, 2, torch::kFloat, 6);
  LinearAttentionOptions fallback;
  fallback.path = AttentionPath::host_kernels;
  fallback.kernel_backward = false;
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, fallback);
  });
  const auto want = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec);
  });
  for (int i = 0; i < 5; ++i) expect_close(got[i], want[i], 1e-4, 1e-3, kNames[i]);
}

// ---- bad inputs ------------------------------------------------------------

class BadInputs : public ::testing::Test {
 protected:
  AttentionSpec spec = small_specs(8, 8).front().second;  // luna, fp32
  Inputs in = random_inputs(spec, 2, 5, 2, torch::kFloat, 7);
  Tensor run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, LinearAttentionOptions o = {}) {
    return linear_attention(q, k, v, p, spec, o);
  }
};

TEST_F(BadInputs, ShapesAreNamed) {
  expect_rejected([&] { run(in.q[0], in.k, in.v, in.params); }, "q must be 4-D [batch, seq, heads, head_dim]");
  expect_rejected([&] { run(in.q, in.k.narrow(3, 0, 4), in.v, in.params); }, "k.size(3) = 4 but the spec's head_dim is 8");
  expect_rejected([&] { run(in.q, in.k, in.v.narrow(3, 0, 4), in.params); }, "v.size(3) = 4 but the spec's value_dim is 8");
  expect_rejected([&] { run(in.q, in.k.narrow(1, 0, 3), in.v, in.params); }, "v has [seq, heads] = [5, 2] but k has [3, 2]");
  expect_rejected([&] { run(in.q, in.k, in.v.narrow(2, 0, 1), in.params); }, "v has [seq, heads] = [5, 1] but k has [5, 2]");
  expect_rejected([&] { run(in.q, in.k.narrow(0, 0, 1), in.v.narrow(0, 0, 1), in.params); }, "k has batch 1 but q has 2");
  const Tensor k3 = torch::randn({2, 5, 3, 8}), v3 = torch::randn({2, 5, 3, 8});
  expect_rejected([&] { run(in.q, k3, v3, in.params); }, "k and v have 3 heads, which does not divide q's 2 heads");
}

TEST_F(BadInputs, DtypesAreNamed) {
  expect_rejected([&] { run(in.q.to(torch::kInt), in.k, in.v, in.params); }, "q must be a floating-point tensor");
  expect_rejected([&] { run(in.q, in.k.to(torch::kDouble), in.v, in.params); }, "k has dtype Double but q has Float");
  LinearAttentionOptions host;
  host.path = AttentionPath::host_kernels;
  AttentionSpec bf16 = spec;
  bf16.dtype = DType::bf16;
  expect_rejected([&] { linear_attention(in.q, in.k, in.v, in.params, bf16, host); },
                  "q has dtype Float but the spec's dtype is bf16");
  expect_rejected([&] { run(in.q, in.k, in.v, in.params.to(torch::kDouble), host); },
                  "feature_params must be float32 on path host_kernels");
}

TEST_F(BadInputs, LayoutIsNamed) {
  const Tensor wide = torch::randn({2, 5, 2, 16});
  expect_rejected([&] { run(in.q, wide.slice(3, 0, 16, 2), in.v, in.params); },
                  "k must have unit stride in its last (feature) dim, got stride 2");
  expect_rejected([&] { run(in.q, in.k, in.v, in.params.view({2, -1}).t().contiguous().t()); },
                  "feature_params must be 1-D");
}

TEST_F(BadInputs, SpecParameterMismatchIsNamed) {
  expect_rejected([&] { run(in.q, in.k, in.v, in.params.narrow(0, 0, in.params.numel() - 1)); },
                  "feature_params has");
  expect_rejected([&] { run(in.q, in.k, in.v, Tensor()); }, "feature_params is undefined; family luna needs");
  AttentionSpec elu = spec;
  elu.family = Family::elu;
  expect_rejected([&] { linear_attention(in.q, in.k, in.v, in.params, elu); },
                  "feature_params: family elu has no parameters");
  AttentionSpec shared = spec;
  shared.params_per_head = false;
  expect_rejected([&] { linear_attention(in.q, in.k, in.v, in.params, shared); }, "shared block");
  AttentionSpec bad = spec;
  bad.head_dim = 0;
  expect_rejected([&] { linear_attention(in.q, in.k, in.v, in.params, bad); }, "linear_attention: spec: head_dim");
}

TEST_F(BadInputs, DevicesAndPaths) {
  LinearAttentionOptions cuda;
  cuda.path = AttentionPath::cuda_kernels;
  expect_rejected([&] { run(in.q, in.k, in.v, in.params, cuda); }, "path cuda_kernels needs CUDA tensors");
  LinearAttentionOptions chunk;
  chunk.chunk = 0;
  expect_rejected([&] { run(in.q, in.k, in.v, in.params, chunk); }, "options.chunk must be >= 1");
}

TEST_F(BadInputs, NonFiniteWhenAsked) {
  Tensor q = in.q.clone();
  q[0][1][0][2] = std::numeric_limits<float>::quiet_NaN();
  LinearAttentionOptions strict;
  strict.check_finite = true;
  expect_rejected([&] { run(q, in.k, in.v, in.params, strict); }, "q contains NaN or Inf");
  EXPECT_NO_THROW(run(q, in.k, in.v, in.params));  // unchecked by default
}

TEST_F(BadInputs, CrossAttentionAndKeyMaskWhereNotSupported) {
  const Tensor k7 = torch::randn({2, 7, 2, 8}), v7 = torch::randn({2, 7, 2, 8});
  EXPECT_EQ(run(in.q, k7, v7, in.params).sizes(), in.q.sizes());  // non-causal cross-attention runs
  spec.causal = true;
  expect_rejected([&] { run(in.q, k7, v7, in.params); }, "causal attention needs seq_q == seq_k, got seq_q = 5 and "
                  "seq_k = 7");
  spec.causal = false;
  LinearAttentionOptions host;
  host.path = AttentionPath::host_kernels;
  EXPECT_EQ(run(in.q, k7, v7, in.params, host).sizes(), in.q.sizes());  // on the kernels too (HostKernelPath)
  LinearAttentionOptions masked;
  masked.key_mask = torch::ones({2, 5}, torch::kBool);
  EXPECT_NO_THROW(run(in.q, in.k, in.v, in.params, masked));
  host.key_mask = masked.key_mask;  // the kernel path serves key_mask by packing (varlen_test.cpp)
  EXPECT_NO_THROW(run(in.q, in.k, in.v, in.params, host));
  masked.key_mask = torch::ones({2, 5});
  expect_rejected([&] { run(in.q, in.k, in.v, in.params, masked); }, "key_mask must be bool");
  masked.key_mask = torch::ones({2, 4}, torch::kBool);
  expect_rejected([&] { run(in.q, in.k, in.v, in.params, masked); }, "key_mask must be [batch, seq_k] = [2, 5]");
}

// ---- key padding, grouped-query attention, cross-attention -----------------

// Every family supports key_mask: cosformer (position features) and causal
// performer (running key stabiliser) by packing the real tokens (cu_seqlens),
// the others by zeroed feature rows.

// Three sequences in a batch of length 6: full, right-padded to 3, left-padded to 2.
constexpr int kPadN = 6;
constexpr int kPadLen[3] = {6, 3, 2};
constexpr int kPadStart[3] = {0, 0, 4};

Tensor real_keys() {
  Tensor m = torch::zeros({3, kPadN}, torch::kBool);
  for (int b = 0; b < 3; ++b) m[b].narrow(0, kPadStart[b], kPadLen[b]).fill_(true);
  return m;
}

class KeyMask : public ::testing::TestWithParam<Case> {};

TEST_P(KeyMask, PaddedBatchEqualsPerSequenceCalls) {
  const AttentionSpec& spec = GetParam().spec;
  Inputs in = random_inputs(spec, 3, kPadN, 2, torch::kFloat, 21);
  const Tensor keep = real_keys();
  in.dout = in.dout * keep.reshape({3, kPadN, 1, 1});  // a loss over real tokens only
  LinearAttentionOptions opt;
  opt.chunk = 4;
  opt.key_mask = keep;
  auto op = [&](const LinearAttentionOptions& o) {
    return [&spec, o](Tensor q, Tensor k, Tensor v, Tensor p) { return linear_attention(q, k, v, p, spec, o); };
  };
  const auto got = value_and_grads(in, op(opt));
  LinearAttentionOptions plain;
  plain.chunk = 4;
  Tensor dparams = torch::zeros_like(in.params);
  for (int b = 0; b < 3; ++b) {
    auto cut = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(1, kPadStart[b], kPadLen[b]).contiguous(); };
    const Inputs one{cut(in.q), cut(in.k), cut(in.v), in.params, cut(in.dout)};
    const auto want = value_and_grads(one, op(plain));
    for (int i = 0; i < 4; ++i)
      expect_close(cut(got[i]), want[i], 2e-5, 2e-4, fmt::format("sequence {} {}", b, kNames[i]));
    dparams = dparams + want[4];
  }
  expect_close(got[4], dparams, 2e-5, 2e-4, "dparams");
  // Pad keys and values get no gradient.
  const Tensor pad = keep.logical_not().reshape({3, kPadN, 1, 1});
  EXPECT_EQ((got[2] * pad).abs().max().item<double>(), 0.0);
  EXPECT_EQ((got[3] * pad).abs().max().item<double>(), 0.0);
}

TEST_P(KeyMask, MaskedKeysNeverInfluenceOutputs) {
  const AttentionSpec& spec = GetParam().spec;
  const Inputs in = random_inputs(spec, 3, kPadN, 2, torch::kFloat, 22);
  const Tensor keep = real_keys();
  const Tensor pad = keep.logical_not().reshape({3, kPadN, 1, 1});
  LinearAttentionOptions opt;
  opt.chunk = 4;
  opt.key_mask = keep;
  const Tensor o = linear_attention(in.q, in.k, in.v, in.params, spec, opt);
  // Other, large pad keys and values: every output (real or pad query rows) is bitwise the same,
  // since masked rows add exact zeros to S, z and the causal chunk products.
  const Tensor k2 = torch::where(pad, 10 * torch::randn_like(in.k), in.k);
  const Tensor v2 = torch::where(pad, 10 * torch::randn_like(in.v), in.v);
  EXPECT_TRUE(torch::equal(o, linear_attention(in.q, k2, v2, in.params, spec, opt)));
}

TEST_P(KeyMask, GroupedQueryEqualsRepeatedKvHeads) {
  const AttentionSpec& spec = GetParam().spec;
  Inputs in = random_inputs(spec, 2, 5, 4, torch::kFloat, 23);
  in.k = in.k.narrow(2, 0, 2).contiguous();  // 2 kv heads for 4 query heads
  in.v = in.v.narrow(2, 0, 2).contiguous();
  LinearAttentionOptions opt;
  opt.chunk = 3;
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, opt);
  });
  const auto want = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return testing::plain_linear_attention(q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2), p, spec);
  });
  for (int i = 0; i < 5; ++i) expect_close(got[i], want[i], 2e-5, 2e-4, std::string("gqa ") + kNames[i]);
}

TEST_P(KeyMask, CrossAttentionMatchesPlainComposition) {
  const AttentionSpec& spec = GetParam().spec;
  Inputs in = random_inputs(spec, 2, 4, 2, torch::kFloat, 24);
  in.k = torch::randn({2, 7, 2, spec.head_dim});
  in.v = torch::randn({2, 7, 2, spec.value_dim});
  auto op = [&](Tensor q, Tensor k, Tensor v, Tensor p) { return linear_attention(q, k, v, p, spec); };
  if (spec.causal || spec.family == Family::cosformer) {
    expect_rejected([&] { op(in.q, in.k, in.v, in.params); }, "needs seq_q == seq_k");
    return;
  }
  const auto got = value_and_grads(in, op);
  const auto want = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return testing::plain_linear_attention(q, k, v, p, spec);
  });
  for (int i = 0; i < 5; ++i) expect_close(got[i], want[i], 2e-5, 2e-4, std::string("cross ") + kNames[i]);
}

std::vector<Case> per_head_cases(int d, int dv) {
  std::vector<Case> out;
  for (auto& c : all_cases(d, dv))
    if (c.spec.params_per_head) out.push_back(c);
  return out;
}
INSTANTIATE_TEST_SUITE_P(Families, KeyMask, ::testing::ValuesIn(per_head_cases(4, 3)),
                         [](const auto& info) { return info.param.name; });

TEST(HostKernelPathGqa, EqualsRepeatedKvHeads) {
  const AttentionSpec spec = kernel_cases().front().spec;
  Inputs in = random_inputs(spec, 1, 9, 4, torch::kFloat, 25);
  in.k = in.k.narrow(2, 0, 1).contiguous();  // one kv head for 4 query heads
  in.v = in.v.narrow(2, 0, 1).contiguous();
  LinearAttentionOptions host;
  host.path = AttentionPath::host_kernels;
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, host);
  });
  const auto want = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k.repeat_interleave(4, 2), v.repeat_interleave(4, 2), p, spec, host);
  });
  for (int i = 0; i < 5; ++i) expect_close(got[i], want[i], 0, 0, std::string("host gqa ") + kNames[i]);
}

// ---- GPU -------------------------------------------------------------------

TEST(GpuKernelPath, MatchesAtenPathOnCuda) {
  if (!cuda_kernels_available()) GTEST_SKIP() << "no CUDA GPU / Torch built without CUDA";
  for (const Case& c : kernel_cases()) {
    SCOPED_TRACE(c.name);
    Inputs in = random_inputs(c.spec, 2, 33, 2, torch::kFloat, 8);
    for (Tensor* t : {&in.q, &in.k, &in.v, &in.params, &in.dout}) *t = t->to(torch::kCUDA);
    const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
      return linear_attention(q, k, v, p, c.spec);  // automatic: cuda_kernels
    });
    LinearAttentionOptions aten_opt;
    aten_opt.path = AttentionPath::aten;
    const auto want = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
      return linear_attention(q, k, v, p, c.spec, aten_opt);
    });
    for (int i = 0; i < 5; ++i) expect_close(got[i].cpu(), want[i].cpu(), 1e-4, 1e-3, std::string("cuda ") + kNames[i]);
  }
}

TEST(GpuKernelPath, Bf16OnANonDefaultStream) {
  if (!cuda_kernels_available()) GTEST_SKIP() << "no CUDA GPU / Torch built without CUDA";
  AttentionSpec spec = small_specs(64, 64).front().second;
  spec.dtype = DType::bf16;
  Inputs in = random_inputs(spec, 2, 257, 4, torch::kFloat, 9);
  const Tensor q = in.q.to(torch::kCUDA, torch::kBFloat16), k = in.k.to(torch::kCUDA, torch::kBFloat16),
               v = in.v.to(torch::kCUDA, torch::kBFloat16), p = in.params.to(torch::kCUDA);
  LinearAttentionOptions aten_opt;
  aten_opt.path = AttentionPath::aten;
  const Tensor want = linear_attention(q, k, v, p, spec, aten_opt).to(torch::kFloat);
#if LUNAJIT_TORCH_CUDA
  const c10::cuda::CUDAStreamGuard on_pool_stream(c10::cuda::getStreamFromPool());
#endif
  const Tensor got = linear_attention(q, k, v, p, spec).to(torch::kFloat);
  expect_close(got.cpu(), want.cpu(), 2e-2, 2e-2, "bf16 o");
}

}  // namespace
}  // namespace lunajit
