// Arguments of every lunajit kernel, passed by value as the kernel's only
// parameter (so a launch is `void* args[] = {&a}` on CUDA and on the host).
//
// This header is plain C++ as well as CUDA: the host library includes it to fill
// the structs, so both sides agree on the ABI by construction.
#pragma once

#ifndef LUNAJIT_KERNEL_ARGS_INT64
#define LUNAJIT_KERNEL_ARGS_INT64 long long
#endif

namespace lunajit {

typedef LUNAJIT_KERNEL_ARGS_INT64 i64;

// A [batch, seq, heads, dim] tensor with unit stride in dim (docs/ARCHITECTURE.md).
// Strides are in elements, not bytes.
struct TensorRef {
  const void* data;
  i64 stride_batch;
  i64 stride_seq;
  i64 stride_head;
};

struct MutableTensorRef {
  void* data;
  i64 stride_batch;
  i64 stride_seq;
  i64 stride_head;
};

struct Problem {
  int batch;
  int heads;
  int seq;
};

// Feature map alone: phi = feature_map(x), written as fp32 [batch, seq, heads, D]
// contiguous. `is_query` selects the query form where the family distinguishes
// them (performer's stabiliser).
struct FeatureMapArgs {
  Problem problem;
  TensorRef x;
  float* phi;
  const float* params;  // docs in codegen/feature_params.h
  float* key_stab;      // [batch * heads]; performer only, written by key_stab_kernel
  int is_query;
};

// Forward linear attention. `workspace` holds the non-causal state partials
// [batch*heads, splits, D * dv + D] fp32 and performer's key stabiliser
// [batch*heads]; its size comes from the launch plan.
struct ForwardArgs {
  Problem problem;
  TensorRef q;
  TensorRef k;
  TensorRef v;
  MutableTensorRef o;
  const float* params;
  float* workspace;
  // Carried state (causal only; docs/MATH.md §1a), fp32 contiguous
  // S [batch, heads, D, dv] and z [batch, heads, D]. initial_*: null = the zero
  // state; final_*: null = not written. May not alias each other.
  const float* initial_S;
  const float* initial_z;
  float* final_S;
  float* final_z;
  // Variable-length packed batch (docs/MATH.md §3 "Packed sequences"); null:
  // problem.batch equal-length sequences of problem.seq tokens. Else int32
  // [problem.batch + 1] offsets (fla's cu_seqlens): sequence b is the tokens
  // cu_seqlens[b] .. cu_seqlens[b+1]-1 of tensors packed as [1, total, heads, dim]
  // (stride_batch is ignored), and problem.seq is the longest length (it sizes
  // the grid and the workspace).
  const int* cu_seqlens;
  // Ranges the sequence of each (batch, head) is split into by the state pass
  // and the causal super-chunk walk: the launch plan's choice for the GPU and
  // shape (best_splits), 1 .. K::state_splits (the compiled maximum); 0 =
  // K::state_splits. The workspace keeps its compiled layout
  // ([batch*heads][K::state_splits][...]: partial p of head bh at bh R + p,
  // so addresses stay compile-time multiples); a launch fills the first
  // `splits` partials of each head (and, causal backward, `splits` parameter
  // slots per head and side, dense).
  int splits;
};

// Backward of linear attention (docs/MATH.md §1). o is the forward output,
// dout the upstream gradient. dq, dk, dv are written in the I/O dtype; dparams
// [param blocks, per-head floats] fp32 is overwritten with the gradient of every
// learned parameter (fixed tensors get 0). The workspace size comes from the
// launch plan.
struct BackwardArgs {
  Problem problem;
  TensorRef q;
  TensorRef k;
  TensorRef v;
  TensorRef o;
  TensorRef dout;
  MutableTensorRef dq;
  MutableTensorRef dk;
  MutableTensorRef dv;
  const float* params;
  float* dparams;
  float* workspace;
  // Carried state (causal only; layout as ForwardArgs): the forward's initial
  // state (null = zero), the upstream gradient of its final state (null = zero),
  // and where the gradient of the initial state goes (null = not written).
  const float* initial_S;
  const float* initial_z;
  const float* dfinal_S;
  const float* dfinal_z;
  float* dinitial_S;
  float* dinitial_z;
  const int* cu_seqlens;  // as in ForwardArgs
  int splits;             // as in ForwardArgs
};

// One decoding step (templates/lunajit/linear_attention_decode.cuh): q, k, v
// hold one token per sequence ([batch, 1, heads, dim], problem.seq = 1); the
// state S [batch, heads, D, dv], z [batch, heads, D] (fp32 contiguous) is
// updated in place, then o = phi(q)^T S / (phi(q)^T z + eps).
struct DecodeArgs {
  Problem problem;
  TensorRef q;
  TensorRef k;
  TensorRef v;
  MutableTensorRef o;
  const float* params;
  float* state_S;
  float* state_z;
};

}  // namespace lunajit
