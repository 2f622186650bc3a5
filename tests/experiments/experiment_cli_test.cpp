// lunajit-experiment as a user meets it, at toy size (--quick and smaller):
// every subcommand writes its run directory with valid files; training lowers
// the loss; conversion recovers above chance; --resume after an interruption
// ends with the same figures and the same checkpoint bytes as an uninterrupted
// run (CPU, one thread: bitwise); bad settings exit 2 naming the setting.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct CliRun {
  int code = -1;
  std::string err;
};

class ExperimentCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lunajit_exp_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // Arguments are single-quoted for the shell (none of ours holds a quote).
  CliRun run(const std::vector<std::string>& args, const std::string& cache_dir = "") {
    std::string cmd = cache_dir.empty() ? "" : "LUNAJIT_CACHE_DIR='" + cache_dir + "' ";
    cmd += std::string("'") + LUNAJIT_EXPERIMENT + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    const fs::path err = dir_ / "stderr.txt";
    cmd += " > '" + (dir_ / "stdout.txt").string() + "' 2> '" + err.string() + "'";
    const int st = std::system(cmd.c_str());
    CliRun r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    r.err = read(err);
    return r;
  }
  static std::string read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  static json read_json(const fs::path& p) { return json::parse(read(p)); }
  std::string out(const std::string& name) const { return (dir_ / name).string(); }

  // The files every run directory has; metrics.jsonl: one JSON object per line.
  static void expect_run_dir(const fs::path& d) {
    for (const char* f : {"config.json", "metrics.jsonl", "results.json", "summary.md", "results.svg"})
      EXPECT_TRUE(fs::exists(d / f)) << d / f;
    EXPECT_TRUE(fs::is_directory(d / "checkpoint")) << d;
    const json c = read_json(d / "config.json");
    EXPECT_TRUE(c.contains("seed") && c.contains("data_seed") && c.contains("git_revision") && c.contains("threads_used"))
        << c.dump();
    std::ifstream m(d / "metrics.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(m, line)) {
      EXPECT_TRUE(json::parse(line).is_object()) << line;
      ++lines;
    }
    EXPECT_GT(lines, 0);
    const std::string svg = read(d / "results.svg");
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
  }
  // results.json without the wall-clock figures, which differ run to run.
  static json figures(const fs::path& d) {
    json r = read_json(d / "results.json");
    for (const char* k : {"train_seconds", "tokens_per_second", "teacher_seconds", "distill_seconds",
                          "finetune_seconds", "teacher_tokens_per_second", "finetune_tokens_per_second"})
      r.erase(k);
    return r;
  }
  fs::path dir_;
};

const std::vector<std::string> kToy = {"--quick", "--threads", "1", "--set", "train_size=256", "--set", "test_size=128",
                                       "--set", "val_size=64"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(ExperimentCli, TrainWritesTheRunDirectoryAndLowersTheLoss) {
  const CliRun r = run(with({"train", "--task", "first_token", "--attention", "luna", "--out", out("t")}, kToy));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_run_dir(out("t"));
  EXPECT_TRUE(fs::exists(fs::path(out("t")) / "checkpoint" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(out("t")) / "loss.svg"));
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << "progress bar on stderr";
  const json res = read_json(fs::path(out("t")) / "results.json");
  EXPECT_LT(res.at("final_loss").get<double>(), res.at("first_loss").get<double>());
  EXPECT_GT(res.at("tokens_per_second").get<double>(), 0);
  const json cfg = read_json(fs::path(out("t")) / "config.json");
  EXPECT_EQ(cfg.at("attention"), "luna");
  EXPECT_EQ(cfg.at("train_size"), 256);
}

TEST_F(ExperimentCli, ResumeEqualsAnUninterruptedRunBitwise) {
  const auto args = with({"train", "--task", "sort", "--attention", "hedgehog"}, kToy);
  ASSERT_EQ(run(with(args, {"--out", out("full")})).code, 0);
  const CliRun stopped = run(with(args, {"--out", out("part"), "--stop-after", "11"}));
  ASSERT_EQ(stopped.code, 3) << stopped.err;
  EXPECT_FALSE(fs::exists(fs::path(out("part")) / "results.json"));
  const CliRun resumed = run({"train", "--resume", out("part")});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(figures(out("full")), figures(out("part")));
  EXPECT_EQ(read(fs::path(out("full")) / "checkpoint" / "model.safetensors"),
            read(fs::path(out("part")) / "checkpoint" / "model.safetensors"));
  EXPECT_EQ(read(fs::path(out("full")) / "metrics.jsonl"), read(fs::path(out("part")) / "metrics.jsonl"));
}

TEST_F(ExperimentCli, ConvertRecoversAboveChanceAndResumesAcrossStages) {
  const auto args = with(with({"convert", "--task", "fmnist-vit", "--to", "luna"}, kToy), {"--set", "train_size=512"});
  ASSERT_EQ(run(with(args, {"--out", out("full")})).code, 0);
  expect_run_dir(out("full"));
  EXPECT_TRUE(fs::exists(fs::path(out("full")) / "attention_maps.svg"));
  const json res = read_json(fs::path(out("full")) / "results.json");
  for (const char* k : {"teacher_accuracy", "converted_accuracy_before_finetune", "converted_accuracy", "recovery"})
    ASSERT_TRUE(res.contains(k)) << k;
  EXPECT_DOUBLE_EQ(res["recovery"].get<double>(),
                   res["converted_accuracy"].get<double>() / res["teacher_accuracy"].get<double>());
  // 10 classes: chance is 0.1; the toy teacher trains on 512 images for 3 epochs.
  EXPECT_GT(res["teacher_accuracy"].get<double>(), 0.2);
  EXPECT_GT(res["converted_accuracy"].get<double>(), 0.2);
  // The teacher has 3 epochs of 16 steps; stop inside stage 1 (distill, 16 steps) and resume.
  ASSERT_EQ(run(with(args, {"--out", out("part"), "--stop-after", "52"})).code, 3);
  const CliRun resumed = run({"convert", "--resume", out("part")});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(figures(out("full")), figures(out("part")));
}

TEST_F(ExperimentCli, AblateAndKernelFitWriteTheirTables) {
  const CliRun a = run(with({"ablate", "--task", "counting", "--set", "grid=variants", "--set", "budget=16",
                          "--set", "epochs=1", "--out", out("ab")}, kToy));
  ASSERT_EQ(a.code, 0) << a.err;
  expect_run_dir(out("ab"));
  const json ab = read_json(fs::path(out("ab")) / "results.json");
  ASSERT_EQ(ab.at("rows").size(), 4u);
  for (const auto& row : ab["rows"]) EXPECT_TRUE(row.contains("test_accuracy")) << row.dump();
  const CliRun k = run({"kernel-fit", "--quick", "--set", "families=[\"luna\",\"slay\",\"elu\"]", "--set",
                     "kf_fit_steps=5", "--out", out("kf")});
  ASSERT_EQ(k.code, 0) << k.err;
  expect_run_dir(out("kf"));
  const json kf = read_json(fs::path(out("kf")) / "results.json");
  // luna (learned): init and fitted, against both references; slay and elu: init only.
  EXPECT_EQ(kf.at("rows").size(), 8u);
  for (const auto& row : kf["rows"]) {
    EXPECT_GE(row["rel_l2"]["mean"].get<double>(), 0);
    EXPECT_LE(row["cosine"]["mean"].get<double>(), 1 + 1e-9);
  }
}

// The first steps on the generated kernels (host emulation) give the ATen path's losses.
TEST_F(ExperimentCli, CheckKernelsRunsTheFirstStepsOnTheHostKernels) {
  const CliRun r = run(with({"train", "--task", "first_token", "--attention", "luna", "--check-kernels", "--set",
                             "check_steps=2", "--set", "epochs=1", "--out", out("ck")}, kToy));
  ASSERT_EQ(r.code, 0) << r.err;
  const json ck = read_json(fs::path(out("ck")) / "results.json").at("check_kernels");
  ASSERT_EQ(ck.at("host_kernel_losses").size(), 2u) << ck.dump();
  EXPECT_LE(ck.at("max_relative_difference").get<double>(), 1e-4);
  EXPECT_NE(r.err.find("check-kernels step 1"), std::string::npos) << r.err;
}

// "Autotune before training" on the host kernels (a cache of its own, so the
// tuning database starts empty): the model's luna spec is tuned at the
// training batch (forward, backward) and the evaluation batch (forward), the
// run trains on the tuned kernels and reports the configs; its losses follow
// the ATen run's (fp32 both, summation order differs: 1e-3 relative after 24
// AdamW steps, measured ~1e-7); a second run takes every config from the
// database and repeats the first bit for bit.
TEST_F(ExperimentCli, TrainOnHostKernelsTunesTheModelFirst) {
  const std::string cache = out("cache");
  const auto args = with(with({"train", "--task", "counting", "--attention", "luna"}, kToy),
                         {"--set", "epochs=1", "--set", "path=host_kernels", "--set", "tune_top_k=2"});
  const CliRun r = run(with(args, {"--out", out("k")}), cache);
  ASSERT_EQ(r.code, 0) << r.err;
  const json res = read_json(fs::path(out("k")) / "results.json");
  const json kc = res.at("kernel_configs");
  EXPECT_EQ(kc.at("path"), "host_kernels");
  ASSERT_EQ(kc.at("tuned").size(), 3u) << kc.dump();
  const json cfg = read_json(fs::path(out("k")) / "config.json");
  const char* passes[] = {"forward", "forward", "backward"};
  const int64_t batches[] = {cfg.at("batch").get<int64_t>(), cfg.at("eval_batch").get<int64_t>(),
                             cfg.at("batch").get<int64_t>()};
  for (size_t i = 0; i < 3; ++i) {
    const json& t = kc["tuned"][i];
    EXPECT_EQ(t.at("pass"), passes[i]) << t.dump();
    EXPECT_EQ(t.at("shape")[0].get<int64_t>(), batches[i]) << t.dump();
    EXPECT_EQ(t.at("spec").at("family"), "luna");
    EXPECT_EQ(t.at("method"), "model-ranked");
    EXPECT_FALSE(t.at("from_db").get<bool>());
    EXPECT_TRUE(t.at("saved").get<bool>());
  }
  EXPECT_NE(r.err.find("tuned and saved"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(fs::path(cache) / "tuning")) << "the tuning database lives in the cache directory";
  EXPECT_LT(res.at("final_loss").get<double>(), res.at("first_loss").get<double>());

  const auto aten_args = with(with({"train", "--task", "counting", "--attention", "luna"}, kToy), {"--set", "epochs=1"});
  ASSERT_EQ(run(with(aten_args, {"--out", out("a")})).code, 0);
  const json aten = read_json(fs::path(out("a")) / "results.json");
  EXPECT_NEAR(res["final_loss"].get<double>(), aten.at("final_loss").get<double>(),
              1e-3 * aten["final_loss"].get<double>());

  const CliRun again = run(with(args, {"--out", out("k2")}), cache);
  ASSERT_EQ(again.code, 0) << again.err;
  const json res2 = read_json(fs::path(out("k2")) / "results.json");
  for (const json& t : res2.at("kernel_configs").at("tuned")) EXPECT_TRUE(t.at("from_db").get<bool>()) << t.dump();
  EXPECT_EQ(res2.at("final_loss"), res.at("final_loss"));
  EXPECT_EQ(res2.at("test_accuracy"), res.at("test_accuracy"));
}

// --print-config resolves the settings without running anything; every
// README table's preset (experiments/tables) is accepted and resolves to its
// own values.
TEST_F(ExperimentCli, TablePresetsResolveWithPrintConfig) {
  std::vector<fs::path> presets;
  for (const auto& e : fs::directory_iterator(fs::path(LUNAJIT_SOURCE_DIR) / "experiments" / "tables"))
    if (e.path().extension() == ".json") presets.push_back(e.path());
  std::sort(presets.begin(), presets.end());
  ASSERT_GE(presets.size(), 6u) << "one preset per README results table";
  for (const fs::path& p : presets) {
    const CliRun r = run({"ablate", "--config", p.string(), "--print-config"});
    ASSERT_EQ(r.code, 0) << p << ": " << r.err;
    const json resolved = json::parse(read(dir_ / "stdout.txt"));
    const json preset = read_json(p);
    for (const auto& [k, v] : preset.items()) EXPECT_EQ(resolved.at(k), v) << p << " " << k;
    EXPECT_EQ(resolved.at("command"), "ablate") << p;
    EXPECT_FALSE(resolved.at("quick").get<bool>()) << p;
  }
  // A preset with a misspelt setting is refused like the flag would be.
  {
    std::ofstream(dir_ / "bad.json") << R"({"grid": "ml", "epoch": 3})";
    const CliRun r = run({"ablate", "--config", (dir_ / "bad.json").string(), "--print-config"});
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("\"epoch\" is not a setting"), std::string::npos) << r.err;
  }
}

TEST_F(ExperimentCli, BadSettingsExit2NamingTheSetting) {
  // Each command exits 2 with a message containing the text next to it.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"train", "--task", "sort", "--set", "lr=-1", "--out", out("x")}, "lr = -1"},
      {{"train", "--task", "sort", "--set", "lrr=0.1", "--out", out("x")}, "\"lrr\" is not a setting"},
      {{"train", "--task", "nope", "--quick", "--out", out("x")}, "task = \"nope\""},
      {{"train", "--task", "sort", "--attention", "lunaa", "--quick", "--out", out("x")}, "attention = \"lunaa\""},
      {{"convert", "--task", "sort", "--to", "softmax", "--quick", "--out", out("y")}, "to = \"softmax\""},
      {{"train", "--task", "listops", "--attention", "cosformer", "--quick", "--out", out("z")},
       "cosformer cannot mask padding"},
      {{"train", "--task", "sort", "--quick", "--set", "path=gpu", "--out", out("x")},
       "path = \"gpu\": must be aten, host_kernels or cuda_kernels"},
      {{"convert", "--task", "sort", "--quick", "--set", "path=host_kernels", "--out", out("y")},
       "convert runs on the ATen path only"},
      {{"train", "--resume", out("none")}, "no config.json"},
  };
  for (const auto& [args, message] : bad) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args[0] << " expecting: " << message;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(fs::path(out("z")) / "config.json")) << "rejected before the run directory is made";
}

}  // namespace
