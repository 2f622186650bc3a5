// Forward on tensor cores (mma.sync m16n8k16, bf16/fp16 operands, fp32
// accumulation): the TileConfig knob `mma` selects these kernels for the
// state and output roles (non-causal) and the causal_chunk role (causal, not
// performer: mma_causal_chunk_kernel at the end of this file) of a bf16/fp16
// spec (codegen/generator.cpp); fp32 specs keep the exact scalar kernels of
// linear_attention.cuh.
//
// mma_state_kernel, grid (batch*heads, splits (ForwardArgs::splits), dv blocks), as
// state_kernel: S_aug = Phi_k^T [V | 1] over the block's share of the
// sequence, i.e. S = Phi_k^T V and z = Phi_k^T 1 from the same A fragments
// (z is an n-tile whose B fragment is all ones). Phi_k (fp32 from the feature
// map) is rounded once to the I/O dtype into a padded tile; V is copied in its
// own dtype (exact). A = Phi_k^T by ldmatrix.x4.trans, B = V by
// ldmatrix.x4.trans (two n-tiles per load, b_tiles); the warps' accumulators
// stay in registers for the whole range and are written as the same fp32
// partials state_kernel writes.
//
// mma_output_kernel, grid (query tiles, batch*heads, dv blocks), as
// output_kernel: reads the state (partial 0: state_reduce_kernel summed the
// split partials into it in split order, fp32, deterministic), scales S and z by powers of two so that their largest
// magnitude lies in [1, 2) (exact; keeps fp16 in range whatever the sequence
// length), rounds them to the I/O dtype, then O = Phi_q S' and den = Phi_q z'
// on mma (A = Phi_q by ldmatrix.x4, B = S' by ldmatrix.x4.trans, two n-tiles
// per load; the denominator's B fragment is z' broadcast to all 8 columns, so every lane
// holds its rows' denominators without a shuffle); the epilogue undoes the
// scales and takes one reciprocal per row.
//
// Numerics (docs/MATH.md "Tensor-core forward"): phi(k), phi(q) and the
// reduced S, z are each rounded once to bf16/fp16 (relative 2^-8 / 2^-11);
// every product is exact in fp32 and every sum is fp32.
#pragma once

#include "lunajit/linear_attention.cuh"
#include "lunajit/feature_map_mma.cuh"
#include "lunajit/mma.cuh"

namespace lunajit {

template <class K>
struct MmaTraits {
  using T = typename K::T;
  static constexpr int W = K::threads / 32;
  static constexpr int PD = mma_row_halves(K::D);         // padded row of phi_h (elements)
  static constexpr int PV = mma_row_halves(K::dv_block);  // padded row of v_h and s_h
  static constexpr MmaWarpTiling kState = mma_warp_tiling(KernelKind::state, K::D, K::dv_block, K::block_tokens, W);
  static constexpr MmaWarpTiling kOutput =
      mma_warp_tiling(KernelKind::output, K::D, K::dv_block, K::block_tokens, W);
  static_assert(!mma::IsSame<T, float>::value, "the mma kernels take bf16 or fp16 I/O; fp32 specs use the scalar path");
  static_assert(K::D % 16 == 0 && K::dv_block % 16 == 0 && K::block_tokens % 16 == 0,
                "mma kernels need D, dv_block and block_tokens multiples of 16 (can_implement)");
  static_assert(kState.fits && kOutput.fits, "warps do not tile the mma products (can_implement)");
};

namespace mma_detail {

// acc[j] += A B_j for the NPW consecutive 8-column n-tiles of a 16-bit tile
// at `b` (row stride P; b at the warp's first column n0 and at k0):
//   kNMajor = false: B stored k-major (row k holds B's n values), so each
//     fragment comes from ldmatrix .trans;
//   kNMajor = true: B stored n-major (row n holds B's k values contiguously),
//     so ldmatrix without .trans gives the fragments (b0 = k 2t..2t+1,
//     b1 = k 2t+8.., n = g).
// Pairs of n-tiles share one .x4 (matrices: k 0-7 / 8-15 of tile j, then of
// tile j+1); an odd last tile takes an .x2 (lanes 16..31 repeat lanes 0..15's
// addresses, ignored).
template <class T, int NPW, int P, bool kNMajor = false>
LUNAJIT_DEVICE void b_tiles(float (*acc)[4], const unsigned (&a)[4], const T* b, int lm, int lr) {
  // The row of 8 16-bit values lane lr of matrix (n-tile nt, k half kh) points at.
  const auto row = [&](int nt, int kh) {
    return kNMajor ? b + (8 * nt + lr) * P + 8 * kh : b + (8 * kh + lr) * P + 8 * nt;
  };
#pragma unroll
  for (int j = 0; j + 1 < NPW; j += 2) {
    unsigned r[4];
    mma::ldmatrix<4, !kNMajor>(r, row(j + (lm >> 1), lm & 1));
    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
    mma::mma_m16n8k16<T>(acc[j], a, b0, acc[j]);
    mma::mma_m16n8k16<T>(acc[j + 1], a, b1, acc[j + 1]);
  }
  if constexpr (NPW % 2 == 1) {
    unsigned r[2];
    mma::ldmatrix<2, !kNMajor>(r, row(NPW - 1, lm & 1));
    mma::mma_m16n8k16<T>(acc[NPW - 1], a, r, acc[NPW - 1]);
  }
}

// The z column's B fragment of the state products: every column of that
// n-tile holds one value per token k (the forward's ones; the backward's r).
struct OnesColumn {
  unsigned ones;  // pack2(1, 1)
  LUNAJIT_DEVICE unsigned operator()(int) const { return ones; }
};
struct WordsColumn {
  const unsigned* words;  // (tokens / 2) packed 16-bit pairs, token k in word k / 2
  LUNAJIT_DEVICE unsigned operator()(int k) const { return words[k / 2]; }
};

// Zeroes a warp's state accumulators (S tiles and the z column's tile).
template <int MPW, int NPW>
LUNAJIT_DEVICE void zero_state_accumulators(float (&acc)[MPW][NPW][4], float (&zacc)[MPW][4]) {
#pragma unroll
  for (int i = 0; i < MPW; ++i) {
#pragma unroll
    for (int q = 0; q < 4; ++q) zacc[i][q] = 0.0f;
#pragma unroll
    for (int j = 0; j < NPW; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  }
}

// The state products of one token tile of Tk rows, S_aug += Phi^T [B | col]
// (m-tiles over the D features, n-tiles over B's columns): A = Phi^T by
// ldmatrix.x4.trans from the token-major phi_h (row stride PD), B from the
// token-major b_h (row stride PB, the warp's columns), the extra column's
// fragment from zcol (tokens k0 + 2t, k0 + 2t + 8: b0, b1). Used by the
// forward state pass ([V | 1]) and the backward's dstate ([G | r]).
template <class T, int WM, int MPW, int NPW, int Tk, int PD, int PB, class ZCol>
LUNAJIT_DEVICE void state_tile_products(float (*acc)[NPW][4], float (*zacc)[4], const T* phi_h, const T* b_h,
                                        int wm, int wn, bool with_z, int lane, const ZCol& zcol) {
  const int lm = lane >> 3, lr = lane & 7, t = lane & 3;
  for (int k0 = 0; k0 < Tk; k0 += 16) {
#pragma unroll
    for (int i = 0; i < MPW; ++i) {
      const int f0 = (wm + WM * i) * 16;
      // A = Phi^T (features x tokens): matrix m holds features f0 + 8(m&1),
      // tokens k0 + 8(m>>1); stored transposed (token rows) -> .trans.
      unsigned a[4];
      mma::ldmatrix<4, true>(a, phi_h + (k0 + 8 * (lm >> 1) + lr) * PD + f0 + 8 * (lm & 1));
      b_tiles<T, NPW, PB>(acc[i], a, b_h + k0 * PB + wn * NPW * 8, lm, lr);
      if (with_z) {
        const unsigned bz[2] = {zcol(k0 + 2 * t), zcol(k0 + 2 * t + 8)};
        mma::mma_m16n8k16<T>(zacc[i], a, bz, zacc[i]);
      }
    }
  }
}

// Writes a warp's state accumulators as an fp32 partial [D * ld | D]: S at
// (f, c0 + column) for columns < ld, and z (every column of the z tile holds
// it; lanes t == 0 write column 0). kAdd: adds them to the partial instead
// (each entry has one owner lane: the causal walks' state updates, in shared
// memory). There each lane adds its (c0, c1) or (c2, c3) pair as one 64-bit
// word, and step k of a row half takes n-tile (k + g) % NPW: a half-warp's 16
// pairs then lie in 16 distinct bank pairs (4 n-tiles x 4 t) where the
// fragment order (one n-tile per step, rows g at a stride of ld words) puts 8
// rows on the same banks (8-way conflicts). The global partials keep the
// fragment order (the selects cost the fp16 state pass 16 bytes of spills on sm_80).
// Returns, with kAdd, the largest |S| entry the lane wrote (fmaxf: NaN
// ignored), so that the walks' restaging need not read S again for its block
// max (scale_state_from_max); 0 otherwise.
template <int WM, int MPW, int NPW, bool kAdd = false>
LUNAJIT_DEVICE float write_state_partial(const float (*acc)[NPW][4], const float (*zacc)[4], float* part, int D,
                                        int ld, int c0, int wm, int wn, bool with_z, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float smax = 0.0f;
#pragma unroll
  for (int i = 0; i < MPW; ++i) {
    const int f0 = (wm + WM * i) * 16;
    if constexpr (!kAdd) {
#pragma unroll
      for (int j = 0; j < NPW; ++j) {
        const int n0 = (wn * NPW + j) * 8;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int f = f0 + g + 8 * (q >> 1), c = c0 + n0 + 2 * t + (q & 1);
          if (c < ld) part[(long long)f * ld + c] = acc[i][j][q];
        }
      }
      if (with_z && t == 0) {
        part[(long long)D * ld + f0 + g] = zacc[i][0];
        part[(long long)D * ld + f0 + g + 8] = zacc[i][2];
      }
    } else {
#pragma unroll
      for (int k = 0; k < NPW; ++k) {
        const int jr = (k + g) % NPW;  // lane-dependent: selected below without indexing registers
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v0 = acc[i][0][2 * h], v1 = acc[i][0][2 * h + 1];
#pragma unroll
          for (int j = 1; j < NPW; ++j)
            if (j == jr) {
              v0 = acc[i][j][2 * h];
              v1 = acc[i][j][2 * h + 1];
            }
          const int f = f0 + g + 8 * h, c = c0 + (wn * NPW + jr) * 8 + 2 * t;  // c, ld even: c + 1 < ld too
          if (c < ld) {
            float* const dst = part + (long long)f * ld + c;
            const float2 old = load_pair(dst);
            const float s0 = v0 + old.x, s1 = v1 + old.y;
            store_pair(dst, s0, s1);
            smax = fmaxf(smax, fmaxf(fabsf(s0), fabsf(s1)));
          }
        }
      }
      if (with_z && t == 0) {
        part[(long long)D * ld + f0 + g] += zacc[i][0];
        part[(long long)D * ld + f0 + g + 8] += zacc[i][2];
      }
    }
  }
  return smax;
}

// 2^-floor(log2 m) for a finite m > 0 (so m * scale lies in [1, 2)), else 1;
// exponents clamped so that both the scale and its inverse are normal floats.
LUNAJIT_DEVICE float pow2_scale(float m) {
  if (!(m > 0.0f) || m > 3.402823466e38f) return 1.0f;
  int e = (int)((__float_as_uint(m) >> 23) & 0xff);  // biased exponent of m
  e = e < 2 ? 2 : (e > 252 ? 252 : e);
  return __uint_as_float((unsigned)(254 - e) << 23);
}

// Whether rows of a 16-bit tensor starting at `base`, stride_seq elements
// apart, are all 16-byte aligned: what the cp.async row copies need
// (cp_async_rows); a strided view that breaks it takes the synchronous loads.
template <class T>
LUNAJIT_DEVICE bool rows_aligned16(const T* base, long long stride_seq) {
  return reinterpret_cast<unsigned long long>(base) % 16 == 0 && stride_seq % 8 == 0;
}

// cp.async copies of ROWS rows (rows src + r * stride_seq) of COLS 16-bit
// elements into dst (rows DST elements apart), 16 bytes at a time: rows >= n
// and, unless kWholeRows, columns >= cols_left zero-filled (no global read).
// Does not commit.
template <class T, int NT, int ROWS, int COLS, int DST, bool kWholeRows>
LUNAJIT_DEVICE void cp_async_rows(T* dst, const T* src, long long stride_seq, int n, int cols_left) {
  constexpr int kChunks = COLS / 8;  // 16-byte chunks a row
  for (int e = threadIdx.x; e < ROWS * kChunks; e += NT) {
    const int r = e / kChunks, c = 8 * (e - r * kChunks);
    const int bytes = r >= n ? 0 : kWholeRows ? 16 : 2 * max(0, min(8, cols_left - c));
    mma::cp_async_cg_zfill(dst + r * DST + c, bytes > 0 ? src + (long long)r * stride_seq + c : src, bytes);
  }
}
}  // namespace mma_detail

// Tk: the token tile, K::block_tokens for the non-causal state pass, K::chunk
// for the per-range states of the causal walks' super-chunk split (the
// forward's and the tensor-core backward's; ranges then start on chunk boundaries). kSplitPhi (the backward's state pass):
// phi from the fp32 map split into bf16 hi + lo tiles and both products
// summed, S = Phi_hi^T V + Phi_lo^T V, so that S is accurate to 2^-16
// relative instead of 2^-8 (docs/MATH.md "Tensor-core backward"). Its
// operands are bf16 whatever the I/O dtype: fp16 V, which bf16 holds exactly
// only as hi + lo (11 significant bits), adds the product Phi_hi^T V_lo.
template <class K, int Tk = K::block_tokens, bool kSplitPhi = false>
LUNAJIT_DEVICE void mma_state_block(const Problem& problem, const TensorRef& k_in, const TensorRef& v_in,
                                    const float* all_params, float key_stab, float* parts_base, int splits) {
  using Tr = KernelTraits<K>;
  using T = typename K::T;
  static constexpr bool kSplitV = kSplitPhi && !mma::IsSame<T, __nv_bfloat16>::value;  // fp16 V
  using Op = typename mma::Select<kSplitPhi, __nv_bfloat16, T>::type;                   // the mma operands
  constexpr int D = K::D, DVB = K::dv_block, NT = K::threads;
  constexpr int PD = mma_row_halves(D), PV = mma_row_halves(DVB);
  constexpr MmaWarpTiling W = mma_warp_tiling(KernelKind::state, D, DVB, Tk, NT / 32);
  static_assert(!mma::IsSame<T, float>::value, "the mma kernels take bf16 or fp16 I/O; fp32 specs use the scalar path");
  static_assert(D % 16 == 0 && DVB % 16 == 0 && Tk % 16 == 0,
                "mma kernels need D, dv_block and the token tile multiples of 16 (can_implement)");
  static_assert(W.fits, "warps do not tile the mma state product (can_implement)");
  constexpr bool kPipe = mma_state_pipelined(K::d, kSplitPhi);  // the cp.async double buffer
  constexpr MmaSmemLayout L = mma_smem_layout(KernelKind::state, Tr::dims(Tk), kSplitPhi, kSplitV, kPipe);
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const Op* phi_h = reinterpret_cast<const Op*>(smem + L.phi_h);  // (Tk, PD)
  const Op* phi_lo = reinterpret_cast<const Op*>(smem + L.phi_lo);  // (Tk, PD), kSplitPhi
  const Op* v_h = reinterpret_cast<const Op*>(smem + L.v_h);      // (Tk, PV)
  const Op* v_lo = reinterpret_cast<const Op*>(smem + L.v_lo);    // (Tk, PV), kSplitV
  const int bh = blockIdx.x, b = bh / problem.heads, h = bh % problem.heads;
  const int split = blockIdx.y, c0 = blockIdx.z * DVB, seq = problem.seq;
  const TokenRange range = split_range<K::state_splits>(seq, split, splits, Tk);
  const int s0 = range.begin, s1 = range.end;
  constexpr int parts_per_bh = K::state_splits;  // the first `splits` are this launch's
  const float* params = Tr::head_params(all_params, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % W.warps_m, wn = warp / W.warps_m;
  const bool with_z = wn == 0 && blockIdx.z == 0;  // warp-uniform
  const unsigned ones = mma_detail::pack2<Op>(1.0f, 1.0f);

  float acc[W.m_tiles_per_warp][W.n_tiles_per_warp][4];
  float zacc[W.m_tiles_per_warp][4];
  mma_detail::zero_state_accumulators(acc, zacc);
  const T* vbase = static_cast<const T*>(v_in.data) + b * v_in.stride_batch + h * v_in.stride_head;
  unsigned* v_words = reinterpret_cast<unsigned*>(smem + L.v_h);
  unsigned* v_lo_words = reinterpret_cast<unsigned*>(smem + L.v_lo);
  const MmaPhi<K> phi_map(params);  // the feature map's parameters, staged once per block
  const T* kbase = static_cast<const T*>(k_in.data) + b * k_in.stride_batch + h * k_in.stride_head;
  // The cp.async pipeline (kPipe) needs every row's 16-byte chunks aligned; a
  // strided view that breaks that takes the synchronous loads (block-uniform).
  const bool pipe = kPipe && mma_detail::rows_aligned16(kbase, k_in.stride_seq) &&
                    mma_detail::rows_aligned16(vbase + c0, v_in.stride_seq);
  // The pipeline's buffers: K's raw rows (Tk, d), converted to the fp32 x tile
  // as soon as they land, and two V tiles (Tk, PV), read by the products.
  T* const k_raw = reinterpret_cast<T*>(smem + L.k_raw);
  auto v_stage = [&](int st) { return reinterpret_cast<T*>(smem + (st ? L.v_h2 : L.v_h)); };
  // Issues the cp.async copies of the tile at t (rows past the range end and
  // columns past dv zero-filled) into k_raw and V tile st, and commits them as one group.
  auto issue = [&](int t, int st) {
    // The loops of cp_async_rows, written out: through it (base pointers
    // offset by t before the loops) ptxas spilled 12 B on sm_80 and sm_90
    // in the fp16 non-causal state pass.
    const int n = min(Tk, s1 - t);
    constexpr int KC = K::d / 8, VC = DVB / 8;  // 16-byte chunks a row
    for (int e = threadIdx.x; e < Tk * KC; e += NT) {
      const int r = e / KC, c = 8 * (e - r * KC);
      const bool in = r < n;
      mma::cp_async_cg_zfill(k_raw + r * K::d + c, in ? kbase + (long long)(t + r) * k_in.stride_seq + c : kbase,
                             in ? 16 : 0);
    }
    T* vt = v_stage(st);
    for (int e = threadIdx.x; e < Tk * VC; e += NT) {
      const int r = e / VC, c = 8 * (e - r * VC);
      const int bytes = r < n ? 2 * max(0, min(8, K::dv - (c0 + c))) : 0;
      mma::cp_async_cg_zfill(vt + r * PV + c, bytes > 0 ? vbase + (long long)(t + r) * v_in.stride_seq + c0 + c : vbase,
                             bytes);
    }
    mma::cp_async_commit();
  };
  if (pipe && s0 < s1) issue(s0, 0);
  int stage = 0;
  for (int t0 = s0; t0 < s1; t0 += Tk, stage ^= 1) {
    const int valid = min(Tk, s1 - t0);
    const Op* v_cur = v_h;
    if (pipe) {
      mma::cp_async_wait<0>();
      __syncthreads();  // every thread's copies of this tile are visible
      for (int e = threadIdx.x; e < valid * K::d; e += NT) smem[L.x + e] = to_float(k_raw[e]);
      v_cur = reinterpret_cast<const Op*>(v_stage(stage));
      __syncthreads();  // k_raw is free
      // The next tile's copies overlap this tile's map and products: k_raw is
      // converted, and V tile stage ^ 1 was last read in the previous
      // iteration, which ended with a barrier.
      if (t0 + Tk < s1) issue(t0 + Tk, stage ^ 1);
    } else {
      load_rows<T, NT>(k_in, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
      // V in its own dtype (exact), zero past the range end and past dv.
      for (int e = threadIdx.x; e < Tk * (DVB / 2); e += NT) {
        const int r = e / (DVB / 2), c = 2 * (e - r * (DVB / 2));
        float lo = 0.0f, hi = 0.0f;
        if (r < valid) {
          const T* row = vbase + (long long)(t0 + r) * v_in.stride_seq + c0;
          if (c0 + c < K::dv) lo = to_float(row[c]);
          if (c0 + c + 1 < K::dv) hi = to_float(row[c + 1]);
        }
        if constexpr (kSplitV)  // exact: fp16's 11 bits in bf16 hi + lo
          mma_detail::split_bf16x2(lo, hi, v_words[(r * PV + c) / 2], v_lo_words[(r * PV + c) / 2]);
        else
          v_words[(r * PV + c) / 2] = mma_detail::pack2<T>(lo, hi);  // exact: lo, hi are T values
      }
    }
    __syncthreads();
    const FeatureContext ctx{params, t0, seq, 0, key_stab};
    if constexpr (kSplitPhi && MmaPhiSupport<typename K::FeatureMap, T>::value) {
      // phi to fp32 level on tensor cores, split straight into the hi + lo
      // tiles; x's bf16 copy in the fp32 phi tile (MmaPhiSupport: it fits).
      unsigned* hi = reinterpret_cast<unsigned*>(smem + L.phi_h);
      unsigned* lo = reinterpret_cast<unsigned*>(smem + L.phi_lo);
      mma_phi_split_tile<K, NT>(params, smem + L.x, reinterpret_cast<unsigned*>(smem + L.phi), smem + L.scratch, valid,
                                Tk, [&](int r, int f, float v0, float v1) {
                                  mma_detail::split_bf16x2(v0, v1, hi[(r * PD + f) / 2], lo[(r * PD + f) / 2]);
                                });
    } else if constexpr (kSplitPhi) {
      K::FeatureMap::template apply<NT>(smem + L.x, smem + L.phi, smem + L.scratch, valid, ctx);
      __syncthreads();
      mma_detail::split_rows<NT, D, PD>(smem + L.phi, reinterpret_cast<unsigned*>(smem + L.phi_h),
                                        reinterpret_cast<unsigned*>(smem + L.phi_lo), valid, Tk);
    } else {
      phi_map.template tile<NT>(smem + L.x, smem + L.phi, smem + L.scratch,
                                reinterpret_cast<unsigned*>(smem + L.phi_h), valid, Tk, ctx);
    }
    __syncthreads();
    mma_detail::state_tile_products<Op, W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp, Tk, PD, PV>(
        acc, zacc, phi_h, v_cur, wm, wn, with_z, lane, mma_detail::OnesColumn{ones});
    if constexpr (kSplitPhi)
      mma_detail::state_tile_products<Op, W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp, Tk, PD, PV>(
          acc, zacc, phi_lo, v_cur, wm, wn, with_z, lane, mma_detail::OnesColumn{ones});
    if constexpr (kSplitV)  // z has had both of phi's halves: no ones column here
      mma_detail::state_tile_products<Op, W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp, Tk, PD, PV>(
          acc, zacc, phi_h, v_lo, wm, wn, /*with_z=*/false, lane, mma_detail::OnesColumn{ones});
    __syncthreads();
  }
  float* part = parts_base + ((long long)bh * parts_per_bh + split) * ((long long)D * K::dv + D);
  mma_detail::write_state_partial<W.warps_m, W.m_tiles_per_warp, W.n_tiles_per_warp>(acc, zacc, part, D, K::dv, c0, wm,
                                                                                   wn, with_z, lane);
}

template <class K>
__global__ void __launch_bounds__(K::threads) mma_state_kernel(const ForwardArgs args) {
  const int bh = blockIdx.x;
  // Packed variable-length batches: sequence b's tokens (as state_kernel).
  const SeqSpan sp = sequence_span(args.cu_seqlens, bh / args.problem.heads, args.problem.seq);
  const ForwardArgs a = sequence_args<K>(args, sp);
  const Problem problem{a.problem.batch, a.problem.heads, sp.len};
  float* parts = a.workspace + forward_workspace_state_offset(a.problem.batch * a.problem.heads);
  if constexpr (K::causal)  // the causal walk's per-range states (mma_causal_chunk_kernel)
    mma_state_block<K, K::chunk>(problem, a.k, a.v, a.params, 0.0f, parts, split_count<K>(a));
  else
    mma_state_block<K>(problem, a.k, a.v, a.params, K::performer ? a.workspace[bh] : 0.0f, parts, split_count<K>(a));
}

template <class K>
__global__ void __launch_bounds__(K::threads) mma_output_kernel(const ForwardArgs args) {
  using Tr = KernelTraits<K>;
  using M = MmaTraits<K>;
  using T = typename K::T;
  constexpr int Tk = K::block_tokens, D = K::D, DVB = K::dv_block, NT = K::threads;
  constexpr int PD = M::PD, PV = M::PV, NW = NT / 32;
  constexpr MmaWarpTiling W = M::kOutput;
  constexpr MmaSmemLayout L = mma_smem_layout(KernelKind::output, Tr::dims(Tk));
  constexpr long long kPart = (long long)D * K::dv + D;
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.y, b = bh / args.problem.heads, h = bh % args.problem.heads;
  // Packed variable-length batches: sequence b's tokens (as output_kernel).
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const ForwardArgs a = sequence_args<K>(args, sp);
  const int t0 = blockIdx.x * Tk, c0 = blockIdx.z * DVB, seq = sp.len;
  const int valid = min(Tk, seq - t0);
  if (valid <= 0) return;  // a tile past the end of a shorter packed sequence (whole block)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The query tile's raw 16-bit rows are fetched with cp.async into the phi
  // tile (free until the map) while the block reads the state, then
  // converted to the fp32 x tile; rows that are not 16-byte aligned (a strided
  // view) are loaded after the state as before (block-uniform).
  constexpr bool kQPipe = K::d % 8 == 0 && 2 * K::D >= K::d;  // whole 16-byte chunks; the raw tile fits phi
  const T* qbase = static_cast<const T*>(a.q.data) + b * a.q.stride_batch + h * a.q.stride_head;
  const bool q_pipe = kQPipe && mma_detail::rows_aligned16(qbase, a.q.stride_seq);
  T* const q_raw = reinterpret_cast<T*>(smem + L.phi);
  if (q_pipe) {
    constexpr int QC = K::d / 8;  // 16-byte chunks a row
    for (int e = threadIdx.x; e < valid * QC; e += NT) {
      const int r = e / QC, c = 8 * (e - r * QC);
      mma::cp_async_cg(q_raw + r * K::d + c, qbase + (long long)(t0 + r) * a.q.stride_seq + c);
    }
    mma::cp_async_commit();
  }
  // The state: partial 0, summed over the splits by state_reduce_kernel.
  const float* state = a.workspace + forward_workspace_state_offset(a.problem.batch * a.problem.heads) +
                       (long long)bh * K::state_splits * kPart;
  float* S = smem + L.state;  // (D, DVB) fp32
  float* z = smem + L.z;      // (D) fp32
  float* red = smem + L.reduce;
  // The state's dv block, and each thread's largest magnitudes.
  float smax = 0.0f, zmax = 0.0f;
  for (int e = threadIdx.x; e < D * DVB; e += NT) {
    const int f = e / DVB, c = e - f * DVB;
    const float s = c0 + c < K::dv ? state[f * K::dv + c0 + c] : 0.0f;
    S[e] = s;
    smax = fmaxf(smax, fabsf(s));
  }
  for (int f = threadIdx.x; f < D; f += NT) {
    const float s = state[D * K::dv + f];
    z[f] = s;
    zmax = fmaxf(zmax, fabsf(s));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, o));
    zmax = fmaxf(zmax, __shfl_xor_sync(0xffffffffu, zmax, o));
  }
  if (lane == 0) {
    red[warp] = smax;
    red[NW + warp] = zmax;
  }
  if (q_pipe) {
    mma::cp_async_wait<0>();
    __syncthreads();  // every thread's copies are visible
    for (int e = threadIdx.x; e < valid * K::d; e += NT) smem[L.x + e] = to_float(q_raw[e]);
  } else {
    load_rows<T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
  }
  __syncthreads();
  smax = red[0];
  zmax = red[NW];
  for (int w = 1; w < NW; ++w) {
    smax = fmaxf(smax, red[w]);
    zmax = fmaxf(zmax, red[NW + w]);
  }
  const float s_scale = mma_detail::pow2_scale(smax), z_scale = mma_detail::pow2_scale(zmax);
  unsigned* s_words = reinterpret_cast<unsigned*>(smem + L.s_h);
  for (int e = threadIdx.x; e < D * (DVB / 2); e += NT) {
    const int f = e / (DVB / 2), c = 2 * (e - f * (DVB / 2));
    const float2 p = mma_detail::load_pair(S + f * DVB + c);
    s_words[(f * PV + c) / 2] = mma_detail::pack2<T>(p.x * s_scale, p.y * s_scale);
  }
  unsigned* z_words = reinterpret_cast<unsigned*>(smem + L.z_h);
  for (int e = threadIdx.x; e < D / 2; e += NT) {
    const float2 p = mma_detail::load_pair(z + 2 * e);
    z_words[e] = mma_detail::pack2<T>(p.x * z_scale, p.y * z_scale);
  }
  const FeatureContext ctx{Tr::head_params(a.params, h), t0, seq, 1, 0.0f};
  const MmaPhi<K> phi_map(ctx.params);
  phi_map.template tile<NT>(smem + L.x, smem + L.phi, smem + L.scratch, reinterpret_cast<unsigned*>(smem + L.phi_h),
                            valid, Tk, ctx);
  __syncthreads();

  const T* phi_h = reinterpret_cast<const T*>(smem + L.phi_h);  // (Tk, PD)
  const T* s_h = reinterpret_cast<const T*>(smem + L.s_h);      // (D, PV)
  const int wm = warp % W.warps_m, wn = warp / W.warps_m;
  const int lm = lane >> 3, lr = lane & 7, g = lane >> 2, t = lane & 3;
  const float s_unscale = 1.0f / s_scale, z_unscale = 1.0f / z_scale;  // powers of two: exact
  typename K::T* out = static_cast<typename K::T*>(a.o.data) + b * a.o.stride_batch + h * a.o.stride_head;
  for (int i = 0; i < W.m_tiles_per_warp; ++i) {
    const int m0 = (wm + W.warps_m * i) * 16;
    float acc[W.n_tiles_per_warp][4];
    float dacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < W.n_tiles_per_warp; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      // A = Phi_q (tokens x features): matrix m holds rows m0 + 8(m&1), features k0 + 8(m>>1).
      unsigned af[4];
      mma::ldmatrix<4, false>(af, phi_h + (m0 + 8 * (lm & 1) + lr) * PD + k0 + 8 * (lm >> 1));
      mma_detail::b_tiles<T, W.n_tiles_per_warp, PV>(acc, af, s_h + k0 * PV + wn * W.n_tiles_per_warp * 8, lm, lr);
      if constexpr (K::normalize) {
        // B = z' in every column: b0 = z'(k0+2t, k0+2t+1), b1 = z'(k0+2t+8, +9).
        const unsigned bz[2] = {z_words[(k0 + 2 * t) / 2], z_words[(k0 + 2 * t + 8) / 2]};
        mma::mma_m16n8k16<T>(dacc, af, bz, dacc);
      }
    }
    // C fragment: q = 0,1 row m0+g, q = 2,3 row m0+g+8; columns n0 + 2t + (q&1).
    float rinv[2] = {s_unscale, s_unscale};
    if constexpr (K::normalize) {
      rinv[0] = s_unscale / fmaf(dacc[0], z_unscale, K::eps);
      rinv[1] = s_unscale / fmaf(dacc[2], z_unscale, K::eps);
    }
#pragma unroll
    for (int j = 0; j < W.n_tiles_per_warp; ++j) {
      const int n0 = (wn * W.n_tiles_per_warp + j) * 8;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = m0 + g + 8 * (q >> 1), c = c0 + n0 + 2 * t + (q & 1);
        if (r < valid && c < K::dv)
          out[(long long)(t0 + r) * a.o.stride_seq + c] = from_float<T>(acc[j][q] * rinv[q >> 1]);
      }
    }
  }
}

namespace mma_detail {
// The causal walk's cp.async prefetch (mma_causal_pipelined) runs only where
// Q's, K's and V's rows of this block are 16-byte aligned (block-uniform).
template <class K>
LUNAJIT_DEVICE bool causal_prefetch_aligned(const ForwardArgs& a, int b, int h, int c0) {
  using T = typename K::T;
  if constexpr (!mma_causal_pipelined(K::d)) {
    return false;
  } else {
    const T* q = static_cast<const T*>(a.q.data) + b * a.q.stride_batch + h * a.q.stride_head;
    const T* k = static_cast<const T*>(a.k.data) + b * a.k.stride_batch + h * a.k.stride_head;
    const T* v = static_cast<const T*>(a.v.data) + b * a.v.stride_batch + h * a.v.stride_head + c0;
    return rows_aligned16(q, a.q.stride_seq) && rows_aligned16(k, a.k.stride_seq) && rows_aligned16(v, a.v.stride_seq);
  }
}

// Issues the cp.async copies of the chunk at token t of this block's
// sequence into the raw tiles q_raw, k_raw (chunk, d) and v_raw (chunk,
// dv_block) (rows past the sequence end and columns past dv zero-filled) and
// commits them as one group. Not inlined, and reading the kernel's
// parameters (and blockIdx) itself: inlined into the walk, which runs at 255
// registers, its pointers lived across the whole walk and ptxas spilled 28
// bytes on sm_90.
template <class K>
__device__ __noinline__ void causal_prefetch(const ForwardArgs& args, int t) {
  using T = typename K::T;
  constexpr int C = K::chunk, DVB = K::dv_block, NT = K::threads;
  constexpr MmaSmemLayout L = mma_smem_layout(KernelKind::causal_chunk, KernelTraits<K>::dims(C));
  float* const smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads, c0 = blockIdx.y * DVB;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const int bt = args.cu_seqlens != nullptr ? 0 : b;  // packed: (0, offset + t)
  const long long t_abs = sp.offset + t;
  const int n = min(C, sp.len - t);
  const T* const qbase = static_cast<const T*>(args.q.data) + bt * args.q.stride_batch + h * args.q.stride_head +
                         t_abs * args.q.stride_seq;
  const T* const kbase = static_cast<const T*>(args.k.data) + bt * args.k.stride_batch + h * args.k.stride_head +
                         t_abs * args.k.stride_seq;
  const T* const vbase = static_cast<const T*>(args.v.data) + bt * args.v.stride_batch + h * args.v.stride_head +
                         t_abs * args.v.stride_seq + c0;
  T* const q_raw = reinterpret_cast<T*>(smem + L.q_raw);
  T* const k_raw = reinterpret_cast<T*>(smem + L.k_raw);
  T* const v_raw = reinterpret_cast<T*>(smem + L.v_raw);
  cp_async_rows<T, NT, C, K::d, K::d, true>(q_raw, qbase, args.q.stride_seq, n, K::d);
  cp_async_rows<T, NT, C, K::d, K::d, true>(k_raw, kbase, args.k.stride_seq, n, K::d);
  cp_async_rows<T, NT, C, DVB, DVB, false>(v_raw, vbase, args.v.stride_seq, n, K::dv - c0);
  mma::cp_async_commit();
}
}  // namespace mma_detail

// Causal forward on tensor cores (docs/MATH.md "Tensor-core causal forward"),
// grid (batch*heads, dv blocks, ranges: 1 unless split, below) as
// causal_chunk_kernel: one block walks its chunks in order. Per chunk of C tokens:
//   1. phi(q), phi(k) (MmaPhi: on mma for LUNA bf16, else the fp32 map)
//      rounded once to T into padded tiles phi_h, phi_k_h; V copied in T
//      (exact) into v_h.
//   2. The fp32 master state (S, z) of the chunks before, held in the state
//      tiling's registers (as mma_state_block), scaled by powers of two so its
//      largest magnitude lies in [1, 2) and rounded to T into s_h, z_h.
//   3. Each warp, per 16-row query tile m0:
//        acc  = Phi_q S' / s_scale,  dacc = Phi_q z' / z_scale  (inter-chunk,
//        on mma; the unscaling by a power of two is exact);
//      then the strip A = Phi_q Phi_k^T (16 x C, fp32 C fragments; B = Phi_k
//      by ldmatrix.x4 without .trans), masked to j <= i. One power of two r_i
//      per row brings the row's largest |A_ij|, |acc|, |dacc| into [1, 2) (a
//      quad shuffle): r A is packed into 16-bit A fragments (the C fragments
//      of two adjacent n-tiles are the A fragment of one k16 step: no shared
//      memory round trip; fp16 cannot overflow, and no product of scales can),
//        acc *= r_i, dacc *= r_i;  acc += (r A) V,  dacc += (r A) 1  (on mma)
//      and o_i = acc / (dacc + eps r_i). n-tiles and k16 steps past the
//      diagonal are skipped (masked to zero anyway).
//   4. S += Phi_k^T V, z += Phi_k^T 1 on mma into the master registers.
// With mma_causal_pipelined (d a multiple of 8, rows 16-byte aligned at run
// time) the chunk's raw Q, K, V rows were copied with cp.async during the
// chunk before's steps 3 and 4 (the first chunk's before the walk), and
// step 1 converts them from shared memory: one load round trip a chunk is
// hidden behind the products instead of two exposed (the cost model's
// pipeline_stages = 2).
// With the super-chunk split (R = K::state_splits > 1 compiled; grid z = nr =
// ForwardArgs::splits <= R ranges of ceil(chunks / nr) chunks) block r walks only range r, its master state seeded
// with the carried state plus the fp32 states of ranges 0 .. r-1 (mma_state_kernel
// on chunk tiles, launched first), summed in range order; only the last range
// writes the final state.
// Every sum is fp32 in a fixed order (deterministic); the causal performer
// (running key stabiliser) is not implemented here (can_implement). Carried
// state (initial_S/z seed the master registers, final_S/z receive them) and
// packed sequences (cu_seqlens) as causal_chunk_kernel (docs/MATH.md §1a, §3).
template <class K>
__global__ void __launch_bounds__(K::threads) mma_causal_chunk_kernel(const __grid_constant__ ForwardArgs args) {
  using Tr = KernelTraits<K>;
  using T = typename K::T;
  static_assert(!K::performer, "the causal performer has no tensor-core kernel (can_implement)");
  static_assert(!mma::IsSame<T, float>::value, "the mma kernels take bf16 or fp16 I/O; fp32 specs use the scalar path");
  constexpr int C = K::chunk, D = K::D, DVB = K::dv_block, NT = K::threads, NW = NT / 32;
  static_assert(D % 16 == 0 && DVB % 16 == 0 && C % 16 == 0,
                "mma kernels need D, dv_block and chunk multiples of 16 (can_implement)");
  constexpr int PD = mma_row_halves(D), PV = mma_row_halves(DVB);
  constexpr MmaWarpTiling WS = mma_warp_tiling(KernelKind::state, D, DVB, C, NW);
  constexpr MmaWarpTiling WO = mma_warp_tiling(KernelKind::output, D, DVB, C, NW);
  static_assert(WS.fits && WO.fits, "warps do not tile the mma products (can_implement)");
  constexpr int CN = C / 8;  // n-tiles of one A strip
  constexpr MmaSmemLayout L = mma_smem_layout(KernelKind::causal_chunk, Tr::dims(C));
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const T* phi_h = reinterpret_cast<const T*>(smem + L.phi_h);      // (C, PD): phi(q)
  const T* phi_k_h = reinterpret_cast<const T*>(smem + L.phi_k_h);  // (C, PD): phi(k)
  const T* v_h = reinterpret_cast<const T*>(smem + L.v_h);          // (C, PV)
  const T* s_h = reinterpret_cast<const T*>(smem + L.s_h);          // (D, PV)
  unsigned* v_words = reinterpret_cast<unsigned*>(smem + L.v_h);
  unsigned* v_lo_words = reinterpret_cast<unsigned*>(smem + L.v_lo);
  unsigned* s_words = reinterpret_cast<unsigned*>(smem + L.s_h);
  unsigned* z_words = reinterpret_cast<unsigned*>(smem + L.z_h);
  float* red = smem + L.reduce;
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads;
  // Packed variable-length batches: sequence b's tokens (as causal_chunk_kernel).
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const ForwardArgs a = sequence_args<K>(args, sp);
  const int c0 = blockIdx.y * DVB, seq = sp.len;
  // This block's range of chunks (all of them unless the super-chunk split is on).
  constexpr int R = K::state_splits;
  const int nr = R > 1 ? split_count<K>(a) : 1;  // this launch's ranges
  const int r = R > 1 ? (int)blockIdx.z : 0;
  const int per_range = R > 1 ? ((seq + C - 1) / C + nr - 1) / nr : 0;
  const int t_begin = R > 1 ? min(seq, r * per_range * C) : 0;
  const int t_end = R > 1 ? min(seq, t_begin + per_range * C) : seq;
  const float* params = Tr::head_params(a.params, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int lm = lane >> 3, lr = lane & 7, g = lane >> 2, t = lane & 3;
  const bool carried = a.initial_S != nullptr || a.initial_z != nullptr;  // docs/MATH.md §1a
  // State tiling (master S, z) and output tiling (query tiles) of this warp.
  const int sm_ = warp % WS.warps_m, sn = warp / WS.warps_m;
  const bool with_z = sn == 0;  // warp-uniform; z is needed by every dv block here
  const int om = warp % WO.warps_m, on = warp / WO.warps_m;
  const unsigned ones = mma_detail::pack2<T>(1.0f, 1.0f);
  const T* vbase = static_cast<const T*>(a.v.data) + b * a.v.stride_batch + h * a.v.stride_head;
  T* out = static_cast<T*>(a.o.data) + b * a.o.stride_batch + h * a.o.stride_head;
  // The cp.async prefetch (mma_causal_pipelined): chunk c + 1's raw Q, K and
  // V rows are copied while chunk c's products (steps 3 and 4) run. It needs
  // every row's 16-byte chunks aligned; a strided view that breaks that takes
  // the synchronous loads (block-uniform).
  const bool pipe = mma_detail::causal_prefetch_aligned<K>(a, b, h, c0);
  const T* const q_raw = reinterpret_cast<const T*>(smem + L.q_raw);
  const T* const k_raw = reinterpret_cast<const T*>(smem + L.k_raw);
  const unsigned* const v_raw = reinterpret_cast<const unsigned*>(smem + L.v_raw);

  // The master state, seeded with the carried state [batch*heads, D, dv] /
  // [batch*heads, D] when given (zero otherwise); C fragment positions: row
  // f0 + g + 8(q>>1), column n0 + 2t + (q&1); every column of the z tile is z.
  float sacc[WS.m_tiles_per_warp][WS.n_tiles_per_warp][4];
  float zacc[WS.m_tiles_per_warp][4];
#pragma unroll
  for (int i = 0; i < WS.m_tiles_per_warp; ++i) {
    const int f0 = (sm_ + WS.warps_m * i) * 16;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int f = f0 + g + 8 * (q >> 1);
      zacc[i][q] = with_z && a.initial_z != nullptr ? a.initial_z[(long long)bh * D + f] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < WS.n_tiles_per_warp; ++j) {
      const int n0 = (sn * WS.n_tiles_per_warp + j) * 8;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int f = f0 + g + 8 * (q >> 1), c = c0 + n0 + 2 * t + (q & 1);
        sacc[i][j][q] = a.initial_S != nullptr && c < K::dv ? a.initial_S[((long long)bh * D + f) * K::dv + c] : 0.0f;
      }
    }
  }

  // Super-chunk split (R = K::state_splits > 1, nr ranges): block r walks range r of the
  // chunks, seeded with the carried state plus the states of ranges 0 .. r-1
  // (written by mma_state_kernel, chunk tiles, same range bounds), summed in
  // range order (fixed: deterministic).
  if (R > 1 && r > 0) {
    constexpr long long kPart = (long long)D * K::dv + D;
    const float* parts = a.workspace + forward_workspace_state_offset(a.problem.batch * a.problem.heads) +
                         (long long)bh * R * kPart;
    for (int p = 0; p < r; ++p) {
#pragma unroll
      for (int i = 0; i < WS.m_tiles_per_warp; ++i) {
        const int f0 = (sm_ + WS.warps_m * i) * 16;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int f = f0 + g + 8 * (q >> 1);
          if (with_z) zacc[i][q] += parts[p * kPart + (long long)D * K::dv + f];
        }
#pragma unroll
        for (int j = 0; j < WS.n_tiles_per_warp; ++j) {
          const int n0 = (sn * WS.n_tiles_per_warp + j) * 8;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int f = f0 + g + 8 * (q >> 1), c = c0 + n0 + 2 * t + (q & 1);
            if (c < K::dv) sacc[i][j][q] += parts[p * kPart + (long long)f * K::dv + c];
          }
        }
      }
    }
  }

  // The feature map's parameters are loaded per phi tile here (L1-resident
  // after the first chunk): kept across the chunk walk next to the master
  // state they would spill on sm_80.
  if (pipe && t_begin < t_end) mma_detail::causal_prefetch<K>(args, t_begin);
  for (int t0 = 0; t0 < t_end; t0 += C) {
    if (t0 < t_begin) continue;  // (from 0, not t_begin: ptxas then keeps the walk spill-free)
    const int valid = min(C, seq - t0);
    // 1a. phi(q) -> phi_h; this thread's largest |S|, |z| (the master state of the chunks before).
    if (pipe) {
      // The chunk's copies have landed (issued one chunk ahead); Q to the
      // fp32 x tile, V (zero-filled rows and columns) to v_h, which the
      // previous chunk last read before its closing barrier. The barrier
      // below (the warps' maxima) frees q_raw and v_raw for phi(q)'s map.
      mma::cp_async_wait<0>();
      __syncthreads();
      for (int e = threadIdx.x; e < valid * K::d; e += NT) smem[L.x + e] = to_float(q_raw[e]);
      for (int e = threadIdx.x; e < C * (DVB / 2); e += NT) {
        const int r = e / (DVB / 2), c = 2 * (e - r * (DVB / 2));
        v_words[(r * PV + c) / 2] = v_raw[(r * DVB + c) / 2];
      }
    } else {
      load_rows<T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    }
    float smax = 0.0f, zmax = 0.0f;
#pragma unroll
    for (int i = 0; i < WS.m_tiles_per_warp; ++i) {
#pragma unroll
      for (int q = 0; q < 4; ++q) zmax = fmaxf(zmax, fabsf(zacc[i][q]));
#pragma unroll
      for (int j = 0; j < WS.n_tiles_per_warp; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) smax = fmaxf(smax, fabsf(sacc[i][j][q]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, o));
      zmax = fmaxf(zmax, __shfl_xor_sync(0xffffffffu, zmax, o));
    }
    if (lane == 0) {
      red[warp] = smax;
      red[NW + warp] = zmax;
    }
    __syncthreads();
    MmaPhi<K>(params).template tile<NT>(smem + L.x, smem + L.phi, smem + L.scratch,
                                        reinterpret_cast<unsigned*>(smem + L.phi_h), valid, C,
                                        FeatureContext{params, t0, seq, 1, 0.0f});
    smax = red[0];
    zmax = red[NW];
    for (int w = 1; w < NW; ++w) {
      smax = fmaxf(smax, red[w]);
      zmax = fmaxf(zmax, red[NW + w]);
    }
    const float s_scale = mma_detail::pow2_scale(smax), z_scale = mma_detail::pow2_scale(zmax);
    const float s_unscale = 1.0f / s_scale, z_unscale = 1.0f / z_scale;  // powers of two: exact
    // 2. S' = S s_scale, z' = z z_scale in T, from the master registers (C fragment positions).
#pragma unroll
    for (int i = 0; i < WS.m_tiles_per_warp; ++i) {
      const int f0 = (sm_ + WS.warps_m * i) * 16;
#pragma unroll
      for (int j = 0; j < WS.n_tiles_per_warp; ++j) {
        const int n0 = (sn * WS.n_tiles_per_warp + j) * 8;
        s_words[((f0 + g) * PV + n0 + 2 * t) / 2] =
            mma_detail::pack2<T>(sacc[i][j][0] * s_scale, sacc[i][j][1] * s_scale);
        s_words[((f0 + g + 8) * PV + n0 + 2 * t) / 2] =
            mma_detail::pack2<T>(sacc[i][j][2] * s_scale, sacc[i][j][3] * s_scale);
      }
      // Every column of the ones tile is z: lane 4g holds features f0+g and
      // f0+g+8; lanes 4g (g even) pack them with lane 4(g+1)'s (whole words).
      const float z_lo_next = __shfl_down_sync(0xffffffffu, zacc[i][0], 4);
      const float z_hi_next = __shfl_down_sync(0xffffffffu, zacc[i][2], 4);
      if (with_z && t == 0 && (g & 1) == 0) {
        z_words[(f0 + g) / 2] = mma_detail::pack2<T>(zacc[i][0] * z_scale, z_lo_next * z_scale);
        z_words[(f0 + g + 8) / 2] = mma_detail::pack2<T>(zacc[i][2] * z_scale, z_hi_next * z_scale);
      }
    }
    __syncthreads();
    // 1b. phi(k) -> phi_k_h, V -> v_h (exact; zero past the chunk end and past dv).
    if (pipe) {
      for (int e = threadIdx.x; e < valid * K::d; e += NT) smem[L.x + e] = to_float(k_raw[e]);
    } else {
      load_rows<T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
      for (int e = threadIdx.x; e < C * (DVB / 2); e += NT) {
        const int r = e / (DVB / 2), c = 2 * (e - r * (DVB / 2));
        float lo = 0.0f, hi = 0.0f;
        if (r < valid) {
          const T* row = vbase + (long long)(t0 + r) * a.v.stride_seq + c0;
          if (c0 + c < K::dv) lo = to_float(row[c]);
          if (c0 + c + 1 < K::dv) hi = to_float(row[c + 1]);
        }
        v_words[(r * PV + c) / 2] = mma_detail::pack2<T>(lo, hi);
      }
    }
    __syncthreads();
    MmaPhi<K>(params).template tile<NT>(smem + L.x, smem + L.phi, smem + L.scratch,
                                        reinterpret_cast<unsigned*>(smem + L.phi_k_h), valid, C,
                                        FeatureContext{params, t0, seq, 0, 0.0f});
    __syncthreads();
    // The next chunk's copies overlap steps 3 and 4, which read only the
    // 16-bit operand tiles: x, phi and scratch (under q_raw, v_raw) are free
    // behind the barrier above, and k_raw was converted before it.
    if (pipe && t0 + C < t_end) mma_detail::causal_prefetch<K>(args, t0 + C);

    // 3. Output rows of this chunk.
    for (int i = 0; i < WO.m_tiles_per_warp; ++i) {
      const int m0 = (om + WO.warps_m * i) * 16;
      if (m0 >= valid) break;  // warp-uniform
      // Inter-chunk: acc = Phi_q S', dacc = Phi_q z' (scaled by s_scale, z_scale).
      float acc[WO.n_tiles_per_warp][4];
      float dacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < WO.n_tiles_per_warp; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
      if (t0 > 0 || carried) {
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
          unsigned af[4];
          mma::ldmatrix<4, false>(af, phi_h + (m0 + 8 * (lm & 1) + lr) * PD + k0 + 8 * (lm >> 1));
          mma_detail::b_tiles<T, WO.n_tiles_per_warp, PV>(acc, af, s_h + k0 * PV + on * WO.n_tiles_per_warp * 8,
                                                           lm, lr);
          if constexpr (K::normalize) {
            const unsigned bz[2] = {z_words[(k0 + 2 * t) / 2], z_words[(k0 + 2 * t + 8) / 2]};
            mma::mma_m16n8k16<T>(dacc, af, bz, dacc);
          }
        }
      }
      // Back to true magnitudes (powers of two: exact) and the rows' largest of them.
      float rmax[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < WO.n_tiles_per_warp; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc[j][q] *= s_unscale;
          rmax[q >> 1] = fmaxf(rmax[q >> 1], fabsf(acc[j][q]));
        }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        dacc[q] *= z_unscale;
        rmax[q >> 1] = fmaxf(rmax[q >> 1], fabsf(dacc[q]));
      }
      // A strip (16 x C) = Phi_q[m0:m0+16] Phi_k^T; n-tiles past the diagonal stay 0.
      float sa[CN][4];
#pragma unroll
      for (int j = 0; j < CN; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) sa[j][q] = 0.0f;
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        unsigned af[4];
        mma::ldmatrix<4, false>(af, phi_h + (m0 + 8 * (lm & 1) + lr) * PD + k0 + 8 * (lm >> 1));
#pragma unroll
        for (int j = 0; j < CN; j += 2) {
          if (8 * j > m0 + 15) break;  // both n-tiles past the diagonal (warp-uniform)
          // B = Phi_k^T (features x tokens), stored token-major: no .trans;
          // matrices: tokens 8j.. / features k0, k0+8, then tokens 8(j+1)...
          unsigned r[4];
          mma::ldmatrix<4, false>(r, phi_k_h + (8 * (j + (lm >> 1)) + lr) * PD + k0 + 8 * (lm & 1));
          const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
          mma::mma_m16n8k16<T>(sa[j], af, b0, sa[j]);
          mma::mma_m16n8k16<T>(sa[j + 1], af, b1, sa[j + 1]);
        }
      }
      // Mask j <= i (rows m0+g, m0+g+8; columns 8j + 2t + (q&1)).
#pragma unroll
      for (int j = 0; j < CN; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = m0 + g + 8 * (q >> 1), col = 8 * j + 2 * t + (q & 1);
          if (col > row) sa[j][q] = 0.0f;
          rmax[q >> 1] = fmaxf(rmax[q >> 1], fabsf(sa[j][q]));
        }
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {  // the quad holding the row
        rmax[0] = fmaxf(rmax[0], __shfl_xor_sync(0xffffffffu, rmax[0], o));
        rmax[1] = fmaxf(rmax[1], __shfl_xor_sync(0xffffffffu, rmax[1], o));
      }
      // Row scale r_i: the row's largest |A_ij|, |num_inter|, |den_inter| in [1, 2).
      const float rs[2] = {mma_detail::pow2_scale(rmax[0]), mma_detail::pow2_scale(rmax[1])};
      unsigned pa[CN / 2][4];  // r A as A fragments, one per k16 step of tokens
#pragma unroll
      for (int kk = 0; kk < CN / 2; ++kk) {
        pa[kk][0] = mma_detail::pack2<T>(sa[2 * kk][0] * rs[0], sa[2 * kk][1] * rs[0]);
        pa[kk][1] = mma_detail::pack2<T>(sa[2 * kk][2] * rs[1], sa[2 * kk][3] * rs[1]);
        pa[kk][2] = mma_detail::pack2<T>(sa[2 * kk + 1][0] * rs[0], sa[2 * kk + 1][1] * rs[0]);
        pa[kk][3] = mma_detail::pack2<T>(sa[2 * kk + 1][2] * rs[1], sa[2 * kk + 1][3] * rs[1]);
      }
#pragma unroll
      for (int j = 0; j < WO.n_tiles_per_warp; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] *= rs[q >> 1];
#pragma unroll
      for (int q = 0; q < 4; ++q) dacc[q] *= rs[q >> 1];
      // Intra-chunk: (r A) [V | 1], k16 steps over the chunk's tokens up to the diagonal.
#pragma unroll
      for (int kk = 0; kk < CN / 2; ++kk) {
        if (16 * kk > m0) break;  // warp-uniform: all masked
        mma_detail::b_tiles<T, WO.n_tiles_per_warp, PV>(acc, pa[kk],
                                                         v_h + 16 * kk * PV + on * WO.n_tiles_per_warp * 8, lm, lr);
        if constexpr (K::normalize) {
          const unsigned bz[2] = {ones, ones};
          mma::mma_m16n8k16<T>(dacc, pa[kk], bz, dacc);
        }
      }
      float rinv[2] = {1.0f / rs[0], 1.0f / rs[1]};
      if constexpr (K::normalize) {
        rinv[0] = 1.0f / fmaf(K::eps, rs[0], dacc[0]);
        rinv[1] = 1.0f / fmaf(K::eps, rs[1], dacc[2]);
      }
#pragma unroll
      for (int j = 0; j < WO.n_tiles_per_warp; ++j) {
        const int n0 = (on * WO.n_tiles_per_warp + j) * 8;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = m0 + g + 8 * (q >> 1), c = c0 + n0 + 2 * t + (q & 1);
          if (r < valid && c < K::dv)
            out[(long long)(t0 + r) * a.o.stride_seq + c] = from_float<T>(acc[j][q] * rinv[q >> 1]);
        }
      }
    }

    // 4. Master state += Phi_k^T [V | 1] (registers only: no shared writes).
    for (int k0 = 0; k0 < C; k0 += 16) {
      if (k0 >= valid) break;  // rows past valid are zero
#pragma unroll
      for (int i = 0; i < WS.m_tiles_per_warp; ++i) {
        const int f0 = (sm_ + WS.warps_m * i) * 16;
        unsigned af[4];
        mma::ldmatrix<4, true>(af, phi_k_h + (k0 + 8 * (lm >> 1) + lr) * PD + f0 + 8 * (lm & 1));
        mma_detail::b_tiles<T, WS.n_tiles_per_warp, PV>(sacc[i], af, v_h + k0 * PV + sn * WS.n_tiles_per_warp * 8,
                                                         lm, lr);
        if (with_z) {
          const unsigned bz[2] = {ones, ones};
          mma::mma_m16n8k16<T>(zacc[i], af, bz, zacc[i]);
        }
      }
    }
    __syncthreads();
  }
  // The final state (null pointers: not written), from the last range's
  // blocks; z from the first dv block.
  if ((int)blockIdx.z != nr - 1) return;
#pragma unroll
  for (int i = 0; i < WS.m_tiles_per_warp; ++i) {
    const int f0 = (sm_ + WS.warps_m * i) * 16;
    if (a.final_S != nullptr) {
#pragma unroll
      for (int j = 0; j < WS.n_tiles_per_warp; ++j) {
        const int n0 = (sn * WS.n_tiles_per_warp + j) * 8;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int f = f0 + g + 8 * (q >> 1), c = c0 + n0 + 2 * t + (q & 1);
          if (c < K::dv) a.final_S[((long long)bh * D + f) * K::dv + c] = sacc[i][j][q];
        }
      }
    }
    if (a.final_z != nullptr && blockIdx.y == 0 && with_z && t == 0) {
      a.final_z[(long long)bh * D + f0 + g] = zacc[i][0];
      a.final_z[(long long)bh * D + f0 + g + 8] = zacc[i][2];
    }
  }
}

}  // namespace lunajit
