// Jacobian-transpose products of the feature maps (docs/MATH.md §1 backward):
// given dphi for a tile of rows, dx = J_phi(x)^T dphi, and the gradient of every
// learned parameter accumulated into the block's partial `dparams`.
//
// FeatureMapBackward<FM>::backward<kThreads>(x, phi, dphi, valid, ctx, scratch,
//                                            bscratch, dx, dparams)
//   x        (rows, d)   the inputs phi was computed from
//   phi      (rows, D)   phi(x), as FM::apply left it
//   dphi     (rows, D)   upstream gradient; overwritten (used as workspace)
//   scratch  (rows, FM::kScratchPerRow)  as FM::apply left it for these rows
//   bscratch (rows, kScratchPerRow of this struct)
//   dx       (rows, d)   written
//   dparams  (param_floats) smem partial, accumulated; unused for fixed families
// Determinism: every parameter entry is updated by one fixed thread, looping
// over rows in order, so the partial sums are bitwise reproducible.
// Performer's stabilisers are stop-gradient (as in reference/feature_map.h).
// Ends with __syncthreads().
#pragma once

#include "lunajit/feature_maps.cuh"

namespace lunajit {

namespace fm {

template <Act A>
LUNAJIT_DEVICE float activation_grad(float x) {
  if constexpr (A == Act::relu) return x > 0.0f ? 1.0f : 0.0f;
  else if constexpr (A == Act::gelu) {
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    return cdf + x * pdf;
  } else if constexpr (A == Act::silu) {
    const float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
  } else {
    const float t = tanhf(x);
    return 1.0f - t * t;
  }
}

// Derivative of the output activation at its input y.
template <OutAct A>
LUNAJIT_DEVICE float output_activation_grad(float y) {
  if constexpr (A == OutAct::relu) return y > 0.0f ? 1.0f : 0.0f;
  else if constexpr (A == OutAct::softplus) return sigmoid(y);
  else return 1.0f;
}

LUNAJIT_DEVICE float bank_basis_grad(int l, float u) {
  switch (l & 7) {
    case 0: return cosf(u);
    case 1: return -sinf(u);
    case 2: {
      const float t = tanhf(u);
      return 1.0f - t * t;
    }
    case 3: {
      const float s = sigmoid(u);
      return s * (1.0f - s);
    }
    case 4: return u > 0.0f ? 1.0f : 0.0f;
    case 5: return activation_grad<Act::gelu>(u);
    case 6: return sigmoid(u);
    default: return -u * expf(-0.5f * u * u);
  }
}

// dx (rows, d) = dy (rows, f) W (f, d); dW (f, d) += dy^T x; db (f) += colsum(dy).
// The linear layer shared by t2r and hedgehog (and luna's projections).
template <int kThreads>
LUNAJIT_DEVICE void linear_backward(const float* x, const float* dy, int valid, int d, int f, const float* W,
                                    float* dx, float* dW, float* db) {
  for (int e = threadIdx.x; e < valid * d; e += kThreads) {
    const int r = e / d, c = e - r * d;
    float s = 0.0f;
    for (int k = 0; k < f; ++k) s = fmaf(dy[r * f + k], W[k * d + c], s);
    dx[e] = s;
  }
  if (dW != nullptr)
    for (int e = threadIdx.x; e < f * d; e += kThreads) {
      const int k = e / d, c = e - k * d;
      float s = dW[e];
      for (int r = 0; r < valid; ++r) s = fmaf(dy[r * f + k], x[r * d + c], s);
      dW[e] = s;
    }
  if (db != nullptr)
    for (int k = threadIdx.x; k < f; k += kThreads) {
      float s = db[k];
      for (int r = 0; r < valid; ++r) s += dy[r * f + k];
      db[k] = s;
    }
}

}  // namespace fm

template <class FM>
struct FeatureMapBackward;

// ---------------------------------------------------------------- luna
template <class Opt>
struct FeatureMapBackward<LunaFeatureMap<Opt>> {
  using FM = LunaFeatureMap<Opt>;
  static constexpr int d = FM::d, M = FM::M, L = FM::L, Hm = FM::Hm, D = FM::D;
  static constexpr int kScratchPerRow = 1 + 2 * M;  // [denv, u_0..u_{M-1}, du_0..du_{M-1}]
  // The rff variant freezes W; only an envelope then learns.
  static constexpr bool kLearned = Opt::variant != fm::LunaVariant::rff || Opt::envelope;

  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext& ctx, const float* scratch, float* bs, float* dx,
                                      float* dparams) {
    const float* p = ctx.params;
    constexpr int S = kScratchPerRow;
    // Envelope: phi = g(x) * base, g = sigmoid(a.x + c): d(a.x + c) = (1 - g) sum_f dphi phi.
    if constexpr (Opt::envelope) {
      const float inv_sqrt_m = 1.0f / sqrtf((float)M);
      for (int r = threadIdx.x; r < valid; r += kThreads) {
        const float g = scratch[r] / inv_sqrt_m;
        bs[r * S] = (1.0f - g) * fm::dot(dphi + r * D, phi + r * D, D);
      }
      __syncthreads();  // the loop below overwrites dphi
    }
    // Per (row, projection): u, dpre (in place of dphi), du.
    for (int item = threadIdx.x; item < valid * M; item += kThreads) {
      const int r = item / M, i = item - r * M;
      const float u = fm::dot(p + FM::kW + i * d, x + r * d, d);
      const float gate = scratch[r];
      float* dp = dphi + r * D + i * L;
      float du = 0.0f;
      if constexpr (Opt::variant == fm::LunaVariant::neural && Opt::shared_channels) {
        float pre[L];
#pragma unroll
        for (int l = 0; l < L; ++l) pre[l] = p[FM::kB2 + l];
        for (int j = 0; j < Hm; ++j) {
          const float h = fm::activation<Opt::activation>(fmaf(p[FM::kW1 + j], u, p[FM::kB1 + j]));
#pragma unroll
          for (int l = 0; l < L; ++l) pre[l] = fmaf(p[FM::kW2 + l * Hm + j], h, pre[l]);
        }
#pragma unroll
        for (int l = 0; l < L; ++l) dp[l] *= gate * fm::output_activation_grad<Opt::output_activation>(pre[l]);
        for (int j = 0; j < Hm; ++j) {
          float dh = 0.0f;
#pragma unroll
          for (int l = 0; l < L; ++l) dh = fmaf(dp[l], p[FM::kW2 + l * Hm + j], dh);
          const float a = fmaf(p[FM::kW1 + j], u, p[FM::kB1 + j]);
          du = fmaf(dh * fm::activation_grad<Opt::activation>(a), p[FM::kW1 + j], du);
        }
      } else if constexpr (Opt::variant == fm::LunaVariant::neural) {
        for (int l = 0; l < L; ++l) {
          float pre = p[FM::kB2 + l];
          for (int j = 0; j < Hm; ++j)
            pre = fmaf(p[FM::kW2 + l * Hm + j],
                       fm::activation<Opt::activation>(fmaf(p[FM::kW1 + l * Hm + j], u, p[FM::kB1 + l * Hm + j])),
                       pre);
          const float dpre = dp[l] * gate * fm::output_activation_grad<Opt::output_activation>(pre);
          dp[l] = dpre;
          for (int j = 0; j < Hm; ++j) {
            const float a = fmaf(p[FM::kW1 + l * Hm + j], u, p[FM::kB1 + l * Hm + j]);
            du = fmaf(dpre * p[FM::kW2 + l * Hm + j] * fm::activation_grad<Opt::activation>(a),
                      p[FM::kW1 + l * Hm + j], du);
          }
        }
      } else if constexpr (Opt::variant == fm::LunaVariant::bank_coef) {
        for (int l = 0; l < L; ++l) {
          dp[l] *= gate;
          du = fmaf(dp[l] * p[FM::kCoef + l], fm::bank_basis_grad(l, u), du);
        }
      } else {
        du = gate * (-sinf(u) * dp[0] + cosf(u) * dp[1]);
      }
      bs[r * S + 1 + i] = u;
      bs[r * S + 1 + M + i] = du;
    }
    __syncthreads();

    projection_gradients<kThreads>(x, valid, p, bs, dx, dparams);
    // Parameter gradients, one owner thread per entry, rows in order.
    if constexpr (Opt::variant == fm::LunaVariant::neural && Opt::shared_channels) {
      for (int e = threadIdx.x; e < Hm + L * Hm + L; e += kThreads) {
        if (e < Hm) {  // W1[j], b1[j]
          const int j = e;
          float sw = dparams[FM::kW1 + j], sb = dparams[FM::kB1 + j];
          for (int r = 0; r < valid; ++r)
            for (int i = 0; i < M; ++i) {
              const float u = bs[r * S + 1 + i];
              const float* dp = dphi + r * D + i * L;
              float dh = 0.0f;
              for (int l = 0; l < L; ++l) dh = fmaf(dp[l], p[FM::kW2 + l * Hm + j], dh);
              const float g = dh * fm::activation_grad<Opt::activation>(fmaf(p[FM::kW1 + j], u, p[FM::kB1 + j]));
              sw = fmaf(g, u, sw);
              sb += g;
            }
          dparams[FM::kW1 + j] = sw;
          dparams[FM::kB1 + j] = sb;
        } else if (e < Hm + L * Hm) {  // W2[l][j]
          const int lj = e - Hm, l = lj / Hm, j = lj - l * Hm;
          float s = dparams[FM::kW2 + lj];
          for (int r = 0; r < valid; ++r)
            for (int i = 0; i < M; ++i) {
              const float u = bs[r * S + 1 + i];
              const float h = fm::activation<Opt::activation>(fmaf(p[FM::kW1 + j], u, p[FM::kB1 + j]));
              s = fmaf(dphi[r * D + i * L + l], h, s);
            }
          dparams[FM::kW2 + lj] = s;
        } else {  // b2[l]
          const int l = e - Hm - L * Hm;
          float s = dparams[FM::kB2 + l];
          for (int r = 0; r < valid; ++r)
            for (int i = 0; i < M; ++i) s += dphi[r * D + i * L + l];
          dparams[FM::kB2 + l] = s;
        }
      }
    } else if constexpr (Opt::variant == fm::LunaVariant::neural) {
      for (int e = threadIdx.x; e < L * Hm + L; e += kThreads) {
        if (e < L * Hm) {  // W1[l][j], b1[l][j], W2[l][j]
          const int l = e / Hm;
          float sw1 = dparams[FM::kW1 + e], sb1 = dparams[FM::kB1 + e], sw2 = dparams[FM::kW2 + e];
          for (int r = 0; r < valid; ++r)
            for (int i = 0; i < M; ++i) {
              const float u = bs[r * S + 1 + i];
              const float dpre = dphi[r * D + i * L + l];
              const float a = fmaf(p[FM::kW1 + e], u, p[FM::kB1 + e]);
              sw2 = fmaf(dpre, fm::activation<Opt::activation>(a), sw2);
              const float g = dpre * p[FM::kW2 + e] * fm::activation_grad<Opt::activation>(a);
              sw1 = fmaf(g, u, sw1);
              sb1 += g;
            }
          dparams[FM::kW1 + e] = sw1;
          dparams[FM::kB1 + e] = sb1;
          dparams[FM::kW2 + e] = sw2;
        } else {
          const int l = e - L * Hm;
          float s = dparams[FM::kB2 + l];
          for (int r = 0; r < valid; ++r)
            for (int i = 0; i < M; ++i) s += dphi[r * D + i * L + l];
          dparams[FM::kB2 + l] = s;
        }
      }
    } else if constexpr (Opt::variant == fm::LunaVariant::bank_coef) {
      for (int l = threadIdx.x; l < L; l += kThreads) {
        float s = dparams[FM::kCoef + l];
        for (int r = 0; r < valid; ++r)
          for (int i = 0; i < M; ++i) s = fmaf(dphi[r * D + i * L + l], fm::bank_basis(l, bs[r * S + 1 + i]), s);
        dparams[FM::kCoef + l] = s;
      }
    }
    __syncthreads();
  }

  // dx = sum_i du_i w_i (+ denv a), dW += du^T x and the envelope's (a, c)
  // gradients, from bs's denv and du (every row's, visible to every thread);
  // one owner thread per parameter entry, rows in order. Shared with the
  // tensor-core J^T (feature_map_backward_mma.cuh).
  template <int kThreads>
  static LUNAJIT_DEVICE void projection_gradients(const float* x, int valid, const float* p, const float* bs,
                                                  float* dx, float* dparams) {
    constexpr int S = kScratchPerRow;
    for (int e = threadIdx.x; e < valid * d; e += kThreads) {
      const int r = e / d, c = e - r * d;
      float s = 0.0f;
      for (int i = 0; i < M; ++i) s = fmaf(bs[r * S + 1 + M + i], p[FM::kW + i * d + c], s);
      if constexpr (Opt::envelope) s = fmaf(bs[r * S], p[FM::kA + c], s);
      dx[e] = s;
    }
    if constexpr (Opt::variant != fm::LunaVariant::rff) {  // W is frozen for the rff variant
      for (int e = threadIdx.x; e < M * d; e += kThreads) {
        const int i = e / d, c = e - i * d;
        float s = dparams[FM::kW + e];
        for (int r = 0; r < valid; ++r) s = fmaf(bs[r * S + 1 + M + i], x[r * d + c], s);
        dparams[FM::kW + e] = s;
      }
    }
    if constexpr (Opt::envelope) {
      for (int c = threadIdx.x; c <= d; c += kThreads) {
        float s = dparams[FM::kA + c];  // c == d is the bias kC = kA + d
        for (int r = 0; r < valid; ++r) s = c < d ? fmaf(bs[r * S], x[r * d + c], s) : s + bs[r * S];
        dparams[FM::kA + c] = s;
      }
    }
  }
};

// ---------------------------------------------------------------- performer
template <class Opt>
struct FeatureMapBackward<PerformerFeatureMap<Opt>> {
  static constexpr int d = Opt::d, D = Opt::features;
  static constexpr int kScratchPerRow = 1;
  static constexpr bool kLearned = false;

  // exponent_f = s w_f.x - s^2 |x|^2 / 2 (s = d^{-1/4}); dexp_f = dphi_f (phi_f - kernel_eps).
  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext& ctx, const float*, float* bs, float* dx, float*) {
    const float s = rsqrtf(sqrtf((float)d));
    for (int e = threadIdx.x; e < valid * D; e += kThreads) dphi[e] *= phi[e] - Opt::kernel_eps;
    __syncthreads();
    for (int r = threadIdx.x; r < valid; r += kThreads) {
      float t = 0.0f;
      for (int f = 0; f < D; ++f) t += dphi[r * D + f];
      bs[r] = t;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * d; e += kThreads) {
      const int r = e / d, c = e - r * d;
      float acc = 0.0f;
      for (int f = 0; f < D; ++f) acc = fmaf(dphi[r * D + f], ctx.params[f * d + c], acc);
      dx[e] = s * acc - s * s * x[e] * bs[r];
    }
    __syncthreads();
  }
};

// ---------------------------------------------------------------- rff
template <class Opt>
struct FeatureMapBackward<RffFeatureMap<Opt>> {
  static constexpr int d = Opt::d, m = Opt::features, D = 2 * m;
  static constexpr int kScratchPerRow = 0;
  static constexpr bool kLearned = false;

  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext& ctx, const float*, float*, float* dx, float*) {
    // t_f = w_f.x: dt_f = -phi_sin_f dcos_f + phi_cos_f dsin_f (into dphi's cos half).
    for (int e = threadIdx.x; e < valid * m; e += kThreads) {
      const int r = e / m, f = e - r * m;
      dphi[r * D + f] = -phi[r * D + m + f] * dphi[r * D + f] + phi[r * D + f] * dphi[r * D + m + f];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * d; e += kThreads) {
      const int r = e / d, c = e - r * d;
      float acc = 0.0f;
      for (int f = 0; f < m; ++f) acc = fmaf(dphi[r * D + f], ctx.params[f * d + c], acc);
      dx[e] = acc;
    }
    __syncthreads();
  }
};

// ---------------------------------------------------------------- elu, relu, cosformer
template <class Opt>
struct FeatureMapBackward<EluFeatureMap<Opt>> {
  static constexpr int d = Opt::d;
  static constexpr int kScratchPerRow = 0;
  static constexpr bool kLearned = false;

  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext&, const float*, float*, float* dx, float*) {
    for (int e = threadIdx.x; e < valid * d; e += kThreads) dx[e] = dphi[e] * (x[e] > 0.0f ? 1.0f : phi[e]);
    __syncthreads();
  }
};

template <class Opt>
struct FeatureMapBackward<ReluFeatureMap<Opt>> {
  static constexpr int d = Opt::d;
  static constexpr int kScratchPerRow = 0;
  static constexpr bool kLearned = false;

  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float*, float* dphi, int valid, const FeatureContext&,
                                      const float*, float*, float* dx, float*) {
    for (int e = threadIdx.x; e < valid * d; e += kThreads) dx[e] = x[e] > 0.0f ? dphi[e] : 0.0f;
    __syncthreads();
  }
};

template <class Opt>
struct FeatureMapBackward<CosformerFeatureMap<Opt>> {
  static constexpr int d = Opt::d, D = 2 * d;
  static constexpr int kScratchPerRow = 0;
  static constexpr bool kLearned = false;

  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float*, float* dphi, int valid,
                                      const FeatureContext& ctx, const float*, float*, float* dx, float*) {
    const float step = 1.57079632679489662f / (float)ctx.seq_len;
    for (int e = threadIdx.x; e < valid * d; e += kThreads) {
      const int r = e / d, c = e - r * d;
      const float angle = step * (float)(ctx.first_token + r + 1);
      dx[e] = x[e] > 0.0f ? dphi[r * D + c] * sinf(angle) + dphi[r * D + d + c] * cosf(angle) : 0.0f;
    }
    __syncthreads();
  }
};

// ---------------------------------------------------------------- t2r, hedgehog
template <class Opt>
struct FeatureMapBackward<T2rFeatureMap<Opt>> {
  static constexpr int d = Opt::d, D = Opt::features;
  static constexpr int kScratchPerRow = 0;
  static constexpr bool kLearned = true;

  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext& ctx, const float*, float*, float* dx, float* dparams) {
    for (int e = threadIdx.x; e < valid * D; e += kThreads)
      if (!(phi[e] > 0.0f)) dphi[e] = 0.0f;
    __syncthreads();
    fm::linear_backward<kThreads>(x, dphi, valid, d, D, ctx.params, dx, dparams, dparams + D * d);
    __syncthreads();
  }
};

template <class Opt>
struct FeatureMapBackward<HedgehogFeatureMap<Opt>> {
  static constexpr int d = Opt::d, f = Opt::features, D = 2 * f;
  static constexpr int kScratchPerRow = 0;
  static constexpr bool kLearned = true;

  // Softmax backward per half: dy_k = p_k (dp_k - p.dp) - n_k (dn_k - n.dn), into dphi[:, :f].
  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext& ctx, const float*, float*, float* dx, float* dparams) {
    for (int r = threadIdx.x; r < valid; r += kThreads) {
      const float* pr = phi + r * D;
      float* g = dphi + r * D;
      const float sp = fm::dot(pr, g, f), sn = fm::dot(pr + f, g + f, f);
      for (int k = 0; k < f; ++k) g[k] = pr[k] * (g[k] - sp) - pr[f + k] * (g[f + k] - sn);
    }
    __syncthreads();
    // dy lives in dphi with row stride D.
    hedgehog_linear<kThreads>(x, dphi, valid, ctx.params, dx, dparams);
    __syncthreads();
  }

  template <int kThreads>
  static LUNAJIT_DEVICE void hedgehog_linear(const float* x, const float* dy, int valid, const float* W, float* dx,
                                             float* dparams) {
    for (int e = threadIdx.x; e < valid * d; e += kThreads) {
      const int r = e / d, c = e - r * d;
      float s = 0.0f;
      for (int k = 0; k < f; ++k) s = fmaf(dy[r * D + k], W[k * d + c], s);
      dx[e] = s;
    }
    for (int e = threadIdx.x; e < f * d; e += kThreads) {
      const int k = e / d, c = e - k * d;
      float s = dparams[e];
      for (int r = 0; r < valid; ++r) s = fmaf(dy[r * D + k], x[r * d + c], s);
      dparams[e] = s;
    }
    for (int k = threadIdx.x; k < f; k += kThreads) {
      float s = dparams[f * d + k];
      for (int r = 0; r < valid; ++r) s += dy[r * D + k];
      dparams[f * d + k] = s;
    }
  }
};

// ---------------------------------------------------------------- slay
template <class Opt>
struct FeatureMapBackward<SlayFeatureMap<Opt>> {
  using FM = SlayFeatureMap<Opt>;
  static constexpr int d = Opt::d, R = Opt::nodes, P = Opt::anchors, M = Opt::prf_features, D = R * P * M;
  static constexpr int kScratchPerRow = P + R * M;  // d(anchor feature), d(prf feature)
  static constexpr bool kLearned = false;

  // phi = sqrt(w_r) anc_p prf_rj; anc_p = P^-1/2 (a_p.u)^2; prf_rj = M^-1/2 exp(sqrt(2 s_r) o_rj.u - s_r);
  // du = sum_p 2 P^-1/2 (a_p.u) danc_p a_p + sum_rj sqrt(2 s_r) prf_rj dprf_rj o_rj;
  // dx = (du - u (u.du)) / |x|.
  template <int kThreads>
  static LUNAJIT_DEVICE void backward(const float* x, const float*, float* dphi, int valid,
                                      const FeatureContext& ctx, const float* scratch, float* bs, float* dx,
                                      float*) {
    const float* p = ctx.params;
    constexpr int S = FM::kScratchPerRow, B = kScratchPerRow;
    for (int item = threadIdx.x; item < valid * (P + R * M); item += kThreads) {
      const int r = item / (P + R * M), k = item - r * (P + R * M);
      const float* row = scratch + r * S + 1;  // [anc (P), prf (R*M)]
      const float* g = dphi + r * D;
      float acc = 0.0f;
      if (k < P) {
        for (int node = 0; node < R; ++node) {
          const float w = sqrtf(p[FM::kWeights + node]);
          for (int j = 0; j < M; ++j) acc = fmaf(g[node * P * M + k * M + j], w * row[P + node * M + j], acc);
        }
      } else {
        const int node = (k - P) / M, j = (k - P) - node * M;
        const float w = sqrtf(p[FM::kWeights + node]);
        for (int a = 0; a < P; ++a) acc = fmaf(g[node * P * M + a * M + j], w * row[a], acc);
      }
      bs[r * B + k] = acc;
    }
    __syncthreads();
    // Derivatives with respect to the projections a_p.u and o_rj.u, in place.
    const float anc_norm = rsqrtf((float)P);
    for (int item = threadIdx.x; item < valid * (P + R * M); item += kThreads) {
      const int r = item / (P + R * M), k = item - r * (P + R * M);
      const float* row = scratch + r * S + 1;
      const float inv = scratch[r * S];
      if (k < P) {
        const float proj = inv * fm::dot(p + FM::kAnchors + k * d, x + r * d, d);
        bs[r * B + k] *= 2.0f * anc_norm * proj;
      } else {
        const int node = (k - P) / M;
        bs[r * B + k] *= sqrtf(2.0f * p[FM::kNodes + node]) * row[k];
      }
    }
    __syncthreads();
    // du into dx, then project out the radial part: one row per thread.
    for (int e = threadIdx.x; e < valid * d; e += kThreads) {
      const int r = e / d, c = e - r * d;
      float s = 0.0f;
      for (int k = 0; k < P; ++k) s = fmaf(bs[r * B + k], p[FM::kAnchors + k * d + c], s);
      for (int k = 0; k < R * M; ++k) s = fmaf(bs[r * B + P + k], p[FM::kOmega + k * d + c], s);
      dx[e] = s;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < valid; r += kThreads) {
      const float inv = scratch[r * S];
      float udu = 0.0f;
      for (int c = 0; c < d; ++c) udu = fmaf(x[r * d + c] * inv, dx[r * d + c], udu);
      for (int c = 0; c < d; ++c) dx[r * d + c] = (dx[r * d + c] - x[r * d + c] * inv * udu) * inv;
    }
    __syncthreads();
  }
};

}  // namespace lunajit
