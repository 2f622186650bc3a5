// Sequence-parallel linear attention (torch_binding/sequence_parallel.h).
// Shapes: B batch, n local tokens, H heads, D feature dim, dv value dim.
#include "torch_binding/sequence_parallel.h"

#include "torch_binding/aten_attention.h"
#include "torch_binding/linear_attention.h"

namespace lunajit::dist {

using torch::Tensor;

int64_t sequence_parallel_payload_bytes(const AttentionSpec& spec, int64_t batch, int64_t heads,
                                        torch::ScalarType compute) {
  const int64_t cols = spec.value_dim + (spec.normalize ? 1 : 0);
  return batch * heads * spec.feature_dim() * cols * int64_t(c10::elementSize(compute));
}

namespace {

// The kernel paths (sequence_parallel.h, "Paths"): the two halves of
// non-causal attention on the kernels (linear_attention.h,
// packed_state_kernels / output_from_state_kernels) and the carried-state op
// for the causal pass, all differentiated by the backward kernels; the
// collectives are the ATen path's.
Tensor kernel_path(Communicator& comm, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                   const AttentionSpec& spec, const SequenceParallelOptions& options, AttentionPath path) {
  const int64_t H = q.size(2), dv = spec.value_dim;
  LinearAttentionOptions op;
  op.path = path;
  op.config = options.config;
  const Tensor delta = packed_state_kernels(k, v, params, spec, H, op);  // (B, H, D, dv [+ 1]): (S_r | z_r)
  if (spec.causal) {
    const Tensor prefix = exclusive_prefix_over_ranks(comm, delta);
    const LinearAttentionState seed{prefix.narrow(-1, 0, dv).contiguous(),
                                    spec.normalize ? prefix.select(-1, dv).contiguous()
                                                   : torch::zeros({prefix.size(0), H, prefix.size(2)},
                                                                  prefix.options())};
    return linear_attention_with_state(q, k, v, params, spec, seed, false, op).out;
  }
  return output_from_state_kernels(q, params, spec, sum_over_ranks(comm, delta, options.reduction), op);
}

}  // namespace

Tensor sequence_parallel_linear_attention(Communicator& comm, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& feature_params, const AttentionSpec& spec,
                                          const SequenceParallelOptions& options) {
  const AttentionPath path = resolve_path(options.path, q.defined() ? q.device() : torch::Device(torch::kCPU));
  check_linear_attention_inputs(q, k, v, feature_params, spec, path, /*check_finite=*/false);
  TORCH_CHECK(spec.family != Family::cosformer && spec.family != Family::performer,
              "sequence_parallel_linear_attention: family ", std::string(to_string(spec.family)),
              " is not supported (its features depend on the whole sequence: cosformer on the global position, "
              "performer on a key stabiliser over all keys); supported: luna, rff, elu, relu, t2r, hedgehog, slay");
  TORCH_CHECK(options.chunk >= 1, "sequence_parallel_linear_attention: options.chunk = ", options.chunk,
              ": must be >= 1");
  TORCH_CHECK(!spec.causal || options.reduction == Reduction::fixed_order,
              "sequence_parallel_linear_attention: options.reduction = backend_allreduce is for non-causal specs "
              "only (the causal exclusive prefix is an allgather summed in rank order)");

  if (path != AttentionPath::aten) return kernel_path(comm, q, k, v, feature_params, spec, options, path);

  const int64_t H = q.size(2), dv = spec.value_dim;
  const Tensor kk = repeat_kv_heads(k, H), vk = repeat_kv_heads(v, H);
  const Tensor pq = aten::feature_map(q, feature_params, spec, aten::FeatureRole::query);  // (B, n, H, D)
  const Tensor pk = aten::feature_map(kk, feature_params, spec, aten::FeatureRole::key);   // (B, m, H, D)
  Tensor vv = vk.to(pq.scalar_type());                                                     // (B, m, H, dv)
  // Normalized: carry a column of ones next to v, so that the numerator's last
  // column is the denominator (sum_j <phi_q_i, phi_k_j> = phi_q_i . z) and one
  // pass and one collective serve both.
  if (spec.normalize) vv = torch::cat({vv, torch::ones({vv.size(0), vv.size(1), H, 1}, vv.options())}, -1);
  const Tensor delta = torch::einsum("bnhd,bnhe->bhde", {pk, vv});  // (B, H, D, dv [+ 1]): (S_r | z_r)

  Tensor num;  // (B, n, H, dv [+ 1])
  if (!spec.causal) {
    const Tensor state = sum_over_ranks(comm, delta, options.reduction);
    num = torch::einsum("bnhd,bhde->bnhe", {pq, state});
  } else {
    const Tensor prefix = exclusive_prefix_over_ranks(comm, delta);
    // The local causal pass seeded with the ranks-before-me prefix, built here
    // from the ATen pieces: the zero-state chunked pass plus phi(q_i) S_<r.
    // Once the op takes an initial state (issue 14 item 1, "initial_state"),
    // this is lunajit::linear_attention(q, k, v, params, spec, {.initial_state =
    // (S_<r, z_<r)}), which also runs the kernel paths; the collectives stay.
    const Tensor local = aten::linear_attention_from_features(pq, pk, vv, /*causal=*/true, /*normalize=*/false,
                                                              /*eps=*/0.0, options.chunk);
    num = local + torch::einsum("bnhd,bhde->bnhe", {pq, prefix});
  }
  Tensor out = num;
  if (spec.normalize) out = num.narrow(-1, 0, dv) / (num.narrow(-1, dv, 1) + spec.eps);
  return out.to(q.scalar_type());
}

}  // namespace lunajit::dist
