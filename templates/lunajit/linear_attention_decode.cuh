// One decoding step of causal linear attention (docs/MATH.md §3, "Decoding"):
// for each sequence of a batch, one new token (q, k, v) against the carried
// state (S, z) of the tokens before it:
//   S += phi(k) v^T ;  z += phi(k) ;  o = phi(q)^T S / (phi(q)^T z + eps)
// (the new key included, as in the causal forward where key j <= i is seen).
//
// Grid (batch*heads): one block owns the whole (D, dv) state of its
// (batch, head), so the update is in place with no race; each thread owns fixed
// entries of S and z (fixed summation order: the step is deterministic).
// The work is O(D dv) per (batch, head) and token, independent of how many
// tokens came before: what makes linear attention's decoding constant-time.
// Not for performer (its running key stabiliser) nor cosformer (position
// features); the host side rejects those before generating this kernel.
#pragma once

#include "lunajit/decode_layout.cuh"
#include "lunajit/linear_attention.cuh"

namespace lunajit {

template <class K>
__global__ void __launch_bounds__(K::threads) decode_step_kernel(const DecodeArgs a) {
  using Tr = KernelTraits<K>;
  constexpr int D = K::D, DV = K::dv, NT = K::threads;
  constexpr DecodeSmem L = decode_smem_layout(K::d, D, DV, K::FeatureMap::kScratchPerRow);
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  const int bh = blockIdx.x, b = bh / a.problem.heads, h = bh % a.problem.heads;
  const float* params = Tr::head_params(a.params, h);
  float* S = a.state_S + (long long)bh * D * DV;  // (D, dv) in global memory
  float* z = a.state_z + (long long)bh * D;       // (D)
  float* phi_q = smem + L.phi_q;
  float* phi_k = smem + L.phi_k;
  float* v = smem + L.v;
  load_rows<typename K::T, NT>(a.k, b, h, 0, 1, 1, K::d, 0, K::d, smem + L.x);
  load_rows<typename K::T, NT>(a.v, b, h, 0, 1, 1, DV, 0, DV, v);
  __syncthreads();
  K::FeatureMap::template apply<NT>(smem + L.x, phi_k, smem + L.scratch, 1, FeatureContext{params, 0, 1, 0, 0.0f});
  __syncthreads();
  load_rows<typename K::T, NT>(a.q, b, h, 0, 1, 1, K::d, 0, K::d, smem + L.x);
  __syncthreads();
  K::FeatureMap::template apply<NT>(smem + L.x, phi_q, smem + L.scratch, 1, FeatureContext{params, 0, 1, 1, 0.0f});
  // State update: each thread its own entries.
  for (int e = threadIdx.x; e < D * DV; e += NT) {
    const int f = e / DV, c = e - f * DV;
    S[e] = fmaf(phi_k[f], v[c], S[e]);
  }
  for (int f = threadIdx.x; f < D; f += NT) z[f] += phi_k[f];
  __syncthreads();  // the block's global writes are visible to the block after the barrier
  if constexpr (K::normalize) {
    if (threadIdx.x == 0) smem[L.den] = fm::dot(phi_q, z, D) + K::eps;
    __syncthreads();
  }
  typename K::T* out = static_cast<typename K::T*>(a.o.data) + b * a.o.stride_batch + h * a.o.stride_head;
  for (int c = threadIdx.x; c < DV; c += NT) {
    float num = 0.0f;
    for (int f = 0; f < D; ++f) num = fmaf(phi_q[f], S[f * DV + c], num);
    if constexpr (K::normalize) num /= smem[L.den];
    out[c] = from_float<typename K::T>(num);
  }
}

}  // namespace lunajit
