// Feature maps phi: R^d -> R^D of every family (docs/MATH.md §2), computed for a
// tile of rows in shared memory by all threads of a block, in fp32.
//
// Interface of a feature map FM (Opt = a generated struct of static constexpr options):
//   FM::D                    feature dimension
//   FM::kScratchPerRow       fp32 scratch floats per row it needs in shared memory
//   FM::apply<kThreads>(x, phi, scratch, valid, ctx)
//       x (rows, d) fp32 smem -> phi (rows, D) fp32 smem for rows < valid; rows
//       >= valid are left untouched (callers never read them). Ends with
//       __syncthreads(), so phi is ready for every thread on return.
// Feature index orders (the reference follows the same): luna i*L + l;
// rff [cos_0..cos_{m-1}, sin_0..sin_{m-1}]; hedgehog [softmax(y), softmax(-y)];
// cosformer [relu(x) sin, relu(x) cos]; slay r*P*M + p*M + j.
// Parameters are read from global memory (read-only, cached in L1/L2): the
// layout of codegen/feature_params.h, already offset to this head's block.
#pragma once

#include "lunajit/device.cuh"

namespace lunajit {

struct FeatureContext {
  const float* params;  // this head's parameter block
  int first_token;      // sequence position of row 0 (cosformer)
  int seq_len;          // N (cosformer)
  int is_query;         // performer: per-row stabiliser for queries
  float key_stab;       // performer: the (batch, head) key stabiliser
};

namespace fm {

enum class Act { relu, gelu, silu, tanh };
enum class OutAct { relu, softplus, none };
enum class LunaVariant { neural, bank_coef, rff };

LUNAJIT_DEVICE float dot(const float* __restrict__ a, const float* __restrict__ b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s = fmaf(a[i], b[i], s);
  return s;
}

// dot(a, b, N) summed from element rot % N round to rot % N - 1: threads
// that read rows at an N-float stride with different rot then start in
// different shared-memory banks (a fixed order per (rot): deterministic).
template <int N>
LUNAJIT_DEVICE float dot_rotated(const float* __restrict__ a, const float* __restrict__ b, int rot) {
  float s = 0.0f;
  int k = rot % N;
  for (int n = 0; n < N; ++n) {
    s = fmaf(a[k], b[k], s);
    k = k + 1 == N ? 0 : k + 1;
  }
  return s;
}

template <Act A>
LUNAJIT_DEVICE float activation(float x) {
  if constexpr (A == Act::relu) return fmaxf(x, 0.0f);
  else if constexpr (A == Act::gelu) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  else if constexpr (A == Act::silu) return x / (1.0f + expf(-x));
  else return tanhf(x);
}

template <OutAct A>
LUNAJIT_DEVICE float output_activation(float x) {
  if constexpr (A == OutAct::relu) return fmaxf(x, 0.0f);
  else if constexpr (A == OutAct::softplus) return x > 20.0f ? x : log1pf(expf(x));
  else return x;
}

LUNAJIT_DEVICE float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// luna's bank_coef basis b_l, cycling by l mod 8 (docs/MATH.md §2).
LUNAJIT_DEVICE float bank_basis(int l, float u) {
  switch (l & 7) {
    case 0: return sinf(u);
    case 1: return cosf(u);
    case 2: return tanhf(u);
    case 3: return sigmoid(u);
    case 4: return fmaxf(u, 0.0f);
    case 5: return activation<Act::gelu>(u);
    case 6: return output_activation<OutAct::softplus>(u);
    default: return expf(-0.5f * u * u);
  }
}

}  // namespace fm

// LUNA (eq. 11): phi(x) = h(x)/sqrt(M) [psi_l(w_i^T x)]_{i,l}. One work item per
// (row, projection): u = w_i . x, then the 1 -> Hm -> L channel MLP streamed
// over the hidden units with L accumulators in registers (no Hm-sized storage).
template <class Opt>
struct LunaFeatureMap {
  using Options = Opt;
  static constexpr int d = Opt::d, M = Opt::projections, L = Opt::channels, Hm = Opt::mlp_width;
  static constexpr int D = M * L;
  static constexpr int kScratchPerRow = 1;  // gate h(x) / sqrt(M)
  // Offsets in the parameter block (codegen/feature_params.h).
  static constexpr int kW = 0;
  static constexpr int kW1 = kW + M * d;
  static constexpr int kB1 = kW1 + (Opt::shared_channels ? Hm : L * Hm);
  static constexpr int kW2 = kB1 + (Opt::shared_channels ? Hm : L * Hm);
  static constexpr int kB2 = kW2 + L * Hm;
  static constexpr int kMlpEnd = Opt::variant == fm::LunaVariant::neural   ? kB2 + L
                                 : Opt::variant == fm::LunaVariant::bank_coef ? kW1 + L
                                                                               : kW1;
  static constexpr int kCoef = kW1;
  static constexpr int kA = kMlpEnd, kC = kA + d;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float* scratch, int valid,
                                   const FeatureContext& ctx) {
    const float* p = ctx.params;
    const float inv_sqrt_m = 1.0f / sqrtf((float)M);
    for (int r = threadIdx.x; r < valid; r += kThreads) {
      float gate = inv_sqrt_m;
      if constexpr (Opt::envelope) gate *= fm::sigmoid(fm::dot(p + kA, x + r * d, d) + p[kC]);
      scratch[r] = gate;
    }
    __syncthreads();
    for (int item = threadIdx.x; item < valid * M; item += kThreads) {
      const int r = item / M;
      const int i = item - r * M;
      const float u = fm::dot(p + kW + i * d, x + r * d, d);
      float psi[L];
      if constexpr (Opt::variant == fm::LunaVariant::neural && Opt::shared_channels) {
#pragma unroll
        for (int l = 0; l < L; ++l) psi[l] = p[kB2 + l];
        for (int j = 0; j < Hm; ++j) {
          const float hidden = fm::activation<Opt::activation>(fmaf(p[kW1 + j], u, p[kB1 + j]));
#pragma unroll
          for (int l = 0; l < L; ++l) psi[l] = fmaf(p[kW2 + l * Hm + j], hidden, psi[l]);
        }
#pragma unroll
        for (int l = 0; l < L; ++l) psi[l] = fm::output_activation<Opt::output_activation>(psi[l]);
      } else if constexpr (Opt::variant == fm::LunaVariant::neural) {
        for (int l = 0; l < L; ++l) {
          float acc = p[kB2 + l];
          for (int j = 0; j < Hm; ++j)
            acc = fmaf(p[kW2 + l * Hm + j],
                       fm::activation<Opt::activation>(fmaf(p[kW1 + l * Hm + j], u, p[kB1 + l * Hm + j])), acc);
          psi[l] = fm::output_activation<Opt::output_activation>(acc);
        }
      } else if constexpr (Opt::variant == fm::LunaVariant::bank_coef) {
#pragma unroll
        for (int l = 0; l < L; ++l) psi[l] = p[kCoef + l] * fm::bank_basis(l, u);
      } else {
        psi[0] = cosf(u);
        psi[1] = sinf(u);
      }
      const float gate = scratch[r];
#pragma unroll
      for (int l = 0; l < L; ++l) phi[r * D + i * L + l] = gate * psi[l];
    }
    __syncthreads();
  }
};

// FAVOR+ (Performer): phi(x) = m^{-1/2} exp(omega^T x' - |x'|^2/2 - stab) + kernel_eps,
// x' = d^{-1/4} x. Queries (is_query) subtract their own max over features;
// keys of non-causal attention the (batch, head) max computed by key_stab_kernel
// before any key is mapped. Causal attention maps keys in the query form too and
// rescales them per query row (performer_causal_chunk, docs/MATH.md §2).
template <class Opt>
struct PerformerFeatureMap {
  static constexpr int d = Opt::d, D = Opt::features;
  static constexpr int kScratchPerRow = 1;  // after apply: each row's stabiliser
  static constexpr float kKernelEps = Opt::kernel_eps;

  // phi <- omega^T x' - |x'|^2 / 2 (the exponent before stabilisation).
  template <int kThreads>
  static LUNAJIT_DEVICE void log_features(const float* x, float* phi, float* scratch, int valid,
                                          const FeatureContext& ctx) {
    const float scale = rsqrtf(sqrtf((float)d));  // d^{-1/4}
    for (int r = threadIdx.x; r < valid; r += kThreads)
      scratch[r] = 0.5f * scale * scale * fm::dot(x + r * d, x + r * d, d);
    __syncthreads();
    for (int item = threadIdx.x; item < valid * D; item += kThreads) {
      const int r = item / D;
      const int f = item - r * D;
      phi[item] = scale * fm::dot(ctx.params + f * d, x + r * d, d) - scratch[r];
    }
    __syncthreads();
  }

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float* scratch, int valid,
                                   const FeatureContext& ctx) {
    log_features<kThreads>(x, phi, scratch, valid, ctx);
    for (int r = threadIdx.x; r < valid; r += kThreads) {
      float stab = ctx.key_stab;
      if (ctx.is_query) {
        stab = phi[r * D];
        for (int f = 1; f < D; ++f) stab = fmaxf(stab, phi[r * D + f]);
      }
      scratch[r] = stab;
    }
    __syncthreads();
    const float norm = rsqrtf((float)D);
    for (int item = threadIdx.x; item < valid * D; item += kThreads)
      phi[item] = norm * expf(phi[item] - scratch[item / D]) + Opt::kernel_eps;
    __syncthreads();
  }
};

// Random Fourier features: sqrt(1/m) [cos(omega_r . x), sin(omega_r . x)].
template <class Opt>
struct RffFeatureMap {
  static constexpr int d = Opt::d, m = Opt::features, D = 2 * m;
  static constexpr int kScratchPerRow = 0;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float*, int valid, const FeatureContext& ctx) {
    const float norm = rsqrtf((float)m);
    for (int item = threadIdx.x; item < valid * m; item += kThreads) {
      const int r = item / m;
      const int f = item - r * m;
      const float w = fm::dot(ctx.params + f * d, x + r * d, d);
      phi[r * D + f] = norm * cosf(w);
      phi[r * D + m + f] = norm * sinf(w);
    }
    __syncthreads();
  }
};

// Linear Transformer: elu(x) + 1.
template <class Opt>
struct EluFeatureMap {
  static constexpr int d = Opt::d, D = d;
  static constexpr int kScratchPerRow = 0;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float*, int valid, const FeatureContext&) {
    for (int item = threadIdx.x; item < valid * d; item += kThreads) {
      const float v = x[item];
      phi[item] = v > 0.0f ? v + 1.0f : expf(v);
    }
    __syncthreads();
  }
};

template <class Opt>
struct ReluFeatureMap {
  static constexpr int d = Opt::d, D = d;
  static constexpr int kScratchPerRow = 0;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float*, int valid, const FeatureContext&) {
    for (int item = threadIdx.x; item < valid * d; item += kThreads) phi[item] = fmaxf(x[item], 0.0f);
    __syncthreads();
  }
};

// T2R: relu(W x + b), W (D, d).
template <class Opt>
struct T2rFeatureMap {
  static constexpr int d = Opt::d, D = Opt::features;
  static constexpr int kScratchPerRow = 0;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float*, int valid, const FeatureContext& ctx) {
    const float* W = ctx.params;
    const float* b = ctx.params + D * d;
    for (int item = threadIdx.x; item < valid * D; item += kThreads) {
      const int r = item / D;
      const int f = item - r * D;
      phi[item] = fmaxf(fm::dot(W + f * d, x + r * d, d) + b[f], 0.0f);
    }
    __syncthreads();
  }
};

// Hedgehog: y = W x + b, phi = [softmax(y), softmax(-y)], each half on its own.
template <class Opt>
struct HedgehogFeatureMap {
  static constexpr int d = Opt::d, f = Opt::features, D = 2 * f;
  static constexpr int kScratchPerRow = 0;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float*, int valid, const FeatureContext& ctx) {
    const float* W = ctx.params;
    const float* b = ctx.params + f * d;
    for (int item = threadIdx.x; item < valid * f; item += kThreads) {
      const int r = item / f;
      const int k = item - r * f;
      phi[r * D + k] = fm::dot(W + k * d, x + r * d, d) + b[k];
    }
    __syncthreads();
    for (int r = threadIdx.x; r < valid; r += kThreads) {
      float* row = phi + r * D;
      float hi = row[0], lo = row[0];
      for (int k = 1; k < f; ++k) {
        hi = fmaxf(hi, row[k]);
        lo = fminf(lo, row[k]);
      }
      float sum_pos = 0.0f, sum_neg = 0.0f;
      for (int k = 0; k < f; ++k) {
        const float y = row[k];
        const float ep = expf(y - hi), en = expf(lo - y);
        row[f + k] = en;
        row[k] = ep;
        sum_pos += ep;
        sum_neg += en;
      }
      const float ip = 1.0f / sum_pos, in = 1.0f / sum_neg;
      for (int k = 0; k < f; ++k) {
        row[k] *= ip;
        row[f + k] *= in;
      }
    }
    __syncthreads();
  }
};

// cosFormer: [relu(x) sin(pi i / 2N), relu(x) cos(pi i / 2N)], i the 1-based position.
template <class Opt>
struct CosformerFeatureMap {
  static constexpr int d = Opt::d, D = 2 * d;
  static constexpr int kScratchPerRow = 0;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float*, int valid, const FeatureContext& ctx) {
    const float step = 1.57079632679489662f / (float)ctx.seq_len;  // pi / (2N)
    for (int item = threadIdx.x; item < valid * d; item += kThreads) {
      const int r = item / d;
      const int c = item - r * d;
      const float angle = step * (float)(ctx.first_token + r + 1);
      const float v = fmaxf(x[item], 0.0f);
      phi[r * D + c] = v * sinf(angle);
      phi[r * D + d + c] = v * cosf(angle);
    }
    __syncthreads();
  }
};

// SLAY: u = x/|x|; phi = concat_r sqrt(w_r) (phi_anc(u) (x) phi_prf(u; s_r)).
// Scratch per row: [1/|x|, P anchor features, R*M positive random features].
template <class Opt>
struct SlayFeatureMap {
  static constexpr int d = Opt::d, R = Opt::nodes, P = Opt::anchors, M = Opt::prf_features;
  static constexpr int D = R * P * M;
  static constexpr int kScratchPerRow = 1 + P + R * M;
  static constexpr int kAnchors = 0, kOmega = P * d, kNodes = kOmega + R * M * d, kWeights = kNodes + R;

  template <int kThreads>
  static LUNAJIT_DEVICE void apply(const float* x, float* phi, float* scratch, int valid,
                                   const FeatureContext& ctx) {
    const float* p = ctx.params;
    constexpr int S = kScratchPerRow;
    for (int r = threadIdx.x; r < valid; r += kThreads) {
      const float n2 = fm::dot(x + r * d, x + r * d, d);
      scratch[r * S] = n2 > 0.0f ? rsqrtf(n2) : 0.0f;
    }
    __syncthreads();
    const float anc_norm = rsqrtf((float)P), prf_norm = rsqrtf((float)M);
    for (int item = threadIdx.x; item < valid * (P + R * M); item += kThreads) {
      const int r = item / (P + R * M);
      const int k = item - r * (P + R * M);
      const float inv = scratch[r * S];
      float value;
      if (k < P) {
        const float a = inv * fm::dot(p + kAnchors + k * d, x + r * d, d);
        value = anc_norm * a * a;
      } else {
        const int node = (k - P) / M;
        const float s = p[kNodes + node];
        const float w = inv * fm::dot(p + kOmega + (k - P) * d, x + r * d, d);
        value = prf_norm * expf(sqrtf(2.0f * s) * w - s);
      }
      scratch[r * S + 1 + k] = value;
    }
    __syncthreads();
    for (int item = threadIdx.x; item < valid * D; item += kThreads) {
      const int r = item / D;
      const int f = item - r * D;
      const int node = f / (P * M);
      const int a = (f / M) % P;
      const int j = f % M;
      const float* row = scratch + r * S + 1;
      phi[item] = sqrtf(p[kWeights + node]) * row[a] * row[P + node * M + j];
    }
    __syncthreads();
  }
};

}  // namespace lunajit
