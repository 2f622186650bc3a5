// The runtime split count (plan_launches' splits, ForwardArgs /
// BackwardArgs::splits): kernels compiled for state_splits R run with the
// count 1 .. R the cost model picks for the GPU and shape (best_splits). On
// the host backend (HostBackend::set_splits sets the count plans get) every
// kernel family that reads it runs with a count below R that is not a power
// of two (3) and with one range (where the plan also drops the reduce
// launches and, causal, the per-range state pass), against the
// double-precision reference, and the count-3 runs also under the host
// sanitizers (init, bounds, sync, race, threads in reverse order):
// - scalar non-causal forward and backward (fp32: the exact path),
// - tensor-core non-causal forward and backward (bf16),
// - tensor-core causal forward (super-chunk ranges) and backward (range walks).
//
// Tolerance: the reference checks' own (forward_tolerance: relative RMS 1e-6
// fp32, 1e-2 bf16; check_backward's per-tensor bounds), plus: the error at the
// runtime count stays within 1.5x that at the compiled count R, plus 2^-20
// (fp32) or 2^-10 (bf16). The two differ only in the order of the fp32 state
// sums (and, bf16, an occasional rounding of the 16-bit state copy); a range
// read with the wrong stride, a partial summed twice or a range not seeded
// is off by O(1).
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "autotune/validation.h"
#include "codegen/generator.h"
#include "codegen/launch_plan.h"
#include "runtime/host/host_backend.h"
#include "tests/autotune/host_cases.h"

namespace lunajit {
namespace {

using namespace testing_host;

struct Case {
  const char* name;
  DType dtype;
  bool causal;
  Pass pass;
  TileConfig config;
};

std::vector<Case> cases() {
  return {
      {"scalar_forward", DType::fp32, false, Pass::forward, TileConfig(64, 4, 64, 64, 4)},
      {"scalar_backward", DType::fp32, false, Pass::backward, TileConfig(64, 4, 64, 64, 4)},
      {"mma_forward", DType::bf16, false, Pass::forward, TileConfig(64, 8, 64, 64, 4).with_mma(true)},
      {"mma_backward", DType::bf16, false, Pass::backward, TileConfig(16, 4, 64, 64, 4).with_mma(true)},
      {"mma_causal_forward", DType::bf16, true, Pass::forward, TileConfig(64, 4, 64, 64, 4).with_mma(true)},
      {"mma_causal_backward", DType::bf16, true, Pass::backward, TileConfig(64, 8, 64, 16, 4).with_mma(true)},
  };
}

// 300 tokens: 5 tiles (chunks) of 64 (3 ranges of 2, 2 and 1) and 19 chunks
// of 16 (3 ranges of 7, 7 and 5).
constexpr ProblemShape kShape{1, 2, 300};

AttentionSpec spec_of(const Case& c) {
  AttentionSpec spec = default_spec(Family::luna);
  spec.dtype = c.dtype;
  spec.causal = c.causal;
  return spec;
}

// rel_rms of the forward's output, or the largest over the backward's tensors.
struct Outcome {
  bool pass = false;
  double error = 0;
};

Outcome run_check(HostBackend& backend, const AttentionSpec& spec, const Case& c) {
  CheckOptions opt;
  opt.shape = kShape;
  opt.seed = 17;
  Outcome r;
  if (c.pass == Pass::forward) {
    auto rep = check_forward(backend, spec, c.config, opt);
    EXPECT_TRUE(rep.ok()) << rep.error().message;
    if (!rep) return r;
    r.pass = rep->pass;
    r.error = rep->rel_rms;
  } else {
    auto rep = check_backward(backend, spec, c.config, opt);
    EXPECT_TRUE(rep.ok()) << rep.error().message;
    if (!rep) return r;
    r.pass = rep->pass;
    for (const TensorError& t : rep->tensors) {
      EXPECT_TRUE(t.pass) << t.name << " rel rms " << t.rel_rms;
      r.error = std::max(r.error, t.rel_rms);
    }
  }
  return r;
}

class RuntimeSplits : public ::testing::TestWithParam<Case> {};

TEST_P(RuntimeSplits, FewerRangesThanCompiledMatchTheReference) {
  const Case& c = GetParam();
  const AttentionSpec spec = spec_of(c);
  ASSERT_TRUE(can_implement(spec, c.config, sm90(), c.pass)) << c.config.to_string();
  ASSERT_EQ(c.config.state_splits(), 4);

  HostBackend compiled;  // the compiled 4 ranges
  const Outcome full = run_check(compiled, spec, c);
  EXPECT_TRUE(full.pass) << full.error;
  const double slack = c.dtype == DType::fp32 ? std::ldexp(1.0, -20) : std::ldexp(1.0, -10);

  for (int want : {3, 1}) {
    SCOPED_TRACE(fmt::format("{} ranges", want));
    auto plan = plan_launches(spec, c.config, c.pass, kShape, want).value_or_throw();
    ASSERT_EQ(plan.splits, want);
    if (want == 1) {
      // One range: nothing to reduce, and no earlier range to seed a causal walk.
      for (const KernelLaunch& l : plan.launches) {
        if (!(c.pass == Pass::backward && c.config.mma() && !c.causal)) {  // its reduce also stages the state
          EXPECT_TRUE(l.role != "state_reduce" && l.role != "dstate_reduce") << l.role;
        }
        if (c.causal && c.pass == Pass::forward) {
          EXPECT_NE(l.role, "state");
        }
      }
    }
    HostBackend backend;
    backend.set_splits(want);
    const Outcome r = run_check(backend, spec, c);
    // The runner launched what the plan says: the split kernels' grids hold `want` ranges.
    const KernelSource src = generate(spec, c.config, c.pass).value_or_throw();
    int checked = 0;
    for (const KernelEntry& e : src.entries) {
      const std::optional<Dim3> g = backend.last_grid(e.name_expression);
      if (!g) continue;  // not launched (the causal state pass at one range)
      unsigned ranges = 0;  // the grid dimension that holds the ranges
      if (e.role == "state" || e.role == "dstate") ranges = g->y;
      else if (e.role == "causal_chunk") ranges = g->z;
      else if (e.role == "causal_dq" || e.role == "causal_dkv") ranges = g->x;
      else continue;
      EXPECT_EQ(ranges, unsigned(want)) << e.role;
      ++checked;
    }
    EXPECT_GT(checked, 0) << "no split kernel launched";
    std::printf("%s: %d ranges rel rms %.3e; 4 ranges %.3e\n", c.name, want, r.error, full.error);
    EXPECT_TRUE(r.pass) << r.error;
    EXPECT_LE(r.error, 1.5 * full.error + slack) << "4 ranges: " << full.error;

    if (want == 3) {
      HostBackend sanitized;
      sanitized.set_splits(want);
      sanitized.set_sanitize(host::parse_sanitize("init,bounds,sync,race,schedule=reverse").value_or_throw());
      const Outcome s = run_check(sanitized, spec, c);  // a finding fails the launch, hence the check
      EXPECT_TRUE(s.pass) << s.error;
      EXPECT_TRUE(sanitized.last_findings().empty());
      EXPECT_GT(sanitized.sanitized_launches(), 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, RuntimeSplits, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace lunajit
