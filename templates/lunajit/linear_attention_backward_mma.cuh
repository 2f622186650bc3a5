// Non-causal backward on tensor cores (TileConfig `mma`, bf16 and fp16 specs;
// docs/MATH.md "Tensor-core backward"): the four GEMM-shaped products of the
// non-causal backward run as mma.sync m16n8k16 with bf16 operands and fp32
// accumulators, whatever the I/O dtype; the feature map stays the fp32 code of feature_maps.cuh, and
// its Jacobian-transpose (with the parameter gradients) runs on tensor cores
// for LUNA's neural map (feature_map_backward_mma.cuh), in fp32 otherwise.
//
//   mma_backward_state_kernel   (S, z) partials: the forward's mma_state_block
//   mma_dq_kernel               dphi(q) = 2^a (G~ S~^T) + r z^T        grid (query tiles, batch*heads)
//                               (writes r for dstate)
//   mma_dstate_kernel           [dS | dz] = Phi_q~^T [G~ | r~]       grid (batch*heads, splits)
//   mma_dkv_kernel              dphi(k) = 2^a (V dS~^T) + 1 dz^T,
//                               dv = 2^a (Phi_k~ dS~)                 grid (key tiles, batch*heads)
//
// with G = dO / den and r = -(dO . o) / den computed in fp32 as the scalar
// kernels do (r from the fp32 G S^T, query_r, not from the stored o), ~ = rounded once to bf16, S~ = round(2^-a S) (a: exponent of the
// block's max |S|; exact power-of-two scaling), and every sum fp32 in a fixed
// order: the gradients are bitwise deterministic. V, exact in bf16 for bf16
// I/O, is split into bf16 hi + lo for fp16 I/O (exact: fp16 has 11
// significant bits), which adds one product per V operand. The layouts: every 16-bit
// tile is token- or feature-major with rows padded by 8 elements (conflict-free
// ldmatrix, layout.cuh); S~ (D, dv + 8) serves as the k-major B of Phi_k dS
// (ldmatrix .trans) and as the n-major B of G S^T and V dS^T (ldmatrix without
// .trans), so one staged copy feeds both products of mma_dkv_kernel.
#pragma once

#include "lunajit/feature_map_backward_mma.cuh"
#include "lunajit/linear_attention_backward.cuh"
#include "lunajit/linear_attention_mma.cuh"

namespace lunajit {

namespace mma_detail {

// C = sum_p A_p B_p over a warp's 16-row m-tiles (output tiling W), the
// NTERMS products in order into one fp32 accumulator (the bf16 hi/lo split
// terms): A_p row-major (rows, KD) 16-bit at a[p] (row stride PA) by
// ldmatrix.x4; B_p k-major (kNMajorB = false: (KD, n) rows, .trans) or
// n-major (true: (n, KD) rows). Calls epi(row, column, value) for every
// entry of the warp's C fragments (C fragment: q = 0,1 row m0 + g, q = 2,3
// row m0 + g + 8; column n0 + 2t + (q & 1)), rows past the tile's valid ones
// included (the caller masks them). An epilogue wrapped by pair_epilogue gets
// a fragment row's two adjacent entries at once, epi(row, column, v0, v1)
// for (column, column + 1): one 64-bit store where the tile takes them.
// `extra(acc, m0, n_first, lane)` runs on each m-tile's accumulators before
// the epilogue sees them (more mma terms into the same fragments: the causal
// walks' intra-chunk products, IntraChunkTerms); the default adds nothing.
struct NoExtraTerms {
  template <int NPW>
  LUNAJIT_DEVICE void operator()(float (&)[NPW][4], int, int, int) const {}
};

template <class F>
struct PairEpilogue {
  F f;
};
template <class F>
LUNAJIT_DEVICE PairEpilogue<F> pair_epilogue(const F& f) {
  return PairEpilogue<F>{f};
}
template <class E>
struct IsPairEpilogue {
  static constexpr bool value = false;
};
template <class F>
struct IsPairEpilogue<PairEpilogue<F>> {
  static constexpr bool value = true;
};

template <class T, int WM, int MPW, int NPW, int KD, int PA, int PB, bool kNMajorB, int NTERMS, class Epi,
          class Extra = NoExtraTerms>
LUNAJIT_DEVICE void row_tile_products(const T* const (&a)[NTERMS], const T* const (&b)[NTERMS], int wm, int wn,
                                      int lane, const Epi& epi, const Extra& extra = Extra{}) {
  const int lm = lane >> 3, lr = lane & 7;
  const int n_first = wn * NPW * 8;
  for (int i = 0; i < MPW; ++i) {
    const int m0 = (wm + WM * i) * 16;
    float acc[NPW][4];
#pragma unroll
    for (int j = 0; j < NPW; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
#pragma unroll
    for (int p = 0; p < NTERMS; ++p) {
#pragma unroll
      for (int k0 = 0; k0 < KD; k0 += 16) {
        // A: matrix m holds rows m0 + 8(m&1), k k0 + 8(m>>1).
        unsigned af[4];
        mma::ldmatrix<4, false>(af, a[p] + (m0 + 8 * (lm & 1) + lr) * PA + k0 + 8 * (lm >> 1));
        b_tiles<T, NPW, PB, kNMajorB>(acc, af, kNMajorB ? b[p] + n_first * PB + k0 : b[p] + k0 * PB + n_first, lm, lr);
      }
    }
    extra(acc, m0, n_first, lane);
    const int g = lane >> 2, t = lane & 3;
    if constexpr (IsPairEpilogue<Epi>::value) {
#pragma unroll
      for (int j = 0; j < NPW; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) epi.f(m0 + g + 8 * h, n_first + 8 * j + 2 * t, acc[j][2 * h], acc[j][2 * h + 1]);
    } else {
#pragma unroll
      for (int j = 0; j < NPW; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) epi(m0 + g + 8 * (q >> 1), n_first + 8 * j + 2 * t + (q & 1), acc[j][q]);
    }
  }
}

// The causal walks' intra-chunk scores on mma: out[i CS + j] = x_i . y_j
// (+ add_row[i] when given) for j <= i < valid, 0 elsewhere in the C x C
// tile, with x and y fp32 (rows, KD) tiles at a KD-float stride (rows <
// valid read; the rest count as 0; XS, YS: their row strides, KD or a padded
// phi tile's, backward_phi_stride). Fragments come straight from the fp32
// tiles as 64-bit pairs and are split into bf16 hi + lo in registers (no
// staging tile: the walks' shared memory is full), the three significant
// split products (hi hi, hi lo, lo hi) per k16 step into one fp32
// accumulator: 2^-16-relative terms, as the inter-chunk products. Items are
// (16-row m-tile, 8-column n-tile) pairs over the warps; those wholly past
// the diagonal only write their zeros. Before, each (i, j) slot was an fp32
// dot product on CUDA cores: C^2 slots of 2 KD shared loads each, the largest
// shared-memory term of both walks (docs/ARCHITECTURE.md). Ends without a
// barrier.
template <class T, int NT, int C, int CS, int KD, int XS = KD, int YS = XS>
LUNAJIT_DEVICE void masked_scores(const float* x, const float* y, float* out, int valid, const float* add_row) {
  static_assert(C % 16 == 0 && KD % 16 == 0, "whole m16n8k16 tiles");
  constexpr int kMTiles = C / 16, kNTiles = C / 8, NW = NT / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const auto pair = [valid](const float* tile, int stride, int row, int col, unsigned& hi, unsigned& lo) {
    float2 v = make_float2(0.0f, 0.0f);
    if (row < valid) v = load_pair(tile + row * stride + col);
    split_bf16x2(v.x, v.y, hi, lo);
  };
  for (int item = warp; item < kMTiles * kNTiles; item += NW) {  // warp-uniform
    const int m0 = (item / kNTiles) * 16, n0 = (item % kNTiles) * 8;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (n0 <= m0 + 15 && m0 < valid && n0 < valid) {  // warp-uniform: the item holds kept entries
      for (int k0 = 0; k0 < KD; k0 += 16) {
        // A = x rows (g, g + 8) x columns (2t, 2t + 8); B = y rows n0 + g (n) x columns (k) 2t, 2t + 8.
        unsigned ahi[4], alo[4], bhi[2], blo[2];
        pair(x, XS, m0 + g, k0 + 2 * t, ahi[0], alo[0]);
        pair(x, XS, m0 + g + 8, k0 + 2 * t, ahi[1], alo[1]);
        pair(x, XS, m0 + g, k0 + 2 * t + 8, ahi[2], alo[2]);
        pair(x, XS, m0 + g + 8, k0 + 2 * t + 8, ahi[3], alo[3]);
        pair(y, YS, n0 + g, k0 + 2 * t, bhi[0], blo[0]);
        pair(y, YS, n0 + g, k0 + 2 * t + 8, bhi[1], blo[1]);
        mma::mma_m16n8k16<T>(acc, ahi, bhi, acc);
        mma::mma_m16n8k16<T>(acc, ahi, blo, acc);
        mma::mma_m16n8k16<T>(acc, alo, bhi, acc);
      }
    }
    // C fragment: q = 0, 1 row m0 + g, q = 2, 3 row m0 + g + 8; column n0 + 2t + (q & 1).
    // Stored as 64-bit pairs (j, j + 1): CS is even.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = m0 + g + 8 * h, j = n0 + 2 * t;
      const float add = add_row != nullptr && i < valid ? add_row[i] : 0.0f;
      const float v0 = j <= i && i < valid ? acc[2 * h] + add : 0.0f;
      const float v1 = j + 1 <= i && i < valid ? acc[2 * h + 1] + add : 0.0f;
      store_pair(out + i * CS + j, v0, v1);
    }
  }
}

// The causal walks' intra-chunk products on mma, as row_tile_products' extra
// terms (docs/MATH.md "Tensor-core causal backward"). First the accumulators
// (the inter-chunk product of the staged 2^-a S) times `unscale` = 2^a
// (exact), then, with P the C x C fp32 scores tile as masked_scores wrote it
// (0 outside the kept entries, CS floats a row: CausalRangeBlock) and Y an fp32 (C, n)
// tile YS floats a row whose rows >= valid count as 0:
//   kTransposed = false (causal_dq's dphi(q)):  acc(i, f) += sum_j P[i CS + j] Y[j YS + f]
//   kTransposed = true  (causal_dkv's dphi(k) and dv):  acc(j, f) += sum_i P[i CS + j] Y[i YS + f]
// Both operands split into bf16 hi + lo in registers (Y's fragments are
// k-pairs of one column, two scalar loads), the three significant split products per k16
// step (hi hi, hi lo, lo hi) into the same fp32 accumulators: 2^-16-relative
// terms, as the scores and the inter-chunk products. Only the k-steps that
// can hold kept entries run (dq: k0 <= m0; dkv: k0 >= m0). Before, every
// fragment entry summed its terms in fp32 on CUDA cores, one P and one Y
// load per FMA: the largest shared-memory term left in the walks.
template <class T, int C, int CS, int YS, bool kTransposed>
struct IntraChunkTerms {
  const float* P;
  const float* Y;
  int valid;
  float unscale;
  template <int NPW>
  LUNAJIT_DEVICE void operator()(float (&acc)[NPW][4], int m0, int n_first, int lane) const {
    static_assert(C % 16 == 0, "whole k16 steps over the chunk");
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NPW; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] *= unscale;
    const int k_begin = kTransposed ? m0 : 0, k_end = kTransposed ? C : m0 + 16;
    for (int k0 = k_begin; k0 < k_end; k0 += 16) {
      // A(row, k) = P[row][k] (dq: (k, k + 1) as one 64-bit load) or P[k][row]
      // (dkv): rows m0 + g (+ 8), k k0 + 2t (+ 1) (+ 8).
      const auto p = [&](int row, int k) {
        if constexpr (kTransposed) return make_float2(P[k * CS + row], P[(k + 1) * CS + row]);
        else return load_pair(P + row * CS + k);
      };
      unsigned ahi[4], alo[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float2 v = p(m0 + g + 8 * (r & 1), k0 + 2 * t + 8 * (r >> 1));
        split_bf16x2(v.x, v.y, ahi[r], alo[r]);
      }
      // B(k, n) = Y[k][n]: k k0 + 2t (+ 1) (+ 8), n the n-tile's column g.
      const auto y = [&](int k, int n) { return k < valid ? Y[k * YS + n] : 0.0f; };
#pragma unroll
      for (int j = 0; j < NPW; ++j) {
        const int n = n_first + 8 * j + g;
        unsigned bhi[2], blo[2];
        split_bf16x2(y(k0 + 2 * t, n), y(k0 + 2 * t + 1, n), bhi[0], blo[0]);
        split_bf16x2(y(k0 + 2 * t + 8, n), y(k0 + 2 * t + 9, n), bhi[1], blo[1]);
        mma::mma_m16n8k16<T>(acc[j], ahi, bhi, acc[j]);
        mma::mma_m16n8k16<T>(acc[j], ahi, blo, acc[j]);
        mma::mma_m16n8k16<T>(acc[j], alo, bhi, acc[j]);
      }
    }
  }
};

// [dS | dz] += Phi_q^T [G | r] with every operand a bf16 hi + lo pair: the
// three significant products hi hi, hi lo, lo hi (lo lo is below 2^-16
// relative), in that order (mma_dstate_kernel and mma_causal_dq_kernel).
template <class T, int WM, int MPW, int NPW, int Tk, int PD, int PV>
LUNAJIT_DEVICE void split_dstate_products(float (*acc)[NPW][4], float (*zacc)[4], const T* phi_hi, const T* phi_lo,
                                          const T* g_hi, const T* g_lo, const unsigned* r_hi, const unsigned* r_lo,
                                          int wm, int wn, bool with_z, int lane) {
  state_tile_products<T, WM, MPW, NPW, Tk, PD, PV>(acc, zacc, phi_hi, g_hi, wm, wn, with_z, lane, WordsColumn{r_hi});
  state_tile_products<T, WM, MPW, NPW, Tk, PD, PV>(acc, zacc, phi_hi, g_lo, wm, wn, with_z, lane, WordsColumn{r_lo});
  state_tile_products<T, WM, MPW, NPW, Tk, PD, PV>(acc, zacc, phi_lo, g_hi, wm, wn, with_z, lane, WordsColumn{r_hi});
}

// Stages 2^-a S (S: (D, dv) fp32) as bf16 hi + lo tiles (D, P), with a the
// exponent of max |S| over the block (red: one float per warp), and returns
// 2^a (the unscale). Ends with a barrier; the tiles are visible to every thread.
// scale_state_from_max: the same from each thread's max |S| over the entries
// it last wrote (write_state_partial's return: the walks' updates, where
// every entry has one owner lane); its barrier on the warps' maxima also
// orders those writes before the tiles' reads of S.
template <int NT, int D, int DV, int P>
LUNAJIT_DEVICE float scale_state_from_max(const float* S, unsigned* s_hi, unsigned* s_lo, float* red, float smax) {
  constexpr int NW = NT / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = smax;
  __syncthreads();
  smax = red[0];
  for (int w = 1; w < NW; ++w) smax = fmaxf(smax, red[w]);
  const float scale = pow2_scale(smax);
  for (int e = threadIdx.x; e < D * (DV / 2); e += NT) {
    const int f = e / (DV / 2), c = 2 * (e - f * (DV / 2));
    const float2 v = load_pair(S + f * DV + c);
    split_bf16x2(v.x * scale, v.y * scale, s_hi[(f * P + c) / 2], s_lo[(f * P + c) / 2]);
  }
  __syncthreads();
  return 1.0f / scale;  // a power of two: exact
}

template <int NT, int D, int DV, int P>
LUNAJIT_DEVICE float scale_state(const float* S, unsigned* s_hi, unsigned* s_lo, float* red) {
  float smax = 0.0f;
  for (int e = threadIdx.x; e < D * DV; e += NT) smax = fmaxf(smax, fabsf(S[e]));
  return scale_state_from_max<NT, D, DV, P>(S, s_hi, s_lo, red, smax);
}

// Loads one (batch, head)'s state [D * dv | D] (partial 0: the reduce
// kernels summed the non-causal splits into it; the causal walks' range
// slot) into S (D, dv) and z (D) fp32 and stages S as scale_state does. Ends
// with a barrier; the tiles and z are visible to every thread.
template <int NT, int D, int DV, int P>
LUNAJIT_DEVICE float stage_scaled_state(const float* state, float* S, float* z, unsigned* s_hi, unsigned* s_lo,
                                        float* red) {
  for (int e = threadIdx.x; e < D * DV; e += NT) S[e] = state[e];
  for (int f = threadIdx.x; f < D; f += NT) z[f] = state[D * DV + f];
  // No barrier: scale_state reads each entry of S from the thread that wrote it.
  return scale_state<NT, D, DV, P>(S, s_hi, s_lo, red);
}

// The non-causal state (or its gradient) of one (batch, head) as the reduce
// kernel staged it (mma_reduce_and_stage; `staged`: backward_staged_floats):
// the hi and lo words copied into the padded tiles s_hi, s_lo (D, P), 64
// bits at a time, z (D) from partial 0; returns the unscale 2^a. The same
// tiles stage_scaled_state makes from the fp32 state, without the fp32 tile,
// the block-wide max and the split in every tile. Ends with a barrier.
template <int NT, int D, int DV, int P>
LUNAJIT_DEVICE float load_staged_state(const float* staged, const float* state, float* z, unsigned* s_hi,
                                       unsigned* s_lo) {
  constexpr int kRowPairs = DV / 4;  // 64-bit pairs of words a row (DV / 2 words)
  const unsigned long long* hi = reinterpret_cast<const unsigned long long*>(staged);
  const unsigned long long* lo = hi + D * kRowPairs;
  for (int e = threadIdx.x; e < D * kRowPairs; e += NT) {
    const int f = e / kRowPairs, q = e - f * kRowPairs;
    reinterpret_cast<unsigned long long*>(s_hi + f * (P / 2))[q] = hi[e];
    reinterpret_cast<unsigned long long*>(s_lo + f * (P / 2))[q] = lo[e];
  }
  for (int f = threadIdx.x; f < D; f += NT) z[f] = state[D * DV + f];
  __syncthreads();
  return staged[D * DV];
}

// The feature map of the tensor-core backward for query_tile_gradients:
// backward_phi_tile (feature_map_mma.cuh) with its bf16 copy of x in x_words.
template <class K>
struct BackwardPhi {
  unsigned* x_words;
  int rows_alloc;
  LUNAJIT_DEVICE void operator()(const float* x, float* phi, float* scratch, int valid,
                                 const FeatureContext& ctx) const {
    backward_phi_tile<K, K::threads, backward_phi_stride<K>()>(x, phi, scratch, x_words, valid, rows_alloc, ctx);
  }
};

}  // namespace mma_detail

template <class K>
struct BackwardMmaTraits {
  using T = typename K::T;  // the I/O dtype
  using Op = __nv_bfloat16;  // the mma operands (hi + lo splits)
  static constexpr bool kSplitV = !mma::IsSame<T, __nv_bfloat16>::value;  // fp16 V: hi + lo
  static constexpr int NW = K::threads / 32;
  static constexpr int Tk = BackwardTraits<K>::kTokens;  // block_tokens, or chunk (causal)
  static constexpr int PD = mma_row_halves(K::D), PV = mma_row_halves(K::dv);
  static constexpr int PS = backward_phi_stride<K>();  // the fp32 phi and dphi tiles' row stride
  // The causal walks' fp32 V and dO (g) tiles: rows dv + 8 floats apart, so
  // that the scores' B = G V^T fragment loads (a fragment's 8 rows, 64-bit
  // pairs at columns 2t) cover all 32 banks per half-warp; dv apart they
  // shared 8 banks (8-way). The host mirror: backward_value_stride (launch_plan.h).
  static constexpr int VS = K::causal ? K::dv + 8 : K::dv;
  static constexpr MmaWarpTiling kDstate = mma_warp_tiling(KernelKind::state, K::D, K::dv, Tk, NW);
  static constexpr MmaWarpTiling kRowsByD = mma_warp_tiling(KernelKind::output, K::D, K::D, Tk, NW);   // dphi
  static constexpr MmaWarpTiling kRowsByDv = mma_warp_tiling(KernelKind::output, K::D, K::dv, Tk, NW); // dv
  static_assert(!mma::IsSame<T, float>::value,
                "the tensor-core backward takes bf16 or fp16 I/O; fp32 specs use the scalar backward (can_implement)");
  static_assert(!K::causal || !K::performer,
                "the causal performer (running key stabiliser) has no tensor-core backward (can_implement)");
  static_assert(K::D % 16 == 0 && K::dv % 16 == 0 && Tk % 16 == 0,
                "the tensor-core backward needs D, dv and block_tokens multiples of 16 (can_implement)");
  static_assert(kDstate.fits && kRowsByD.fits && kRowsByDv.fits,
                "warps do not tile the tensor-core backward's products (can_implement)");
  using FMB = MmaFeatureBackward<K, Tk>;  // the J^T: on tensor cores for LUNA's neural map, else fp32
  static LUNAJIT_HOST_DEVICE constexpr BackwardDims dims() {
    BackwardDims p = BackwardTraits<K>::dims();
    p.jt_stage = FMB::kStageFloats;
    p.split_v = kSplitV ? 1 : 0;
    p.score_pad = K::causal ? 8 : 0;
    p.staged_state = BackwardTraits<K>::kStaged ? 1 : 0;
    p.phi_stride = PS;
    p.value_stride = VS;
    return p;
  }
  static LUNAJIT_HOST_DEVICE constexpr BackwardMmaSmem layout(BackwardKind kind) {
    return backward_mma_smem_layout(kind, dims());
  }
};

// (S, z) partials, as the forward's tensor-core state pass. Grid (batch*heads, splits, dv blocks).
template <class K>
__global__ void __launch_bounds__(K::threads) mma_backward_state_kernel(const BackwardArgs args) {
  const BackwardWorkspace w = BackwardTraits<K>::workspace(args);
  const SeqSpan sp = sequence_span(args.cu_seqlens, blockIdx.x / args.problem.heads, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  // Causal: one partial per super-chunk range (chunk tiles), scanned into S_<r by state_scan_kernel.
  mma_state_block<K, BackwardMmaTraits<K>::Tk, /*kSplitPhi=*/true>(
      Problem{a.problem.batch, a.problem.heads, sp.len}, a.k, a.v, a.params,
      K::performer ? a.workspace[blockIdx.x] : 0.0f, a.workspace + w.state, split_count<K>(a));
}

// [dS | dz] partials over this block's share of the queries: Phi_q~^T [G~ | r~].
// Grid (batch*heads, splits).
template <class K>
__global__ void __launch_bounds__(K::threads) mma_dstate_kernel(const BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  using M = BackwardMmaTraits<K>;
  using T = typename K::T;
  constexpr int Tk = M::Tk, D = K::D, DV = K::dv, NT = K::threads, PD = M::PD, PV = M::PV;
  constexpr MmaWarpTiling W = M::kDstate;
  constexpr BackwardMmaSmem LM = M::layout(BackwardKind::dstate);
  constexpr BackwardSmem L = LM.base;
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads, split = blockIdx.y;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  const int seq = sp.len;
  const int splits = split_count<K>(a);
  const TokenRange range = split_range<K::state_splits>(seq, split, splits, Tk);
  constexpr long long kPart = (long long)D * DV + D;
  float* z = smem + L.z;
  load_state_z<K>(a.workspace + w.state + (long long)bh * K::state_splits * kPart, z);
  const float* params = KernelTraits<K>::head_params(a.params, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % W.warps_m, wn = warp / W.warps_m;
  const bool with_z = wn == 0;  // warp-uniform: the dz tile
  float acc[W.m_tiles_per_warp][W.n_tiles_per_warp][4];
  float zacc[W.m_tiles_per_warp][4];
  mma_detail::zero_state_accumulators(acc, zacc);
  // Each operand as bf16 hi + lo: [dS | dz] = Phi_hi^T [G_hi | r_hi] + Phi_hi^T [G_lo | r_lo]
  // + Phi_lo^T [G_hi | r_hi] (the lo x lo term is below 2^-16 relative).
  using Op = typename M::Op;
  const Op* phi_hi = reinterpret_cast<const Op*>(smem + LM.phi_h);  // (Tk, PD)
  const Op* phi_lo = reinterpret_cast<const Op*>(smem + LM.phi_lo);
  const Op* g_hi = reinterpret_cast<const Op*>(smem + LM.a_h);  // (Tk, PV)
  const Op* g_lo = reinterpret_cast<const Op*>(smem + LM.a_lo);
  unsigned* r_hi = reinterpret_cast<unsigned*>(smem + LM.r_h);
  unsigned* r_lo = reinterpret_cast<unsigned*>(smem + LM.r_lo);
  static_assert(LM.a_h - LM.phi_h >= backward_phi_x_floats<K>(Tk), "phi's x copy fits in phi_h, phi_lo");
  __syncthreads();  // z
  const float* r_row = a.workspace + w.r + bh * (long long)args.problem.seq;  // from mma_dq_kernel
  for (int t0 = range.begin; t0 < range.end; t0 += Tk) {
    const int valid = min(Tk, range.end - t0);
    // phi(q)'s x copy in the (still free) phi_h, phi_lo tiles.
    query_tile_gradients<K, M::PS>(a, b, h, t0, valid, L, smem, z, r_row + t0, FeatureContext{params, t0, seq, 1, 0.0f},
                            mma_detail::BackwardPhi<K>{reinterpret_cast<unsigned*>(smem + LM.phi_h), Tk});
    mma_detail::split_rows<NT, D, PD, M::PS>(smem + L.phi_q, reinterpret_cast<unsigned*>(smem + LM.phi_h),
                                      reinterpret_cast<unsigned*>(smem + LM.phi_lo), valid, Tk);
    mma_detail::split_rows<NT, DV, PV>(smem + L.dout, reinterpret_cast<unsigned*>(smem + LM.a_h),
                                       reinterpret_cast<unsigned*>(smem + LM.a_lo), valid, Tk);
    for (int e = threadIdx.x; e < Tk / 2; e += NT) {
      const float r0 = 2 * e < valid ? smem[L.r + 2 * e] : 0.0f, r1 = 2 * e + 1 < valid ? smem[L.r + 2 * e + 1] : 0.0f;
      mma_detail::split_bf16x2(r0, r1, r_hi[e], r_lo[e]);
    }
    __syncthreads();
    mma_detail::split_dstate_products<Op, W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp, Tk, PD, PV>(
        acc, zacc, phi_hi, phi_lo, g_hi, g_lo, r_hi, r_lo, wm, wn, with_z, lane);
    __syncthreads();
  }
  float* part = a.workspace + w.dstate + ((long long)bh * K::state_splits + split) * kPart;
  mma_detail::write_state_partial<W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp>(acc, zacc, part, D, DV, 0, wm,
                                                                                   wn, with_z, lane);
}

// The non-causal tensor-core backward's reduce kernels (roles state_reduce
// and dstate_reduce, one block per (batch, head), always run: with one split
// too): the split partials of (S, z) or (dS, dz) summed in split order into
// partial 0 (reduce_state_partials' sums; skipped with one split), then S
// (or dS) staged for every dq (or dkv) tile as stage_scaled_state staged it
// in each of them: a = the exponent of max |S| over the whole state, 2^-a S
// split into bf16 hi + lo words, and the unscale 2^a, in the workspace's
// staged region. Identical tiles, made once per (batch, head) instead of
// once per tile (98,304 16-token tiles in each of dq and dkv at B 8, H 12,
// N 16384). Dynamic shared memory: one float per warp (the max).
template <class K, bool kGradient>
LUNAJIT_DEVICE void mma_reduce_and_stage(const BackwardArgs& args) {
  constexpr int D = K::D, DV = K::dv, NT = K::threads, NW = NT / 32, R = K::state_splits;
  constexpr long long kPart = (long long)D * DV + D;
  const BackwardWorkspace w = BackwardTraits<K>::workspace(args);
  const int bh = blockIdx.x, bh_count = args.problem.batch * args.problem.heads;
  const int splits = split_count<K>(args);
  float* const part = args.workspace + (kGradient ? w.dstate : w.state) + (long long)bh * R * kPart;
  float* const staged =
      args.workspace + w.staged + (long long)((kGradient ? bh_count : 0) + bh) * backward_staged_floats(D, DV);
  float* const red = reinterpret_cast<float*>(dynamic_smem());
  float smax = 0.0f;
  for (int e = threadIdx.x; e < kPart; e += NT) {
    float x[R];
#pragma unroll
    for (int p = 0; p < R; ++p) x[p] = p < splits ? part[p * kPart + e] : 0.0f;
    float s = 0.0f;
#pragma unroll
    for (int p = 0; p < R; ++p)
      if (p < splits) s += x[p];
    if (splits > 1) part[e] = s;
    if (e < D * DV) smax = fmaxf(smax, fabsf(s));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = smax;
  __syncthreads();  // the warps' maxima, and the sums (read below by other threads)
  smax = red[0];
  for (int i = 1; i < NW; ++i) smax = fmaxf(smax, red[i]);
  const float scale = mma_detail::pow2_scale(smax);
  unsigned* const hi = reinterpret_cast<unsigned*>(staged);
  unsigned* const lo = hi + D * DV / 2;
  for (int e = threadIdx.x; e < D * DV / 2; e += NT) {
    // 0 + sum: a single partial's -0 becomes +0 as the readers' sums made it.
    const float v0 = 0.0f + part[2 * e], v1 = 0.0f + part[2 * e + 1];
    mma_detail::split_bf16x2(v0 * scale, v1 * scale, hi[e], lo[e]);
  }
  if (threadIdx.x == 0) staged[D * DV] = 1.0f / scale;  // a power of two: exact
}

template <class K>
__global__ void __launch_bounds__(K::threads) mma_backward_state_reduce_kernel(const BackwardArgs args) {
  mma_reduce_and_stage<K, false>(args);
}

template <class K>
__global__ void __launch_bounds__(K::threads) mma_dstate_reduce_kernel(const BackwardArgs args) {
  mma_reduce_and_stage<K, true>(args);
}

// dq for one query tile: dphi(q) = G S^T + r z^T on mma (S~ scaled, r z^T in
// fp32, r from G S^T: query_r, written to the workspace for mma_dstate_kernel),
// then the feature map's backward. Grid (query tiles, batch*heads).
// When its shared memory keeps it to one block per SM (the default config does):
// launch bounds that let ptxas use the registers the J^T needs (layout.cuh).
template <class K>
__global__ void __launch_bounds__(K::threads,
                                  sole_block_min_blocks(BackwardMmaTraits<K>::layout(BackwardKind::dq).bytes()))
    mma_dq_kernel(const BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  using M = BackwardMmaTraits<K>;
  using T = typename K::T;
  constexpr int Tk = M::Tk, D = K::D, DV = K::dv, NT = K::threads, PV = M::PV;
  constexpr MmaWarpTiling W = M::kRowsByD;
  constexpr BackwardMmaSmem LM = M::layout(BackwardKind::dq);
  constexpr BackwardSmem L = LM.base;
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.y, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  // A tile past the end of a shorter packed sequence has no rows but still
  // writes its (zero) parameter-gradient slot.
  const int seq = sp.len, t0 = blockIdx.x * Tk, valid = max(0, min(Tk, seq - t0));
  float* z = smem + L.z;
  float* dphi = smem + L.dphi;
  float* dparams = smem + L.dparams;
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  // S as the reduce kernel staged it (2^-a S as bf16 hi + lo), z from partial 0.
  const float unscale = mma_detail::load_staged_state<NT, D, DV, PV>(
      a.workspace + w.staged + (long long)bh * backward_staged_floats(D, DV),
      a.workspace + w.state + (long long)bh * K::state_splits * ((long long)D * DV + D), z,
      reinterpret_cast<unsigned*>(smem + LM.s_h), reinterpret_cast<unsigned*>(smem + LM.s_lo));
  const FeatureContext ctx{KernelTraits<K>::head_params(a.params, h), t0, seq, 1, 0.0f};
  // phi(q)'s x copy in the dphi tile, free until the products' epilogue.
  static_assert(L.v - L.dphi >= backward_phi_x_floats<K>(Tk), "phi's x copy fits in dphi");
  query_tile_gradients<K, M::PS>(a, b, h, t0, valid, L, smem, z, nullptr, ctx,
                          mma_detail::BackwardPhi<K>{reinterpret_cast<unsigned*>(dphi), Tk});
  mma_detail::split_rows<NT, DV, PV>(smem + L.dout, reinterpret_cast<unsigned*>(smem + LM.a_h),
                                     reinterpret_cast<unsigned*>(smem + LM.a_lo), valid, Tk);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* r = smem + L.r;
  // G S^T = g_hi S_hi^T + g_hi S_lo^T + g_lo S_hi^T (the lo x lo term is below
  // 2^-16 relative): fp32-level, since dphi(q) = S g + z r cancels (phi(q) .
  // dphi(q) = 0 for a normalized output) and a once-rounded product would carry
  // 2^-8 of |S g|, not of |dphi|.
  using Op = typename M::Op;
  const Op* g_hi = reinterpret_cast<const Op*>(smem + LM.a_h);
  const Op* g_lo = reinterpret_cast<const Op*>(smem + LM.a_lo);
  const Op* s_hi = reinterpret_cast<const Op*>(smem + LM.s_h);
  const Op* s_lo = reinterpret_cast<const Op*>(smem + LM.s_lo);
  const Op* const as[3] = {g_hi, g_hi, g_lo};
  const Op* const bs[3] = {s_hi, s_lo, s_hi};
  mma_detail::row_tile_products<Op, W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp, DV, PV, PV, true>(
      as, bs, warp % W.warps_m, warp / W.warps_m, lane,
      mma_detail::pair_epilogue([&](int i, int f, float v0, float v1) {
        if (i < valid) mma_detail::store_pair(dphi + i * M::PS + f, v0 * unscale, v1 * unscale);
      }));
  __syncthreads();
  if constexpr (K::normalize) {
    query_r<K, M::PS>(smem + L.phi_q, dphi, smem + L.den, smem + L.r,
                      a.workspace + w.r + bh * (long long)args.problem.seq + t0, valid);
    for (int e = threadIdx.x; e < valid * D; e += NT) {
      const int i = e / D, f = e - i * D;
      dphi[i * M::PS + f] = fmaf(z[f], r[i], dphi[i * M::PS + f]);
    }
    __syncthreads();
  }
  M::FMB::template backward<NT>(smem + L.x, smem + L.phi_q, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                smem + L.dx, dparams, smem + LM.jt);
  store_tile<K>(smem + L.dx, valid, K::d, a.dq, b, h, t0);
  if constexpr (Tr::kLearned)
    write_slot<K>(dparams, a.workspace + w.slots + ((long long)bh * gridDim.x + blockIdx.x) * Tr::kParamFloats);
}

// dk and dv for one key tile: dphi(k) = V dS^T + dz and dv = Phi_k dS, both on
// mma from one staged dS~, then the feature map's backward. Grid (key tiles, batch*heads).
// When its shared memory keeps it to one block per SM (the default config does):
// launch bounds that let ptxas use the registers the J^T needs (layout.cuh).
template <class K>
__global__ void __launch_bounds__(K::threads,
                                  sole_block_min_blocks(BackwardMmaTraits<K>::layout(BackwardKind::dkv).bytes()))
    mma_dkv_kernel(const BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  using M = BackwardMmaTraits<K>;
  using T = typename K::T;
  constexpr int Tk = M::Tk, D = K::D, DV = K::dv, NT = K::threads, PD = M::PD, PV = M::PV;
  constexpr MmaWarpTiling WD = M::kRowsByD, WV = M::kRowsByDv;
  constexpr BackwardMmaSmem LM = M::layout(BackwardKind::dkv);
  constexpr BackwardSmem L = LM.base;
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.y, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  // A tile past the end of a shorter packed sequence has no rows but still
  // writes its (zero) parameter-gradient slot.
  const int seq = sp.len, t0 = blockIdx.x * Tk, valid = max(0, min(Tk, seq - t0));
  const int bh_count = a.problem.batch * a.problem.heads;
  float* dz = smem + L.z;
  float* phi = smem + L.phi_q;  // phi(k) here
  float* dphi = smem + L.dphi;
  float* dparams = smem + L.dparams;
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  // dS as the reduce kernel staged it, dz from partial 0.
  const float unscale = mma_detail::load_staged_state<NT, D, DV, PV>(
      a.workspace + w.staged + (long long)(bh_count + bh) * backward_staged_floats(D, DV),
      a.workspace + w.dstate + (long long)bh * K::state_splits * ((long long)D * DV + D), dz,
      reinterpret_cast<unsigned*>(smem + LM.s_h), reinterpret_cast<unsigned*>(smem + LM.s_lo));
  load_rows<T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
  load_rows<T, NT>(a.v, b, h, t0, valid, valid, DV, 0, DV, smem + L.v);
  __syncthreads();
  const FeatureContext ctx{KernelTraits<K>::head_params(a.params, h), t0, seq, 0,
                           K::performer ? a.workspace[bh] : 0.0f};
  static_assert(L.v - L.dphi >= backward_phi_x_floats<K>(Tk), "phi's x copy fits in dphi");
  backward_phi_tile<K, NT, M::PS>(smem + L.x, phi, smem + L.scratch, reinterpret_cast<unsigned*>(dphi), valid, Tk,
                                  ctx);
  if constexpr (M::kSplitV)  // exact: fp16's 11 bits in bf16 hi + lo
    mma_detail::split_rows<NT, DV, PV>(smem + L.v, reinterpret_cast<unsigned*>(smem + LM.a_h),
                                       reinterpret_cast<unsigned*>(smem + LM.a_lo), valid, Tk);
  else
    mma_detail::round_rows<T, NT, DV, PV>(smem + L.v, reinterpret_cast<unsigned*>(smem + LM.a_h), valid, Tk);  // exact
  __syncthreads();
  mma_detail::split_rows<NT, D, PD, M::PS>(phi, reinterpret_cast<unsigned*>(smem + LM.phi_h),
                                    reinterpret_cast<unsigned*>(smem + LM.phi_lo), valid, Tk);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // dS and phi(k) as bf16 hi + lo, V exact (bf16 I/O: V, fp16: V_hi + V_lo):
  // V dS^T = V dS_hi^T + V dS_lo^T (+ V_lo dS_hi^T) and
  // Phi_k dS = Phi_hi dS_hi + Phi_hi dS_lo + Phi_lo dS_hi.
  using Op = typename M::Op;
  const Op* s_hi = reinterpret_cast<const Op*>(smem + LM.s_h);
  const Op* s_lo = reinterpret_cast<const Op*>(smem + LM.s_lo);
  const Op* v_h = reinterpret_cast<const Op*>(smem + LM.a_h);
  const Op* v_lo = reinterpret_cast<const Op*>(smem + LM.a_lo);  // fp16 I/O only
  const Op* phi_hi = reinterpret_cast<const Op*>(smem + LM.phi_h);
  const Op* phi_lo = reinterpret_cast<const Op*>(smem + LM.phi_lo);
  const Op* const phis[3] = {phi_hi, phi_hi, phi_lo};
  const Op* const dss[3] = {s_hi, s_lo, s_hi};
  const auto dphi_epi = mma_detail::pair_epilogue([&](int i, int f, float v0, float v1) {
    if (i < valid) mma_detail::store_pair(dphi + i * M::PS + f, fmaf(v0, unscale, dz[f]), fmaf(v1, unscale, dz[f + 1]));
  });
  if constexpr (M::kSplitV) {
    const Op* const vs[3] = {v_h, v_h, v_lo};
    const Op* const ss[3] = {s_hi, s_lo, s_hi};
    mma_detail::row_tile_products<Op, WD.warps_m, WD.m_tiles_per_warp, WD.n_tiles_per_warp, DV, PV, PV, true>(
        vs, ss, warp % WD.warps_m, warp / WD.warps_m, lane, dphi_epi);
  } else {
    (void)v_lo;
    const Op* const vs[2] = {v_h, v_h};
    const Op* const ss[2] = {s_hi, s_lo};
    mma_detail::row_tile_products<Op, WD.warps_m, WD.m_tiles_per_warp, WD.n_tiles_per_warp, DV, PV, PV, true>(
        vs, ss, warp % WD.warps_m, warp / WD.warps_m, lane, dphi_epi);
  }
  T* dv_out = static_cast<T*>(a.dv.data) + b * a.dv.stride_batch + h * a.dv.stride_head;
  mma_detail::row_tile_products<Op, WV.warps_m, WV.m_tiles_per_warp, WV.n_tiles_per_warp, D, PD, PV, false>(
      phis, dss, warp % WV.warps_m, warp / WV.warps_m, lane, [&](int i, int c, float v) {
        if (i < valid) dv_out[(long long)(t0 + i) * a.dv.stride_seq + c] = from_float<T>(v * unscale);
      });
  __syncthreads();
  M::FMB::template backward<NT>(smem + L.x, phi, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch, smem + L.dx,
                                dparams, smem + LM.jt);
  store_tile<K>(smem + L.dx, valid, K::d, a.dk, b, h, t0);
  if constexpr (Tr::kLearned)
    write_slot<K>(dparams, a.workspace + w.slots +
                               ((long long)(bh_count + bh) * gridDim.x + blockIdx.x) * Tr::kParamFloats);
}

// ------------------------------------------------------------------ causal
// The causal backward on tensor cores (docs/MATH.md "Tensor-core causal
// backward"): the sequence of each (batch, head) splits into R =
// BackwardArgs::splits (at most K::state_splits) super-chunk ranges of whole chunks (split_range, as the
// forward's walk); a block takes one range and walks its chunks of C =
// K::chunk tokens, seeded with the exclusive prefix S_<r, z_<r (dq, walking
// forward) or suffix dS_>r, dz_>r (dk, dv, walking backward) of the per-range
// states, and carries the fp32 state in shared memory from chunk to chunk:
//   mma_backward_state_kernel  (S_r, z_r) per range (chunk tiles), grid (bh, R, dv blocks)
//   state_scan_kernel          -> S_<r (+ the carried initial state) in place
//   mma_causal_dq_kernel       per chunk c: den, g; dphi(q) = 2^a G S~_<c^T + r z_<c^T
//                              + sum_{j<=i in c} B_ij phi(k_j), r from the rest
//                              (causal_query_r; den and r kept for dkv); the range's
//                              [dS_r | dz_r] += Phi_q^T [G | r]; then S += Phi_k^T [V | 1]
//   dstate_scan_kernel         -> dS_>r (+ dS_T) in place; writes dS_>=0
//   mma_causal_dkv_kernel      per chunk c, last first: dphi(k) = 2^a V dS~_>c^T + dz_>c
//                              + sum_{i>=j in c} B_ij phi(q_i), dv = 2^a Phi_k dS~_>c
//                              + sum_{i>=j in c} A_ij g_i; then dS += Phi_q^T [G | r]
// grid (R, batch*heads) for both walks, with A_ij = phi(q_i) . phi(k_j),
// B_ij = v_j . g_i + r_i as the scalar scans. The inter-chunk products and the
// walks' state updates are bf16 hi + lo split products with fp32 accumulation;
// the state is restaged as 2^-a-scaled hi + lo tiles after every update; the
// intra-chunk scores A, B are split products on mma too (masked_scores), the
// sums over them fp32 on CUDA cores, added in the products' epilogues.
// Fixed-order sums everywhere: the gradients are bitwise deterministic. Not
// the causal performer (its running key stabiliser; can_implement). (Until
// this walk, every chunk was a block of its own and
// read its prefix from a per-chunk state array: D (dv + 1) floats a chunk
// written and read four times, most of the predicted time; MATH.md.)
//
// What both causal walks set up first, for block (range, batch*head) of
// kernel `kind`: the block's indices, its (packed) sequence span and its
// range of chunks, the shared tiles both use, the parameter-gradient
// accumulator zeroed, and the scanned range state staged (the prefix S_<r,
// z_<r for causal_dq, the suffix dS_>r, dz_>r for causal_dkv): fp32 in the
// state and z tiles (the walk's master copy) and as 2^-a-scaled bf16 hi + lo
// tiles. A range past the end of a shorter packed sequence is empty but still
// writes its (zero) partial and slots.
template <class K, BackwardKind kKind>
struct CausalRangeBlock {
  using Tr = BackwardTraits<K>;
  using M = BackwardMmaTraits<K>;
  static constexpr int C = M::Tk, D = K::D, DV = K::dv, NT = K::threads, PV = M::PV;
  // The A and B tiles' row stride (the layout holds C + 8 floats a row,
  // score_pad): IntraChunkTerms reads causal_dq's rows as 64-bit pairs, conflict-free at
  // C + 8 (8 mod 32 floats), and causal_dkv's transposed (rows 2t, column g),
  // conflict-free at C + 4 (4 mod 32); masked_scores' pair stores are
  // conflict-free at C + 8 and 2-way at C + 4. At C + 1 (for the fp32
  // epilogues' column walks these replaced) both reads were 4-way.
  static constexpr int CS = kKind == BackwardKind::causal_dq ? C + 8 : C + 4;
  static constexpr long long kPart = (long long)D * DV + D;
  static constexpr BackwardMmaSmem LM = M::layout(kKind);
  static constexpr BackwardSmem L = LM.base;
  static_assert(Tr::kCausalTiles, "the tensor-core causal backward");
  static_assert(L.v - L.dphi >= backward_phi_x_floats<K>(C), "phi's x copy fits in dphi");
  static_assert(L.z == L.state + D * DV, "[S | z] contiguous: the walk's updates add a [D * dv | D] partial");
  float* smem;
  BackwardWorkspace w;
  int split, bh, b, h;
  // The tensors' (batch, token) coordinates: (b, t) unpacked, (0, off + t) for
  // packed sequences (sequence_args' views, recomputed per access: the kernels
  // read the tensors from the kernel parameters, so that their pointers and
  // strides need no registers across the walk).
  int bt, off;
  long long ws_seq;  // per-token workspace rows: the longest length
  long long slot;    // (batch*head, range): the state partial index
  long long param_slot;  // workspace offset of this block's parameter slot (dq's side, then dkv's)
  int seq;
  TokenRange range;
  float *z, *phi_q, *phi_k, *v, *g, *A, *B, *den, *r, *dphi, *dparams;
  unsigned* x_words;  // the maps' bf16 copy of x: the dphi tile, free until the epilogues
  const float* params;
  float unscale;

  // stage = false: the coordinates and tiles only (a chunk of the walk).
  LUNAJIT_DEVICE explicit CausalRangeBlock(const BackwardArgs& args, bool stage = true)
      : smem(reinterpret_cast<float*>(dynamic_smem())), w(Tr::workspace(args)) {
    split = blockIdx.x;
    bh = blockIdx.y;
    b = bh / args.problem.heads;
    h = bh % args.problem.heads;
    const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
    bt = args.cu_seqlens != nullptr ? 0 : b;
    off = (int)sp.offset;
    ws_seq = args.problem.seq;
    // State partials at the compiled stride (bh R + split); parameter slots
    // dense by the launch's count (ParamSlots: side, batch*head, range).
    const int splits = split_count<K>(args);
    slot = (long long)bh * K::state_splits + split;
    const long long side = kKind == BackwardKind::causal_dkv ? (long long)args.problem.batch * args.problem.heads : 0;
    param_slot = w.slots + ((side + bh) * splits + split) * Tr::kParamFloats;
    seq = sp.len;
    // The kernel computes the range (a division by the runtime count) and
    // set_walk leaves it in shared memory for the chunk calls: computed in
    // every call, ptxas needed a 40-byte stack frame on sm_90 at 128 registers.
    if (stage) {
      range = split_range<K::state_splits>(seq, split, splits, C);
    } else {
      const int* walk = reinterpret_cast<const int*>(smem + LM.walk);
      range = TokenRange{walk[2], walk[3]};
    }
    z = smem + L.z;
    phi_q = smem + L.phi_q;
    phi_k = smem + L.phi_k;
    v = smem + L.v;
    g = smem + L.dout;
    A = smem + L.scores;
    B = smem + L.scores + C * CS;
    den = smem + L.den;
    r = smem + L.r;
    dphi = smem + L.dphi;
    dparams = smem + L.dparams;
    x_words = reinterpret_cast<unsigned*>(dphi);
    params = KernelTraits<K>::head_params(args.params, h);
    unscale = 1.0f;
    if (!stage) return;
    for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
    const long long state = kKind == BackwardKind::causal_dq ? w.state : w.dstate;
    unscale = mma_detail::stage_scaled_state<NT, D, DV, PV>(
        args.workspace + state + slot * kPart, smem + L.state, z, reinterpret_cast<unsigned*>(smem + LM.s_h),
        reinterpret_cast<unsigned*>(smem + LM.s_lo), smem + LM.reduce);
  }

  // The walk's state for the next chunk call: the chunk starting at token
  // t0, the state's unscale and the range (thread 0 writes them; ends with a
  // barrier).
  LUNAJIT_DEVICE void set_walk(int t0, float state_unscale) const {
    if (threadIdx.x == 0) {
      int* walk = reinterpret_cast<int*>(smem + LM.walk);
      walk[0] = t0;
      smem[LM.walk + 1] = state_unscale;
      walk[2] = range.begin;
      walk[3] = range.end;
    }
    __syncthreads();
  }

  // After a walk update of the fp32 state: its 2^-a-scaled hi + lo tiles
  // again (the J^T's staging overlays them), from each thread's max |S| over
  // the entries its update wrote (write_state_partial<..., kAdd>). No
  // barrier needed before it: scale_state_from_max's own orders the update's
  // writes before its reads. Ends with a barrier.
  LUNAJIT_DEVICE void restage(float thread_max) {
    unscale = mma_detail::scale_state_from_max<NT, D, DV, PV>(
        smem + L.state, reinterpret_cast<unsigned*>(smem + LM.s_h), reinterpret_cast<unsigned*>(smem + LM.s_lo),
        smem + LM.reduce, thread_max);
  }
};

// One chunk of the walk, not inlined into it: the block's walk state (next
// chunk, the state's unscale) comes from shared memory, so that nothing of
// the kernel's lives across the call, and returns false after the range's
// last chunk (having written the block's partials). Inlined into the walk's
// loop, the compiler hoisted the chunk's lane-dependent addresses out of the
// loop and ptxas spilled 156 bytes at the 128 registers that keep two blocks
// of 8 warps per SM on sm_90; a call keeps the chunk's registers its own.
template <class K>
__device__ __noinline__ bool mma_causal_dq_chunk(const BackwardArgs& args) {
  using Tr = BackwardTraits<K>;
  using M = BackwardMmaTraits<K>;
  using T = typename K::T;
  using Op = typename M::Op;
  using CB = CausalRangeBlock<K, BackwardKind::causal_dq>;
  constexpr int C = CB::C, D = K::D, DV = K::dv, NT = K::threads, PD = M::PD, PV = M::PV, CS = CB::CS, VS = M::VS;
  constexpr MmaWarpTiling W = M::kRowsByD, WS = M::kDstate;
  constexpr BackwardMmaSmem LM = CB::LM;
  constexpr BackwardSmem L = CB::L;
  constexpr long long kPart = CB::kPart;
  CB cb(args, /*stage=*/false);
  float* const smem = cb.smem;
  const BackwardWorkspace& w = cb.w;
  const BackwardArgs& a = args;
  const int bh = cb.bh, b = cb.bt, h = cb.h, off = cb.off;
  const long long ws_seq = cb.ws_seq;
  const int seq = cb.seq;
  float *const z = cb.z, *const phi_q = cb.phi_q, *const phi_k = cb.phi_k, *const v = cb.v, *const g = cb.g;
  float *const A = cb.A, *const B = cb.B, *const den = cb.den, *const r = cb.r, *const dphi = cb.dphi;
  float* const dparams = cb.dparams;
  unsigned* const x_words = cb.x_words;
  float* const dsum = smem + LM.dsum;  // the range's [dS | dz], fp32
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned* const phi_hw = reinterpret_cast<unsigned*>(smem + LM.phi_h);
  unsigned* const phi_lw = reinterpret_cast<unsigned*>(smem + LM.phi_lo);
  unsigned* const a_hw = reinterpret_cast<unsigned*>(smem + LM.a_h);
  unsigned* const a_lw = reinterpret_cast<unsigned*>(smem + LM.a_lo);
  unsigned* const r_hi = reinterpret_cast<unsigned*>(smem + LM.r_h);
  unsigned* const r_lo = reinterpret_cast<unsigned*>(smem + LM.r_lo);
  const Op* const g_hi = reinterpret_cast<const Op*>(smem + LM.a_h);  // g, then V (the update)
  const Op* const g_lo = reinterpret_cast<const Op*>(smem + LM.a_lo);
  const Op* const s_hi = reinterpret_cast<const Op*>(smem + LM.s_h);
  const Op* const s_lo = reinterpret_cast<const Op*>(smem + LM.s_lo);
  const Op* const phi_hi = reinterpret_cast<const Op*>(smem + LM.phi_h);  // phi(q), then phi(k) (the update)
  const Op* const phi_lo = reinterpret_cast<const Op*>(smem + LM.phi_lo);
  const int wm = warp % WS.warps_m, wn = warp / WS.warps_m;
  const bool with_z = wn == 0;  // warp-uniform: the z / dz tile
  float* const walk = smem + LM.walk;  // [next chunk (int), unscale]
  const int t0 = reinterpret_cast<const int*>(walk)[0];
  const float unscale = walk[1];
  const int valid = min(C, cb.range.end - t0);
  const float* const params = cb.params;
  load_rows<T, NT>(a.k, b, h, off + t0, valid, valid, K::d, 0, K::d, smem + L.x);
  load_rows<T, NT, VS>(a.v, b, h, off + t0, valid, valid, DV, 0, DV, v);
  __syncthreads();
  backward_phi_tile<K, NT, M::PS>(smem + L.x, phi_k, smem + L.scratch, x_words, valid, C,
                                  FeatureContext{params, t0, seq, 0, 0.0f});
  const FeatureContext ctx{params, t0, seq, 1, 0.0f};
  load_rows<T, NT>(a.q, b, h, off + t0, valid, valid, K::d, 0, K::d, smem + L.x);
  load_rows<T, NT, VS>(a.dout, b, h, off + t0, valid, valid, DV, 0, DV, g);
  __syncthreads();
  backward_phi_tile<K, NT, M::PS>(smem + L.x, phi_q, smem + L.scratch, x_words, valid, C, ctx);
  mma_detail::masked_scores<Op, NT, C, CS, D, M::PS>(phi_q, phi_k, A, valid, nullptr);  // A_ij = phi(q_i) . phi(k_j)
  __syncthreads();
  // den_i = phi(q_i) . z_<c + sum_{j<=i in c} A_ij + eps, kept for the dkv kernel.
  for (int i = threadIdx.x; i < valid; i += NT) {
    float s = 1.0f;
    if constexpr (K::normalize) {
      s = fm::dot_rotated<D>(phi_q + i * M::PS, z, i) + K::eps;
      for (int j = 0; j <= i; ++j) s += A[i * CS + j];
      a.workspace[w.den + bh * ws_seq + t0 + i] = s;
    }
    den[i] = s;
  }
  __syncthreads();
  query_gradients<K, VS>(g, den, nullptr, r, valid);
  // B_ij = g_i . v_j here; r_i joins dphi(q_i) once query_r has it (below).
  mma_detail::masked_scores<Op, NT, C, CS, DV, VS>(g, v, B, valid, nullptr);
  mma_detail::split_rows<NT, DV, PV, VS>(g, a_hw, a_lw, valid, C);
  mma_detail::split_rows<NT, D, PD, M::PS>(phi_q, phi_hw, phi_lw, valid, C);
  __syncthreads();
  {  // dphi(q) = 2^a G S~^T + B Phi_k: inter-chunk (as mma_dq_kernel) and intra-chunk, both on mma
    const Op* const as[3] = {g_hi, g_hi, g_lo};
    const Op* const bs[3] = {s_hi, s_lo, s_hi};
    mma_detail::row_tile_products<Op, W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp, DV, PV, PV, true>(
        as, bs, warp % W.warps_m, warp / W.warps_m, lane,
        mma_detail::pair_epilogue([&](int i, int f, float x0, float x1) {
          if (i < valid) mma_detail::store_pair(dphi + i * M::PS + f, x0, x1);
        }),
        mma_detail::IntraChunkTerms<Op, C, CS, M::PS, false>{B, phi_k, valid, unscale});
  }
  __syncthreads();
  causal_query_r<K, M::PS>(phi_q, phi_k, z, dphi, den, r, a.workspace + w.r + bh * ws_seq + t0, valid);
  for (int e = threadIdx.x; e < C / 2; e += NT) {
    const float r0 = 2 * e < valid ? r[2 * e] : 0.0f, r1 = 2 * e + 1 < valid ? r[2 * e + 1] : 0.0f;
    mma_detail::split_bf16x2(r0, r1, r_hi[e], r_lo[e]);
  }
  __syncthreads();
  {  // The range's [dS_r | dz_r] += Phi_q^T [G | r], hi + lo as mma_dstate_kernel;
     // each entry added by its owner lane, chunk after chunk (fixed order).
    float acc[WS.m_tiles_per_warp][WS.n_tiles_per_warp][4];
    float zacc[WS.m_tiles_per_warp][4];
    mma_detail::zero_state_accumulators(acc, zacc);
    mma_detail::split_dstate_products<Op, WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp, C, PD, PV>(
        acc, zacc, phi_hi, phi_lo, g_hi, g_lo, r_hi, r_lo, wm, wn, with_z, lane);
    mma_detail::write_state_partial<WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp, /*kAdd=*/true>(
        acc, zacc, dsum, D, DV, 0, wm, wn, with_z, lane);
  }
  __syncthreads();
  M::FMB::template backward<NT>(smem + L.x, phi_q, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                smem + L.dx, dparams, smem + LM.jt);
  store_tile<K>(smem + L.dx, valid, K::d, a.dq, b, h, off + t0);
  if (t0 + C < cb.range.end) {  // block-uniform: S_<c+1 = S_<c + Phi_k^T [V | 1] for the next chunk
    __syncthreads();  // the J^T's staging (over phi_h ...) is free
    mma_detail::split_rows<NT, D, PD, M::PS>(phi_k, phi_hw, phi_lw, valid, C);
    if constexpr (M::kSplitV)  // exact: fp16's 11 bits in bf16 hi + lo
      mma_detail::split_rows<NT, DV, PV, VS>(v, a_hw, a_lw, valid, C);
    else
      mma_detail::round_rows<T, NT, DV, PV, VS>(v, a_hw, valid, C);  // exact
    __syncthreads();
    float acc[WS.m_tiles_per_warp][WS.n_tiles_per_warp][4];
    float zacc[WS.m_tiles_per_warp][4];
    mma_detail::zero_state_accumulators(acc, zacc);
    const unsigned ones = mma_detail::pack2<Op>(1.0f, 1.0f);
    // As the state pass: Phi_hi^T [V | 1] + Phi_lo^T [V | 1] (+ Phi_hi^T V_lo, fp16 I/O).
    mma_detail::state_tile_products<Op, WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp, C, PD, PV>(
        acc, zacc, phi_hi, g_hi, wm, wn, with_z, lane, mma_detail::OnesColumn{ones});
    mma_detail::state_tile_products<Op, WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp, C, PD, PV>(
        acc, zacc, phi_lo, g_hi, wm, wn, with_z, lane, mma_detail::OnesColumn{ones});
    if constexpr (M::kSplitV)
      mma_detail::state_tile_products<Op, WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp, C, PD, PV>(
          acc, zacc, phi_hi, g_lo, wm, wn, /*with_z=*/false, lane, mma_detail::OnesColumn{ones});
    const float smax = mma_detail::write_state_partial<WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp,
                                                       /*kAdd=*/true>(acc, zacc, smem + L.state, D, DV, 0, wm, wn,
                                                                      with_z, lane);
    cb.restage(smax);
    cb.set_walk(t0 + C, cb.unscale);
    return true;
  }
  __syncthreads();
  // The range's [dS_r | dz_r] over its own prefix slot (w.dstate == w.state:
  // read by the constructor, behind its barrier; no other block reads slot r).
  float* const part = a.workspace + w.dstate + cb.slot * kPart;
  for (int e = threadIdx.x; e < kPart; e += NT) part[e] = dsum[e];
  if constexpr (Tr::kLearned) write_slot<K>(dparams, a.workspace + cb.param_slot);
  return false;
}

template <class K>
__global__ void __launch_bounds__(K::threads, walk_min_blocks(
                                                  BackwardMmaTraits<K>::layout(BackwardKind::causal_dq).bytes()))
    mma_causal_dq_kernel(const __grid_constant__ BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  using CB = CausalRangeBlock<K, BackwardKind::causal_dq>;
  constexpr long long kPart = CB::kPart;
  const CB cb(args);
  float* const dsum = cb.smem + CB::LM.dsum;  // the range's [dS | dz], fp32
  for (int e = threadIdx.x; e < kPart; e += K::threads) dsum[e] = 0.0f;
  if (cb.range.begin >= cb.range.end) {  // an empty range: its zero partial and slot
    float* const part = args.workspace + cb.w.dstate + cb.slot * kPart;
    for (int e = threadIdx.x; e < kPart; e += K::threads) part[e] = 0.0f;
    if constexpr (Tr::kLearned) write_slot<K>(cb.dparams, args.workspace + cb.param_slot);
    return;
  }
  cb.set_walk(cb.range.begin, cb.unscale);  // its barrier also covers dsum
  while (mma_causal_dq_chunk<K>(args)) {
  }
}

// One chunk of the walk, not inlined into it: the block's walk state (next
// chunk, the state's unscale) comes from shared memory, so that nothing of
// the kernel's lives across the call, and returns false after the range's
// last chunk (having written the block's partials). Inlined into the walk's
// loop, the compiler hoisted the chunk's lane-dependent addresses out of the
// loop and ptxas spilled 156 bytes at the 128 registers that keep two blocks
// of 8 warps per SM on sm_90; a call keeps the chunk's registers its own.
template <class K>
__device__ __noinline__ bool mma_causal_dkv_chunk(const BackwardArgs& args) {
  using Tr = BackwardTraits<K>;
  using M = BackwardMmaTraits<K>;
  using T = typename K::T;
  using Op = typename M::Op;
  using CB = CausalRangeBlock<K, BackwardKind::causal_dkv>;
  constexpr int C = CB::C, D = K::D, DV = K::dv, NT = K::threads, PD = M::PD, PV = M::PV, CS = CB::CS, VS = M::VS;
  // phi(q)'s rows stay D floats apart here (phi(k)'s and dphi's are padded,
  // M::PS): padded too, ptxas needed a 16-byte stack frame on sm_90, where
  // this walk runs at 128 registers for two blocks per SM.
  constexpr int QS = D;
  constexpr MmaWarpTiling WD = M::kRowsByD, WV = M::kRowsByDv, WS = M::kDstate;
  constexpr BackwardMmaSmem LM = CB::LM;
  constexpr BackwardSmem L = CB::L;
  CB cb(args, /*stage=*/false);
  float* const smem = cb.smem;
  const BackwardWorkspace& w = cb.w;
  const BackwardArgs& a = args;
  const int bh = cb.bh, b = cb.bt, h = cb.h, off = cb.off;
  const long long ws_seq = cb.ws_seq;
  const int seq = cb.seq;
  float *const dz = cb.z, *const phi_q = cb.phi_q, *const phi_k = cb.phi_k, *const v = cb.v, *const g = cb.g;
  float *const A = cb.A, *const B = cb.B, *const den = cb.den, *const r = cb.r, *const dphi = cb.dphi;
  float* const dparams = cb.dparams;
  unsigned* const x_words = cb.x_words;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned* const phi_hw = reinterpret_cast<unsigned*>(smem + LM.phi_h);
  unsigned* const phi_lw = reinterpret_cast<unsigned*>(smem + LM.phi_lo);
  unsigned* const a_hw = reinterpret_cast<unsigned*>(smem + LM.a_h);
  unsigned* const a_lw = reinterpret_cast<unsigned*>(smem + LM.a_lo);
  unsigned* const r_hi = reinterpret_cast<unsigned*>(smem + LM.r_h);
  unsigned* const r_lo = reinterpret_cast<unsigned*>(smem + LM.r_lo);
  const Op* const s_hi = reinterpret_cast<const Op*>(smem + LM.s_h);
  const Op* const s_lo = reinterpret_cast<const Op*>(smem + LM.s_lo);
  const Op* const v_h = reinterpret_cast<const Op*>(smem + LM.a_h);  // V, then g (the update)
  const Op* const v_lo = reinterpret_cast<const Op*>(smem + LM.a_lo);
  const Op* const phi_hi = reinterpret_cast<const Op*>(smem + LM.phi_h);  // phi(k), then phi(q) (the update)
  const Op* const phi_lo = reinterpret_cast<const Op*>(smem + LM.phi_lo);
  T* const dv_out = static_cast<T*>(a.dv.data) + b * a.dv.stride_batch + h * a.dv.stride_head;
  const int span = cb.range.end - cb.range.begin;
  float* const walk = smem + LM.walk;  // [next chunk (int), unscale]
  const int t0 = reinterpret_cast<const int*>(walk)[0];
  const float unscale = walk[1];
  const int valid = min(C, cb.range.end - t0);
  const float* const params = cb.params;
  load_rows<T, NT>(a.q, b, h, off + t0, valid, valid, K::d, 0, K::d, smem + L.x);
  load_rows<T, NT, VS>(a.dout, b, h, off + t0, valid, valid, DV, 0, DV, g);
  for (int i = threadIdx.x; i < valid; i += NT)
    den[i] = K::normalize ? a.workspace[w.den + bh * ws_seq + t0 + i] : 1.0f;
  __syncthreads();
  backward_phi_tile<K, NT, QS>(smem + L.x, phi_q, smem + L.scratch, x_words, valid, C,
                                  FeatureContext{params, t0, seq, 1, 0.0f});
  load_rows<T, NT>(a.k, b, h, off + t0, valid, valid, K::d, 0, K::d, smem + L.x);
  load_rows<T, NT, VS>(a.v, b, h, off + t0, valid, valid, DV, 0, DV, v);
  __syncthreads();
  const FeatureContext ctx{params, t0, seq, 0, 0.0f};
  backward_phi_tile<K, NT, M::PS>(smem + L.x, phi_k, smem + L.scratch, x_words, valid, C, ctx);
  // r from mma_causal_dq_kernel; ends with a barrier: phi(k) is visible
  query_gradients<K, VS>(g, den, a.workspace + w.r + bh * ws_seq + t0, r, valid);
  mma_detail::masked_scores<Op, NT, C, CS, D, QS, M::PS>(phi_q, phi_k, A, valid, nullptr);  // as in dq
  mma_detail::masked_scores<Op, NT, C, CS, DV, VS>(g, v, B, valid, r);           // B_ij = g_i . v_j + r_i
  if constexpr (M::kSplitV)  // exact: fp16's 11 bits in bf16 hi + lo
    mma_detail::split_rows<NT, DV, PV, VS>(v, a_hw, a_lw, valid, C);
  else
    mma_detail::round_rows<T, NT, DV, PV, VS>(v, a_hw, valid, C);  // exact
  mma_detail::split_rows<NT, D, PD, M::PS>(phi_k, phi_hw, phi_lw, valid, C);
  __syncthreads();
  // dphi(k) = 2^a V dS~^T + B^T Phi_q + dz and dv = 2^a Phi_k dS~ + A^T G:
  // inter-chunk (as mma_dkv_kernel) and intra-chunk, both on mma.
  const auto dphi_epi = mma_detail::pair_epilogue([&](int j, int f, float x0, float x1) {
    if (j < valid) mma_detail::store_pair(dphi + j * M::PS + f, x0 + dz[f], x1 + dz[f + 1]);
  });
  const mma_detail::IntraChunkTerms<Op, C, CS, QS, true> dphi_intra{B, phi_q, valid, unscale};
  if constexpr (M::kSplitV) {
    const Op* const vs[3] = {v_h, v_h, v_lo};
    const Op* const ss[3] = {s_hi, s_lo, s_hi};
    mma_detail::row_tile_products<Op, WD.warps_m, WD.m_tiles_per_warp, WD.n_tiles_per_warp, DV, PV, PV, true>(
        vs, ss, warp % WD.warps_m, warp / WD.warps_m, lane, dphi_epi, dphi_intra);
  } else {
    const Op* const vs[2] = {v_h, v_h};
    const Op* const ss[2] = {s_hi, s_lo};
    mma_detail::row_tile_products<Op, WD.warps_m, WD.m_tiles_per_warp, WD.n_tiles_per_warp, DV, PV, PV, true>(
        vs, ss, warp % WD.warps_m, warp / WD.warps_m, lane, dphi_epi, dphi_intra);
  }
  const Op* const phis[3] = {phi_hi, phi_hi, phi_lo};
  const Op* const dss[3] = {s_hi, s_lo, s_hi};
  mma_detail::row_tile_products<Op, WV.warps_m, WV.m_tiles_per_warp, WV.n_tiles_per_warp, D, PD, PV, false>(
      phis, dss, warp % WV.warps_m, warp / WV.warps_m, lane,
      [&](int j, int c, float x) {
        if (j < valid) dv_out[(long long)(off + t0 + j) * a.dv.stride_seq + c] = from_float<T>(x);
      },
      mma_detail::IntraChunkTerms<Op, C, CS, VS, true>{A, g, valid, unscale});
  __syncthreads();
  M::FMB::template backward<NT>(smem + L.x, phi_k, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                smem + L.dx, dparams, smem + LM.jt);
  store_tile<K>(smem + L.dx, valid, K::d, a.dk, b, h, off + t0);
  if (t0 > cb.range.begin) {  // block-uniform: dS_>c-1 = dS_>c + Phi_q^T [G | r] for the chunk before
    __syncthreads();  // the J^T's staging (over phi_h ...) is free
    mma_detail::split_rows<NT, D, PD, QS>(phi_q, phi_hw, phi_lw, valid, C);
    mma_detail::split_rows<NT, DV, PV, VS>(g, a_hw, a_lw, valid, C);
    for (int e = threadIdx.x; e < C / 2; e += NT) {
      const float r0 = 2 * e < valid ? r[2 * e] : 0.0f, r1 = 2 * e + 1 < valid ? r[2 * e + 1] : 0.0f;
      mma_detail::split_bf16x2(r0, r1, r_hi[e], r_lo[e]);
    }
    __syncthreads();
    const int wm = warp % WS.warps_m, wn = warp / WS.warps_m;
    const bool with_z = wn == 0;  // warp-uniform: the dz tile
    float acc[WS.m_tiles_per_warp][WS.n_tiles_per_warp][4];
    float zacc[WS.m_tiles_per_warp][4];
    mma_detail::zero_state_accumulators(acc, zacc);
    mma_detail::split_dstate_products<Op, WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp, C, PD, PV>(
        acc, zacc, phi_hi, phi_lo, v_h, v_lo, r_hi, r_lo, wm, wn, with_z, lane);
    const float smax = mma_detail::write_state_partial<WS.warps_m, WS.m_tiles_per_warp, WS.n_tiles_per_warp,
                                                       /*kAdd=*/true>(acc, zacc, smem + L.state, D, DV, 0, wm, wn,
                                                                      with_z, lane);
    cb.restage(smax);
    cb.set_walk(t0 - C, cb.unscale);
    return true;
  }
  __syncthreads();
  if constexpr (Tr::kLearned) write_slot<K>(dparams, a.workspace + cb.param_slot);
  return false;
}

template <class K>
__global__ void __launch_bounds__(K::threads, walk_min_blocks(
                                                  BackwardMmaTraits<K>::layout(BackwardKind::causal_dkv).bytes()))
    mma_causal_dkv_kernel(const __grid_constant__ BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  using CB = CausalRangeBlock<K, BackwardKind::causal_dkv>;
  constexpr int C = CB::C;
  const CB cb(args);
  const int span = cb.range.end - cb.range.begin;
  if (span == 0) {  // an empty range: its zero slot
    if constexpr (Tr::kLearned) write_slot<K>(cb.dparams, args.workspace + cb.param_slot);
    return;
  }
  cb.set_walk(cb.range.begin + (span - 1) / C * C, cb.unscale);  // the range's last chunk first
  while (mma_causal_dkv_chunk<K>(args)) {
  }
}

}  // namespace lunajit
