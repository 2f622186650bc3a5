// The C++ side of the Python call overhead (bench/python_overhead.py runs the
// same shapes from Python; compare the CPU column): lunajit::linear_attention on small CPU tensors,
// ATen path, forward only, one call per iteration. Not built by default:
//   cmake --build build --target torch_call_bench && build/bench/torch_call_bench
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "torch_binding/linear_attention.h"

namespace {

lunajit::AttentionSpec spec_of(const std::string& family) {
  const std::string luna = family == "luna" ? R"(, "luna": {"projections": 2, "channels": 2, "mlp_width": 4})" : "";
  return lunajit::spec_from_string(R"({"family": ")" + family +
                                   R"(", "head_dim": 16, "value_dim": 16, "dtype": "fp32", "causal": true)" + luna +
                                   "}")
      .value_or_throw();
}

void run(benchmark::State& state, const char* family) {
  torch::NoGradGuard no_grad;
  const lunajit::AttentionSpec spec = spec_of(family);
  const int64_t seq = state.range(0);
  const torch::Tensor q = torch::randn({1, seq, 2, 16}), k = torch::randn({1, seq, 2, 16}),
                      v = torch::randn({1, seq, 2, 16});
  const torch::Tensor p = lunajit::init_feature_params(spec, 2);
  for (auto _ : state) benchmark::DoNotOptimize(lunajit::linear_attention(q, k, v, p, spec));
}

void BM_CppCall_elu(benchmark::State& s) { run(s, "elu"); }
void BM_CppCall_luna(benchmark::State& s) { run(s, "luna"); }
BENCHMARK(BM_CppCall_elu)->Arg(16)->Arg(256)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CppCall_luna)->Arg(16)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
