// The sequence-parallel cases shared by the rank program (seq_parallel_worker)
// and the test that launches it (sequence_parallel_test): the same specs and
// the same seeded inputs in both, so the test's single-process run sees exactly
// the tensors the ranks split.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "codegen/attention_spec.h"
#include "torch_binding/linear_attention.h"
#include "torch_binding/sequence_parallel.h"

namespace lunajit::dist::testing {

inline constexpr int64_t kBatch = 2, kSeq = 96, kHeads = 2, kHeadDim = 8, kValueDim = 6, kChunk = 16;

struct SpCase {
  std::string name;
  std::string family_json;  // the family's extra JSON fields
  bool causal = false;
  int64_t heads_kv = kHeads;
  Reduction reduction = Reduction::fixed_order;
  AttentionPath path = AttentionPath::aten;
};

// luna (neural and rff variants), elu, hedgehog; causal and not; one
// grouped-query case; one through the backend's allreduce; on the ATen path,
// and the host kernels' two-pass composition (sequence_parallel.h, "Paths")
// causal and not, normalized and not, grouped-query, allreduce.
inline std::vector<SpCase> sp_cases() {
  const std::string luna = R"("family": "luna", "luna": {"projections": 3, "channels": 2, "mlp_width": 5})";
  return {
      {"luna_full", luna, false},
      {"luna_causal", luna, true},
      {"luna_full_allreduce", luna, false, kHeads, Reduction::backend_allreduce},
      {"luna_rff_causal_unnormalized",
       R"("family": "luna", "luna": {"projections": 3, "channels": 2, "variant": "rff"}, "normalize": false)", true},
      {"elu_full", R"("family": "elu")", false},
      {"elu_causal_gqa", R"("family": "elu")", true, 1},
      {"hedgehog_causal", R"("family": "hedgehog", "hedgehog": {"features": 8})", true},
      {"luna_causal_host_kernels", luna, true, kHeads, Reduction::fixed_order, AttentionPath::host_kernels},
      {"luna_full_host_kernels", luna, false, kHeads, Reduction::fixed_order, AttentionPath::host_kernels},
      {"luna_rff_causal_unnormalized_host_kernels",
       R"("family": "luna", "luna": {"projections": 3, "channels": 2, "variant": "rff"}, "normalize": false)", true,
       kHeads, Reduction::fixed_order, AttentionPath::host_kernels},
      {"elu_full_gqa_unnormalized_allreduce_host_kernels", R"("family": "elu", "normalize": false)", false, 1,
       Reduction::backend_allreduce, AttentionPath::host_kernels},
  };
}

inline AttentionSpec spec_of(const SpCase& c) {
  const std::string json = fmt::format(R"({{{}, "head_dim": {}, "value_dim": {}, "dtype": "fp32", "causal": {}}})",
                                       c.family_json, kHeadDim, kValueDim, c.causal ? "true" : "false");
  auto spec = spec_from_string(json);
  TORCH_CHECK(spec.ok(), json, ": ", spec.ok() ? "" : spec.error().message);
  return *spec;
}

struct SpInputs {
  torch::Tensor q, k, v, params, dout;
};

// The whole sequence's inputs of case index `i` (fp32, CPU).
inline SpInputs sp_inputs(const SpCase& c, int i) {
  const AttentionSpec spec = spec_of(c);
  torch::manual_seed(1000 + i);
  SpInputs in;
  in.q = torch::randn({kBatch, kSeq, kHeads, kHeadDim});
  in.k = torch::randn({kBatch, kSeq, c.heads_kv, kHeadDim});
  in.v = torch::randn({kBatch, kSeq, c.heads_kv, kValueDim});
  in.dout = torch::randn({kBatch, kSeq, kHeads, kValueDim});
  in.params = init_feature_params(spec, kHeads, 7 + i);
  return in;
}

// Shard lengths the test gives R ranks (uneven on purpose, summing to kSeq).
inline std::vector<int64_t> shard_lengths(int world) {
  if (world == 1) return {kSeq};
  if (world == 2) return {50, 46};
  if (world == 4) return {37, 5, 30, 24};
  TORCH_CHECK(false, "shard_lengths: world = ", world, ": the test knows 1, 2 and 4");
  return {};
}

inline int64_t shard_start(const std::vector<int64_t>& lengths, int rank) {
  int64_t s = 0;
  for (int r = 0; r < rank; ++r) s += lengths[r];
  return s;
}

}  // namespace lunajit::dist::testing
