// Modules of torch_binding/modules.h: parameters in the feature_params layout
// and initialisation, gradients reaching every parameter, the quadratic cores
// against the double reference, torch::nn::MultiheadAttention's interface,
// the factory, save/load round trips and the module-level input checks.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "codegen/feature_params.h"
#include "plain_composition.h"
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
  auto [out0, none] = ours->forward(x, x, x);  // need_weights defaults to false (torch's: true)
  EXPECT_FALSE(none.defined());
  auto [out, w] = ours->forward(x, x, x, {}, true);
  EXPECT_TRUE(torch::equal(out0, out));
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
  expect_rejected([&] { m->forward(x, x, x, torch::zeros({2, 5})); }, "key_padding_mask must be bool (true = padding)");
  expect_rejected([&] { m->forward(x, x, x, torch::zeros({2, 4}, torch::kBool)); },
                  "key_padding_mask must be [batch, seq_k] = [2, 5]");
  expect_rejected([&] { m->forward(x, x, x, {}, false, torch::zeros({5, 5})); }, "attn_mask is not supported");
  expect_rejected([&] { m->forward(torch::randn({5, 2, 8}), x, x); }, "query, key and value must be [seq, batch, 16]");
  expect_rejected([&] { m->forward(x, x.narrow(0, 0, 4), x); }, "key and value must have the same shape");
  expect_rejected([&] { m->forward(x, x.narrow(1, 0, 1), x.narrow(1, 0, 1)); }, "with query's batch");
  auto causal = make_multihead_attention("luna", o, true);
  expect_rejected([&] { causal->forward(x, x.narrow(0, 0, 4), x.narrow(0, 0, 4)); },
                  "a causal core needs key and value as long as query (seq 5), got seq_k = 4");
  auto cosformer = make_multihead_attention("cosformer", o);
  // cosformer takes key_padding_mask by packing (varlen_test.cpp checks the values); its weights do not.
  EXPECT_NO_THROW(cosformer->forward(x, x, x, torch::zeros({2, 5}, torch::kBool)));
  expect_rejected([&] { cosformer->forward(x, x, x, torch::zeros({2, 5}, torch::kBool), true); },
                  "key_mask is not supported for cosformer and causal performer");
  o.num_kv_heads = 3;
  expect_rejected([&] { make_multihead_attention("luna", o); }, "num_kv_heads (3) must divide num_heads (2)");
  o.num_kv_heads = 1;
  o.dwc = true;
  expect_rejected([&] { make_multihead_attention("luna", o); }, "dwc needs num_kv_heads == num_heads");
  o.num_kv_heads = 0;
  o.dwc = false;
  o.num_heads = 3;
  expect_rejected([&] { make_multihead_attention("softmax", o); }, "must be a multiple of num_heads");
  o.num_heads = 2;
  expect_rejected([&] { MultiheadLinearAttention(o, spec_of(R"({"family": "luna", "head_dim": 4})")); },
                  "must both be embed_dim / num_heads");
}

// ---- key padding, GQA, cross-attention -------------------------------------

// [seq 6, batch 3] with batch 0 full, 1 right-padded to 3 tokens, 2 left-padded to 2.
constexpr int64_t kStart[3] = {0, 0, 4}, kLen[3] = {6, 3, 2};
Tensor padding_mask() {  // torch's meaning: true = padding
  Tensor pad = torch::ones({3, 6}, torch::kBool);
  for (int b = 0; b < 3; ++b) pad[b].narrow(0, kStart[b], kLen[b]).fill_(false);
  return pad;
}

TEST(MultiheadKeyPadding, PaddedBatchEqualsPerSequenceCallsAndIgnoresPads) {
  MultiheadOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  for (const char* kind : {"luna", "performer", "hedgehog", "softmax"})
    for (bool causal : {false, true})
      for (bool dwc : {false, true}) {
        if (causal && std::string(kind) == "performer") continue;  // rejected: ModuleBadInputs
        o.dwc = dwc;
        torch::manual_seed(3);
        auto m = make_multihead_attention(kind, o, causal);
        const std::string what = fmt::format("{} causal={} dwc={}", kind, causal, dwc);
        const Tensor x = torch::randn({6, 3, 16});
        const Tensor pad = padding_mask();
        const auto [y, w] = m->forward(x, x, x, pad, true);
        for (int b = 0; b < 3; ++b) {
          const Tensor xb = x.narrow(1, b, 1).narrow(0, kStart[b], kLen[b]);
          const Tensor want = std::get<0>(m->forward(xb, xb, xb));
          const Tensor got = y.narrow(1, b, 1).narrow(0, kStart[b], kLen[b]);
          EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5))
              << what << " sequence " << b << ": max diff " << (got - want).abs().max().item<double>();
        }
        // Weights of pad keys are zero in real query rows (a causal softmax pad row
        // that sees only pad keys is NaN, as in torch's MultiheadAttention).
        const Tensor real_rows = pad.logical_not().unsqueeze(-1);  // (B, Nq, 1)
        const Tensor w_real = torch::where(real_rows, w, torch::zeros_like(w));
        EXPECT_EQ((w_real * pad.unsqueeze(1)).abs().max().item<double>(), 0.0) << what;
        // Other pad tokens: the real tokens' outputs are bitwise the same.
        const Tensor x2 = torch::where(pad.t().unsqueeze(-1), 10 * torch::randn_like(x), x);
        const Tensor y2 = std::get<0>(m->forward(x2, x2, x2, pad));
        const Tensor real = pad.logical_not().t().unsqueeze(-1);  // (N, B, 1)
        EXPECT_TRUE(torch::equal(torch::where(real, y, torch::zeros_like(y)),
                                 torch::where(real, y2, torch::zeros_like(y2)))) << what;
      }
}

TEST(MultiheadGqa, EqualsTheCompositionWithRepeatedKvHeads) {
  MultiheadOptions o;
  o.embed_dim = 16;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.batch_first = true;
  const AttentionSpec spec = spec_of(R"({"family": "luna", "head_dim": 4, "dtype": "fp32", "causal": true})");
  MultiheadLinearAttention m(o, spec);
  EXPECT_EQ(m->k_proj->weight.sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(m->v_proj->weight.sizes(), (std::vector<int64_t>{8, 16}));
  const Tensor x = torch::randn({2, 5, 16});
  const Tensor y = std::get<0>(m->forward(x, x, x));
  const Tensor q = m->q_proj->forward(x).reshape({2, 5, 4, 4});
  const Tensor k = m->k_proj->forward(x).reshape({2, 5, 2, 4}).repeat_interleave(2, 2);
  const Tensor v = m->v_proj->forward(x).reshape({2, 5, 2, 4}).repeat_interleave(2, 2);
  const Tensor want = m->out_proj->forward(
      testing::plain_linear_attention(q, k, v, m->linear()->feature_map->params, spec).reshape({2, 5, 16}));
  EXPECT_TRUE(torch::allclose(y, want, 1e-5, 1e-5)) << (y - want).abs().max().item<double>();
  // The softmax core too: the same with repeated heads through torch's composition.
  auto sm = make_multihead_attention("softmax", o);
  const Tensor ys = std::get<0>(sm->forward(x, x, x));
  const Tensor qs = sm->q_proj->forward(x).reshape({2, 5, 4, 4}).transpose(1, 2);
  const Tensor ks = sm->k_proj->forward(x).reshape({2, 5, 2, 4}).repeat_interleave(2, 2).transpose(1, 2);
  const Tensor vs = sm->v_proj->forward(x).reshape({2, 5, 2, 4}).repeat_interleave(2, 2).transpose(1, 2);
  const Tensor ws = torch::softmax(torch::matmul(qs, ks.transpose(-1, -2)) / 2.0, -1);
  const Tensor wants = sm->out_proj->forward(torch::matmul(ws, vs).transpose(1, 2).reshape({2, 5, 16}));
  EXPECT_TRUE(torch::allclose(ys, wants, 1e-5, 1e-5)) << (ys - wants).abs().max().item<double>();
}

TEST(MultiheadCrossAttention, KeysOfAnotherLengthMatchThePlainComposition) {
  MultiheadOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  const AttentionSpec spec = spec_of(R"({"family": "hedgehog", "head_dim": 8, "dtype": "fp32"})");
  MultiheadLinearAttention m(o, spec);
  const Tensor query = torch::randn({4, 2, 16}), mem = torch::randn({7, 2, 16});
  const auto [y, w] = m->forward(query, mem, mem, {}, true);
  EXPECT_EQ(y.sizes(), query.sizes());
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{2, 4, 7}));
  EXPECT_TRUE(torch::allclose(w.sum(-1), torch::ones({2, 4}), 1e-5, 1e-5));
  auto bm = [](const Tensor& t, int64_t n) { return t.transpose(0, 1).reshape({2, n, 2, 8}); };
  const Tensor o_heads = testing::plain_linear_attention(bm(m->q_proj->forward(query), 4), bm(m->k_proj->forward(mem), 7),
                                                         bm(m->v_proj->forward(mem), 7),
                                                         m->linear()->feature_map->params, spec);
  const Tensor want = m->out_proj->forward(o_heads.reshape({2, 4, 16})).transpose(0, 1);
  EXPECT_TRUE(torch::allclose(y, want, 1e-5, 1e-5)) << (y - want).abs().max().item<double>();
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
