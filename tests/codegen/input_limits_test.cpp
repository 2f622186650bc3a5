// Regression tests of issue 15's "silent wrong results" and "messages" findings
// on the parsers: values out of range are errors naming the field, the value
// and the range, never wrapped, clamped or echoed whole.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "codegen/arch.h"
#include "codegen/attention_spec.h"
#include "codegen/launch_plan.h"
#include "codegen/tile_config.h"
#include "common/input_limits.h"
#include "common/read_file.h"

namespace lunajit {
namespace {

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

std::string spec_error(const std::string& json) {
  auto r = spec_from_string(json);
  EXPECT_FALSE(r.ok()) << json;
  return r ? std::string() : r.error().message;
}

TEST(IntegersBeyond32Bits, AreErrorsNotWrapped) {
  // 4294967360 = 2^32 + 64 ran as head_dim 64 before.
  EXPECT_TRUE(has(spec_error(R"({"family":"luna","head_dim":4294967360})"), "head_dim = 4294967360: must be in [1, 256]"));
  EXPECT_TRUE(has(spec_error(R"({"family":"luna","value_dim":18446744073709551615})"), "value_dim = 18446744073709551615"));
  for (const char* field : {"projections", "channels", "mlp_width"})
    EXPECT_TRUE(has(spec_error(std::string(R"({"family":"luna","luna":{")") + field + R"(":4294967304}})"),
                    std::string("luna.") + field + " = 4294967304: must be in"));
  EXPECT_TRUE(has(spec_error(R"({"family":"performer","performer":{"features":4294967360}})"),
                  "performer.features = 4294967360"));
  EXPECT_TRUE(has(spec_error(R"({"family":"slay","slay":{"nodes":4294967299}})"), "slay.nodes = 4294967299"));
  auto c = tile_config_from_string(R"({"block_tokens": 4294967312})", TileConfig());
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(has(c.error().message, "config.block_tokens = 4294967312: allowed: 8, 16, 32, 64, 128")) << c.error().message;
}

TEST(Seeds, NegativeIsAnErrorAndFullRangeIsKept) {
  EXPECT_TRUE(has(spec_error(R"({"family":"performer","performer":{"seed":-1}})"), "performer.seed = -1: must be in [0, 18446744073709551615]"));
  auto s = spec_from_string(R"({"family":"rff","rff":{"seed":18446744073709551615}})");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->rff.seed, 18446744073709551615ull);
}

TEST(FloatsBeyondFloatRange, AreErrors) {
  EXPECT_TRUE(has(spec_error(R"({"family":"luna","eps":1e39})"), "eps = 1e+39: must be a finite number in [1.17549e-38, 1]"));
  EXPECT_TRUE(has(spec_error(R"({"family":"luna","eps":1e-320})"), "eps = "));  // would be emitted as 0f
  EXPECT_TRUE(has(spec_error(R"({"family":"luna","eps":1e308})"), "eps = 1e+308"));
  EXPECT_TRUE(has(spec_error(R"({"family":"performer","performer":{"kernel_eps":1e39}})"),
                  "performer.kernel_eps = 1e+39: must be a finite number in [0, 1]"));
  EXPECT_TRUE(has(spec_error(R"({"family":"slay","slay":{"eps_yat":1e39}})"), "slay.eps_yat = 1e+39"));
  // The ends of the ranges are accepted.
  EXPECT_TRUE(spec_from_string(R"({"family":"luna","eps":1})").ok());
  EXPECT_TRUE(spec_from_string(R"({"family":"performer","performer":{"kernel_eps":0}})").ok());
}

TEST(Messages, LongStringsAreNotEchoedWhole) {
  const std::string big(10 << 20, 'x');
  const std::string e = spec_error(R"({"family":")" + big + R"("})");
  EXPECT_LT(e.size(), 400u) << e.substr(0, 400);
  EXPECT_TRUE(has(e, "(10485760 bytes)")) << e.substr(0, 400);
}

TEST(Messages, AllowedFieldsListTheFamilySubObject) {
  const std::string e = spec_error(R"({"family":"luna","performer":{}})");
  EXPECT_TRUE(has(e, "performer: unknown field; allowed fields: family, head_dim")) << e;
  EXPECT_TRUE(has(e, ", luna")) << e;
}

TEST(Messages, InvalidJsonNamesThePosition) {
  const std::string e = spec_error("{\"family\": \"luna\",\n \"head_dim\": }");
  EXPECT_TRUE(has(e, "not valid JSON at line 2, column")) << e;
}

// Found by tests/fuzz/spec_parser_fuzzer: a number beyond double range threw
// nlohmann's out_of_range out of the parser (corpus: crash_number_overflow.json).
TEST(Messages, NumberBeyondDoubleRangeIsAnErrorNotAnException) {
  EXPECT_TRUE(has(spec_error(R"({"family":"luna","eps":1e400})"), "not valid JSON")) ;
  auto c = tile_config_from_string(R"({"chunk": 1e400})", TileConfig());
  ASSERT_FALSE(c.ok());
}

TEST(Messages, DvBlockExactlyTwiceValueDimIsNotOverTwice) {
  AttentionSpec s = default_spec(Family::luna);
  const Arch sm90 = arch_from_sm(90).value_or_throw();
  auto st = can_implement(s, TileConfig(16, 4, 128, 16, 1), sm90, Pass::forward);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(has(st.error().message, "dv_block 128 is at least twice value_dim 64")) << st.error().message;
}

TEST(NoTileConfigFits, IsAnErrorNamingTheNeed) {
  // performer, d = dv = 256, 2048 features: nothing fits sm_75's 64 KiB.
  auto spec = spec_from_string(
      R"({"family":"performer","head_dim":256,"value_dim":256,"performer":{"features":2048}})").value_or_throw();
  const Arch sm75 = arch_from_sm(75).value_or_throw();
  for (Pass pass : {Pass::feature_map, Pass::forward, Pass::backward}) {
    auto c = fitting_default_config(spec, sm75, pass);
    ASSERT_FALSE(c.ok()) << to_string(pass);
    EXPECT_EQ(c.error().kind, ErrorKind::invalid_argument);
    EXPECT_TRUE(has(c.error().message, "no tile config fits sm_75")) << c.error().message;
    EXPECT_TRUE(has(c.error().message, "bytes of shared memory; sm_75 allows 65536")) << c.error().message;
  }
  // The default spec fits every arch.
  EXPECT_TRUE(fitting_default_config(default_spec(Family::luna), sm75, Pass::backward).ok());
}

TEST(Shapes, SixtyFourBitSafeWithSpacesAndLimits) {
  auto s = parse_shapes(" 2, 8 ,1024 ; 1,16, 4096");
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[1].seq, 4096);
  // 99999999999 became 1215752191 before; 2147483647 is the last int32 seq.
  auto big = parse_shapes("1,1,99999999999");
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(has(big.error().message, "seq = 99999999999: must be in [1, 2147483647]")) << big.error().message;
  EXPECT_TRUE(parse_shapes("1,1,2147483647").ok());
  EXPECT_FALSE(parse_shapes("1,1,2147483648").ok());
  EXPECT_FALSE(parse_shapes("65536,1,1").ok());
  EXPECT_FALSE(parse_shapes("1,-1,1").ok());
  EXPECT_FALSE(parse_shapes("1,1,1,1").ok());
  EXPECT_FALSE(parse_shapes("1,1,1x").ok());
}

TEST(InputLimits, ParseIntIsStrict) {
  EXPECT_EQ(*limits::parse_int("x", " 42 ", {1, 100}), 42);
  EXPECT_FALSE(limits::parse_int("x", "0", {1, 100}).ok());
  EXPECT_FALSE(limits::parse_int("x", "abc", {1, 100}).ok());
  EXPECT_FALSE(limits::parse_int("x", "99999999999999999999", {1, 100}).ok());
  auto e = limits::parse_int("--seq", "0", limits::kSeq);
  EXPECT_TRUE(has(e.error().message, "--seq = 0: must be in [1, 2147483647]")) << e.error().message;
  EXPECT_FALSE(limits::parse_uint64("s", "-1").ok());
  EXPECT_EQ(*limits::parse_uint64("s", "18446744073709551615"), 18446744073709551615ull);
}

TEST(BoundedRead, DevZeroAndFifoAreRefusedAtOnce) {
  auto z = read_file_bounded("/dev/zero", 1 << 20, "spec file");
  ASSERT_FALSE(z.ok());
  EXPECT_TRUE(has(z.error().message, "not a regular file")) << z.error().message;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("lunajit-fifo-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto fifo = dir / "spec.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = read_file_bounded(fifo, 1 << 20, "spec file");  // must not wait for a writer: reads as empty
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_TRUE(f->empty());
  EXPECT_FALSE(load_spec(fifo.string()).ok());
  const auto big = dir / "big.json";
  { std::ofstream(big) << std::string(2000, ' '); }
  auto b = read_file_bounded(big, 1000, "spec file");
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(has(b.error().message, "2000 bytes, more than the limit of 1000 bytes")) << b.error().message;
  auto spec = load_spec("/dev/zero");
  ASSERT_FALSE(spec.ok());
  std::filesystem::remove_all(dir);
}

TEST(InlineJson, OfTheWrongTypeIsNotTakenForAFile) {
  auto r = load_spec("[1,2]");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.error().message, "expected a JSON object, got array")) << r.error().message;
  r = load_spec("5");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.error().message, "got number")) << r.error().message;
}

}  // namespace
}  // namespace lunajit
