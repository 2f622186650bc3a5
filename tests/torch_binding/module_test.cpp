// Modules of torch_binding/modules.h: parameters in the feature_params layout
// and initialisation, gradients reaching every parameter, the quadratic cores
// against the double reference, torch::nn::MultiheadAttention's interface,
// the factory, save/load round trips and the module-level input checks.
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "codegen/feature_params.h"
#include "reference/quadratic_attention.h"
#include "torch_binding/modules.h"

namespace lunajit::nn {
namespace {

using torch::Tensor;

AttentionSpec spec_of(const std::string& json) { return spec_from_string(json).value_or_throw(); }

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".pt")).string();
}

TEST(FeatureMapModule, HoldsInitParamsInTheFlatLayout) {
  const AttentionSpec spec = spec_of(R"({"family": "luna", "head_dim": 8, "dtype": "fp32",
      "luna": {"projections": 3, "channels": 2, "mlp_width": 5}})");
  FeatureMap fm(spec, 3, 11);
  ASSERT_TRUE(fm->learned());
  const std::vector<float> want = init_params(spec, 3, 11);
  ASSERT_EQ(fm->params.numel(), int64_t(want.size()));
  EXPECT_TRUE(torch::equal(fm->params.detach(), torch::from_blob(const_cast<float*>(want.data()),
                                                                  {int64_t(want.size())})));
  EXPECT_EQ(fm->parameters().size(), 1u);
  EXPECT_EQ(fm->tensor("W").sizes(), (std::vector<int64_t>{3, 3, 8}));
  EXPECT_EQ(fm->tensor("W2").sizes(), (std::vector<int64_t>{3, 2, 5}));
  // Head 1's W is the second block's first M*d floats.
  const ParamLayout layout = param_layout(spec);
  EXPECT_TRUE(torch::equal(fm->tensor("W")[1].reshape({-1}),
                           fm->params.narrow(0, layout.per_head_floats, 24)));
}

TEST(FeatureMapModule, FixedFamiliesHoldBuffersAndLearnedOnesParameters) {
  for (const char* fam : {"performer", "rff", "slay"}) {
    FeatureMap fm(spec_of(std::string(R"({"family": ")") + fam + R"(", "head_dim": 8})"), 2);
    EXPECT_FALSE(fm->learned()) << fam;
    EXPECT_TRUE(fm->parameters().empty()) << fam;
    EXPECT_EQ(fm->buffers().size(), 1u) << fam;
  }
  FeatureMap elu(spec_of(R"({"family": "elu", "head_dim": 8})"), 2);
  EXPECT_FALSE(elu->params.defined());
  EXPECT_TRUE(luna_feature_map(8, 2)->learned());
  FeatureMap hh = hedgehog_feature_map(8, 2);
  EXPECT_TRUE(hh->learned());
  EXPECT_TRUE(torch::equal(hh->tensor("W")[0], torch::eye(8)));  // identity init when f = d
  EXPECT_EQ(t2r_feature_map(8, 2, 12)->tensor("W").sizes(), (std::vector<int64_t>{2, 12, 8}));
}

TEST(FeatureMapModule, ForwardIsThePhiOfTheOp) {
  FeatureMap fm = luna_feature_map(8, 2);
  const Tensor x = torch::randn({2, 5, 2, 8});
  EXPECT_EQ(fm->forward(x).sizes(), (std::vector<int64_t>{2, 5, 2, 64}));
  EXPECT_TRUE(torch::allclose(fm->forward(x), feature_map(x, fm->params, fm->spec())));
}

// Every family: loss.backward() reaches every parameter of the layer (the four
// projections, DWC, the feature map of learned families) with a finite, nonzero gradient.
TEST(MultiheadLinearAttentionModule, EveryParameterReceivesAGradient) {
  for (const char* fam : {"luna", "performer", "rff", "elu", "relu", "t2r", "hedgehog", "cosformer", "slay"}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(fam) + (causal ? " causal" : ""));
      MultiheadOptions o;
      o.embed_dim = 32;
      o.num_heads = 4;
      o.dwc = true;
      auto mha = make_multihead_attention(fam, o, causal);
      const Tensor x = torch::randn({9, 3, 32});  // [seq, batch, embed]
      auto [out, w] = mha->forward(x, x, x, {}, false);
      EXPECT_EQ(out.sizes(), x.sizes());
      EXPECT_FALSE(w.defined());
      out.pow(2).sum().backward();
      for (const auto& p : mha->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
        EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
      }
      const bool learned = std::string(fam) == "luna" || std::string(fam) == "t2r" || std::string(fam) == "hedgehog";
      EXPECT_EQ(mha->named_parameters().contains("core.feature_map.params"), learned);
    }
  }
}

// Drop-in: the same call compiles and runs for torch's module and ours.
template <class Mha>
Tensor self_attend(Mha& m, const Tensor& x) {
  return std::get<0>(m->forward(x, x, x));
}

TEST(MultiheadLinearAttentionModule, HasTorchMultiheadAttentionsInterface) {
  torch::nn::MultiheadAttention torch_mha(32, 4);
  MultiheadOptions o;
  o.embed_dim = 32;
  o.num_heads = 4;
  MultiheadLinearAttention ours(o, spec_of(R"({"family": "luna", "head_dim": 8, "dtype": "fp32"})"));
  const Tensor x = torch::randn({6, 2, 32});
  EXPECT_EQ(self_attend(torch_mha, x).sizes(), self_attend(ours, x).sizes());
  auto [out, w] = ours->forward(x, x, x);  // need_weights defaults to true, like torch's
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{2, 6, 6}));
  auto [out2, w_heads] = ours->forward(x, x, x, {}, true, {}, false);
  EXPECT_EQ(w_heads.sizes(), (std::vector<int64_t>{2, 4, 6, 6}));
  // The weights are what the layer applies: rows sum to 1 up to eps.
  EXPECT_TRUE(torch::allclose(w_heads.sum(-1), torch::ones({2, 4, 6}), 1e-4, 1e-4));
}

TEST(MultiheadLinearAttentionModule, BatchFirstEqualsSeqFirst) {
  MultiheadOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  o.dwc = true;
  torch::manual_seed(0);
  auto a = make_multihead_attention("hedgehog", o, true);
  o.batch_first = true;
  torch::manual_seed(0);
  auto b = make_multihead_attention("hedgehog", o, true);
  const Tensor x = torch::randn({7, 3, 16});
  const Tensor ya = std::get<0>(a->forward(x, x, x, {}, false));
  const Tensor yb = std::get<0>(b->forward(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), {}, false));
  EXPECT_TRUE(torch::allclose(ya, yb.transpose(0, 1), 1e-5, 1e-5));
}

TEST(MultiheadLinearAttentionModule, CausalOutputIgnoresTheFuture) {
  MultiheadOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  o.dwc = true;
  for (const char* kind : {"luna", "performer", "softmax", "yat", "spherical_yat"}) {
    SCOPED_TRACE(kind);
    auto m = make_multihead_attention(kind, o, true);
    Tensor x = torch::randn({8, 2, 16});
    const Tensor y = std::get<0>(m->forward(x, x, x, {}, false));
    x[7] = torch::randn({2, 16});
    const Tensor y2 = std::get<0>(m->forward(x, x, x, {}, false));
    EXPECT_TRUE(torch::allclose(y.narrow(0, 0, 7), y2.narrow(0, 0, 7), 1e-5, 1e-5));
  }
}

// Causal performer maps keys per query row (docs/MATH.md §2): weights() must be
// the matrix forward() applies, o = A v, with a kernel_eps large enough that the
// old one-max-per-sequence key features would give other weights.
TEST(LinearAttentionModule, CausalPerformerWeightsAreWhatTheForwardApplies) {
  AttentionSpec spec = spec_of(R"({"family": "performer", "head_dim": 8, "value_dim": 8, "dtype": "fp32",
                                   "causal": true, "performer": {"features": 6, "kernel_eps": 0.1}})");
  LinearAttention core(spec, 2);
  torch::manual_seed(3);
  const Tensor q = torch::randn({1, 9, 2, 8}), k = torch::randn({1, 9, 2, 8}), v = torch::randn({1, 9, 2, 8});
  const Tensor o = core->forward(q, k, v);
  const Tensor A = core->weights(q, k);  // [B, H, N, N]
  EXPECT_TRUE(torch::allclose(torch::einsum("bhij,bjhd->bihd", {A, v}), o, 1e-5, 1e-5));
  EXPECT_EQ(A.triu(1).abs().max().item<double>(), 0.0);
}

TEST(QuadraticAttentionModule, MatchesDoubleReference) {
  const int B = 2, N = 5, H = 2, d = 4, dv = 3;
  torch::manual_seed(1);
  const Tensor q = torch::randn({B, N, H, d}, torch::kDouble), k = torch::randn({B, N, H, d}, torch::kDouble),
               v = torch::randn({B, N, H, dv}, torch::kDouble);
  auto vec = [](const Tensor& t) { return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel()); };
  const std::pair<aten::QuadraticKind, reference::QuadraticKernel> kinds[] = {
      {aten::QuadraticKind::softmax, reference::QuadraticKernel::softmax},
      {aten::QuadraticKind::yat, reference::QuadraticKernel::yat},
      {aten::QuadraticKind::spherical_yat, reference::QuadraticKernel::spherical_yat}};
  for (const auto& [kind, ref_kind] : kinds) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(aten::to_string(kind)) + (causal ? " causal" : ""));
      aten::QuadraticOptions o;
      o.kind = kind;
      o.causal = causal;
      QuadraticAttention core(o);
      reference::QuadraticOptions ro;
      ro.kernel = ref_kind;
      ro.causal = causal;
      auto want = reference::quadratic_attention(ro, {B, N, H}, d, dv, vec(q), vec(k), vec(v));
      ASSERT_TRUE(want.ok()) << want.error().message;
      const Tensor got = core->forward(q, k, v).contiguous();
      const Tensor ref = torch::from_blob(want->data(), {B, N, H, dv}, torch::kDouble);
      EXPECT_LE((got - ref).abs().max().item<double>(), 1e-10);
    }
  }
}

TEST(Factory, BuildsEveryKind) {
  MultiheadOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  EXPECT_NE(dynamic_cast<MultiheadQuadraticAttentionImpl*>(make_multihead_attention("softmax", o).get()), nullptr);
  EXPECT_NE(dynamic_cast<MultiheadQuadraticAttentionImpl*>(make_multihead_attention("spherical-yat", o).get()),
            nullptr);
  auto from_json = make_multihead_attention(
      R"({"family": "performer", "head_dim": 8, "causal": true, "dtype": "fp32", "performer": {"features": 16}})", o);
  auto* linear = dynamic_cast<MultiheadLinearAttentionImpl*>(from_json.get());
  ASSERT_NE(linear, nullptr);
  EXPECT_TRUE(linear->linear()->spec().causal);
  EXPECT_EQ(linear->linear()->spec().performer.features, 16);
  try {
    make_multihead_attention("lunar", o);
    ADD_FAILURE() << "accepted 'lunar'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not softmax/yat/spherical_yat, a family name, nor a readable spec"),
              std::string::npos) << e.what();
  }
}

TEST(SaveLoad, RoundTripsEveryFamily) {
  for (const char* fam : {"luna", "performer", "t2r", "hedgehog", "slay", "elu"}) {
    SCOPED_TRACE(fam);
    MultiheadOptions o;
    o.embed_dim = 16;
    o.num_heads = 2;
    o.dwc = true;
    torch::manual_seed(1);
    auto a = std::make_shared<MultiheadLinearAttentionImpl>(
        o, spec_of(std::string(R"({"family": ")") + fam + R"(", "head_dim": 8, "dtype": "fp32"})"),
        LinearAttentionOptions{}, 1);
    torch::manual_seed(2);
    auto b = std::make_shared<MultiheadLinearAttentionImpl>(
        o, spec_of(std::string(R"({"family": ")") + fam + R"(", "head_dim": 8, "dtype": "fp32"})"),
        LinearAttentionOptions{}, 2);
    const std::string file = temp_file(std::string("lunajit_saveload_") + fam);
    torch::save(MultiheadLinearAttention(a), file);
    MultiheadLinearAttention loaded(b);
    torch::load(loaded, file);
    std::filesystem::remove(file);
    const Tensor x = torch::randn({5, 2, 16});
    EXPECT_TRUE(torch::equal(std::get<0>(a->forward(x, x, x, {}, false)), std::get<0>(b->forward(x, x, x, {}, false))));
    auto pa = a->named_parameters(), pb = b->named_parameters();
    for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  }
}

void expect_rejected(const std::function<void()>& fn, const std::string& message) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected an error containing: " << message;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what_without_backtrace();
  }
}

TEST(ModuleBadInputs, AreRejectedWithTheirMessages) {
  MultiheadOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  auto m = make_multihead_attention("luna", o);
  const Tensor x = torch::randn({5, 2, 16});
  expect_rejected([&] { m->forward(x, x, x, torch::zeros({2, 5}, torch::kBool)); }, "key_padding_mask is not supported");
  expect_rejected([&] { m->forward(x, x, x, {}, false, torch::zeros({5, 5})); }, "attn_mask is not supported");
  expect_rejected([&] { m->forward(torch::randn({5, 2, 8}), x, x); }, "query, key and value must be [seq, batch, 16]");
  expect_rejected([&] { m->forward(x, x.narrow(0, 0, 4), x.narrow(0, 0, 4)); }, "must have the same shape");
  o.num_heads = 3;
  expect_rejected([&] { make_multihead_attention("softmax", o); }, "must be a multiple of num_heads");
  o.num_heads = 2;
  expect_rejected([&] { MultiheadLinearAttention(o, spec_of(R"({"family": "luna", "head_dim": 4})")); },
                  "must both be embed_dim / num_heads");
}

TEST(GpuModules, TrainStepOnCuda) {
  if (!cuda_kernels_available()) GTEST_SKIP() << "no CUDA GPU / Torch built without CUDA";
  MultiheadOptions o;
  o.embed_dim = 64;
  o.num_heads = 4;
  o.dwc = true;
  auto m = make_multihead_attention("luna", o, true);
  m->to(torch::kCUDA);
  const Tensor x = torch::randn({128, 2, 64}, torch::kCUDA);
  auto [out, w] = m->forward(x, x, x, {}, false);
  out.pow(2).sum().backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
}

}  // namespace
}  // namespace lunajit::nn
