// Per-token decoding latency (the generated kernels on the backend
// LUNAJIT_BACKEND picks: auto = a CUDA GPU when present, else the host
// emulator, runtime/host): one decode_step_kernel call (one new token per
// sequence against the carried (S, z), docs/MATH.md §3) versus what generation
// without carried state costs per token, a full causal forward over the prefix
// of N tokens (causal_chunk_kernel), at N = 128 .. 8192. Luna default spec
// (d = dv = 64, M = L = 8, D = 64), fp32, 4 heads; the step at batch 1, 8
// and 64, the forward at batch 1 and 8 (64 takes minutes on the emulator). The decode
// step's work does not depend on N (it reads the state, not the prefix); the
// forward's grows linearly. The first iteration of each benchmark JIT-compiles
// (through the binary cache); Google Benchmark's warm-up absorbs it.
//   cmake --build build --target decode_bench && build/bench/decode_bench
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>

#include "codegen/decode_source.h"
#include "codegen/feature_params.h"
#include "runtime/attention_runner.h"
#include "runtime/host/host_backend.h"

namespace lunajit {
namespace {

Backend& host() {
  static std::unique_ptr<Backend> b = [] {
    const char* env = std::getenv("LUNAJIT_BACKEND");
    return make_backend(env ? env : "auto").value_or_throw();
  }();
  return *b;
}

AttentionSpec spec() {
  AttentionSpec s = default_spec(Family::luna);
  s.causal = true;
  s.dtype = DType::fp32;
  return s;
}

const Arch& sm90() {
  static const Arch a = arch_from_sm(90).value_or_throw();
  return a;
}

Buffer filled(size_t floats, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> x(floats);
  for (float& e : x) e = n(rng);
  Buffer b = host().allocate(floats * 4).value_or_throw();
  if (!host().copy_to_device(b, x.data(), floats * 4).ok()) std::abort();
  return b;
}

TensorRef ref(const Buffer& b, int seq, int heads, int width) {
  return {b.as_pointer(), int64_t(seq) * heads * width, int64_t(heads) * width, width};
}
MutableTensorRef mref(const Buffer& b, int seq, int heads, int width) {
  return {b.as_pointer(), int64_t(seq) * heads * width, int64_t(heads) * width, width};
}

constexpr int kHeads = 4;

void BM_DecodeStep(benchmark::State& state) {
  const AttentionSpec s = spec();
  const int B = int(state.range(1)), d = s.head_dim, dv = s.value_dim, D = s.feature_dim();
  static AttentionRunner runner =
      AttentionRunner::create_decode(host(), s, default_config(s, sm90(), Pass::forward)).value_or_throw();
  const std::vector<float> p = init_params(s, kHeads, 1);
  Buffer params = host().allocate(p.size() * 4).value_or_throw();
  if (!host().copy_to_device(params, p.data(), p.size() * 4).ok()) std::abort();
  Buffer q = filled(size_t(B) * kHeads * d, 1), k = filled(size_t(B) * kHeads * d, 2), v = filled(size_t(B) * kHeads * dv, 3);
  Buffer o = filled(size_t(B) * kHeads * dv, 4);
  // The state of a prefix of N tokens: its values do not change the step's cost.
  Buffer S = filled(size_t(B) * kHeads * D * dv, 5, 0.01f), z = filled(size_t(B) * kHeads * D, 6, 0.01f);
  for (auto _ : state) {
    Status st = runner.decode({B, kHeads, 1}, ref(q, 1, kHeads, d), ref(k, 1, kHeads, d), ref(v, 1, kHeads, dv),
                              mref(o, 1, kHeads, dv), params.ptr(), S.ptr(), z.ptr());
    if (!st.ok()) state.SkipWithError(st.error().message.c_str());
    if (!host().synchronize().ok()) std::abort();
  }
  state.counters["prefix"] = double(state.range(0));
}

void BM_FullCausalForwardOverPrefix(benchmark::State& state) {
  const AttentionSpec s = spec();
  const int N = int(state.range(0)), B = int(state.range(1)), d = s.head_dim, dv = s.value_dim;
  static AttentionRunner runner =
      AttentionRunner::create(host(), s, default_config(s, sm90(), Pass::forward), Pass::forward).value_or_throw();
  const std::vector<float> p = init_params(s, kHeads, 1);
  Buffer params = host().allocate(p.size() * 4).value_or_throw();
  if (!host().copy_to_device(params, p.data(), p.size() * 4).ok()) std::abort();
  const size_t rows = size_t(B) * N * kHeads;
  Buffer q = filled(rows * d, 1), k = filled(rows * d, 2), v = filled(rows * dv, 3), o = filled(rows * dv, 4);
  for (auto _ : state) {
    Status st = runner.forward({B, kHeads, N}, ref(q, N, kHeads, d), ref(k, N, kHeads, d), ref(v, N, kHeads, dv),
                               mref(o, N, kHeads, dv), params.ptr());
    if (!st.ok()) state.SkipWithError(st.error().message.c_str());
    if (!host().synchronize().ok()) std::abort();
  }
  state.counters["prefix"] = double(N);
}

void step_lengths(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8, 64})
    for (int n : {128, 512, 2048, 8192}) b->Args({n, batch});
}
void forward_lengths(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8})
    for (int n : {128, 512, 2048, 8192}) b->Args({n, batch});
}

BENCHMARK(BM_DecodeStep)->Apply(step_lengths)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FullCausalForwardOverPrefix)->Apply(forward_lengths)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lunajit
