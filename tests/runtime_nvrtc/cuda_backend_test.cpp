// CUDA driver and CudaBackend. Without a driver or GPU (the usual CI machine)
// the "unavailable" path is tested; kernel launches skip with "no CUDA GPU".
#include "runtime/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/cuda/cuda_driver.h"
#include "tests/runtime_nvrtc/test_kernels.h"

namespace lunajit {
namespace {

bool have_gpu() { return cuda::CudaDriver::instance().ok(); }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

TEST(CudaDriver, MissingLibraryIsUnavailableWithTheMessage) {
  auto d = cuda::CudaDriver::open("libcuda-not-here.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().kind, ErrorKind::unavailable);
  EXPECT_EQ(first_line(d.error().message), "no CUDA driver/GPU found; use --backend host");
  EXPECT_NE(d.error().message.find("libcuda-not-here.so.1"), std::string::npos) << d.error().message;
}

// On a machine without a driver or GPU, this is the no-driver path of
// make_cuda_backend (what `lunajit run --backend cuda` reports).
TEST(CudaBackend, MakeWithoutGpuIsUnavailable) {
  auto b = make_cuda_backend();
  if (have_gpu()) {
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ((*b)->kind(), BackendKind::cuda);
    return;
  }
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().kind, ErrorKind::unavailable);
  EXPECT_EQ(first_line(b.error().message), cuda::kNoCudaMessage);
  auto devices = cuda::list_devices();
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(first_line(devices.error().message), cuda::kNoCudaMessage);
}

TEST(CudaDriver, FormatsDriverVersion) {
  EXPECT_EQ(cuda::format_driver_version(12040), "12.4");
  EXPECT_EQ(cuda::format_driver_version(13000), "13.0");
}

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CudaBackend::create();
    if (!b.ok()) GTEST_SKIP() << "no CUDA GPU";
    backend_ = std::move(*b);
  }
  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(CudaGpuTest, DeviceList) {
  auto devices = cuda::list_devices();
  ASSERT_TRUE(devices.ok()) << devices.error().message;
  ASSERT_FALSE(devices->empty());
  const auto& d = devices->front();
  EXPECT_FALSE(d.name.empty());
  EXPECT_GE(d.sm(), 75);
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GT(d.total_memory, 0u);
  EXPECT_GT(d.driver_version, 0);
  EXPECT_GE(d.max_smem_per_block_optin, 48 * 1024);
  std::printf("[ device   ] %s\n", backend_->description().c_str());
}

TEST_F(CudaGpuTest, CopiesRoundTrip) {
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 1.0f);
  auto buf = backend_->allocate(host.size() * sizeof(float));
  ASSERT_TRUE(buf.ok()) << buf.error().message;
  ASSERT_TRUE(backend_->copy_to_device(*buf, host.data(), host.size() * sizeof(float)).ok());
  std::vector<float> back(host.size(), 0.0f);
  ASSERT_TRUE(backend_->copy_to_host(back.data(), *buf, back.size() * sizeof(float)).ok());
  EXPECT_EQ(back, host);
  ASSERT_TRUE(backend_->fill_zero(*buf).ok());
  ASSERT_TRUE(backend_->copy_to_host(back.data(), *buf, back.size() * sizeof(float)).ok());
  EXPECT_EQ(back, std::vector<float>(host.size(), 0.0f));
  EXPECT_EQ(backend_->copy_to_device(*buf, host.data(), 2 * host.size() * sizeof(float)).error().kind,
            ErrorKind::invalid_argument);
}

TEST_F(CudaGpuTest, LaunchesByNameExpressionAndRole) {
  auto module = backend_->load(test::small_kernels("nvrtc_test_gpu"));
  ASSERT_TRUE(module.ok()) << module.error().message;
  const int blocks = 4, n = blocks * test::kReverseTile;
  std::vector<float> x(n);
  std::iota(x.begin(), x.end(), 0.0f);
  auto buf = backend_->allocate(n * sizeof(float)).value_or_throw();
  ASSERT_TRUE(backend_->copy_to_device(buf, x.data(), n * sizeof(float)).ok());
  DevicePtr p = buf.ptr();
  float a = 3.0f;
  void* args[] = {&p, &a};
  LaunchConfig cfg{{unsigned(blocks), 1, 1}, {unsigned(test::kReverseTile), 1, 1}, 0};
  auto s = backend_->launch(**module, "lunajit_test::reverse_scale<256>", cfg, args);
  ASSERT_TRUE(s.ok()) << s.error().message;
  s = backend_->launch(**module, "reverse", cfg, args);  // by role; reverses back
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::vector<float> y(n);
  ASSERT_TRUE(backend_->copy_to_host(y.data(), buf, n * sizeof(float)).ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], 9.0f * x[i]) << i;

  const CompiledKernel* ck = CudaBackend::compiled(**module);
  ASSERT_NE(ck, nullptr);
  EXPECT_EQ(ck->find("lunajit_test::reverse_scale<256>")->smem_bytes, test::kReverseStaticSmem);
  EXPECT_EQ(backend_->launch(**module, "no_such_kernel", cfg, args).error().kind, ErrorKind::invalid_argument);
  LaunchConfig too_big = cfg;
  too_big.block.x = 4096;
  EXPECT_EQ(backend_->launch(**module, "reverse", too_big, args).error().kind, ErrorKind::invalid_argument);
}

// More than the default 48 KiB of dynamic shared memory: the load raised the
// limit, so the launch needs no attribute call.
TEST_F(CudaGpuTest, LargeDynamicSharedMemoryAndTiming) {
  auto module = backend_->load(test::small_kernels("nvrtc_test_gpu"));
  ASSERT_TRUE(module.ok()) << module.error().message;
  const unsigned threads = 1024, blocks = 64;
  std::vector<float> in(threads * blocks);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7);
  auto din = backend_->allocate(in.size() * 4).value_or_throw();
  auto dout = backend_->allocate(blocks * 4).value_or_throw();
  ASSERT_TRUE(backend_->copy_to_device(din, in.data(), in.size() * 4).ok());
  DevicePtr pi = din.ptr(), po = dout.ptr();
  void* args[] = {&pi, &po};
  const unsigned dyn = std::min(96u * 1024u, static_cast<unsigned>(backend_->device().max_smem_per_block_optin));
  LaunchConfig cfg{{blocks, 1, 1}, {threads, 1, 1}, dyn};
  auto ms = backend_->time_ms([&] { return backend_->launch(**module, "sum", cfg, args); });
  ASSERT_TRUE(ms.ok()) << ms.error().message;
  EXPECT_GT(*ms, 0.0);
  std::vector<float> out(blocks);
  ASSERT_TRUE(backend_->copy_to_host(out.data(), dout, blocks * 4).ok());
  for (unsigned b = 0; b < blocks; ++b) {
    double ref = 0;
    for (unsigned t = 0; t < threads; ++t) ref += in[b * threads + t];
    EXPECT_EQ(out[b], static_cast<float>(ref)) << b;
  }
  LaunchConfig over = cfg;
  over.dynamic_smem = backend_->device().max_smem_per_block_optin + 1;
  EXPECT_EQ(backend_->launch(**module, "sum", over, args).error().kind, ErrorKind::invalid_argument);
}

TEST_F(CudaGpuTest, Bf16ConversionMatchesHostRounding) {
  auto module = backend_->load(test::small_kernels("nvrtc_test_gpu"));
  ASSERT_TRUE(module.ok()) << module.error().message;
  const int n = 3;
  const float in[n] = {1.0f, 1.00390625f, -3.3f};
  auto din = backend_->allocate(sizeof in).value_or_throw();
  auto dout = backend_->allocate(n * 2).value_or_throw();
  ASSERT_TRUE(backend_->copy_to_device(din, in, sizeof in).ok());
  DevicePtr pi = din.ptr(), po = dout.ptr();
  int count = n;
  void* args[] = {&pi, &po, &count};
  ASSERT_TRUE(backend_->launch(**module, "convert", {{1, 1, 1}, {32, 1, 1}, 0}, args).ok());
  uint16_t out[n];
  ASSERT_TRUE(backend_->copy_to_host(out, dout, sizeof out).ok());
  EXPECT_EQ(out[0], 0x4000);  // 2.0
  EXPECT_EQ(out[1], 0x4000);  // 2.0078125 rounds to even: 2.0
  EXPECT_EQ(out[2], 0xc0d3);  // -6.6 -> -6.59375
}

}  // namespace
}  // namespace lunajit
