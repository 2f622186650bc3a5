// Every tile config the tuner may pick for the default LUNA spec (forward,
// causal and not, bf16) runs on the host backend and matches the reference.
// LUNAJIT_SWEEP=full runs all of them; otherwise (CI) a fixed, evenly spaced
// sample of 12 per causal flag, always including the first and last.
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "autotune/validation.h"
#include "runtime/host/host_backend.h"

namespace lunajit {
namespace {

std::vector<TileConfig> sweep_configs(const AttentionSpec& spec, const Arch& arch) {
  std::vector<TileConfig> all;
  for (const auto& c : all_valid_configs(spec, arch))
    if (c.phi_backward() == PhiInBackward::recompute) all.push_back(c);
  const char* mode = std::getenv("LUNAJIT_SWEEP");
  if (mode != nullptr && std::strcmp(mode, "full") == 0) return all;
  constexpr size_t kSample = 12;
  if (all.size() <= kSample) return all;
  std::vector<TileConfig> sample;
  for (size_t i = 0; i < kSample; ++i) sample.push_back(all[i * (all.size() - 1) / (kSample - 1)]);
  return sample;
}

class ForwardSweep : public ::testing::TestWithParam<bool> {};

TEST_P(ForwardSweep, EveryTunerCandidateMatchesReference) {
  static std::unique_ptr<Backend> host = make_host_backend();
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = GetParam();
  const Arch arch = arch_from_sm(90).value_or_throw();
  const auto configs = sweep_configs(spec, arch);
  ASSERT_FALSE(configs.empty());
  for (const TileConfig& c : configs) {
    CheckOptions opt;
    opt.shape = {2, 2, 70};
    opt.seed = 11;
    auto rep = check_forward(*host, spec, c, opt);
    ASSERT_TRUE(rep.ok()) << c.to_string() << ": " << rep.error().message;
    EXPECT_TRUE(rep->pass) << c.to_string() << ": rel rms " << rep->rel_rms;
  }
  std::printf("checked %zu configs\n", configs.size());
}

INSTANTIATE_TEST_SUITE_P(DefaultLuna, ForwardSweep, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "causal" : "noncausal"; });

}  // namespace
}  // namespace lunajit
