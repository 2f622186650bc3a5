// Host emulation: the hand-written kernels of host_test_kernels.cpp run through
// the host JIT and the fiber scheduler give CUDA's results; divergent barriers
// and compile errors come back as errors; the object cache skips the compiler.
#include <gtest/gtest.h>
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <regex>
#include <thread>
#include <vector>

#include "cache/binary_cache.h"
#include "runtime/backend.h"
#include "runtime/host/host_backend.h"
#include "runtime/host/host_jit.h"
#include "tests/runtime/host_test_kernels.h"

namespace lunajit::test {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// One backend and one compiled module for the whole suite (the global binary
// cache, LUNAJIT_CACHE_DIR, makes later test processes skip the compile).
class HostEmulation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = new HostBackend();
    auto t0 = Clock::now();
    Result<std::shared_ptr<LoadedModule>> m = backend_->load(host_test_kernels());
    ASSERT_TRUE(m.ok()) << m.error().message;
    module_ = new std::shared_ptr<LoadedModule>(std::move(m.value()));
    std::printf("[ host ] test kernels loaded in %.0f ms\n", ms_since(t0));
  }
  static void TearDownTestSuite() {
    delete module_;
    delete backend_;
    module_ = nullptr;
    backend_ = nullptr;
  }

  // Buffers of the TestArgs slots, zero-filled (iout filled with `ifill`).
  struct Io {
    Buffer in, out, iout, uout, ull;
    TestArgs args{};
  };
  Io make_io(std::size_t n, const std::vector<float>& input = {}) {
    Io io;
    io.in = backend_->allocate(std::max<std::size_t>(input.size(), 1) * 4).value_or_throw();
    io.out = backend_->allocate(n * 4).value_or_throw();
    io.iout = backend_->allocate(n * 4).value_or_throw();
    io.uout = backend_->allocate(n * 4).value_or_throw();
    io.ull = backend_->allocate(n * 8).value_or_throw();
    for (Buffer* b : {&io.out, &io.iout, &io.uout, &io.ull}) {
      EXPECT_TRUE(backend_->fill_zero(*b).ok());
    }
    if (!input.empty()) {
      EXPECT_TRUE(backend_->copy_to_device(io.in, input.data(), input.size() * 4).ok());
    }
    io.args = TestArgs{static_cast<const float*>(io.in.as_pointer()), static_cast<float*>(io.out.as_pointer()),
                       static_cast<int*>(io.iout.as_pointer()), static_cast<unsigned*>(io.uout.as_pointer()),
                       static_cast<unsigned long long*>(io.ull.as_pointer()), static_cast<int>(input.size()), 0};
    return io;
  }
  Status launch(std::string_view kernel, Dim3 grid, Dim3 block, TestArgs& args, unsigned smem = 0) {
    void* params[] = {&args};
    return backend_->launch(**module_, kernel, LaunchConfig{grid, block, smem}, params);
  }
  template <class T>
  std::vector<T> read(const Buffer& b, std::size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(backend_->copy_to_host(v.data(), b, n * sizeof(T)).ok());
    return v;
  }

  void SetUp() override { ASSERT_NE(module_, nullptr) << "the test kernels did not load"; }

  static HostBackend* backend_;
  static std::shared_ptr<LoadedModule>* module_;
};
HostBackend* HostEmulation::backend_ = nullptr;
std::shared_ptr<LoadedModule>* HostEmulation::module_ = nullptr;

TEST_F(HostEmulation, IndicesOver3dGridAndBlock) {
  const Dim3 grid{3, 2, 2}, block{4, 3, 2};
  const unsigned threads = 4 * 3 * 2, blocks = 3 * 2 * 2;
  Io io = make_io(threads * blocks * kIndexOutputs);
  ASSERT_TRUE(launch("index_kernel", grid, block, io.args).ok());
  std::vector<unsigned> got = read<unsigned>(io.uout, threads * blocks * kIndexOutputs);
  for (unsigned bz = 0; bz < 2; ++bz)
    for (unsigned by = 0; by < 2; ++by)
      for (unsigned bx = 0; bx < 3; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 3; ++ty)
            for (unsigned tx = 0; tx < 4; ++tx) {
              unsigned b = (bz * 2 + by) * 3 + bx, t = (tz * 3 + ty) * 4 + tx;
              const unsigned* o = &got[(b * threads + t) * kIndexOutputs];
              std::vector<unsigned> want{tx, ty, tz, bx, by, bz, 4, 3, 2, 3, 2, 2};
              ASSERT_EQ(std::vector<unsigned>(o, o + kIndexOutputs), want) << "block " << b << " thread " << t;
            }
}

TEST_F(HostEmulation, Indices2dGrid) {
  const Dim3 grid{5, 3, 1}, block{8, 4, 1};
  Io io = make_io(32 * 15 * kIndexOutputs);
  ASSERT_TRUE(launch("index_kernel", grid, block, io.args).ok());
  std::vector<unsigned> got = read<unsigned>(io.uout, 32 * 15 * kIndexOutputs);
  for (unsigned b = 0; b < 15; ++b)
    for (unsigned t = 0; t < 32; ++t) {
      const unsigned* o = &got[(b * 32 + t) * kIndexOutputs];
      EXPECT_EQ(o[0], t % 8);
      EXPECT_EQ(o[1], t / 8);
      EXPECT_EQ(o[3], b % 5);
      EXPECT_EQ(o[4], b / 5);
      EXPECT_EQ(o[9] * o[10] * o[11], 15u);
    }
}

TEST_F(HostEmulation, BlockReductionWithStaticSharedMemory) {
  const int n = 256 * 37 - 11;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 17) - 8.0f;  // small integers: exact sums
  Io io = make_io(64, x);
  ASSERT_TRUE(launch("reduce", {37, 1, 1}, {256, 1, 1}, io.args).ok());  // by role
  std::vector<float> got = read<float>(io.out, 37);
  for (int b = 0; b < 37; ++b) {
    float want = 0;
    for (int i = b * 256; i < std::min(n, (b + 1) * 256); ++i) want += x[i];
    EXPECT_EQ(got[b], want) << "block " << b;
  }
}

TEST_F(HostEmulation, DynamicSharedMemory) {
  const unsigned blocks = 9, threads = 96;
  std::vector<float> x(blocks * threads);
  std::iota(x.begin(), x.end(), 0.0f);
  Io io = make_io(blocks * threads, x);
  ASSERT_TRUE(launch("dynamic_smem_kernel", {blocks, 1, 1}, {threads, 1, 1}, io.args, threads * 4).ok());
  std::vector<float> got = read<float>(io.out, blocks * threads);
  std::vector<int> aligned = read<int>(io.iout, blocks);
  for (unsigned b = 0; b < blocks; ++b) {
    EXPECT_EQ(aligned[b], 1);
    for (unsigned t = 0; t < threads; ++t) ASSERT_EQ(got[b * threads + t], x[b * threads + threads - 1 - t]);
  }
}

TEST_F(HostEmulation, SharedMemoryIsPerBlock) {
  const unsigned blocks = 48, threads = 64;
  Io io = make_io(blocks * threads);
  io.args.param = 20;  // rounds of barriers
  ASSERT_TRUE(launch("smem_per_block_kernel", {blocks, 1, 1}, {threads, 1, 1}, io.args, 64).ok());
  std::vector<int> wrong = read<int>(io.iout, blocks * threads);
  EXPECT_EQ(std::accumulate(wrong.begin(), wrong.end(), 0), 0);
}

TEST_F(HostEmulation, WarpShufflesAndVotesMatchCuda) {
  for (unsigned threads : {64u, 48u}) {  // two full warps; a full and a half warp
    SCOPED_TRACE(threads);
    Io io = make_io(threads * kShuffleOutputs);
    ASSERT_TRUE(launch("shuffle_kernel", {1, 1, 1}, {threads, 1, 1}, io.args).ok());
    std::vector<int> got = read<int>(io.iout, threads * kShuffleOutputs);
    for (int t = 0; t < static_cast<int>(threads); ++t) {
      const int lane = t % 32, warp = t / 32, base = warp * 32;
      const int lanes = std::min(32, static_cast<int>(threads) - base);  // lanes in this warp
      const unsigned existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
      auto in_warp = [&](int l) { return l >= 0 && l < lanes; };
      const int* o = &got[t * kShuffleOutputs];
      SCOPED_TRACE(t);
      EXPECT_EQ(o[0], in_warp(lane ^ 5) ? (base + (lane ^ 5)) * 10 : t * 10);
      EXPECT_EQ(o[1], lane + 3 < 32 && in_warp(lane + 3) ? (t + 3) * 10 : t * 10);
      EXPECT_EQ(o[2], lane >= 2 ? (t - 2) * 10 : t * 10);
      EXPECT_EQ(o[3], (base + 7) * 10);
      EXPECT_EQ(o[4], (base + (lane & ~7) + 3) * 10);
      EXPECT_EQ(o[5], in_warp(lane ^ 16) ? (base + (lane ^ 16)) * 2 + 1 : t * 2 + 1);
      EXPECT_EQ(o[6], lane < 31 && in_warp(lane + 1) ? lane + 1 : lane);
      EXPECT_EQ(o[7], lane ^ 1);
      EXPECT_EQ(o[8], base * 3);
      unsigned ballot = 0;
      for (int l = 0; l < lanes; ++l) ballot |= (l % 3 == 0 ? 1u : 0u) << l;
      EXPECT_EQ(static_cast<unsigned>(o[9]), ballot);
      bool any = false, all = true;
      for (int l = 0; l < lanes; ++l) {
        any |= base + l == 40;
        all &= base + l < 60;
      }
      EXPECT_EQ(o[10], any ? 1 : 0);
      EXPECT_EQ(o[11], all ? 1 : 0);
      if (lanes == 32) {
        EXPECT_EQ(o[12], 31 * 32 / 2);  // butterfly sum of lanes
      }
      EXPECT_EQ(static_cast<unsigned>(o[13]), existing);
      EXPECT_EQ(o[14], lanes * (lanes - 1) / 2);
      EXPECT_EQ(o[15], (lane % 16) + 4 < 16 && in_warp(lane + 4) ? (t + 4) * 10 : t * 10);
    }
  }
}

TEST_F(HostEmulation, AtomicsFromManyBlocksAreExact) {
  const unsigned blocks = 64, threads = 128, total = blocks * threads;
  Io io = make_io(8);
  std::vector<int> init{0, -1, 1, 0, 0, 0, 0, 0};
  ASSERT_TRUE(backend_->copy_to_device(io.iout, init.data(), init.size() * 4).ok());
  ASSERT_TRUE(launch("atomic_kernel", {blocks, 1, 1}, {threads, 1, 1}, io.args).ok());
  std::vector<int> i = read<int>(io.iout, 5);
  std::vector<unsigned> u = read<unsigned>(io.uout, 2);
  std::vector<unsigned long long> ull = read<unsigned long long>(io.ull, 1);
  std::vector<float> f = read<float>(io.out, 1);
  EXPECT_EQ(i[0], static_cast<int>(total));
  EXPECT_EQ(i[1], static_cast<int>(total - 1));
  EXPECT_EQ(i[2], -static_cast<int>(total - 1));
  EXPECT_EQ(i[3], 2 * static_cast<int>(total));
  EXPECT_EQ(i[4], 77);
  EXPECT_EQ(u[0], total * (total - 1) / 2);
  EXPECT_EQ(u[1], 0xffffffffu);
  EXPECT_EQ(ull[0], static_cast<unsigned long long>(total) << 33);
  EXPECT_EQ(f[0], static_cast<float>(total));
}

TEST_F(HostEmulation, DivergentBarrierIsAnErrorNamingBlockAndThread) {
  Io io = make_io(128);
  auto t0 = Clock::now();
  Status s = launch("divergent_barrier_kernel", {1, 1, 1}, {64, 1, 1}, io.args);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::runtime_failure);
  const std::string& m = s.error().message;
  EXPECT_NE(m.find("divergent_barrier_kernel"), std::string::npos) << m;
  EXPECT_NE(m.find("block (0,0,0)"), std::string::npos) << m;
  EXPECT_NE(m.find("thread (0,0,0) exited"), std::string::npos) << m;
  EXPECT_NE(m.find("__syncthreads"), std::string::npos) << m;
  // Many blocks: the first failure stops the launch; nothing hangs.
  Status many = launch("divergent_barrier_kernel", {32, 1, 1}, {64, 1, 1}, io.args);
  ASSERT_FALSE(many.ok());
  EXPECT_TRUE(std::regex_search(many.error().message, std::regex(R"(block \(\d+,0,0\): thread \(0,0,0\))")))
      << many.error().message;
  EXPECT_LT(ms_since(t0), 5000.0);
  // The backend stays usable.
  Io ok_io = make_io(64 * kShuffleOutputs);
  EXPECT_TRUE(launch("shuffle_kernel", {1, 1, 1}, {64, 1, 1}, ok_io.args).ok());
}

TEST_F(HostEmulation, BarrierAgainstWarpSyncIsAnError) {
  Io io = make_io(8);
  Status s = launch("divergent_warp_kernel", {1, 1, 1}, {32, 1, 1}, io.args);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.error().message;
  EXPECT_NE(m.find("waits at __syncthreads() while thread (16,0,0) waits at __syncwarp"), std::string::npos) << m;
}

TEST_F(HostEmulation, TrapAbortsTheLaunch) {
  Io io = make_io(8);
  Status s = launch("trap_kernel", {3, 1, 1}, {32, 1, 1}, io.args);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("block (1,0,0): thread (5,0,0) called __trap()"), std::string::npos)
      << s.error().message;
}

TEST_F(HostEmulation, HalfAndBfloat16ConversionsAndMath) {
  Io io = make_io(kHalfOutputs);
  ASSERT_TRUE(launch("half_kernel", {1, 1, 1}, {32, 1, 1}, io.args).ok());
  std::vector<unsigned> o = read<unsigned>(io.uout, kHalfOutputs);
  EXPECT_EQ(o[0], 0x3555u);   // half(1/3)
  EXPECT_EQ(o[1], 0x3EABu);   // bf16(1/3)
  EXPECT_EQ(o[2], 0x3C00u);   // ties to even
  EXPECT_EQ(o[3], 0x3C02u);
  EXPECT_EQ(o[4], 0x3F80u);
  EXPECT_EQ(o[5], 0x3F82u);
  EXPECT_EQ(o[6], 0x4280u);   // __hfma(1.5, 2, 0.25) = 3.25
  EXPECT_EQ(o[7], 0x4050u);   // bf16 3.25
  EXPECT_EQ(o[8], 0x4000u);   // hsqrt(4) = 2
  EXPECT_EQ(o[9], 0x3400u);   // hrcp(4) = 0.25
  EXPECT_EQ(o[10], 0x3C00u);  // hexp(0) = 1
  EXPECT_EQ(o[11], 0x4040u);  // bf16 sqrt(9) = 3
  EXPECT_EQ(o[12], 0x4000u);  // bf16 1/0.5 = 2
  EXPECT_EQ(o[13], 0x3F80u);  // bf16 exp(0) = 1
  EXPECT_EQ(o[14], 0xC100u);  // half(-2.5) through bf16 and float
  EXPECT_EQ(o[15], 0x3F400000u);  // float(0.5 + 0.25)
}

TEST_F(HostEmulation, UnknownKernelAndBadConfigAreInvalid) {
  Io io = make_io(8);
  Status s = launch("no_such_kernel", {1, 1, 1}, {1, 1, 1}, io.args);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(s.error().message.find("index_kernel"), std::string::npos);  // lists what exists
  Status big = launch("index_kernel", {1, 1, 1}, {1025, 1, 1}, io.args);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().kind, ErrorKind::invalid_argument);
}

TEST_F(HostEmulation, FiberLaunchTiming) {
  const unsigned blocks = 64, threads = 128;
  Io io = make_io(blocks * threads);
  io.args.param = 5;  // 2 barriers a round: 10 barriers
  ASSERT_TRUE(launch("barrier_loop_kernel", {blocks, 1, 1}, {threads, 1, 1}, io.args).ok());  // warm stacks
  auto t0 = Clock::now();
  ASSERT_TRUE(launch("barrier_loop_kernel", {blocks, 1, 1}, {threads, 1, 1}, io.args).ok());
  double ms = ms_since(t0);
  std::printf("[ host ] %u blocks x %u threads x 10 barriers: %.2f ms (%s)\n", blocks, threads, ms,
              backend_->description().c_str());
  std::vector<float> out = read<float>(io.out, blocks * threads);
  // Round i: thread t adds what its neighbour t+1 wrote: acc[t+1] + (t+1) % n.
  std::vector<float> acc(threads, 0.0f), next(threads);
  for (int i = 0; i < 5; ++i) {
    for (unsigned t = 0; t < threads; ++t) next[t] = acc[t] + acc[(t + 1) % threads] + (t + 1) % threads;
    acc = next;
  }
  for (unsigned t = 0; t < threads; ++t) {
    ASSERT_EQ(out[t], acc[t]) << t;
    ASSERT_EQ(out[(blocks - 1) * threads + t], acc[t]) << t;
  }
}

// ---- compile errors and the object cache ----------------------------------------

TEST(HostJit, CompileErrorCarriesDiagnosticsAndDumpedSource) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("lunajit-host-test-" + std::to_string(std::random_device{}()));
  BinaryCache cache(dir);
  HostBackend backend(&cache);
  Result<std::shared_ptr<LoadedModule>> m = backend.load(host_broken_kernel());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().kind, ErrorKind::compile_failed);
  const std::string& msg = m.error().message;
  EXPECT_NE(msg.find("undefined_identifier_xyz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("error"), std::string::npos) << msg;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(msg, match, std::regex(R"(source: (\S+))"))) << msg;
  EXPECT_TRUE(std::filesystem::exists(match[1].str())) << match[1].str();
  std::filesystem::remove_all(dir);
}

TEST(HostJit, SecondLoadFromTheCacheCompilesNothing) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("lunajit-host-test-" + std::to_string(std::random_device{}()));
  const std::string marker = dir.filename().string();
  std::vector<float> x{1.0f, 1.0f / 3.0f, -2.5f, 1000.1f};
  auto run = [&](Backend& backend, const LoadedModule& module) {
    Buffer in = backend.allocate(16).value_or_throw(), out = backend.allocate(16).value_or_throw();
    EXPECT_TRUE(backend.copy_to_device(in, x.data(), 16).ok());
    TestArgs a{static_cast<const float*>(in.as_pointer()), static_cast<float*>(out.as_pointer()), nullptr, nullptr,
               nullptr, 4, 0};
    void* params[] = {&a};
    EXPECT_TRUE(backend.launch(module, "scale", LaunchConfig{{1, 1, 1}, {32, 1, 1}, 0}, params).ok());
    std::vector<float> y(4);
    EXPECT_TRUE(backend.copy_to_host(y.data(), out, 16).ok());
    return y;
  };
  std::vector<float> first, second;
  {
    BinaryCache cache(dir);
    HostBackend backend(&cache);
    const host::HostJitCounters before = host::host_jit_counters();
    auto t0 = Clock::now();
    auto m = backend.load(host_cache_test_kernel(marker));
    ASSERT_TRUE(m.ok()) << m.error().message;
    std::printf("[ host ] cold compile + load: %.0f ms\n", ms_since(t0));
    EXPECT_EQ(host::host_jit_counters().compiles, before.compiles + 1);
    first = run(backend, **m);
  }
  {
    BinaryCache cache(dir);  // a new cache object on the same directory: the disk entry
    HostBackend backend(&cache);
    const host::HostJitCounters before = host::host_jit_counters();
    auto t0 = Clock::now();
    auto m = backend.load(host_cache_test_kernel(marker));
    ASSERT_TRUE(m.ok()) << m.error().message;
    std::printf("[ host ] cache-hit load: %.1f ms\n", ms_since(t0));
    const host::HostJitCounters after = host::host_jit_counters();
    EXPECT_EQ(after.compiles, before.compiles);  // compiled nothing
    EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
    EXPECT_EQ(cache.counters().hits, 1u);
    second = run(backend, **m);
  }
  EXPECT_EQ(first, second);
  EXPECT_EQ(first[0], 2.0f);
  EXPECT_EQ(first[2], -5.0f);
  EXPECT_EQ(first[1], 0.66796875f);  // bf16(2/3)
  std::filesystem::remove_all(dir);
}

// Clang's driver asks cc1 for -disable-free (a compiler process exits after one
// file, so it skips destructors); in-process each compile then kept its AST,
// module and TargetMachine for good: 16 of them parked in LLVM's BuryPointer
// graveyard, the rest leaked (LeakSanitizer found the latter after a tune that
// compiled more than 16 kernels). Compiles must hand their memory back.
TEST(HostJit, ColdCompilesReleaseTheirMemory) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("lunajit-host-mem-" + std::to_string(std::random_device{}()));
  auto in_use = [] {
    const struct ::mallinfo2 m = ::mallinfo2();
    return static_cast<double>(m.uordblks + m.hblkhd);
  };
  auto compile = [&](int i) {
    BinaryCache cache(dir);
    HostBackend backend(&cache);
    const host::HostJitCounters before = host::host_jit_counters();
    auto m = backend.load(host_cache_test_kernel(dir.filename().string() + "-" + std::to_string(i)));
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(host::host_jit_counters().compiles, before.compiles + 1) << "a cold compile";
  };
  compile(0);  // one-time state: LLVM's registries, the header buffers
  const double start = in_use();
  constexpr int kCompiles = 4;
  for (int i = 1; i <= kCompiles; ++i) compile(i);
  const double per_compile = (in_use() - start) / kCompiles;
  std::printf("[ host ] heap in use after a cold compile and load: %+.0f KB per compile\n", per_compile / 1024);
  // Measured: before the fix each compile of this small kernel kept 3.2 MB
  // (its AST holds lunajit/device.cuh); after it, what remains is allocator noise.
  EXPECT_LT(per_compile, 256.0 * 1024) << "each compile keeps its memory";
  std::filesystem::remove_all(dir);
}

// The tuner compiles candidates on several threads and may launch from several.
TEST(HostJit, ConcurrentLoadsAndLaunches) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("lunajit-host-test-" + std::to_string(std::random_device{}()));
  BinaryCache cache(dir);
  HostBackend backend(&cache);
  std::vector<float> x(1000);
  for (int k = 0; k < 1000; ++k) x[k] = static_cast<float>(k % 128 - 64);  // 2x is exact in bf16
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto m = backend.load(host_cache_test_kernel(dir.filename().string() + "-" + std::to_string(i)));
      if (!m) {
        errors[i] = m.error().message;
        return;
      }
      Buffer in = backend.allocate(4000).value_or_throw(), out = backend.allocate(4000).value_or_throw();
      (void)backend.copy_to_device(in, x.data(), 4000);
      TestArgs a{static_cast<const float*>(in.as_pointer()), static_cast<float*>(out.as_pointer()), nullptr,
                 nullptr, nullptr, 1000, 0};
      void* params[] = {&a};
      for (int rep = 0; rep < 20; ++rep) {
        Status s = backend.launch(**m, "scale", LaunchConfig{{8, 1, 1}, {128, 1, 1}, 0}, params);
        if (!s) errors[i] = s.error().message;
      }
      std::vector<float> y(1000);
      (void)backend.copy_to_host(y.data(), out, 4000);
      for (int k = 0; k < 1000; ++k) {
        if (y[k] != 2.0f * x[k] && errors[i].empty()) errors[i] = "wrong value at " + std::to_string(k);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  std::filesystem::remove_all(dir);
}

TEST(HostJit, CacheKeyCoversCodeAndEntries) {
  KernelSource a = host_cache_test_kernel("a");
  KernelSource b = host_cache_test_kernel("b");
  EXPECT_EQ(host::host_cache_key(a), host::host_cache_key(host_cache_test_kernel("a")));
  EXPECT_NE(host::host_cache_key(a), host::host_cache_key(b));
  KernelSource c = a;
  c.entries[0].name_expression = "scale_kernel<__half>";
  EXPECT_NE(host::host_cache_key(a), host::host_cache_key(c));
}

// Issue 15: an entry is verified to export the kernels its source asks for
// before it is linked. (An entry copied over another key's file is caught by
// the key in its header, cache/binary_cache.h; this is the second line: an
// entry stored under the right key whose object is another kernel's.)
TEST(HostJit, CachedObjectOfAnotherKernelIsRejectedBeforeLinking) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("lunajit-host-test-" + std::to_string(std::random_device{}()));
  BinaryCache cache(dir);
  HostBackend backend(&cache);
  const KernelSource single = host_cache_test_kernel(dir.filename().string());
  const KernelSource multi = host_test_kernels();
  ASSERT_GT(multi.entries.size(), 1u);
  ASSERT_TRUE(backend.load(multi).ok());
  const std::optional<std::string> multi_object = cache.get(host::host_cache_key(multi));
  ASSERT_TRUE(multi_object.has_value());
  cache.remove(host::host_cache_key(single));
  cache.put(host::host_cache_key(single), *multi_object);  // wrong object, right key
  const host::HostJitCounters before = host::host_jit_counters();
  ::testing::internal::CaptureStderr();
  auto m = backend.load(single);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_NE(err.find("cached host object " + host::host_cache_key(single)), std::string::npos) << err;
  EXPECT_TRUE(std::regex_search(
      err, std::regex(R"(rejected \(it defines lunajit_entry_[1-9][0-9]*, which this kernel source does not have\); )"
                      R"(recompiling)")))
      << err;
  EXPECT_EQ(host::host_jit_counters().compiles, before.compiles + 1) << "recompiled";
  // The recompiled object replaced the wrong one.
  EXPECT_NE(cache.get(host::host_cache_key(single)).value_or(""), *multi_object);
  std::filesystem::remove_all(dir);
}

// ---- backend selection and buffers ------------------------------------------------

TEST(BackendSelection, HostAndInvalidKinds) {
  Result<std::unique_ptr<Backend>> host = make_backend("host");
  ASSERT_TRUE(host.ok()) << host.error().message;
  EXPECT_EQ((*host)->kind(), BackendKind::host);
  EXPECT_EQ(to_string((*host)->kind()), "host");
  Result<std::unique_ptr<Backend>> bad = make_backend("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::invalid_argument);
  Result<std::unique_ptr<Backend>> any = make_backend("auto");  // a GPU, or the host emulator
  EXPECT_TRUE(any.ok()) << any.error().message;
}

TEST(BackendSelection, BufferMovesOwnership) {
  HostBackend backend;
  Buffer a = backend.allocate(100).value_or_throw();
  const DevicePtr p = a.ptr();
  EXPECT_EQ(p % 256, 0u);
  Buffer b = std::move(a);
  EXPECT_EQ(a.ptr(), 0u);
  EXPECT_EQ(b.ptr(), p);
  EXPECT_EQ(b.bytes(), 100u);
  std::vector<char> big(200);
  EXPECT_FALSE(backend.copy_to_device(b, big.data(), big.size()).ok());
}

}  // namespace
}  // namespace lunajit::test
