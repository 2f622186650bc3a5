// io/safetensors.h: round trips of every dtype, the files the Python package
// writes byte for byte, each malformed-header rule with its message, and a
// deterministic mutation fuzz (truncations, byte flips, header edits) that must
// never crash and must accept only files whose tensors parse consistently.
#include <cstring>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "io/safetensors.h"

namespace lunajit {
namespace {

std::vector<std::byte> file_of(const std::string& header, size_t data_bytes, std::byte fill = std::byte{7}) {
  std::vector<std::byte> out(8 + header.size() + data_bytes, fill);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string error_of(const std::vector<std::byte>& bytes) {
  auto r = parse_safetensors(bytes);
  if (r.ok()) return "(accepted)";
  EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument);
  return r.error().message;
}

Safetensors sample() {
  Safetensors st;
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  st.tensors.push_back(StTensor::from_floats("q", {1, 2, 3}, a));
  StTensor i{"idx", StDType::I64, {2}, std::vector<std::byte>(16)};
  const int64_t iv[2] = {-3, 1LL << 40};
  std::memcpy(i.data.data(), iv, 16);
  st.tensors.push_back(i);
  st.tensors.push_back(StTensor{"empty", StDType::BF16, {0, 4}, {}});
  StTensor h{"h", StDType::F16, {3}, std::vector<std::byte>(6)};
  const uint16_t hv[3] = {0x3c00, 0xc000, 0x0001};  // 1, -2, the smallest subnormal
  std::memcpy(h.data.data(), hv, 6);
  st.tensors.push_back(h);
  st.metadata["lunajit.spec"] = R"({"family":"luna"})";
  return st;
}

TEST(Safetensors, RoundTripsEveryFieldAndPadsTheHeader) {
  const Safetensors st = sample();
  auto bytes = serialize_safetensors(st);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto back = parse_safetensors(*bytes);
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back->tensors.size(), 4u);
  EXPECT_EQ(back->metadata, st.metadata);
  for (const auto& t : st.tensors) {
    const StTensor* b = back->find(t.name);
    ASSERT_NE(b, nullptr) << t.name;
    EXPECT_EQ(b->dtype, t.dtype);
    EXPECT_EQ(b->shape, t.shape);
    EXPECT_EQ(b->data, t.data);
  }
  EXPECT_EQ(back->find("q")->to_floats(), (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f}));
  const auto h = back->find("h")->to_floats();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));
}

TEST(Safetensors, ReadsTheByteLayoutOfTheFormat) {
  // Written by hand from the format description (as the Python package writes it).
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  auto bytes = file_of(header, 8);
  const float v[2] = {0.5f, 4.0f};
  std::memcpy(bytes.data() + 8 + header.size(), v, 8);
  auto r = parse_safetensors(bytes);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->find("a")->to_floats(), (std::vector<float>{0.5f, 4.0f}));
  EXPECT_EQ(r->metadata.at("format"), "pt");
}

TEST(Safetensors, RejectsMalformedFilesNamingTheProblem) {
  const auto has = [](const std::string& msg, const char* what) {
    return msg.find(what) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << msg << " lacks \"" << what << "\"";
  };
  EXPECT_TRUE(has(error_of(std::vector<std::byte>(5)), "shorter than the 8-byte header length"));
  {
    auto b = file_of("{}", 0);
    const uint64_t huge = 1ull << 62;
    std::memcpy(b.data(), &huge, 8);
    EXPECT_TRUE(has(error_of(b), "exceeds the limit"));
    const uint64_t past = 100;
    std::memcpy(b.data(), &past, 8);
    EXPECT_TRUE(has(error_of(b), "runs past the end of the file"));
  }
  EXPECT_TRUE(has(error_of(file_of("[1, 2]", 0)), "not start with '{'"));
  EXPECT_TRUE(has(error_of(file_of("{\"a\": ", 0)), "not valid JSON"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a": 3})", 0)), "tensor \"a\": entry is not an object"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1)),
                  "dtype \"F8\" is not supported"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4)), "dtype is missing"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
                  "not a non-negative integer"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4)),
                  "not a non-negative integer"));
  EXPECT_TRUE(has(error_of(file_of(
                      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})", 4)),
                  "too many elements"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)),
                  "data_offsets must be [begin, end]"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4)),
                  "begin > end"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", 4)),
                  "run past the data buffer (4 bytes)"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4)),
                  "hold 4 bytes but F32 [2] x 4 needs 8"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                       "b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
                  "overlap"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)), "hole"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 12)),
                  "trailing bytes"));
  EXPECT_TRUE(has(error_of(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4)),
                  "unknown field \"x\""));
  EXPECT_TRUE(has(error_of(file_of(R"({"__metadata__":{"k":1}})", 0)), "__metadata__[\"k\"] is not a string"));
}

TEST(Safetensors, WriterRejectsWhatTheReaderWould) {
  Safetensors st;
  st.tensors.push_back(StTensor{"a", StDType::F32, {2}, std::vector<std::byte>(4)});
  auto r = serialize_safetensors(st);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("has 4 bytes of data, its dtype and shape need 8"), std::string::npos);
  st.tensors = {StTensor::from_floats("a", {1}, std::vector<float>{1}), StTensor::from_floats("a", {1}, std::vector<float>{2})};
  r = serialize_safetensors(st);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("appears twice"), std::string::npos);
}

TEST(Safetensors, FileErrorsNameThePath) {
  auto r = read_safetensors("/nonexistent/lunajit/x.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::unavailable);
  EXPECT_NE(r.error().message.find("/nonexistent/lunajit/x.safetensors"), std::string::npos);
}

// Deterministic mutation fuzz: every truncation of a valid file, and 4000
// mutants (random byte flips anywhere, bytes overwritten in the header,
// digits changed in the header). None may crash or hang (ASan/UBSan builds
// catch out-of-bounds reads); each accepted mutant must be self-consistent
// (every tensor's data the size its dtype and shape imply, and re-serializing
// and parsing it again gives the same tensors).
TEST(Safetensors, MutationFuzzNeverCrashesAndAcceptsOnlyConsistentFiles) {
  const auto valid = serialize_safetensors(sample()).value_or_throw();
  size_t rejected_truncations = 0;
  for (size_t len = 0; len < valid.size(); ++len) {
    const std::vector<std::byte> cut(valid.begin(), valid.begin() + len);
    rejected_truncations += !parse_safetensors(cut).ok();
  }
  EXPECT_EQ(rejected_truncations, valid.size()) << "every strict prefix of the file must be rejected";

  std::mt19937_64 rng(20260612);
  uint64_t header_len = 0;
  std::memcpy(&header_len, valid.data(), 8);
  const char digits[] = "0123456789-.e\"{}[],: ";
  size_t accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    std::vector<std::byte> m = valid;
    const int kind = i % 4;
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      if (kind == 0) {  // anywhere
        m[rng() % m.size()] ^= std::byte(1u << (rng() % 8));
      } else if (kind == 1) {  // the length field
        m[rng() % 8] = std::byte(rng() & 0xff);
      } else {  // inside the JSON, with JSON-ish characters
        m[8 + rng() % header_len] = std::byte(digits[rng() % (sizeof(digits) - 1)]);
      }
    }
    if (kind == 3 && rng() % 2) m.resize(rng() % m.size());
    auto r = parse_safetensors(m);
    if (!r.ok()) {
      EXPECT_FALSE(r.error().message.empty());
      continue;
    }
    ++accepted;
    for (const auto& t : r->tensors) ASSERT_EQ(int64_t(t.data.size()), t.numel() * st_dtype_bytes(t.dtype)) << t.name;
    auto again = serialize_safetensors(*r);
    ASSERT_TRUE(again.ok()) << again.error().message;
    auto back = parse_safetensors(*again);
    ASSERT_TRUE(back.ok()) << back.error().message;
    ASSERT_EQ(back->tensors.size(), r->tensors.size());
    for (size_t t = 0; t < r->tensors.size(); ++t) EXPECT_EQ(back->tensors[t].data, r->tensors[t].data);
  }
  // Flips in the data buffer leave a valid file: some mutants must be accepted,
  // or the fuzz would only be exercising the first check.
  EXPECT_GT(accepted, 100u);
}

}  // namespace
}  // namespace lunajit
