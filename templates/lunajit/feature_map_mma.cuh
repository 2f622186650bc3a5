// The feature map on tensor cores for the mma kernels (linear_attention_mma.cuh):
// phi of a tile of rows straight into the padded 16-bit tile the products read
// (row stride PD = D + 8 elements), with no fp32 phi tile in between.
//
// MmaPhi<K>: the constructor loads this lane's fragments of W (hi and lo), W2
// and b2 into registers (the state pass does it once per block; the causal
// walk once per phi tile, since kept next to its master state they would
// spill); W1 and b1 (4 values per lane and k-step) are re-read from L1 once
// per projection and tile, i.e. once per 16 rows x 16 hidden units, where the
// fp32 map reads a parameter per FMA. tile(...) maps one tile. For a feature
// map without a tensor-core form it falls back to FM::apply (fp32, shared
// memory) and rounds phi to T once.
//
// LUNA on tensor cores (bf16 specs; neural variant with shared channels,
// d and Hm multiples of 16, L a multiple of 8; docs/MATH.md "Tensor-core
// feature map"). Per warp and 16-row m-tile:
//   1. the projection U = X W^T (16 x M) on mma: A = X from a padded bf16 copy
//      of the x tile (exact: x is a bf16 tensor) by ldmatrix.x4, B = W^T from
//      registers as W = W_hi + W_lo, both bf16 (W_lo = bf16(W - W_hi)): two mmas
//      per k-step give W to 2^-16 relative (u fp32-like), because the
//      nonlinearity downstream amplifies an error in u by |W1|;
//   2. per projection p: the hidden layer H (16 x Hm), H[r][j] = act(W1_j
//      u[r][p] + b1_j), is built directly in A-fragment registers (lane (g, t)
//      needs u of rows g and g + 8: two shuffles from lane 4g + (p mod 8)/2,
//      which holds them in its C fragment), W1 and b1 in fp32, the
//      activation fused, each element rounded once to bf16;
//   3. psi = H W2^T + b2 (16 x L) on mma, B = W2^T (bf16) from registers, C
//      seeded with b2. Its C fragment (rows g, g + 8; channels 2t, 2t + 1 of
//      each 8-channel n-tile) is exactly the fragment of phi's columns p L + l,
//      so the epilogue (output activation, gate h(x)/sqrt(M)) writes whole
//      bf16x2 words of phi_h, conflict-free (row stride 4 mod 8 words).
// Rounding: x exact; W to 2^-16; H and W2 once each to bf16 (2^-8); every
// product exact in fp32, every sum fp32 in k order; phi once to bf16 (as the
// fp32 path rounds it). fp16 specs keep the fp32 feature map: their parameters
// and hidden activations could leave fp16's range, bf16 has fp32's.
#pragma once

#include "lunajit/feature_maps.cuh"
#include "lunajit/layout.cuh"
#include "lunajit/mma.cuh"

namespace lunajit {

namespace mma_detail {

// Two floats rounded to T, packed (lower index in the low half).
template <class T>
LUNAJIT_DEVICE unsigned pack2(float lo, float hi) {
  if constexpr (mma::IsSame<T, __nv_bfloat16>::value) return mma::pack_bf16x2(lo, hi);
  else return mma::pack_f16x2(lo, hi);
}

// Two adjacent fp32 values of shared memory as one 64-bit load (served per
// half-warp: conflict-free when consecutive threads take consecutive pairs;
// a float2 would do on the device, but the host compiles it as two 32-bit
// loads, which its bank profile counts as 2-way conflicts).
LUNAJIT_DEVICE float2 load_pair(const float* p) {
  const unsigned long long w = *reinterpret_cast<const unsigned long long*>(p);
  return make_float2(__uint_as_float((unsigned)w), __uint_as_float((unsigned)(w >> 32)));
}

// a ~= hi + lo, both bf16x2: hi = bf16(a), lo = bf16(a - hi) (a - hi is exact in fp32).
LUNAJIT_DEVICE void split_bf16x2(float a0, float a1, unsigned& hi, unsigned& lo) {
  hi = mma::pack_bf16x2(a0, a1);
  lo = mma::pack_bf16x2(a0 - mma::bf16x2_lo(hi), a1 - mma::bf16x2_hi(hi));
}

// fp32 rows (rows_alloc, COLS; SS floats apart) -> (rows_alloc, P) in T, two
// elements per 32-bit store; rows >= valid become 0. Exact when the values
// are T values.
template <class T, int NT, int COLS, int P, int SS = COLS>
LUNAJIT_DEVICE void round_rows(const float* src, unsigned* dst, int valid, int rows_alloc) {
  constexpr int kPairs = COLS / 2;
  for (int e = threadIdx.x; e < rows_alloc * kPairs; e += NT) {
    const int r = e / kPairs, f = 2 * (e - r * kPairs);
    unsigned packed = 0u;
    if (r < valid) {
      const float2 v = load_pair(src + r * SS + f);
      packed = pack2<T>(v.x, v.y);
    }
    dst[(r * P + f) / 2] = packed;
  }
}

// fp32 rows (rows_alloc, COLS; SS floats apart) -> bf16 hi and lo tiles
// (rows_alloc, P), x ~= hi + lo to 2^-16 relative (split_bf16x2); rows >=
// valid become 0.
template <int NT, int COLS, int P, int SS = COLS>
LUNAJIT_DEVICE void split_rows(const float* src, unsigned* hi, unsigned* lo, int valid, int rows_alloc) {
  constexpr int kPairs = COLS / 2;
  for (int e = threadIdx.x; e < rows_alloc * kPairs; e += NT) {
    const int r = e / kPairs, f = 2 * (e - r * kPairs);
    unsigned h = 0u, l = 0u;
    if (r < valid) {
      const float2 v = load_pair(src + r * SS + f);
      split_bf16x2(v.x, v.y, h, l);
    }
    hi[(r * P + f) / 2] = h;
    lo[(r * P + f) / 2] = l;
  }
}

}  // namespace mma_detail

// Whether FM has a tensor-core form for I/O type T (the fallback otherwise).
template <class FM, class T>
struct MmaPhiSupport {
  static constexpr bool value = false;
};
template <class Opt>
struct MmaPhiSupport<LunaFeatureMap<Opt>, __nv_bfloat16> {
  static constexpr bool value = Opt::variant == fm::LunaVariant::neural && Opt::shared_channels &&
                                Opt::d % 16 == 0 && Opt::mlp_width % 16 == 0 && Opt::channels % 8 == 0 &&
                                // the bf16 copy of x fits in the fp32 phi tile it replaces
                                mma_row_halves(Opt::d) <= 2 * Opt::projections * Opt::channels;
};

// LUNA's parameters in this lane's fragment positions (g = lane >> 2, t = lane & 3).
template <class Opt>
struct LunaMmaParams {
  using FM = LunaFeatureMap<Opt>;
  static constexpr int d = Opt::d, M = Opt::projections, L = Opt::channels, Hm = Opt::mlp_width;
  static constexpr int KP = d / 16, NP = (M + 7) / 8, KH = Hm / 16, NL = L / 8;
  unsigned w_hi[KP][NP][2], w_lo[KP][NP][2];  // B = W^T: (k = 2t + 8r.., n = g) of each tile
  unsigned w2[KH][NL][2];                      // B = W2^T: (k = hidden unit, n = channel g)
  float b2[NL][2];                             // channels 8 nl + 2t, 2t + 1

  // W^T's B fragments as bf16 hi + lo (also the backward's J^T, feature_map_backward_mma.cuh).
  static LUNAJIT_DEVICE void load_w(const float* p, int lane, unsigned (&hi)[KP][NP][2], unsigned (&lo)[KP][NP][2]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < KP; ++kk)
#pragma unroll
      for (int nt = 0; nt < NP; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = nt * 8 + g, c = kk * 16 + 2 * t + 8 * r;
          const float a0 = i < M ? p[FM::kW + i * d + c] : 0.0f, a1 = i < M ? p[FM::kW + i * d + c + 1] : 0.0f;
          mma_detail::split_bf16x2(a0, a1, hi[kk][nt][r], lo[kk][nt][r]);
        }
  }

  // U = X W^T (16 x 8 NP, C fragments) for the 16 rows from m0 of x_h, a
  // padded 16-bit tile (row stride PX): A by ldmatrix.x4, W = W_hi + W_lo.
  template <class T, int PX>
  static LUNAJIT_DEVICE void project(float (&u)[NP][4], const T* x_h, int m0, int lane,
                                     const unsigned (&hi)[KP][NP][2], const unsigned (&lo)[KP][NP][2]) {
    const int lm = lane >> 3, lr = lane & 7;
#pragma unroll
    for (int nt = 0; nt < NP; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) u[nt][q] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KP; ++kk) {
      unsigned a[4];
      mma::ldmatrix<4, false>(a, x_h + (m0 + 8 * (lm & 1) + lr) * PX + kk * 16 + 8 * (lm >> 1));
#pragma unroll
      for (int nt = 0; nt < NP; ++nt) {
        mma::mma_m16n8k16<T>(u[nt], a, hi[kk][nt], u[nt]);
        mma::mma_m16n8k16<T>(u[nt], a, lo[kk][nt], u[nt]);
      }
    }
  }

  // The hidden layer's values in A-fragment order for k-step kk, fp32: h[2q],
  // h[2q + 1] are register q's two halves, units 16 kk + 2t (+ 1) for q < 2 and
  // + 8 for q >= 2, row g (u = ug) for even q and g + 8 (uh) for odd q. W1 and
  // b1 are read from L1 here (held in registers for the whole tile they would
  // spill the causal kernels). MmaPhi rounds them once, the backward splits them.
  static LUNAJIT_DEVICE void hidden_fragment(const float* p, int kk, int t, float ug, float uh, float (&h)[8]) {
    const int j = kk * 16 + 2 * t;
    const float w1[4] = {p[FM::kW1 + j], p[FM::kW1 + j + 1], p[FM::kW1 + j + 8], p[FM::kW1 + j + 9]};
    const float b1[4] = {p[FM::kB1 + j], p[FM::kB1 + j + 1], p[FM::kB1 + j + 8], p[FM::kB1 + j + 9]};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int c = (q >> 1) * 2;
      const float u = (q & 1) ? uh : ug;
      h[2 * q] = fm::activation<Opt::activation>(fmaf(w1[c], u, b1[c]));
      h[2 * q + 1] = fm::activation<Opt::activation>(fmaf(w1[c + 1], u, b1[c + 1]));
    }
  }

  LUNAJIT_DEVICE void load(const float* p, int lane) {
    const int g = lane >> 2, t = lane & 3;
    load_w(p, lane, w_hi, w_lo);
#pragma unroll
    for (int kk = 0; kk < KH; ++kk) {
#pragma unroll
      for (int nl = 0; nl < NL; ++nl)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int l = nl * 8 + g, j = kk * 16 + 2 * t + 8 * r;
          w2[kk][nl][r] = mma::pack_bf16x2(p[FM::kW2 + l * Hm + j], p[FM::kW2 + l * Hm + j + 1]);
        }
    }
#pragma unroll
    for (int nl = 0; nl < NL; ++nl) {
      b2[nl][0] = p[FM::kB2 + nl * 8 + 2 * t];
      b2[nl][1] = p[FM::kB2 + nl * 8 + 2 * t + 1];
    }
  }
};

template <class K, bool kMma = MmaPhiSupport<typename K::FeatureMap, typename K::T>::value>
struct MmaPhi;

// Fallback: the fp32 feature map in shared memory, rounded to T once.
template <class K>
struct MmaPhi<K, false> {
  static constexpr bool kTensorCores = false;
  LUNAJIT_DEVICE explicit MmaPhi(const float*) {}
  // x (rows_alloc, d) fp32 -> dst (rows_alloc, D + 8) in T; rows >= valid
  // become 0. phi (rows, D) fp32 and scratch are work space. Needs x visible to
  // every thread on entry; dst is this block's after the caller's next barrier.
  template <int NT>
  LUNAJIT_DEVICE void tile(const float* x, float* phi, float* scratch, unsigned* dst, int valid, int rows_alloc,
                           const FeatureContext& ctx) const {
    K::FeatureMap::template apply<NT>(x, phi, scratch, valid, ctx);
    mma_detail::round_rows<typename K::T, NT, K::D, mma_row_halves(K::D)>(phi, dst, valid, rows_alloc);
  }
};

template <class K>
struct MmaPhi<K, true> {
  static constexpr bool kTensorCores = true;
  using FM = typename K::FeatureMap;
  using Opt = typename FM::Options;
  using T = typename K::T;
  using P = LunaMmaParams<Opt>;
  static constexpr int d = P::d, M = P::M, L = P::L, D = K::D;
  static constexpr int PX = mma_row_halves(d), PD = mma_row_halves(D);
  P prm;
  const float* params;

  LUNAJIT_DEVICE explicit MmaPhi(const float* p) : params(p) { prm.load(p, threadIdx.x % 32); }

  template <int NT>
  LUNAJIT_DEVICE void tile(const float* x, float* phi, float* scratch, unsigned* dst, int valid, int rows_alloc,
                           const FeatureContext&) const {
    const float inv_sqrt_m = 1.0f / sqrtf((float)M);
    // The bf16 copy of x (exact) in phi's space; the gate per row when enveloped.
    unsigned* x_words = reinterpret_cast<unsigned*>(phi);
    mma_detail::round_rows<T, NT, d, PX>(x, x_words, valid, rows_alloc);
    if constexpr (Opt::envelope) {
      for (int r = threadIdx.x; r < valid; r += NT)
        scratch[r] = inv_sqrt_m * fm::sigmoid(fm::dot(params + FM::kA, x + r * d, d) + params[FM::kC]);
    }
    __syncthreads();
    const T* x_h = reinterpret_cast<const T*>(phi);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    for (int m0 = warp * 16; m0 < rows_alloc; m0 += NT / 2) {  // NT / 32 warps x 16 rows
      const int r0 = m0 + g, r1 = m0 + g + 8;
      if (m0 >= valid) {  // warp-uniform: rows past the end are zero
#pragma unroll
        for (int f = 2 * t; f < D; f += 8) {
          dst[(r0 * PD + f) / 2] = 0u;
          dst[(r1 * PD + f) / 2] = 0u;
        }
        continue;
      }
      // 1. U = X W^T (W = W_hi + W_lo).
      float u[P::NP][4];
      P::template project<T, PX>(u, x_h, m0, lane, prm.w_hi, prm.w_lo);
      float gate0 = inv_sqrt_m, gate1 = inv_sqrt_m;
      if constexpr (Opt::envelope) {
        gate0 = r0 < valid ? scratch[r0] : 0.0f;
        gate1 = r1 < valid ? scratch[r1] : 0.0f;
      }
#pragma unroll
      for (int p = 0; p < M; ++p) {
        // 2. u of rows g, g + 8 for projection p: lane 4g + (p mod 8)/2 holds them.
        const int src = 4 * g + (p % 8) / 2;
        const float ug = __shfl_sync(0xffffffffu, (p & 1) ? u[p / 8][1] : u[p / 8][0], src);
        const float uh = __shfl_sync(0xffffffffu, (p & 1) ? u[p / 8][3] : u[p / 8][2], src);
        // 3. psi = act(W1 u + b1) W2^T + b2, the hidden layer in A fragments.
        float psi[P::NL][4];
#pragma unroll
        for (int nl = 0; nl < P::NL; ++nl) {
          psi[nl][0] = psi[nl][2] = prm.b2[nl][0];
          psi[nl][1] = psi[nl][3] = prm.b2[nl][1];
        }
#pragma unroll
        for (int kk = 0; kk < P::KH; ++kk) {
          float h[8];
          P::hidden_fragment(params, kk, t, ug, uh, h);
          unsigned a[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) a[q] = mma::pack_bf16x2(h[2 * q], h[2 * q + 1]);
#pragma unroll
          for (int nl = 0; nl < P::NL; ++nl) mma::mma_m16n8k16<T>(psi[nl], a, prm.w2[kk][nl], psi[nl]);
        }
        // Epilogue: phi[r][p L + 8 nl + 2t, +1] = gate_r out_act(psi).
#pragma unroll
        for (int nl = 0; nl < P::NL; ++nl) {
          const int f = p * L + nl * 8 + 2 * t;
          const auto oa = [](float v) { return fm::output_activation<Opt::output_activation>(v); };
          dst[(r0 * PD + f) / 2] = r0 < valid ? mma::pack_bf16x2(gate0 * oa(psi[nl][0]), gate0 * oa(psi[nl][1])) : 0u;
          dst[(r1 * PD + f) / 2] = r1 < valid ? mma::pack_bf16x2(gate1 * oa(psi[nl][2]), gate1 * oa(psi[nl][3])) : 0u;
        }
      }
    }
  }
};

// ------------------------------------------------------------ the backward's map
// The backward kernels need phi to fp32 level (2^-16 relative), as the rest
// of the tensor-core backward, not once-rounded to bf16 (docs/MATH.md
// "Tensor-core feature map in the backward"): the same three steps as
// MmaPhi, with the hidden layer and W2 each split into bf16 hi + lo and psi =
// H_hi W2_hi + H_hi W2_lo + H_lo W2_hi + b2 (the lo x lo term is below 2^-16
// relative); u = X W^T as the forward (x exact, W = W_hi + W_lo). Every product
// is exact in fp32, every sum fp32 in k order.
//
// store(r, f, v0, v1) receives phi[r][f], phi[r][f + 1] (f even) of every row
// r < rows_alloc, 0 past valid; scratch[r] = the gate h(x) / sqrt(M) of rows
// r < valid (as FM::apply, which the backward's J^T reads). x_words: the bf16
// copy of x, (rows_alloc, d + 8) halves, must not overlap x, scratch or what
// store writes. Needs x visible to every thread on entry; what store wrote is
// the block's after the caller's next barrier.
template <class K, int NT, class Store>
LUNAJIT_DEVICE void mma_phi_split_tile(const float* params, const float* x, unsigned* x_words, float* scratch,
                                       int valid, int rows_alloc, Store&& store) {
  using FM = typename K::FeatureMap;
  using Opt = typename FM::Options;
  using T = typename K::T;
  using P = LunaMmaParams<Opt>;
  static_assert(MmaPhiSupport<FM, T>::value, "mma_phi_split_tile: LUNA's neural map with bf16 I/O (MmaPhiSupport)");
  constexpr int d = P::d, M = P::M, L = P::L, Hm = P::Hm, PX = mma_row_halves(d);
  const float inv_sqrt_m = 1.0f / sqrtf((float)M);
  mma_detail::round_rows<T, NT, d, PX>(x, x_words, valid, rows_alloc);
  for (int r = threadIdx.x; r < valid; r += NT) {
    float gate = inv_sqrt_m;
    if constexpr (Opt::envelope) gate *= fm::sigmoid(fm::dot(params + FM::kA, x + r * d, d) + params[FM::kC]);
    scratch[r] = gate;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  // b2 in this lane's fragment positions; W^T's per item and W2^T's per use, below.
  float b2[P::NL][2];
#pragma unroll
  for (int nl = 0; nl < P::NL; ++nl) {
    b2[nl][0] = params[FM::kB2 + nl * 8 + 2 * t];
    b2[nl][1] = params[FM::kB2 + nl * 8 + 2 * t + 1];
  }
  __syncthreads();  // x_words, scratch
  const T* x_h = reinterpret_cast<const T*>(x_words);
  // Work items (16-row m-tile, projection group): with fewer m-tiles than
  // warps (the causal backward's 16-token chunks) the warps share a tile's
  // projections (each recomputes the tile's u, 2 KP NP mmas), so none idles.
  constexpr int NW = NT / 32;
  const int mtiles = rows_alloc / 16;
  const int groups = mtiles >= NW ? 1 : min(M, NW / mtiles);
  for (int item = warp; item < mtiles * groups; item += NW) {  // warp-uniform
    const int m0 = (item / groups) * 16, group = item % groups;
    const int r0 = m0 + g, r1 = m0 + g + 8;
    if (m0 >= valid) {  // rows past the end are zero
      for (int p = group; p < M; p += groups)
#pragma unroll
        for (int f = 2 * t; f < L; f += 8) {
          store(r0, p * L + f, 0.0f, 0.0f);
          store(r1, p * L + f, 0.0f, 0.0f);
        }
      continue;
    }
    float u[P::NP][4];
    {
      // W^T hi + lo (as the forward), loaded per item (one per warp in the
      // default tiles) so that their registers are free during the walk below.
      unsigned w_hi[P::KP][P::NP][2], w_lo[P::KP][P::NP][2];
      P::load_w(params, lane, w_hi, w_lo);
      P::template project<T, PX>(u, x_h, m0, lane, w_hi, w_lo);
    }
    const float gate0 = r0 < valid ? scratch[r0] : 0.0f, gate1 = r1 < valid ? scratch[r1] : 0.0f;
    // Not unrolled over the projections (unlike MmaPhi): unrolled, ptxas hoists
    // W1 and b1 of every step out of the loop and the causal dkv kernel spills
    // at sm_90's 128-register cap (two blocks per SM).
#pragma unroll 1
    for (int p = group; p < M; p += groups) {
      float up0 = 0.0f, up1 = 0.0f;  // this lane's u of projection 8 (p / 8) + 2t + (p & 1): a register select
#pragma unroll
      for (int nt = 0; nt < P::NP; ++nt)
        if (nt == p / 8) {
          up0 = (p & 1) ? u[nt][1] : u[nt][0];
          up1 = (p & 1) ? u[nt][3] : u[nt][2];
        }
      const int src = 4 * g + (p % 8) / 2;  // holds u of rows g, g + 8 for projection p
      const float ug = __shfl_sync(0xffffffffu, up0, src);
      const float uh = __shfl_sync(0xffffffffu, up1, src);
      float psi[P::NL][4];
#pragma unroll
      for (int nl = 0; nl < P::NL; ++nl) {
        psi[nl][0] = psi[nl][2] = b2[nl][0];
        psi[nl][1] = psi[nl][3] = b2[nl][1];
      }
      // Nor over the hidden layer's k-steps (nothing in registers is indexed
      // by kk): unrolled, ptxas keeps every step's H fragments live at once.
#pragma unroll 1
      for (int kk = 0; kk < P::KH; ++kk) {
        const int j = kk * 16 + 2 * t;
        float h[8];
        P::hidden_fragment(params, kk, t, ug, uh, h);
        unsigned ahi[4], alo[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) mma_detail::split_bf16x2(h[2 * q], h[2 * q + 1], ahi[q], alo[q]);
#pragma unroll
        for (int nl = 0; nl < P::NL; ++nl) {
          // W2^T's B fragment (k = hidden unit j, j + 1 and j + 8, j + 9; n = channel g) as
          // hi + lo, re-read from L1 per projection like W1 and b1: held in registers
          // through the walk they spill the causal state kernel on sm_80 (128-register cap).
          const float* w2 = params + FM::kW2 + (nl * 8 + g) * Hm + j;
          unsigned bhi[2], blo[2];
          mma_detail::split_bf16x2(w2[0], w2[1], bhi[0], blo[0]);
          mma_detail::split_bf16x2(w2[8], w2[9], bhi[1], blo[1]);
          mma::mma_m16n8k16<T>(psi[nl], ahi, bhi, psi[nl]);
          mma::mma_m16n8k16<T>(psi[nl], ahi, blo, psi[nl]);
          mma::mma_m16n8k16<T>(psi[nl], alo, bhi, psi[nl]);
        }
      }
      // phi[r][p L + 8 nl + 2t, +1] = gate_r out_act(psi) (FM::apply's order: activation, then gate).
#pragma unroll
      for (int nl = 0; nl < P::NL; ++nl) {
        const int f = p * L + nl * 8 + 2 * t;
        const auto oa = [](float v) { return fm::output_activation<Opt::output_activation>(v); };
        if (r0 < valid) store(r0, f, gate0 * oa(psi[nl][0]), gate0 * oa(psi[nl][1]));
        else store(r0, f, 0.0f, 0.0f);
        if (r1 < valid) store(r1, f, gate1 * oa(psi[nl][2]), gate1 * oa(psi[nl][3]));
        else store(r1, f, 0.0f, 0.0f);
      }
    }
  }
}

namespace mma_detail {
// Two fp32 values to adjacent shared words as one 64-bit store (see load_pair).
LUNAJIT_DEVICE void store_pair(float* p, float v0, float v1) {
  *reinterpret_cast<unsigned long long*>(p) =
      (unsigned long long)__float_as_uint(v0) | ((unsigned long long)__float_as_uint(v1) << 32);
}
}  // namespace mma_detail

// The row stride (floats) of the tensor-core backward's fp32 phi and dphi
// tiles (BackwardDims::phi_stride): D + 8 where backward_phi_tile makes phi on
// tensor cores, else D (FM::apply and the fp32 Jacobian-transposes index
// their rows D apart). Padded because the tiles are written in C-fragment
// order, 64-bit pairs (row g, columns 2t, 2t + 1) per lane: D apart (D a
// multiple of 32) the 8 rows of a half-warp's pairs fall on the same 8 banks,
// 8 wavefronts where 2 do; D + 8 apart they cover all 32 banks. The host
// mirror is backward_phi_stride in codegen/launch_plan.cpp.
template <class K>
LUNAJIT_HOST_DEVICE constexpr int backward_phi_stride() {
  return MmaPhiSupport<typename K::FeatureMap, typename K::T>::value ? K::D + 8 : K::D;
}

// The backward kernels' fp32 phi tile (rows < valid of phi, (rows, D), rows
// PS floats apart) and the gate in scratch: on tensor cores to fp32 level where
// MmaPhiSupport holds (x_words: the bf16 copy of x, rows_alloc x (d + 8)
// halves, disjoint from x, phi and scratch), else FM::apply (PS = D). Ends with
// a barrier, as FM::apply.
template <class K, int NT, int PS = K::D>
LUNAJIT_DEVICE void backward_phi_tile(const float* x, float* phi, float* scratch, unsigned* x_words, int valid,
                                      int rows_alloc, const FeatureContext& ctx) {
  if constexpr (MmaPhiSupport<typename K::FeatureMap, typename K::T>::value) {
    static_assert(PS >= K::D && PS % 2 == 0, "phi rows hold D floats, 64-bit aligned");
    mma_phi_split_tile<K, NT>(ctx.params, x, x_words, scratch, valid, rows_alloc, [&](int r, int f, float v0, float v1) {
      if (r < valid) mma_detail::store_pair(phi + r * PS + f, v0, v1);
    });
    __syncthreads();
  } else {
    static_assert(PS == K::D, "FM::apply writes phi rows D apart");
    (void)x_words;
    (void)rows_alloc;
    K::FeatureMap::template apply<NT>(x, phi, scratch, valid, ctx);
  }
}

// Whether the backward maps phi on tensor cores (backward_phi_tile): the
// x_words it needs, in floats, else 0.
template <class K>
LUNAJIT_HOST_DEVICE constexpr int backward_phi_x_floats(int rows) {
  if constexpr (MmaPhiSupport<typename K::FeatureMap, typename K::T>::value)
    return (rows * mma_row_halves(K::FeatureMap::d) + 1) / 2;
  else
    return 0;
}

}  // namespace lunajit
