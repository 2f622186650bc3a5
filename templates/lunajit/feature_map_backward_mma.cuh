// LUNA's Jacobian-transpose on tensor cores, for the tensor-core backward's dq
// and dkv kernels (linear_attention_backward_mma.cuh; docs/MATH.md
// "Tensor-core J^T"). Same interface as FeatureMapBackward<FM>::backward plus
// `stage`, the luna_jt_stage_floats of shared memory (layout.cuh); a feature
// map without a tensor-core J^T runs FeatureMapBackward's fp32 code.
//
// LUNA neural, shared channels, bf16 specs, d and Hm multiples of 16, L of 8.
// Per (row r, projection i) item, with a = W1 u + b1, h = act(a), pre = h W2^T + b2:
//   u = X W^T                                  mma m16n8k16: x's bf16 copy (exact) by
//                                              ldmatrix, W = W_hi + W_lo from registers
//                                              (as the forward's tensor-core map)
//   dpre = dphi * gate * out_act'(pre)         fp32, all threads; out_act'(pre) from phi
//                                              itself: relu phi > 0, softplus
//                                              1 - exp(-phi / gate), none 1 (exact
//                                              identities; no MLP recomputation)
//   db2 += colsum(dpre)                        fp32, one owner thread per channel
//   dh = dpre W2 (16 items x Hm)               mma m16n8k8: A = dpre (hi + lo tiles,
//                                              ldmatrix), B = W2 hi + lo from registers
//   da = dh * act'(a), du = da . W1            fp32 on the dh C fragments (a recomputed
//   dW1 += da u, db1 += da                     by one FMA); per-lane fp32 partials
//   dW2^T += H^T dpre (Hm x L, K = 16 items)   mma m16n8k16: H (hi + lo) staged per warp,
//                                              A = H^T by ldmatrix.trans, B = dpre by
//                                              ldmatrix.trans
// then dx, dW and the envelope as the fp32 code (projection_gradients). Each
// product sums the significant terms of the bf16 hi + lo split (hi hi, hi lo,
// lo hi; u has two, x being exact), so every product is good to about 2^-16
// relative, as the rest of the tensor-core backward. Items: (16-row m-tile,
// projection) pairs, m-tile major, warp w taking items w, w + NW, ...; the
// per-lane partials are reduced over the lanes by a fixed shuffle tree and
// over the warps in warp order into dparams: bitwise deterministic.
#pragma once

#include "lunajit/feature_map_backward.cuh"
#include "lunajit/feature_map_mma.cuh"
#include "lunajit/layout.cuh"
#include "lunajit/mma.cuh"

namespace lunajit {

// Whether FM has a tensor-core J^T for I/O type T.
template <class FM, class T>
struct MmaJacobianSupport {
  static constexpr bool value = false;
};
template <class Opt>
struct MmaJacobianSupport<LunaFeatureMap<Opt>, __nv_bfloat16> {
  static constexpr bool value = Opt::variant == fm::LunaVariant::neural && Opt::shared_channels &&
                                Opt::d % 16 == 0 && Opt::mlp_width % 16 == 0 && Opt::channels % 8 == 0;
};

// TK: the token tile (K::block_tokens, or K::chunk in the causal backward).
template <class K, int TK, bool kMma = MmaJacobianSupport<typename K::FeatureMap, typename K::T>::value>
struct MmaFeatureBackward {
  static constexpr bool kTensorCores = false;
  static constexpr int kStageFloats = 0;
  // The fp32 Jacobian-transposes index phi and dphi rows D apart.
  static_assert(backward_phi_stride<K>() == K::D, "a padded phi tile takes the tensor-core J^T");
  template <int NT>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext& ctx, const float* scratch, float* bs, float* dx,
                                      float* dparams, float*) {
    FeatureMapBackward<typename K::FeatureMap>::template backward<NT>(x, phi, dphi, valid, ctx, scratch, bs, dx,
                                                                      dparams);
  }
};

template <class K, int TK>
struct MmaFeatureBackward<K, TK, true> {
  using FM = typename K::FeatureMap;
  using FB = FeatureMapBackward<FM>;
  using Opt = typename FM::Options;
  using T = typename K::T;
  static constexpr bool kTensorCores = true;
  static constexpr int d = FM::d, M = FM::M, L = FM::L, Hm = FM::Hm, D = FM::D;
  static constexpr int PS = backward_phi_stride<K>();  // phi and dphi rows, floats
  static constexpr int NW = K::threads / 32, Tk = TK;
  static constexpr int PD = mma_row_halves(D), PH = mma_row_halves(Hm), PX = mma_row_halves(d);
  static constexpr int NL = L / 8, KH = Hm / 16, NJ = Hm / 8, KP = d / 16, NP = (M + 7) / 8;
  static constexpr int S = FB::kScratchPerRow;  // [denv, u_0..u_{M-1}, du_0..du_{M-1}]
  static constexpr int kDpreFloats = align4((Tk * PD + 1) / 2);
  // dW2^T's staged rows: Hm + 4 words apart, so that a fragment store's 32 lanes
  // (rows l = 2t (+1), columns j = g) hit 32 banks (8t + g) where Hm apart put
  // the 4 t of a g on one bank (4-way conflicts, every tile of the J^T).
  static constexpr int W2S = luna_jt_w2_stride(Hm);
  static constexpr int kWarpFloats = align4(16 * PH > 2 * Hm + L * W2S ? 16 * PH : 2 * Hm + L * W2S);
  static constexpr int kXFloats = align4((Tk * PX + 1) / 2);
  static constexpr int kStageFloats = luna_jt_stage_floats(Tk, d, D, Hm, L, NW);
  static_assert(kStageFloats == 2 * kDpreFloats + (NW * kWarpFloats > kXFloats ? NW * kWarpFloats : kXFloats),
                "luna_jt_stage_floats");
  static_assert(Tk % 16 == 0, "the tensor-core J^T walks 16-row m-tiles");

  template <int NT>
  static LUNAJIT_DEVICE void backward(const float* x, const float* phi, float* dphi, int valid,
                                      const FeatureContext& ctx, const float* scratch, float* bs, float* dx,
                                      float* dparams, float* stage) {
    static_assert(NT == K::threads, "one block of K::threads");
    const float* p = ctx.params;
    // Envelope (as the fp32 code): d(a.x + c) = (1 - g) sum_f dphi phi, before dphi turns into dpre.
    if constexpr (Opt::envelope) {
      const float inv_sqrt_m = 1.0f / sqrtf((float)M);
      for (int r = threadIdx.x; r < valid; r += NT) {
        const float g = scratch[r] / inv_sqrt_m;
        bs[r * S] = (1.0f - g) * fm::dot(dphi + r * PS, phi + r * PS, D);
      }
    }
    // x as bf16 (exact: the rows of a bf16 tensor) in the warps' region, free until the walk.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3, lm = lane >> 3, lr = lane & 7;
    mma_detail::round_rows<T, NT, d, PX>(x, reinterpret_cast<unsigned*>(stage + 2 * kDpreFloats), valid, Tk);
    __syncthreads();  // the x tile; the envelope's dot reads dphi
    // u = X W^T on mma, W = W_hi + W_lo (as the forward's tensor-core map), into bs.
    {
      using LP = LunaMmaParams<Opt>;
      unsigned w_hi[KP][NP][2], w_lo[KP][NP][2];
      LP::load_w(p, lane, w_hi, w_lo);
      const T* x_h = reinterpret_cast<const T*>(stage + 2 * kDpreFloats);
      for (int m0 = warp * 16; m0 < valid; m0 += NW * 16) {  // warp-uniform
        float u[NP][4];
        LP::template project<T, PX>(u, x_h, m0, lane, w_hi, w_lo);
#pragma unroll
        for (int nt = 0; nt < NP; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int r = m0 + g + 8 * (q >> 1), i = 8 * nt + 2 * t + (q & 1);
            if (r < valid && i < M) bs[r * S + 1 + i] = u[nt][q];
          }
      }
    }
    // dpre = dphi * (gate * out_act'(pre)) in place.
    for (int e = threadIdx.x; e < valid * D; e += NT) {
      const int r = e / D, at = r * PS + (e - r * D);
      const float gate = scratch[r], y = phi[at];
      float deriv = 1.0f;
      if constexpr (Opt::output_activation == fm::OutAct::relu) deriv = y > 0.0f ? 1.0f : 0.0f;
      else if constexpr (Opt::output_activation == fm::OutAct::softplus)
        deriv = gate > 0.0f ? -expm1f(-y / gate) : 0.0f;  // sigmoid(pre) = 1 - exp(-softplus(pre))
      dphi[at] *= gate * deriv;
    }
    __syncthreads();
    unsigned* dpre_h = reinterpret_cast<unsigned*>(stage);
    unsigned* dpre_lo = reinterpret_cast<unsigned*>(stage + kDpreFloats);
    mma_detail::split_rows<NT, D, PD, PS>(dphi, dpre_h, dpre_lo, valid, Tk);
    if constexpr (32 % L == 0 && D % 32 == 0) {
      // db2_l = sum over rows and projections of dpre[r][i L + l]: warp 0 reads
      // whole 32-float runs of a row (one wavefront each; lane f holds channel
      // f mod L), then a fixed xor tree sums the lanes of a channel. The 8
      // threads that walked rows x projections in series took valid M loads
      // each, one wavefront per 8 floats.
      if (warp == 0) {
        float s = 0.0f;
        for (int r = 0; r < valid; ++r)
#pragma unroll
          for (int f = lane; f < D; f += 32) s += dphi[r * PS + f];
#pragma unroll
        for (int o = L; o < 32; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane < L) dparams[FM::kB2 + lane] += s;
      }
    } else {
      for (int l = threadIdx.x; l < L; l += NT) {  // db2, rows then projections in order
        float s = dparams[FM::kB2 + l];
        for (int r = 0; r < valid; ++r)
          for (int i = 0; i < M; ++i) s += dphi[r * PS + i * L + l];
        dparams[FM::kB2 + l] = s;
      }
    }
    __syncthreads();  // u, dpre's tiles; the walk's hidden tiles overwrite the x tile

    // B = W2 (k = channel l, n = hidden j) of m16n8k8, hi + lo: (k 2t, 2t + 1; n g) of tile (nl, nj).
    unsigned w2_hi[NL][NJ], w2_lo[NL][NJ];
#pragma unroll
    for (int nl = 0; nl < NL; ++nl)
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj) {
        const int l = 8 * nl + 2 * t, j = 8 * nj + g;
        mma_detail::split_bf16x2(p[FM::kW2 + l * Hm + j], p[FM::kW2 + (l + 1) * Hm + j], w2_hi[nl][nj],
                                 w2_lo[nl][nj]);
      }
    float dw1[NJ][2], db1[NJ][2];  // hidden units 8 nj + 2t + c, this lane's rows
    float dw2[KH][NL][4];          // dW2^T C fragments: rows j = 16 kk + g (+ 8), columns l = 8 nl + 2t (+ 1)
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj) dw1[nj][0] = dw1[nj][1] = db1[nj][0] = db1[nj][1] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KH; ++kk)
#pragma unroll
      for (int nl = 0; nl < NL; ++nl)
#pragma unroll
        for (int q = 0; q < 4; ++q) dw2[kk][nl][q] = 0.0f;
    float* wstage = stage + 2 * kDpreFloats + warp * kWarpFloats;
    unsigned* h_hi = reinterpret_cast<unsigned*>(wstage);  // (16, PH) bf16
    unsigned* h_lo = h_hi + 16 * PH / 2;
    const T* dpre_hh = reinterpret_cast<const T*>(dpre_h);
    const T* dpre_lh = reinterpret_cast<const T*>(dpre_lo);
    // (m-tile, projection) items, item = warp, warp + NW, ...: every warp
    // takes a share even when the tile has one m-tile (the causal walks'
    // 16-token chunks), where warp-owned m-tiles left all warps but one idle.
    const int items = (valid + 15) / 16 * M;
    for (int item = warp; item < items; item += NW) {  // warp-uniform
      const int m0 = item / M * 16, i = item - item / M * M;
      const int r0 = m0 + g, r1 = m0 + g + 8;
      const bool v0 = r0 < valid, v1 = r1 < valid;
      {
        // Past the last row: u = 0 and dpre = 0 (the tiles' zero rows), so nothing accumulates.
        const float ug = v0 ? bs[r0 * S + 1 + i] : 0.0f, uh = v1 ? bs[r1 * S + 1 + i] : 0.0f;
        // dpre fragments: A of m16n8k8 (hi: regs 0, 1; lo: 2, 3) and B of m16n8k16 (k = rows).
        const T* arow = ((lm >> 1) ? dpre_lh : dpre_hh) + (m0 + 8 * (lm & 1) + lr) * PD + i * L;
        unsigned ad[NL][4], bd[NL][4];
#pragma unroll
        for (int nl = 0; nl < NL; ++nl) {
          mma::ldmatrix<4, false>(ad[nl], arow + 8 * nl);
          mma::ldmatrix<4, true>(bd[nl], arow + 8 * nl);
        }
        // Per 8 hidden units (one n-tile of dh at a time, to keep few registers live):
        // dh = dpre W2, then da = dh act'(a) on its C fragment (rows g, g + 8; units
        // 8 nj + 2t + c), du, dW1, db1, and h staged.
        float du0 = 0.0f, du1 = 0.0f;
#pragma unroll
        for (int nj = 0; nj < NJ; ++nj) {
          float dh[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int nl = 0; nl < NL; ++nl) {
            const unsigned ahi[2] = {ad[nl][0], ad[nl][1]}, alo[2] = {ad[nl][2], ad[nl][3]};
            const unsigned bhi[1] = {w2_hi[nl][nj]}, blo[1] = {w2_lo[nl][nj]};
            mma::mma_m16n8k8<T>(dh, ahi, bhi, dh);
            mma::mma_m16n8k8<T>(dh, ahi, blo, dh);
            mma::mma_m16n8k8<T>(dh, alo, bhi, dh);
          }
          const int j = 8 * nj + 2 * t;
          const float w1[2] = {p[FM::kW1 + j], p[FM::kW1 + j + 1]}, b1[2] = {p[FM::kB1 + j], p[FM::kB1 + j + 1]};
          float h[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int c = q & 1;
            const float u = q < 2 ? ug : uh;
            const float a = fmaf(w1[c], u, b1[c]);
            h[q] = fm::activation<Opt::activation>(a);
            const float da = dh[q] * fm::activation_grad<Opt::activation>(a);
            if (q < 2) du0 = fmaf(da, w1[c], du0);
            else du1 = fmaf(da, w1[c], du1);
            dw1[nj][c] = fmaf(da, u, dw1[nj][c]);
            db1[nj][c] += da;
          }
          // Word (g * PH + j) / 2 as a lane base plus a constant (PH and j are
          // even): the constant folds into the store's offset instead of
          // costing a register per n-tile where the caller loops (the causal walks).
          const int hw = g * (PH / 2) + t + 4 * nj;
          mma_detail::split_bf16x2(h[0], h[1], h_hi[hw], h_lo[hw]);
          mma_detail::split_bf16x2(h[2], h[3], h_hi[hw + 4 * PH], h_lo[hw + 4 * PH]);
        }
        du0 += __shfl_xor_sync(0xffffffffu, du0, 1);
        du0 += __shfl_xor_sync(0xffffffffu, du0, 2);
        du1 += __shfl_xor_sync(0xffffffffu, du1, 1);
        du1 += __shfl_xor_sync(0xffffffffu, du1, 2);
        if (t == 0 && v0) bs[r0 * S + 1 + M + i] = du0;
        if (t == 0 && v1) bs[r1 * S + 1 + M + i] = du1;
        __syncwarp();
        // dW2^T += H^T dpre: A = H^T (matrix m: units 16 kk + 8 (m & 1), rows 8 (m >> 1)) by .trans.
        const T* hh = reinterpret_cast<const T*>(h_hi) + (8 * (lm >> 1) + lr) * PH + 8 * (lm & 1);
        const T* hl = reinterpret_cast<const T*>(h_lo) + (8 * (lm >> 1) + lr) * PH + 8 * (lm & 1);
#pragma unroll
        for (int kk = 0; kk < KH; ++kk) {
          unsigned ah[4], al[4];
          mma::ldmatrix<4, true>(ah, hh + 16 * kk);
          mma::ldmatrix<4, true>(al, hl + 16 * kk);
#pragma unroll
          for (int nl = 0; nl < NL; ++nl) {
            const unsigned bhi[2] = {bd[nl][0], bd[nl][1]}, blo[2] = {bd[nl][2], bd[nl][3]};
            mma::mma_m16n8k16<T>(dw2[kk][nl], ah, bhi, dw2[kk][nl]);
            mma::mma_m16n8k16<T>(dw2[kk][nl], ah, blo, dw2[kk][nl]);
            mma::mma_m16n8k16<T>(dw2[kk][nl], al, bhi, dw2[kk][nl]);
          }
        }
        __syncwarp();  // the next projection overwrites the hidden tiles
      }
    }
    // Per-lane dW1, db1 over the lanes of one t (g = 0..7), then per warp into
    // its stage ([dW1 | db1 | dW2 (l Hm + j)]), then over the warps in order.
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
          dw1[nj][c] += __shfl_xor_sync(0xffffffffu, dw1[nj][c], o);
          db1[nj][c] += __shfl_xor_sync(0xffffffffu, db1[nj][c], o);
        }
    // Every lane of a t holds the sums now; lane (g, t) writes n-tiles nj = g
    // (mod 8): one 64-bit store per 8 n-tiles instead of one per n-tile from
    // the 4 lanes of g = 0. A warp without items holds zeros and writes
    // nothing; the warp sum below reads the warps that had items.
    float* part = wstage;
    if (warp < items) {
#pragma unroll
      for (int nj0 = 0; nj0 < NJ; nj0 += 8) {
        float w0 = 0.0f, w1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
#pragma unroll
        for (int k = 0; k < 8 && nj0 + k < NJ; ++k)
          if (g == k) {
            w0 = dw1[nj0 + k][0];
            w1 = dw1[nj0 + k][1];
            b0 = db1[nj0 + k][0];
            b1 = db1[nj0 + k][1];
          }
        if (nj0 + g < NJ) {
          mma_detail::store_pair(part + 8 * (nj0 + g) + 2 * t, w0, w1);
          mma_detail::store_pair(part + Hm + 8 * (nj0 + g) + 2 * t, b0, b1);
        }
      }
#pragma unroll
    for (int kk = 0; kk < KH; ++kk)
#pragma unroll
      for (int nl = 0; nl < NL; ++nl)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int j = 16 * kk + g + 8 * (q >> 1), l = 8 * nl + 2 * t + (q & 1);
          part[2 * Hm + l * W2S + j] = dw2[kk][nl][q];
        }
    }
    __syncthreads();
    const int with_items = items < NW ? items : NW;
    for (int e = threadIdx.x; e < 2 * Hm + L * Hm; e += NT) {
      float s = 0.0f;
      const int at = e < 2 * Hm ? e : 2 * Hm + (e - 2 * Hm) / Hm * W2S + (e - 2 * Hm) % Hm;
      for (int w = 0; w < with_items; ++w) s += stage[2 * kDpreFloats + w * kWarpFloats + at];
      const int dst = e < Hm ? FM::kW1 + e : e < 2 * Hm ? FM::kB1 + (e - Hm) : FM::kW2 + (e - 2 * Hm);
      dparams[dst] += s;
    }
    __syncthreads();  // the warps' partials are read: x's bf16 copy may take their region again
    projection_gradients<NT>(x, valid, p, bs, dx, dparams, stage + 2 * kDpreFloats);
    __syncthreads();
  }

  // dx = dU W (+ the envelope's denv a) and dW += dU^T X on tensor cores (the
  // fp32 code: FeatureMapBackward::projection_gradients, 4 d M FMAs a row with
  // two L1/shared operands each). dU (bs's du columns) is split into bf16 hi +
  // lo, W too; x's bf16 copy is exact:
  //   dx:  m16n8k8, A = dU (16 rows x 8 projections, from bs), B = W (8
  //        projections x 8 columns, from L1), three split terms; per (m-tile,
  //        slot) unit, the slot's 8-column n-tiles with one A;
  //   dW^T = X^T dU: m16n8k16, A = X^T by ldmatrix.trans of x's copy, B = dU
  //        (16 rows x 8 projections), two terms (x exact); per (16-column
  //        m-tile, 8-projection n-tile) item, over the rows in order; each
  //        entry of dW has one owner lane, which adds it to dparams.
  // The envelope's (a, c) gradient stays fp32 (d + 1 dot products a tile).
  template <int NT>
  static LUNAJIT_DEVICE void projection_gradients(const float* x, int valid, const float* p, const float* bs,
                                                  float* dx, float* dparams, float* x_stage) {
    constexpr int KM = (M + 7) / 8, NTD = d / 8, MTD = d / 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3, lm = lane >> 3, lr = lane & 7;
    unsigned* x_words = reinterpret_cast<unsigned*>(x_stage);
    mma_detail::round_rows<T, NT, d, PX>(x, x_words, valid, Tk);
    __syncthreads();
    const int mtiles = (valid + 15) / 16;
    const auto du = [&](int r, int i) { return r < valid && i < M ? bs[r * S + 1 + M + i] : 0.0f; };
    // Units (m-tile, slot), slot < SL = min(NW, NTD): a unit's warp splits dU's
    // A fragments once and runs the n-tiles slot, slot + SL, ... with them (the
    // fragment loads are 4-way: bs's rows are 2M + 1 floats apart), where one
    // (m-tile, n-tile) item per warp re-read them for every n-tile. Each dx
    // entry's sum is the same three products in the same k order.
    constexpr int SL = NW < NTD ? NW : NTD;
    for (int unit = warp; unit < mtiles * SL; unit += NW) {  // warp-uniform
      const int m0 = (unit / SL) * 16, slot = unit % SL;
      const int r0 = m0 + g, r1 = m0 + g + 8;
      unsigned ahi[KM][2], alo[KM][2];
#pragma unroll
      for (int kk = 0; kk < KM; ++kk) {
        const int i = kk * 8 + 2 * t;
        mma_detail::split_bf16x2(du(r0, i), du(r0, i + 1), ahi[kk][0], alo[kk][0]);
        mma_detail::split_bf16x2(du(r1, i), du(r1, i + 1), ahi[kk][1], alo[kk][1]);
      }
      for (int nt = slot; nt < NTD; nt += SL) {
        const int c0 = nt * 8;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kk = 0; kk < KM; ++kk) {
          const int i = kk * 8 + 2 * t;
          unsigned bhi[1], blo[1];
          const int c = c0 + g;
          mma_detail::split_bf16x2(i < M ? p[FM::kW + i * d + c] : 0.0f,
                                   i + 1 < M ? p[FM::kW + (i + 1) * d + c] : 0.0f, bhi[0], blo[0]);
          mma::mma_m16n8k8<T>(acc, ahi[kk], bhi, acc);
          mma::mma_m16n8k8<T>(acc, ahi[kk], blo, acc);
          mma::mma_m16n8k8<T>(acc, alo[kk], bhi, acc);
        }
        // Rows g, g + 8, columns c0 + 2t, + 1: one 64-bit store each (a fragment's 8
        // rows share banks at the d-float stride: 4 wavefronts per half-warp).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = h == 0 ? r0 : r1, c = c0 + 2 * t;
          if (r >= valid) continue;
          float v0 = acc[2 * h], v1 = acc[2 * h + 1];
          if constexpr (Opt::envelope) {
            v0 = fmaf(bs[r * S], p[FM::kA + c], v0);
            v1 = fmaf(bs[r * S], p[FM::kA + c + 1], v1);
          }
          mma_detail::store_pair(dx + r * d + c, v0, v1);
        }
      }
    }
    const T* x_h = reinterpret_cast<const T*>(x_stage);
    for (int item = warp; item < MTD * KM; item += NW) {  // warp-uniform
      const int c0 = (item / KM) * 16, i0 = (item % KM) * 8;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int m0 = 0; m0 < mtiles * 16; m0 += 16) {
        // A = X^T (matrix m: columns c0 + 8 (m & 1), rows m0 + 8 (m >> 1)) by .trans.
        unsigned a[4];
        mma::ldmatrix<4, true>(a, x_h + (m0 + 8 * (lm >> 1) + lr) * PX + c0 + 8 * (lm & 1));
        unsigned bhi[2], blo[2];
        mma_detail::split_bf16x2(du(m0 + 2 * t, i0 + g), du(m0 + 2 * t + 1, i0 + g), bhi[0], blo[0]);
        mma_detail::split_bf16x2(du(m0 + 2 * t + 8, i0 + g), du(m0 + 2 * t + 9, i0 + g), bhi[1], blo[1]);
        mma::mma_m16n8k16<T>(acc, a, bhi, acc);
        mma::mma_m16n8k16<T>(acc, a, blo, acc);
      }
      // C = dW^T: rows c0 + g (+ 8), columns (projections) i0 + 2t (+ 1).
      // dparams holds W row-major (d floats a projection, d % 16 == 0), so the
      // bank is c's: in step qq the odd t take the other row half (q = qq ^ 2),
      // and a g's 4 lanes meet 2 to a bank instead of 4. Each entry still has
      // one owner lane: the sums are the same.
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const int q = (t & 1) ? (qq ^ 2) : qq;
        const float v = (t & 1) ? acc[qq ^ 2] : acc[qq];
        const int c = c0 + g + 8 * (q >> 1), i = i0 + 2 * t + (q & 1);
        if (i < M) dparams[FM::kW + i * d + c] += v;
      }
    }
    if constexpr (Opt::envelope) {
      for (int c = threadIdx.x; c <= d; c += NT) {
        float s = dparams[FM::kA + c];  // c == d is the bias kC = kA + d
        for (int r = 0; r < valid; ++r) s = c < d ? fmaf(bs[r * S], x[r * d + c], s) : s + bs[r * S];
        dparams[FM::kA + c] = s;
      }
    }
  }
};

}  // namespace lunajit
