// Forward linear attention fused with the feature map (docs/MATH.md §1): phi
// lives only in shared memory, never in global memory.
//
// K is the generated kernel description (codegen/generator.cpp emits it):
//   K::T (I/O element type), K::FeatureMap, K::d, K::dv, K::D, K::threads,
//   K::block_tokens, K::dv_block, K::chunk, K::state_splits, K::causal,
//   K::normalize, K::eps, K::params_per_head, K::param_floats, K::performer.
//
// Non-causal = two passes. state_kernel, grid (batch*heads, splits, dv
// blocks; splits = ForwardArgs::splits, at most K::state_splits): each block
// streams K/V tiles of its part of the sequence and accumulates a partial
// (S, z) in registers; partials go to the workspace.
// With splits > 1, state_reduce_kernel, grid (batch*heads, entry
// blocks), then sums the partials in split order (deterministic) into
// partial 0, once per (batch, head). output_kernel, grid (query tiles,
// batch*heads, dv blocks): reads that state, maps Q and writes O.
// Causal = causal_chunk_kernel, grid (batch*heads, dv blocks): one block walks
// the chunks in order carrying (S, z) in shared memory ("fused chunk").
// Performer additionally runs key_stab_kernel first (one max per batch*head)
// when non-causal; causal performer keeps a running max per row instead
// (performer_causal_chunk).
//
// All accumulation is fp32; the products go through plain loops for now; the
// feature map's two matrix products are where a warp-tile MMA goes next.
#pragma once

#include "lunajit/device.cuh"
#include "lunajit/feature_maps.cuh"
#include "lunajit/layout.cuh"
#include "lunajit/tile_io.cuh"

namespace lunajit {

// Workspace of the forward pass (floats): [key stabiliser (batch*heads), padded
// to 4] then the state partials [batch*heads][splits][D*dv + D].
LUNAJIT_HOST_DEVICE constexpr long long forward_workspace_state_offset(int batch_heads) {
  return (batch_heads + 3) / 4 * 4;
}
LUNAJIT_HOST_DEVICE constexpr long long forward_workspace_floats(int batch_heads, int splits, int D, int dv) {
  return forward_workspace_state_offset(batch_heads) + (long long)batch_heads * splits * ((long long)D * dv + D);
}

template <class K>
struct KernelTraits {
  static constexpr int kNumDvBlocks = (K::dv + K::dv_block - 1) / K::dv_block;
  static LUNAJIT_HOST_DEVICE constexpr LayoutDims dims(int tokens) {
    return LayoutDims{K::d, K::D, K::FeatureMap::kScratchPerRow, K::dv_block, tokens, K::threads,
                      K::performer && K::causal ? 1 : 0};
  }
  static_assert(K::FeatureMap::D == K::D, "feature dimension mismatch between spec and feature map");
  static_assert(K::threads % 32 == 0 && K::threads <= 1024, "threads must be whole warps");

  static LUNAJIT_DEVICE const float* head_params(const float* params, int h) {
    return params + (K::params_per_head ? (long long)h * K::param_floats : 0LL);
  }
};

// Packed variable-length batches (ForwardArgs::cu_seqlens): sequence b's token
// range, and the tensors moved to its first token with stride_batch 0, so the
// kernels index (b, h, t) as for an equal-length batch with t < len. Without
// cu_seqlens every sequence is [0, problem.seq) of batch entry b and the
// tensors are left as they are.
struct SeqSpan {
  long long offset;  // first token in the packed tensors
  int len;
};
LUNAJIT_DEVICE SeqSpan sequence_span(const int* cu_seqlens, int b, int seq) {
  if (cu_seqlens == nullptr) return SeqSpan{0, seq};
  return SeqSpan{(long long)cu_seqlens[b], cu_seqlens[b + 1] - cu_seqlens[b]};
}
template <class T>
LUNAJIT_DEVICE TensorRef at_sequence(TensorRef r, const SeqSpan& s) {
  r.data = static_cast<const T*>(r.data) + s.offset * r.stride_seq;
  r.stride_batch = 0;
  return r;
}
template <class T>
LUNAJIT_DEVICE MutableTensorRef at_sequence(MutableTensorRef r, const SeqSpan& s) {
  r.data = static_cast<T*>(r.data) + s.offset * r.stride_seq;
  r.stride_batch = 0;
  return r;
}
// The arguments as seen by the blocks of sequence b (problem.seq stays the
// longest length: grid and workspace indexing use it).
template <class K>
LUNAJIT_DEVICE ForwardArgs sequence_args(const ForwardArgs& a, const SeqSpan& s) {
  if (a.cu_seqlens == nullptr) return a;
  using T = typename K::T;
  ForwardArgs r = a;
  r.q = at_sequence<T>(a.q, s);
  r.k = at_sequence<T>(a.k, s);
  r.v = at_sequence<T>(a.v, s);
  r.o = at_sequence<T>(a.o, s);
  return r;
}
template <class K>
LUNAJIT_DEVICE BackwardArgs sequence_args(const BackwardArgs& a, const SeqSpan& s) {
  if (a.cu_seqlens == nullptr) return a;
  using T = typename K::T;
  BackwardArgs r = a;
  r.q = at_sequence<T>(a.q, s);
  r.k = at_sequence<T>(a.k, s);
  r.v = at_sequence<T>(a.v, s);
  r.o = at_sequence<T>(a.o, s);
  r.dout = at_sequence<T>(a.dout, s);
  r.dq = at_sequence<T>(a.dq, s);
  r.dk = at_sequence<T>(a.dk, s);
  r.dv = at_sequence<T>(a.dv, s);
  return r;
}

// Writes phi(x) for one tile of rows as fp32 [batch, seq, heads, D] contiguous.
// Grid (ceil(seq / block_tokens), batch*heads).
template <class K>
__global__ void __launch_bounds__(K::threads) feature_map_kernel(const FeatureMapArgs a) {
  using Tr = KernelTraits<K>;
  constexpr SmemLayout L = smem_layout(KernelKind::feature_map, Tr::dims(K::block_tokens));
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.y, b = bh / a.problem.heads, h = bh % a.problem.heads;
  const int t0 = blockIdx.x * K::block_tokens;
  const int valid = min(K::block_tokens, a.problem.seq - t0);
  load_rows<typename K::T, K::threads>(a.x, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
  __syncthreads();
  const FeatureContext ctx{Tr::head_params(a.params, h), t0, a.problem.seq, a.is_query,
                           K::performer && !a.is_query ? a.key_stab[bh] : 0.0f};
  K::FeatureMap::template apply<K::threads>(smem + L.x, smem + L.phi_q, smem + L.scratch, valid, ctx);
  float* out = a.phi + (((long long)b * a.problem.seq + t0) * a.problem.heads + h) * K::D;
  for (int e = threadIdx.x; e < valid * K::D; e += K::threads) {
    const int r = e / K::D, f = e - r * K::D;
    out[(long long)r * a.problem.heads * K::D + f] = smem[L.phi_q + e];
  }
}

// Performer's key stabiliser: max over all keys and features of one
// (batch, head) of the exponent omega^T k' - |k'|^2 / 2. Grid (batch*heads).
template <class K>
LUNAJIT_DEVICE void key_stab_block(const TensorRef& x, const float* params, int b, int h, int seq, int heads,
                                   float* out) {
  using Tr = KernelTraits<K>;
  constexpr SmemLayout L = smem_layout(KernelKind::key_stab, Tr::dims(K::block_tokens));
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const FeatureContext ctx{Tr::head_params(params, h), 0, seq, 0, 0.0f};
  float best = -3.402823466e38f;
  for (int t0 = 0; t0 < seq; t0 += K::block_tokens) {
    const int valid = min(K::block_tokens, seq - t0);
    load_rows<typename K::T, K::threads>(x, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    __syncthreads();
    K::FeatureMap::template log_features<K::threads>(smem + L.x, smem + L.phi_q, smem + L.scratch, valid, ctx);
    for (int e = threadIdx.x; e < valid * K::D; e += K::threads) best = fmaxf(best, smem[L.phi_q + e]);
    __syncthreads();
  }
  smem[L.reduce + threadIdx.x] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int t = 1; t < K::threads; ++t) best = fmaxf(best, smem[L.reduce + t]);
    *out = best;
  }
}

template <class K>
__global__ void __launch_bounds__(K::threads) key_stab_kernel(const FeatureMapArgs a) {
  if constexpr (K::performer) {
    const int bh = blockIdx.x;
    key_stab_block<K>(a.x, a.params, bh / a.problem.heads, bh % a.problem.heads, a.problem.seq, a.problem.heads,
                      a.key_stab + bh);
  }
}

template <class K>
__global__ void __launch_bounds__(K::threads) forward_key_stab_kernel(const ForwardArgs args) {
  if constexpr (K::performer) {
    const int bh = blockIdx.x, b = bh / args.problem.heads;
    const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
    const ForwardArgs a = sequence_args<K>(args, sp);
    key_stab_block<K>(a.k, a.params, b, bh % a.problem.heads, sp.len, a.problem.heads, a.workspace + bh);
  }
}

// The number of ranges of a launch (ForwardArgs::splits, BackwardArgs::splits):
// the plan's runtime choice, at most the compiled K::state_splits.
template <class K, class Args>
LUNAJIT_DEVICE int split_count(const Args& a) {
  return a.splits > 0 ? a.splits : K::state_splits;
}

// The tokens [begin, end) of split `split` of `splits` over a sequence of seq
// tokens in tiles of `tile`: whole tiles, ceil(tiles / splits) each.
struct TokenRange {
  int begin, end;
};
// R: the compiled maximum of `splits`. The division by splits is one by a
// constant for each s <= R: a division by the runtime value made ptxas give
// the 8-warp scalar state kernel 64 registers and 8/16 bytes of spills on
// sm_80 (80 registers, none, with this).
template <int R>
LUNAJIT_DEVICE TokenRange split_range(int seq, int split, int splits, int tile) {
  const int tiles = (seq + tile - 1) / tile;
  int tiles_per_split = tiles;
#pragma unroll
  for (int s = 2; s <= R; ++s)
    if (splits == s) tiles_per_split = (tiles + s - 1) / s;
  const int begin = min(seq, split * tiles_per_split * tile);
  return TokenRange{begin, min(seq, begin + tiles_per_split * tile)};
}

// Non-causal state pass: partial S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j)
// over this block's share of the sequence. Grid (batch*heads, splits, dv blocks).
// The state pass of one block, shared by the forward and the backward:
// partials (S, z) of (batch*heads, split) of `splits` written to `parts_base`
// [batch*heads][splits][D*dv + D].
template <class K>
LUNAJIT_DEVICE void state_block(const Problem& problem, const TensorRef& k_in, const TensorRef& v_in,
                                const float* all_params, float key_stab, float* parts_base, int splits) {
  using Tr = KernelTraits<K>;
  constexpr int T = K::block_tokens, D = K::D, DVB = K::dv_block, NT = K::threads;
  constexpr SmemLayout L = smem_layout(KernelKind::state, Tr::dims(T));
  constexpr int kEntries = state_entries_per_thread(D, DVB, NT);  // (D, DVB) accumulators per thread
  constexpr int kZEntries = (D + NT - 1) / NT;
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.x, b = bh / problem.heads, h = bh % problem.heads;
  const int split = blockIdx.y, c0 = blockIdx.z * DVB, seq = problem.seq;
  const TokenRange range = split_range<K::state_splits>(seq, split, splits, T);
  const int s0 = range.begin, s1 = range.end;
  const float* params = Tr::head_params(all_params, h);

  float acc[kEntries];
  float zacc[kZEntries];
#pragma unroll
  for (int i = 0; i < kEntries; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kZEntries; ++i) zacc[i] = 0.0f;
  for (int t0 = s0; t0 < s1; t0 += T) {
    const int valid = min(T, s1 - t0);
    load_rows<typename K::T, NT>(k_in, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(v_in, b, h, t0, valid, valid, K::dv, c0, DVB, smem + L.v);  // (valid, DVB)
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, smem + L.phi_q, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 0, key_stab});
    const float* phi = smem + L.phi_q;  // (valid, D)
    const float* v = smem + L.v;        // (valid, DVB)
    // Tokens outer, the thread's entries inner: each acc[i] still sums its
    // tokens in order (bitwise as an entry-by-entry loop), but the row's phi
    // and v values are read once per token, not once per FMA, and no per-entry
    // loop state stays live: the default config (32 entries) fits its
    // registers without ptxas's occupancy-driven spill (issue 11 item 5).
    for (int t = 0; t < valid; ++t) {
#pragma unroll
      for (int i = 0; i < kEntries; ++i) {
        const int e = threadIdx.x + i * NT;
        if (e < D * DVB) {
          const int f = e / DVB, c = e - f * DVB;
          acc[i] = fmaf(phi[t * D + f], v[t * DVB + c], acc[i]);
        }
      }
      if (blockIdx.z == 0) {
#pragma unroll
        for (int i = 0; i < kZEntries; ++i) {
          const int f = threadIdx.x + i * NT;
          if (f < D) zacc[i] += phi[t * D + f];
        }
      }
    }
    __syncthreads();
  }
  float* part = parts_base + ((long long)bh * K::state_splits + split) * ((long long)D * K::dv + D);
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = threadIdx.x + i * NT;
    const int f = e / DVB, c = e - f * DVB;
    if (e < D * DVB && c0 + c < K::dv) part[f * K::dv + c0 + c] = acc[i];
  }
  if (blockIdx.z == 0)
#pragma unroll
    for (int i = 0; i < kZEntries; ++i) {
      const int f = threadIdx.x + i * NT;
      if (f < D) part[D * K::dv + f] = zacc[i];
    }
}

// The non-causal state partials [splits][D*dv + D] of one (batch, head)
// summed in split order (fixed: deterministic) into partial 0, in place:
// state_reduce_kernel (forward), backward_state_reduce_kernel and
// dstate_reduce_kernel (backward) run between the pass that writes the
// partials and the kernels that read the state, when splits > 1. The
// readers (output, dstate, dq, dkv; scalar and tensor-core) then read one
// state from partial 0: before, every query or key tile summed all the
// partials itself (the default forward at B 8, H 12, N 16384: 24,576 tiles
// x 4 partials x 16.6 KB = 1.6 GB of L2 reads; the backward's 16-token
// tiles 6.5 GB in dq and again in dkv). The same fp32 sums in the same
// order as the readers' loops were: the same results. Grid (batch*heads,
// ceil((D*dv + D) / threads)); one thread per entry, its `splits` (at most
// the compiled R) loads in flight.
template <class K>
LUNAJIT_DEVICE void reduce_state_partials(float* parts, int splits) {
  constexpr long long kPart = (long long)K::D * K::dv + K::D;
  constexpr int R = K::state_splits;
  const long long e = (long long)blockIdx.y * K::threads + threadIdx.x;
  if (e >= kPart) return;
  float* col = parts + (long long)blockIdx.x * R * kPart + e;
  float x[R];
#pragma unroll
  for (int p = 0; p < R; ++p) x[p] = p < splits ? col[p * kPart] : 0.0f;
  float s = 0.0f;
#pragma unroll
  for (int p = 0; p < R; ++p)
    if (p < splits) s += x[p];
  col[0] = s;
}

template <class K>
__global__ void __launch_bounds__(K::threads) state_reduce_kernel(const ForwardArgs args) {
  reduce_state_partials<K>(args.workspace + forward_workspace_state_offset(args.problem.batch * args.problem.heads),
                           split_count<K>(args));
}

template <class K>
__global__ void __launch_bounds__(K::threads) state_kernel(const ForwardArgs args) {
  const int bh = blockIdx.x;
  const SeqSpan sp = sequence_span(args.cu_seqlens, bh / args.problem.heads, args.problem.seq);
  const ForwardArgs a = sequence_args<K>(args, sp);
  state_block<K>(Problem{a.problem.batch, a.problem.heads, sp.len}, a.k, a.v, a.params, K::performer ? a.workspace[bh] : 0.0f,
                 a.workspace + forward_workspace_state_offset(a.problem.batch * a.problem.heads), split_count<K>(a));
}

// Non-causal output pass: o_i = phi(q_i)^T S / (phi(q_i)^T z + eps).
// Grid (ceil(seq / block_tokens), batch*heads, dv blocks).
template <class K>
__global__ void __launch_bounds__(K::threads) output_kernel(const ForwardArgs args) {
  using Tr = KernelTraits<K>;
  constexpr int T = K::block_tokens, D = K::D, DVB = K::dv_block, NT = K::threads;
  constexpr SmemLayout L = smem_layout(KernelKind::output, Tr::dims(T));
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.y, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const ForwardArgs a = sequence_args<K>(args, sp);
  const int t0 = blockIdx.x * T, c0 = blockIdx.z * DVB, seq = sp.len;
  const int valid = min(T, seq - t0);
  if (valid <= 0) return;  // a tile past the end of a shorter packed sequence (whole block)
  // The state: partial 0, summed over the splits by state_reduce_kernel.
  const float* state = a.workspace + forward_workspace_state_offset(a.problem.batch * a.problem.heads) +
                       (long long)bh * K::state_splits * ((long long)D * K::dv + D);
  float* S = smem + L.state;  // (D, DVB)
  float* z = smem + L.z;      // (D)
  for (int e = threadIdx.x; e < D * DVB; e += NT) {
    const int f = e / DVB, c = e - f * DVB;
    S[e] = c0 + c < K::dv ? state[f * K::dv + c0 + c] : 0.0f;
  }
  for (int f = threadIdx.x; f < D; f += NT) z[f] = state[D * K::dv + f];
  load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
  __syncthreads();
  const FeatureContext ctx{Tr::head_params(a.params, h), t0, seq, 1, 0.0f};
  K::FeatureMap::template apply<NT>(smem + L.x, smem + L.phi_q, smem + L.scratch, valid, ctx);
  const float* phi = smem + L.phi_q;  // (valid, D)
  float* den = smem + L.den;
  if constexpr (K::normalize) {
    for (int r = threadIdx.x; r < valid; r += NT) den[r] = fm::dot(phi + r * D, z, D) + K::eps;
    __syncthreads();
  }
  typename K::T* out = static_cast<typename K::T*>(a.o.data) + b * a.o.stride_batch + h * a.o.stride_head;
  for (int e = threadIdx.x; e < valid * DVB; e += NT) {
    const int r = e / DVB, c = e - r * DVB;
    if (c0 + c >= K::dv) continue;
    float num = 0.0f;
    for (int f = 0; f < D; ++f) num = fmaf(phi[r * D + f], S[f * DVB + c], num);
    if constexpr (K::normalize) num /= den[r];
    out[(long long)(t0 + r) * a.o.stride_seq + c0 + c] = from_float<typename K::T>(num);
  }
}

// Carried state (docs/MATH.md §1a): the (D, cols) slice at value column c0 of
// one (batch, head)'s S [D, dv] and its z [D], fp32 contiguous
// [batch*heads][D][dv] and [batch*heads][D]. Null pointers: the zero state.
template <class K>
LUNAJIT_DEVICE void load_initial_state(const float* S0, const float* z0, int bh, int c0, int cols, float* S,
                                       float* z) {
  for (int e = threadIdx.x; e < K::D * cols; e += K::threads) {
    const int f = e / cols, c = e - f * cols;
    S[e] = S0 != nullptr && c0 + c < K::dv ? S0[((long long)bh * K::D + f) * K::dv + c0 + c] : 0.0f;
  }
  for (int f = threadIdx.x; f < K::D; f += K::threads) z[f] = z0 != nullptr ? z0[(long long)bh * K::D + f] : 0.0f;
}

// Writes the slice back (null pointers: not written); call after the last
// __syncthreads of the scan, every thread writing the entries it owns.
template <class K>
LUNAJIT_DEVICE void store_final_state(float* S1, float* z1, int bh, int c0, int cols, const float* S,
                                      const float* z) {
  if (S1 != nullptr)
    for (int e = threadIdx.x; e < K::D * cols; e += K::threads) {
      const int f = e / cols, c = e - f * cols;
      if (c0 + c < K::dv) S1[((long long)bh * K::D + f) * K::dv + c0 + c] = S[e];
    }
  if (z1 != nullptr)
    for (int f = threadIdx.x; f < K::D; f += K::threads) z1[(long long)bh * K::D + f] = z[f];
}

// Causal performer (docs/MATH.md §2): query i maps the keys it sees with
// M_i = max_{j<=i} s_j, s_j = max_f e_f(k_j) the key's own max, so that
//   phi_i(k_j) = exp(s_j - M_i) (u_j - kappa) + kappa,
// u_j = phi(k_j) mapped with its own s_j (what the query form computes). The
// carried state sits at the level R = M of the last token before the chunk:
//   E = sum_{j<t0} exp(s_j - R)(u_j - kappa) v_j^T, e = the same with v = 1,
//   Vs = sum_{j<t0} v_j,  and t0 keys so far (kappa's share).
// Every exp factor is <= 1, and no value row i reads depends on a key j > i.
// Rows: A_ij = exp(s_j - M_i) (phi_q_i . u_j - kappa Q_i) + kappa Q_i, Q_i = sum_f phi_q_i,f
//   o_i = (sum_j A_ij v_j + exp(R - M_i) phi_q_i^T E + kappa Q_i Vs)
//       / (sum_j A_ij + exp(R - M_i) phi_q_i . e + kappa Q_i t0 + eps).
template <class K>
LUNAJIT_DEVICE void performer_causal_chunk(const ForwardArgs& args) {
  using Tr = KernelTraits<K>;
  constexpr int C = K::chunk, D = K::D, DVB = K::dv_block, NT = K::threads;
  constexpr float kappa = K::FeatureMap::kKernelEps;
  constexpr SmemLayout L = smem_layout(KernelKind::causal_chunk, Tr::dims(C));
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const ForwardArgs a = sequence_args<K>(args, sp);
  const int c0 = blockIdx.y * DVB, seq = sp.len;
  float* S = smem + L.state;      // (D, DVB): E
  float* z = smem + L.z;          // (D): e
  float* phi_q = smem + L.phi_q;  // (C, D)
  float* phi_k = smem + L.phi_k;  // (C, D): u_j
  float* v = smem + L.v;          // (C, DVB)
  float* A = smem + L.scores;     // (C, C)
  float* den = smem + L.den;      // (C)
  float* ks = smem + L.kstab;     // (C): s_j
  float* km = smem + L.kmax;      // (C): M_i
  float* qs = smem + L.qsum;      // (C): Q_i
  float* vs = smem + L.vsum;      // (DVB): Vs
  for (int e = threadIdx.x; e < D * DVB; e += NT) S[e] = 0.0f;
  for (int f = threadIdx.x; f < D; f += NT) z[f] = 0.0f;
  for (int c = threadIdx.x; c < DVB; c += NT) vs[c] = 0.0f;
  const float* params = Tr::head_params(a.params, h);
  typename K::T* out = static_cast<typename K::T*>(a.o.data) + b * a.o.stride_batch + h * a.o.stride_head;
  float level = -3.402823466e38f;  // R; exp(R - M) = 0 before the first chunk, where E = e = 0
  for (int t0 = 0; t0 < seq; t0 += C) {
    const int valid = min(C, seq - t0);
    load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, phi_q, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 1, 0.0f});
    for (int i = threadIdx.x; i < valid; i += NT) {
      float s = 0.0f;
      for (int f = 0; f < D; ++f) s += phi_q[i * D + f];
      qs[i] = s;
    }
    load_rows<typename K::T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.v, b, h, t0, valid, valid, K::dv, c0, DVB, v);
    __syncthreads();
    // Keys in the query form: each shifted by its own max, which apply leaves in scratch.
    K::FeatureMap::template apply<NT>(smem + L.x, phi_k, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 1, 0.0f});
    if (threadIdx.x == 0) {
      float m = level;
      for (int j = 0; j < valid; ++j) {
        ks[j] = smem[L.scratch + j];
        m = fmaxf(m, ks[j]);
        km[j] = m;
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      A[i * C + j] = j <= i ? expf(ks[j] - km[i]) * (fm::dot(phi_q + i * D, phi_k + j * D, D) - kappa * qs[i]) +
                                  kappa * qs[i]
                            : 0.0f;
    }
    __syncthreads();
    if constexpr (K::normalize) {
      for (int i = threadIdx.x; i < valid; i += NT) {
        float s = expf(level - km[i]) * fm::dot(phi_q + i * D, z, D) + kappa * qs[i] * (float)t0;
        for (int j = 0; j <= i; ++j) s += A[i * C + j];
        den[i] = s + K::eps;
      }
      __syncthreads();
    }
    for (int e = threadIdx.x; e < valid * DVB; e += NT) {
      const int i = e / DVB, c = e - i * DVB;
      if (c0 + c >= K::dv) continue;
      float num = 0.0f;
      for (int j = 0; j <= i; ++j) num = fmaf(A[i * C + j], v[j * DVB + c], num);
      float carried = 0.0f;
      for (int f = 0; f < D; ++f) carried = fmaf(phi_q[i * D + f], S[f * DVB + c], carried);
      num = fmaf(expf(level - km[i]), carried, fmaf(kappa * qs[i], vs[c], num));
      if constexpr (K::normalize) num /= den[i];
      out[(long long)(t0 + i) * a.o.stride_seq + c0 + c] = from_float<typename K::T>(num);
    }
    __syncthreads();
    // Move the state past this chunk, to the level of its last token.
    const float next = km[valid - 1], rescale = expf(level - next);
    for (int e = threadIdx.x; e < D * DVB; e += NT) {
      const int f = e / DVB, c = e - f * DVB;
      float s = S[e] * rescale;
      for (int j = 0; j < valid; ++j) s = fmaf(expf(ks[j] - next) * (phi_k[j * D + f] - kappa), v[j * DVB + c], s);
      S[e] = s;
    }
    for (int f = threadIdx.x; f < D; f += NT) {
      float s = z[f] * rescale;
      for (int j = 0; j < valid; ++j) s = fmaf(expf(ks[j] - next), phi_k[j * D + f] - kappa, s);
      z[f] = s;
    }
    for (int c = threadIdx.x; c < DVB; c += NT) {
      float s = vs[c];
      for (int j = 0; j < valid; ++j) s += v[j * DVB + c];
      vs[c] = s;
    }
    level = next;
    __syncthreads();
  }
}

// Causal forward, fused chunks (docs/MATH.md §1 "Chunked causal"): per chunk c
//   A = mask(Phi_q Phi_k^T);  o = (A V + Phi_q S_<c) / (A 1 + Phi_q z_<c + eps)
//   S += Phi_k^T V;  z += Phi_k^T 1
// Grid (batch*heads, dv blocks); the block carries (S, z) through the sequence.
template <class K>
__global__ void __launch_bounds__(K::threads) causal_chunk_kernel(const ForwardArgs args) {
  if constexpr (K::performer) {
    performer_causal_chunk<K>(args);
    return;
  }
  using Tr = KernelTraits<K>;
  constexpr int C = K::chunk, D = K::D, DVB = K::dv_block, NT = K::threads;
  constexpr SmemLayout L = smem_layout(KernelKind::causal_chunk, Tr::dims(C));
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.x, b = bh / args.problem.heads, h = bh % args.problem.heads;
  const SeqSpan sp = sequence_span(args.cu_seqlens, b, args.problem.seq);
  const ForwardArgs a = sequence_args<K>(args, sp);
  const int c0 = blockIdx.y * DVB, seq = sp.len;
  float* S = smem + L.state;      // (D, DVB)
  float* z = smem + L.z;          // (D)
  float* phi_q = smem + L.phi_q;  // (C, D)
  float* phi_k = smem + L.phi_k;  // (C, D)
  float* v = smem + L.v;          // (C, DVB)
  float* A = smem + L.scores;     // (C, C)
  float* den = smem + L.den;      // (C)
  load_initial_state<K>(a.initial_S, a.initial_z, bh, c0, DVB, S, z);
  const float* params = Tr::head_params(a.params, h);
  const float key_stab = K::performer ? a.workspace[bh] : 0.0f;
  typename K::T* out = static_cast<typename K::T*>(a.o.data) + b * a.o.stride_batch + h * a.o.stride_head;

  for (int t0 = 0; t0 < seq; t0 += C) {
    const int valid = min(C, seq - t0);
    load_rows<typename K::T, NT>(a.q, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, phi_q, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 1, 0.0f});
    load_rows<typename K::T, NT>(a.k, b, h, t0, valid, valid, K::d, 0, K::d, smem + L.x);
    load_rows<typename K::T, NT>(a.v, b, h, t0, valid, valid, K::dv, c0, DVB, v);
    __syncthreads();
    K::FeatureMap::template apply<NT>(smem + L.x, phi_k, smem + L.scratch, valid,
                                      FeatureContext{params, t0, seq, 0, key_stab});
    for (int e = threadIdx.x; e < valid * valid; e += NT) {
      const int i = e / valid, j = e - i * valid;
      A[i * C + j] = j <= i ? fm::dot(phi_q + i * D, phi_k + j * D, D) : 0.0f;
    }
    __syncthreads();
    if constexpr (K::normalize) {
      for (int i = threadIdx.x; i < valid; i += NT) {
        float s = fm::dot(phi_q + i * D, z, D);
        for (int j = 0; j <= i; ++j) s += A[i * C + j];
        den[i] = s + K::eps;
      }
      __syncthreads();
    }
    for (int e = threadIdx.x; e < valid * DVB; e += NT) {
      const int i = e / DVB, c = e - i * DVB;
      if (c0 + c >= K::dv) continue;
      float num = 0.0f;
      for (int j = 0; j <= i; ++j) num = fmaf(A[i * C + j], v[j * DVB + c], num);
      for (int f = 0; f < D; ++f) num = fmaf(phi_q[i * D + f], S[f * DVB + c], num);
      if constexpr (K::normalize) num /= den[i];
      out[(long long)(t0 + i) * a.o.stride_seq + c0 + c] = from_float<typename K::T>(num);
    }
    __syncthreads();
    // Each thread owns fixed entries of S and z: no races, fixed summation order.
    for (int e = threadIdx.x; e < D * DVB; e += NT) {
      const int f = e / DVB, c = e - f * DVB;
      float s = S[e];
      for (int j = 0; j < valid; ++j) s = fmaf(phi_k[j * D + f], v[j * DVB + c], s);
      S[e] = s;
    }
    for (int f = threadIdx.x; f < D; f += NT) {
      float s = z[f];
      for (int j = 0; j < valid; ++j) s += phi_k[j * D + f];
      z[f] = s;
    }
    __syncthreads();
  }
  store_final_state<K>(a.final_S, blockIdx.y == 0 ? a.final_z : nullptr, bh, c0, DVB, S, z);
}

}  // namespace lunajit
