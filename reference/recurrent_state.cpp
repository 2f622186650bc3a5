// Carried state in double: the causal recurrence started from (S0, z0), its
// backward, and the decoding step (see recurrent_state.h).
#include "reference/recurrent_state.h"

#include <cmath>

#include <fmt/format.h>

namespace lunajit::reference {
namespace {

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

std::span<const double> head_params(const AttentionSpec& spec, std::span<const double> params, int h) {
  return params.subspan(param_block_offset(spec, h), param_layout(spec).per_head_floats);
}

Status check_state_sizes(const AttentionSpec& spec, int batch, int heads, const RecurrentState& s,
                         std::string_view field) {
  const size_t D = spec.feature_dim(), bh = size_t(batch) * heads;
  if (s.S.size() != bh * D * spec.value_dim || s.z.size() != bh * D)
    return Error::invalid(fmt::format("{}: S has {} and z {} elements; expected [batch, heads, D, dv] = {} and "
                                      "[batch, heads, D] = {} (batch {}, heads {}, D {}, dv {})",
                                      field, s.S.size(), s.z.size(), bh * D * spec.value_dim, bh * D, batch, heads, D,
                                      spec.value_dim));
  return ok_status();
}

// phi of the (b, h) rows of x [batch, seq, heads, d] into [seq, D]; no stabiliser
// (performer is rejected), positions irrelevant (cosformer is rejected).
std::vector<double> head_phi(const FeatureMap& fm, const std::vector<double>& xh, int seq) {
  std::vector<double> phi(size_t(seq) * fm.dim());
  fm.forward(xh.data(), seq, RowContext{seq, 1, nullptr}, phi.data());
  return phi;
}

}  // namespace

Status check_state_support(const AttentionSpec& spec, std::string_view field) {
  if (!spec.causal)
    return Error::invalid(fmt::format("{}: carried state needs a causal spec (causal = false given); non-causal "
                                      "attention sees every key, so there is no state to carry",
                                      field));
  if (spec.family == Family::performer)
    return Error::invalid(fmt::format(
        "{}: not supported for family performer: its causal key stabiliser is the running max M_i of the keys "
        "seen so far (docs/MATH.md §2), which the (S, z) layout does not carry; use another family or one call "
        "over the whole sequence",
        field));
  if (spec.family == Family::cosformer)
    return Error::invalid(fmt::format(
        "{}: not supported for family cosformer: its features depend on the token position and the sequence "
        "length N, so a piece of a sequence is a different function",
        field));
  return ok_status();
}

RecurrentState zero_state(const AttentionSpec& spec, int batch, int heads) {
  const size_t bh = size_t(batch) * heads, D = spec.feature_dim();
  return {std::vector<double>(bh * D * spec.value_dim, 0.0), std::vector<double>(bh * D, 0.0)};
}

Result<StatefulForward> linear_attention_forward_state(const AttentionSpec& spec, const AttentionShape& shape,
                                                       std::span<const double> q, std::span<const double> k,
                                                       std::span<const double> v, std::span<const double> params,
                                                       const RecurrentState* initial) {
  if (Status st = check_state_support(spec); !st) return st.error();
  if (Status st = check_sizes(spec, shape, q.size(), k.size(), v.size(), params.size()); !st) return st.error();
  StatefulForward res{std::vector<double>(size_t(shape.rows()) * spec.value_dim),
                      initial && !initial->empty() ? *initial : zero_state(spec, shape.batch, shape.heads)};
  if (Status st = check_state_sizes(spec, shape.batch, shape.heads, res.final_state, "initial_state"); !st)
    return st.error();
  const int N = shape.seq, d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
  const AttentionMode mode = mode_of(spec);
  std::vector<double> oh(size_t(N) * dv);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const FeatureMap fm(spec, head_params(spec, params, h));
      const auto pq = head_phi(fm, gather_head(q, shape, d, b, h), N);
      const auto pk = head_phi(fm, gather_head(k, shape, d, b, h), N);
      const auto vh = gather_head(v, shape, dv, b, h);
      const int64_t bh = int64_t(b) * shape.heads + h;
      double* S = res.final_state.S.data() + bh * D * dv;
      double* z = res.final_state.z.data() + bh * D;
      for (int i = 0; i < N; ++i) {
        for (int f = 0; f < D; ++f) {
          for (int c = 0; c < dv; ++c) S[int64_t(f) * dv + c] += pk[int64_t(i) * D + f] * vh[int64_t(i) * dv + c];
          z[f] += pk[int64_t(i) * D + f];
        }
        const double* p = pq.data() + int64_t(i) * D;
        const double den = mode.normalize ? dot(p, z, D) + mode.eps : 1.0;
        for (int c = 0; c < dv; ++c) {
          double num = 0;
          for (int f = 0; f < D; ++f) num += p[f] * S[int64_t(f) * dv + c];
          oh[int64_t(i) * dv + c] = num / den;
        }
      }
      scatter_head(oh, shape, dv, b, h, res.out);
    }
  return res;
}

Result<StatefulGradients> linear_attention_backward_state(const AttentionSpec& spec, const AttentionShape& shape,
                                                          std::span<const double> q, std::span<const double> k,
                                                          std::span<const double> v, std::span<const double> params,
                                                          std::span<const double> dout,
                                                          const RecurrentState* initial,
                                                          const RecurrentState* dfinal) {
  if (Status st = check_state_support(spec); !st) return st.error();
  if (Status st = check_sizes(spec, shape, q.size(), k.size(), v.size(), params.size()); !st) return st.error();
  if (dout.size() != v.size())
    return Error::invalid(fmt::format("dout has {} elements: expected {} (the shape of v)", dout.size(), v.size()));
  const RecurrentState S0 = initial && !initial->empty() ? *initial : zero_state(spec, shape.batch, shape.heads);
  if (Status st = check_state_sizes(spec, shape.batch, shape.heads, S0, "initial_state"); !st) return st.error();
  StatefulGradients res;
  res.dinitial = dfinal && !dfinal->empty() ? *dfinal : zero_state(spec, shape.batch, shape.heads);
  if (Status st = check_state_sizes(spec, shape.batch, shape.heads, res.dinitial, "final_state gradient"); !st)
    return st.error();
  Gradients& grad = res.grad;
  grad.dq.assign(q.size(), 0.0);
  grad.dk.assign(k.size(), 0.0);
  grad.dv.assign(v.size(), 0.0);
  grad.dparams.assign(params.size(), 0.0);
  const int N = shape.seq, d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
  const AttentionMode mode = mode_of(spec);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const FeatureMap fm(spec, head_params(spec, params, h));
      const auto qh = gather_head(q, shape, d, b, h), kh = gather_head(k, shape, d, b, h);
      const auto pq = head_phi(fm, qh, N), pk = head_phi(fm, kh, N);
      const auto vh = gather_head(v, shape, dv, b, h), doh = gather_head(dout, shape, dv, b, h);
      const int64_t bh = int64_t(b) * shape.heads + h;
      // Forward sweep from (S0, z0): g_i, r_i and dphi(q_i) = S_i g_i + z_i r_i.
      std::vector<double> S(S0.S.begin() + bh * D * dv, S0.S.begin() + (bh + 1) * D * dv);
      std::vector<double> z(S0.z.begin() + bh * D, S0.z.begin() + (bh + 1) * D);
      std::vector<double> g(size_t(N) * dv), r(N, 0.0), dpq(size_t(N) * D), dpk(size_t(N) * D), dvh(size_t(N) * dv);
      std::vector<double> o(dv);
      for (int i = 0; i < N; ++i) {
        for (int f = 0; f < D; ++f) {
          for (int c = 0; c < dv; ++c) S[int64_t(f) * dv + c] += pk[int64_t(i) * D + f] * vh[int64_t(i) * dv + c];
          z[f] += pk[int64_t(i) * D + f];
        }
        const double* p = pq.data() + int64_t(i) * D;
        const double den = mode.normalize ? dot(p, z.data(), D) + mode.eps : 1.0;
        for (int c = 0; c < dv; ++c) {
          double num = 0;
          for (int f = 0; f < D; ++f) num += p[f] * S[int64_t(f) * dv + c];
          o[c] = num / den;
        }
        const double* dO = doh.data() + int64_t(i) * dv;
        for (int c = 0; c < dv; ++c) g[int64_t(i) * dv + c] = dO[c] / den;
        r[i] = mode.normalize ? -dot(dO, o.data(), dv) / den : 0.0;
        for (int f = 0; f < D; ++f)
          dpq[int64_t(i) * D + f] = dot(S.data() + int64_t(f) * dv, g.data() + int64_t(i) * dv, dv) + z[f] * r[i];
      }
      // Reverse sweep from (dS_T, dz_T): dS_j = dS_T + sum_{i>=j} phi(q_i) g_i^T.
      double* dS = res.dinitial.S.data() + bh * D * dv;
      double* dz = res.dinitial.z.data() + bh * D;
      for (int j = N - 1; j >= 0; --j) {
        const double* p = pq.data() + int64_t(j) * D;
        for (int f = 0; f < D; ++f) {
          for (int c = 0; c < dv; ++c) dS[int64_t(f) * dv + c] += p[f] * g[int64_t(j) * dv + c];
          dz[f] += p[f] * r[j];
        }
        for (int f = 0; f < D; ++f)
          dpk[int64_t(j) * D + f] = dot(dS + int64_t(f) * dv, vh.data() + int64_t(j) * dv, dv) + dz[f];
        for (int c = 0; c < dv; ++c) {
          double s = 0;
          for (int f = 0; f < D; ++f) s += dS[int64_t(f) * dv + c] * pk[int64_t(j) * D + f];
          dvh[int64_t(j) * dv + c] = s;
        }
      }
      // dS, dz now hold dS_0 = dS_T + sum_i phi(q_i) g_i^T: the gradient of S0.
      std::vector<double> dqh(size_t(N) * d, 0.0), dkh(size_t(N) * d, 0.0);
      double* dparams = grad.dparams.data() + param_block_offset(spec, h);
      fm.backward(qh.data(), N, RowContext{N, 1, nullptr}, dpq.data(), dqh.data(), dparams);
      fm.backward(kh.data(), N, RowContext{N, 1, nullptr}, dpk.data(), dkh.data(), dparams);
      scatter_head(dqh, shape, d, b, h, grad.dq);
      scatter_head(dkh, shape, d, b, h, grad.dk);
      scatter_head(dvh, shape, dv, b, h, grad.dv);
    }
  return res;
}

Result<std::vector<double>> linear_attention_decode_step(const AttentionSpec& spec, int batch, int heads,
                                                         std::span<const double> q, std::span<const double> k,
                                                         std::span<const double> v, std::span<const double> params,
                                                         RecurrentState& state) {
  if (Status st = check_state_support(spec, "decode"); !st) return st.error();
  const AttentionShape shape{batch, 1, heads};
  if (Status st = check_sizes(spec, shape, q.size(), k.size(), v.size(), params.size()); !st) return st.error();
  if (state.empty()) state = zero_state(spec, batch, heads);
  if (Status st = check_state_sizes(spec, batch, heads, state, "state"); !st) return st.error();
  // One token: the causal forward of a length-1 sequence from the carried state.
  Result<StatefulForward> r = linear_attention_forward_state(spec, shape, q, k, v, params, &state);
  if (!r) return r.error();
  state = std::move(r->final_state);
  return std::move(r->out);
}

}  // namespace lunajit::reference
