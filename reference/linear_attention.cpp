// Linear attention in double: per-head forward (recurrent, chunked, as a weight
// matrix) and backward, and the whole-tensor drivers that apply the feature map.
#include "reference/linear_attention.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace lunajit::reference {
namespace {

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// S += phi v^T (S [D, dv]) and z += phi.
void add_outer(const double* phi, const double* v, int D, int dv, double* S, double* z) {
  for (int f = 0; f < D; ++f) {
    for (int c = 0; c < dv; ++c) S[int64_t(f) * dv + c] += phi[f] * v[c];
    z[f] += phi[f];
  }
}

// num = phi^T S [dv] and den = phi^T z + eps (1 when not normalized); o = num / den.
double read_state(const double* phi, const double* S, const double* z, int D, int dv,
                  const AttentionMode& mode, double* o) {
  std::fill(o, o + dv, 0.0);
  for (int f = 0; f < D; ++f)
    for (int c = 0; c < dv; ++c) o[c] += phi[f] * S[int64_t(f) * dv + c];
  const double den = mode.normalize ? dot(phi, z, D) + mode.eps : 1.0;
  for (int c = 0; c < dv; ++c) o[c] /= den;
  return den;
}

// The parameter block of head h, as a span over the whole buffer.
std::span<const double> head_block(const AttentionSpec& spec, std::span<const double> params, int h) {
  const int64_t size = param_layout(spec).per_head_floats;
  return params.subspan(param_block_offset(spec, h), size);
}

// The v size check_sizes expects, for the entry points that take no v.
size_t no_values(const AttentionSpec& spec, const AttentionShape& shape) {
  return size_t(shape.rows()) * spec.value_dim;
}

}  // namespace

AttentionMode mode_of(const AttentionSpec& spec) { return {spec.causal, spec.normalize, spec.eps}; }

void linear_attention_head(const double* phi_q, const double* phi_k, const double* v, int n, int D,
                           int dv, const AttentionMode& mode, double* o) {
  std::vector<double> S(size_t(D) * dv, 0.0), z(D, 0.0);
  if (!mode.causal) {
    for (int j = 0; j < n; ++j) add_outer(phi_k + int64_t(j) * D, v + int64_t(j) * dv, D, dv, S.data(), z.data());
  }
  for (int i = 0; i < n; ++i) {
    if (mode.causal) add_outer(phi_k + int64_t(i) * D, v + int64_t(i) * dv, D, dv, S.data(), z.data());
    read_state(phi_q + int64_t(i) * D, S.data(), z.data(), D, dv, mode, o + int64_t(i) * dv);
  }
}

void linear_attention_head_chunked(const double* phi_q, const double* phi_k, const double* v,
                                   int n, int D, int dv, const AttentionMode& mode, int chunk,
                                   double* o) {
  if (!mode.causal || chunk < 1) {
    linear_attention_head(phi_q, phi_k, v, n, D, dv, mode, o);
    return;
  }
  std::vector<double> S(size_t(D) * dv, 0.0), z(D, 0.0);  // state of chunks < c
  for (int c0 = 0; c0 < n; c0 += chunk) {
    const int c1 = std::min(n, c0 + chunk);
    for (int i = c0; i < c1; ++i) {
      const double* pq = phi_q + int64_t(i) * D;
      double* oi = o + int64_t(i) * dv;
      std::vector<double> num(dv, 0.0);
      double den = 0;
      for (int j = c0; j <= i; ++j) {  // intra-chunk: (Phi_q Phi_k^T masked) V
        const double a = dot(pq, phi_k + int64_t(j) * D, D);
        for (int c = 0; c < dv; ++c) num[c] += a * v[int64_t(j) * dv + c];
        den += a;
      }
      for (int f = 0; f < D; ++f) {  // inter-chunk: Phi_q S_<c
        for (int c = 0; c < dv; ++c) num[c] += pq[f] * S[int64_t(f) * dv + c];
        den += pq[f] * z[f];
      }
      const double scale = mode.normalize ? 1.0 / (den + mode.eps) : 1.0;
      for (int c = 0; c < dv; ++c) oi[c] = num[c] * scale;
    }
    for (int j = c0; j < c1; ++j) add_outer(phi_k + int64_t(j) * D, v + int64_t(j) * dv, D, dv, S.data(), z.data());
  }
}

void linear_attention_head_weights(const double* phi_q, const double* phi_k, int n, int D,
                                   const AttentionMode& mode, double* A) {
  for (int i = 0; i < n; ++i) {
    double* row = A + int64_t(i) * n;
    double sum = 0;
    for (int j = 0; j < n; ++j) {
      row[j] = (mode.causal && j > i) ? 0.0 : dot(phi_q + int64_t(i) * D, phi_k + int64_t(j) * D, D);
      sum += row[j];
    }
    if (mode.normalize)
      for (int j = 0; j < n; ++j) row[j] /= sum + mode.eps;
  }
}

namespace {

void add_abs_outer(const double* pk, const double* v, int D, int dv, std::vector<double>& S_abs,
                   std::vector<double>& z_abs) {
  for (int f = 0; f < D; ++f) {
    for (int c = 0; c < dv; ++c) S_abs[int64_t(f) * dv + c] += std::abs(pk[f] * v[c]);
    z_abs[f] += std::abs(pk[f]);
  }
}

double z_abs_of(const TermMagnitudes& m, int f) { return m.z_abs[f]; }

}  // namespace

void TermMagnitudes::reset(int n, int D, int dv) {
  dphi_q.assign(size_t(n) * D, 0.0);
  dphi_k.assign(size_t(n) * D, 0.0);
  this->dv.assign(size_t(n) * dv, 0.0);
  S_abs.assign(size_t(D) * dv, 0.0);
  z_abs.assign(D, 0.0);
  dS_abs.assign(size_t(D) * dv, 0.0);
  dz_abs.assign(D, 0.0);
}

void linear_attention_head_backward(const double* phi_q, const double* phi_k, const double* v,
                                    int n, int D, int dv, const AttentionMode& mode,
                                    const double* dout, double* dphi_q, double* dphi_k,
                                    double* dv_out, TermMagnitudes* mag) {
  // Forward sweep: o_i, den_i and dphi_q_i = S_i g_i + z_i r_i with the state each query saw.
  std::vector<double> S(size_t(D) * dv, 0.0), z(D, 0.0), o(dv);
  std::vector<double> g(size_t(n) * dv), r(n, 0.0);
  if (mag) mag->reset(n, D, dv);
  if (!mode.causal) {
    for (int j = 0; j < n; ++j) add_outer(phi_k + int64_t(j) * D, v + int64_t(j) * dv, D, dv, S.data(), z.data());
    if (mag)
      for (int j = 0; j < n; ++j)
        add_abs_outer(phi_k + int64_t(j) * D, v + int64_t(j) * dv, D, dv, mag->S_abs, mag->z_abs);
  }
  for (int i = 0; i < n; ++i) {
    if (mode.causal) add_outer(phi_k + int64_t(i) * D, v + int64_t(i) * dv, D, dv, S.data(), z.data());
    const double den = read_state(phi_q + int64_t(i) * D, S.data(), z.data(), D, dv, mode, o.data());
    const double* dO = dout + int64_t(i) * dv;
    double* gi = g.data() + int64_t(i) * dv;
    for (int c = 0; c < dv; ++c) gi[c] = dO[c] / den;
    r[i] = mode.normalize ? -dot(dO, o.data(), dv) / den : 0.0;
    double* dq = dphi_q + int64_t(i) * D;
    for (int f = 0; f < D; ++f) dq[f] = dot(S.data() + int64_t(f) * dv, gi, dv) + z[f] * r[i];
    if (mag) {
      // |S| |g| + |z| |r|: the size of the two parts the normalized dphi_q subtracts.
      if (mode.causal) add_abs_outer(phi_k + int64_t(i) * D, v + int64_t(i) * dv, D, dv, mag->S_abs, mag->z_abs);
      double* m = mag->dphi_q.data() + int64_t(i) * D;
      for (int f = 0; f < D; ++f) {
        double t = std::abs(z_abs_of(*mag, f) * r[i]);
        for (int c = 0; c < dv; ++c) t += mag->S_abs[int64_t(f) * dv + c] * std::abs(gi[c]);
        m[f] = t;
      }
    }
  }
  // Reverse sweep: dS, dz summed over the queries that saw key j (all, or i >= j).
  std::vector<double> dS(size_t(D) * dv, 0.0), dz(D, 0.0);
  auto add_query = [&](int i) {  // dS += phi_q_i g_i^T ; dz += phi_q_i r_i
    const double* pq = phi_q + int64_t(i) * D;
    for (int f = 0; f < D; ++f) {
      for (int c = 0; c < dv; ++c) dS[int64_t(f) * dv + c] += pq[f] * g[int64_t(i) * dv + c];
      dz[f] += pq[f] * r[i];
      if (mag) {
        for (int c = 0; c < dv; ++c) mag->dS_abs[int64_t(f) * dv + c] += std::abs(pq[f] * g[int64_t(i) * dv + c]);
        mag->dz_abs[f] += std::abs(pq[f] * r[i]);
      }
    }
  };
  if (!mode.causal)
    for (int i = 0; i < n; ++i) add_query(i);
  for (int j = n - 1; j >= 0; --j) {
    if (mode.causal) add_query(j);
    const double* pk = phi_k + int64_t(j) * D;
    const double* vj = v + int64_t(j) * dv;
    double* dk = dphi_k + int64_t(j) * D;
    for (int f = 0; f < D; ++f) dk[f] = dot(dS.data() + int64_t(f) * dv, vj, dv) + dz[f];
    double* dvj = dv_out + int64_t(j) * dv;
    for (int c = 0; c < dv; ++c) {
      double s = 0;
      for (int f = 0; f < D; ++f) s += dS[int64_t(f) * dv + c] * pk[f];
      dvj[c] = s;
    }
    if (mag) {
      // |dS| |v_j| + |dz|, and |dS|^T |phi_k_j|: the sizes of what dphi_k and dv sum.
      double* mk = mag->dphi_k.data() + int64_t(j) * D;
      for (int f = 0; f < D; ++f) {
        double t = mag->dz_abs[f];
        for (int c = 0; c < dv; ++c) t += mag->dS_abs[int64_t(f) * dv + c] * std::abs(vj[c]);
        mk[f] = t;
      }
      double* mv = mag->dv.data() + int64_t(j) * dv;
      for (int c = 0; c < dv; ++c) {
        double t = 0;
        for (int f = 0; f < D; ++f) t += mag->dS_abs[int64_t(f) * dv + c] * std::abs(pk[f]);
        mv[c] = t;
      }
    }
  }
}

Result<Stabilizers> performer_stabilizers(const AttentionSpec& spec, const AttentionShape& shape,
                                          std::span<const double> q, std::span<const double> k,
                                          std::span<const double> params) {
  if (Status st = check_sizes(spec, shape, q.size(), k.size(), no_values(spec, shape), params.size()); !st)
    return st.error();
  const int N = shape.seq, H = shape.heads;
  Stabilizers stab{std::vector<double>(size_t(shape.batch) * H * N, 0.0),
                   std::vector<double>(size_t(shape.batch) * H, 0.0),
                   std::vector<double>(size_t(shape.batch) * H * N, 0.0)};
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < H; ++h) {
      const FeatureMap fm(spec, head_block(spec, params, h));
      const std::vector<double> qh = gather_head(q, shape, spec.head_dim, b, h);
      const std::vector<double> kh = gather_head(k, shape, spec.head_dim, b, h);
      const int64_t bh = int64_t(b) * H + h;
      const std::vector<double> sq = fm.stabilizers(qh.data(), N, Role::query);
      std::copy(sq.begin(), sq.end(), stab.query.begin() + bh * N);
      stab.key[bh] = fm.stabilizers(kh.data(), N, Role::key)[0];
      // Running max of the keys' own maxima: what causal query row i may use.
      const std::vector<double> sk = fm.stabilizers(kh.data(), N, Role::query);
      for (int t = 0; t < N; ++t)
        stab.key_running[bh * N + t] = t == 0 ? sk[0] : std::max(stab.key_running[bh * N + t - 1], sk[t]);
    }
  return stab;
}

namespace {

// Per-row stabilizers of (b, h) for `role`, from the frozen set.
std::vector<double> head_stab(const Stabilizers& stab, const AttentionShape& shape, int b, int h,
                              Role role) {
  const int64_t bh = int64_t(b) * shape.heads + h;
  if (role == Role::key) return std::vector<double>(shape.seq, stab.key[bh]);
  return {stab.query.begin() + bh * shape.seq, stab.query.begin() + (bh + 1) * shape.seq};
}

Status check_stab(const Stabilizers& stab, const AttentionShape& shape) {
  const size_t bh = size_t(shape.batch) * shape.heads;
  if (stab.key.size() != bh || stab.query.size() != bh * shape.seq || stab.key_running.size() != bh * shape.seq)
    return Error::invalid(fmt::format(
        "frozen stabilizers have {} query, {} key and {} key_running values: expected {}, {} and {}",
        stab.query.size(), stab.key.size(), stab.key_running.size(), bh * shape.seq, bh, bh * shape.seq));
  return ok_status();
}

// Whether the key features depend on the query row: causal performer, where
// query i shifts the keys it sees by M_i = max_{j<=i} s(k_j) (MATH.md §2).
bool row_dependent_keys(const AttentionSpec& spec) { return spec.causal && spec.family == Family::performer; }

// Causal performer, one (batch, head). phi_i(k_j) = exp(s_j - M_i) (u_j - kappa) + kappa
// = m^{-1/2} exp(e(k_j) - M_i) + kappa, where u_j = phi(k_j) shifted by the key's own
// max s_j (so exp(s_j - M_i) <= 1 and nothing overflows; s_j cancels exactly).
struct CausalPerformerHead {
  const double* pq;  // [n, D] query features
  const double* pk;  // [n, D] u_j: key features shifted by their own s_j
  const double* s;   // [n] s_j
  const double* M;   // [n] M_i
  double kappa;
  int n, D;
  double weight(int i, int j) const { return std::exp(s[j] - M[i]); }
  // phi_i(k_j)[f]
  double key(int i, int j, int f) const { return weight(i, j) * (pk[int64_t(j) * D + f] - kappa) + kappa; }
  // A_ij = phi(q_i) . phi_i(k_j) for j <= i, else 0: [n, n]
  std::vector<double> scores() const {
    std::vector<double> A(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) {
        double a = 0;
        for (int f = 0; f < D; ++f) a += pq[int64_t(i) * D + f] * key(i, j, f);
        A[int64_t(i) * n + j] = a;
      }
    return A;
  }
};

// o = A v with A normalized by row (sum + eps) when mode.normalize; returns den [n].
std::vector<double> apply_scores(const std::vector<double>& A, const double* v, int n, int dv,
                                 const AttentionMode& mode, double* o) {
  std::vector<double> den(n, 1.0);
  for (int i = 0; i < n; ++i) {
    double sum = 0;
    std::fill(o + int64_t(i) * dv, o + int64_t(i + 1) * dv, 0.0);
    for (int j = 0; j < n; ++j) {
      const double a = A[int64_t(i) * n + j];
      sum += a;
      for (int c = 0; c < dv; ++c) o[int64_t(i) * dv + c] += a * v[int64_t(j) * dv + c];
    }
    if (mode.normalize) den[i] = sum + mode.eps;
    for (int c = 0; c < dv; ++c) o[int64_t(i) * dv + c] /= den[i];
  }
  return den;
}

// Backward of the causal performer head: dphi(q) [n, D], du [n, D] (gradient
// with respect to u_j, every s and M held constant) and dv [n, dv], overwritten.
void causal_performer_backward(const CausalPerformerHead& hd, const double* v, int dv, const AttentionMode& mode,
                               const double* dout, double* dphi_q, double* du, double* dv_out) {
  const int n = hd.n, D = hd.D;
  const std::vector<double> A = hd.scores();
  std::vector<double> o(size_t(n) * dv);
  const std::vector<double> den = apply_scores(A, v, n, dv, mode, o.data());
  std::fill(dphi_q, dphi_q + int64_t(n) * D, 0.0);
  std::fill(du, du + int64_t(n) * D, 0.0);
  std::fill(dv_out, dv_out + int64_t(n) * dv, 0.0);
  std::vector<double> g(dv);
  for (int i = 0; i < n; ++i) {
    const double* dO = dout + int64_t(i) * dv;
    for (int c = 0; c < dv; ++c) g[c] = dO[c] / den[i];
    const double r = mode.normalize ? -dot(dO, o.data() + int64_t(i) * dv, dv) / den[i] : 0.0;
    for (int j = 0; j <= i; ++j) {
      const double B = dot(v + int64_t(j) * dv, g.data(), dv) + r, w = hd.weight(i, j);
      for (int f = 0; f < D; ++f) {
        dphi_q[int64_t(i) * D + f] += B * hd.key(i, j, f);
        du[int64_t(j) * D + f] += B * w * hd.pq[int64_t(i) * D + f];
      }
      for (int c = 0; c < dv; ++c) dv_out[int64_t(j) * dv + c] += A[int64_t(i) * n + j] * g[c];
    }
  }
}

// The per-row shifts of the keys' own maxima s_j of (b, h): the query-role
// stabilizers of the keys (recomputed; they cancel exactly, see CausalPerformerHead).
std::vector<double> own_max(const FeatureMap& fm, const std::vector<double>& kh, int n) {
  return fm.stabilizers(kh.data(), n, Role::query);
}

std::vector<double> head_running(const Stabilizers& stab, const AttentionShape& shape, int b, int h) {
  const int64_t bh = int64_t(b) * shape.heads + h;
  return {stab.key_running.begin() + bh * shape.seq, stab.key_running.begin() + (bh + 1) * shape.seq};
}

// Stabilizers to use: the frozen ones, or those of q, k.
Result<Stabilizers> resolve_stab(const AttentionSpec& spec, const AttentionShape& shape,
                                 std::span<const double> q, std::span<const double> k,
                                 std::span<const double> params, const Stabilizers* frozen) {
  if (!frozen) return performer_stabilizers(spec, shape, q, k, params);
  if (Status st = check_stab(*frozen, shape); !st) return st.error();
  return *frozen;
}

// phi of the (b, h) rows x_h [seq, d] into [seq, D].
std::vector<double> head_features(const FeatureMap& fm, const std::vector<double>& xh,
                                  const std::vector<double>& stab, int seq) {
  std::vector<double> phi(size_t(seq) * fm.dim());
  fm.forward(xh.data(), seq, RowContext{seq, 1, stab.data()}, phi.data());
  return phi;
}

}  // namespace

Result<std::vector<double>> feature_map(const AttentionSpec& spec, const AttentionShape& shape,
                                        std::span<const double> x, std::span<const double> params,
                                        Role role, const Stabilizers* frozen) {
  Result<Stabilizers> stab = resolve_stab(spec, shape, x, x, params, frozen);
  if (!stab) return stab.error();
  const int D = spec.feature_dim();
  std::vector<double> phi(size_t(shape.rows()) * D);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const FeatureMap fm(spec, head_block(spec, params, h));
      const std::vector<double> xh = gather_head(x, shape, spec.head_dim, b, h);
      const std::vector<double> ph = head_features(fm, xh, head_stab(*stab, shape, b, h, role), shape.seq);
      scatter_head(ph, shape, D, b, h, phi);
    }
  return phi;
}

Result<ForwardResult> linear_attention_forward(const AttentionSpec& spec,
                                               const AttentionShape& shape,
                                               std::span<const double> q,
                                               std::span<const double> k,
                                               std::span<const double> v,
                                               std::span<const double> params,
                                               const Stabilizers* frozen) {
  if (Status st = check_sizes(spec, shape, q.size(), k.size(), v.size(), params.size()); !st)
    return st.error();
  Result<Stabilizers> stab = resolve_stab(spec, shape, q, k, params, frozen);
  if (!stab) return stab.error();
  const int N = shape.seq, d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
  ForwardResult res{std::vector<double>(size_t(shape.rows()) * dv), std::move(*stab)};
  std::vector<double> oh(size_t(N) * dv);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const FeatureMap fm(spec, head_block(spec, params, h));
      const auto pq = head_features(fm, gather_head(q, shape, d, b, h), head_stab(res.stab, shape, b, h, Role::query), N);
      const auto vh = gather_head(v, shape, dv, b, h);
      if (row_dependent_keys(spec)) {
        const auto kh = gather_head(k, shape, d, b, h);
        const auto s = own_max(fm, kh, N), M = head_running(res.stab, shape, b, h);
        const auto pk = head_features(fm, kh, s, N);
        const CausalPerformerHead hd{pq.data(), pk.data(), s.data(), M.data(), spec.performer.kernel_eps, N, D};
        apply_scores(hd.scores(), vh.data(), N, dv, mode_of(spec), oh.data());
      } else {
        const auto pk = head_features(fm, gather_head(k, shape, d, b, h), head_stab(res.stab, shape, b, h, Role::key), N);
        linear_attention_head(pq.data(), pk.data(), vh.data(), N, D, dv, mode_of(spec), oh.data());
      }
      scatter_head(oh, shape, dv, b, h, res.out);
    }
  return res;
}

Result<Gradients> linear_attention_backward(const AttentionSpec& spec, const AttentionShape& shape,
                                            std::span<const double> q, std::span<const double> k,
                                            std::span<const double> v,
                                            std::span<const double> params,
                                            std::span<const double> dout,
                                            const Stabilizers* frozen) {
  if (Status st = check_sizes(spec, shape, q.size(), k.size(), v.size(), params.size()); !st)
    return st.error();
  if (dout.size() != v.size())
    return Error::invalid(fmt::format("dout has {} elements: expected {} (the shape of v)", dout.size(), v.size()));
  Result<Stabilizers> stab = resolve_stab(spec, shape, q, k, params, frozen);
  if (!stab) return stab.error();
  const int N = shape.seq, d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
  Gradients grad{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
                 std::vector<double>(v.size(), 0.0), std::vector<double>(params.size(), 0.0),
                 std::vector<double>(params.size(), 0.0), std::vector<double>(q.size(), 0.0),
                 std::vector<double>(k.size(), 0.0), std::vector<double>(v.size(), 0.0)};
  std::vector<double> dpq(size_t(N) * D), dpk(size_t(N) * D), dvh(size_t(N) * dv);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const FeatureMap fm(spec, head_block(spec, params, h));
      const auto qh = gather_head(q, shape, d, b, h), kh = gather_head(k, shape, d, b, h);
      const auto sq = head_stab(*stab, shape, b, h, Role::query);
      // Causal performer: keys are mapped with their own max s_j and dpk is the
      // gradient with respect to those features (CausalPerformerHead).
      const auto sk = row_dependent_keys(spec) ? own_max(fm, kh, N) : head_stab(*stab, shape, b, h, Role::key);
      const auto pq = head_features(fm, qh, sq, N), pk = head_features(fm, kh, sk, N);
      const auto vh = gather_head(v, shape, dv, b, h), doh = gather_head(dout, shape, dv, b, h);
      // Term magnitudes (the checks' rounding floor) come from the generic
      // backward; the causal performer's rescaled sums keep no floor.
      TermMagnitudes mag;
      if (row_dependent_keys(spec)) {
        const auto M = head_running(*stab, shape, b, h);
        const CausalPerformerHead hd{pq.data(), pk.data(), sk.data(), M.data(), spec.performer.kernel_eps, N, D};
        causal_performer_backward(hd, vh.data(), dv, mode_of(spec), doh.data(), dpq.data(), dpk.data(), dvh.data());
      } else {
        linear_attention_head_backward(pq.data(), pk.data(), vh.data(), N, D, dv, mode_of(spec), doh.data(),
                                       dpq.data(), dpk.data(), dvh.data(), &mag);
      }
      std::vector<double> dqh(size_t(N) * d, 0.0), dkh(size_t(N) * d, 0.0);
      double* dparams = grad.dparams.data() + param_block_offset(spec, h);
      fm.backward(qh.data(), N, RowContext{N, 1, sq.data()}, dpq.data(), dqh.data(), dparams);
      fm.backward(kh.data(), N, RowContext{N, 1, sk.data()}, dpk.data(), dkh.data(), dparams);
      if (!mag.dphi_q.empty()) {
        // The magnitude of the terms every gradient sums: each row's J_t^T applied
        // to the magnitudes of dphi's parts, taken absolute and summed row by row.
        double* terms = grad.dparams_terms.data() + param_block_offset(spec, h);
        const size_t block = param_layout(spec).per_head_floats;
        std::vector<double> row_dp(block), row_dx(d), dq_mag(size_t(N) * d), dk_mag(size_t(N) * d);
        for (int which = 0; which < 2; ++which)
          for (int t = 0; t < N; ++t) {
            std::fill(row_dp.begin(), row_dp.end(), 0.0);
            std::fill(row_dx.begin(), row_dx.end(), 0.0);
            const auto& xh = which == 0 ? qh : kh;
            const auto& st = which == 0 ? sq : sk;
            const double* m = (which == 0 ? mag.dphi_q : mag.dphi_k).data() + size_t(t) * D;
            fm.backward(xh.data() + size_t(t) * d, 1, RowContext{N, t + 1, st.empty() ? nullptr : st.data() + t}, m,
                        row_dx.data(), row_dp.data());
            for (size_t i = 0; i < block; ++i) terms[i] += std::abs(row_dp[i]);
            double* dx_mag = (which == 0 ? dq_mag : dk_mag).data() + size_t(t) * d;
            for (int i = 0; i < d; ++i) dx_mag[i] = std::abs(row_dx[i]);
          }
        scatter_head(dq_mag, shape, d, b, h, grad.dq_terms);
        scatter_head(dk_mag, shape, d, b, h, grad.dk_terms);
        scatter_head(mag.dv, shape, dv, b, h, grad.dv_terms);
      }
      scatter_head(dqh, shape, d, b, h, grad.dq);
      scatter_head(dkh, shape, d, b, h, grad.dk);
      scatter_head(dvh, shape, dv, b, h, grad.dv);
    }
  return grad;
}

Result<std::vector<double>> linear_attention_weights(const AttentionSpec& spec,
                                                     const AttentionShape& shape,
                                                     std::span<const double> q,
                                                     std::span<const double> k,
                                                     std::span<const double> params) {
  if (Status st = check_sizes(spec, shape, q.size(), k.size(), no_values(spec, shape), params.size()); !st)
    return st.error();
  Result<Stabilizers> stab = performer_stabilizers(spec, shape, q, k, params);
  if (!stab) return stab.error();
  const int N = shape.seq, d = spec.head_dim, D = spec.feature_dim();
  std::vector<double> A(size_t(shape.batch) * shape.heads * N * N);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const FeatureMap fm(spec, head_block(spec, params, h));
      const auto pq = head_features(fm, gather_head(q, shape, d, b, h), head_stab(*stab, shape, b, h, Role::query), N);
      double* Ah = A.data() + (int64_t(b) * shape.heads + h) * N * N;
      if (row_dependent_keys(spec)) {
        const auto kh = gather_head(k, shape, d, b, h);
        const auto s = own_max(fm, kh, N), M = head_running(*stab, shape, b, h);
        const auto pk = head_features(fm, kh, s, N);
        const CausalPerformerHead hd{pq.data(), pk.data(), s.data(), M.data(), spec.performer.kernel_eps, N, D};
        const std::vector<double> raw = hd.scores();
        for (int i = 0; i < N; ++i) {
          double sum = 0;
          for (int j = 0; j < N; ++j) sum += raw[int64_t(i) * N + j];
          for (int j = 0; j < N; ++j)
            Ah[int64_t(i) * N + j] = spec.normalize ? raw[int64_t(i) * N + j] / (sum + spec.eps) : raw[int64_t(i) * N + j];
        }
      } else {
        const auto pk = head_features(fm, gather_head(k, shape, d, b, h), head_stab(*stab, shape, b, h, Role::key), N);
        linear_attention_head_weights(pq.data(), pk.data(), N, D, mode_of(spec), Ah);
      }
    }
  return A;
}

}  // namespace lunajit::reference

namespace lunajit::reference {

Status check_cu_seqlens(std::span<const int> cu, int64_t total_tokens) {
  if (cu.empty())
    return Error::invalid("cu_seqlens: needs num_seqs + 1 >= 1 offsets, got an empty array");
  if (cu[0] != 0) return Error::invalid(fmt::format("cu_seqlens[0] = {}, must be 0", cu[0]));
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      return Error::invalid(fmt::format("cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} < "
                                        "cu_seqlens[{}] = {}",
                                        i, cu[i], i - 1, cu[i - 1]));
  if (cu.back() != total_tokens)
    return Error::invalid(fmt::format("cu_seqlens[{}] = {}, must equal the total tokens {}", cu.size() - 1,
                                      cu.back(), total_tokens));
  return ok_status();
}

namespace {

// Rows [row0, row0 + rows) of a [1, total, heads, width] tensor (row = token * heads + h).
std::vector<double> token_slice(std::span<const double> x, int64_t t0, int64_t len, int heads, int width) {
  const int64_t stride = int64_t(heads) * width;
  return std::vector<double>(x.begin() + t0 * stride, x.begin() + (t0 + len) * stride);
}

void put_slice(std::span<const double> part, int64_t t0, int heads, int width, std::vector<double>& x) {
  std::copy(part.begin(), part.end(), x.begin() + t0 * int64_t(heads) * width);
}

Status check_packed(const AttentionSpec& spec, int heads, std::span<const int> cu, size_t q_size, size_t k_size,
                    size_t v_size) {
  if (heads < 1) return Error::invalid(fmt::format("heads = {}, must be >= 1", heads));
  const int64_t row_q = int64_t(heads) * spec.head_dim;
  if (q_size % row_q != 0)
    return Error::invalid(fmt::format("q has {} values, not a whole number of [heads={}, head_dim={}] rows",
                                      q_size, heads, spec.head_dim));
  const int64_t total = int64_t(q_size) / row_q;
  if (auto st = check_cu_seqlens(cu, total); !st) return st;
  if (int64_t(k_size) != total * row_q)
    return Error::invalid(fmt::format("k has {} values, expected {} (= q's)", k_size, total * row_q));
  if (int64_t(v_size) != total * heads * spec.value_dim)
    return Error::invalid(fmt::format("v has {} values, expected {}", v_size, total * heads * spec.value_dim));
  return ok_status();
}

}  // namespace

Result<ForwardResult> linear_attention_forward_varlen(const AttentionSpec& spec, int heads,
                                                      std::span<const int> cu, std::span<const double> q,
                                                      std::span<const double> k, std::span<const double> v,
                                                      std::span<const double> params) {
  if (auto st = check_packed(spec, heads, cu, q.size(), k.size(), v.size()); !st) return st.error();
  ForwardResult result;
  result.out.assign(size_t(cu.back()) * heads * spec.value_dim, 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int len = cu[s + 1] - cu[s];
    if (len == 0) continue;
    const AttentionShape shape{1, len, heads};
    auto part = linear_attention_forward(spec, shape, token_slice(q, cu[s], len, heads, spec.head_dim),
                                         token_slice(k, cu[s], len, heads, spec.head_dim),
                                         token_slice(v, cu[s], len, heads, spec.value_dim), params);
    if (!part) return part.error();
    put_slice(part->out, cu[s], heads, spec.value_dim, result.out);
  }
  return result;
}

Result<Gradients> linear_attention_backward_varlen(const AttentionSpec& spec, int heads, std::span<const int> cu,
                                                   std::span<const double> q, std::span<const double> k,
                                                   std::span<const double> v, std::span<const double> params,
                                                   std::span<const double> dout) {
  if (auto st = check_packed(spec, heads, cu, q.size(), k.size(), v.size()); !st) return st.error();
  if (dout.size() != v.size())
    return Error::invalid(fmt::format("dout has {} values, expected {} (= v's)", dout.size(), v.size()));
  Gradients g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  g.dq_terms.assign(q.size(), 0.0);
  g.dk_terms.assign(k.size(), 0.0);
  g.dv_terms.assign(v.size(), 0.0);
  g.dparams.assign(params.size(), 0.0);
  g.dparams_terms.assign(params.size(), 0.0);
  const int d = spec.head_dim, dv = spec.value_dim;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int len = cu[s + 1] - cu[s];
    if (len == 0) continue;
    const AttentionShape shape{1, len, heads};
    auto part = linear_attention_backward(spec, shape, token_slice(q, cu[s], len, heads, d),
                                          token_slice(k, cu[s], len, heads, d), token_slice(v, cu[s], len, heads, dv),
                                          params, token_slice(dout, cu[s], len, heads, dv));
    if (!part) return part.error();
    put_slice(part->dq, cu[s], heads, d, g.dq);
    put_slice(part->dk, cu[s], heads, d, g.dk);
    put_slice(part->dv, cu[s], heads, dv, g.dv);
    put_slice(part->dq_terms, cu[s], heads, d, g.dq_terms);
    put_slice(part->dk_terms, cu[s], heads, d, g.dk_terms);
    put_slice(part->dv_terms, cu[s], heads, dv, g.dv_terms);
    for (size_t i = 0; i < params.size(); ++i) {
      g.dparams[i] += part->dparams[i];
      g.dparams_terms[i] += part->dparams_terms[i];
    }
  }
  return g;
}

}  // namespace lunajit::reference
