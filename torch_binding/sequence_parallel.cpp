// Sequence-parallel linear attention (torch_binding/sequence_parallel.h).
// Shapes: B batch, n local tokens, H heads, D feature dim, dv value dim.
#include "torch_binding/sequence_parallel.h"

#include "common/input_limits.h"
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

// The kernel paths (sequence_parallel.h, "Paths"): everything through
// linear_attention_with_state, whose autograd runs the backward kernels; the
// collectives and the packing of (S | z) are the ATen path's.
Tensor kernel_path(Communicator& comm, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& params,
                   const AttentionSpec& spec, const SequenceParallelOptions& options, AttentionPath path) {
  const int64_t B = q.size(0), H = q.size(2), D = spec.feature_dim(), dv = spec.value_dim;
  LinearAttentionOptions op;
  op.path = path;
  op.config = options.config;
  AttentionSpec causal = spec;
  causal.causal = true;

  // This rank's delta: the final state of a zero-state causal pass over its
  // k, v shard. Non-causal, the pass's queries are stand-ins (k itself) whose
  // outputs are dropped: the state does not depend on them.
  const Tensor q_state = spec.causal ? q : repeat_kv_heads(k, H).detach();
  const LinearAttentionStateOutput local = linear_attention_with_state(q_state, k, v, params, causal, {}, true, op);
  const Tensor S_r = local.final_state.S, z_r = local.final_state.z;  // fp32 (B, H, D, dv), (B, H, D)
  const Tensor delta = spec.normalize ? torch::cat({S_r, z_r.unsqueeze(-1)}, -1) : S_r;
  auto unpack = [&](const Tensor& packed) {
    return LinearAttentionState{packed.narrow(-1, 0, dv).contiguous(),
                                spec.normalize ? packed.select(-1, dv).contiguous() : torch::zeros_like(z_r)};
  };

  if (spec.causal) {
    const LinearAttentionState prefix = unpack(exclusive_prefix_over_ranks(comm, delta));
    return linear_attention_with_state(q, k, v, params, spec, prefix, false, op).out;
  }

  // o_i = phi(q_i) S / (phi(q_i) z + eps) from the summed (S | z): an
  // unnormalized causal pass over q with v = 0 adds nothing to the carried
  // state, so its output is phi(q_i) (S | z) exactly; in fp32 so that the
  // numerator and the denominator are rounded once, by the division below.
  TORCH_CHECK(delta.size(-1) <= limits::kValueDim.hi, "sequence_parallel_linear_attention: path ",
              std::string(to_string(path)), " reads a normalized non-causal output through a pass of value_dim dv + 1 = ",
              delta.size(-1), ", above the kernels' limit of ", limits::kValueDim.hi,
              "; use value_dim <= ", limits::kValueDim.hi - 1, " or path aten");
  const Tensor state = sum_over_ranks(comm, delta, options.reduction);  // (B, H, D, dv [+ 1])
  const int64_t cols = state.size(-1);
  AttentionSpec readout = causal;
  readout.normalize = false;
  readout.value_dim = int(cols);
  readout.dtype = DType::fp32;
  const Tensor q32 = q.to(torch::kFloat);
  const Tensor zeros_v = torch::zeros({B, q.size(1), H, cols}, q32.options());
  LinearAttentionOptions op_readout = op;
  op_readout.config.reset();
  const LinearAttentionState seed{state.contiguous(), torch::zeros({B, H, D}, state.options())};
  const Tensor num = linear_attention_with_state(q32, q32.detach(), zeros_v, params, readout, seed, false, op_readout).out;
  Tensor out = num;
  if (spec.normalize) out = num.narrow(-1, 0, dv) / (num.narrow(-1, dv, 1) + spec.eps);
  return out.to(q.scalar_type());
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
