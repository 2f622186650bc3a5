// LibTorch modules over lunajit::linear_attention:
//
//   FeatureMap                the feature map of a spec with its parameters in the
//                             flat layout of codegen/feature_params.h (one tensor
//                             `params`, initialised by init_params): a trainable
//                             Parameter for learned families (luna, t2r, hedgehog),
//                             a buffer for fixed ones (performer, rff, slay) and
//                             nothing for elu, relu, cosformer. Kernels read the
//                             very same tensor, so module and kernels agree.
//   LinearAttention           the attention core on [batch, seq, heads, dim] heads
//                             of one spec (a FeatureMap + the op).
//   QuadraticAttention        softmax / yat / spherical-yat cores with the same
//                             interface: teachers and baselines.
//   MultiheadLinearAttention  q/k/v/out projections, heads, causal flag, optional
//                             depthwise convolution of V (MATH.md §3) around a
//                             core; forward() has torch::nn::MultiheadAttention's
//                             signature and [seq, batch, embed] layout (or
//                             batch_first), so it drops in where that one is used.
//   MultiheadQuadraticAttention  the same around a quadratic core.
//   make_multihead_attention  a factory from a spec, a family name or a
//                             quadratic kind.
//
// Saving: save_safetensors / load_safetensors (below) store parameters and
// buffers with the spec of every FeatureMap and check it on load;
// torch::save(module, path) / torch::load also work but store no spec, so they
// load silently into a module of another spec with the same sizes.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "codegen/attention_spec.h"
#include "torch_binding/aten_attention.h"
#include "torch_binding/linear_attention.h"

namespace lunajit::nn {

class FeatureMapImpl : public torch::nn::Module {
 public:
  // Parameters for `heads` heads (one shared block when !spec.params_per_head),
  // initialised by init_params(spec, heads, seed).
  FeatureMapImpl(const AttentionSpec& spec, int64_t heads, uint64_t seed = 0);

  // phi(x) for x [batch, seq, heads, head_dim] -> [batch, seq, heads, D] (ATen).
  torch::Tensor forward(const torch::Tensor& x, aten::FeatureRole role = aten::FeatureRole::query);

  // Tensor `name` of the layout as [heads, shape...] (a view; see aten::param_tensor).
  torch::Tensor tensor(const std::string& name) const;

  const AttentionSpec& spec() const { return spec_; }
  int64_t heads() const { return heads_; }
  // Whether `params` is a trainable Parameter (the family has learned tensors).
  bool learned() const { return learned_; }

  // The flat buffer; an empty tensor for parameter-free families.
  torch::Tensor params;

 private:
  AttentionSpec spec_;
  int64_t heads_;
  bool learned_ = false;
};
TORCH_MODULE(FeatureMap);

// FeatureMap constructors of the learned families, for readers who think in
// families rather than specs (each builds the spec and calls FeatureMap).
FeatureMap luna_feature_map(int64_t head_dim, int64_t heads, const LunaOptions& options = {},
                            bool params_per_head = true, uint64_t seed = 0);
FeatureMap t2r_feature_map(int64_t head_dim, int64_t heads, int64_t features = 0, bool params_per_head = true,
                           uint64_t seed = 0);
FeatureMap hedgehog_feature_map(int64_t head_dim, int64_t heads, int64_t features = 0, bool params_per_head = true,
                                uint64_t seed = 0);

// The core of an attention layer: per-head q [batch, seq_q, heads, d], k
// [batch, seq_k, heads_kv, d] and v [batch, seq_k, heads_kv, dv] -> [batch,
// seq_q, heads, dv]. heads_kv divides heads (grouped-query attention, kv head j
// serving query heads j*g .. j*g+g-1); seq_k != seq_q only when not causal.
// key_mask: bool [batch, seq_k], true for real keys (undefined: all real);
// masked keys contribute nothing (LinearAttentionOptions::key_mask).
class AttentionCoreImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& key_mask = {}) = 0;
  // The row-normalized (linear: as normalized by the spec) weights [batch, heads, seq_q, seq_k].
  virtual torch::Tensor weights(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& key_mask = {}) = 0;
  virtual bool causal() const = 0;
};

class LinearAttentionImpl : public AttentionCoreImpl {
 public:
  LinearAttentionImpl(const AttentionSpec& spec, int64_t heads, LinearAttentionOptions options = {},
                      uint64_t seed = 0);
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& key_mask = {}) override;
  torch::Tensor weights(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& key_mask = {}) override;
  bool causal() const override { return spec_.causal; }

  // Causal attention from `state` (undefined: zero) returning the output and
  // the state after the last token (lunajit::linear_attention_with_state).
  LinearAttentionStateOutput forward_with_state(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v, const LinearAttentionState& state);
  // One token per sequence (lunajit::linear_attention_step).
  LinearAttentionStepOutput step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const LinearAttentionState& state);

  const AttentionSpec& spec() const { return spec_; }
  LinearAttentionOptions& options() { return options_; }
  FeatureMap feature_map;

 private:
  AttentionSpec spec_;
  LinearAttentionOptions options_;
};
TORCH_MODULE(LinearAttention);

class QuadraticAttentionImpl : public AttentionCoreImpl {
 public:
  explicit QuadraticAttentionImpl(aten::QuadraticOptions options);
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& key_mask = {}) override;
  torch::Tensor weights(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& key_mask = {}) override;
  bool causal() const override { return options_.causal; }
  const aten::QuadraticOptions& options() const { return options_; }

 private:
  aten::QuadraticOptions options_;
};
TORCH_MODULE(QuadraticAttention);

struct MultiheadOptions {
  int64_t embed_dim = 256;
  int64_t num_heads = 4;
  // Key/value heads (grouped-query attention): k_proj and v_proj project to
  // num_kv_heads * head_dim; each kv head serves num_heads / num_kv_heads query
  // heads. 0: num_heads (plain multi-head attention).
  int64_t num_kv_heads = 0;
  bool bias = true;           // of the four projections
  bool dwc = false;           // o += depthwise conv (kernel dwc_kernel) of the projected V
  int64_t dwc_kernel = 5;
  bool batch_first = false;   // [batch, seq, embed] instead of torch's [seq, batch, embed]
};

// Projections, heads and DWC around any core. forward() follows
// torch::nn::MultiheadAttention: (attn_output, attn_weights), weights averaged
// over heads [batch, seq_q, seq_k] (or [batch, heads, seq_q, seq_k]) when
// need_weights, else an undefined tensor. need_weights defaults to false (unlike
// torch's true): the weights are O(seq_q * seq_k), which the linear forward
// avoids. key_padding_mask: bool [batch, seq_k], true for padding (torch's
// meaning); pad keys contribute nothing, so real tokens' outputs equal those of
// the unpadded sequence (right or left padding, causal or not; rows of pad
// queries are meaningless). Every family and path: on the kernel paths and for
// cosformer and causal performer the op packs the real tokens of each row into
// a variable-length batch (LinearAttentionOptions::cu_seqlens), pad query rows
// 0; need_weights with a mask is rejected for those two. attn_mask is rejected (linear attention has no per-pair mask;
// causality comes from the core). key and value share [seq_k, batch]; seq_k may
// differ from query's seq_q when the core is not causal (cross-attention;
// not with dwc, which adds a convolution of V to each query position).
class MultiheadAttentionBaseImpl : public torch::nn::Module {
 public:
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& query, const torch::Tensor& key,
                                                   const torch::Tensor& value,
                                                   const torch::Tensor& key_padding_mask = {},
                                                   bool need_weights = false, const torch::Tensor& attn_mask = {},
                                                   bool average_attn_weights = true);
  const MultiheadOptions& options() const { return options_; }
  std::shared_ptr<AttentionCoreImpl> core() const { return core_; }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  torch::nn::Conv1d dwc{nullptr};

 protected:
  MultiheadAttentionBaseImpl(const MultiheadOptions& options, std::shared_ptr<AttentionCoreImpl> core);

 private:
  MultiheadOptions options_;
  std::shared_ptr<AttentionCoreImpl> core_;
};

// What autoregressive generation carries per layer between calls of
// MultiheadLinearAttention::forward_incremental: the attention state (S, z)
// [batch, heads, D, dv] / [batch, heads, D] (fp32), and with dwc the last
// dwc_kernel - 1 projected values [batch, embed_dim, dwc_kernel - 1] (the
// causal convolution's window). Default-constructed: an empty prefix. Its size
// does not grow with the sequence.
struct IncrementalState {
  LinearAttentionState attention;
  torch::Tensor dwc_window;
  int64_t tokens = 0;  // tokens seen so far
};

class MultiheadLinearAttentionImpl : public MultiheadAttentionBaseImpl {
 public:
  // spec.head_dim and spec.value_dim must be embed_dim / num_heads.
  MultiheadLinearAttentionImpl(const MultiheadOptions& options, const AttentionSpec& spec,
                               LinearAttentionOptions op_options = {}, uint64_t seed = 0);
  LinearAttention linear() const { return linear_; }

  // Self-attention over the next tokens x ([seq, batch, embed], or [batch,
  // seq, embed] when batch_first) of sequences whose earlier tokens `state`
  // summarises: a prompt (seq > 1, the stateful causal forward) or one token
  // at a time (seq == 1, linear_attention_step: the decode kernel on kernel
  // paths). Returns the output for x and the state after it; feeding a
  // sequence in any split equals forward(x, x, x) on the whole (causal cores
  // only; no key padding; the same spec restrictions as the state op).
  std::tuple<torch::Tensor, IncrementalState> forward_incremental(const torch::Tensor& x,
                                                                  const IncrementalState& state = {});

 private:
  LinearAttention linear_{nullptr};
};
TORCH_MODULE(MultiheadLinearAttention);

class MultiheadQuadraticAttentionImpl : public MultiheadAttentionBaseImpl {
 public:
  MultiheadQuadraticAttentionImpl(const MultiheadOptions& options, aten::QuadraticOptions quadratic);
};
TORCH_MODULE(MultiheadQuadraticAttention);

// A multi-head attention from a spec (its head_dim/value_dim must be
// embed_dim / num_heads).
std::shared_ptr<MultiheadAttentionBaseImpl> make_multihead_attention(const AttentionSpec& spec,
                                                                     const MultiheadOptions& options,
                                                                     LinearAttentionOptions op_options = {},
                                                                     uint64_t seed = 0);
// From text: "softmax", "yat", "spherical_yat" (quadratic), a family name
// ("luna", "performer", ...: its default spec with head_dim = value_dim =
// embed_dim / num_heads, dtype fp32), or spec JSON / a spec file. `causal`
// applies to the quadratic kinds and family names; a spec carries its own.
std::shared_ptr<MultiheadAttentionBaseImpl> make_multihead_attention(const std::string& kind,
                                                                     const MultiheadOptions& options,
                                                                     bool causal = false,
                                                                     LinearAttentionOptions op_options = {},
                                                                     uint64_t seed = 0);

// Checkpoints as safetensors (io/safetensors.h), the format python/lunajit
// writes too: every parameter and buffer of `module` under its dotted name
// (named_parameters/named_buffers, e.g. "core.feature_map.params"), in its own
// dtype, and metadata "lunajit.spec:<path>" = canonical_json(spec) for each
// FeatureMap submodule at dotted path <path> ("" for the module itself), plus
// `metadata`. load_safetensors checks that the file holds exactly the module's
// tensors with the same shapes and the same spec for every FeatureMap, and
// throws (c10::Error) naming the first difference; values are converted to each
// tensor's dtype, so a checkpoint loads into a module moved to another dtype.
void save_safetensors(const torch::nn::Module& module, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});
void load_safetensors(torch::nn::Module& module, const std::string& path);

}  // namespace lunajit::nn
