// Shared pieces of the reference tests: small specs of every family, random
// problems, and the comparison with a stated tolerance (atol + rtol * scale, as
// in llm.c).
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codegen/attention_spec.h"
#include "codegen/feature_params.h"
#include "reference/reference.h"

namespace lunajit::reference::testing {

// A named small spec of one family; `signed_features` marks maps whose phi can be
// negative (den may cross zero), tested unnormalized only.
struct SpecCase {
  std::string name;
  AttentionSpec spec;
  bool signed_features = false;
};

inline void PrintTo(const SpecCase& c, std::ostream* os) { *os << c.name; }

inline AttentionSpec small_spec(Family f, int d = 5, int dv = 4) {
  AttentionSpec s = default_spec(f);
  s.head_dim = d;
  s.value_dim = dv;
  s.dtype = DType::fp32;
  s.luna.projections = 3;
  s.luna.channels = 3;
  s.luna.mlp_width = 4;
  s.performer.features = 8;
  s.rff.features = 4;
  s.t2r.features = 6;
  s.hedgehog.features = d;
  s.slay.nodes = 2;
  s.slay.anchors = 3;
  s.slay.prf_features = 4;
  return s;
}

// Every family, and luna in each activation, output activation, channel mode,
// envelope and variant.
inline std::vector<SpecCase> all_spec_cases() {
  std::vector<SpecCase> cases;
  auto luna = [](Activation a, OutputActivation o, bool shared, bool envelope, LunaVariant var) {
    AttentionSpec s = small_spec(Family::luna);
    s.luna.activation = a;
    s.luna.output_activation = o;
    s.luna.shared_channels = shared;
    s.luna.envelope = envelope;
    s.luna.variant = var;
    return s;
  };
  using A = Activation;
  using O = OutputActivation;
  using V = LunaVariant;
  cases.push_back({"luna_shared_relu_relu", luna(A::relu, O::relu, true, false, V::neural)});
  cases.push_back({"luna_channel_gelu_softplus", luna(A::gelu, O::softplus, false, false, V::neural)});
  cases.push_back({"luna_shared_silu_none", luna(A::silu, O::none, true, false, V::neural), true});
  cases.push_back({"luna_channel_tanh_relu_envelope", luna(A::tanh, O::relu, false, true, V::neural)});
  cases.push_back({"luna_shared_gelu_softplus_envelope", luna(A::gelu, O::softplus, true, true, V::neural)});
  AttentionSpec bank = luna(A::relu, O::relu, true, false, V::bank_coef);
  bank.luna.projections = 2;
  bank.luna.channels = 9;  // all 8 bases, and l = 8 wraps to sin
  cases.push_back({"luna_bank_coef", bank, true});
  bank.luna.envelope = true;
  cases.push_back({"luna_bank_coef_envelope", bank, true});
  cases.push_back({"luna_rff_envelope", luna(A::relu, O::relu, true, true, V::rff), true});
  cases.push_back({"performer", small_spec(Family::performer)});
  cases.push_back({"rff", small_spec(Family::rff), true});
  cases.push_back({"elu", small_spec(Family::elu)});
  cases.push_back({"relu", small_spec(Family::relu)});
  cases.push_back({"t2r", small_spec(Family::t2r)});
  cases.push_back({"hedgehog", small_spec(Family::hedgehog)});
  AttentionSpec hh = small_spec(Family::hedgehog);
  hh.hedgehog.features = 3;
  cases.push_back({"hedgehog_f3", hh});
  cases.push_back({"cosformer", small_spec(Family::cosformer)});
  cases.push_back({"slay", small_spec(Family::slay)});
  return cases;
}

// A random problem: q, k, v, dout ~ N(0, 1); params from init_params with N(0,
// 0.1^2) noise on learned tensors (so hedgehog's identity W or bank coefficients
// of 1 cannot hide a transposed or swapped index).
struct Problem {
  AttentionSpec spec;
  AttentionShape shape;
  std::vector<double> q, k, v, params, dout;
};

inline std::vector<double> randn(std::mt19937_64& rng, size_t n, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

inline Problem make_problem(const AttentionSpec& spec, AttentionShape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p{spec, shape, {}, {}, {}, {}, {}};
  const size_t rows = size_t(shape.rows());
  p.q = randn(rng, rows * spec.head_dim);
  p.k = randn(rng, rows * spec.head_dim);
  p.v = randn(rng, rows * spec.value_dim);
  p.dout = randn(rng, rows * spec.value_dim);
  p.params = to_double(init_params(spec, shape.heads, seed));
  const ParamLayout layout = param_layout(spec);
  const int blocks = spec.params_per_head ? shape.heads : 1;
  std::normal_distribution<double> noise(0.0, 0.1);
  for (int b = 0; b < blocks; ++b)
    for (const ParamTensor& t : layout.tensors)
      if (t.learned)
        for (int64_t i = 0; i < t.numel(); ++i) p.params[b * layout.per_head_floats + t.offset + i] += noise(rng);
  return p;
}

// Largest |x_i| (0 for empty).
inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// Expects |got_i - want_i| <= atol + rtol * max|want| for every i; returns the
// largest error as a fraction of that allowance (for reporting the margin).
inline double expect_close(const std::vector<double>& got, const std::vector<double>& want,
                           double rtol, double atol, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return INFINITY;
  const double scale = max_abs(want);
  double worst = 0;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    worst = std::max(worst, err / (atol + rtol * scale));
    if (err > atol + rtol * scale && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (error " << err
                    << ", allowed " << atol + rtol * scale << ")";
  }
  return worst;
}

}  // namespace lunajit::reference::testing
