// compile_nvrtc: CUBIN per arch, resources from ptxas -v, lowered names, the
// compile_failed error, the binary cache (hit without an NVRTC call), PTX.
#include "runtime/nvrtc_compiler.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "cache/binary_cache.h"
#include "codegen/generator.h"
#include "tests/runtime_nvrtc/test_kernels.h"

namespace lunajit {
namespace {
namespace fs = std::filesystem;

Arch arch(int sm) { return arch_from_sm(sm).value_or_throw(); }

// A private cache directory per test.
class NvrtcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lunajit-nvrtc-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    cache_ = std::make_unique<BinaryCache>(dir_);
    opts_.cache = cache_.get();
  }
  void TearDown() override {
    cache_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
  std::unique_ptr<BinaryCache> cache_;
  NvrtcOptions opts_;
};

class NvrtcArchTest : public NvrtcTest, public ::testing::WithParamInterface<int> {};

TEST_P(NvrtcArchTest, CompilesWithResourcesAndLoweredNames) {
  const int sm = GetParam();
  const KernelSource src = test::small_kernels();
  auto r = compile_nvrtc(src, arch(sm), opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const CompiledKernel& k = *r;
  EXPECT_FALSE(k.from_cache);
  EXPECT_GT(k.cubin.size(), 1000u);
  EXPECT_EQ(k.cubin.substr(0, 4), "\x7f" "ELF");
  EXPECT_TRUE(k.ptx.empty());
  EXPECT_NE(std::find(k.options.begin(), k.options.end(), "--gpu-architecture=sm_" + std::to_string(sm)),
            k.options.end());
  EXPECT_NE(k.log.find("for 'sm_" + std::to_string(sm) + "'"), std::string::npos) << k.log;

  ASSERT_EQ(k.lowered_names.size(), 3u);
  EXPECT_EQ(k.lowered_names.at("lunajit_test::reverse_scale<256>"), "_ZN12lunajit_test13reverse_scaleILi256EEEvPff");
  for (const auto& [expr, lowered] : k.lowered_names) EXPECT_EQ(lowered.rfind("_Z", 0), 0u) << expr;

  ASSERT_EQ(k.resources.size(), 3u);
  for (const auto& res : k.resources) {
    EXPECT_GT(res.registers, 0) << res.name_expression;
    EXPECT_EQ(res.lowered_name, k.lowered_names.at(res.name_expression));
    EXPECT_EQ(res.spill_stores, 0) << res.name_expression;
    EXPECT_EQ(res.spill_loads, 0) << res.name_expression;
  }
  const KernelResources* rev = k.find("lunajit_test::reverse_scale<256>");
  ASSERT_NE(rev, nullptr);
  EXPECT_EQ(rev->smem_bytes, test::kReverseStaticSmem);
  EXPECT_GE(rev->barriers, 1);
  const KernelResources* conv = k.find("lunajit_test::to_bf16");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->smem_bytes, 0);  // no __shared__ at all
  EXPECT_EQ(k.find("lunajit_test::block_sum")->smem_bytes, 0);  // dynamic only: comes at launch
  EXPECT_GT(k.compile_seconds, 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, NvrtcArchTest, ::testing::Values(80, 90, 100, 120),
                         [](const auto& info) { return "sm_" + std::to_string(info.param); });

TEST_F(NvrtcTest, BrokenSourceIsCompileFailedWithLogOptionsAndDump) {
  const KernelSource src = test::broken_kernel();
  auto r = compile_nvrtc(src, arch(90), opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::compile_failed);
  const std::string& msg = r.error().message;
  EXPECT_NE(msg.find("undefined_identifier_xyz"), std::string::npos) << msg;  // the NVRTC log
  EXPECT_NE(msg.find("error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("options: --std=c++17 --gpu-architecture=sm_90"), std::string::npos) << msg;
  const auto at = msg.find("source: ");
  ASSERT_NE(at, std::string::npos) << msg;
  const std::string path = msg.substr(at + 8, msg.find('\n', at) - at - 8);
  EXPECT_EQ(fs::path(path).filename(), "nvrtc_test_broken.cu");
  EXPECT_EQ(fs::path(path).parent_path().filename(), "lunajit-failed");
  ASSERT_TRUE(fs::exists(path)) << path;
  std::ifstream in(path);
  const std::string dumped{std::istreambuf_iterator<char>(in), {}};
  EXPECT_EQ(dumped, src.code);
  EXPECT_EQ(cache_->counters().writes, 0u);  // failures are not cached
}

TEST_F(NvrtcTest, SecondCompileIsACacheHitWithoutNvrtc) {
  const KernelSource src = test::small_kernels("nvrtc_test_cache");
  auto first = compile_nvrtc(src, arch(90), opts_);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_FALSE(first->from_cache);
  EXPECT_EQ(cache_->counters().writes, 1u);

  const auto calls = nvrtc_invocations();
  auto second = compile_nvrtc(src, arch(90), opts_);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_TRUE(second->from_cache);
  EXPECT_EQ(nvrtc_invocations(), calls) << "a cache hit must not call NVRTC";
  EXPECT_EQ(second->cubin, first->cubin);
  EXPECT_EQ(second->lowered_names, first->lowered_names);
  EXPECT_EQ(second->options, first->options);
  EXPECT_EQ(second->log, first->log);
  EXPECT_EQ(second->cache_key, first->cache_key);
  ASSERT_EQ(second->resources.size(), first->resources.size());
  for (std::size_t i = 0; i < first->resources.size(); ++i) {
    EXPECT_EQ(second->resources[i].registers, first->resources[i].registers);
    EXPECT_EQ(second->resources[i].smem_bytes, first->resources[i].smem_bytes);
    EXPECT_EQ(second->resources[i].lowered_name, first->resources[i].lowered_name);
  }
  std::printf("[ timing   ] small kernel, sm_90: cold %.1f ms, cached %.2f ms\n", first->compile_seconds * 1e3,
              second->compile_seconds * 1e3);

  // Another process (a fresh cache object on the same directory) hits too.
  BinaryCache reopened(dir_);
  NvrtcOptions o = opts_;
  o.cache = &reopened;
  auto third = compile_nvrtc(src, arch(90), o);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->from_cache);
  EXPECT_EQ(nvrtc_invocations(), calls);

  // Anything that changes the bytes changes the key: arch, options, code.
  auto other_arch = compile_nvrtc(src, arch(80), opts_);
  ASSERT_TRUE(other_arch.ok());
  EXPECT_FALSE(other_arch->from_cache);
  NvrtcOptions with_line_info = opts_;
  with_line_info.line_info = true;
  auto li = compile_nvrtc(src, arch(90), with_line_info);
  ASSERT_TRUE(li.ok());
  EXPECT_FALSE(li->from_cache);
  auto changed = compile_nvrtc(test::small_kernels("nvrtc_test_cache", "// changed\n"), arch(90), opts_);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(changed->from_cache);
  EXPECT_EQ(nvrtc_invocations(), calls + 3);
}

// Issue 15: a cached CUBIN must export the kernels its source asks for (the
// recorded names, each lowered name present in the CUBIN) before it is
// launched. An entry copied over another key's file is caught earlier, by the
// key in the entry header (tests/cache); this is an entry under the right key
// holding another source's kernels.
TEST_F(NvrtcTest, CachedCubinOfAnotherKernelSetIsRejectedAndRecompiled) {
  const KernelSource full = test::small_kernels("nvrtc_test_names_full");
  KernelSource fewer = test::small_kernels("nvrtc_test_names_fewer");
  ASSERT_GT(fewer.entries.size(), 1u);
  fewer.entries.pop_back();
  auto a = compile_nvrtc(full, arch(90), opts_);
  auto b = compile_nvrtc(fewer, arch(90), opts_);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::optional<std::string> fewer_payload = cache_->get(b->cache_key);
  ASSERT_TRUE(fewer_payload.has_value());
  ASSERT_TRUE(cache_->remove(a->cache_key));
  cache_->put(a->cache_key, *fewer_payload);  // the right key, another kernel set
  const auto calls = nvrtc_invocations();
  ::testing::internal::CaptureStderr();
  auto again = compile_nvrtc(full, arch(90), opts_);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_FALSE(again->from_cache);
  EXPECT_EQ(nvrtc_invocations(), calls + 1);
  EXPECT_EQ(again->lowered_names.size(), full.entries.size());
  EXPECT_NE(err.find("cached CUBIN " + a->cache_key), std::string::npos) << err;
  EXPECT_NE(err.find("rejected (a different number of kernels); recompiling"), std::string::npos) << err;
  // And the recompiled entry is served from the cache again.
  auto third = compile_nvrtc(full, arch(90), opts_);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->from_cache);
}

TEST_F(NvrtcTest, CacheCanBeBypassed) {
  NvrtcOptions o;
  o.use_cache = false;
  const KernelSource src = test::small_kernels("nvrtc_test_nocache");
  const auto calls = nvrtc_invocations();
  ASSERT_TRUE(compile_nvrtc(src, arch(90), o).ok());
  auto again = compile_nvrtc(src, arch(90), o);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->from_cache);
  EXPECT_EQ(nvrtc_invocations(), calls + 2);
}

TEST_F(NvrtcTest, PtxOnRequest) {
  NvrtcOptions o = opts_;
  o.emit_ptx = true;
  auto r = compile_nvrtc(test::small_kernels("nvrtc_test_ptx"), arch(90), o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->ptx.find(".target sm_90"), std::string::npos);
  EXPECT_NE(r->ptx.find(".entry " + r->lowered_names.at("lunajit_test::to_bf16")), std::string::npos);
  EXPECT_FALSE(r->cubin.empty());
  EXPECT_EQ(r->ptx.find('\0'), std::string::npos);
  auto hit = compile_nvrtc(test::small_kernels("nvrtc_test_ptx"), arch(90), o);
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->from_cache);
  EXPECT_EQ(hit->ptx, r->ptx);
}

TEST_F(NvrtcTest, ParallelCompilesFromSeveralThreads) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(4);
  std::vector<int> registers(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const auto src = test::small_kernels("nvrtc_test_par" + std::to_string(t),
                                           "// variant " + std::to_string(t) + "\n");
      auto r = compile_nvrtc(src, arch(t % 2 ? 80 : 90), opts_);
      if (!r.ok()) errors[t] = r.error().message;
      else registers[t] = r->resources.at(0).registers;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(errors[t], "") << t;
    EXPECT_GT(registers[t], 0) << t;
  }
}

TEST(NvrtcInfo, VersionAndIdentity) {
  const std::string v = nvrtc_version();
  EXPECT_NE(v, "unknown");
  EXPECT_NE(v.find('.'), std::string::npos);
  const std::string id = nvrtc_build_identity();
  EXPECT_EQ(id.rfind(v, 0), 0u) << id;
  EXPECT_GT(id.size(), v.size()) << "no build identity beyond the version";
  const auto sms = nvrtc_supported_sms();
  for (int sm : {80, 90, 100, 120}) EXPECT_NE(std::find(sms.begin(), sms.end(), sm), sms.end()) << sm;
}

TEST(PtxasLog, ParsesEveryField) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function '_Z1aPf' for 'sm_80'\n"
      "ptxas info    : Function properties for _Z1aPf\n"
      "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 2 barriers, 2048 bytes smem, 368 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function '_Z1bv' for 'sm_80'\n"
      "ptxas info    : Function properties for _Z6helperv\n"  // a callee: not an entry
      "ptxas         .     64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Function properties for _Z1bv\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 6 registers, 360 bytes cmem[0]\n";
  const auto r = parse_ptxas_resources(log);
  ASSERT_EQ(r.size(), 2u);
  const KernelResources& a = r.at("_Z1aPf");
  EXPECT_EQ(a.registers, 40);
  EXPECT_EQ(a.barriers, 2);
  EXPECT_EQ(a.smem_bytes, 2048);
  EXPECT_EQ(a.cmem, 368);
  EXPECT_EQ(a.stack_bytes, 16);
  EXPECT_EQ(a.spill_stores, 8);
  EXPECT_EQ(a.spill_loads, 12);
  const KernelResources& b = r.at("_Z1bv");
  EXPECT_EQ(b.registers, 6);
  EXPECT_EQ(b.stack_bytes, 0);
  EXPECT_EQ(b.smem_bytes, 0);
  EXPECT_EQ(b.cmem, 360);
  EXPECT_EQ(r.count("_Z6helperv"), 0u);
}

}  // namespace
}  // namespace lunajit

// The generator's own output (codegen/generator.h) through NVRTC: every entry
// compiles, has a lowered name and a resource report. Skips while the pass is
// not generated yet.
namespace lunajit {
namespace {

class GeneratedSourceTest : public NvrtcTest, public ::testing::WithParamInterface<Family> {};

TEST_P(GeneratedSourceTest, ForwardCompilesForSm90) {
  const AttentionSpec spec = default_spec(GetParam());
  const Arch a = arch(90);
  auto src = generate(spec, default_config(spec, a), Pass::forward);
  if (!src.ok()) GTEST_SKIP() << "generator: " << src.error().message;
  auto r = compile_nvrtc(*src, a, opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->resources.size(), src->entries.size());
  for (const auto& res : r->resources) {
    EXPECT_GT(res.registers, 0) << res.name_expression;
    EXPECT_FALSE(res.lowered_name.empty()) << res.name_expression;
  }
  std::printf("[ timing   ] %s forward, sm_90: %.0f ms cold, %zu kernels\n", src->name.c_str(),
              r->compile_seconds * 1e3, r->resources.size());
}

INSTANTIATE_TEST_SUITE_P(Families, GeneratedSourceTest, ::testing::ValuesIn(kAllFamilies),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace lunajit
