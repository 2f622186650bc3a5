#include "apps/tune_command.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune/tuner.h"
#include "cache/binary_cache.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/host/host_backend.h"

namespace lunajit {
namespace {

using nlohmann::json;

int fail(const Error& e) {
  std::fprintf(stderr, "lunajit: %s\n", e.message.c_str());
  return e.kind == ErrorKind::invalid_argument ? 2 : 1;
}

// "[compile forward] ##########.......... 12/40" on one stderr line, redrawn.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), tty_(::isatty(2) != 0) {}
  ~ProgressBar() { finish(); }
  void update(const TuneProgress& p) {
    if (!enabled_ || p.total == 0) return;
    const std::string label = fmt::format("{} {}", p.stage, to_string(p.pass));
    // Without a terminal, one line per stage (at its end) instead of redraws.
    if (!tty_ && p.done != p.total) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * p.done / p.total);
    std::fprintf(stderr, "%s[%-16s] %s%s %zu/%zu%s", tty_ ? "\r" : "", label.c_str(), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), p.done, p.total, tty_ ? "" : "\n");
    open_ = tty_;
    if (p.done == p.total && tty_) {
      std::fputc('\n', stderr);
      open_ = false;
    }
  }
  void finish() {
    if (open_) std::fputc('\n', stderr);
    open_ = false;
  }

 private:
  bool enabled_, tty_, open_ = false;
};

std::string shape_text(const ProblemShape& s) { return fmt::format("{}x{}x{}", s.batch, s.heads, s.seq); }

void print_table(const std::vector<TuneResult>& results) {
  std::printf("%-9s %-12s %-18s %-30s %-13s %10s %6s %9s %8s %7s\n", "pass", "B x H x N", "bucket (N, BxH)", "chosen",
              "method", "ms", "cands", "correct", "compile", "check");
  for (const auto& r : results) {
    size_t correct = 0;
    double ms = 0;
    for (const auto& c : r.candidates) {
      correct += c.correct;
      if (c.config == r.chosen) ms = c.ms;
    }
    const std::string bucket = fmt::format("{}, {}", r.key.bucket.seq, r.key.bucket.batch_heads);
    if (r.from_db) {
      std::printf("%-9s %-12s %-18s %-30s %-13s %10s %6s %9s %8s %7s\n", std::string(to_string(r.pass)).c_str(),
                  shape_text(r.shape).c_str(), bucket.c_str(), r.chosen.to_string().c_str(), r.method.c_str(), "-",
                  "-", "-", "(db)", "-");
    } else {
      std::printf("%-9s %-12s %-18s %-30s %-13s %10.4f %6zu %9zu %7.1fs %6.1fs\n",
                  std::string(to_string(r.pass)).c_str(), shape_text(r.shape).c_str(), bucket.c_str(),
                  r.chosen.to_string().c_str(), r.method.c_str(), ms, r.candidates.size(), correct,
                  r.compile_wall_seconds, r.check_wall_seconds);
    }
  }
}

json results_json(const std::vector<TuneResult>& results) {
  json out = json::array();
  for (const auto& r : results) {
    json cands = json::array();
    for (const auto& c : r.candidates)
      cands.push_back({{"config", c.config.to_string()},
                       {"ms", c.ms},
                       {"status", c.status},
                       {"correct", c.correct},
                       {"rel_rms", c.rel_rms},
                       {"compile_seconds", c.compile_seconds}});
    out.push_back({{"pass", to_string(r.pass)},
                   {"shape", {r.shape.batch, r.shape.heads, r.shape.seq}},
                   {"key", r.key.to_string()},
                   {"chosen", r.chosen.to_json()},
                   {"method", r.method},
                   {"from_db", r.from_db},
                   {"compile_wall_seconds", r.compile_wall_seconds},
                   {"check_wall_seconds", r.check_wall_seconds},
                   {"nvrtc_compiles", r.nvrtc_compiles},
                   {"candidates", cands}});
  }
  return out;
}

}  // namespace

int run_tune(const TuneRun& a) {
  auto spec = load_spec(a.spec.empty() ? std::string(R"({"family": "luna"})") : a.spec);
  if (!spec) return fail(spec.error());
  auto shapes = parse_shapes(a.shapes);
  if (!shapes) return fail(shapes.error());

  // A GPU when asked for or when auto finds one; the host backend checks otherwise.
  std::unique_ptr<CudaBackend> gpu;
  if (a.backend != "host") {
    auto g = CudaBackend::create();
    if (g) gpu = std::move(*g);
    else if (a.backend == "cuda") return fail(g.error());
  }
  Arch arch;
  if (!a.arch.empty()) {
    auto parsed = parse_arch(a.arch);
    if (!parsed) return fail(parsed.error());
    arch = *parsed;
    if (gpu && arch.sm != gpu->arch().sm)
      return fail(Error::invalid(fmt::format("--arch {}: the GPU is {}; omit --arch to tune it, or use "
                                             "--backend host to model-rank another arch",
                                             a.arch, gpu->arch().name())));
  } else {
    arch = gpu ? gpu->arch() : arch_from_sm(90).value_or_throw();
  }
  DeviceFingerprint fp = model_fingerprint(arch);
  if (gpu) fp = device_fingerprint(gpu->device());
  TuningDb db(BinaryCache::default_dir(), fp);
  std::unique_ptr<Backend> host;
  Backend* check_backend = gpu.get();
  if (!gpu) {
    host = make_host_backend();
    check_backend = host.get();
  }

  TuneOptions opt;
  opt.arch = arch;
  opt.shapes = *shapes;
  opt.max_candidates = a.max_candidates;
  opt.threads = a.threads;
  opt.retune = a.retune;
  if (a.pass != "all") {
    auto p = parse_pass(a.pass);
    if (!p) return fail(p.error());
    opt.passes = {*p};
  }
  ProgressBar bar(!a.quiet && !a.json);
  opt.progress = [&](const TuneProgress& p) { bar.update(p); };
  std::unique_ptr<Timer> timer;
  if (gpu) {
    CudaTimerOptions t;
    if (a.budget_seconds > 0) {
      // The budget is per (pass, shape), shared by the candidates.
      const size_t n = Tuner(db, *check_backend, opt).candidates(*spec, Pass::forward).size();
      t.budget_seconds = a.budget_seconds / double(std::max<size_t>(n, 1));
    }
    timer = make_cuda_event_timer(*gpu, t);
  }
  Tuner tuner(db, *check_backend, opt, timer.get(), gpu.get());

  const uint64_t nvrtc_before = nvrtc_invocations();
  const auto t0 = std::chrono::steady_clock::now();
  auto results = tuner.tune(*spec);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bar.finish();
  if (!results) return fail(results.error());
  const uint64_t compiles = nvrtc_invocations() - nvrtc_before;
  if (a.json) {
    std::puts(json{{"spec", to_json(*spec)},
                   {"arch", arch.name()},
                   {"device", fp.to_json()},
                   {"database", db.file().string()},
                   {"seconds", seconds},
                   {"nvrtc_compiles", compiles},
                   {"results", results_json(*results)}}
                  .dump(2)
                  .c_str());
    return 0;
  }
  if (a.note) std::printf("%s\n", a.note->c_str());
  std::printf("tuned %s for %s on %s (%s)\n", spec_hash(*spec).substr(0, 8).c_str(), arch.name().c_str(),
              fp.name.c_str(), gpu ? "measured with CUDA events" : "no GPU: checked on the host, model-ranked");
  print_table(*results);
  std::printf("%.1f s, %llu NVRTC compiles; database %s\n", seconds, static_cast<unsigned long long>(compiles),
              db.file().string().c_str());
  return 0;
}

int run_demo_tune() {
  constexpr size_t kDemoCandidates = 6;
  const AttentionSpec spec = default_spec(Family::luna);
  const Arch sm90 = arch_from_sm(90).value_or_throw();
  const size_t all = search_space(spec, Pass::forward, sm90).size();
  std::puts("== tune (default LUNA spec) ==");
  TuneRun a;
  a.spec = canonical_json(spec);
  a.shapes = "4,8,1024";
  a.max_candidates = kDemoCandidates;
  a.retune = true;
  a.pass = "forward";
  a.note = fmt::format("demo: the forward pass, {} of its {} candidates (evenly spaced, plus the default config); "
                       "`lunajit tune` tunes every candidate of the forward and backward passes",
                       kDemoCandidates, all);
  return run_tune(a);
}

Subcommand add_tune_command(CLI::App& app) {
  auto args = std::make_shared<TuneRun>();
  auto* cmd = app.add_subcommand("tune", "tune the tile configs of a spec and store them in the tuning database");
  cmd->add_option("SPEC", args->spec, "spec JSON file or inline JSON text (default: the default LUNA spec)");
  cmd->add_option("--shapes", args->shapes, "B,H,N[;B,H,N...] shapes to tune (default 4,8,1024)");
  cmd->add_option("--arch", args->arch, "arch to tune for (default: the GPU's, else sm_90)");
  cmd->add_option("--budget", args->budget_seconds, "GPU timing budget per pass and shape, seconds")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--backend", args->backend, "auto | cuda | host")->check(CLI::IsMember({"auto", "cuda", "host"}));
  cmd->add_option("--pass", args->pass, "forward | backward | all")
      ->check(CLI::IsMember({"forward", "backward", "all"}));
  cmd->add_option("--max-candidates", args->max_candidates, "tune an evenly spaced subset of this many candidates");
  cmd->add_option("--threads", args->threads, "compile/check workers (default: all cores)");
  cmd->add_flag("--retune", args->retune, "ignore the database and tune again");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->add_flag("--json", args->json, "machine-readable output");
  return {cmd, [args] { return run_tune(*args); }};
}

}  // namespace lunajit
