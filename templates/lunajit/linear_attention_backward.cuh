// Backward of linear attention fused with the feature map's own backward
// (docs/MATH.md §1): dq, dk, dv and the gradient of every learned feature-map
// parameter. phi is recomputed from q and k (TileConfig::phi_backward =
// recompute) and never touches global memory.
//
// With g_i = dO_i / den_i and r_i = -(dO_i . o_i) / den_i (normalized; else
// g = dO, r = 0), r taken from the dq kernels' fp32 products (query_r), not
// from the forward's stored o (only the causal performer still reads o):
//   dphi(q_i) = S g_i + z r_i          dS = sum_i phi(q_i) g_i^T, dz = sum_i phi(q_i) r_i
//   dphi(k_j) = dS v_j + dz            dv_j = dS^T phi(k_j)
// Non-causal: backward_state_kernel (S, z partials, as the forward) ->
// dq_kernel (query tiles; writes each token's r) -> dstate_kernel (dS, dz
// partials over query splits) -> dkv_kernel (key tiles). Causal:
// causal_dq_kernel scans the chunks forward carrying (S, z) and stores each
// token's denominator and r; causal_dkv_kernel scans
// them backward carrying (dS, dz):
//   dphi(q_i) = sum_{j<=i in c} B_ij phi(k_j) + S_<c g_i + z_<c r_i,   B_ij = v_j . g_i + r_i
//   dphi(k_j) = sum_{i>=j in c} B_ij phi(q_i) + dS_>c v_j + dz_>c
//   dv_j      = sum_{i>=j in c} A_ij g_i + dS_>c^T phi(k_j),            A_ij = phi(q_i) . phi(k_j)
// Parameter gradients: every block that maps dphi back writes its partial
// to its own workspace slot; param_reduce_kernel and param_sum_kernel sum
// the slots in a fixed order. No floating-point atomics: two runs give bitwise-equal gradients.
#pragma once

#include "lunajit/feature_map_backward.cuh"
#include "lunajit/linear_attention.cuh"

namespace lunajit {

template <class K>
struct BackwardTraits {
  using FM = typename K::FeatureMap;
  using FB = FeatureMapBackward<FM>;
  static constexpr bool kLearned = FB::kLearned;
  static constexpr int kTokens = K::causal ? K::chunk : K::block_tokens;
  static constexpr int kParamFloats = kLearned ? K::param_floats : 0;
  static constexpr bool kRunningMax = K::performer && K::causal;  // per-row key stabiliser
  // The causal backward on tensor cores (linear_attention_backward_mma.cuh):
  // per-range state partials (BackwardArgs::splits super-chunk ranges) scanned in
  // place, chunk walks within each range, one parameter slot per range and side.
  static constexpr bool kCausalTiles = K::causal && K::mma;
  // The non-causal backward on tensor cores: its reduce kernels stage the
  // state and its gradient as split words once (mma_reduce_and_stage).
  static constexpr bool kStaged = !K::causal && K::mma;
  static LUNAJIT_HOST_DEVICE constexpr BackwardDims dims() {
    return BackwardDims{K::d, K::D, K::dv, FM::kScratchPerRow, FB::kScratchPerRow, kTokens, K::threads,
                        kParamFloats, kRunningMax ? 1 : 0};
  }
  // The layout of a launch's workspace. Its regions are sized for the
  // compiled maximum K::state_splits, whatever the launch's count: a launch
  // of s splits uses the first s partials (dense: (bh * s + split)) and
  // slots of each region. With the runtime count in the offsets, the walks
  // of the causal backward, at 128 registers on sm_90, needed a 40-byte
  // stack frame; with the compiled one they fold as before.
  static LUNAJIT_DEVICE BackwardWorkspace workspace(const BackwardArgs& a) {
    const Problem& p = a.problem;
    return backward_workspace(p.batch * p.heads, p.seq, K::state_splits, K::D, K::dv, K::causal, kTokens,
                              kParamFloats, kRunningMax, kCausalTiles, kStaged);
  }
};

// z (D) of the state of one (batch, head): partial 0 of its split partials
// [splits][D*dv + D], which backward_state_reduce_kernel summed over the
// splits (reduce_state_partials, when splits > 1).
template <class K>
LUNAJIT_DEVICE void load_state_z(const float* parts, float* z) {
  for (int f = threadIdx.x; f < K::D; f += K::threads) z[f] = parts[K::D * K::dv + f];
}

// S (D, dv) and z (D) of one (batch, head), as load_state_z (the state or,
// after dstate_reduce_kernel, its gradient).
template <class K>
LUNAJIT_DEVICE void load_state(const float* parts, float* S, float* z) {
  for (int e = threadIdx.x; e < K::D * K::dv; e += K::threads) S[e] = parts[e];
  load_state_z<K>(parts, z);
}

// r_i and g_i in place of dout, given den_i (rows < valid), with r from the
// forward's output o: only the causal performer's scans, which have no fp32
// product to take r from (docs/MATH.md §1 "r from the backward's own state").
template <class K>
LUNAJIT_DEVICE void query_gradients_from_o(float* dout, const float* o, const float* den, float* r, int valid) {
  if constexpr (K::normalize) {
    // Rotated by the row: the lanes' rows (a dv-float stride) start in different banks.
    for (int i = threadIdx.x; i < valid; i += K::threads)
      r[i] = -fm::dot_rotated<K::dv>(dout + i * K::dv, o + i * K::dv, i) / den[i];
    __syncthreads();
    for (int e = threadIdx.x; e < valid * K::dv; e += K::threads) dout[e] /= den[e / K::dv];
  } else {
    for (int i = threadIdx.x; i < valid; i += K::threads) r[i] = 0.0f;
  }
  __syncthreads();
}

// g_i = dO_i / den_i in place of dout (normalized; else g = dO), and r_i:
// from r_in[i] (the workspace's row written by the dq kernel) when given,
// else 0 (the dq kernels compute it with query_r below). Ends with a barrier.
// VS: dout's row stride (dv; the tensor-core walks' padded tiles: BackwardMmaTraits::VS).
template <class K, int VS = K::dv>
LUNAJIT_DEVICE void query_gradients(float* dout, const float* den, const float* r_in, float* r, int valid) {
  if constexpr (K::normalize && VS == K::dv) {
    for (int e = threadIdx.x; e < valid * K::dv; e += K::threads) dout[e] /= den[e / K::dv];
  } else if constexpr (K::normalize) {
    for (int e = threadIdx.x; e < valid * K::dv; e += K::threads) {
      const int i = e / K::dv;
      dout[i * VS + (e - i * K::dv)] /= den[i];
    }
  }
  for (int i = threadIdx.x; i < valid; i += K::threads) r[i] = K::normalize && r_in != nullptr ? r_in[i] : 0.0f;
  __syncthreads();
}

// r_i = -(dO_i . o_i) / den_i from the backward's own fp32 products, not from
// the forward's output o (rounded to the I/O dtype, and off by the forward's
// own error): p_i = dphi(q_i) without its r term (S_i g_i: the state and
// intra-chunk sums the row saw), so phi(q_i) . p_i = dO_i . num_i / den_i =
// dO_i . o_i exactly in fp32-level arithmetic. dphi(q) = S g + z r cancels
// (phi(q) . dphi(q) = eps r), and an r off by the 2^-8 of a bf16 o put errors
// of up to 8% on dq (softplus outputs, MATH.md §1). Writes r to the tile and to
// r_out (the workspace row, for the dstate / dkv kernel). Rows < valid; ends
// with a barrier. Normalized specs only (r = 0 otherwise). PS: the row stride
// of phi_q and p (D; the tensor-core backward's padded tiles: backward_phi_stride).
template <class K, int PS = K::D>
LUNAJIT_DEVICE void query_r(const float* phi_q, const float* p, const float* den, float* r, float* r_out, int valid) {
  for (int i = threadIdx.x; i < valid; i += K::threads) {
    const float x = -fm::dot_rotated<K::D>(phi_q + i * PS, p + i * PS, i) / den[i];
    r[i] = x;
    r_out[i] = x;
  }
  __syncthreads();
}

// The causal form of query_r for one chunk: p_i = dphi(q_i) without its r
// terms (S_<c g_i + sum_{j<=i in c} (v_j . g_i) phi(k_j)); then dphi(q_i) +=
// r_i z_i with z_i = z_<c + sum_{j<=i in c} phi(k_j), the keys row i saw
// (B_ij = v_j . g_i + r_i in full). Each column's z_i is a running sum in
// token order. Normalized specs only; ends with a barrier. PS: the tiles' row stride.
template <class K, int PS = K::D>
LUNAJIT_DEVICE void causal_query_r(const float* phi_q, const float* phi_k, const float* z, float* dphi,
                                   const float* den, float* r, float* r_out, int valid) {
  if constexpr (K::normalize) {
    query_r<K, PS>(phi_q, dphi, den, r, r_out, valid);
    for (int f = threadIdx.x; f < K::D; f += K::threads) {
      float zi = z[f];
      for (int i = 0; i < valid; ++i) {
        zi += phi_k[i * PS + f];
        dphi[i * PS + f] = fmaf(zi, r[i], dphi[i * PS + f]);
      }
    }
    __syncthreads();
  }
}

// q and dout rows of a query tile, phi(q) (fp32), the denominators against
// z and then g (in place of dout) and r (from r_in, the workspace row of the
// tile's first token, or 0 for the dq kernels to compute), for the dstate and
// dq kernels (scalar and mma). Ends with a barrier.
// map(x, phi, scratch, valid, ctx): the feature map (FM::apply in the scalar
// kernels; the tensor-core backward passes backward_phi_tile); it ends with a
// barrier. PS: phi(q)'s row stride (D; the tensor-core backward's: backward_phi_stride).
template <class K, int PS = K::D, class Map>
LUNAJIT_DEVICE void query_tile_gradients(const BackwardArgs& a, int b, int h, int t0, int valid, const BackwardSmem& L,
                                         float* smem, const float* z, const float* r_in, const FeatureContext& ctx,
                                         Map&& map) {
  constexpr int NT = K::threads, D = K::D, DV = K::dv;
  load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
  load_rows<typename K::T, NT>(a.dout, b, h, t0, valid, valid, DV, 0, DV, smem + L.dout);
  __syncthreads();
  map(smem + L.x, smem + L.phi_q, smem + L.scratch, valid, ctx);
  for (int i = threadIdx.x; i < valid; i += NT)
    smem[L.den + i] = K::normalize ? fm::dot_rotated<D>(smem + L.phi_q + i * PS, z, i) + K::eps : 1.0f;
  __syncthreads();
  query_gradients<K>(smem + L.dout, smem + L.den, r_in, smem + L.r, valid);
}

template <class K>
LUNAJIT_DEVICE void query_tile_gradients(const BackwardArgs& a, int b, int h, int t0, int valid, const BackwardSmem& L,
                                         float* smem, const float* z, const float* r_in, const FeatureContext& ctx) {
  query_tile_gradients<K>(a, b, h, t0, valid, L, smem, z, r_in, ctx,
                          [](const float* x, float* phi, float* scratch, int n, const FeatureContext& c) {
                            K::FeatureMap::template apply<K::threads>(x, phi, scratch, n, c);
                          });
}

template <class K>
LUNAJIT_DEVICE void store_tile(const float* src, int valid, int dim, const MutableTensorRef& dst, int b, int h,
                               int t0) {
  typename K::T* base = static_cast<typename K::T*>(dst.data) + b * dst.stride_batch + h * dst.stride_head;
  for (int e = threadIdx.x; e < valid * dim; e += K::threads) {
    const int r = e / dim, c = e - r * dim;
    base[(long long)(t0 + r) * dst.stride_seq + c] = from_float<typename K::T>(src[e]);
  }
}

template <class K>
LUNAJIT_DEVICE void write_slot(const float* dparams, float* slot) {
  for (int p = threadIdx.x; p < BackwardTraits<K>::kParamFloats; p += K::threads) slot[p] = dparams[p];
}

template <class K>
__global__ void __launch_bounds__(K::threads) backward_key_stab_kernel(const BackwardArgs args) {
  if constexpr (K::performer) {
    const int bh = blockIdx.x, b = bh / args.problem.heads;
    const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
    const BackwardArgs a = sequence_args<K>(args, sp);
    key_stab_block<K>(a.k, a.params, b, bh % a.problem.heads, sp.len, a.problem.heads, a.workspace + bh);
  }
}

// (S, z) partials, exactly as the forward. Grid (batch*heads, splits, dv blocks).
template <class K>
__global__ void __launch_bounds__(K::threads) backward_state_kernel(const BackwardArgs args) {
  const BackwardWorkspace w = BackwardTraits<K>::workspace(args);
  const SeqSpan sp = sequence_span(args.cu_seqlens, blockIdx.x / args.problem.heads, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  state_block<K>(Problem{a.problem.batch, a.problem.heads, sp.len}, a.k, a.v, a.params, K::performer ? a.workspace[blockIdx.x] : 0.0f, a.workspace + w.state, split_count<K>(a));
}

// (dS, dz) partials over this block's share of the queries. Grid (batch*heads, splits).
// The non-causal split partials of (S, z) (written by the state pass) and of
// (dS, dz) (by dstate) summed into partial 0 (reduce_state_partials, when
// splits > 1). Grid (batch*heads, ceil((D*dv + D) / threads)).
template <class K>
__global__ void __launch_bounds__(K::threads) backward_state_reduce_kernel(const BackwardArgs args) {
  reduce_state_partials<K>(args.workspace + BackwardTraits<K>::workspace(args).state, split_count<K>(args));
}

template <class K>
__global__ void __launch_bounds__(K::threads) dstate_reduce_kernel(const BackwardArgs args) {
  reduce_state_partials<K>(args.workspace + BackwardTraits<K>::workspace(args).dstate, split_count<K>(args));
}

template <class K>
__global__ void __launch_bounds__(K::threads) dstate_kernel(const BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  constexpr int T = K::block_tokens, D = K::D, DV = K::dv, NT = K::threads;
  constexpr BackwardSmem L = backward_smem_layout(BackwardKind::dstate, Tr::dims());
  constexpr int kEntries = state_entries_per_thread(D, DV, NT);
  constexpr int kZEntries = (D + NT - 1) / NT;
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads, split = blockIdx.y;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  const int seq = sp.len;
  const int splits = split_count<K>(a);
  const TokenRange range = split_range<K::state_splits>(seq, split, splits, T);
  constexpr long long kPart = (long long)D * DV + D;
  float* z = smem + L.z;
  load_state_z<K>(a.workspace + w.state + (long long)bh * K::state_splits * kPart, z);
  const float* params = KernelTraits<K>::head_params(a.params, h);
  float acc[kEntries];
  float zacc[kZEntries];
#pragma unroll
  for (int i = 0; i < kEntries; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kZEntries; ++i) zacc[i] = 0.0f;
  const float* phi = smem + L.phi_q;
  const float* g = smem + L.dout;
  const float* r = smem + L.r;
  for (int t0 = range.begin; t0 < range.end; t0 += T) {
    const int valid = min(T, range.end - t0);
    // r from dq_kernel.
    query_tile_gradients<K>(a, b, h, t0, valid, L, smem, z, a.workspace + w.r + bh * (long long)args.problem.seq + t0,
                            FeatureContext{params, t0, seq, 1, 0.0f});
    // Tokens outer, entries inner, as state_block: each sum in token order.
    for (int t = 0; t < valid; ++t) {
#pragma unroll
      for (int i = 0; i < kEntries; ++i) {
        const int e = threadIdx.x + i * NT;
        if (e < D * DV) {
          const int f = e / DV, c = e - f * DV;
          acc[i] = fmaf(phi[t * D + f], g[t * DV + c], acc[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kZEntries; ++i) {
        const int f = threadIdx.x + i * NT;
        if (f < D) zacc[i] = fmaf(phi[t * D + f], r[t], zacc[i]);
      }
    }
    __syncthreads();
  }
  float* part = a.workspace + w.dstate + ((long long)bh * K::state_splits + split) * kPart;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = threadIdx.x + i * NT;
    if (e < D * DV) part[e] = acc[i];
  }
#pragma unroll
  for (int i = 0; i < kZEntries; ++i) {
    const int f = threadIdx.x + i * NT;
    if (f < D) part[D * DV + f] = zacc[i];
  }
}

// dq for one query tile: dphi(q) = S g + z r, with r from S g (query_r; written
// to the workspace for dstate_kernel), then the feature map's backward.
// Grid (query tiles, batch*heads).
template <class K>
__global__ void __launch_bounds__(K::threads) dq_kernel(const BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  constexpr int T = K::block_tokens, D = K::D, DV = K::dv, NT = K::threads;
  constexpr BackwardSmem L = backward_smem_layout(BackwardKind::dq, Tr::dims());
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.y, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  // A tile past the end of a shorter packed sequence has no rows but still
  // writes its (zero) parameter-gradient slot.
  const int seq = sp.len, t0 = blockIdx.x * T, valid = max(0, min(T, seq - t0));
  float* S = smem + L.state;
  float* z = smem + L.z;
  float* phi = smem + L.phi_q;
  float* dphi = smem + L.dphi;
  const float* g = smem + L.dout;
  const float* r = smem + L.r;
  float* dparams = smem + L.dparams;
  load_state<K>(a.workspace + w.state + (long long)bh * K::state_splits * ((long long)D * DV + D), S, z);
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  const FeatureContext ctx{KernelTraits<K>::head_params(a.params, h), t0, seq, 1, 0.0f};
  query_tile_gradients<K>(a, b, h, t0, valid, L, smem, z, nullptr, ctx);
  for (int e = threadIdx.x; e < valid * D; e += NT) {
    const int i = e / D, f = e - i * D;
    float s = 0.0f;
    for (int c = 0; c < DV; ++c) s = fmaf(S[f * DV + c], g[i * DV + c], s);
    dphi[e] = s;
  }
  __syncthreads();
  if constexpr (K::normalize) {
    query_r<K>(phi, dphi, smem + L.den, smem + L.r, a.workspace + w.r + bh * (long long)args.problem.seq + t0, valid);
    for (int e = threadIdx.x; e < valid * D; e += NT) dphi[e] = fmaf(z[e % D], r[e / D], dphi[e]);
    __syncthreads();
  }
  Tr::FB::template backward<NT>(smem + L.x, phi, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                smem + L.dx, dparams);
  store_tile<K>(smem + L.dx, valid, K::d, a.dq, b, h, t0);
  if constexpr (Tr::kLearned) write_slot<K>(dparams, a.workspace + w.slots + ((long long)bh * gridDim.x + blockIdx.x) * Tr::kParamFloats);
}

// dk and dv for one key tile: dphi(k) = dS v + dz, dv = dS^T phi(k).
// Grid (key tiles, batch*heads).
template <class K>
__global__ void __launch_bounds__(K::threads) dkv_kernel(const BackwardArgs args) {
  using Tr = BackwardTraits<K>;
  constexpr int T = K::block_tokens, D = K::D, DV = K::dv, NT = K::threads;
  constexpr BackwardSmem L = backward_smem_layout(BackwardKind::dkv, Tr::dims());
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.y, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  // A tile past the end of a shorter packed sequence has no rows but still
  // writes its (zero) parameter-gradient slot.
  const int seq = sp.len, t0 = blockIdx.x * T, valid = max(0, min(T, seq - t0));
  const int bh_count = a.problem.batch * a.problem.heads;
  float* dS = smem + L.state;
  float* dz = smem + L.z;
  float* phi = smem + L.phi_q;  // phi(k) here
  float* dphi = smem + L.dphi;
  float* v = smem + L.v;
  float* dparams = smem + L.dparams;
  load_state<K>(a.workspace + w.dstate + (long long)bh * K::state_splits * ((long long)D * DV + D), dS, dz);
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  load_rows<typename K::T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
  load_rows<typename K::T, NT>(a.v, b, h, t0, valid, valid, DV, 0, DV, v);
  __syncthreads();
  const FeatureContext ctx{KernelTraits<K>::head_params(a.params, h), t0, seq, 0,
                           K::performer ? a.workspace[bh] : 0.0f};
  K::FeatureMap::template apply<NT>(smem + L.x, phi, smem + L.scratch, valid, ctx);
  for (int e = threadIdx.x; e < valid * D; e += NT) {
    const int j = e / D, f = e - j * D;
    float s = dz[f];
    for (int c = 0; c < DV; ++c) s = fmaf(dS[f * DV + c], v[j * DV + c], s);
    dphi[e] = s;
  }
  typename K::T* dv_out = static_cast<typename K::T*>(a.dv.data) + b * a.dv.stride_batch + h * a.dv.stride_head;
  for (int e = threadIdx.x; e < valid * DV; e += NT) {
    const int j = e / DV, c = e - j * DV;
    float s = 0.0f;
    for (int f = 0; f < D; ++f) s = fmaf(dS[f * DV + c], phi[j * D + f], s);
    dv_out[(long long)(t0 + j) * a.dv.stride_seq + c] = from_float<typename K::T>(s);
  }
  __syncthreads();
  Tr::FB::template backward<NT>(smem + L.x, phi, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                smem + L.dx, dparams);
  store_tile<K>(smem + L.dx, valid, K::d, a.dk, b, h, t0);
  if constexpr (Tr::kLearned)
    write_slot<K>(dparams, a.workspace + w.slots +
                               ((long long)(bh_count + bh) * gridDim.x + blockIdx.x) * Tr::kParamFloats);
}

// Causal performer backward (docs/MATH.md §2; the forward is performer_causal_chunk,
// whose notation this follows). Forward scan, per chunk:
//   dphi(q_i) = sum_{j<=i} B_ij phi_i(k_j) + exp(R - M_i)(E g_i + e r_i) + kappa (Vs . g_i + t0 r_i)
// with B_ij = v_j . g_i + r_i; stores den_i and M_i for the reverse scan.
template <class K>
LUNAJIT_DEVICE void performer_causal_dq(const BackwardArgs& args) {
  using Tr = BackwardTraits<K>;
  constexpr int C = K::chunk, D = K::D, DV = K::dv, NT = K::threads;
  constexpr float kappa = K::FeatureMap::kKernelEps;
  constexpr BackwardSmem L = backward_smem_layout(BackwardKind::causal_dq, Tr::dims());
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  const int seq = sp.len;
  const long long ws_seq = args.problem.seq;  // per-token workspace rows: the longest length
  float* S = smem + L.state;
  float* z = smem + L.z;
  float* phi_q = smem + L.phi_q;
  float* phi_k = smem + L.phi_k;
  float* dphi = smem + L.dphi;
  float* v = smem + L.v;
  float* g = smem + L.dout;
  float* A = smem + L.scores;
  float* B = smem + L.scores + C * C;
  float* den = smem + L.den;
  float* r = smem + L.r;
  float* ks = smem + L.kstab;
  float* km = smem + L.kmax;
  float* qs = smem + L.qsum;
  float* vs = smem + L.vsum;
  float* dparams = smem + L.dparams;
  for (int e = threadIdx.x; e < D * DV; e += NT) S[e] = 0.0f;
  for (int f = threadIdx.x; f < D; f += NT) z[f] = 0.0f;
  for (int c = threadIdx.x; c < DV; c += NT) vs[c] = 0.0f;
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  const float* params = KernelTraits<K>::head_params(a.params, h);
  float level = -3.402823466e38f;
  for (int t0 = 0; t0 < seq; t0 += C) {
    const int valid = min(C, seq - t0);
    load_rows<typename K::T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.v, b, h, t0, valid, valid, DV, 0, DV, v);
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, phi_k, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 1, 0.0f});
    if (threadIdx.x == 0) {
      float m = level;
      for (int j = 0; j < valid; ++j) {
        ks[j] = smem[L.scratch + j];
        m = fmaxf(m, ks[j]);
        km[j] = m;
        a.workspace[w.kmax + bh * ws_seq + t0 + j] = m;
      }
    }
    load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.dout, b, h, t0, valid, valid, DV, 0, DV, g);
    load_rows<typename K::T, NT>(a.o, b, h, t0, valid, valid, DV, 0, DV, smem + L.o);
    __syncthreads();
    const FeatureContext ctx{params, t0, seq, 1, 0.0f};
    K::FeatureMap::template apply<NT>(smem + L.x, phi_q, smem + L.scratch, valid, ctx);
    for (int i = threadIdx.x; i < valid; i += NT) {
      float s = 0.0f;
      for (int f = 0; f < D; ++f) s += phi_q[i * D + f];
      qs[i] = s;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      A[i * C + j] = j <= i ? expf(ks[j] - km[i]) * (fm::dot(phi_q + i * D, phi_k + j * D, D) - kappa * qs[i]) +
                                  kappa * qs[i]
                            : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < valid; i += NT) {
      float s = 1.0f;
      if constexpr (K::normalize) {
        s = expf(level - km[i]) * fm::dot(phi_q + i * D, z, D) + kappa * qs[i] * (float)t0 + K::eps;
        for (int j = 0; j <= i; ++j) s += A[i * C + j];
        a.workspace[w.den + bh * ws_seq + t0 + i] = s;
      }
      den[i] = s;
    }
    __syncthreads();
    query_gradients_from_o<K>(g, smem + L.o, den, r, valid);
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      B[i * C + j] = j <= i ? fm::dot(v + j * DV, g + i * DV, DV) + r[i] : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * D; e += NT) {
      const int i = e / D, f = e - i * D;
      float carried = K::normalize ? z[f] * r[i] : 0.0f;
      for (int c = 0; c < DV; ++c) carried = fmaf(S[f * DV + c], g[i * DV + c], carried);
      float flat = K::normalize ? r[i] * (float)t0 : 0.0f;  // kappa's share: sum_j B_ij over earlier chunks
      for (int c = 0; c < DV; ++c) flat = fmaf(vs[c], g[i * DV + c], flat);
      float s = fmaf(expf(level - km[i]), carried, kappa * flat);
      for (int j = 0; j <= i; ++j)
        s = fmaf(B[i * C + j], expf(ks[j] - km[i]) * (phi_k[j * D + f] - kappa) + kappa, s);
      dphi[e] = s;
    }
    __syncthreads();
    const float next = km[valid - 1], rescale = expf(level - next);
    for (int e = threadIdx.x; e < D * DV; e += NT) {
      const int f = e / DV, c = e - f * DV;
      float s = S[e] * rescale;
      for (int j = 0; j < valid; ++j) s = fmaf(expf(ks[j] - next) * (phi_k[j * D + f] - kappa), v[j * DV + c], s);
      S[e] = s;
    }
    for (int f = threadIdx.x; f < D; f += NT) {
      float s = z[f] * rescale;
      for (int j = 0; j < valid; ++j) s = fmaf(expf(ks[j] - next), phi_k[j * D + f] - kappa, s);
      z[f] = s;
    }
    for (int c = threadIdx.x; c < DV; c += NT) {
      float s = vs[c];
      for (int j = 0; j < valid; ++j) s += v[j * DV + c];
      vs[c] = s;
    }
    level = next;
    Tr::FB::template backward<NT>(smem + L.x, phi_q, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                  smem + L.dx, dparams);
    store_tile<K>(smem + L.dx, valid, K::d, a.dq, b, h, t0);
    __syncthreads();
  }
}

// Causal performer, reverse scan: dk and dv. The carry of the queries after the
// chunk sits at the level R' = M of the chunk's last token (>= s_j of its keys,
// <= M_i of every later query):
//   dE = sum_{i later} exp(R' - M_i) phi_q_i g_i^T,  de = the same with r_i,
//   Gs = sum_{i later} Q_i g_i  (kappa's share, no stabiliser).
//   du_j  = sum_{i>=j in c} B_ij exp(s_j - M_i) phi_q_i + exp(s_j - R')(dE v_j + de)
//   dv_j  = sum_{i>=j in c} A_ij g_i + exp(s_j - R') dE^T (u_j - kappa) + kappa Gs
// du_j is the gradient of u_j (the key in the query form), which the feature
// map's backward maps to dk_j with s_j held (stop-gradient; s_j cancels in phi_i(k_j)).
template <class K>
LUNAJIT_DEVICE void performer_causal_dkv(const BackwardArgs& args) {
  using Tr = BackwardTraits<K>;
  constexpr int C = K::chunk, D = K::D, DV = K::dv, NT = K::threads;
  constexpr float kappa = K::FeatureMap::kKernelEps;
  constexpr BackwardSmem L = backward_smem_layout(BackwardKind::causal_dkv, Tr::dims());
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  const int seq = sp.len;
  const long long ws_seq = args.problem.seq;  // per-token workspace rows: the longest length
  const int bh_count = a.problem.batch * a.problem.heads;
  float* dS = smem + L.state;
  float* dz = smem + L.z;
  float* phi_q = smem + L.phi_q;
  float* phi_k = smem + L.phi_k;
  float* dphi = smem + L.dphi;
  float* v = smem + L.v;
  float* g = smem + L.dout;
  float* A = smem + L.scores;
  float* B = smem + L.scores + C * C;
  float* den = smem + L.den;
  float* r = smem + L.r;
  float* ks = smem + L.kstab;
  float* km = smem + L.kmax;
  float* qs = smem + L.qsum;
  float* gs = smem + L.vsum;
  float* dparams = smem + L.dparams;
  for (int e = threadIdx.x; e < D * DV; e += NT) dS[e] = 0.0f;
  for (int f = threadIdx.x; f < D; f += NT) dz[f] = 0.0f;
  for (int c = threadIdx.x; c < DV; c += NT) gs[c] = 0.0f;
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  const float* params = KernelTraits<K>::head_params(a.params, h);
  const float* kmax_all = a.workspace + w.kmax + bh * ws_seq;
  const int chunks = (seq + C - 1) / C;
  typename K::T* dv_out = static_cast<typename K::T*>(a.dv.data) + b * a.dv.stride_batch + h * a.dv.stride_head;
  float level = seq > 0 ? kmax_all[seq - 1] : 0.0f;  // the carry is empty until the last chunk is done
  for (int c_idx = chunks - 1; c_idx >= 0; --c_idx) {
    const int t0 = c_idx * C, valid = min(C, seq - t0);
    load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.dout, b, h, t0, valid, valid, DV, 0, DV, g);
    load_rows<typename K::T, NT>(a.o, b, h, t0, valid, valid, DV, 0, DV, smem + L.o);
    for (int i = threadIdx.x; i < valid; i += NT) {
      den[i] = K::normalize ? a.workspace[w.den + bh * ws_seq + t0 + i] : 1.0f;
      km[i] = kmax_all[t0 + i];
    }
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, phi_q, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 1, 0.0f});
    for (int i = threadIdx.x; i < valid; i += NT) {
      float s = 0.0f;
      for (int f = 0; f < D; ++f) s += phi_q[i * D + f];
      qs[i] = s;
    }
    load_rows<typename K::T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.v, b, h, t0, valid, valid, DV, 0, DV, v);
    __syncthreads();
    const FeatureContext ctx{params, t0, seq, 1, 0.0f};
    K::FeatureMap::template apply<NT>(smem + L.x, phi_k, smem + L.scratch, valid, ctx);
    for (int j = threadIdx.x; j < valid; j += NT) ks[j] = smem[L.scratch + j];
    query_gradients_from_o<K>(g, smem + L.o, den, r, valid);
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      const bool on = i >= j;
      const float wij = on ? expf(ks[j] - km[i]) : 0.0f;
      A[i * C + j] = on ? wij * (fm::dot(phi_q + i * D, phi_k + j * D, D) - kappa * qs[i]) + kappa * qs[i] : 0.0f;
      B[i * C + j] = on ? (fm::dot(v + j * DV, g + i * DV, DV) + r[i]) * wij : 0.0f;  // B_ij exp(s_j - M_i)
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * D; e += NT) {
      const int j = e / D, f = e - j * D;
      float s = dz[f];
      for (int c = 0; c < DV; ++c) s = fmaf(dS[f * DV + c], v[j * DV + c], s);
      s *= expf(ks[j] - level);
      for (int i = j; i < valid; ++i) s = fmaf(B[i * C + j], phi_q[i * D + f], s);
      dphi[e] = s;
    }
    for (int e = threadIdx.x; e < valid * DV; e += NT) {
      const int j = e / DV, c = e - j * DV;
      float s = 0.0f;
      for (int f = 0; f < D; ++f) s = fmaf(dS[f * DV + c], phi_k[j * D + f] - kappa, s);
      s = fmaf(expf(ks[j] - level), s, kappa * gs[c]);
      for (int i = j; i < valid; ++i) s = fmaf(A[i * C + j], g[i * DV + c], s);
      dv_out[(long long)(t0 + j) * a.dv.stride_seq + c] = from_float<typename K::T>(s);
    }
    __syncthreads();
    // Add this chunk's queries to the carry, at the level of the token before it.
    if (t0 > 0) {
      const float prev = kmax_all[t0 - 1], rescale = expf(prev - level);
      for (int e = threadIdx.x; e < D * DV; e += NT) {
        const int f = e / DV, c = e - f * DV;
        float s = dS[e] * rescale;
        for (int i = 0; i < valid; ++i) s = fmaf(expf(prev - km[i]) * phi_q[i * D + f], g[i * DV + c], s);
        dS[e] = s;
      }
      for (int f = threadIdx.x; f < D; f += NT) {
        float s = dz[f] * rescale;
        for (int i = 0; i < valid; ++i) s = fmaf(expf(prev - km[i]) * phi_q[i * D + f], r[i], s);
        dz[f] = s;
      }
      for (int c = threadIdx.x; c < DV; c += NT) {
        float s = gs[c];
        for (int i = 0; i < valid; ++i) s = fmaf(qs[i], g[i * DV + c], s);
        gs[c] = s;
      }
      level = prev;
    }
    Tr::FB::template backward<NT>(smem + L.x, phi_k, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                  smem + L.dx, dparams);
    store_tile<K>(smem + L.dx, valid, K::d, a.dk, b, h, t0);
    __syncthreads();
  }
  (void)bh_count;
}

// Causal, forward scan: dq, and each token's denominator and r for causal_dkv_kernel.
// Grid (batch*heads).
template <class K>
__global__ void __launch_bounds__(K::threads) causal_dq_kernel(const BackwardArgs args) {
  if constexpr (K::performer) {
    performer_causal_dq<K>(args);
    return;
  }
  using Tr = BackwardTraits<K>;
  constexpr int C = K::chunk, D = K::D, DV = K::dv, NT = K::threads;
  constexpr BackwardSmem L = backward_smem_layout(BackwardKind::causal_dq, Tr::dims());
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  const int seq = sp.len;
  const long long ws_seq = args.problem.seq;  // per-token workspace rows: the longest length
  float* S = smem + L.state;
  float* z = smem + L.z;
  float* phi_q = smem + L.phi_q;
  float* phi_k = smem + L.phi_k;
  float* dphi = smem + L.dphi;
  float* v = smem + L.v;
  float* g = smem + L.dout;
  float* A = smem + L.scores;
  float* B = smem + L.scores + C * C;
  float* den = smem + L.den;
  float* r = smem + L.r;
  float* dparams = smem + L.dparams;
  load_initial_state<K>(a.initial_S, a.initial_z, bh, 0, DV, S, z);
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  const float* params = KernelTraits<K>::head_params(a.params, h);
  const float key_stab = K::performer ? a.workspace[bh] : 0.0f;
  for (int t0 = 0; t0 < seq; t0 += C) {
    const int valid = min(C, seq - t0);
    load_rows<typename K::T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.v, b, h, t0, valid, valid, DV, 0, DV, v);
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, phi_k, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 0, key_stab});
    load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.dout, b, h, t0, valid, valid, DV, 0, DV, g);
    __syncthreads();
    const FeatureContext ctx{params, t0, seq, 1, 0.0f};
    K::FeatureMap::template apply<NT>(smem + L.x, phi_q, smem + L.scratch, valid, ctx);
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      A[i * C + j] = j <= i ? fm::dot(phi_q + i * D, phi_k + j * D, D) : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < valid; i += NT) {
      float s = 1.0f;
      if constexpr (K::normalize) {
        s = fm::dot(phi_q + i * D, z, D) + K::eps;
        for (int j = 0; j <= i; ++j) s += A[i * C + j];
        a.workspace[w.den + bh * ws_seq + t0 + i] = s;
      }
      den[i] = s;
    }
    __syncthreads();
    query_gradients<K>(g, den, nullptr, r, valid);
    // B_ij = v_j . g_i here; r_i joins it once query_r has it.
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      B[i * C + j] = j <= i ? fm::dot(v + j * DV, g + i * DV, DV) : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * D; e += NT) {
      const int i = e / D, f = e - i * D;
      float s = 0.0f;
      for (int c = 0; c < DV; ++c) s = fmaf(S[f * DV + c], g[i * DV + c], s);
      for (int j = 0; j <= i; ++j) s = fmaf(B[i * C + j], phi_k[j * D + f], s);
      dphi[e] = s;
    }
    __syncthreads();
    causal_query_r<K>(phi_q, phi_k, z, dphi, den, r, a.workspace + w.r + bh * ws_seq + t0, valid);
    // (S, z) move past this chunk; each thread owns fixed entries.
    for (int e = threadIdx.x; e < D * DV; e += NT) {
      const int f = e / DV, c = e - f * DV;
      float s = S[e];
      for (int j = 0; j < valid; ++j) s = fmaf(phi_k[j * D + f], v[j * DV + c], s);
      S[e] = s;
    }
    for (int f = threadIdx.x; f < D; f += NT) {
      float s = z[f];
      for (int j = 0; j < valid; ++j) s += phi_k[j * D + f];
      z[f] = s;
    }
    Tr::FB::template backward<NT>(smem + L.x, phi_q, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                  smem + L.dx, dparams);
    store_tile<K>(smem + L.dx, valid, K::d, a.dq, b, h, t0);
    __syncthreads();
  }
  if constexpr (Tr::kLearned) write_slot<K>(dparams, a.workspace + w.slots + (long long)bh * Tr::kParamFloats);
}

// Causal, backward scan over the chunks: dk and dv. Grid (batch*heads).
// Its tiles (C x C scores twice, phi(q), phi(k), dphi, ...) keep it to one
// block per SM at the default chunk; the launch bounds say so to ptxas.
template <class K>
__global__ void __launch_bounds__(K::threads, sole_block_min_blocks(backward_smem_layout(
                                                  BackwardKind::causal_dkv, BackwardTraits<K>::dims()).bytes()))
    causal_dkv_kernel(const BackwardArgs args) {
  if constexpr (K::performer) {
    performer_causal_dkv<K>(args);
    return;
  }
  using Tr = BackwardTraits<K>;
  constexpr int C = K::chunk, D = K::D, DV = K::dv, NT = K::threads;
  constexpr BackwardSmem L = backward_smem_layout(BackwardKind::causal_dkv, Tr::dims());
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const BackwardWorkspace w = Tr::workspace(args);
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const BackwardArgs a = sequence_args<K>(args, sp);
  const int seq = sp.len;
  const long long ws_seq = args.problem.seq;  // per-token workspace rows: the longest length
  const int bh_count = a.problem.batch * a.problem.heads;
  float* dS = smem + L.state;
  float* dz = smem + L.z;
  float* phi_q = smem + L.phi_q;
  float* phi_k = smem + L.phi_k;
  float* dphi = smem + L.dphi;
  float* v = smem + L.v;
  float* g = smem + L.dout;
  float* A = smem + L.scores;
  float* B = smem + L.scores + C * C;
  float* den = smem + L.den;
  float* r = smem + L.r;
  float* dparams = smem + L.dparams;
  // The upstream gradient of the final state enters every key's dS_>c, dz_>c.
  load_initial_state<K>(a.dfinal_S, a.dfinal_z, bh, 0, DV, dS, dz);
  for (int p = threadIdx.x; p < Tr::kParamFloats; p += NT) dparams[p] = 0.0f;
  const float* params = KernelTraits<K>::head_params(a.params, h);
  const float key_stab = K::performer ? a.workspace[bh] : 0.0f;
  const int chunks = (seq + C - 1) / C;
  typename K::T* dv_out = static_cast<typename K::T*>(a.dv.data) + b * a.dv.stride_batch + h * a.dv.stride_head;
  for (int c_idx = chunks - 1; c_idx >= 0; --c_idx) {
    const int t0 = c_idx * C, valid = min(C, seq - t0);
    load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.dout, b, h, t0, valid, valid, DV, 0, DV, g);
    for (int i = threadIdx.x; i < valid; i += NT)
      den[i] = K::normalize ? a.workspace[w.den + bh * ws_seq + t0 + i] : 1.0f;
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, phi_q, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 1, 0.0f});
    load_rows<typename K::T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.v, b, h, t0, valid, valid, DV, 0, DV, v);
    __syncthreads();
    const FeatureContext ctx{params, t0, seq, 0, key_stab};
    K::FeatureMap::template apply<NT>(smem + L.x, phi_k, smem + L.scratch, valid, ctx);
    query_gradients<K>(g, den, a.workspace + w.r + bh * ws_seq + t0, r, valid);  // r from causal_dq_kernel
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      const bool on = i >= j;
      A[i * C + j] = on ? fm::dot(phi_q + i * D, phi_k + j * D, D) : 0.0f;
      B[i * C + j] = on ? fm::dot(v + j * DV, g + i * DV, DV) + r[i] : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * D; e += NT) {
      const int j = e / D, f = e - j * D;
      float s = dz[f];
      for (int c = 0; c < DV; ++c) s = fmaf(dS[f * DV + c], v[j * DV + c], s);
      for (int i = j; i < valid; ++i) s = fmaf(B[i * C + j], phi_q[i * D + f], s);
      dphi[e] = s;
    }
    for (int e = threadIdx.x; e < valid * DV; e += NT) {
      const int j = e / DV, c = e - j * DV;
      float s = 0.0f;
      for (int f = 0; f < D; ++f) s = fmaf(dS[f * DV + c], phi_k[j * D + f], s);
      for (int i = j; i < valid; ++i) s = fmaf(A[i * C + j], g[i * DV + c], s);
      dv_out[(long long)(t0 + j) * a.dv.stride_seq + c] = from_float<typename K::T>(s);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < D * DV; e += NT) {
      const int f = e / DV, c = e - f * DV;
      float s = dS[e];
      for (int i = 0; i < valid; ++i) s = fmaf(phi_q[i * D + f], g[i * DV + c], s);
      dS[e] = s;
    }
    for (int f = threadIdx.x; f < D; f += NT) {
      float s = dz[f];
      for (int i = 0; i < valid; ++i) s = fmaf(phi_q[i * D + f], r[i], s);
      dz[f] = s;
    }
    Tr::FB::template backward<NT>(smem + L.x, phi_k, dphi, valid, ctx, smem + L.scratch, smem + L.bscratch,
                                  smem + L.dx, dparams);
    store_tile<K>(smem + L.dx, valid, K::d, a.dk, b, h, t0);
    __syncthreads();
  }
  // dS_>=0 = dS_T + sum_i phi(q_i) g_i^T: the gradient of the initial S (and z).
  store_final_state<K>(a.dinitial_S, a.dinitial_z, bh, 0, DV, dS, dz);
  if constexpr (Tr::kLearned)
    write_slot<K>(dparams, a.workspace + w.slots + (long long)(bh_count + bh) * Tr::kParamFloats);
}

// The tensor-core causal backward (Tr::kCausalTiles): the per-range
// partials [ranges][D*dv + D] of one (batch, head) (BackwardArgs::splits
// super-chunk ranges), written by the state pass (S_r, z_r) or the causal dq
// kernel (dS_r, dz_r), become in place the exclusive prefix S_<r = S_0 +
// sum_{r' < r} S_r' (S_0 the carried initial state, else 0) or suffix dS_>r =
// dS_T + sum_{r' > r} dS_r' (dS_T the upstream gradient of the final state,
// else 0). Each thread walks its entries' ranges in order: fixed-order fp32
// sums, as the scalar scans. The suffix scan also writes dS_>=0, the
// gradient of the initial state. Grid (batch*heads, ceil((D*dv + D) / threads)).
template <class K, bool kReverse>
LUNAJIT_DEVICE void causal_state_scan(const float* seed_S, const float* seed_z, float* out_S, float* out_z,
                                      float* parts, int bh, int ranges) {
  constexpr long long kPart = (long long)K::D * K::dv + K::D;
  const int e = blockIdx.y * K::threads + threadIdx.x;
  if (e >= kPart) return;
  const bool in_S = e < K::D * K::dv;
  const float* seed = in_S ? seed_S : seed_z;
  const long long at = in_S ? (long long)bh * K::D * K::dv + e : (long long)bh * K::D + (e - K::D * K::dv);
  float run = seed != nullptr ? seed[at] : 0.0f;
  float* col = parts + (long long)bh * K::state_splits * kPart + e;  // the first `ranges` of R partials
  // kBatch loads in flight before their stores: the walk waits on memory
  // ceil(ranges / kBatch) times, not ranges times (the sums stay in order).
  constexpr int kBatch = 8;
  for (int i0 = 0; i0 < ranges; i0 += kBatch) {
    float x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u, c = kReverse ? ranges - 1 - i : i;
      x[u] = i < ranges ? col[(long long)c * kPart] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u, c = kReverse ? ranges - 1 - i : i;
      if (i < ranges) {
        col[(long long)c * kPart] = run;
        run += x[u];
      }
    }
  }
  float* out = in_S ? out_S : out_z;
  if (out != nullptr) out[at] = run;
}

template <class K>
__global__ void __launch_bounds__(K::threads) state_scan_kernel(const BackwardArgs a) {
  if constexpr (BackwardTraits<K>::kCausalTiles) {
    const BackwardWorkspace w = BackwardTraits<K>::workspace(a);
    causal_state_scan<K, false>(a.initial_S, a.initial_z, nullptr, nullptr, a.workspace + w.state, blockIdx.x,
                                split_count<K>(a));
  }
}

template <class K>
__global__ void __launch_bounds__(K::threads) dstate_scan_kernel(const BackwardArgs a) {
  if constexpr (BackwardTraits<K>::kCausalTiles) {
    const BackwardWorkspace w = BackwardTraits<K>::workspace(a);
    causal_state_scan<K, true>(a.dfinal_S, a.dfinal_z, a.dinitial_S, a.dinitial_z, a.workspace + w.dstate,
                               blockIdx.x, split_count<K>(a));
  }
}

// The parameter gradient: dparams[hb][p] = the sum of head block hb's slots
// (per-head parameters: head hb's; shared: every head's), in two launches, in
// a fixed order (bitwise deterministic):
//   param_reduce_kernel, grid (ceil(P / 32), G, Hp): the block's slot list is
//     cut into G consecutive groups (param_reduce_groups: about 256 slots a
//     warp); block (x, gi, hb) takes 32 consecutive parameters (one 128-byte
//     line per slot and warp) of group gi, its NW warps sum NW consecutive
//     ranges of it, each with kParamLoads independent accumulators (slot e
//     into accumulator e mod kParamLoads, added in a fixed tree), and warp 0
//     adds the warps' sums in warp order and writes the group's sum over the
//     group's first slot (in place: no other block reads those 32 columns of
//     that slot).
//   param_sum_kernel, grid (ceil(P / 32), Hp): the G group sums, in the same
//     way (warps over consecutive ranges of groups, then warp order).
// Before this, one launch of (ceil(P / 32), Hp) blocks had each warp walk a
// quarter of the slots one dependent load at a time: at B 8, H 12, N 16384
// the default LUNA backward's 196,608 slots gave every warp 49,152 loads in
// series, latency-bound (tens of ms on a GPU where the bytes take 0.2 ms).
// Dynamic shared memory: one partial per thread, both kernels.
template <class K>
struct ParamSlots {
  long long n;       // slots in the list of one head block
  long long tiles;   // slots per (side, batch, head)
  long long stride;  // workspace slots from one (side, batch[, head]) run of the list to the next
  long long hoff;    // per-head parameters: head hb's first slot within a (side, batch) run
  LUNAJIT_DEVICE ParamSlots(const BackwardArgs& a, int hb) {
    using Tr = BackwardTraits<K>;
    // One per tile (non-causal), one per range (the tensor-core causal walks), one (the causal scans).
    tiles = Tr::kCausalTiles ? split_count<K>(a) : K::causal ? 1 : (a.problem.seq + Tr::kTokens - 1) / Tr::kTokens;
    const int heads_summed = K::params_per_head ? 1 : a.problem.heads;
    n = 2LL * a.problem.batch * heads_summed * tiles;
    stride = K::params_per_head ? tiles * a.problem.heads : tiles;
    hoff = K::params_per_head ? tiles * hb : 0;
  }
  // The list is (side, batch, head, tile); the workspace holds slot
  // ((side B + b) H + h) tiles + t: list entry e's workspace slot.
  LUNAJIT_DEVICE long long slot(long long e) const { return e / tiles * stride + hoff + e % tiles; }
  LUNAJIT_DEVICE long long group_begin(long long gi, long long groups) const { return n * gi / groups; }
};

constexpr int kParamLoads = 8;  // loads in flight per lane

// Sum of col[slot(e) * PF] over list entries e in [begin, end): entry e into
// accumulator (e - begin) mod kParamLoads, then a fixed tree. `slot` maps an
// entry to its row; the rows of consecutive entries are walked by carries.
template <int PF, class Rows>
LUNAJIT_DEVICE float sum_param_rows(const float* col, long long begin, long long end, Rows rows) {
  float acc[kParamLoads];
#pragma unroll
  for (int u = 0; u < kParamLoads; ++u) acc[u] = 0.0f;
  for (long long e = begin; e < end; e += kParamLoads) {
    float v[kParamLoads];
#pragma unroll
    for (int u = 0; u < kParamLoads; ++u) v[u] = e + u < end ? col[rows(e + u) * PF] : 0.0f;
#pragma unroll
    for (int u = 0; u < kParamLoads; ++u) acc[u] += v[u];
  }
#pragma unroll
  for (int w = 1; w < kParamLoads; w *= 2)
#pragma unroll
    for (int u = 0; u < kParamLoads; u += 2 * w) acc[u] += acc[u + w];
  return acc[0];
}

// Adds the block's per-thread partials in warp order (warp 0 lane l: parameter
// column l); the total, for warp 0's lanes.
template <int NT>
LUNAJIT_DEVICE float sum_warp_partials(float s) {
  float* partial = reinterpret_cast<float*>(dynamic_smem());
  partial[threadIdx.x] = s;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x < 32)
    for (int v = 0; v < NT / 32; ++v) total += partial[v * 32 + threadIdx.x];
  return total;
}

template <class K>
__global__ void __launch_bounds__(K::threads) param_reduce_kernel(const BackwardArgs a) {
  using Tr = BackwardTraits<K>;
  if constexpr (Tr::kLearned) {
    constexpr int PF = Tr::kParamFloats, NW = K::threads / 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int p = blockIdx.x * 32 + lane;
    const ParamSlots<K> ps(a, blockIdx.z);
    const long long groups = param_reduce_groups(ps.n, NW), gi = blockIdx.y;
    const long long gb = ps.group_begin(gi, groups), ge = ps.group_begin(gi + 1, groups);
    const long long begin = gb + (ge - gb) * warp / NW, end = gb + (ge - gb) * (warp + 1) / NW;
    float* const col = a.workspace + Tr::workspace(a).slots + p;
    const float s = p < PF && begin < end ? sum_param_rows<PF>(col, begin, end, [&](long long e) { return ps.slot(e); })
                                          : 0.0f;
    const float total = sum_warp_partials<K::threads>(s);
    if (warp == 0 && p < PF && gb < ge) col[ps.slot(gb) * PF] = total;
  }
}

template <class K>
__global__ void __launch_bounds__(K::threads) param_sum_kernel(const BackwardArgs a) {
  using Tr = BackwardTraits<K>;
  if constexpr (Tr::kLearned) {
    constexpr int PF = Tr::kParamFloats, NW = K::threads / 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int p = blockIdx.x * 32 + lane, hb = blockIdx.y;
    const ParamSlots<K> ps(a, hb);
    const long long groups = param_reduce_groups(ps.n, NW);
    const long long begin = groups * warp / NW, end = groups * (warp + 1) / NW;
    const float* const col = a.workspace + Tr::workspace(a).slots + p;
    // No group is empty while n >= 1 (param_reduce_groups <= n); n = 0 has no slots.
    const float s = p < PF && ps.n > 0 && begin < end
                        ? sum_param_rows<PF>(col, begin, end,
                                             [&](long long gi) { return ps.slot(ps.group_begin(gi, groups)); })
                        : 0.0f;
    const float total = sum_warp_partials<K::threads>(s);
    if (warp == 0 && p < PF) a.dparams[(long long)hb * PF + p] = total;
  }
}

}  // namespace lunajit
