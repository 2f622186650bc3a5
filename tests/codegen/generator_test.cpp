// Code generation: determinism, the golden default LUNA forward source, and
// the entries each pass exposes.
#include "codegen/generator.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "templates/embedded.h"

namespace lunajit {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Arch& sm90() {
  static const Arch a = arch_from_sm(90).value_or_throw();
  return a;
}

TEST(Generator, SameInputsGiveByteIdenticalSource) {
  for (Family f : kAllFamilies)
    for (bool causal : {false, true}) {
      AttentionSpec s = default_spec(f);
      s.causal = causal;
      TileConfig c = default_config(s, sm90());
      auto a = generate(s, c, Pass::forward).value_or_throw();
      auto b = generate(s, c, Pass::forward).value_or_throw();
      EXPECT_EQ(a.code, b.code);
      EXPECT_EQ(a.content_hash(), b.content_hash());
      // A different config is a different program.
      TileConfig other(c.block_tokens() == 16 ? 32 : 16, c.warps(), c.dv_block(), c.chunk() == 16 ? 32 : 16,
                       c.state_splits());
      EXPECT_NE(generate(s, other, Pass::forward).value_or_throw().code, a.code);
    }
}

// Pins the default LUNA forward source: a change must be deliberate. Regenerate
// with LUNAJIT_UPDATE_GOLDEN=1 and review the diff.
TEST(Generator, GoldenDefaultLunaForward) {
  for (bool causal : {false, true}) {
    AttentionSpec s = default_spec(Family::luna);
    s.causal = causal;
    auto src = generate(s, default_config(s, sm90()), Pass::forward).value_or_throw();
    const std::string path = std::string(LUNAJIT_GOLDEN_DIR) + "/luna_forward_" +
                             (causal ? "causal" : "noncausal") + "_bf16_sm90.cu";
    if (std::getenv("LUNAJIT_UPDATE_GOLDEN")) {
      std::ofstream(path) << src.code;
    }
    EXPECT_EQ(src.code, read_file(path)) << "generated source differs from " << path;
  }
}

TEST(Generator, HeaderNamesSpecAndConfig) {
  AttentionSpec s = default_spec(Family::performer);
  TileConfig c(32, 2, 64, 32, 2);
  auto src = generate(s, c, Pass::forward).value_or_throw();
  EXPECT_NE(src.code.find("// spec:   " + canonical_json(s)), std::string::npos);
  EXPECT_NE(src.code.find("// config: T32.w2.dv64.C32.s2.recompute"), std::string::npos);
  EXPECT_NE(src.code.find("#include \"lunajit/linear_attention.cuh\""), std::string::npos);
}

TEST(Generator, EntriesPerPass) {
  AttentionSpec s = default_spec(Family::luna);
  auto fwd = generate(s, TileConfig(), Pass::forward).value_or_throw();
  // state_splits > 1: the partials are summed once between the two passes.
  ASSERT_GT(TileConfig().state_splits(), 1);
  ASSERT_EQ(fwd.entries.size(), 3u);
  EXPECT_EQ(fwd.entries[0].name_expression, "lunajit::state_kernel<lunajit_gen::Kernel>");
  EXPECT_EQ(fwd.entries[1].name_expression, "lunajit::state_reduce_kernel<lunajit_gen::Kernel>");
  EXPECT_EQ(fwd.entries[2].name_expression, "lunajit::output_kernel<lunajit_gen::Kernel>");
  auto bwd = generate(s, TileConfig(), Pass::backward).value_or_throw();
  ASSERT_NE(bwd.entry("state_reduce"), nullptr);
  EXPECT_EQ(bwd.entry("state_reduce")->name_expression, "lunajit::backward_state_reduce_kernel<lunajit_gen::Kernel>");
  ASSERT_NE(bwd.entry("dstate_reduce"), nullptr);
  EXPECT_EQ(bwd.entry("dstate_reduce")->name_expression, "lunajit::dstate_reduce_kernel<lunajit_gen::Kernel>");
  auto one = generate(s, TileConfig(64, 4, 64, 64, 1), Pass::forward).value_or_throw();
  EXPECT_EQ(one.entries.size(), 2u);
  s.causal = true;
  auto causal = generate(s, TileConfig(), Pass::forward).value_or_throw();
  ASSERT_EQ(causal.entries.size(), 1u);
  EXPECT_EQ(causal.entries[0].role, "causal_chunk");
  AttentionSpec p = default_spec(Family::performer);
  auto fm = generate(p, TileConfig(), Pass::feature_map).value_or_throw();
  ASSERT_EQ(fm.entries.size(), 2u);
  EXPECT_EQ(fm.entries[0].role, "key_stab");
  EXPECT_NE(fm.entry("feature_map"), nullptr);
}

TEST(Generator, RejectsInvalidSpec) {
  AttentionSpec s = default_spec(Family::luna);
  s.luna.projections = 0;
  auto r = generate(s, TileConfig(), Pass::forward);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("luna.projections = 0"), std::string::npos);
}

TEST(Generator, TemplatesAreEmbedded) {
  bool found = false;
  for (const auto& f : templates::files()) found |= f.path == "lunajit/linear_attention.cuh";
  EXPECT_TRUE(found);
  bool fp16 = false;
  for (const auto& f : cuda_headers::files()) fp16 |= f.path == "cuda_fp16.h" && f.contents.size() > 1000;
  EXPECT_TRUE(fp16);
}

}  // namespace
}  // namespace lunajit
