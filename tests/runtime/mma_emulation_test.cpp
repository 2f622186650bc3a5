// Warp-level matrix primitives (templates/lunajit/mma.cuh) on the host
// emulator: mma.sync m16n8k16 / m16n8k8 against a scalar GEMM, every ldmatrix
// variant against the PTX ISA's lane map, cp.async groups and zero-fill,
// bf16x2 FMA, and the errors: a wrong fragment index gives a wrong product,
// lanes at different call sites or a partial warp abort with the line, a store
// into a pending cp.async destination is reported.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "runtime/host/host_backend.h"
#include "tests/runtime/mma_test_kernels.h"

namespace lunajit::test {
namespace {

class MmaEmulation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = new HostBackend();
    Result<std::shared_ptr<LoadedModule>> m = backend_->load(mma_test_kernels());
    ASSERT_TRUE(m.ok()) << m.error().message;
    module_ = new std::shared_ptr<LoadedModule>(std::move(m.value()));
  }
  static void TearDownTestSuite() {
    delete module_;
    delete backend_;
  }

  template <class T>
  Buffer upload(const std::vector<T>& v) {
    Buffer b = backend_->allocate(std::max<std::size_t>(v.size(), 1) * sizeof(T)).value_or_throw();
    if (!v.empty()) {
      EXPECT_TRUE(backend_->copy_to_device(b, v.data(), v.size() * sizeof(T)).ok());
    }
    return b;
  }
  template <class T>
  std::vector<T> download(const Buffer& b, std::size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(backend_->copy_to_host(v.data(), b, n * sizeof(T)).ok());
    return v;
  }
  Status launch(std::string_view kernel, unsigned threads, MmaArgs& args, unsigned smem = 0, unsigned blocks = 1) {
    void* params[] = {&args};
    return backend_->launch(**module_, kernel, LaunchConfig{{blocks, 1, 1}, {threads, 1, 1}, smem}, params);
  }

  static HostBackend* backend_;
  static std::shared_ptr<LoadedModule>* module_;
};
HostBackend* MmaEmulation::backend_ = nullptr;
std::shared_ptr<LoadedModule>* MmaEmulation::module_ = nullptr;

// Random 16-bit operands (values in [-2, 2), exactly representable) and their floats.
struct Operands {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Operands random_operands(std::size_t n, bool bf16, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  Operands o;
  for (std::size_t i = 0; i < n; ++i) {
    uint16_t b = bf16 ? float_to_bf16_bits(dist(rng)) : float_to_fp16_bits(dist(rng));
    o.bits.push_back(b);
    o.values.push_back(bf16 ? bf16_bits_to_float(b) : fp16_bits_to_float(b));
  }
  return o;
}

// D = A B + C for M x K row-major A, K x 8 row-major B: the emulator's
// documented order (C, then k = 0..K-1, fp32) and, in double, the exact value.
void scalar_gemm(int M, int K, const float* A, const float* B, const float* C, float* D32, double* D64) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < 8; ++j) {
      float acc = C[i * 8 + j];
      double exact = C[i * 8 + j];
      for (int k = 0; k < K; ++k) {
        acc += A[i * K + k] * B[k * 8 + j];
        exact += static_cast<double>(A[i * K + k]) * B[k * 8 + j];
      }
      D32[i * 8 + j] = acc;
      D64[i * 8 + j] = exact;
    }
  }
}

// Runs an mma kernel on `warps` tiles and checks D bitwise against the fp32
// k-order GEMM (and within K * 2^-24 * sum|terms| of the exact value, the
// bound of a K-term fp32 sum, as the device's tensor cores would be).
void expect_gemm(MmaEmulation* t, const std::vector<float>& got, int M, int K, int warps, const Operands& a,
                 const Operands& b, const std::vector<float>& c) {
  for (int w = 0; w < warps; ++w) {
    std::vector<float> d32(M * 8);
    std::vector<double> d64(M * 8);
    scalar_gemm(M, K, &a.values[w * M * K], &b.values[w * K * 8], &c[w * M * 8], d32.data(), d64.data());
    for (int i = 0; i < M * 8; ++i) {
      ASSERT_EQ(got[w * M * 8 + i], d32[i]) << "warp " << w << " element (" << i / 8 << "," << i % 8 << ")";
      double mag = std::fabs(c[w * M * 8 + i]);
      for (int k = 0; k < K; ++k) mag += std::fabs(a.values[w * M * K + (i / 8) * K + k] * b.values[w * K * 8 + k * 8 + i % 8]);
      EXPECT_NEAR(got[w * M * 8 + i], d64[i], K * 0x1p-24 * mag + 1e-30);
    }
  }
  (void)t;
}

class MmaK16 : public MmaEmulation, public ::testing::WithParamInterface<bool> {};

TEST_P(MmaK16, MatchesScalarGemmOnRandomData) {
  const bool bf16 = GetParam();
  const int warps = 4;
  std::mt19937 rng(bf16 ? 11 : 12);
  Operands a = random_operands(warps * 256, bf16, rng), b = random_operands(warps * 128, bf16, rng);
  std::vector<float> c(warps * 128);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (float& x : c) x = dist(rng);
  Buffer ba = upload(a.bits), bb = upload(b.bits), bc = upload(c), bd = upload(std::vector<float>(warps * 128));
  MmaArgs args{static_cast<const unsigned short*>(ba.as_pointer()), static_cast<const unsigned short*>(bb.as_pointer()),
               static_cast<const float*>(bc.as_pointer()), static_cast<float*>(bd.as_pointer()), nullptr, nullptr,
               nullptr, 0};
  Status s = launch(bf16 ? "mma_test::mma_k16<__nv_bfloat16, false>" : "mma_test::mma_k16<__half, false>", 32 * warps,
                    args);
  ASSERT_TRUE(s.ok()) << s.error().message;
  expect_gemm(this, download<float>(bd, warps * 128), 16, 16, warps, a, b, c);
}
INSTANTIATE_TEST_SUITE_P(Types, MmaK16, ::testing::Values(true, false),
                         [](const auto& i) { return i.param ? "bf16" : "fp16"; });

TEST_F(MmaEmulation, WrongFragmentIndexGivesAWrongProduct) {
  // mma_k16<bf16, SWAP = true> loads A rows g+8 where the ISA puts row g: the
  // emulator must not hide it (more than half the outputs change).
  std::mt19937 rng(5);
  Operands a = random_operands(256, true, rng), b = random_operands(128, true, rng);
  std::vector<float> c(128, 0.0f);
  Buffer ba = upload(a.bits), bb = upload(b.bits), bc = upload(c), bd = upload(std::vector<float>(128));
  MmaArgs args{static_cast<const unsigned short*>(ba.as_pointer()), static_cast<const unsigned short*>(bb.as_pointer()),
               static_cast<const float*>(bc.as_pointer()), static_cast<float*>(bd.as_pointer()), nullptr, nullptr,
               nullptr, 0};
  ASSERT_TRUE(launch("mma_test::mma_k16<__nv_bfloat16, true>", 32, args).ok());
  std::vector<float> got = download<float>(bd, 128), d32(128);
  std::vector<double> d64(128);
  scalar_gemm(16, 16, a.values.data(), b.values.data(), c.data(), d32.data(), d64.data());
  int wrong = 0;
  for (int i = 0; i < 128; ++i) wrong += got[i] != d32[i];
  EXPECT_GT(wrong, 64) << "a kernel with rows g and g+8 swapped matched the GEMM";
}

TEST_F(MmaEmulation, MmaK8MatchesScalarGemm) {
  for (bool bf16 : {true, false}) {
    std::mt19937 rng(bf16 ? 21 : 22);
    Operands a = random_operands(128, bf16, rng), b = random_operands(64, bf16, rng);
    std::vector<float> c(128);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    for (float& x : c) x = dist(rng);
    Buffer ba = upload(a.bits), bb = upload(b.bits), bc = upload(c), bd = upload(std::vector<float>(128));
    MmaArgs args{static_cast<const unsigned short*>(ba.as_pointer()),
                 static_cast<const unsigned short*>(bb.as_pointer()), static_cast<const float*>(bc.as_pointer()),
                 static_cast<float*>(bd.as_pointer()), nullptr, nullptr, nullptr, 0};
    Status s = launch(bf16 ? "mma_test::mma_k8<__nv_bfloat16>" : "mma_test::mma_k8<__half>", 32, args);
    ASSERT_TRUE(s.ok()) << s.error().message;
    expect_gemm(this, download<float>(bd, 128), 16, 8, 1, a, b, c);
  }
}

TEST_F(MmaEmulation, LdmatrixFragmentsFeedMmaLikeGlobalLoads) {
  for (bool bf16 : {true, false}) {
    std::mt19937 rng(bf16 ? 31 : 32);
    Operands a = random_operands(256, bf16, rng), b = random_operands(128, bf16, rng);
    std::vector<float> c(128);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    for (float& x : c) x = dist(rng);
    Buffer ba = upload(a.bits), bb = upload(b.bits), bc = upload(c), bd = upload(std::vector<float>(128));
    MmaArgs args{static_cast<const unsigned short*>(ba.as_pointer()),
                 static_cast<const unsigned short*>(bb.as_pointer()), static_cast<const float*>(bc.as_pointer()),
                 static_cast<float*>(bd.as_pointer()), nullptr, nullptr, nullptr, 0};
    Status s = launch(bf16 ? "mma_test::ldmatrix_gemm<__nv_bfloat16>" : "mma_test::ldmatrix_gemm<__half>", 32, args);
    ASSERT_TRUE(s.ok()) << s.error().message;
    expect_gemm(this, download<float>(bd, 128), 16, 16, 1, a, b, c);
  }
}

struct LdmatrixCase {
  int n;
  bool trans;
};
class LdmatrixLayout : public MmaEmulation, public ::testing::WithParamInterface<LdmatrixCase> {};

TEST_P(LdmatrixLayout, EveryLaneGetsThePtxIsaElements) {
  const auto [n, trans] = GetParam();
  std::vector<uint16_t> m(320);
  for (int i = 0; i < 320; ++i) m[i] = static_cast<uint16_t>(i < 256 ? i * 7 + 1 : 0xBEEF);  // distinct per element
  Buffer ba = upload(m), br = upload(std::vector<unsigned>(128, 0xdeadbeefu));
  MmaArgs args{static_cast<const unsigned short*>(ba.as_pointer()), nullptr, nullptr, nullptr,
               static_cast<unsigned*>(br.as_pointer()), nullptr, nullptr, 0};
  std::string kernel = "mma_test::ldmatrix_layout<" + std::to_string(n) + ", " + (trans ? "true" : "false") + ">";
  Status s = launch(kernel, 32, args);
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::vector<unsigned> r = download<unsigned>(br, 128);
  // PTX ISA "Warp-level matrix load instruction: ldmatrix": register i of lane l
  // holds matrix i's row l/4, elements 2(l%4) and 2(l%4)+1; .trans: elements
  // (row 2(l%4), col l/4) and (row 2(l%4)+1, col l/4).
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < n; ++i) {
      uint16_t e[2];
      for (int j = 0; j < 2; ++j) {
        const int row = trans ? 2 * (l % 4) + j : l / 4, col = trans ? l / 4 : 2 * (l % 4) + j;
        e[j] = m[i * 64 + row * 8 + col];
      }
      EXPECT_EQ(r[l * 4 + i], static_cast<unsigned>(e[0]) | (static_cast<unsigned>(e[1]) << 16))
          << kernel << " lane " << l << " register " << i;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Variants, LdmatrixLayout,
                         ::testing::Values(LdmatrixCase{1, false}, LdmatrixCase{1, true}, LdmatrixCase{2, false},
                                           LdmatrixCase{2, true}, LdmatrixCase{4, false}, LdmatrixCase{4, true}),
                         [](const auto& i) {
                           return "x" + std::to_string(i.param.n) + (i.param.trans ? "_trans" : "");
                         });

TEST_F(MmaEmulation, CpAsyncGroupsAndZeroFillMatchACopy) {
  const int threads = 64, n = threads * 16;
  std::vector<float> src(n);
  for (int i = 0; i < n; ++i) src[i] = 0.5f * i + 3.0f;
  Buffer bs = upload(src), bd = upload(std::vector<float>(n, -7.0f));
  MmaArgs args{nullptr, nullptr, nullptr, nullptr, nullptr, static_cast<const float*>(bs.as_pointer()),
               static_cast<float*>(bd.as_pointer()), 0};
  Status s = launch("mma_test::cp_async_copy", threads, args, n * 4);
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::vector<float> got = download<float>(bd, n);
  for (int j = 0; j < n; ++j) {
    const int idx = (j + 16) % n, piece = idx % 16, owner = idx / 16;
    float want = src[idx];
    if (piece == 1) want = 1.0f;
    if (piece >= 12 && piece - 12 >= (owner % 5)) want = 0.0f;  // zero-filled beyond src-size
    ASSERT_EQ(got[j], want) << "dst " << j << " (thread " << owner << ", float " << piece << ")";
  }
}

TEST_F(MmaEmulation, StoreIntoPendingCpAsyncDestinationIsAnError) {
  std::vector<float> src(128, 1.0f);
  Buffer bs = upload(src), bd = upload(std::vector<float>(32));
  MmaArgs args{nullptr, nullptr, nullptr, nullptr, nullptr, static_cast<const float*>(bs.as_pointer()),
               static_cast<float*>(bd.as_pointer()), 0};
  Status s = launch("mma_test::cp_async_store_pending", 32, args, 512);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("written while the copy was pending"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("mma_test::cp_async_store_pending"), std::string::npos) << s.error().message;
}

TEST_F(MmaEmulation, ReadOfPendingCpAsyncDestinationSeesThePoison) {
  std::vector<float> src(128, 2.5f);
  Buffer bs = upload(src), bd = upload(std::vector<float>(64));
  MmaArgs args{nullptr, nullptr, nullptr, nullptr, nullptr, static_cast<const float*>(bs.as_pointer()),
               static_cast<float*>(bd.as_pointer()), 0};
  ASSERT_TRUE(launch("mma_test::cp_async_read_pending", 32, args, 512).ok());
  std::vector<uint32_t> got = download<uint32_t>(bd, 64);
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(got[t], 0xFFFFFFFFu) << "thread " << t << " read a pending destination and saw real data";
    float after;
    std::memcpy(&after, &got[32 + t], 4);
    EXPECT_EQ(after, 2.5f) << "thread " << t;
  }
}

// fma.rn(.relu).bf16x2 per half against the exact a*b + c rounded once to bf16.
TEST_F(MmaEmulation, Bf16x2FmaRoundsOnceAndRelu) {
  const int n = 256;
  std::mt19937 rng(41);
  Operands a = random_operands(4 * n, true, rng), b = random_operands(2 * n, true, rng);
  Buffer ba = upload(a.bits), bb = upload(b.bits), br = upload(std::vector<unsigned>(2 * n));
  MmaArgs args{static_cast<const unsigned short*>(ba.as_pointer()), static_cast<const unsigned short*>(bb.as_pointer()),
               nullptr, nullptr, static_cast<unsigned*>(br.as_pointer()), nullptr, nullptr, n};
  ASSERT_TRUE(launch("mma_test::bf16x2_fma", 128, args, 0, 2).ok());
  std::vector<unsigned> r = download<unsigned>(br, 2 * n);
  int negative = 0;
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < 2; ++h) {
      const double exact = static_cast<double>(a.values[2 * i + h]) * b.values[2 * i + h] + a.values[2 * n + 2 * i + h];
      // Round the exact value to bf16 (nearest even) through the two bf16 neighbours.
      const float lo = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(exact)));
      const uint16_t got = static_cast<uint16_t>(r[n + i] >> (16 * h));
      const uint16_t got_relu = static_cast<uint16_t>(r[i] >> (16 * h));
      const double err = std::fabs(bf16_bits_to_float(got) - exact);
      EXPECT_LE(err, std::fabs(lo - exact)) << "element " << i << "." << h << ": not the nearest bf16";
      if (bf16_bits_to_float(got) < 0) {
        ++negative;
        EXPECT_EQ(got_relu, 0u);
      } else {
        EXPECT_EQ(got_relu, got);
      }
    }
  }
  EXPECT_GT(negative, n / 4);  // the relu branch was exercised
}

TEST_F(MmaEmulation, LanesAtDifferentCallSitesAbortWithBothLines) {
  Buffer bd = upload(std::vector<float>(32));
  MmaArgs args{nullptr, nullptr, nullptr, static_cast<float*>(bd.as_pointer()), nullptr, nullptr, nullptr, 0};
  Status s = launch("mma_test::mma_divergent_sites", 32, args);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.error().message;
  EXPECT_NE(m.find("mma_test::mma_divergent_sites"), std::string::npos) << m;
  EXPECT_NE(m.find("block (0,0,0)"), std::string::npos) << m;
  EXPECT_NE(m.find("warp 0"), std::string::npos) << m;
  EXPECT_NE(m.find("mma.sync.aligned.m16n8k16.f32.bf16 at mma_test_kernels.cpp:"), std::string::npos) << m;
}

TEST_F(MmaEmulation, PartialWarpAtLdmatrixIsAnError) {
  Buffer br = upload(std::vector<unsigned>(48));
  MmaArgs args{nullptr, nullptr, nullptr, nullptr, static_cast<unsigned*>(br.as_pointer()), nullptr, nullptr, 0};
  Status s = launch("mma_test::mma_partial_warp", 48, args);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("warp 1"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("needs all 32 lanes"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace lunajit::test
