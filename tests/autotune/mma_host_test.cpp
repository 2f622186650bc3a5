// The tensor-core forward (TileConfig::mma, templates/lunajit/linear_attention_mma.cuh)
// on the host backend, which executes mma.sync / ldmatrix lane-exactly, against
// the double-precision reference: each family whose default non-causal spec has
// tensor-core configs (CI: luna, performer, slay; LUNAJIT_SWEEP=full: all), in
// bf16 (luna also fp16), at the default config with mma on (luna bf16 also at
// the smallest and largest mma configs and three shapes); plus the sanitizers (init, bounds, sync,
// race under two thread orders) and the scalar/mma boundary of the search space.
//
// Tolerance: forward_tolerance (relative RMS 1e-2, autotune/validation.h) as for
// every bf16/fp16 kernel. The mma path rounds phi(k), phi(q) and the reduced
// state to the I/O dtype once each (relative 2^-8 for bf16, 2^-11 for fp16)
// before exact fp32 products and fp32 sums; with the output's own rounding
// that is a relative RMS of a few 1e-3 for bf16 (docs/MATH.md "Tensor-core
// forward"); the test also asserts the mma error stays within 4x the scalar
// path's error plus 2^-9 for bf16 (2^-12 for fp16), which a wrong fragment
// map, a missed tile or a wrong scale would exceed by orders of magnitude.
#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <random>

#include "autotune/search_space.h"
#include "autotune/validation.h"
#include "codegen/cost_model.h"
#include "codegen/launch_plan.h"
#include "lunajit/layout.cuh"
#include "codegen/feature_params.h"
#include "runtime/attention_runner.h"
#include "tests/autotune/host_cases.h"

namespace lunajit {
namespace {

using namespace testing_host;

std::vector<TileConfig> mma_configs(const AttentionSpec& spec) {
  std::vector<TileConfig> out;
  for (const auto& c : all_valid_configs(spec, sm90()))
    if (c.mma() && c.phi_backward() == PhiInBackward::recompute) out.push_back(c);
  return out;
}

// Causal: the chunk replaces the tile and the splits (the causal kernel reads neither).
int64_t volume(const AttentionSpec& spec, const TileConfig& c) {
  return spec.causal ? int64_t(c.chunk()) * c.threads() * c.dv_block()
                     : int64_t(c.block_tokens()) * c.threads() * c.dv_block() * c.state_splits();
}

// `full`: the default, smallest and largest mma configs at three shapes;
// otherwise the default config with mma on at the first shape (host JIT
// compiles dominate the test's time).
struct Case {
  Family family;
  DType dtype;
  bool full;
  bool causal = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return fmt::format("{}_{}{}", to_string(info.param.family), to_string(info.param.dtype),
                     info.param.causal ? "_causal" : "");
}

AttentionSpec spec_of(const Case& c) {
  AttentionSpec spec = default_spec(c.family);
  spec.causal = c.causal;
  spec.dtype = c.dtype;
  return spec;
}

// The configs a case runs: default with mma on (when it fits), smallest and largest.
std::vector<TileConfig> picks(const AttentionSpec& spec, bool full) {
  std::vector<TileConfig> all = mma_configs(spec);
  std::vector<TileConfig> out;
  if (all.empty()) return out;
  const TileConfig def = default_config(spec, sm90()).with_mma(true);
  if (can_implement(spec, def, sm90())) out.push_back(def);
  if (!full && !out.empty()) return out;
  auto by_volume = [&](const TileConfig& a, const TileConfig& b) {
    return volume(spec, a) != volume(spec, b) ? volume(spec, a) < volume(spec, b) : a < b;
  };
  for (const TileConfig& c : {*std::min_element(all.begin(), all.end(), by_volume),
                              *std::max_element(all.begin(), all.end(), by_volume)})
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

class MmaForwardHost : public ::testing::TestWithParam<Case> {};

TEST_P(MmaForwardHost, MatchesReference) {
  const AttentionSpec spec = spec_of(GetParam());
  const std::vector<TileConfig> configs = picks(spec, GetParam().full);
  if (spec.feature_dim() % 16 == 0) ASSERT_FALSE(configs.empty()) << "D " << spec.feature_dim() << ": no mma config";
  else ASSERT_TRUE(configs.empty()) << "D " << spec.feature_dim() << " is no multiple of 16";
  const double unit = spec.dtype == DType::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
  for (const TileConfig& config : configs) {
    SCOPED_TRACE(config.to_string());
    ASSERT_TRUE(config.mma());
    CheckOptions opt;
    opt.seed = 1;
    // n not a multiple of any tile or chunk; fused QKV strides; b, h > 1 / one
    // token / several tiles and state splits (causal: several chunks, the last
    // partial).
    for (auto [shape, layout] : {std::pair{ProblemShape{2, 3, 77}, InputLayout::fused_qkv},
                                 std::pair{ProblemShape{1, 2, 1}, InputLayout::contiguous},
                                 std::pair{ProblemShape{1, 1, 300}, InputLayout::contiguous}}) {
      if (!GetParam().full && shape.seq != 77) continue;
      opt.shape = shape;
      opt.layout = layout;
      auto mma = check_forward(host_backend(), spec, config, opt);
      ASSERT_TRUE(mma.ok()) << mma.error().message;
      auto scalar = check_forward(host_backend(), spec, config.with_mma(false), opt);
      ASSERT_TRUE(scalar.ok()) << scalar.error().message;
      const std::string what = fmt::format("{} b{} h{} n{}: mma rel rms {:.3e}, scalar {:.3e} (tolerance {:.0e})",
                                           config.to_string(), shape.batch, shape.heads, shape.seq, mma->rel_rms,
                                           scalar->rel_rms, mma->tolerance);
      std::printf("%s %s\n", to_string(spec.family).data(), what.c_str());
      EXPECT_TRUE(mma->pass) << what;
      EXPECT_LE(mma->rel_rms, 4 * scalar->rel_rms + unit) << what;
      EXPECT_GT(mma->rms_reference, 1e-3);
    }
  }
}

// CI: luna (bf16 in full, fp16), performer (its key stabiliser pre-pass) and
// slay (D = 384: many feature tiles, dv_block 16); the mma kernels see the
// other families only through apply() and D. LUNAJIT_SWEEP=full (as for the
// tuner sweep) runs every family; each host JIT compile costs seconds.
std::vector<Case> all_cases() {
  const char* mode = std::getenv("LUNAJIT_SWEEP");
  const bool every = mode != nullptr && std::string(mode) == "full";
  std::vector<Case> cases;
  for (Family f : kAllFamilies)
    if (every || f == Family::luna || f == Family::performer || f == Family::slay)
      cases.push_back({f, DType::bf16, f == Family::luna});
  cases.push_back({Family::luna, DType::fp16, false});
  // Causal (mma_causal_chunk_kernel): luna bf16 in full (default, smallest and
  // largest causal mma configs at three shapes), luna fp16, elu bf16 (D = d).
  cases.push_back({Family::luna, DType::bf16, true, true});
  cases.push_back({Family::luna, DType::fp16, false, true});
  cases.push_back({Family::elu, DType::bf16, false, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, MmaForwardHost, ::testing::ValuesIn(all_cases()), case_name);

// A partial dv block (dv 96 = 64 + 32 with dv_block 64) and d != dv.
// LUNA's feature map on tensor cores (feature_map_mma.cuh) beyond the default
// spec: the envelope gate, a partial projection n-tile with two psi n-tiles
// (M 4, L 16), gelu hidden units with a softplus output (causal), against the
// reference and the scalar kernels (bounds as MatchesReference).
TEST(MmaFeatureMapHost, LunaVariantsMatchTheReference) {
  struct Variant {
    const char* what;
    void (*change)(AttentionSpec&);
  };
  const Variant variants[] = {
      {"envelope", [](AttentionSpec& s) { s.luna.envelope = true; }},
      {"M 4 L 16",
       [](AttentionSpec& s) {
         s.luna.projections = 4;
         s.luna.channels = 16;
       }},
      {"gelu softplus causal",
       [](AttentionSpec& s) {
         s.luna.activation = Activation::gelu;
         s.luna.output_activation = OutputActivation::softplus;
         s.causal = true;
       }},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    AttentionSpec spec = default_spec(Family::luna);
    v.change(spec);
    const TileConfig config = default_config(spec, sm90()).with_mma(true);
    ASSERT_TRUE(feature_map_on_tensor_cores(spec, config, Pass::forward));
    CheckOptions opt;
    opt.seed = 3;
    opt.shape = {2, 2, 77};
    auto mma = check_forward(host_backend(), spec, config, opt);
    ASSERT_TRUE(mma.ok()) << mma.error().message;
    auto scalar = check_forward(host_backend(), spec, config.with_mma(false), opt);
    ASSERT_TRUE(scalar.ok()) << scalar.error().message;
    std::printf("luna %s: mma rel rms %.3e, scalar %.3e\n", v.what, mma->rel_rms, scalar->rel_rms);
    EXPECT_TRUE(mma->pass) << mma->rel_rms;
    EXPECT_LE(mma->rel_rms, 4 * scalar->rel_rms + std::ldexp(1.0, -9));
    EXPECT_GT(mma->rms_reference, 1e-3);
  }
}

// The causal walk's super-chunk split (state_splits R > 1 on a causal mma
// config: per-range states, then each range's walk seeded with the ranges
// before it): R = 2, 4 (a partial last range) and 16 (ranges past the last
// chunk are empty) against the reference, within 1.25x the single walk's
// (R = 1) error: the two differ only in the order of the fp32 state sums and
// hence in an occasional rounding of the 16-bit state copy, where a range
// seeded wrongly (a state missed or counted twice) is off by O(1).
TEST(MmaCausalSuperChunks, RangesMatchTheReferenceAndTheSingleWalk) {
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = true;
  CheckOptions opt;
  opt.seed = 5;
  opt.shape = {2, 3, 300};  // 5 chunks of 64
  const TileConfig single = TileConfig(64, 4, 64, 64, 1).with_mma(true);
  auto one = check_forward(host_backend(), spec, single, opt);
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_TRUE(one->pass);
  for (int ranges : {2, 4, 16}) {
    const TileConfig config = TileConfig(64, 4, 64, 64, ranges).with_mma(true);
    SCOPED_TRACE(config.to_string());
    ASSERT_TRUE(causal_super_chunks(spec, config, Pass::forward));
    auto rep = check_forward(host_backend(), spec, config, opt);
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    std::printf("causal R %d: rel rms %.3e (single walk %.3e)\n", ranges, rep->rel_rms, one->rel_rms);
    EXPECT_TRUE(rep->pass) << rep->rel_rms;
    EXPECT_LE(rep->rel_rms, 1.25 * one->rel_rms) << "single walk " << one->rel_rms;
  }
}

TEST(MmaForwardHostDims, PartialValueBlock) {
  AttentionSpec spec = default_spec(Family::elu);
  spec.causal = false;
  spec.dtype = DType::bf16;
  spec.head_dim = 32;
  spec.value_dim = 96;
  const TileConfig config = TileConfig(32, 4, 64, 64, 2).with_mma(true);
  ASSERT_TRUE(can_implement(spec, config, sm90()));
  CheckOptions opt;
  opt.shape = {1, 2, 50};
  opt.seed = 2;
  auto rep = check_forward(host_backend(), spec, config, opt);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_TRUE(rep->pass) << rep->rel_rms;
}

// Carried state (initial_S/z, final_S/z; docs/MATH.md §1a) and packed
// variable-length batches (cu_seqlens, §3) on the tensor-core kernels: the
// same bf16 inputs through the mma runner and the scalar runner (itself
// checked against the reference by state_host_tests and the varlen tests).
// Tolerance: relative RMS 1e-2 between the two (each is a few 1e-3 from the
// reference, MATH.md "Tensor-core causal forward"); the state must matter
// (the output without it differs by far more), so ignoring it fails.
namespace packed {

using namespace buffers;

struct Outputs {
  std::vector<float> o, S, z;
};

// One forward over the packed batch; state = nullptr: none carried.
Outputs run(const AttentionSpec& spec, const TileConfig& config, const std::vector<int>& cu, int heads,
            const std::vector<uint16_t>& q, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
            const std::vector<float>& params, const std::vector<float>* S0, const std::vector<float>* z0) {
  const int d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim(), B = int(cu.size()) - 1;
  const int total = cu.back();
  int longest = 0;
  for (int b = 0; b < B; ++b) longest = std::max(longest, cu[b + 1] - cu[b]);
  auto runner = AttentionRunner::create(host_backend(), spec, config, Pass::forward).value_or_throw();
  Buffer bq = upload(q.data(), q.size() * 2), bk = upload(k.data(), k.size() * 2), bv = upload(v.data(), v.size() * 2);
  Buffer bo = upload(nullptr, size_t(total) * heads * dv * 2), bp = upload(params.data(), params.size() * 4);
  Buffer bcu = upload(cu.data(), cu.size() * 4);
  const size_t nS = size_t(B) * heads * D * dv, nz = size_t(B) * heads * D;
  Buffer bS0, bz0, bS1, bz1;
  StateRefs st;
  if (S0 != nullptr) {
    bS0 = upload(S0->data(), nS * 4);
    bz0 = upload(z0->data(), nz * 4);
    bS1 = upload(nullptr, nS * 4);
    bz1 = upload(nullptr, nz * 4);
    st = StateRefs{bS0.ptr(), bz0.ptr(), bS1.ptr(), bz1.ptr()};
  }
  auto tref = [&](const Buffer& b, int w) { return TensorRef{b.as_pointer(), 0, int64_t(heads) * w, w}; };
  const MutableTensorRef oref{bo.as_pointer(), 0, int64_t(heads) * dv, dv};
  auto status = runner.forward({B, heads, longest}, tref(bq, d), tref(bk, d), tref(bv, dv), oref, bp.ptr(), st,
                               bcu.ptr());
  EXPECT_TRUE(status.ok()) << status.error().message;
  Outputs out;
  for (uint16_t h : download<uint16_t>(bo, size_t(total) * heads * dv)) out.o.push_back(from_bf16(h));
  if (S0 != nullptr) {
    out.S = download<float>(bS1, nS);
    out.z = download<float>(bz1, nz);
  }
  return out;
}

}  // namespace packed

TEST(MmaForwardHostPacked, CarriedStateAndPackedSequencesMatchTheScalarKernels) {
  using namespace packed;
  const std::vector<int> cu = {0, 37, 127};  // 37 and 90 tokens: 1 and 2 chunks of 64, both partial
  const int heads = 2, total = cu.back(), B = int(cu.size()) - 1;
  for (bool causal : {true, false}) {
    AttentionSpec spec = default_spec(Family::luna);
    spec.causal = causal;
    spec.dtype = DType::bf16;
    const int d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
    const TileConfig scalar = default_config(spec, sm90()).with_mma(false);
    const TileConfig tc = scalar.with_mma(true);
    SCOPED_TRACE(tc.to_string() + (causal ? " causal" : " non-causal"));
    ASSERT_TRUE(can_implement(spec, tc, sm90()));
    std::mt19937_64 rng(11);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    auto bf16s = [&](size_t n) {
      std::vector<uint16_t> x(n);
      for (auto& e : x) e = to_bf16(n01(rng));
      return x;
    };
    const auto q = bf16s(size_t(total) * heads * d), k = bf16s(size_t(total) * heads * d);
    const auto v = bf16s(size_t(total) * heads * dv);
    const std::vector<float> params = init_params(spec, heads, 3);
    std::vector<float> S0(size_t(B) * heads * D * dv), z0(size_t(B) * heads * D);
    // Magnitudes of a state some hundred tokens in (phi > 0 for luna).
    for (float& e : S0) e = 20.0f * n01(rng);
    for (float& e : z0) e = 100.0f * (1.0f + std::abs(n01(rng)));
    const std::vector<float>* s0 = causal ? &S0 : nullptr;
    const std::vector<float>* zz = causal ? &z0 : nullptr;
    const Outputs want = run(spec, scalar, cu, heads, q, k, v, params, s0, zz);
    const Outputs got = run(spec, tc, cu, heads, q, k, v, params, s0, zz);
    const double e_o = rel_rms(got.o, want.o);
    std::printf("packed %s: mma vs scalar rel rms o %.3e", causal ? "causal+state" : "non-causal", e_o);
    EXPECT_LE(e_o, 1e-2);
    if (causal) {
      const double e_S = rel_rms(got.S, want.S), e_z = rel_rms(got.z, want.z);
      std::printf(", final S %.3e, z %.3e", e_S, e_z);
      EXPECT_LE(e_S, 1e-2);
      EXPECT_LE(e_z, 1e-2);
      // The state matters: without it the output and the final state differ by far more.
      const Outputs fresh = run(spec, tc, cu, heads, q, k, v, params, nullptr, nullptr);
      EXPECT_GT(rel_rms(fresh.o, want.o), 10 * e_o + 1e-2);
      EXPECT_GT(rel_rms(S0, want.S), 1e-2);  // and the walk moved it
    }
    std::printf("\n");
  }
}

// check_forward under the init, bounds, sync and race sanitizers in the
// reverse thread order and in `random` (schedule=random:SEED): each passes
// against the reference with at least `launches` sanitized launches and no
// finding, and the two give the same errors (fixed-order sums, no atomics).
// `inspect`, when given, sees each schedule's backend after its check.
void sanitized_forward_twice(const AttentionSpec& spec, const TileConfig& config, const CheckOptions& opt,
                             unsigned launches, const char* random,
                             const std::function<void(const HostBackend&)>& inspect = nullptr) {
  std::vector<CheckReport> reps;
  for (const std::string& schedule : {std::string("init,bounds,sync,race,schedule=reverse"),
                                      "init,bounds,sync,race,schedule=" + std::string(random)}) {
    SCOPED_TRACE(schedule);
    HostBackend backend;
    backend.set_sanitize(host::parse_sanitize(schedule).value_or_throw());
    auto rep = check_forward(backend, spec, config, opt);
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    EXPECT_TRUE(rep->pass) << rep->rel_rms;
    EXPECT_GE(backend.sanitized_launches(), launches);
    EXPECT_TRUE(backend.last_findings().empty());
    if (inspect) inspect(backend);
    reps.push_back(*rep);
  }
  ASSERT_EQ(reps.size(), 2u);
  EXPECT_EQ(reps[0].rel_rms, reps[1].rel_rms);
  EXPECT_EQ(reps[0].max_abs_error, reps[1].max_abs_error);
}

// The sanitizers find nothing, and the result is bitwise the same under both
// thread orders (fixed-order reductions, no atomics).
TEST(MmaForwardSanitized, CleanAndDeterministicUnderTwoSchedules) {
  // luna in both dtypes; performer for its key-stabiliser pre-pass.
  // luna causal in both dtypes (mma_causal_chunk_kernel; n = 33 spans a full
  // chunk of 16 and a partial one at the config below).
  struct Sanitized { Family family; DType dtype; bool causal; };
  for (auto [family, t, causal] : {Sanitized{Family::luna, DType::bf16, false}, Sanitized{Family::luna, DType::fp16, false},
                                   Sanitized{Family::performer, DType::bf16, false},
                                   Sanitized{Family::luna, DType::bf16, true}, Sanitized{Family::luna, DType::fp16, true}}) {
    AttentionSpec spec = default_spec(family);
    spec.causal = causal;
    spec.dtype = t;
    // Causal: chunk 16 so that n = 33 walks three chunks (state carried twice).
    const TileConfig def = default_config(spec, sm90());
    const TileConfig config = causal ? TileConfig(def.block_tokens(), def.warps(), def.dv_block(), 16,
                                                  def.state_splits(), def.phi_backward(), true)
                                     : def.with_mma(true);
    SCOPED_TRACE(config.to_string() + (causal ? " causal" : ""));
    ASSERT_TRUE(can_implement(spec, config, sm90()));
    CheckOptions opt;
    opt.shape = {1, 2, 33};
    opt.seed = 7;
    sanitized_forward_twice(spec, config, opt, causal ? 1u : 2u, "random:20261201");  // causal: the one chunk-walk kernel
  }
}

// The cp.async copies that the last sanitized launch of the kernel with
// `role` issued (every block), 0 if it issued none; fails if it did not run.
std::uint64_t async_copies(const HostBackend& backend, const AttentionSpec& spec, const TileConfig& config,
                           const std::string& role) {
  const KernelSource src = generate(spec, config, Pass::forward).value_or_throw();
  for (const KernelEntry& e : src.entries) {
    if (e.role != role) continue;
    const std::optional<std::uint64_t> n = backend.last_async_copies(e.name_expression);
    EXPECT_TRUE(n.has_value()) << role << " did not run sanitized";
    return n.value_or(0);
  }
  ADD_FAILURE() << "no " << role << " kernel";
  return 0;
}

// The forward's cp.async loads: the state pass's pipeline
// (mma_state_pipelined): a block that walks several tiles (T16, one split:
// n = 77 is five tiles, the last partial) prefetches tile i + 1 while it maps
// and multiplies tile i; the output kernel's query tile, fetched while the
// block sums the state partials (raw rows in the phi tile); and the causal
// walk's next-chunk prefetch (mma_causal_pipelined; C16, two super-chunk
// ranges of three and two chunks, the last partial). Run under the
// sanitizers (a read of a cp.async destination before its wait_group is an
// init finding) in two thread orders, against the reference:
//   dv 64 contiguous: every row 16-byte aligned, the pipeline;
//   dv 60 fused QKV, 2 heads: row stride 2 (64 + 64 + 60) = 376 halves, head
//     stride 188 halves: head 0's rows are aligned (the pipeline, with V's
//     last 16-byte chunk zero-filled past dv), head 1's are not (the
//     synchronous loads): both paths in one launch;
//   dv 60 contiguous and fused with 1 head (strides 60 and 188 halves): rows
//     not 16-byte aligned, the synchronous loads (fused: Q's rows too).
// Which path ran is checked by the emulator's count of cp.async copies: per
// pipelined head, K and V 16-byte chunks of every 16-token tile (5 tiles x
// 16 rows x (8 + 8)) in the state pass, Q's of every valid row (77 x 8) in
// the output pass, and Q, K, V of every chunk (5 x 16 x (8 + 8 + 8)) in the
// walk, rows and columns past the end included (zero-filled); none for a
// head whose rows are not aligned (V's at dv 60 contiguous, everything of
// the fused head 1).
TEST(MmaForwardPipeline, CleanAndCorrectAlignedOrNot) {
  // qk_heads: heads whose Q (and K) rows are aligned; all_heads: whose Q, K and V rows are.
  struct Case { int dv; InputLayout layout; int heads; unsigned qk_heads; unsigned all_heads; };
  for (bool causal : {false, true}) {
    for (auto [dv, layout, heads, qk_heads, all_heads] :
         {Case{64, InputLayout::contiguous, 2, 2, 2}, Case{60, InputLayout::fused_qkv, 2, 1, 1},
          Case{60, InputLayout::contiguous, 1, 1, 0}, Case{60, InputLayout::fused_qkv, 1, 0, 0}}) {
      AttentionSpec spec = default_spec(Family::luna);
      spec.value_dim = dv;
      spec.causal = causal;
      const TileConfig config = causal ? TileConfig(16, 4, 64, 16, 2).with_mma(true)
                                       : TileConfig(16, 4, 64, 64, 1).with_mma(true);
      SCOPED_TRACE(fmt::format("{} dv {} {} heads {}", causal ? "causal" : "non-causal", dv,
                               layout == InputLayout::fused_qkv ? "fused" : "contiguous", heads));
      ASSERT_TRUE(can_implement(spec, config, sm90())) << can_implement(spec, config, sm90()).error().message;
      ASSERT_TRUE(mma_state_pipelined(spec.head_dim, false));
      ASSERT_TRUE(mma_causal_pipelined(spec.head_dim));
      CheckOptions opt;
      opt.shape = {1, heads, 77};
      opt.seed = 11;
      opt.layout = layout;
      const std::uint64_t qk = qk_heads, all = all_heads;
      sanitized_forward_twice(spec, config, opt, causal ? 1u : 2u, "random:20261203", [&](const HostBackend& b) {
        if (causal) {
          // The walk needs Q, K and V aligned (block-uniform).
          EXPECT_EQ(async_copies(b, spec, config, "causal_chunk"), all * 5 * 16 * (8 + 8 + 8));
        } else {
          EXPECT_EQ(async_copies(b, spec, config, "state"), all * 5 * 16 * (8 + 8));
          EXPECT_EQ(async_copies(b, spec, config, "output"), qk * 77 * 8);
        }
      });
    }
  }
}

// The knob's rules and its place in the search space.
TEST(MmaConfig, CanImplementRulesAndSearchSpace) {
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = false;
  spec.dtype = DType::bf16;
  const TileConfig on = default_config(spec, sm90()).with_mma(true);
  EXPECT_TRUE(can_implement(spec, on, sm90()));
  // mma is the default of a bf16/fp16 forward and backward where it
  // implements the default tiles; fp32 specs and the causal performer keep
  // the scalar kernels.
  EXPECT_EQ(default_config(spec, sm90()), on);
  auto rejects = [&](AttentionSpec s, const TileConfig& c, Pass p, const char* words) {
    auto st = can_implement(s, c, sm90(), p);
    ASSERT_FALSE(st) << c.to_string();
    EXPECT_NE(st.error().message.find(words), std::string::npos) << st.error().message;
  };
  AttentionSpec fp32 = spec;
  fp32.dtype = DType::fp32;
  rejects(fp32, on, Pass::forward, "bf16 or fp16");
  AttentionSpec causal = spec;
  causal.causal = true;
  EXPECT_TRUE(can_implement(causal, default_config(causal, sm90()).with_mma(true), sm90()));
  rejects(causal, TileConfig(64, 4, 64, 8, 4).with_mma(true), Pass::forward, "chunk a multiple of 16");
  rejects(causal, TileConfig(64, 1, 64, 128, 4).with_mma(true), Pass::forward, "causal kernel would hold");
  AttentionSpec causal_performer = default_spec(Family::performer);
  causal_performer.causal = true;
  causal_performer.dtype = DType::bf16;
  rejects(causal_performer, default_config(causal_performer, sm90()).with_mma(true), Pass::forward,
          "causal performer");
  for (const auto& c : search_space(causal_performer, Pass::forward, sm90())) EXPECT_FALSE(c.mma()) << c.to_string();
  EXPECT_FALSE(default_config(causal_performer, sm90()).mma());
  EXPECT_FALSE(default_config(fp32, sm90()).mma());
  EXPECT_TRUE(default_config(spec, sm90(), Pass::backward).mma());  // the non-causal bf16 backward
  EXPECT_TRUE(default_config(causal, sm90(), Pass::backward).mma());  // super-chunk walks (mma_backward_host_test.cpp)
  AttentionSpec fp16 = spec;
  fp16.dtype = DType::fp16;
  EXPECT_TRUE(default_config(fp16, sm90()).mma());
  EXPECT_TRUE(default_config(fp16, sm90(), Pass::backward).mma());  // bf16 operands (mma_backward_host_test.cpp)
  EXPECT_TRUE(default_config(causal, sm90()).mma());
  // The bf16 backward has tensor-core kernels (mma_backward_host_test.cpp); the
  // causal one tiles by chunk: the forward's 64-token chunks do not fit its
  // shared memory (causal_dq 246,592 bytes) on sm_90 or sm_80, its own default's do.
  EXPECT_TRUE(can_implement(spec, on, sm90(), Pass::backward));
  EXPECT_TRUE(can_implement(causal, default_config(causal, sm90(), Pass::backward), sm90(), Pass::backward));
  for (const Arch& arch : {sm90(), arch_from_sm(80).value_or_throw()}) {
    auto st = can_implement(causal, default_config(causal, sm90()).with_mma(true), arch, Pass::backward);
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().message.find("shared memory"), std::string::npos) << st.error().message;
  }
  rejects(causal_performer, default_config(causal, sm90(), Pass::backward), Pass::backward, "causal performer");
  rejects(spec, TileConfig(8, 4, 64, 64, 4).with_mma(true), Pass::forward, "block_tokens a multiple of 16");
  rejects(spec, TileConfig(64, 4, 8, 64, 4).with_mma(true), Pass::forward, "dv_block a multiple of 16");
  rejects(spec, TileConfig(64, 1, 64, 64, 4).with_mma(true), Pass::forward, "accumulators");
  AttentionSpec odd = spec;
  odd.luna.projections = 6;
  odd.luna.channels = 5;
  rejects(odd, on, Pass::forward, "multiple of 16");
  // JSON round trip; a config without mma keeps its old JSON (and hash).
  EXPECT_EQ(tile_config_from_json(on.to_json(), TileConfig()).value_or_throw(), on);
  EXPECT_FALSE(on.with_mma(false).to_json().contains("mma"));
  EXPECT_EQ(on.to_string().substr(on.to_string().size() - 4), ".mma");
  auto bad = tile_config_from_string(R"({"mma": 1})", TileConfig());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("config.mma"), std::string::npos);
  // The search space holds both variants; the scalar ones first, so the
  // evenly spaced CI sample (first, middle, last) ends on a tensor-core one.
  const auto space = search_space(spec, Pass::forward, sm90());
  const auto n_mma = std::count_if(space.begin(), space.end(), [](const TileConfig& c) { return c.mma(); });
  EXPECT_GT(n_mma, 0);
  EXPECT_LT(n_mma, static_cast<long>(space.size()));
  EXPECT_TRUE(space.back().mma());
  EXPECT_TRUE(std::is_partitioned(space.begin(), space.end(), [](const TileConfig& c) { return !c.mma(); }));
  EXPECT_TRUE(sample_space(space, 3, default_config(spec, sm90())).at(2).mma());
  // The causal space likewise (its CI sample ends on a tensor-core config).
  const auto causal_space = search_space(causal, Pass::forward, sm90());
  EXPECT_TRUE(causal_space.back().mma());
  EXPECT_TRUE(std::is_partitioned(causal_space.begin(), causal_space.end(), [](const TileConfig& c) { return !c.mma(); }));
  EXPECT_TRUE(sample_space(causal_space, 3, default_config(causal, sm90())).at(2).mma());
  // The causal performer's backward and fp32 spaces have no mma configs.
  for (const auto& c : search_space(causal_performer, Pass::backward, sm90())) EXPECT_FALSE(c.mma()) << c.to_string();
  for (const auto& c : search_space(fp32, Pass::forward, sm90())) EXPECT_FALSE(c.mma()) << c.to_string();
}

}  // namespace
}  // namespace lunajit
