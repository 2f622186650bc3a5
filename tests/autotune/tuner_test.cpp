// The autotuner: effective knobs and the search space, NVRTC cache-key
// ingredients, selection with an injected timer (the fastest correct
// candidate wins, a wrong-but-fast one is rejected), the database serving a
// second tune with zero compiles, run-time lookup, and four processes tuning
// the same spec at once.
//
// Most tests tune the relu family (no parameters, small kernels: fast to
// compile on 2 cores) with a few candidates; the default LUNA spec's whole
// space is the sweep in tuner_sweep_test.cpp.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <map>
#include <set>

#include "codegen/cost_model.h"
#include "autotune/tuner.h"
#include "cache/binary_cache.h"
#include "codegen/generator.h"
#include "runtime/host/host_backend.h"
#include "runtime/host/host_jit.h"

namespace lunajit {
namespace {
namespace fs = std::filesystem;

const Arch& sm90() {
  static const Arch a = arch_from_sm(90).value_or_throw();
  return a;
}

AttentionSpec relu_spec(bool causal = false) {
  AttentionSpec s = default_spec(Family::relu);
  s.head_dim = s.value_dim = 16;
  s.dtype = DType::fp32;
  s.causal = causal;
  return s;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "lunajit-tuner-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Returns the configured time of each config; records what it was asked.
class FakeTimer final : public Timer {
 public:
  explicit FakeTimer(std::map<std::string, double> ms) : ms_(std::move(ms)) {}
  Result<TimingSample> time(const TileConfig& c, const std::function<Status()>&, double best) override {
    timed.push_back(c.to_string());
    auto it = ms_.find(c.to_string());
    const double t = it != ms_.end() ? it->second : 10.0;
    return TimingSample{t, 5, t > 1.75 * best};
  }
  std::vector<std::string> timed;

 private:
  std::map<std::string, double> ms_;
};

Backend& host() {
  static std::unique_ptr<Backend> b = make_host_backend();
  return *b;
}

// ---------------------------------------------------------------- search space
TEST(EffectiveKnobs, PerPassAndCausality) {
  AttentionSpec s = default_spec(Family::luna);
  // bf16: the tensor-core state/output kernels are a variant (TileConfig::mma).
  EXPECT_EQ(effective_knobs(s, Pass::forward).to_string(), "block_tokens, warps, dv_block, state_splits, mma");
  AttentionSpec f32 = s;
  f32.dtype = DType::fp32;
  EXPECT_EQ(effective_knobs(f32, Pass::forward).to_string(), "block_tokens, warps, dv_block, state_splits");
  // The non-causal bf16 (and fp16) backward has tensor-core kernels too; fp32 does not.
  EXPECT_EQ(effective_knobs(s, Pass::backward).to_string(),
            "block_tokens, warps, dv_block, state_splits, phi_backward, mma");
  EXPECT_EQ(effective_knobs(f32, Pass::backward).to_string(),
            "block_tokens, warps, dv_block, state_splits, phi_backward");
  AttentionSpec f16 = s;  // fp16: the tensor-core backward too (bf16 operands)
  f16.dtype = DType::fp16;
  EXPECT_EQ(effective_knobs(f16, Pass::backward).to_string(),
            "block_tokens, warps, dv_block, state_splits, phi_backward, mma");
  s.causal = true;
  // state_splits: the super-chunk split of the tensor-core walk (mma configs only).
  EXPECT_EQ(effective_knobs(s, Pass::forward).to_string(), "warps, dv_block, chunk, state_splits, mma");
  EXPECT_TRUE(effective_knobs(s, Pass::forward).reads_state_splits(TileConfig(64, 4, 64, 64, 2).with_mma(true)));
  EXPECT_FALSE(effective_knobs(s, Pass::forward).reads_state_splits(TileConfig(64, 4, 64, 64, 2)));
  // The causal backward on tensor cores walks state_splits super-chunk ranges;
  // the scalar scans walk the whole sequence.
  EXPECT_EQ(effective_knobs(s, Pass::backward).to_string(), "warps, dv_block, chunk, state_splits, phi_backward, mma");
  EXPECT_TRUE(effective_knobs(s, Pass::backward).reads_state_splits(TileConfig(64, 4, 64, 16, 2).with_mma(true)));
  EXPECT_FALSE(effective_knobs(s, Pass::backward).reads_state_splits(TileConfig(64, 4, 64, 16, 2)));
  AttentionSpec p = default_spec(Family::performer);
  p.causal = true;  // key_stab tiles by block_tokens
  EXPECT_EQ(effective_knobs(p, Pass::forward).to_string(), "block_tokens, warps, dv_block, chunk");
  EXPECT_EQ(effective_knobs(s, Pass::feature_map).to_string(), "block_tokens, warps");
}

TEST(SearchSpace, DeduplicatedValidAndHoldsTheDefault) {
  for (bool causal : {false, true})
    for (Pass pass : {Pass::forward, Pass::backward}) {
      AttentionSpec s = default_spec(Family::luna);
      s.causal = causal;
      const auto space = search_space(s, pass, sm90());
      const auto all = all_valid_configs(s, sm90(), pass);
      const EffectiveKnobs k = effective_knobs(s, pass);
      std::set<std::string> sigs, all_sigs;
      for (const auto& c : space) {
        EXPECT_TRUE(can_implement(s, c, sm90(), pass).ok()) << c.to_string();
        EXPECT_TRUE(sigs.insert(knob_signature(c, k)).second) << "duplicate " << c.to_string();
      }
      for (const auto& c : all) all_sigs.insert(knob_signature(c, k));
      EXPECT_EQ(sigs, all_sigs) << "every distinct kernel is a candidate";
      EXPECT_NE(std::find(space.begin(), space.end(), default_config(s, sm90(), pass)), space.end());
      std::printf("luna %s %s: %zu valid configs, %zu candidates\n", causal ? "causal" : "non-causal",
                  std::string(to_string(pass)).c_str(), all.size(), space.size());
    }
}

TEST(SearchSpace, SampleKeepsEndsAndDefault) {
  const AttentionSpec s = default_spec(Family::luna);
  const auto space = search_space(s, Pass::forward, sm90());
  const TileConfig def = default_config(s, sm90());
  const auto sample = sample_space(space, 4, def);
  EXPECT_EQ(sample.front(), space.front());
  EXPECT_NE(std::find(sample.begin(), sample.end(), space.back()), sample.end());
  EXPECT_NE(std::find(sample.begin(), sample.end(), def), sample.end());
  EXPECT_LE(sample.size(), 5u);
}

// ---------------------------------------------------------------- cache keys
TEST(NvrtcCacheKey, ChangesWithEveryIngredientAndOnlyThen) {
  TempDir dir;
  BinaryCache cache(dir.path());
  const AttentionSpec s = relu_spec();
  const TileConfig c = default_config(s, sm90());
  auto key = [&](const AttentionSpec& spec, const TileConfig& cfg, const Arch& arch, NvrtcOptions o) {
    o.cache = &cache;
    auto src = generate(spec, cfg, Pass::forward);
    EXPECT_TRUE(src.ok());
    auto k = compile_nvrtc(*src, arch, o);
    EXPECT_TRUE(k.ok()) << k.error().message;
    return k->cache_key;
  };
  const std::string base = key(s, c, sm90(), {});
  // Same ingredients: same key, served from the cache.
  EXPECT_EQ(key(s, c, sm90(), {}), base);
  NvrtcOptions other_cache;  // where the cache lives is not an ingredient
  BinaryCache second(dir.path() / "second");
  other_cache.cache = &second;
  auto src = generate(s, c, Pass::forward);
  EXPECT_EQ(compile_nvrtc(*src, sm90(), other_cache)->cache_key, base);
  // Each ingredient alone changes it: source (via the config or the spec),
  // arch, options, PTX kept or not.
  std::set<std::string> keys{base};
  AttentionSpec eps = s;
  eps.eps = 1e-5;
  EXPECT_TRUE(keys.insert(key(eps, c, sm90(), {})).second) << "spec";
  EXPECT_TRUE(keys.insert(key(s, TileConfig(c.block_tokens(), c.warps() == 4 ? 2 : 4, c.dv_block(), c.chunk(),
                                            c.state_splits()),
                              sm90(), {}))
                  .second)
      << "config";
  EXPECT_TRUE(keys.insert(key(s, c, arch_from_sm(80).value_or_throw(), {})).second) << "arch";
  NvrtcOptions extra;
  extra.extra = {"-DLUNAJIT_UNUSED=1"};
  EXPECT_TRUE(keys.insert(key(s, c, sm90(), extra)).second) << "options";
  NvrtcOptions ptx;
  ptx.emit_ptx = true;
  EXPECT_TRUE(keys.insert(key(s, c, sm90(), ptx)).second) << "ptx";
  NvrtcOptions line;
  line.line_info = true;
  EXPECT_TRUE(keys.insert(key(s, c, sm90(), line)).second) << "-lineinfo";
  // The compiler's and lunajit's versions are in the key by construction
  // (nvrtc_build_identity(), LUNAJIT_VERSION); a process cannot change them.
  EXPECT_FALSE(nvrtc_build_identity().empty());
}

// ---------------------------------------------------------------- selection
struct Tuned {
  std::vector<TuneResult> results;
  std::vector<std::string> timed;
};

Tuned tune_relu(TuningDb& db, std::map<std::string, double> ms, size_t candidates,
                std::function<void(const TileConfig&, std::vector<double>&)> perturb = {}) {
  TuneOptions opt;
  opt.arch = sm90();
  opt.shapes = {{2, 4, 512}};
  opt.passes = {Pass::forward};
  opt.max_candidates = candidates;
  opt.check_options.shape = {1, 2, 40};
  opt.perturb_output = std::move(perturb);
  FakeTimer timer(std::move(ms));
  Tuner tuner(db, host(), opt, &timer, &host());
  auto r = tuner.tune(relu_spec());
  EXPECT_TRUE(r.ok()) << r.error().message;
  return {r.ok() ? *r : std::vector<TuneResult>{}, timer.timed};
}

TEST(TunerSelection, FastestCorrectWinsAndWrongButFastIsRejected) {
  TempDir dir;
  TuningDb db(dir.path(), model_fingerprint(sm90()));
  TuneOptions probe_opt;
  probe_opt.arch = sm90();
  probe_opt.max_candidates = 4;
  const auto cands = Tuner(db, host(), probe_opt).candidates(relu_spec(), Pass::forward);
  ASSERT_GE(cands.size(), 4u);
  const std::string fastest = cands[2].to_string(), second = cands[3].to_string();
  std::map<std::string, double> ms{{cands[0].to_string(), 1.0}, {cands[1].to_string(), 0.9},
                                   {fastest, 0.2}, {second, 0.3}};

  // 1. All correct: the fastest wins, method "measured", the table is stored.
  auto t1 = tune_relu(db, ms, 4);
  ASSERT_EQ(t1.results.size(), 1u);
  EXPECT_EQ(t1.results[0].chosen.to_string(), fastest);
  EXPECT_EQ(t1.results[0].method, "measured");
  auto entry = db.find(t1.results[0].key);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->config_name, fastest);
  EXPECT_EQ(entry->timings.size(), cands.size());

  // 2. The fastest is made wrong: it is never timed and cannot win.
  TempDir dir2;
  TuningDb db2(dir2.path(), model_fingerprint(sm90()));
  auto t2 = tune_relu(db2, ms, 4, [&](const TileConfig& c, std::vector<double>& out) {
    if (c.to_string() == fastest) out[out.size() / 2] += 10.0;
  });
  ASSERT_EQ(t2.results.size(), 1u);
  EXPECT_EQ(t2.results[0].chosen.to_string(), second);
  EXPECT_EQ(std::count(t2.timed.begin(), t2.timed.end(), fastest), 0);
  for (const auto& c : t2.results[0].candidates)
    if (c.config.to_string() == fastest) {
      EXPECT_FALSE(c.correct);
      EXPECT_NE(c.status.find("wrong output"), std::string::npos) << c.status;
    }
}

// On a GPU the backward's candidates are timed too, each through the
// backward's whole launch plan (AttentionRunner::backward on the timing
// backend's zero-filled tensors): here the host backend runs that plan once
// per timed candidate (the timer calls `run`), and the fake times decide.
TEST(TunerSelection, BackwardCandidatesAreTimedThroughTheirPlan) {
  class RunningTimer final : public Timer {
   public:
    explicit RunningTimer(std::string fastest) : fastest_(std::move(fastest)) {}
    Result<TimingSample> time(const TileConfig& c, const std::function<Status()>& run, double) override {
      if (auto st = run(); !st) return st.error();
      timed.push_back(c.to_string());
      const double t = c.to_string() == fastest_ ? 0.5 : 2.0;
      return TimingSample{t, 1, false};
    }
    std::vector<std::string> timed;

   private:
    std::string fastest_;
  };
  TempDir dir;
  TuningDb db(dir.path(), model_fingerprint(sm90()));
  TuneOptions opt;
  opt.arch = sm90();
  opt.shapes = {{1, 2, 40}};
  opt.passes = {Pass::backward};
  opt.max_candidates = 3;
  opt.check_options.shape = {1, 2, 40};
  const AttentionSpec spec = relu_spec();
  const auto cands = Tuner(db, host(), opt).candidates(spec, Pass::backward);
  ASSERT_GE(cands.size(), 2u);
  const std::string fastest = cands.back().to_string();
  RunningTimer timer(fastest);
  auto r = Tuner(db, host(), opt, &timer, &host()).tune(spec);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].pass, Pass::backward);
  EXPECT_EQ((*r)[0].method, "measured");
  EXPECT_EQ((*r)[0].chosen.to_string(), fastest);
  EXPECT_EQ(timer.timed.size(), cands.size());  // every candidate ran its backward plan
}

// Quick tune: the cost model ranks the candidates first and only its best
// top_k per shape, and the default config, are compiled, checked and timed;
// the rest are listed as pruned and cannot win; exhaustive takes them all.
TEST(TunerSelection, QuickTuneCompilesOnlyTheModelsTopK) {
  TempDir dir;
  TuningDb db(dir.path(), model_fingerprint(sm90()));
  TuneOptions opt;
  opt.arch = sm90();
  opt.shapes = {{2, 4, 512}};
  opt.passes = {Pass::forward};
  opt.max_candidates = 4;
  opt.top_k = 2;
  opt.check_options.shape = {1, 2, 40};
  opt.retune = true;
  const AttentionSpec spec = relu_spec();
  const auto space = Tuner(db, host(), opt).candidates(spec, Pass::forward);
  ASSERT_GE(space.size(), 4u);
  // The model's order at the shape (64 registers assumed, as in the tuner).
  std::vector<std::pair<double, size_t>> ranked;
  for (size_t i = 0; i < space.size(); ++i)
    ranked.push_back({predict_pass(spec, space[i], Pass::forward, opt.shapes[0], *representative_gpu(90), sm90())
                          .value_or_throw()
                          .ms,
                      i});
  std::stable_sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::set<std::string> best{space[ranked[0].second].to_string(), space[ranked[1].second].to_string()};
  const TileConfig fallback = default_config(spec, sm90(), Pass::forward);
  for (const TileConfig& c : space)
    if (c == fallback) best.insert(c.to_string());  // always timed, whatever its rank

  auto r = Tuner(db, host(), opt).tune(spec);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 1u);
  const TuneResult& t = (*r)[0];
  EXPECT_EQ(t.space_size, space.size());
  EXPECT_EQ(t.pruned, space.size() - best.size());
  EXPECT_EQ(t.candidates.size(), space.size());  // the pruned are listed too
  std::set<std::string> tried;
  for (const CandidateResult& c : t.candidates) {
    if (c.status.rfind("pruned (model rank ", 0) == 0) {
      EXPECT_FALSE(c.compiled) << c.config.to_string();
      EXPECT_GT(c.model_ms, 0);
    } else {
      EXPECT_TRUE(c.compiled && c.correct) << c.config.to_string() << ": " << c.status;
      tried.insert(c.config.to_string());
    }
  }
  EXPECT_EQ(tried, best);
  EXPECT_TRUE(best.count(t.chosen.to_string())) << t.chosen.to_string();

  // Exhaustive: every candidate is compiled and checked.
  opt.exhaustive = true;
  auto all = Tuner(db, host(), opt).tune(spec);
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ((*all)[0].pruned, 0u);
  for (const CandidateResult& c : (*all)[0].candidates) EXPECT_TRUE(c.compiled) << c.status;
}

// Model-ranked, a candidate whose kernels spill loses to every correct one
// that does not (tuner.h): the non-causal backward of LUNA with the envelope,
// softplus outputs and a gelu MLP on sm_80 at the shape where the model's
// favourites include T16.w4 tiles, whose state kernel ptxas (NVRTC 13) holds
// at 128 registers with 4 B spilled. (It was the default spec's T16.w8 state
// kernel on sm_90 until the backward's feature map moved onto tensor cores and
// stopped spilling.) The check is off (correctness: the sweep); what matters
// here is the ranking.
TEST(TunerSelection, ModelRankedPrefersCandidatesThatDoNotSpill) {
  TempDir dir;
  const Arch sm80 = arch_from_sm(80).value_or_throw();
  TuningDb db(dir.path(), model_fingerprint(sm80));
  TuneOptions opt;
  opt.arch = sm80;
  opt.shapes = {{8, 12, 16384}};
  opt.passes = {Pass::backward};
  opt.top_k = 6;
  opt.check = false;
  opt.retune = true;
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = false;
  spec.luna.envelope = true;
  spec.luna.output_activation = OutputActivation::softplus;
  spec.luna.activation = Activation::gelu;
  auto r = Tuner(db, host(), opt).tune(spec);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 1u);
  const TuneResult& t = (*r)[0];
  EXPECT_EQ(t.method, "model-ranked");
  const CandidateResult* chosen = nullptr;
  const CandidateResult* fastest_spilling = nullptr;
  double best_clean = std::numeric_limits<double>::infinity();
  for (const CandidateResult& c : t.candidates) {
    if (!c.compiled) continue;
    std::printf("%-36s %8.3f ms spills %3d B\n", c.config.to_string().c_str(), c.ms, c.spill_bytes);
    if (c.config == t.chosen) chosen = &c;
    if (c.spill_bytes > 0 && (fastest_spilling == nullptr || c.ms < fastest_spilling->ms)) fastest_spilling = &c;
    if (c.spill_bytes == 0) best_clean = std::min(best_clean, c.ms);
  }
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(chosen->spill_bytes, 0) << t.chosen.to_string();
  EXPECT_EQ(chosen->ms, best_clean);
  // Spilling candidates were among those compiled, so the rule had something to
  // pass over. (Since the backward's feature map moved onto tensor cores no
  // probed spec and shape, on sm_80 or sm_90, has a spilling candidate the model
  // predicts faster than the best clean one, so this no longer shows the rule
  // deciding a tune; here the spillers are predicted slower, 7.8 against 7.2 ms.)
  ASSERT_NE(fastest_spilling, nullptr) << "no top-6 candidate spills any more (ptxas changed?)";
}

TEST(TunerSelection, SecondTuneIsServedFromTheDatabaseWithZeroCompiles) {
  TempDir dir;
  TuningDb db(dir.path(), model_fingerprint(sm90()));
  TuneOptions opt;
  opt.arch = sm90();
  opt.shapes = {{2, 4, 512}, {1, 8, 3000}};
  opt.passes = {Pass::forward};
  opt.max_candidates = 3;
  opt.check_options.shape = {1, 2, 40};
  auto first = Tuner(db, host(), opt).tune(relu_spec());
  ASSERT_TRUE(first.ok()) << first.error().message;
  for (const auto& r : *first) {
    EXPECT_FALSE(r.from_db);
    EXPECT_EQ(r.method, "model-ranked");
  }
  // A new process would open the file afresh.
  TuningDb again(dir.path(), model_fingerprint(sm90()));
  const uint64_t nvrtc = nvrtc_invocations(), host_compiles = host::host_jit_counters().compiles,
                 host_hits = host::host_jit_counters().cache_hits;
  auto second = Tuner(again, host(), opt).tune(relu_spec());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(nvrtc_invocations(), nvrtc);
  EXPECT_EQ(host::host_jit_counters().compiles, host_compiles);
  EXPECT_EQ(host::host_jit_counters().cache_hits, host_hits) << "nothing even loaded";
  ASSERT_EQ(second->size(), first->size());
  for (size_t i = 0; i < first->size(); ++i) {
    EXPECT_TRUE((*second)[i].from_db);
    EXPECT_EQ((*second)[i].chosen, (*first)[i].chosen);
  }
}

// Issue 15: a stopped tune had saved nothing, and the terminal counter could
// go backwards (3/5 then 2/5) because the count was taken outside the lock.
TEST(TunerProgress, TuneSavesEachShapeAsItCompletesAndResumesWhereItLeftOff) {
  TempDir dir;
  TuningDb db(dir.path(), model_fingerprint(sm90()));
  TuneOptions opt;
  opt.arch = sm90();
  opt.shapes = {{2, 4, 512}, {1, 8, 3000}};
  opt.passes = {Pass::forward};
  opt.max_candidates = 4;
  opt.threads = 4;
  opt.check_options.shape = {1, 2, 40};
  std::map<std::string, size_t> last;  // stage -> last count reported
  int backwards = 0;
  opt.progress = [&](const TuneProgress& p) {
    size_t& l = last[p.stage];
    if (p.done < l && l != p.total) ++backwards;
    l = p.done;
  };
  std::vector<size_t> on_disk_when_reported;
  opt.on_result = [&](const TuneResult& r) {
    // What a process started now (or after this one is killed) would read.
    on_disk_when_reported.push_back(TuningDb(dir.path(), model_fingerprint(sm90())).entries().size());
    EXPECT_TRUE(r.saved);
    EXPECT_FALSE(r.tuned_at.empty());
  };
  auto first = Tuner(db, host(), opt).tune(relu_spec());
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(backwards, 0);
  EXPECT_EQ(on_disk_when_reported, (std::vector<size_t>{1, 2})) << "each shape is stored as soon as it is decided";

  // As if the tune had been stopped after the first shape: the second shape's
  // entry is gone. A rerun with a third shape serves the first from the
  // database (saying so through on_result) and tunes only the rest.
  TuningDb stopped(dir.path(), model_fingerprint(sm90()));
  {
    std::vector<TuningEntry> keep;
    for (const auto& e : stopped.entries())
      if (e.key == (*first)[0].key) keep.push_back(e);
    ASSERT_EQ(keep.size(), 1u);
    ASSERT_EQ(clear_tuning(dir.path()).removed, 1);
    TuningDb fresh(dir.path(), model_fingerprint(sm90()));
    ASSERT_TRUE(fresh.store(keep).ok());
  }
  TuningDb resumed(dir.path(), model_fingerprint(sm90()));
  opt.shapes = {{2, 4, 512}, {1, 8, 3000}, {1, 1, 100000}};
  std::vector<bool> from_db;
  opt.on_result = [&](const TuneResult& r) { from_db.push_back(r.from_db); };
  auto second = Tuner(resumed, host(), opt).tune(relu_spec());
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_EQ(from_db, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(TuningDb(dir.path(), model_fingerprint(sm90())).entries().size(), 3u);
}

TEST(ChooseConfig, ExactNearestDefaultAndWarmPathTime) {
  TempDir dir;
  TuningDb db(dir.path(), model_fingerprint(sm90()));
  const AttentionSpec s = relu_spec();
  const TileConfig tuned(16, 2, 16, 64, 2);
  ASSERT_TRUE(can_implement(s, tuned, sm90()).ok());
  TuningEntry e;
  e.key = tuning_key(s, Pass::forward, {2, 4, 1000});
  e.config = tuned.to_json();
  e.config_name = tuned.to_string();
  e.method = "measured";
  ASSERT_TRUE(db.store(e).ok());
  EXPECT_EQ(choose_config(db, s, Pass::forward, {2, 4, 900}, sm90()).from, LookupKind::exact);
  const ConfigChoice near = choose_config(db, s, Pass::forward, {2, 4, 8000}, sm90());
  EXPECT_EQ(near.from, LookupKind::nearest);
  EXPECT_EQ(near.config, tuned);
  const ConfigChoice none = choose_config(db, s, Pass::backward, {2, 4, 900}, sm90());
  EXPECT_EQ(none.from, LookupKind::none);
  EXPECT_EQ(none.config, default_config(s, sm90(), Pass::backward));

  // Warm path, spec to ready kernel: open the database, look up, generate,
  // and take the compiled kernel from the binary cache.
  BinaryCache cache(dir.path());
  NvrtcOptions o;
  o.cache = &cache;
  ASSERT_TRUE(compile_nvrtc(generate(s, tuned, Pass::forward).value(), sm90(), o).ok());  // cold
  const uint64_t before = nvrtc_invocations();
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kReps = 20;
  for (int i = 0; i < kReps; ++i) {
    TuningDb fresh(dir.path(), model_fingerprint(sm90()));
    const ConfigChoice c = choose_config(fresh, s, Pass::forward, {2, 4, 1000}, sm90());
    auto k = compile_nvrtc(generate(s, c.config, Pass::forward).value(), sm90(), o);
    ASSERT_TRUE(k.ok() && k->from_cache);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kReps;
  EXPECT_EQ(nvrtc_invocations(), before);
  std::printf("warm path spec -> database lookup -> source -> cached CUBIN: %.3f ms\n", ms);
  EXPECT_LT(ms, 50.0) << "target is < 5 ms; the bound leaves room for loaded CI machines";
}

TEST(CostModel, PrefersOnePhiPerTokenWhenComputeBound) {
  const AttentionSpec s = default_spec(Family::luna);
  const GpuSpec* h100 = representative_gpu(90);
  ASSERT_NE(h100, nullptr);
  const ProblemShape big{4, 8, 4096};
  auto one = predict_pass(s, TileConfig(64, 4, 64, 64, 4), Pass::forward, big, *h100, sm90());
  auto eight = predict_pass(s, TileConfig(64, 4, 8, 64, 4), Pass::forward, big, *h100, sm90());
  ASSERT_TRUE(one.ok() && eight.ok());
  EXPECT_LT(one->ms, eight->ms) << "dv_block 8 recomputes phi 8 times";
  EXPECT_GT(one->ms, 0.0);
}

// ---------------------------------------------------------------- processes
// Four processes compile (into one fresh binary cache) and tune the same spec
// at once: one database file, parseable, holding the entries, no temp or
// damaged file, and every process chose the same config (ranks agree).
TEST(TunerProcesses, FourProcessesLeaveOneConsistentDatabase) {
  TempDir dir;
  const AttentionSpec s = relu_spec(true);
  constexpr int kProcs = 4;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child compiles with NVRTC and ranks by the cost model; the host
      // check (LLVM's JIT) is left to the parent's tests, since its thread
      // pools do not survive fork().
      BinaryCache cache(dir.path());
      TuningDb db(dir.path(), model_fingerprint(sm90()));
      TuneOptions opt;
      opt.arch = sm90();
      opt.shapes = {{1, 4, 256}, {2, 8, 2048}};
      opt.passes = {Pass::forward};
      opt.max_candidates = 3;
      opt.threads = 1;
      opt.check = false;
      opt.retune = true;
      opt.nvrtc.cache = &cache;
      std::unique_ptr<Backend> unused = nullptr;
      auto r = Tuner(db, host(), opt).tune(s);
      if (!r.ok()) ::_exit(1);
      // Report the choice through the exit code's low bits is too small;
      // the parent compares the file instead.
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  TuningDb db(dir.path(), model_fingerprint(sm90()));
  ASSERT_EQ(db.entries().size(), 2u);
  for (const auto& e : db.entries()) {
    EXPECT_EQ(e.method, "model-ranked");
    EXPECT_EQ(e.timings.size(), 4u) << "3 sampled + the default";
  }
  for (const auto& f : fs::directory_iterator(dir.path() / "tuning")) {
    const std::string name = f.path().filename().string();
    EXPECT_TRUE(name == ".lock" || f.path() == db.file()) << name;
  }
  // The same tuning in this process picks what the file holds: deterministic.
  TempDir mine;
  TuningDb db2(mine.path(), model_fingerprint(sm90()));
  TuneOptions opt;
  opt.arch = sm90();
  opt.shapes = {{1, 4, 256}, {2, 8, 2048}};
  opt.passes = {Pass::forward};
  opt.max_candidates = 3;
  opt.check = false;
  auto r = Tuner(db2, host(), opt).tune(s);
  ASSERT_TRUE(r.ok());
  for (const auto& res : *r) EXPECT_EQ(db.find(res.key)->config_name, res.chosen.to_string());
  // The binary cache holds each candidate once and nothing damaged.
  BinaryCache cache(dir.path());
  EXPECT_EQ(cache.keys().size(), 4u);
  for (const auto& k : cache.keys()) EXPECT_TRUE(cache.get(k).has_value());
  EXPECT_EQ(cache.counters().corrupt, 0u);
}

}  // namespace
}  // namespace lunajit
