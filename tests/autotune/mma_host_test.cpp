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
// state to the I/O dtype once each (relative 2^-9 for bf16, 2^-12 for fp16)
// before exact fp32 products and fp32 sums; with the output's own rounding
// that is a relative RMS of a few 1e-3 for bf16 (docs/MATH.md "Tensor-core
// forward"); the test also asserts the mma error stays within 4x the scalar
// path's error plus 2^-9 for bf16 (2^-12 for fp16), which a wrong fragment
// map, a missed tile or a wrong scale would exceed by orders of magnitude.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "autotune/search_space.h"
#include "autotune/validation.h"
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

int64_t volume(const TileConfig& c) { return int64_t(c.block_tokens()) * c.threads() * c.dv_block() * c.state_splits(); }

// `full`: the default, smallest and largest mma configs at three shapes;
// otherwise the default config with mma on at the first shape (host JIT
// compiles dominate the test's time).
struct Case {
  Family family;
  DType dtype;
  bool full;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return fmt::format("{}_{}", to_string(info.param.family), to_string(info.param.dtype));
}

AttentionSpec spec_of(const Case& c) {
  AttentionSpec spec = default_spec(c.family);
  spec.causal = false;
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
  auto by_volume = [](const TileConfig& a, const TileConfig& b) {
    return volume(a) != volume(b) ? volume(a) < volume(b) : a < b;
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
    // n not a multiple of any tile; fused QKV strides; b, h > 1 / one token /
    // several tiles and state splits.
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
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, MmaForwardHost, ::testing::ValuesIn(all_cases()), case_name);

// A partial dv block (dv 96 = 64 + 32 with dv_block 64) and d != dv.
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

// The sanitizers find nothing, and the result is bitwise the same under both
// thread orders (fixed-order reductions, no atomics).
TEST(MmaForwardSanitized, CleanAndDeterministicUnderTwoSchedules) {
  // luna in both dtypes; performer for its key-stabiliser pre-pass.
  for (auto [family, t] : {std::pair{Family::luna, DType::bf16}, std::pair{Family::luna, DType::fp16},
                           std::pair{Family::performer, DType::bf16}}) {
    AttentionSpec spec = default_spec(family);
    spec.causal = false;
    spec.dtype = t;
    const TileConfig config = default_config(spec, sm90()).with_mma(true);
    ASSERT_TRUE(can_implement(spec, config, sm90()));
    CheckOptions opt;
    opt.shape = {1, 2, 33};
    opt.seed = 7;
    std::vector<CheckReport> reps;
    for (const char* schedule : {"init,bounds,sync,race,schedule=reverse",
                                 "init,bounds,sync,race,schedule=random:20261201"}) {
      SCOPED_TRACE(schedule);
      HostBackend backend;
      backend.set_sanitize(host::parse_sanitize(schedule).value_or_throw());
      auto rep = check_forward(backend, spec, config, opt);
      ASSERT_TRUE(rep.ok()) << rep.error().message;
      EXPECT_TRUE(rep->pass) << rep->rel_rms;
      EXPECT_GE(backend.sanitized_launches(), 2u);
      EXPECT_TRUE(backend.last_findings().empty());
      reps.push_back(*rep);
    }
    EXPECT_EQ(reps[0].rel_rms, reps[1].rel_rms);
    EXPECT_EQ(reps[0].max_abs_error, reps[1].max_abs_error);
  }
}

// The knob's rules and its place in the search space.
TEST(MmaConfig, CanImplementRulesAndSearchSpace) {
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = false;
  spec.dtype = DType::bf16;
  const TileConfig on = default_config(spec, sm90()).with_mma(true);
  EXPECT_TRUE(can_implement(spec, on, sm90()));
  EXPECT_FALSE(default_config(spec, sm90()).mma());
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
  rejects(causal, on, Pass::forward, "causal");
  rejects(spec, on, Pass::backward, "backward");
  rejects(spec, TileConfig(8, 4, 64, 64, 4).with_mma(true), Pass::forward, "block_tokens a multiple of 16");
  rejects(spec, TileConfig(64, 4, 8, 64, 4).with_mma(true), Pass::forward, "dv_block a multiple of 16");
  rejects(spec, TileConfig(64, 1, 64, 64, 4).with_mma(true), Pass::forward, "accumulators");
  AttentionSpec odd = spec;
  odd.luna.projections = 6;
  odd.luna.channels = 5;
  rejects(odd, on, Pass::forward, "multiple of 16");
  // JSON round trip; a config without mma keeps its old JSON (and hash).
  EXPECT_EQ(tile_config_from_json(on.to_json(), TileConfig()).value_or_throw(), on);
  EXPECT_FALSE(default_config(spec, sm90()).to_json().contains("mma"));
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
  // Backward and fp32 spaces have no mma configs.
  for (const auto& c : search_space(spec, Pass::backward, sm90())) EXPECT_FALSE(c.mma()) << c.to_string();
  for (const auto& c : search_space(fp32, Pass::forward, sm90())) EXPECT_FALSE(c.mma()) << c.to_string();
}

}  // namespace
}  // namespace lunajit
