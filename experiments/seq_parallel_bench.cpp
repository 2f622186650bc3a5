// seq_parallel_bench: wall time and communication volume of sequence-parallel
// causal (or not) linear attention (lunajit::dist::sequence_parallel_linear_
// attention) over R ranks on this machine, forward + backward of one layer.
//
//   seq_parallel_bench [--nproc 2] [--seq 16384] [--batch 1] [--heads 4] [--dim 32]
//                      [--reps 5] [--threads 1] [--full] [--path aten|host_kernels]
//
// Launches itself --nproc times (FileStore in a fresh temporary directory, Gloo
// over 127.0.0.1), each rank holding seq / nproc tokens; with --nproc 1 it also
// times the single-process lunajit::linear_attention (same path) on the whole
// sequence. --path host_kernels runs the host-emulated kernels (slow: it shows
// the composition works and what it sends, not GPU speed). Rank 0 prints the median over --reps of the step time (barrier to
// barrier, so the slowest rank's), and the bytes counted at the process-group
// calls per step next to the formula B * H * D * (dv + 1) * 4 per collective.
// Each rank runs --threads intra-op threads: the ranks share the machine's
// cores, so R ranks on C cores can gain at most min(R, C / threads); the CPU
// time per step of the busiest rank shows the split of the work regardless.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include "apps/cli_support.h"
#include "codegen/attention_spec.h"
#include "torch_binding/linear_attention.h"
#include "torch_binding/sequence_parallel.h"

namespace {

using torch::Tensor;
namespace dist = lunajit::dist;

struct Args {
  int nproc = 2, seq = 16384, batch = 1, heads = 4, dim = 32, reps = 5, threads = 1, rank = -1;
  bool full = false;
  std::string store, path = "aten";
};

lunajit::AttentionSpec spec_of(const Args& a) {
  return lunajit::spec_from_string(fmt::format(
                                       R"({{"family": "luna", "head_dim": {0}, "value_dim": {0}, "causal": {1},
          "dtype": "fp32", "luna": {{"projections": 8, "channels": 4, "mlp_width": 16}}}})",
                                       a.dim, a.full ? "false" : "true"))
      .value_or_throw();
}

// CPU time of this process (every thread, Gloo's included), ms.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One forward + backward step on (q, k, v) of `n` tokens; returns ms.
template <class F>
double step_ms(const Args& a, int64_t n, const F& attention, const std::function<void()>& sync) {
  torch::manual_seed(1);
  const Tensor q = torch::randn({a.batch, n, a.heads, a.dim}).requires_grad_(true);
  const Tensor k = torch::randn({a.batch, n, a.heads, a.dim}).requires_grad_(true);
  const Tensor v = torch::randn({a.batch, n, a.heads, a.dim}).requires_grad_(true);
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  attention(q, k, v).sum().backward();
  sync();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int rank_main(const Args& a) {
  torch::set_num_threads(a.threads);
  dist::Communicator comm(dist::make_process_group(a.store, a.rank, a.nproc));
  const lunajit::AttentionSpec spec = spec_of(a);
  const Tensor params = lunajit::init_feature_params(spec, a.heads, 0).requires_grad_(true);
  const int64_t n = a.seq / a.nproc;
  const lunajit::AttentionPath path =
      a.path == "aten" ? lunajit::AttentionPath::aten : lunajit::AttentionPath::host_kernels;
  auto sp = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    dist::SequenceParallelOptions o;
    o.path = path;
    return dist::sequence_parallel_linear_attention(comm, q, k, v, params, spec, o);
  };
  auto sync = [&] { comm.barrier(); };
  step_ms(a, n, sp, sync);  // warm-up
  comm.reset_stats();
  std::vector<double> t;
  const double cpu0 = cpu_ms();
  for (int i = 0; i < a.reps; ++i) t.push_back(step_ms(a, n, sp, sync));
  // The work each rank does, whatever the sharing of cores: the most CPU time of any rank per step.
  const Tensor cpu = torch::tensor({(cpu_ms() - cpu0) / a.reps}, torch::kDouble);
  const dist::CommStats st = comm.stats();
  double cpu_max = 0;
  for (const Tensor& c : comm.all_gather(cpu)) cpu_max = std::max(cpu_max, c.item<double>());
  if (a.rank == 0) {
    const int64_t per = dist::sequence_parallel_payload_bytes(spec, a.batch, a.heads, torch::kFloat);
    std::printf("seq_parallel_bench: %s luna on path %s, seq %d = %d ranks x %lld tokens, batch %d, %d heads, "
                "d = dv = %d, D = %d, %d thread%s per rank\n",
                a.full ? "non-causal" : "causal", a.path.c_str(), a.seq, a.nproc, (long long)n, a.batch, a.heads, a.dim,
                spec.feature_dim(), a.threads, a.threads == 1 ? "" : "s");
    std::printf("  sequence-parallel fwd+bwd: median %.1f ms wall over %d reps; CPU time per step of the busiest "
                "rank %.1f ms\n",
                median(t), a.reps, cpu_max);
    std::printf("  per step and rank, counted at the process group: %lld collectives, %lld bytes contributed, "
                "%lld bytes received\n",
                (long long)(st.calls / a.reps), (long long)(st.payload_bytes / a.reps),
                (long long)(st.received_bytes / a.reps));
    std::printf("  formula: 2 allgathers x B*H*D*(dv+1)*4 = 2 x %lld = %lld bytes contributed, x (R-1) = %lld "
                "received\n",
                (long long)per, (long long)(2 * per), (long long)(2 * per * (a.nproc - 1)));
    if (a.nproc == 1) {
      auto one = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
        lunajit::LinearAttentionOptions o;
        o.path = path;
        return lunajit::linear_attention(q, k, v, params, spec, o);
      };
      std::vector<double> t1;
      for (int i = 0; i < a.reps; ++i) t1.push_back(step_ms(a, a.seq, one, [] {}));
      std::printf("  single-process lunajit::linear_attention fwd+bwd: median %.1f ms\n", median(t1));
    }
  }
  comm.barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"seq_parallel_bench: sequence-parallel linear attention over c10d ranks on this machine",
               "seq_parallel_bench"};
  app.option_defaults()->always_capture_default();
  app.add_option("--nproc", a.nproc, "ranks")->check(lunajit::int_in("--nproc", {1, 64}));
  app.add_option("--seq", a.seq, "whole sequence length (a multiple of --nproc)")->check(lunajit::int_in("--seq", {1, 1 << 24}));
  app.add_option("--batch", a.batch, "batch")->check(lunajit::int_in("--batch", {1, 4096}));
  app.add_option("--heads", a.heads, "heads")->check(lunajit::int_in("--heads", {1, 256}));
  app.add_option("--dim", a.dim, "head_dim = value_dim")->check(lunajit::int_in("--dim", {1, 512}));
  app.add_option("--reps", a.reps, "timed steps")->check(lunajit::int_in("--reps", {1, 1000}));
  app.add_option("--threads", a.threads, "intra-op threads per rank")->check(lunajit::int_in("--threads", {1, 256}));
  app.add_flag("--full", a.full, "non-causal instead of causal");
  app.add_option("--path", a.path, "aten or host_kernels")->check(CLI::IsMember({"aten", "host_kernels"}));
  app.add_option("--rank", a.rank, "(set by the launcher) this process's rank")->check(lunajit::int_in("--rank", {0, 63}));
  app.add_option("--store", a.store, "(set by the launcher) the FileStore file");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const int rc = lunajit::parse_command_line(app, args); rc >= 0) return rc;
  if (a.seq % a.nproc != 0) {
    std::fprintf(stderr, "seq_parallel_bench: --seq = %d: must be a multiple of --nproc = %d\n", a.seq, a.nproc);
    return 2;
  }
  try {
    if (a.rank >= 0) return rank_main(a);
    const std::string dir = dist::make_temp_dir("lunajit-spbench-");
    const std::string exe = dist::self_executable();
    const auto codes = dist::run_ranks(
        a.nproc,
        [&](int r) {
          std::vector<std::string> v{exe};
          v.insert(v.end(), args.begin(), args.end());
          v.push_back("--rank");
          v.push_back(std::to_string(r));
          v.push_back("--store");
          v.push_back(dir + "/store");
          return v;
        },
        std::chrono::minutes(10));
    std::filesystem::remove_all(dir);
    int worst = 0;
    for (int r = 0; r < a.nproc; ++r) worst = std::max(worst, codes[r]);
    return worst;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seq_parallel_bench: %s\n", e.what());
    return 1;
  }
}
