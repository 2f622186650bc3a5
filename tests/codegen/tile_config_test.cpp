// TileConfig: value semantics, parsing, can_implement and the default per arch.
#include "codegen/tile_config.h"

#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "lunajit/layout.cuh"

namespace lunajit {
namespace {

TEST(TileConfig, ValueSemantics) {
  TileConfig a(64, 4, 64, 64, 4), b(64, 4, 64, 64, 4), c(32, 4, 64, 64, 4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a.hash(), c.hash());
  EXPECT_EQ(a.to_string(), "T64.w4.dv64.C64.s4.recompute");
  EXPECT_EQ(a.threads(), 128);
  auto back = tile_config_from_json(a.to_json(), TileConfig(16, 1, 8, 16, 1));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, a);
}

TEST(TileConfig, ParsingRejectsUnknownAndOutOfSet) {
  auto r = tile_config_from_string(R"({"warps": 3})", TileConfig());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("config.warps = 3: allowed: 1, 2, 4, 8"), std::string::npos);
  r = tile_config_from_string(R"({"tile": 3})", TileConfig());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("config.tile: unknown field"), std::string::npos);
}

TEST(TileConfig, CanImplementExplainsSharedMemoryLimit) {
  AttentionSpec s = default_spec(Family::luna);
  s.causal = true;
  const Arch sm86 = arch_from_sm(86).value_or_throw();
  const Arch sm90 = arch_from_sm(90).value_or_throw();
  TileConfig big(64, 4, 64, 128, 4);
  EXPECT_TRUE(can_implement(s, big, sm90).ok());
  auto st = can_implement(s, big, sm86);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("causal_chunk kernel needs"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("sm_86 allows 101376"), std::string::npos) << st.error().message;
}

TEST(TileConfig, StateAccumulatorsBoundedByRegisters) {
  AttentionSpec s = default_spec(Family::slay);  // D = 384
  const Arch sm90 = arch_from_sm(90).value_or_throw();
  auto st = can_implement(s, TileConfig(16, 1, 64, 16, 1), sm90);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("accumulators per thread"), std::string::npos);
}

TEST(TileConfig, DefaultIsImplementableEverywhere) {
  for (int sm : known_sms()) {
    const Arch arch = arch_from_sm(sm).value_or_throw();
    for (Family f : kAllFamilies)
      for (bool causal : {false, true}) {
        AttentionSpec s = default_spec(f);
        s.causal = causal;
        TileConfig c = default_config(s, arch);
        EXPECT_TRUE(can_implement(s, c, arch).ok()) << to_string(f) << " " << arch.name() << " " << c.to_string();
      }
  }
  // The default LUNA spec (bf16) on sm_90 gets the largest tiles in the
  // forward (8 warps non-causal, 4 causal), 16-token tiles in the non-causal
  // backward (occupancy: the comments in default_config), all on tensor
  // cores, on sm_80 too; the causal backward's walks on tensor cores
  // with 16-token chunks, 8 warps and 16 ranges; fp32 stays scalar.
  AttentionSpec luna = default_spec(Family::luna);
  const Arch sm90 = arch_from_sm(90).value_or_throw();
  EXPECT_EQ(default_config(luna, sm90), TileConfig(64, 8, 64, 64, 4).with_mma(true));
  EXPECT_EQ(default_config(luna, arch_from_sm(80).value_or_throw()), TileConfig(64, 8, 64, 64, 4).with_mma(true));
  {
    AttentionSpec c = luna;
    c.causal = true;
    EXPECT_EQ(default_config(c, sm90), TileConfig(64, 4, 64, 64, 4).with_mma(true));
  }
  EXPECT_EQ(default_config(luna, sm90, Pass::backward), TileConfig(16, 4, 64, 64, 4).with_mma(true));
  EXPECT_EQ(default_config(luna, arch_from_sm(80).value_or_throw(), Pass::backward),
            TileConfig(16, 4, 64, 64, 4).with_mma(true));
  AttentionSpec causal = luna;
  causal.causal = true;
  EXPECT_EQ(default_config(causal, sm90, Pass::backward), TileConfig(64, 8, 64, 16, 16).with_mma(true));
  EXPECT_EQ(default_config(causal, arch_from_sm(80).value_or_throw(), Pass::backward),
            TileConfig(64, 8, 64, 16, 16).with_mma(true));
  // sm_75 has no bf16 mma.sync: can_implement refuses mma there, so its defaults are scalar.
  const Arch sm75 = arch_from_sm(75).value_or_throw();
  for (Pass pass : {Pass::forward, Pass::backward}) {
    EXPECT_FALSE(default_config(luna, sm75, pass).mma());
    auto st = can_implement(luna, default_config(luna, sm90, pass), sm75, pass);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("sm_80 or later"), std::string::npos) << st.error().message;
  }
  for (Pass pass : {Pass::forward, Pass::backward})
    for (int sm : known_sms()) {  // every arch's default of both passes, causal or not, fits
      const Arch arch = arch_from_sm(sm).value_or_throw();
      for (bool c : {false, true}) {
        AttentionSpec s = luna;
        s.causal = c;
        EXPECT_TRUE(can_implement(s, default_config(s, arch, pass), arch, pass).ok()) << arch.name();
      }
    }
  luna.dtype = DType::fp32;
  EXPECT_FALSE(default_config(luna, sm90).mma());
  EXPECT_FALSE(default_config(luna, sm90, Pass::backward).mma());
}

TEST(TileConfig, AllValidConfigsAreUniqueAndValid) {
  AttentionSpec s = default_spec(Family::luna);
  const Arch arch = arch_from_sm(80).value_or_throw();
  auto all = all_valid_configs(s, arch);
  EXPECT_GT(all.size(), 10u);
  std::set<TileConfig> unique(all.begin(), all.end());
  EXPECT_EQ(unique.size(), all.size());
  for (const auto& c : all) EXPECT_TRUE(can_implement(s, c, arch).ok());
}

// The device code's copy of the shared-memory columns of the arch table
// (layout.cuh, keyed by __CUDA_ARCH__) agrees with codegen/arch.cpp.
TEST(Arch, DeviceSharedMemoryTableMatches) {
  for (int sm : known_sms()) {
    const Arch a = arch_from_sm(sm).value_or_throw();
    EXPECT_EQ(arch_smem_per_sm(sm * 10), a.max_smem_per_sm) << a.name();
    EXPECT_EQ(arch_smem_reserved_per_block(sm * 10), a.smem_reserved_per_block) << a.name();
  }
  // One block of the sm_90 causal_dkv default (190,240 B) fits an H100 SM; two of 97,568 B do.
  EXPECT_EQ(blocks_by_smem(190240, arch_smem_per_sm(900), 1024), 1);
  EXPECT_EQ(blocks_by_smem(97568, arch_smem_per_sm(900), 1024), 2);
  EXPECT_EQ(blocks_by_smem(97568, arch_smem_per_sm(800), 1024), 1);
}

TEST(Arch, ParsesAndRejects) {
  EXPECT_EQ(parse_arch("sm_90").value_or_throw().sm, 90);
  EXPECT_EQ(parse_arch("8.6").value_or_throw().sm, 86);
  auto bad = parse_arch("sm_42");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("arch = sm_42: unknown; allowed: sm_75"), std::string::npos);
  auto list = parse_arch_list("sm_80,sm_90");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
}

}  // namespace
}  // namespace lunajit
