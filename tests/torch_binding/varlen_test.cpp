// Packed variable-length batches (cu_seqlens, docs/MATH.md §3 "Packed
// sequences") through lunajit::linear_attention: a packed call equals one call
// per sequence (forward and the gradients of q, k, v and the feature-map
// parameters), on the ATen path and on the host-emulated kernels (forward and
// backward kernels, and the ATen gradient fallback), causal and not, for a
// family sample that covers every kind of feature map (learned MLP: luna;
// stabilised random features, with causal performer's running stabiliser:
// performer; positions: cosformer; learned linear + softmax: hedgehog;
// elementwise: elu; quadrature + random features: slay), with sequences of
// length 0 and 1; key_mask served by packing; the modules' key_padding_mask;
// and each bad cu_seqlens named.
//
// Tiles of 8 tokens and chunks of 8 make the longest sequence (19) span three
// tiles and chunks, so blocks past the end of the shorter sequences run (and
// must write zero parameter-gradient slots).
//
// Tolerances, max |a - b| <= atol + rtol * max |b|: 2e-5 + 2e-4 (fp32 on both
// sides; a packed and a per-sequence call may use other split / summation
// orders: the kernels' state partials are the same per block, the ATen path
// runs the very same per-sequence calls, so most comparisons are exact).
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checks.h"
#include "codegen/launch_plan.h"
#include "reference/reference.h"
#include "torch_binding/linear_attention.h"
#include "torch_binding/modules.h"

// Its own namespace: torch_binding_tests is one unity translation unit, and
// op_test.cpp has helpers of the same names (Case, Inputs, ...).
namespace lunajit::varlen_test {
namespace {

using torch::Tensor;
using testing::expect_close;
using testing::expect_rejected;

AttentionSpec make_spec(const std::string& family, const std::string& extra, bool causal) {
  const std::string json = fmt::format(R"({{"family": "{}", "head_dim": 8, "value_dim": 8, "dtype": "fp32", "causal": {}{}{}}})",
                                       family, causal ? "true" : "false", extra.empty() ? "" : ", ", extra);
  return spec_from_string(json).value_or_throw();
}

struct Case {
  std::string name;
  AttentionSpec spec;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> sample_cases() {
  const std::vector<std::pair<std::string, std::string>> fam = {
      {"luna", R"("luna": {"projections": 3, "channels": 2, "mlp_width": 5})"},
      {"performer", R"("performer": {"features": 6})"},
      {"cosformer", ""},
      {"hedgehog", R"("hedgehog": {"features": 8})"},
      {"elu", ""},
      {"slay", R"("slay": {"nodes": 2, "anchors": 3, "prf_features": 4})"}};
  std::vector<Case> out;
  for (const auto& [family, extra] : fam)
    for (bool causal : {false, true})
      out.push_back({fmt::format("{}_{}", family, causal ? "causal" : "full"), make_spec(family, extra, causal)});
  return out;
}

constexpr int kHeads = 2;
const std::vector<int64_t> kLengths = {9, 0, 1, 19};

Tensor offsets(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int64_t n : lengths) cu.push_back(cu.back() + static_cast<int32_t>(n));
  return torch::tensor(cu, torch::kInt);
}

TileConfig small_tiles() {
  return tile_config_from_string(R"({"block_tokens": 8, "warps": 1, "dv_block": 8, "chunk": 8, "state_splits": 2})",
                                 TileConfig())
      .value_or_throw();
}

struct Inputs {
  Tensor q, k, v, params, dout;
};

Inputs packed_inputs(const AttentionSpec& spec, int64_t total, uint64_t seed) {
  torch::manual_seed(seed);
  Inputs in;
  in.q = torch::randn({1, total, kHeads, spec.head_dim});
  in.k = torch::randn({1, total, kHeads, spec.head_dim});
  in.v = torch::randn({1, total, kHeads, spec.value_dim});
  in.dout = torch::randn({1, total, kHeads, spec.value_dim});
  in.params = init_feature_params(spec, kHeads, seed);
  return in;
}


using Fn = std::function<Tensor(Tensor, Tensor, Tensor, Tensor)>;

// {o, dq, dk, dv, dparams} of fn for upstream dout.
std::vector<Tensor> value_and_grads(const Inputs& in, const Fn& fn) {
  std::vector<Tensor> leaves = {in.q.clone().requires_grad_(), in.k.clone().requires_grad_(),
                                in.v.clone().requires_grad_(), in.params.clone().requires_grad_(in.params.numel() > 0)};
  const Tensor o = fn(leaves[0], leaves[1], leaves[2], leaves[3]);
  (o * in.dout).sum().backward();
  std::vector<Tensor> out{o.detach()};
  for (auto& l : leaves) out.push_back(l.grad().defined() ? l.grad() : torch::zeros_like(l));
  return out;
}

const char* kNames[] = {"o", "dq", "dk", "dv", "dparams"};

// The packed call against one call per non-empty sequence (same options, no cu_seqlens).
void expect_packed_equals_per_sequence(const AttentionSpec& spec, const LinearAttentionOptions& base,
                                       const std::string& label) {
  int64_t total = 0;
  for (int64_t n : kLengths) total += n;
  const Inputs in = packed_inputs(spec, total, 31);
  LinearAttentionOptions packed = base;
  packed.cu_seqlens = offsets(kLengths);
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, packed);
  });
  Tensor dparams = torch::zeros_like(in.params);
  int64_t t0 = 0;
  for (size_t s = 0; s < kLengths.size(); ++s) {
    const int64_t n = kLengths[s];
    if (n == 0) continue;
    auto cut = [&](const Tensor& t) { return t.narrow(1, t0, n).contiguous(); };
    const Inputs one{cut(in.q), cut(in.k), cut(in.v), in.params, cut(in.dout)};
    const auto want = value_and_grads(one, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
      return linear_attention(q, k, v, p, spec, base);
    });
    for (int i = 0; i < 4; ++i)
      expect_close(got[i].narrow(1, t0, n), want[i], 2e-5, 2e-4, fmt::format("{} sequence {} {}", label, s, kNames[i]));
    dparams = dparams + want[4];
    t0 += n;
  }
  expect_close(got[4], dparams, 2e-5, 2e-4, label + " dparams");
  if (has_learned_params(spec)) EXPECT_GT(dparams.abs().max().item<double>(), 0.0) << label << ": vacuous dparams";
}

class Varlen : public ::testing::TestWithParam<Case> {};

TEST_P(Varlen, PackedEqualsPerSequenceAten) {
  LinearAttentionOptions o;
  o.path = AttentionPath::aten;
  o.chunk = 4;
  expect_packed_equals_per_sequence(GetParam().spec, o, "aten");
}

TEST_P(Varlen, PackedEqualsPerSequenceHostKernels) {
  LinearAttentionOptions o;
  o.path = AttentionPath::host_kernels;
  o.config = small_tiles();
  expect_packed_equals_per_sequence(GetParam().spec, o, "host kernels");
}

// The packed host kernels against the double reference on the packed batch
// (reference::linear_attention_*_varlen), fp32 kernels vs double: 1e-4 + 1e-3.
TEST_P(Varlen, HostKernelsMatchDoubleReference) {
  const AttentionSpec& spec = GetParam().spec;
  int64_t total = 0;
  for (int64_t n : kLengths) total += n;
  const Inputs in = packed_inputs(spec, total, 32);
  LinearAttentionOptions o;
  o.path = AttentionPath::host_kernels;
  o.config = small_tiles();
  o.cu_seqlens = offsets(kLengths);
  const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
    return linear_attention(q, k, v, p, spec, o);
  });
  auto dbl = [](const Tensor& t) {
    const Tensor c = t.to(torch::kDouble).contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  std::vector<int> cu;
  for (int64_t i = 0; i < o.cu_seqlens.numel(); ++i) cu.push_back(o.cu_seqlens[i].item<int>());
  const auto fwd = reference::linear_attention_forward_varlen(spec, kHeads, cu, dbl(in.q), dbl(in.k), dbl(in.v),
                                                              dbl(in.params));
  ASSERT_TRUE(fwd.ok()) << fwd.error().message;
  const auto g = reference::linear_attention_backward_varlen(spec, kHeads, cu, dbl(in.q), dbl(in.k), dbl(in.v),
                                                             dbl(in.params), dbl(in.dout));
  ASSERT_TRUE(g.ok()) << g.error().message;
  const std::vector<double>* want[] = {&fwd->out, &g->dq, &g->dk, &g->dv, &g->dparams};
  for (int i = 0; i < 5; ++i) {
    const Tensor w = torch::tensor(*want[i], torch::kDouble).reshape(got[i].sizes());
    expect_close(got[i], w, 1e-4, 1e-3, std::string("reference ") + kNames[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Sample, Varlen, ::testing::ValuesIn(sample_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(VarlenHostKernels, AtenGradientFallback) {
  LinearAttentionOptions o;
  o.path = AttentionPath::host_kernels;
  o.config = small_tiles();
  o.kernel_backward = false;
  expect_packed_equals_per_sequence(sample_cases()[1].spec, o, "fallback performer");  // causal luna
}

// Tokens of one sequence never see another's: changing the last sequence
// leaves every output and input gradient of the others bitwise equal.
TEST(VarlenHostKernels, OtherSequencesNeverInfluence) {
  for (bool causal : {false, true}) {
    const AttentionSpec spec = make_spec("performer", R"("performer": {"features": 6})", causal);
    const Inputs in = packed_inputs(spec, 29, 33);
    LinearAttentionOptions o;
    o.path = AttentionPath::host_kernels;
    o.config = small_tiles();
    o.cu_seqlens = offsets(kLengths);
    const Fn fn = [&](Tensor q, Tensor k, Tensor v, Tensor p) { return linear_attention(q, k, v, p, spec, o); };
    const auto base = value_and_grads(in, fn);
    Inputs pert = in;
    pert.k = in.k.clone();
    pert.v = in.v.clone();
    pert.k.narrow(1, 10, 19).mul_(3.0).add_(1.0);  // the last sequence: tokens 10 .. 28
    pert.v.narrow(1, 10, 19).add_(5.0);
    const auto got = value_and_grads(pert, fn);
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(torch::equal(got[i].narrow(1, 0, 10), base[i].narrow(1, 0, 10)))
          << kNames[i] << (causal ? " causal" : " full") << " of sequences 0..2 moved";
    EXPECT_FALSE(torch::equal(got[0].narrow(1, 10, 19), base[0].narrow(1, 10, 19))) << "vacuous";
  }
}

// key_mask on the kernel path (and for cosformer / causal performer on any
// path) is served by packing: a padded batch equals per-sequence calls on the
// real tokens, any padding pattern; pad query rows are 0.
TEST(VarlenKeyMask, PaddedBatchEqualsPerSequenceByPacking) {
  const int64_t N = 10;
  const int64_t len[3] = {10, 4, 1}, start[3] = {0, 0, 7};  // full, right-padded, left-padded
  Tensor keep = torch::zeros({3, N}, torch::kBool);
  for (int b = 0; b < 3; ++b) keep[b].narrow(0, start[b], len[b]).fill_(true);
  for (const Case& c : sample_cases()) {
    if (c.spec.family != Family::cosformer && c.spec.family != Family::performer && c.spec.family != Family::luna)
      continue;
    for (AttentionPath path : {AttentionPath::aten, AttentionPath::host_kernels}) {
      const AttentionSpec& spec = c.spec;
      torch::manual_seed(41);
      Inputs in{torch::randn({3, N, kHeads, 8}), torch::randn({3, N, kHeads, 8}), torch::randn({3, N, kHeads, 8}),
                init_feature_params(spec, kHeads, 41), torch::randn({3, N, kHeads, 8})};
      in.dout = in.dout * keep.reshape({3, N, 1, 1});
      LinearAttentionOptions o;
      o.path = path;
      o.config = small_tiles();
      o.chunk = 4;
      LinearAttentionOptions masked = o;
      masked.key_mask = keep;
      const auto got = value_and_grads(in, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
        return linear_attention(q, k, v, p, spec, masked);
      });
      const std::string label = c.name + (path == AttentionPath::aten ? " aten" : " host kernels");
      Tensor dparams = torch::zeros_like(in.params);
      for (int b = 0; b < 3; ++b) {
        auto cut = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(1, start[b], len[b]).contiguous(); };
        const Inputs one{cut(in.q), cut(in.k), cut(in.v), in.params, cut(in.dout)};
        const auto want = value_and_grads(one, [&](Tensor q, Tensor k, Tensor v, Tensor p) {
          return linear_attention(q, k, v, p, spec, o);
        });
        for (int i = 0; i < 4; ++i)
          expect_close(cut(got[i]), want[i], 2e-5, 2e-4, fmt::format("{} row {} {}", label, b, kNames[i]));
        dparams = dparams + want[4];
      }
      expect_close(got[4], dparams, 2e-5, 2e-4, label + " dparams");
      const Tensor pad = keep.logical_not().reshape({3, N, 1, 1});
      const bool packs = path == AttentionPath::host_kernels || spec.family == Family::cosformer ||
                         (spec.causal && spec.family == Family::performer);
      if (packs) EXPECT_EQ((got[0] * pad).abs().max().item<double>(), 0.0) << label << ": pad query rows are 0";
      EXPECT_EQ((got[2] * pad).abs().max().item<double>(), 0.0) << label << ": pad keys get no gradient";
    }
  }
}

// MultiheadLinearAttention's key_padding_mask on the host kernels (by packing):
// each row's real outputs equal the module on that row's real tokens alone.
TEST(VarlenModules, MultiheadKeyPaddingMaskOnHostKernels) {
  const AttentionSpec spec = make_spec("cosformer", "", true);
  nn::MultiheadOptions mo;
  mo.embed_dim = 16;
  mo.num_heads = kHeads;
  mo.batch_first = true;
  LinearAttentionOptions op;
  op.path = AttentionPath::host_kernels;
  op.config = small_tiles();
  nn::MultiheadLinearAttention mha(mo, spec, op, 5);
  torch::manual_seed(42);
  const int64_t N = 9, len[2] = {9, 3};
  const Tensor x = torch::randn({2, N, 16});
  Tensor pad = torch::zeros({2, N}, torch::kBool);
  pad[1].narrow(0, len[1], N - len[1]).fill_(true);  // torch's meaning: true = padding
  const Tensor out = std::get<0>(mha->forward(x, x, x, pad));
  for (int b = 0; b < 2; ++b) {
    const Tensor xb = x.narrow(0, b, 1).narrow(1, 0, len[b]);
    const Tensor want = std::get<0>(mha->forward(xb, xb, xb));
    expect_close(out.narrow(0, b, 1).narrow(1, 0, len[b]), want, 2e-5, 2e-4, fmt::format("module row {}", b));
  }
}

// ---- bad cu_seqlens ----------------------------------------------------------


TEST(VarlenBadInputs, EachProblemIsNamed) {
  const AttentionSpec spec = make_spec("elu", "", false);
  const Inputs in = packed_inputs(spec, 6, 7);
  auto run = [&](const Tensor& cu, const Tensor& q, AttentionPath path = AttentionPath::aten) {
    LinearAttentionOptions o;
    o.path = path;
    o.cu_seqlens = cu;
    const Tensor k = q.size(0) == 1 ? in.k : torch::randn(q.sizes());
    return linear_attention(q, k, q.size(0) == 1 ? in.v : torch::randn(q.sizes()), in.params, spec, o);
  };
  const Tensor good = torch::tensor({0, 2, 6}, torch::kInt);
  EXPECT_NO_THROW(run(good, in.q));
  EXPECT_NO_THROW(run(good, in.q, AttentionPath::host_kernels));
  expect_rejected([&] { run(good.to(torch::kLong), in.q); }, "cu_seqlens must be int32 (fla's convention), got Long");
  expect_rejected([&] { run(good.reshape({1, 3}), in.q); }, "cu_seqlens must be 1-D [num_seqs + 1], got shape [1, 3]");
  expect_rejected([&] { run(torch::tensor({0}, torch::kInt), in.q); }, "num_seqs + 1 >= 2 offsets, got 1");
  expect_rejected([&] { run(torch::tensor({1, 2, 6}, torch::kInt), in.q); }, "cu_seqlens[0] = 1, must be 0");
  expect_rejected([&] { run(torch::tensor({0, 4, 3, 6}, torch::kInt), in.q); },
                  "non-decreasing, got cu_seqlens[2] = 3 < cu_seqlens[1] = 4");
  expect_rejected([&] { run(torch::tensor({0, 2, 5}, torch::kInt), in.q); },
                  "cu_seqlens[2] = 5, must equal the total tokens q.size(1) = 6");
  expect_rejected([&] { run(good, torch::randn({2, 3, kHeads, 8})); }, "packed as [1, total_tokens, heads, dim], got q "
                  "of batch 2");
  LinearAttentionOptions both;
  both.cu_seqlens = good;
  both.key_mask = torch::ones({1, 6}, torch::kBool);
  expect_rejected([&] { linear_attention(in.q, in.k, in.v, in.params, spec, both); }, "key_mask or cu_seqlens, not both");
}

}  // namespace
}  // namespace lunajit::varlen_test
