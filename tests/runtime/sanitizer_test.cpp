// The host sanitizers (runtime/host/sanitizer.h) on seeded bugs: each bug is
// reported by the check that owns it, with its line, and by no other check;
// the unmodified kernels are clean under every check and schedule; every
// schedule gives bitwise-identical results on a correct kernel, and the random
// schedule really interleaves barrier intervals (a racy increment loses updates).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/host/host_backend.h"
#include "runtime/host/sanitizer.h"

namespace lunajit::test {
namespace {

struct SanArgs {
  const float* in;
  float* out;
  int n;
};

const char* kSource = R"CUDA(#include "lunajit/device.cuh"
#include "lunajit/mma.cuh"
struct SanArgs { const float* in; float* out; int n; };
namespace san {

// s[t] = in[t]; barrier; s[t] += 1; [barrier]; out[t] = s[(t + 1) % n]
template <bool BUG>
__global__ void neighbour(const SanArgs a) {
  __shared__ float s[128];
  const int t = threadIdx.x;
  s[t] = a.in[t];
  __syncthreads();
  s[t] += 1.0f;
  if (!BUG) __syncthreads();  // BUG: removed __syncthreads
  a.out[t] = s[(t + 1) % blockDim.x];
}

// Warp-synchronous tree sum of 32 floats in shared memory.
template <bool BUG>
__global__ void warp_sum(const SanArgs a) {
  __shared__ float s[32];
  const int lane = threadIdx.x;
  s[lane] = a.in[lane];
  __syncwarp();
  for (int off = 16; off > 0; off /= 2) {
    if (lane < off) s[lane] += s[lane + off];
    if (!BUG) __syncwarp();  // BUG: missing __syncwarp
  }
  if (lane == 0) a.out[0] = s[0];
}

// out[t] = s[t ^ 1] after every thread wrote s[t] (BUG: thread 5 does not).
template <bool BUG>
__global__ void uninit(const SanArgs a) {
  float* s = reinterpret_cast<float*>(lunajit::dynamic_smem());
  const int t = threadIdx.x;
  if (!BUG || t != 5) s[t] = a.in[t];
  __syncthreads();
  a.out[t] = s[t ^ 1];
}

// out[i] = 2 in[i] for i < n (BUG: i <= n, one past the end of out).
template <bool BUG>
__global__ void scale(const SanArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (BUG ? i <= a.n : i < a.n) a.out[i] = 2.0f * a.in[i < a.n ? i : 0];
}

// out[4t..4t+3] = the float4 at in + 4t (BUG: in + 1 + 4t, not 16-byte aligned).
template <bool BUG>
__global__ void vec4(const SanArgs a) {
  const int t = threadIdx.x;
  const float4 v = *reinterpret_cast<const float4*>(a.in + (BUG ? 1 : 0) + 4 * t);
  a.out[4 * t] = v.x;
  a.out[4 * t + 1] = v.y;
  a.out[4 * t + 2] = v.z;
  a.out[4 * t + 3] = v.w;
}

// cp.async of 16 bytes per thread into shared memory, read back (BUG: before the wait_group).
template <bool BUG>
__global__ void async_copy(const SanArgs a) {
  float* s = reinterpret_cast<float*>(lunajit::dynamic_smem());
  const int t = threadIdx.x;
  lunajit::mma::cp_async_cg(s + 4 * t, a.in + 4 * t);
  lunajit::mma::cp_async_commit();
  float early = 0.0f;
  if (BUG) early = s[4 * t];
  lunajit::mma::cp_async_wait<0>();
  a.out[t] = s[4 * t] + early;
}

// All 32 lanes call __syncwarp with the mask of lanes 0-15 (BUG) or 0xffffffff.
template <bool BUG>
__global__ void warp_mask(const SanArgs a) {
  const int lane = threadIdx.x;
  __syncwarp(BUG ? 0x0000ffffu : 0xffffffffu);
  a.out[lane] = a.in[lane];
}

// A racy shared counter: every thread adds 1 without an atomic.
__global__ void racy_increment(const SanArgs a) {
  __shared__ float count;
  if (threadIdx.x == 0) count = 0.0f;
  __syncthreads();
  count = count + 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) a.out[blockIdx.x] = count;
}

// Tree reduction with barriers (correct): out[block] = sum of its 128 inputs.
__global__ void block_sum(const SanArgs a) {
  __shared__ float s[128];
  const int t = threadIdx.x;
  s[t] = a.in[blockIdx.x * 128 + t];
  __syncthreads();
  for (int stride = 64; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) a.out[blockIdx.x] = s[0];
}
// Shared-memory access patterns with known wavefront counts (one warp).
__global__ void bank_patterns(const SanArgs a) {
  __shared__ __align__(16) unsigned s[32 * 32 + 64];
  const int l = threadIdx.x;
  for (int i = l; i < 32 * 32 + 64; i += 32) s[i] = (unsigned)i;
  __syncwarp();
  unsigned x = 0;
  x += s[l];       // BANK_UNIT
  x += s[2 * l];   // BANK_STRIDE2
  x += s[32 * l];  // BANK_STRIDE32
  x += s[7];       // BANK_BROADCAST
  x += (unsigned)reinterpret_cast<const unsigned long long*>(s)[l];      // BANK_U64
  x += (unsigned)reinterpret_cast<const unsigned long long*>(s)[2 * l];  // BANK_U64_STRIDE2
  x += (unsigned)reinterpret_cast<const unsigned __int128*>(s)[l];       // BANK_U128
  a.out[l] = (float)x;
}
// One store site reached twice: by 8 divergent lanes (words 40 .. 47: banks
// 8 .. 15), then, past a barrier, by all 32 (words 0 .. 31). Each warp
// instruction is conflict-free; pairing lane 0's first store with lane 8's
// first (the divergent call with the converged one) would put two words on
// each of banks 8 .. 15.
__device__ inline void bank_put(unsigned& dst, unsigned v) {
  dst = v;  // BANK_HELPER
}
__global__ void bank_divergent(const SanArgs a) {
  __shared__ unsigned s[64];
  const int l = threadIdx.x;
  if (l < 8) bank_put(s[40 + l], 1u);
  __syncthreads();
  bank_put(s[l], 2u);
  __syncthreads();
  a.out[l] = (float)(s[l] + s[40 + (l & 7)]);
}
}  // namespace san
)CUDA";

KernelSource sanitizer_kernels() {
  KernelSource s;
  s.name = "sanitizer_kernels";
  s.code = kSource;
  for (const char* k : {"neighbour", "warp_sum", "uninit", "scale", "vec4", "async_copy", "warp_mask"}) {
    for (const char* b : {"true", "false"}) {
      const std::string e = std::string("san::") + k + "<" + b + ">";
      s.entries.push_back({e, e});
    }
  }
  s.entries.push_back({"racy", "san::racy_increment"});
  s.entries.push_back({"sum", "san::block_sum"});
  s.entries.push_back({"banks", "san::bank_patterns"});
  s.entries.push_back({"banks_divergent", "san::bank_divergent"});
  return s;
}

// The line of kSource that contains `marker` (1-based).
unsigned line_of(const char* marker) {
  const std::string src = kSource;
  const std::size_t at = src.find(marker);
  EXPECT_NE(at, std::string::npos) << marker;
  return 1 + static_cast<unsigned>(std::count(src.begin(), src.begin() + at, '\n'));
}

struct Bug {
  const char* kernel;
  const char* check;   // the check that must report it
  const char* marker;  // text on the line the finding must name
  unsigned threads;
  unsigned smem;
};

const Bug kBugs[] = {
    {"neighbour", "race", "s[t] += 1.0f;", 64, 0},
    {"warp_sum", "race", "if (lane < off) s[lane] += s[lane + off];", 32, 0},
    {"uninit", "init", "a.out[t] = s[t ^ 1];", 64, 64 * 4},
    {"scale", "bounds", "if (BUG ? i <= a.n : i < a.n) a.out[i]", 96, 0},
    {"vec4", "bounds", "const float4 v = *reinterpret_cast<const float4*>", 16, 0},
    {"async_copy", "init", "if (BUG) early = s[4 * t];", 32, 32 * 16},
    {"warp_mask", "sync", nullptr, 32, 0},
};

class Sanitizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = new HostBackend();
    auto m = backend_->load(sanitizer_kernels());
    ASSERT_TRUE(m.ok()) << m.error().message;
    module_ = new std::shared_ptr<LoadedModule>(std::move(m.value()));
  }
  static void TearDownTestSuite() {
    delete module_;
    delete backend_;
  }
  void SetUp() override {
    in_ = backend_->allocate(1024 * 4).value_or_throw();
    out_ = backend_->allocate(64 * 4).value_or_throw();  // 64 floats exactly: scale<true> writes out[64]
    std::vector<float> v(1024);
    for (int i = 0; i < 1024; ++i) v[i] = 0.25f * static_cast<float>(i % 97) - 3.0f;
    ASSERT_TRUE(backend_->copy_to_device(in_, v.data(), v.size() * 4).ok());
    ASSERT_TRUE(backend_->fill_zero(out_).ok());
  }
  Status run(const std::string& kernel, unsigned threads, unsigned smem, std::string_view sanitize,
             unsigned blocks = 1, int n = 64) {
    SanArgs a{static_cast<const float*>(in_.as_pointer()), static_cast<float*>(out_.as_pointer()), n};
    void* params[] = {&a};
    LaunchConfig c{{blocks, 1, 1}, {threads, 1, 1}, smem};
    c.host_sanitize = sanitize;
    return backend_->launch(**module_, kernel, c, params);
  }
  std::vector<float> out(std::size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(backend_->copy_to_host(v.data(), out_, n * 4).ok());
    return v;
  }
  static HostBackend* backend_;
  static std::shared_ptr<LoadedModule>* module_;
  Buffer in_, out_;
};
HostBackend* Sanitizer::backend_ = nullptr;
std::shared_ptr<LoadedModule>* Sanitizer::module_ = nullptr;

TEST_F(Sanitizer, EachSeededBugIsReportedByItsCheckWithTheLine) {
  for (const Bug& b : kBugs) {
    SCOPED_TRACE(b.kernel);
    const std::string kernel = std::string("san::") + b.kernel + "<true>";
    Status s = run(kernel, b.threads, b.smem, b.check);
    ASSERT_FALSE(s.ok()) << b.kernel << " was clean under " << b.check;
    const std::string& m = s.error().message;
    EXPECT_NE(m.find(std::string("sanitizer [") + b.check + "]"), std::string::npos) << m;
    EXPECT_NE(m.find(kernel), std::string::npos) << m;
    ASSERT_EQ(backend_->last_findings().size(), 1u) << m;
    const host::SanitizerFinding& f = backend_->last_findings()[0];
    EXPECT_EQ(f.check, b.check);
    EXPECT_EQ(f.kernel, kernel);
    EXPECT_EQ(f.block, "(0,0,0)");
    EXPECT_FALSE(f.threads.empty());
    if (b.marker != nullptr) {
      // The finding's line is the access that found it; for a race the message
      // names both accesses' lines, one of them the marked one.
      EXPECT_GT(f.line, 0u);
      EXPECT_NE(m.find("sanitizer_kernels.cpp:" + std::to_string(line_of(b.marker)) + ":"), std::string::npos) << m;
      EXPECT_NE(m.find("sanitizer_kernels.cpp:" + std::to_string(f.line) + ":"), std::string::npos) << m;
    }
    std::printf("[ finding ] %s\n", m.c_str());
  }
}

TEST_F(Sanitizer, EachSeededBugIsCleanUnderTheOtherChecks) {
  for (const Bug& b : kBugs) {
    for (const char* check : {"init", "bounds", "sync", "race"}) {
      if (check == std::string(b.check)) continue;
      const std::string kernel = std::string("san::") + b.kernel + "<true>";
      Status s = run(kernel, b.threads, b.smem, check);
      EXPECT_TRUE(backend_->last_findings().empty()) << kernel << " under " << check;
      if (b.check == std::string("sync")) {
        // A lane outside its own mask also deadlocks the warp: the always-on
        // divergence error, not a finding of another check.
        if (!s.ok()) {
          EXPECT_EQ(s.error().message.find("sanitizer ["), std::string::npos) << s.error().message;
        }
      } else {
        EXPECT_TRUE(s.ok()) << kernel << " under " << check << ": " << s.error().message;
      }
    }
  }
}

TEST_F(Sanitizer, UnmodifiedKernelsAreCleanUnderEveryCheckAndSchedule) {
  for (const Bug& b : kBugs) {
    for (const char* schedule : {"schedule=forward", "schedule=reverse", "schedule=random:1", "schedule=random:77"}) {
      const std::string kernel = std::string("san::") + b.kernel + "<false>";
      Status s = run(kernel, b.threads, b.smem, std::string("init,bounds,sync,race,") + schedule);
      EXPECT_TRUE(s.ok()) << kernel << " under " << schedule << ": " << s.error().message;
    }
  }
}

TEST_F(Sanitizer, EverySchedulesGivesBitwiseIdenticalResults) {
  std::vector<float> first;
  for (const char* sched : {"", "schedule=forward", "schedule=reverse", "schedule=random:3", "race,schedule=random:9"}) {
    Status s = run("san::block_sum", 128, 0, sched, 8);
    ASSERT_TRUE(s.ok()) << sched << ": " << s.error().message;
    std::vector<float> got = out(8);
    if (first.empty()) {
      first = got;
    } else {
      EXPECT_EQ(std::memcmp(got.data(), first.data(), 8 * 4), 0) << sched;
    }
  }
}

TEST_F(Sanitizer, RandomScheduleInterleavesBarrierIntervals) {
  // Forward and reverse run each thread's interval to its end: no update is lost.
  for (const char* sched : {"schedule=forward", "schedule=reverse"}) {
    ASSERT_TRUE(run("racy", 64, 0, sched).ok());
    EXPECT_EQ(out(1)[0], 64.0f) << sched;
  }
  // Random preempts threads between their load and store of `count`.
  ASSERT_TRUE(run("racy", 64, 0, "schedule=random:5").ok());
  EXPECT_LT(out(1)[0], 64.0f) << "the random schedule never interleaved the read-modify-writes";
  // And the race check names it.
  Status s = run("racy", 64, 0, "race");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("race on static __shared__ memory"), std::string::npos) << s.error().message;
}

TEST_F(Sanitizer, BankConflictsAreCountedPerSiteInWavefronts) {
  ASSERT_TRUE(run("banks", 32, 0, "banks").ok());
  struct Want {
    const char* marker;
    unsigned bytes;
    std::uint64_t wavefronts, ideal;
  };
  // 32-bit: one phase of 32 lanes; 64-bit: two half-warps; 128-bit: four quarter-warps.
  const Want want[] = {{"// BANK_UNIT", 4, 1, 1},       {"// BANK_STRIDE2", 4, 2, 1},  {"// BANK_STRIDE32", 4, 32, 1},
                       {"// BANK_BROADCAST", 4, 1, 1},  {"// BANK_U64", 8, 2, 2},      {"// BANK_U64_STRIDE2", 8, 4, 2},
                       {"// BANK_U128", 16, 4, 4}};
  const std::vector<host::BankSite>& sites = backend_->last_bank_sites();
  for (const Want& w : want) {
    const unsigned line = line_of(w.marker);
    auto it = std::find_if(sites.begin(), sites.end(), [&](const host::BankSite& b) { return b.line == line && !b.write; });
    ASSERT_NE(it, sites.end()) << w.marker << " (line " << line << ") has no bank statistics";
    EXPECT_EQ(it->bytes, w.bytes) << w.marker;
    EXPECT_EQ(it->executions, 1u) << w.marker;
    EXPECT_EQ(it->wavefronts, w.wavefronts) << w.marker;
    EXPECT_EQ(it->ideal, w.ideal) << w.marker;
  }
  // Worst first: the stride-32 load leads the table.
  ASSERT_FALSE(sites.empty());
  EXPECT_EQ(sites.front().line, line_of("// BANK_STRIDE32"));
  const std::string table = host::bank_table(host::bank_sites_so_far(), 3);
  EXPECT_NE(table.find("san::bank_patterns"), std::string::npos) << table;
}

// Lanes that reached a site a different number of times (a divergent branch
// through an inlined helper) are realigned at each block barrier: the
// helper's store is two conflict-free warp stores, 2 wavefronts. Counting
// each lane's executions over the whole block, as the profiler did, paired
// the 8 divergent stores with 8 converged ones: 3 wavefronts, and false
// conflicts in the walks' split_bf16x2 stores (docs/ARCHITECTURE.md).
TEST_F(Sanitizer, BankGroupsRealignDivergentLanesAtBarriers) {
  ASSERT_TRUE(run("banks_divergent", 32, 0, "banks").ok());
  EXPECT_EQ(out(32)[0], 3.0f);
  EXPECT_EQ(out(32)[9], 2.0f + 1.0f);
  const std::vector<host::BankSite>& sites = backend_->last_bank_sites();
  const unsigned line = line_of("// BANK_HELPER");
  auto it = std::find_if(sites.begin(), sites.end(), [&](const host::BankSite& b) { return b.line == line && b.write; });
  ASSERT_NE(it, sites.end()) << "the helper's store (line " << line << ") has no bank statistics";
  EXPECT_EQ(it->executions, 2u);
  EXPECT_EQ(it->wavefronts, 2u);
  EXPECT_EQ(it->ideal, 2u);
}

TEST_F(Sanitizer, OptionsParseAndBadWordsAreNamed) {
  auto o = host::parse_sanitize("race,init, bounds,sync,schedule=random:42");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->describe(), "init,bounds,sync,race; schedule random:42");
  EXPECT_EQ(host::parse_sanitize("all")->describe(), "init,bounds,sync,race; schedule forward");
  auto bad = host::parse_sanitize("init,racy");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(bad.error().message.find("'racy'"), std::string::npos);
  EXPECT_NE(bad.error().message.find("schedule=forward|reverse|random:SEED"), std::string::npos);
  EXPECT_FALSE(host::parse_sanitize("schedule=random:x").ok());
  Status s = run("sum", 128, 0, "bogus");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::invalid_argument);
}

}  // namespace
}  // namespace lunajit::test
