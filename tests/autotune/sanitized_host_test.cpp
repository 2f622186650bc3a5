// Every generated kernel under the host sanitizers (README "Host sanitizers"):
// each family x {causal, non-causal} x {fp32, bf16} at the default config,
// forward and backward, runs clean under init,bounds,sync,race with the thread
// order reversed and with one random order (which also preempts threads inside
// barrier intervals), still matches the reference, and gives bitwise-identical
// gradients (and identical forward errors) under both orders.
//
// Plus a seeded bug in a copy of the real causal template (a removed
// __syncthreads), which the race check must name.
//
// ctest label "sanitizer". The shape is small (b1 h2 n33: one partial tile or
// chunk after full ones) to keep the run to a couple of minutes warm;
// LUNAJIT_SANITIZE_SEQ overrides n.
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "autotune/validation.h"
#include "codegen/launch_plan.h"
#include "runtime/host/host_backend.h"
#include "templates/embedded.h"
#include "tests/autotune/host_cases.h"

namespace lunajit {
namespace {

using namespace testing_host;

struct Case {
  Family family;
  bool causal;
  DType dtype;
};

int seq_len() {
  const char* v = std::getenv("LUNAJIT_SANITIZE_SEQ");
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 33;
}

HostBackend& sanitized_backend(const char* options) {
  static std::map<std::string, std::unique_ptr<HostBackend>> backends;
  auto& b = backends[options];
  if (!b) {
    b = std::make_unique<HostBackend>();
    b->set_sanitize(host::parse_sanitize(options).value_or_throw());
  }
  return *b;
}

constexpr const char* kSchedules[] = {"init,bounds,sync,race,schedule=reverse",
                                      "init,bounds,sync,race,schedule=random:20261201"};

class SanitizedHost : public ::testing::TestWithParam<Case> {};

TEST_P(SanitizedHost, ForwardAndBackwardAreCleanUnderEverySchedule) {
  const Case& c = GetParam();
  AttentionSpec spec = default_spec(c.family);
  spec.causal = c.causal;
  spec.dtype = c.dtype;
  CheckOptions opt;
  opt.shape = {1, 2, seq_len()};
  opt.seed = 7;
  std::vector<CheckReport> fwd;
  std::vector<BackwardCheckReport> bwd;
  for (const char* schedule : kSchedules) {
    SCOPED_TRACE(schedule);
    HostBackend& backend = sanitized_backend(schedule);
    const std::uint64_t before = backend.sanitized_launches();
    auto f = check_forward(backend, spec, default_config(spec, sm90()), opt);
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_TRUE(f->pass) << fmt::format("rel rms {:.3e} (tolerance {:.0e})", f->rel_rms, f->tolerance);
    auto b = check_backward(backend, spec, default_config(spec, sm90(), Pass::backward), opt);
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_TRUE(b->pass);
    EXPECT_GT(backend.sanitized_launches(), before + 1);  // the kernels really ran sanitized
    EXPECT_TRUE(backend.last_findings().empty());
    fwd.push_back(*f);
    bwd.push_back(std::move(*b));
  }
  EXPECT_EQ(fwd[0].rel_rms, fwd[1].rel_rms);
  EXPECT_EQ(fwd[0].max_abs_error, fwd[1].max_abs_error);
  EXPECT_EQ(bwd[0].dq, bwd[1].dq) << "dq differs between thread orders";
  EXPECT_EQ(bwd[0].dk, bwd[1].dk) << "dk differs between thread orders";
  EXPECT_EQ(bwd[0].dv, bwd[1].dv) << "dv differs between thread orders";
  EXPECT_EQ(bwd[0].dparams, bwd[1].dparams) << "parameter gradients differ between thread orders";
}

// A seeded bug in a copy of a real template: a Backend that hands the host
// backend every source with "lunajit/linear_attention.cuh" pasted in, edited.
class SeedingBackend final : public Backend {
 public:
  SeedingBackend(HostBackend& inner, std::string from, std::string to)
      : inner_(inner), from_(std::move(from)), to_(std::move(to)) {}
  BackendKind kind() const override { return inner_.kind(); }
  std::string description() const override { return inner_.description() + " (seeded)"; }
  Result<Buffer> allocate(std::size_t bytes) override { return inner_.allocate(bytes); }
  Status copy_to_device(const Buffer& d, const void* s, std::size_t n) override { return inner_.copy_to_device(d, s, n); }
  Status copy_to_host(void* d, const Buffer& s, std::size_t n) override { return inner_.copy_to_host(d, s, n); }
  Status fill_zero(const Buffer& d) override { return inner_.fill_zero(d); }
  Result<std::shared_ptr<LoadedModule>> load(const KernelSource& source) override {
    KernelSource s = source;
    const std::string include = "#include \"lunajit/linear_attention.cuh\"";
    std::string header;
    for (const EmbeddedFile& f : templates::files())
      if (f.path == "lunajit/linear_attention.cuh") header = std::string(f.contents);
    EXPECT_FALSE(header.empty());
    // Every occurrence (the causal kernels of several families share the pattern).
    for (std::size_t at = header.find(from_); at != std::string::npos; at = header.find(from_, at + to_.size())) {
      header.replace(at, from_.size(), to_);
      ++seeded_;
    }
    EXPECT_GT(seeded_, 0) << "the seed no longer matches the template";
    if (const std::size_t once = header.find("#pragma once"); once != std::string::npos) header.erase(once, 12);
    if (const std::size_t inc = s.code.find(include); inc != std::string::npos) s.code.replace(inc, include.size(), header);
    return inner_.load(s);
  }
  Status launch(const LoadedModule& m, std::string_view name, const LaunchConfig& c, void** args) override {
    return inner_.launch(m, name, c, args);
  }
  Status synchronize() override { return inner_.synchronize(); }
  int seeded() const { return seeded_; }

 protected:
  void release(DevicePtr) noexcept override {}  // buffers belong to the inner backend

 private:
  HostBackend& inner_;
  std::string from_, to_;
  int seeded_ = 0;
};

TEST(SanitizedHostSeeded, RemovedBarrierInTheCausalTemplateIsARace) {
  // The barrier between writing A = phi(q) phi(k)^T and reading it for the denominators.
  const std::string barrier = "    }\n    __syncthreads();\n    if constexpr (K::normalize) {";
  const std::string removed = "    }\n    if constexpr (K::normalize) {";
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = true;
  spec.dtype = DType::fp32;
  CheckOptions opt;
  opt.shape = {1, 1, 24};
  HostBackend& host = sanitized_backend("race,schedule=reverse");
  SeedingBackend seeded(host, barrier, removed);
  auto r = check_forward(seeded, spec, default_config(spec, sm90()), opt);
  EXPECT_GT(seeded.seeded(), 0);
  ASSERT_FALSE(r.ok()) << "the removed __syncthreads went unnoticed";
  EXPECT_NE(r.error().message.find("sanitizer [race]"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("causal_chunk_kernel"), std::string::npos) << r.error().message;
  ASSERT_EQ(host.last_findings().size(), 1u);
  EXPECT_GT(host.last_findings()[0].line, 0u);
  std::printf("[ finding ] %s\n", r.error().message.c_str());
  // The same copy with the barrier kept is clean.
  SeedingBackend unmodified(host, barrier, barrier);
  auto clean = check_forward(unmodified, spec, default_config(spec, sm90()), opt);
  ASSERT_TRUE(clean.ok()) << clean.error().message;
  EXPECT_TRUE(clean->pass);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Family f : kAllFamilies)
    for (bool causal : {false, true})
      for (DType t : {DType::fp32, DType::bf16}) out.push_back({f, causal, t});
  return out;
}

// The parameter gradient's two launches (param_reduce sums each group of a
// head block's slots over the group's first slot, param_sum adds the groups:
// templates/lunajit/linear_attention_backward.cuh) with several groups, for
// shared parameters (one list of every head's slots) and per-head ones (one
// list per head): the plan really cuts the slots into groups, the gradients
// match the reference, and both thread orders run clean under the sanitizers
// and give bitwise-equal parameter gradients. One warp a block and d = 16 keep
// the slot count (and the run) small: 256 slots a group.
TEST(SanitizedHostParamReduce, SeveralGroupsAreCleanAndMatchTheReference) {
  for (bool per_head : {false, true}) {
    SCOPED_TRACE(per_head ? "per-head parameters" : "shared parameters");
    AttentionSpec spec = default_spec(Family::t2r);
    spec.dtype = DType::fp32;
    spec.head_dim = spec.value_dim = 16;
    spec.t2r.features = 16;
    spec.params_per_head = per_head;
    const TileConfig config(16, 1, 16, 64, 1);
    CheckOptions opt;
    opt.shape = {2, 2, 1040};  // 65 tiles: 2 x 2 x 65 = 260 slots a head, 520 in all
    opt.seed = 5;
    auto plan = plan_launches(spec, config, Pass::backward, opt.shape);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    unsigned groups = 0, sums = 0;
    for (const KernelLaunch& l : plan->launches) {
      if (l.role == "param_reduce") groups = l.grid[1];
      if (l.role == "param_sum") ++sums;
    }
    EXPECT_EQ(groups, per_head ? 2u : 3u);  // ceil(260 / 256), ceil(520 / 256)
    EXPECT_EQ(sums, 1u);
    auto plain = check_backward(host_backend(), spec, config, opt);
    ASSERT_TRUE(plain.ok()) << plain.error().message;
    EXPECT_TRUE(plain->pass);
    std::vector<std::vector<float>> dparams;
    for (const char* schedule : kSchedules) {
      SCOPED_TRACE(schedule);
      HostBackend& backend = sanitized_backend(schedule);
      auto b = check_backward(backend, spec, config, opt);
      ASSERT_TRUE(b.ok()) << b.error().message;
      EXPECT_TRUE(b->pass);
      EXPECT_TRUE(backend.last_findings().empty());
      dparams.push_back(b->dparams);
    }
    EXPECT_EQ(dparams[0], dparams[1]) << "parameter gradients differ between thread orders";
    EXPECT_EQ(dparams[0], plain->dparams) << "parameter gradients differ from the plain run";
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, SanitizedHost, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return fmt::format("{}_{}_{}", to_string(c.family), c.causal ? "causal" : "noncausal",
                                              to_string(c.dtype));
                         });

}  // namespace
}  // namespace lunajit
