// Google Benchmark suite of the GPU comparison (issue 11 item 4; the C++ side of
// bench/gpu_bench.py, without Python in the timed loop): the default LUNA spec,
// forward and forward+backward, causal and not, through
//   lunajit  lunajit's kernels (path cuda_kernels; the tuning database's
//            choice, so run `lunajit tune` first: bench/gpu_check.sh does),
//   eager    the ATen composition of the same model (path aten: phi
//            materialised, chunked causal products),
//   sdpa     torch's scaled_dot_product_attention (FlashAttention where
//            available; LibTorch >= 2.0, else each such benchmark is skipped
//            with the reason),
// at B = 8, H = 12, d = dv = 64, bf16, N in {1K, 4K, 16K, 64K}. Each iteration is
// timed on the host around the call and a device synchronisation (manual time),
// so it includes launch overhead, as a user sees it. A configuration that fails
// (out of memory, say) is reported with SkipWithError and its message, never
// dropped. forward+backward differentiates the summed output in q, k, v and,
// for lunajit and eager, the feature parameters (a training step's gradients).
// Counters: tokens/s (B N per iteration).
//
//   attention_bench [--seqs=1024,4096] [--batch=8] [--heads=12] [google benchmark flags]
//   attention_bench --cpu-smoke [...]   the same benchmarks on the CPU at a tiny
//       size (B 1, H 2, N 64, fp32; lunajit on the host kernels, the emulator):
//       checks the suite without a GPU (ctest attention_bench_cpu_smoke). Its
//       times measure the emulator, not a GPU kernel: no claim rests on them.
// Without --cpu-smoke and without a CUDA device every benchmark is skipped,
// saying so.
#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "torch_binding/linear_attention.h"

namespace {

struct Setup {
  bool cpu_smoke = false;
  int64_t batch = 8, heads = 12, dim = 64;
  std::vector<int64_t> seqs{1024, 4096, 16384, 65536};
};
Setup g_setup;

enum class Impl { lunajit, eager, sdpa };
const char* name(Impl i) { return i == Impl::lunajit ? "lunajit" : i == Impl::eager ? "eager" : "sdpa"; }

torch::Device device() { return g_setup.cpu_smoke ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA); }

void sync() {
  if (!g_setup.cpu_smoke) torch::cuda::synchronize();
}

// One call of impl on q, k, v ([B, N, H, d], fla layout); the output in that layout.
torch::Tensor call(Impl impl, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& params, const lunajit::AttentionSpec& spec) {
  switch (impl) {
    case Impl::lunajit: {
      lunajit::LinearAttentionOptions o;
      o.path = g_setup.cpu_smoke ? lunajit::AttentionPath::host_kernels : lunajit::AttentionPath::cuda_kernels;
      return lunajit::linear_attention(q, k, v, params, spec, o);
    }
    case Impl::eager: {
      lunajit::LinearAttentionOptions o;
      o.path = lunajit::AttentionPath::aten;
      return lunajit::linear_attention(q, k, v, params, spec, o);
    }
    case Impl::sdpa:
#if TORCH_VERSION_MAJOR >= 2
      // SDPA takes [B, H, N, d].
      return at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {}, 0.0,
                                              spec.causal)
          .transpose(1, 2);
#else
      break;
#endif
  }
  throw std::logic_error("unreachable");
}

void run(benchmark::State& state, Impl impl, bool causal, bool backward) {
  const int64_t B = g_setup.batch, H = g_setup.heads, d = g_setup.dim, N = state.range(0);
  if (!g_setup.cpu_smoke && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device (LibTorch sees none); --cpu-smoke runs the suite on the CPU at a tiny size");
    return;
  }
#if TORCH_VERSION_MAJOR < 2
  if (impl == Impl::sdpa) {
    state.SkipWithError(fmt::format("scaled_dot_product_attention needs LibTorch >= 2.0; this is {}.{}",
                                    TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR)
                            .c_str());
    return;
  }
#endif
  try {
    lunajit::AttentionSpec spec = lunajit::default_spec(lunajit::Family::luna);
    spec.causal = causal;
    spec.dtype = g_setup.cpu_smoke ? lunajit::DType::fp32 : lunajit::DType::bf16;
    const auto dt = g_setup.cpu_smoke ? torch::kFloat32 : torch::kBFloat16;
    const auto opts = torch::TensorOptions().device(device()).dtype(dt);
    torch::manual_seed(0);
    torch::Tensor q = torch::randn({B, N, H, d}, opts) * 0.5, k = torch::randn({B, N, H, d}, opts) * 0.5,
                  v = torch::randn({B, N, H, d}, opts) * 0.5;
    torch::Tensor params = lunajit::init_feature_params(spec, H).to(device());
    if (backward) {
      q.requires_grad_();
      k.requires_grad_();
      v.requires_grad_();
      params.requires_grad_();
    }
    auto once = [&] {
      if (backward) {
        call(impl, q, k, v, params, spec).to(torch::kFloat32).sum().backward();
      } else {
        torch::NoGradGuard no_grad;
        benchmark::DoNotOptimize(call(impl, q, k, v, params, spec));
      }
    };
    once();  // warm-up: kernel loads (cache or compile), allocator
    sync();
    for (auto _ : state) {
      const auto t0 = std::chrono::steady_clock::now();
      once();
      sync();
      state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    state.counters["tokens_per_s"] = benchmark::Counter(double(B * N), benchmark::Counter::kIsIterationInvariantRate);
    state.SetLabel(fmt::format("B{} H{} d{} {}", B, H, d, g_setup.cpu_smoke ? "fp32 cpu-smoke" : "bf16"));
  } catch (const std::exception& e) {  // recorded, not dropped
    const std::string msg = e.what();
    state.SkipWithError(msg.substr(0, msg.find('\n')).c_str());
    try {  // let the device finish what it started before the next benchmark
      sync();
    } catch (const std::exception&) {  // a sticky CUDA error: the next benchmarks report it
    }
  }
}

// Consumes the suite's own flags (before Google Benchmark sees argv).
bool parse_own_flags(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    try {
      if (a == "--cpu-smoke") {
        g_setup.cpu_smoke = true;
      } else if (const char* v = value("--seqs=")) {
        g_setup.seqs.clear();
        for (const char* p = v; *p;) {
          size_t used = 0;
          const long long n = std::stoll(p, &used);
          if (n < 1) throw std::invalid_argument("not positive");
          g_setup.seqs.push_back(n);
          p += used;
          if (*p == ',') ++p;
          else if (*p) throw std::invalid_argument("expected a comma");
        }
      } else if (const char* v = value("--batch=")) {
        g_setup.batch = std::stoll(v);
      } else if (const char* v = value("--heads=")) {
        g_setup.heads = std::stoll(v);
      } else {
        argv[out++] = argv[i];
        continue;
      }
    } catch (const std::exception&) {
      fmt::print(stderr, "attention_bench: {}: expected a positive whole number (--seqs: a comma-separated list)\n", a);
      return false;
    }
  }
  argc = out;
  if (g_setup.batch < 1 || g_setup.heads < 1) {
    fmt::print(stderr, "attention_bench: --batch and --heads must be at least 1\n");
    return false;
  }
  if (g_setup.cpu_smoke) {
    g_setup.batch = 1;
    g_setup.heads = 2;
    g_setup.seqs = {64};
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!parse_own_flags(argc, argv)) return 2;
  if (g_setup.cpu_smoke) torch::set_num_threads(1);
  for (Impl impl : {Impl::lunajit, Impl::eager, Impl::sdpa})
    for (bool causal : {false, true})
      for (bool backward : {false, true}) {
        const std::string n = fmt::format("{}/{}/{}", name(impl), causal ? "causal" : "noncausal",
                                          backward ? "fwd+bwd" : "fwd");
        auto* b = benchmark::RegisterBenchmark(n.c_str(), [=](benchmark::State& s) { run(s, impl, causal, backward); });
        for (int64_t seq : g_setup.seqs) b->Arg(seq);
        b->ArgName("N")->UseManualTime()->Unit(benchmark::kMillisecond);
        if (g_setup.cpu_smoke) b->Iterations(2);
        else b->MinTime(0.2);
      }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
