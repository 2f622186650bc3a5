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

std::string duration_text(double s) {
  if (s < 60) return fmt::format("{:.0f} s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", int(s) / 60, int(s) % 60);
  return fmt::format("{}h{:02d}m", int(s) / 3600, int(s) / 60 % 60);
}

// Progress on stderr. On a terminal: "[compile forward] ####....... 12/40 ETA 19 s"
// on one line, redrawn. Otherwise (a log file, a pipe): a line at the first
// step of each stage, then at most every kLogEvery seconds, and at its end:
// "lunajit tune: compile forward 12/40 (30%), 8 s elapsed, ETA 19 s".
// The counter of a stage never goes backwards.
class ProgressBar {
 public:
  static constexpr double kLogEvery = 10;
  explicit ProgressBar(bool enabled) : enabled_(enabled), tty_(::isatty(2) != 0) {}
  ~ProgressBar() { finish(); }
  void update(const TuneProgress& p) {
    if (!enabled_ || p.total == 0) return;
    const auto now = Clock::now();
    const std::string label = fmt::format("{} {}", p.stage, to_string(p.pass));
    const bool same_stage = label == label_ && p.total == total_;
    // An older report of a stage still running: never show the counter going back.
    if (same_stage && p.done < done_ && done_ != total_) return;
    if (!same_stage || p.done < done_) {  // a new stage (or the same stage again, for the next shape)
      finish();
      label_ = label;
      total_ = p.total;
      start_ = now;
      last_line_ = {};
      done_ = 0;
    }
    if (p.done == done_ && p.done != 0) return;
    done_ = p.done;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const std::string eta = p.done == 0 ? "ETA ?"
                            : p.done == p.total
                                ? fmt::format("done in {}", duration_text(elapsed))
                                : "ETA " + duration_text(elapsed * double(p.total - p.done) / double(p.done));
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * p.done / p.total);
      std::fprintf(stderr, "\r[%-16s] %s%s %zu/%zu %-16s", label.c_str(), std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), p.done, p.total, eta.c_str());
      open_ = true;
      if (p.done == p.total) finish();
      return;
    }
    const bool due = p.done <= 1 || p.done == p.total ||
                     std::chrono::duration<double>(now - last_line_).count() >= kLogEvery;
    if (!due) return;
    last_line_ = now;
    std::fprintf(stderr, "lunajit tune: %s %zu/%zu (%.0f%%), %s elapsed, %s\n", label.c_str(), p.done, p.total,
                 100.0 * double(p.done) / double(p.total), duration_text(elapsed).c_str(), eta.c_str());
  }
  void finish() {
    if (open_) std::fputc('\n', stderr);
    open_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_, tty_, open_ = false;
  std::string label_;
  size_t total_ = 0, done_ = 0;
  Clock::time_point start_, last_line_;
};

std::string shape_text(const ProblemShape& s) { return fmt::format("{}x{}x{}", s.batch, s.heads, s.seq); }

void print_table(const std::vector<TuneResult>& results) {
  std::printf("%-9s %-12s %-18s %-30s %-13s %10s %9s %9s %8s %7s\n", "pass", "B x H x N", "bucket (N, BxH)", "chosen",
              "method", "ms", "tried/all", "correct", "compile", "check");
  for (const auto& r : results) {
    size_t correct = 0;
    double ms = 0;
    for (const auto& c : r.candidates) {
      correct += c.correct;
      if (c.config == r.chosen) ms = c.ms;
    }
    const std::string bucket = fmt::format("{}, {}", r.key.bucket.seq, r.key.bucket.batch_heads);
    if (r.from_db) {
      std::printf("%-9s %-12s %-18s %-30s %-13s %10s %9s %9s %8s %7s\n", std::string(to_string(r.pass)).c_str(),
                  shape_text(r.shape).c_str(), bucket.c_str(), r.chosen.to_string().c_str(), r.method.c_str(), "-",
                  "-", "-", "(db)", "-");
    } else {
      std::printf("%-9s %-12s %-18s %-30s %-13s %10.4f %9s %9zu %7.1fs %6.1fs\n",
                  std::string(to_string(r.pass)).c_str(), shape_text(r.shape).c_str(), bucket.c_str(),
                  r.chosen.to_string().c_str(), r.method.c_str(), ms,
                  fmt::format("{}/{}", r.candidates.size() - r.pruned, r.candidates.size()).c_str(), correct,
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
                       {"compile_seconds", c.compile_seconds},
                       {"model_ms", c.model_ms},
                       {"spill_bytes", c.spill_bytes}});
    out.push_back({{"pass", to_string(r.pass)},
                   {"shape", {r.shape.batch, r.shape.heads, r.shape.seq}},
                   {"key", r.key.to_string()},
                   {"chosen", r.chosen.to_json()},
                   {"method", r.method},
                   {"from_db", r.from_db},
                   {"compile_wall_seconds", r.compile_wall_seconds},
                   {"check_wall_seconds", r.check_wall_seconds},
                   {"nvrtc_compiles", r.nvrtc_compiles},
                   {"space_size", r.space_size},
                   {"pruned", r.pruned},
                   {"candidates", cands}});
  }
  return out;
}

}  // namespace

int run_tune(const TuneRun& a) {
  if (auto st = BinaryCache::check_environment(); !st) return fail(st.error());
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
  opt.top_k = a.top_k;
  opt.exhaustive = a.exhaustive;
  opt.threads = a.threads;
  opt.retune = a.retune;
  if (a.pass != "all") {
    auto p = parse_pass(a.pass);
    if (!p) return fail(p.error());
    opt.passes = {*p};
  }
  ProgressBar bar(!a.quiet && !a.json);
  opt.progress = [&](const TuneProgress& p) { bar.update(p); };
  opt.on_result = [&](const TuneResult& r) {
    if (a.quiet || a.json) return;
    bar.finish();
    if (r.from_db)
      std::fprintf(stderr,
                   "lunajit tune: %s %s already tuned (%s%s), skipped; --retune tunes it again\n",
                   std::string(to_string(r.pass)).c_str(), shape_text(r.shape).c_str(), r.method.c_str(),
                   r.tuned_at.empty() ? "" : (", " + r.tuned_at).c_str());
    else
      std::fprintf(stderr, "lunajit tune: %s %s -> %s, %s\n", std::string(to_string(r.pass)).c_str(),
                   shape_text(r.shape).c_str(), r.chosen.to_string().c_str(),
                   r.saved ? "saved" : "NOT saved (the database is not writable)");
  };
  std::unique_ptr<Timer> timer;
  if (gpu) {
    CudaTimerOptions t;
    if (a.budget_seconds > 0) {
      // The budget is per (pass, shape), shared by the candidates.
      size_t n = Tuner(db, *check_backend, opt).candidates(*spec, Pass::forward).size();
      if (!opt.exhaustive && opt.top_k > 0) n = std::min(n, opt.top_k * opt.shapes.size());
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
  bool all_from_db = true;
  for (const auto& r : *results) all_from_db = all_from_db && r.from_db;
  // Results that could not be written must not look saved.
  const bool saved = db.persistent() || all_from_db;
  const std::string not_saved =
      saved ? "" : fmt::format("the tuning results were NOT saved: cannot write {} ({}); they were used for this run only",
                               db.file().string(), db.not_saved_reason());
  if (a.json) {
    std::puts(json{{"spec", to_json(*spec)},
                   {"arch", arch.name()},
                   {"device", fp.to_json()},
                   {"database", db.file().string()},
                   {"saved", saved},
                   {"seconds", seconds},
                   {"nvrtc_compiles", compiles},
                   {"results", results_json(*results)}}
                  .dump(2)
                  .c_str());
    if (!saved) std::fprintf(stderr, "lunajit: %s\n", not_saved.c_str());
    return saved ? 0 : 1;
  }
  if (a.note) std::printf("%s\n", a.note->c_str());
  std::printf("tuned %s for %s on %s (%s)\n", spec_hash(*spec).substr(0, 8).c_str(), arch.name().c_str(),
              fp.name.c_str(), gpu ? "measured with CUDA events" : "no GPU: checked on the host, model-ranked");
  print_table(*results);
  if (!saved) {
    std::printf("%.1f s, %llu NVRTC compiles; NOT saved\n", seconds, static_cast<unsigned long long>(compiles));
    std::fflush(stdout);
    std::fprintf(stderr, "lunajit: %s\n", not_saved.c_str());
    return 1;
  }
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
  cmd->add_option("--max-candidates", args->max_candidates,
                  "tune an evenly spaced subset of this many candidates (0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1000000}));
  cmd->add_option("--top-k", args->top_k,
                  "compile, check and rank only the cost model's best K candidates per shape (0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1000000}));
  cmd->add_flag("--exhaustive", args->exhaustive, "compile, check and rank every candidate (no model pre-ranking)");
  cmd->add_option("--threads", args->threads, "compile/check workers (default 0: all cores)")
      ->check(CLI::Range(0, 4096));
  cmd->add_flag("--retune", args->retune, "ignore the database and tune again");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->add_flag("--json", args->json, "machine-readable output");
  return {cmd, [args] { return run_tune(*args); }};
}

}  // namespace lunajit
