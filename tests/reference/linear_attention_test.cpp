// Forward linear attention of the reference: a hand-computed case, causal against
// non-causal on prefixes, the recurrence against MATH.md's chunked form and the
// O(n^2) masked matrix, shared against per-head parameters, and input checks.
//
// Tolerance 1e-12 relative: these compare two double evaluations of the same sums
// in different orders (a few dozen terms, rounding ~1e-15); any formula error is O(1).
#include <gtest/gtest.h>

#include "reference_test_util.h"

namespace lunajit::reference::testing {
namespace {

constexpr double kSameSums = 1e-12;

// The first `len` tokens of a [batch, seq, heads, width] tensor.
std::vector<double> prefix(const std::vector<double>& x, const AttentionShape& s, int width, int len) {
  std::vector<double> out;
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < len; ++t)
      for (int h = 0; h < s.heads; ++h) {
        const double* row = x.data() + s.row(b, t, h) * width;
        out.insert(out.end(), row, row + width);
      }
  return out;
}

TEST(LinearAttention, HandComputedReluCase) {
  // relu features, d = 2, dv = 1, eps = 0: S = [1,1]*1 + [2,0]*3 = [7,1], z = [3,1].
  AttentionSpec spec = small_spec(Family::relu, 2, 1);
  spec.eps = 0;
  const AttentionShape shape{1, 2, 1};
  const std::vector<double> q{1, 0, 0, 1}, k{1, 1, 2, 0}, v{1, 3};
  Result<ForwardResult> full = linear_attention_forward(spec, shape, q, k, v, {});
  ASSERT_TRUE(full.ok()) << full.error().message;
  EXPECT_NEAR(full->out[0], 7.0 / 3.0, 1e-15);
  EXPECT_NEAR(full->out[1], 1.0, 1e-15);
  spec.causal = true;  // query 0 sees key 0 only: S = [1,1], z = [1,1]
  Result<ForwardResult> causal = linear_attention_forward(spec, shape, q, k, v, {});
  ASSERT_TRUE(causal.ok());
  EXPECT_NEAR(causal->out[0], 1.0, 1e-15);
  EXPECT_NEAR(causal->out[1], 1.0, 1e-15);
  spec.normalize = false;  // query 1 = [0,1]: phi^T S = 1 (causal, both keys)
  spec.causal = false;
  Result<ForwardResult> raw = linear_attention_forward(spec, shape, q, k, v, {});
  ASSERT_TRUE(raw.ok());
  EXPECT_NEAR(raw->out[0], 7.0, 1e-15);
  EXPECT_NEAR(raw->out[1], 1.0, 1e-15);
}

// Causal row t equals non-causal attention over the first t+1 tokens, every
// stabilizer recomputed on the prefix: the defining property of the causal
// performer convention (MATH.md §2: query t shifts its keys by the max over the
// keys it sees). cosformer's features depend on the sequence length, so it is
// checked per head on features below.
TEST(LinearAttention, CausalEqualsNonCausalOnPrefixes) {
  for (const SpecCase& c : all_spec_cases()) {
    if (c.spec.family == Family::cosformer) continue;
    for (bool normalize : {true, false}) {
      if (normalize && c.signed_features) continue;
      AttentionSpec spec = c.spec;
      spec.normalize = normalize;
      spec.causal = true;
      const Problem p = make_problem(spec, {2, 6, 2}, 5);
      Result<ForwardResult> causal = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, p.params);
      ASSERT_TRUE(causal.ok()) << c.name;
      spec.causal = false;
      for (int len = 1; len <= p.shape.seq; ++len) {
        const AttentionShape ps{p.shape.batch, len, p.shape.heads};
        Result<ForwardResult> pre = linear_attention_forward(
            spec, ps, prefix(p.q, p.shape, spec.head_dim, len), prefix(p.k, p.shape, spec.head_dim, len),
            prefix(p.v, p.shape, spec.value_dim, len), p.params);
        ASSERT_TRUE(pre.ok()) << c.name << ": " << pre.error().message;
        std::vector<double> got, want;
        for (int b = 0; b < p.shape.batch; ++b)
          for (int h = 0; h < p.shape.heads; ++h)
            for (int j = 0; j < spec.value_dim; ++j) {
              got.push_back(causal->out[p.shape.row(b, len - 1, h) * spec.value_dim + j]);
              want.push_back(pre->out[ps.row(b, len - 1, h) * spec.value_dim + j]);
            }
        expect_close(got, want, kSameSums, 0, c.name + " prefix " + std::to_string(len));
      }
    }
  }
}

// Sets key (b, j, h) to x' = omega_0 of its head, the input that maximizes
// e_0 = omega_0 . x' - |x'|^2/2 (at |omega_0|^2/2): it becomes the largest key
// stabilizer of the sequence.
void make_dominant_key(Problem& p, int b, int j, int h) {
  const ParamLayout layout = param_layout(p.spec);
  const int64_t base = (p.spec.params_per_head ? h * layout.per_head_floats : 0) + layout.find("omega")->offset;
  const double scale = std::pow(double(p.spec.head_dim), 0.25);  // x = d^{1/4} x'
  for (int c = 0; c < p.spec.head_dim; ++c) p.k[p.shape.row(b, j, h) * p.spec.head_dim + c] = scale * p.params[base + c];
}

// Causal performer: changing key (and value) j leaves outputs i < j bitwise
// unchanged. The perturbation makes k_j the dominant key, so under a stabilizer
// shared by all keys every earlier output would move by O(kernel_eps) relative,
// far above rounding; with the running max M_i no value computed for rows i < j
// depends on k_j at all, hence exact equality. kernel_eps = 0.1 and eps = 1e-3
// make any leak large.
TEST(LinearAttention, CausalPerformerNoFutureLeak) {
  AttentionSpec spec = small_spec(Family::performer);
  spec.causal = true;
  spec.performer.kernel_eps = 0.1;
  spec.eps = 1e-3;
  for (bool normalize : {true, false}) {
    spec.normalize = normalize;
    const Problem p = make_problem(spec, {2, 7, 2}, 21);
    Result<ForwardResult> base = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, p.params);
    ASSERT_TRUE(base.ok()) << base.error().message;
    Result<Gradients> gbase = linear_attention_backward(spec, p.shape, p.q, p.k, p.v, p.params, p.dout);
    ASSERT_TRUE(gbase.ok()) << gbase.error().message;
    for (int j = 1; j < p.shape.seq; ++j) {
      Problem q = p;
      for (int b = 0; b < p.shape.batch; ++b)
        for (int h = 0; h < p.shape.heads; ++h) {
          make_dominant_key(q, b, j, h);
          for (int c = 0; c < spec.value_dim; ++c) q.v[p.shape.row(b, j, h) * spec.value_dim + c] += 1.0;
        }
      Result<ForwardResult> pert = linear_attention_forward(spec, q.shape, q.q, q.k, q.v, q.params);
      ASSERT_TRUE(pert.ok());
      Result<Gradients> gpert = linear_attention_backward(spec, q.shape, q.q, q.k, q.v, q.params, q.dout);
      ASSERT_TRUE(gpert.ok());
      bool later_changed = false;
      for (int b = 0; b < p.shape.batch; ++b)
        for (int h = 0; h < p.shape.heads; ++h)
          for (int i = 0; i < p.shape.seq; ++i) {
            for (int c = 0; c < spec.value_dim; ++c) {
              const int64_t at = p.shape.row(b, i, h) * spec.value_dim + c;
              if (i < j) EXPECT_EQ(pert->out[at], base->out[at]) << "o row " << i << " moved with key " << j;
              else later_changed |= pert->out[at] != base->out[at];
            }
            // dq_i depends on keys j' <= i only.
            for (int c = 0; c < spec.head_dim && i < j; ++c) {
              const int64_t at = p.shape.row(b, i, h) * spec.head_dim + c;
              EXPECT_EQ(gpert->dq[at], gbase->dq[at]) << "dq row " << i << " moved with key " << j;
            }
          }
      EXPECT_TRUE(later_changed) << "perturbing key " << j << " changed nothing: the test is vacuous";
    }
  }
}

// The previous convention (one key max over the whole sequence) leaks: the same
// perturbation moves earlier rows. Shows the test above can fail.
TEST(LinearAttention, SharedKeyStabilizerLeaksIntoEarlierRows) {
  AttentionSpec spec = small_spec(Family::performer);
  spec.causal = true;
  spec.performer.kernel_eps = 0.1;
  const Problem p = make_problem(spec, {1, 5, 1}, 21);
  Problem q = p;
  make_dominant_key(q, 0, 4, 0);
  Result<ForwardResult> base = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, p.params);
  Result<ForwardResult> pert = linear_attention_forward(spec, q.shape, q.q, q.k, q.v, q.params);
  ASSERT_TRUE(base.ok() && pert.ok());
  // Freeze the perturbed run's running key max at its last (global) value for every row.
  Stabilizers shared = pert->stab;
  std::fill(shared.key_running.begin(), shared.key_running.end(), shared.key[0]);
  Stabilizers shared_base = base->stab;
  std::fill(shared_base.key_running.begin(), shared_base.key_running.end(), shared_base.key[0]);
  Result<ForwardResult> old_base = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, p.params, &shared_base);
  Result<ForwardResult> old_pert = linear_attention_forward(spec, q.shape, q.q, q.k, q.v, q.params, &shared);
  ASSERT_TRUE(old_base.ok() && old_pert.ok());
  // Row 3 sees keys 0..3 (row 0 sees one key, whose weight normalizes to ~1 whatever the shift).
  const int64_t at = 3 * spec.value_dim;
  EXPECT_GT(std::abs(old_pert->out[at] - old_base->out[at]), 1e-3 * std::abs(old_base->out[at]));
  EXPECT_EQ(pert->out[at], base->out[at]);
}

// Random positive features (a stand-in for any family, cosformer included).
struct HeadFeatures {
  int n = 7, D = 5, dv = 3;
  std::vector<double> phi_q, phi_k, v;
};

HeadFeatures random_features(uint64_t seed) {
  std::mt19937_64 rng(seed);
  HeadFeatures f;
  f.phi_q = randn(rng, size_t(f.n) * f.D);
  f.phi_k = randn(rng, size_t(f.n) * f.D);
  for (double& x : f.phi_q) x = std::exp(x);
  for (double& x : f.phi_k) x = std::exp(x);
  f.v = randn(rng, size_t(f.n) * f.dv);
  return f;
}

TEST(LinearAttentionHead, CausalEqualsNonCausalOnPrefixes) {
  const HeadFeatures f = random_features(11);
  for (bool normalize : {true, false}) {
    std::vector<double> causal(size_t(f.n) * f.dv);
    linear_attention_head(f.phi_q.data(), f.phi_k.data(), f.v.data(), f.n, f.D, f.dv, {true, normalize, 1e-6}, causal.data());
    for (int len = 1; len <= f.n; ++len) {
      std::vector<double> full(size_t(len) * f.dv);
      linear_attention_head(f.phi_q.data(), f.phi_k.data(), f.v.data(), len, f.D, f.dv, {false, normalize, 1e-6}, full.data());
      expect_close({causal.begin() + (len - 1) * f.dv, causal.begin() + len * f.dv},
                   {full.end() - f.dv, full.end()}, kSameSums, 0, "prefix " + std::to_string(len));
    }
  }
}

TEST(LinearAttentionHead, ChunkedEqualsRecurrent) {
  const HeadFeatures f = random_features(12);
  for (bool normalize : {true, false}) {
    const AttentionMode mode{true, normalize, 1e-6};
    std::vector<double> rec(size_t(f.n) * f.dv), chunked(rec.size());
    linear_attention_head(f.phi_q.data(), f.phi_k.data(), f.v.data(), f.n, f.D, f.dv, mode, rec.data());
    for (int chunk : {1, 2, 3, 4, 7, 9}) {
      linear_attention_head_chunked(f.phi_q.data(), f.phi_k.data(), f.v.data(), f.n, f.D, f.dv, mode, chunk, chunked.data());
      expect_close(chunked, rec, kSameSums, 0, "chunk " + std::to_string(chunk));
    }
  }
}

// The recurrence (no chunks) equals the O(n^2) masked matrix A applied to v, for
// every family, causal and not; rows of a normalized A sum to at most 1.
TEST(LinearAttention, RecurrenceEqualsMaskedQuadraticForm) {
  for (const SpecCase& c : all_spec_cases())
    for (bool causal : {false, true})
      for (bool normalize : {true, false}) {
        if (normalize && c.signed_features) continue;
        AttentionSpec spec = c.spec;
        spec.causal = causal;
        spec.normalize = normalize;
        const Problem p = make_problem(spec, {2, 6, 2}, 21);
        Result<ForwardResult> fwd = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, p.params);
        Result<std::vector<double>> A = linear_attention_weights(spec, p.shape, p.q, p.k, p.params);
        ASSERT_TRUE(fwd.ok() && A.ok()) << c.name;
        expect_close(apply_weights(*A, p.shape, spec.value_dim, p.v), fwd->out, kSameSums, 0, c.name);
        const int N = p.shape.seq;
        for (int row = 0; row < p.shape.batch * p.shape.heads * N; ++row) {
          double sum = 0;
          for (int j = 0; j < N; ++j) {
            sum += (*A)[size_t(row) * N + j];
            if (causal && j > row % N) EXPECT_EQ((*A)[size_t(row) * N + j], 0.0) << c.name;
          }
          // den_raw / (den_raw + eps): below 1, and 0 for a query whose features are all 0.
          if (normalize) EXPECT_LE(sum, 1.0 + 1e-12) << c.name;
        }
      }
}

// params_per_head = false: one block serves every head, equal to a per-head buffer
// holding copies of it; its gradient is the sum of the per-head blocks' gradients.
TEST(LinearAttention, SharedParamsEqualReplicatedPerHeadParams) {
  for (const SpecCase& c : all_spec_cases()) {
    const ParamLayout layout = param_layout(c.spec);
    if (layout.per_head_floats == 0) continue;
    AttentionSpec shared = c.spec, per_head = c.spec;
    shared.params_per_head = false;
    per_head.params_per_head = true;
    shared.normalize = per_head.normalize = !c.signed_features;
    const Problem p = make_problem(shared, {2, 5, 3}, 31);
    std::vector<double> copies;
    for (int h = 0; h < p.shape.heads; ++h) copies.insert(copies.end(), p.params.begin(), p.params.end());

    Result<ForwardResult> a = linear_attention_forward(shared, p.shape, p.q, p.k, p.v, p.params);
    Result<ForwardResult> b = linear_attention_forward(per_head, p.shape, p.q, p.k, p.v, copies);
    ASSERT_TRUE(a.ok() && b.ok()) << c.name;
    expect_close(a->out, b->out, kSameSums, 0, c.name + " out");

    Result<Gradients> ga = linear_attention_backward(shared, p.shape, p.q, p.k, p.v, p.params, p.dout);
    Result<Gradients> gb = linear_attention_backward(per_head, p.shape, p.q, p.k, p.v, copies, p.dout);
    ASSERT_TRUE(ga.ok() && gb.ok()) << c.name;
    std::vector<double> summed(p.params.size(), 0.0);
    for (int h = 0; h < p.shape.heads; ++h)
      for (size_t i = 0; i < summed.size(); ++i) summed[i] += gb->dparams[h * layout.per_head_floats + i];
    expect_close(ga->dparams, summed, kSameSums, 1e-300, c.name + " dparams");
    expect_close(ga->dq, gb->dq, kSameSums, 0, c.name + " dq");

    // Non-vacuity: per-head blocks that differ give different outputs.
    const Problem q = make_problem(per_head, p.shape, 32);
    Result<ForwardResult> d = linear_attention_forward(per_head, p.shape, p.q, p.k, p.v, q.params);
    ASSERT_TRUE(d.ok());
    std::vector<double> diff(d->out.size());
    for (size_t i = 0; i < diff.size(); ++i) diff[i] = d->out[i] - a->out[i];
    EXPECT_GT(max_abs(diff), 1e-6) << c.name;
  }
}

TEST(LinearAttention, RejectsWrongSizes) {
  const AttentionSpec spec = small_spec(Family::t2r);
  const Problem p = make_problem(spec, {1, 4, 2}, 3);
  std::vector<double> short_q(p.q.begin(), p.q.end() - 1);
  Result<ForwardResult> r = linear_attention_forward(spec, p.shape, short_q, p.k, p.v, p.params);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("q has"), std::string::npos) << r.error().message;
  Result<ForwardResult> rp = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, std::vector<double>(3));
  ASSERT_FALSE(rp.ok());
  EXPECT_NE(rp.error().message.find("params"), std::string::npos) << rp.error().message;
  Result<Gradients> g = linear_attention_backward(spec, p.shape, p.q, p.k, p.v, p.params, p.q);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("dout"), std::string::npos) << g.error().message;
  Stabilizers bad{{1.0}, {1.0}, {1.0}};
  Result<ForwardResult> s = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, p.params, &bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("stabilizers"), std::string::npos) << s.error().message;
}

// Packed variable-length batches: sequences of equal length packed as
// [1, B*N, H, *] with cu_seqlens {0, N, 2N, ...} are the contiguous batch
// [B, N, H, *] itself, so the varlen reference (one call per sequence) must
// equal the batched one (one call over the batch): forward, dq, dk, dv and the
// summed dparams, to double rounding (1e-12 relative: only the order of the
// parameter-gradient sums over sequences differs). Causal and not, every
// family the small specs cover (cosformer: N is each sequence's length, which
// is the batch's N here).
TEST(LinearAttentionVarlen, EqualLengthsEqualTheBatch) {
  for (Family f : kAllFamilies)
    for (bool causal : {false, true}) {
      AttentionSpec spec = small_spec(f);
      spec.causal = causal;
      const Problem p = make_problem(spec, {3, 4, 2}, 17);
      const std::vector<int> cu = {0, 4, 8, 12};
      auto batched = linear_attention_forward(spec, p.shape, p.q, p.k, p.v, p.params);
      auto packed = linear_attention_forward_varlen(spec, 2, cu, p.q, p.k, p.v, p.params);
      ASSERT_TRUE(batched.ok() && packed.ok()) << to_string(f);
      std::vector<double> diff(batched->out.size());
      for (size_t i = 0; i < diff.size(); ++i) diff[i] = packed->out[i] - batched->out[i];
      EXPECT_LE(max_abs(diff), 1e-12 * (1 + max_abs(batched->out))) << to_string(f) << " o";
      const std::vector<double> dout(p.v.begin(), p.v.end());
      auto gb = linear_attention_backward(spec, p.shape, p.q, p.k, p.v, p.params, dout);
      auto gp = linear_attention_backward_varlen(spec, 2, cu, p.q, p.k, p.v, p.params, dout);
      ASSERT_TRUE(gb.ok() && gp.ok()) << to_string(f);
      const std::pair<const std::vector<double>*, const std::vector<double>*> pairs[] = {
          {&gp->dq, &gb->dq}, {&gp->dk, &gb->dk}, {&gp->dv, &gb->dv}, {&gp->dparams, &gb->dparams}};
      const char* names[] = {"dq", "dk", "dv", "dparams"};
      for (int i = 0; i < 4; ++i) {
        const auto& [a, b] = pairs[i];
        ASSERT_EQ(a->size(), b->size());
        std::vector<double> d(a->size());
        for (size_t j = 0; j < d.size(); ++j) d[j] = (*a)[j] - (*b)[j];
        EXPECT_LE(max_abs(d), 1e-12 * (1 + max_abs(*b))) << to_string(f) << (causal ? " causal " : " ") << names[i];
      }
    }
}

// Sequences of length 0 write nothing and cost nothing; a length-1 sequence of a
// normalized family is its value row (one key: o = v (a / (a + eps)), a = phi(q).phi(k)).
TEST(LinearAttentionVarlen, LengthZeroAndOne) {
  AttentionSpec spec = small_spec(Family::elu);  // phi > 0: a > 0
  const Problem p = make_problem(spec, {1, 3, 2}, 18);
  const std::vector<int> cu = {0, 0, 1, 1, 3};
  auto r = linear_attention_forward_varlen(spec, 2, cu, p.q, p.k, p.v, p.params);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const int dv = spec.value_dim;
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < dv; ++c) {
      const double v = p.v[h * dv + c], o = r->out[h * dv + c];
      EXPECT_NEAR(o, v, 1e-4 * (1 + std::abs(v))) << "token 0 head " << h;  // eps / a relative
    }
}

TEST(LinearAttentionVarlen, RejectsBadOffsets) {
  const AttentionSpec spec = small_spec(Family::elu);
  const Problem p = make_problem(spec, {1, 4, 2}, 19);
  auto msg = [&](std::vector<int> cu) {
    auto r = linear_attention_forward_varlen(spec, 2, cu, p.q, p.k, p.v, p.params);
    return r.ok() ? std::string("accepted") : r.error().message;
  };
  EXPECT_EQ(msg({}), "cu_seqlens: needs num_seqs + 1 >= 1 offsets, got an empty array");
  EXPECT_EQ(msg({1, 4}), "cu_seqlens[0] = 1, must be 0");
  EXPECT_EQ(msg({0, 3, 2, 4}), "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 2 < cu_seqlens[1] = 3");
  EXPECT_EQ(msg({0, 3}), "cu_seqlens[1] = 3, must equal the total tokens 4");
  EXPECT_EQ(msg({0, 1, 4}), "accepted");
}

}  // namespace
}  // namespace lunajit::reference::testing
