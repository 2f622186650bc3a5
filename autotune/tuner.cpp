#include "autotune/tuner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "codegen/cost_model.h"
#include "codegen/feature_params.h"
#include "autotune/forward_probe.h"
#include "autotune/validation.h"
#include "codegen/generator.h"
#include "runtime/attention_runner.h"

namespace lunajit {
namespace {

// The base a stored config is read onto: a stored config names every knob
// but writes `mma` only when it is on (TileConfig::to_json keeps the hashes of
// scalar configs), so a missing `mma` means off, whatever the default is.
TileConfig stored_base(const AttentionSpec& spec, const Arch& arch, Pass pass) {
  return default_config(spec, arch, pass).with_mma(false);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int worker_count(int threads) {
  if (threads > 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Runs body(i) for i in [0, n) on `threads` workers (a plain pool: one atomic
// counter, no queue); on_done(count) after each.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& body,
                  const std::function<void(size_t)>& on_done) {
  std::atomic<size_t> next{0}, done{0};
  std::mutex progress_mu;
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      body(i);
      if (on_done) {
        // Counted under the lock, so the reports arrive in order (a counter
        // taken before the lock could be overtaken: 3/5 printed before 2/5).
        std::lock_guard lock(progress_mu);
        on_done(++done);
      } else {
        ++done;
      }
    }
  };
  const int w = std::min<int>(worker_count(threads), std::max<size_t>(n, 1));
  if (w <= 1) return work();
  std::vector<std::thread> pool;
  for (int i = 0; i < w; ++i) pool.emplace_back(work);
  for (auto& t : pool) t.join();
}

// Device buffers of one forward or backward at `shape` for timing (contents
// zero: the kernels' work does not depend on the values; zero inputs give
// finite outputs, den = eps and g = 0, so no NaN slows a run).
struct PassBench {
  Buffer q, k, v, o, params;
  Buffer dout, dq, dk, dv, dparams;  // the backward's
  static Result<PassBench> create(Backend& b, const AttentionSpec& spec, Pass pass, const ProblemShape& s) {
    PassBench pb;
    const size_t rows = size_t(s.batch) * s.seq * s.heads, eb = dtype_bytes(spec.dtype);
    const size_t qk = rows * spec.head_dim * eb, vo = rows * spec.value_dim * eb;
    const size_t param_bytes = std::max<size_t>(
        size_t(1) << 20, 4 * param_layout(spec).per_head_floats * size_t(spec.params_per_head ? s.heads : 1));
    std::vector<std::pair<Buffer*, size_t>> bufs{{&pb.q, qk}, {&pb.k, qk}, {&pb.v, vo}, {&pb.o, vo},
                                                 {&pb.params, param_bytes}};
    if (pass == Pass::backward)
      bufs.insert(bufs.end(), {{&pb.dout, vo}, {&pb.dq, qk}, {&pb.dk, qk}, {&pb.dv, vo}, {&pb.dparams, param_bytes}});
    for (auto [buf, bytes] : bufs) {
      auto a = b.allocate(bytes);
      if (!a) return a.error();
      *buf = std::move(*a);
      if (auto st = b.fill_zero(*buf); !st) return st.error();
    }
    return pb;
  }
};

}  // namespace

std::vector<Result<CompiledKernel>> compile_candidates(const AttentionSpec& spec, Pass pass,
                                                       const std::vector<TileConfig>& configs, const Arch& arch,
                                                       int threads, const NvrtcOptions& options,
                                                       const std::function<void(size_t)>& on_done) {
  std::vector<Result<CompiledKernel>> out(configs.size(), Result<CompiledKernel>(Error::failure("not compiled")));
  parallel_for(
      configs.size(), threads,
      [&](size_t i) {
        auto src = generate(spec, configs[i], pass);
        if (!src) {
          out[i] = src.error();
          return;
        }
        out[i] = compile_nvrtc(*src, arch, options);
      },
      on_done);
  return out;
}

TuningKey tuning_key(const AttentionSpec& spec, Pass pass, const ProblemShape& s) {
  return {spec_hash(spec), std::string(to_string(pass)),
          shape_bucket(s.batch, s.heads, s.seq, std::string(to_string(spec.dtype)))};
}

DeviceFingerprint device_fingerprint(const cuda::DeviceInfo& d) {
  return {d.name,           d.sm(), d.sm_count, d.total_memory, cuda::format_driver_version(d.driver_version),
          nvrtc_build_identity(), LUNAJIT_VERSION};
}

DeviceFingerprint model_fingerprint(const Arch& arch) {
  const GpuSpec* g = representative_gpu(arch.sm);
  DeviceFingerprint f;
  f.name = g ? "model of " + g->name : "model of " + arch.name();
  f.sm = arch.sm;
  f.sm_count = g ? g->sm_count : 0;
  f.memory_bytes = g ? static_cast<uint64_t>(g->memory_gib * double(1ull << 30)) : 0;
  f.driver = "none";
  f.nvrtc = nvrtc_build_identity();
  f.lunajit = LUNAJIT_VERSION;
  return f;
}

ConfigChoice choose_config(const TuningDb& db, const AttentionSpec& spec, Pass pass, const ProblemShape& shape,
                           const Arch& arch) {
  const TuningLookup hit = db.lookup(tuning_key(spec, pass, shape));
  if (hit.entry) {
    auto c = tile_config_from_json(hit.entry->config, stored_base(spec, arch, pass));
    if (c && can_implement(spec, *c, arch, pass)) return {*c, hit.kind, hit.entry->method};
  }
  return {default_config(spec, arch, pass), LookupKind::none, "default"};
}

Tuner::Tuner(TuningDb& db, Backend& check_backend, TuneOptions options, Timer* timer, Backend* timing_backend,
             const GpuSpec* gpu)
    : db_(db),
      check_backend_(check_backend),
      options_(std::move(options)),
      timer_(timer),
      timing_backend_(timing_backend),
      gpu_(gpu != nullptr ? gpu : representative_gpu(options_.arch.sm)) {}

std::vector<TileConfig> Tuner::candidates(const AttentionSpec& spec, Pass pass) const {
  const auto space = search_space(spec, pass, options_.arch);
  if (options_.max_candidates == 0) return space;
  return sample_space(space, options_.max_candidates, default_config(spec, options_.arch, pass));
}

Result<std::vector<TuneResult>> Tuner::tune(const AttentionSpec& spec) {
  if (auto st = validate(spec); !st) return st.error();
  const Arch& arch = options_.arch;
  std::vector<TuneResult> results;
  const std::vector<Pass> passes = options_.passes.empty() ? tunable_passes(spec, arch) : options_.passes;
  for (Pass pass : passes) {
    // Shapes the database answers exactly need nothing compiled.
    std::vector<ProblemShape> pending;
    for (const ProblemShape& shape : options_.shapes) {
      if (auto st = validate(shape); !st) return st.error();
      const TuningKey key = tuning_key(spec, pass, shape);
      auto entry = options_.retune ? std::nullopt : db_.find(key);
      auto config = entry ? tile_config_from_json(entry->config, stored_base(spec, arch, pass))
                          : Result<TileConfig>(Error::invalid("no entry"));
      if (config && can_implement(spec, *config, arch, pass)) {
        TuneResult r;
        r.pass = pass;
        r.shape = shape;
        r.key = key;
        r.chosen = *config;
        r.method = entry->method;
        r.from_db = true;
        r.tuned_at = entry->tuned_at;
        if (options_.on_result) options_.on_result(r);
        results.push_back(std::move(r));
      } else {
        pending.push_back(shape);
      }
    }
    if (pending.empty()) continue;

    const std::vector<TileConfig> space = candidates(spec, pass);
    const TileConfig reference_config = default_config(spec, arch, pass);
    // Step 1: the model's pre-ranking (quick tune).
    std::vector<TileConfig> configs = space;
    std::vector<CandidateResult> pruned_rows;
    std::vector<double> model_ms(space.size(), 0);
    if (!options_.exhaustive && options_.top_k > 0 && space.size() > options_.top_k) {
      std::vector<bool> keep(space.size(), false);
      std::vector<size_t> rank_of(space.size(), 0);
      for (const ProblemShape& shape : pending) {
        std::vector<double> ms(space.size(), std::numeric_limits<double>::infinity());
        for (size_t i = 0; i < space.size(); ++i)
          if (auto p = predict_pass(spec, space[i], pass, shape, *gpu_, arch)) ms[i] = p->ms;
        std::vector<size_t> order(space.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] < ms[b]; });
        for (size_t r = 0; r < order.size(); ++r) {
          if (r < options_.top_k) keep[order[r]] = true;
          if (&shape == &pending.front()) {
            rank_of[order[r]] = r + 1;
            model_ms[order[r]] = ms[order[r]];
          }
        }
      }
      // The default config is always timed too: on an H200 the model's top 6
      // for the default LUNA forward at B 8, H 12, N 16384 all ran 2.6-3.8 ms
      // against the untuned default's 1.7 ms, so a tune without it made the
      // op slower. With it a GPU tune never stores a config slower (as
      // measured) than the default.
      for (size_t i = 0; i < space.size(); ++i)
        if (space[i] == reference_config) keep[i] = true;
      configs.clear();
      std::vector<double> kept_ms;
      for (size_t i = 0; i < space.size(); ++i) {
        if (keep[i]) {
          configs.push_back(space[i]);
          kept_ms.push_back(std::isfinite(model_ms[i]) ? model_ms[i] : 0);
          continue;
        }
        CandidateResult r;
        r.config = space[i];
        // A config the model cannot predict ranks last; its row keeps a finite
        // ms (JSON has no infinity) and says why.
        const bool predicted = std::isfinite(model_ms[i]);
        r.model_ms = predicted ? model_ms[i] : 0;
        r.ms = r.model_ms;
        r.status = predicted ? fmt::format("pruned (model rank {} of {})", rank_of[i], space.size())
                             : fmt::format("pruned (model rank {} of {}: no prediction)", rank_of[i], space.size());
        pruned_rows.push_back(std::move(r));
      }
      model_ms = std::move(kept_ms);
    }
    std::vector<CandidateResult> rows(configs.size());
    for (size_t i = 0; i < configs.size(); ++i) {
      rows[i].config = configs[i];
      rows[i].model_ms = model_ms[i];
    }
    auto report = [&](const char* stage, size_t done, size_t total) {
      if (options_.progress) options_.progress({stage, pass, done, total});
    };

    // Step 2: NVRTC for the arch, all candidates in parallel.
    const uint64_t nvrtc_before = nvrtc_invocations();
    const auto t_compile = Clock::now();
    auto compiled = compile_candidates(spec, pass, configs, arch, options_.threads, options_.nvrtc,
                                       [&](size_t d) { report("compile", d, configs.size()); });
    const double compile_wall = seconds_since(t_compile);
    const uint64_t nvrtc_compiles = nvrtc_invocations() - nvrtc_before;
    std::vector<std::map<std::string, KernelUsage>> usage(configs.size());
    for (size_t i = 0; i < configs.size(); ++i) {
      if (!compiled[i]) {
        rows[i].status = "compile failed: " + compiled[i].error().message.substr(0, 200);
        continue;
      }
      rows[i].compiled = true;
      rows[i].compile_seconds = compiled[i]->from_cache ? 0 : compiled[i]->compile_seconds;
      for (const KernelResources& k : compiled[i]->resources) rows[i].spill_bytes += k.spill_stores + k.spill_loads;
      if (auto src = generate(spec, configs[i], pass)) usage[i] = usage_by_role(*src, *compiled[i]);
    }
    for (size_t i = 0; i < configs.size(); ++i)
      if (!rows[i].compiled && configs[i] == reference_config)
        return Error{ErrorKind::compile_failed,
                     fmt::format("the reference config {} does not compile for {}: {}", configs[i].to_string(),
                                 arch.name(), rows[i].status)};

    // Step 3: correctness on the check backend.
    const auto t_check = Clock::now();
    if (!options_.check) {
      for (auto& r : rows) r.correct = r.compiled;
    } else if (pass == Pass::forward) {
      auto probe = ForwardProbe::create(spec, options_.check_options);
      if (!probe) return probe.error();
      auto exact = probe->reference();
      if (!exact) return exact.error();
      auto ref_out = probe->run(check_backend_, reference_config);
      if (!ref_out) return ref_out.error();
      const CheckReport ref_rep = compare_outputs(*ref_out, *exact, spec.dtype);
      if (!ref_rep.pass)
        return Error::failure(fmt::format("the reference config {} fails the check against the double reference "
                                          "(rel rms {:.2e} > {:.0e}); not tuning a wrong kernel",
                                          reference_config.to_string(), ref_rep.rel_rms, ref_rep.tolerance));
      parallel_for(
          configs.size(), options_.threads,
          [&](size_t i) {
            if (!rows[i].compiled) return;
            auto out = configs[i] == reference_config ? Result<std::vector<double>>(*ref_out)
                                                       : probe->run(check_backend_, configs[i]);
            if (!out) {
              rows[i].status = "run failed: " + out.error().message.substr(0, 200);
              return;
            }
            if (options_.perturb_output) options_.perturb_output(configs[i], *out);
            const CheckReport rep = compare_outputs(*out, *ref_out, spec.dtype);
            rows[i].rel_rms = rep.rel_rms;
            rows[i].correct = rep.pass;
            if (!rep.pass)
              rows[i].status = fmt::format("wrong output: rel rms {:.2e} vs the reference config", rep.rel_rms);
          },
          [&](size_t d) { report("check", d, configs.size()); });
    } else {
      // Backward: dq, dk, dv and parameter gradients against the double reference.
      parallel_for(
          configs.size(), options_.threads,
          [&](size_t i) {
            if (!rows[i].compiled) return;
            auto rep = check_backward(check_backend_, spec, configs[i], options_.check_options);
            if (!rep) {
              rows[i].status = "run failed: " + rep.error().message.substr(0, 200);
              return;
            }
            rows[i].correct = rep->pass;
            for (const auto& t : rep->tensors) rows[i].rel_rms = std::max(rows[i].rel_rms, t.rel_rms);
            if (!rep->pass) rows[i].status = fmt::format("wrong gradients: rel rms {:.2e}", rows[i].rel_rms);
          },
          [&](size_t d) { report("check", d, configs.size()); });
    }
    const double check_wall = seconds_since(t_check);

    // Step 4: rank at each pending shape.
    // On a GPU the forward and the backward candidates are timed (the
    // backward's whole plan: state, dq, dstate, dkv, ... as the op runs it).
    const bool measure = timer_ != nullptr && timing_backend_ != nullptr && pass != Pass::feature_map;
    for (const ProblemShape& shape : pending) {
      TuneResult res;
      res.pass = pass;
      res.shape = shape;
      res.key = tuning_key(spec, pass, shape);
      res.method = measure ? "measured" : "model-ranked";
      res.compile_wall_seconds = compile_wall;
      res.check_wall_seconds = check_wall;
      res.nvrtc_compiles = nvrtc_compiles;
      res.space_size = space.size();
      res.pruned = pruned_rows.size();
      res.candidates = rows;
      std::optional<PassBench> bench;
      if (measure) {
        auto b = PassBench::create(*timing_backend_, spec, pass, shape);
        if (!b) return b.error();
        bench = std::move(*b);
      }
      double best = std::numeric_limits<double>::infinity();
      size_t done = 0;
      for (CandidateResult& c : res.candidates) {
        report("time", ++done, res.candidates.size());
        if (!c.compiled || !c.correct) continue;
        if (measure) {
          auto runner = AttentionRunner::create(*timing_backend_, spec, c.config, pass);
          if (!runner) {
            c.correct = false;
            c.status = "load failed: " + runner.error().message.substr(0, 200);
            continue;
          }
          const int dv = spec.value_dim, d = spec.head_dim;
          auto ref = [&](const Buffer& b, int dim) {
            return TensorRef{b.as_pointer(), int64_t(shape.seq) * shape.heads * dim, int64_t(shape.heads) * dim, dim};
          };
          auto mut = [&](const Buffer& b, int dim) {
            return MutableTensorRef{b.as_pointer(), int64_t(shape.seq) * shape.heads * dim, int64_t(shape.heads) * dim,
                                    dim};
          };
          auto run = [&]() -> Status {
            if (pass == Pass::backward)
              return runner->backward(shape, ref(bench->q, d), ref(bench->k, d), ref(bench->v, dv), ref(bench->o, dv),
                                      ref(bench->dout, dv), mut(bench->dq, d), mut(bench->dk, d), mut(bench->dv, dv),
                                      bench->params.ptr(), bench->dparams.ptr());
            return runner->forward(shape, ref(bench->q, d), ref(bench->k, d), ref(bench->v, dv), mut(bench->o, dv),
                                   bench->params.ptr());
          };
          auto sample = timer_->time(c.config, run, best);
          if (!sample) return sample.error();
          c.ms = sample->median_ms;
          c.status = sample->rejected_early ? "slow (rejected early)" : "ok";
        } else {
          const size_t i = &c - res.candidates.data();
          auto est = predict_pass(spec, c.config, pass, shape, *gpu_, arch, usage[i]);
          if (!est) return est.error();
          c.ms = est->ms;
          c.status = "ok";
        }
        best = std::min(best, c.ms);
      }
      // The fastest correct candidate; ties (and rejected ones) to the earlier.
      // Model-ranked, spilling candidates only when nothing else is correct
      // (tuner.h).
      const CandidateResult* winner = nullptr;
      for (bool allow_spills : {measure, true}) {
        for (const CandidateResult& c : res.candidates)
          if (c.correct && c.status == "ok" && (allow_spills || c.spill_bytes == 0) &&
              (winner == nullptr || c.ms < winner->ms))
            winner = &c;
        if (winner != nullptr) break;
      }
      if (winner == nullptr) {
        std::string why;
        for (size_t i = 0; i < res.candidates.size() && i < 3; ++i)
          why += fmt::format("\n  {}: {}", res.candidates[i].config.to_string(), res.candidates[i].status);
        return Error::failure(fmt::format("{} of {}: no candidate compiled and passed the check{}", to_string(pass),
                                          spec_hash(spec).substr(0, 8), why));
      }
      res.chosen = winner->config;
      res.candidates.insert(res.candidates.end(), pruned_rows.begin(), pruned_rows.end());

      TuningEntry e;
      e.key = res.key;
      e.config = res.chosen.to_json();
      e.config_name = res.chosen.to_string();
      e.method = res.method;
      e.spec = to_json(spec);
      for (const CandidateResult& c : res.candidates)
        e.timings.push_back({c.config.to_json(), c.config.to_string(), c.ms, c.status});
      // Stored as soon as it is decided: a tune stopped later keeps it, and a
      // rerun serves this (pass, shape) from the database.
      if (auto st = db_.store(e); !st) return st.error();
      res.saved = db_.persistent();
      if (auto found = db_.find(res.key)) res.tuned_at = found->tuned_at;
      if (options_.on_result) options_.on_result(res);
      results.push_back(std::move(res));
    }
  }
  return results;
}

}  // namespace lunajit
