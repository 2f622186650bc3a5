// AttentionSpec: JSON round trips, defaults, and every rejection the README promises.
#include "codegen/attention_spec.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace lunajit {
namespace {

TEST(AttentionSpec, DefaultLunaMatchesArchitectureDoc) {
  auto r = spec_from_string(R"({"family": "luna"})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const AttentionSpec& s = *r;
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.value_dim, 64);
  EXPECT_FALSE(s.causal);
  EXPECT_EQ(s.dtype, DType::bf16);
  EXPECT_TRUE(s.normalize);
  EXPECT_DOUBLE_EQ(s.eps, 1e-6);
  EXPECT_EQ(s.luna.projections, 8);
  EXPECT_EQ(s.luna.channels, 8);
  EXPECT_EQ(s.luna.mlp_width, 64);
  EXPECT_EQ(s.feature_dim(), 64);
  EXPECT_EQ(s, default_spec(Family::luna));
}

TEST(AttentionSpec, ValueDimDefaultsToHeadDim) {
  auto r = spec_from_string(R"({"family": "elu", "head_dim": 48})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value_dim, 48);
  EXPECT_EQ(r->feature_dim(), 48);
}

TEST(AttentionSpec, FeatureDimPerFamily) {
  auto dim = [](const char* json) { return spec_from_string(json).value_or_throw().feature_dim(); };
  EXPECT_EQ(dim(R"({"family":"luna","luna":{"projections":6,"channels":5}})"), 30);
  EXPECT_EQ(dim(R"({"family":"luna","luna":{"projections":6,"channels":2,"variant":"rff"}})"), 12);
  EXPECT_EQ(dim(R"({"family":"performer","performer":{"features":96}})"), 96);
  EXPECT_EQ(dim(R"({"family":"rff","rff":{"features":20}})"), 40);
  EXPECT_EQ(dim(R"({"family":"relu","head_dim":96})"), 96);
  EXPECT_EQ(dim(R"({"family":"t2r","head_dim":48})"), 48);
  EXPECT_EQ(dim(R"({"family":"hedgehog","hedgehog":{"features":16}})"), 32);
  EXPECT_EQ(dim(R"({"family":"cosformer","head_dim":32})"), 64);
  EXPECT_EQ(dim(R"({"family":"slay"})"), 3 * 8 * 16);
}

TEST(AttentionSpec, JsonRoundTripIsCanonical) {
  for (Family f : kAllFamilies) {
    AttentionSpec s = default_spec(f);
    s.causal = true;
    s.dtype = DType::fp16;
    auto back = spec_from_json(to_json(s));
    ASSERT_TRUE(back.ok()) << to_string(f) << ": " << back.error().message;
    EXPECT_EQ(*back, s) << to_string(f);
    EXPECT_EQ(canonical_json(*back), canonical_json(s));
  }
}

TEST(AttentionSpec, HashIgnoresKeyOrderAndDefaults) {
  auto a = spec_from_string(R"({"family":"luna","causal":true})").value_or_throw();
  auto b = spec_from_string(R"({"causal":true,"family":"luna","head_dim":64,"luna":{"projections":8}})")
               .value_or_throw();
  EXPECT_EQ(spec_hash(a), spec_hash(b));
  auto c = spec_from_string(R"({"family":"luna","causal":false})").value_or_throw();
  EXPECT_NE(spec_hash(a), spec_hash(c));
  EXPECT_EQ(spec_hash(a).size(), 32u);
}

struct Rejection {
  const char* json;
  const char* must_mention;
};

class SpecRejection : public ::testing::TestWithParam<Rejection> {};

TEST_P(SpecRejection, NamesFieldAndAllowedRange) {
  auto r = spec_from_string(GetParam().json);
  ASSERT_FALSE(r.ok()) << "accepted: " << GetParam().json;
  EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(r.error().message.find(GetParam().must_mention), std::string::npos)
      << "message: " << r.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    AllBadFields, SpecRejection,
    ::testing::Values(
        Rejection{R"({"head_dim": 64})", "family: missing"},
        Rejection{R"({"family": "softmax"})", "family = \"softmax\": unknown value; allowed: luna, performer"},
        Rejection{R"({"family": "luna", "colour": 3})", "colour: unknown field"},
        Rejection{R"({"family": "luna", "luna": {"projections": 0}})", "luna.projections = 0: must be in [1, 64]"},
        Rejection{R"({"family": "luna", "luna": {"depth": 2}})", "luna.depth: unknown field"},
        Rejection{R"({"family": "luna", "performer": {"features": 2}})", "performer: unknown field"},
        Rejection{R"({"family": "luna", "head_dim": 0})", "head_dim = 0: must be in [1, 256]"},
        Rejection{R"({"family": "luna", "head_dim": 512})", "head_dim = 512: must be in [1, 256]"},
        Rejection{R"({"family": "luna", "value_dim": 0})", "value_dim = 0: must be in [1, 256]"},
        Rejection{R"({"family": "luna", "eps": 0})", "eps = 0: must be a finite number in [1.17549e-38, 1]"},
        Rejection{R"({"family": "luna", "eps": -1e-6})", "eps = -1e-06: must be a finite number in [1.17549e-38, 1]"},
        Rejection{R"({"family": "luna", "dtype": "fp8"})", "dtype = \"fp8\": unknown value; allowed: fp32, fp16, bf16"},
        Rejection{R"({"family": "luna", "causal": "yes"})", "causal = \"yes\": expected true or false"},
        Rejection{R"({"family": "luna", "head_dim": 6.5})", "head_dim = 6.5: expected an integer"},
        Rejection{R"({"family": "luna", "luna": {"activation": "swish"}})",
                  "luna.activation = \"swish\": unknown value; allowed: relu, gelu, silu, tanh"},
        Rejection{R"({"family": "luna", "luna": {"variant": "rff"}})", "luna.channels = 8: variant \"rff\""},
        Rejection{R"({"family": "luna", "luna": {"mlp_width": 1000}})", "luna.mlp_width = 1000"},
        Rejection{R"({"family": "performer", "performer": {"features": 0}})", "performer.features = 0"},
        Rejection{R"({"family": "performer", "performer": {"kernel_eps": -1}})", "performer.kernel_eps = -1"},
        Rejection{R"({"family": "slay", "slay": {"eps_yat": 0}})", "slay.eps_yat = 0"},
        Rejection{R"({"family": "slay", "slay": {"nodes": 16, "anchors": 64, "prf_features": 64}})",
                  "feature dimension D = 65536"},
        Rejection{R"({"family": "hedgehog", "hedgehog": {"features": -2}})", "hedgehog.features = -2"},
        Rejection{R"([1, 2])", "expected a JSON object"},
        Rejection{R"({"family": )", "not valid JSON"}));

}  // namespace
}  // namespace lunajit
