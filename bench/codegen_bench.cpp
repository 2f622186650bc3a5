// Host-side costs on the path from spec to ready kernel: generating the source,
// hashing it for the cache key, parsing a spec. (Compile times are reported by
// `lunajit compile`; GPU timings come from the GPU script.)
#include <benchmark/benchmark.h>

#include "codegen/generator.h"

namespace lunajit {
namespace {

void BM_GenerateForward(benchmark::State& state) {
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = state.range(0) != 0;
  const TileConfig config = default_config(spec, arch_from_sm(90).value_or_throw());
  size_t bytes = 0;
  for (auto _ : state) {
    auto src = generate(spec, config, Pass::forward);
    bytes = src->code.size();
    benchmark::DoNotOptimize(src);
  }
  state.counters["source_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_GenerateForward)->Arg(0)->Arg(1);

void BM_ContentHash(benchmark::State& state) {
  AttentionSpec spec = default_spec(Family::luna);
  auto src = generate(spec, TileConfig(), Pass::forward).value_or_throw();
  src.content_hash();  // the embedded headers' hash is computed once per process
  for (auto _ : state) benchmark::DoNotOptimize(src.content_hash());
}
BENCHMARK(BM_ContentHash);

void BM_ParseSpec(benchmark::State& state) {
  const std::string text = canonical_json(default_spec(Family::luna));
  for (auto _ : state) benchmark::DoNotOptimize(spec_from_string(text));
}
BENCHMARK(BM_ParseSpec);

void BM_DefaultConfig(benchmark::State& state) {
  AttentionSpec spec = default_spec(Family::slay);
  spec.causal = true;
  const Arch arch = arch_from_sm(86).value_or_throw();
  for (auto _ : state) benchmark::DoNotOptimize(default_config(spec, arch));
}
BENCHMARK(BM_DefaultConfig);

}  // namespace
}  // namespace lunajit
