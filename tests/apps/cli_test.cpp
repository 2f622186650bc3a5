// The lunajit CLI as a user meets it: each command run as a subprocess of the
// built binary, asserting its exit code (0 ok, 2 bad usage or bad spec,
// 1 failure), the message on stderr and the JSON on stdout.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <gtest/gtest.h>

#include "io/safetensors.h"
#include <nlohmann/json.hpp>

#include <array>
#include <string>
#include <vector>

extern char** environ;

namespace {

using nlohmann::json;

struct CliResult {
  int exit_code = -1;  // the process's exit status; 128 + signal when killed
  std::string out;
  std::string err;
};

// Runs LUNAJIT_CLI with `args` (no shell: arguments travel verbatim), reading
// stdout and stderr through two pipes drained together so neither can fill up.
CliResult run_cli(const std::vector<std::string>& args) {
  CliResult r;
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) {
    ADD_FAILURE() << "pipe failed";
    return r;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) posix_spawn_file_actions_addclose(&actions, fd);

  std::vector<std::string> argv_s{LUNAJIT_CLI};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, LUNAJIT_CLI, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (spawned != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    ADD_FAILURE() << "posix_spawn(" << LUNAJIT_CLI << ") failed: " << spawned;
    return r;
  }

  std::array<pollfd, 2> fds{pollfd{out_pipe[0], POLLIN, 0}, pollfd{err_pipe[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks{&r.out, &r.err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// What a failed expectation prints: the whole exchange.
std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout:\n" + r.out + "\n--- stderr:\n" + r.err;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// Whether this machine has a CUDA driver with at least one device, asked of
// libcuda directly (the same dlopen the CUDA backend does), so the test does
// not trust the binary under test to say so.
bool cuda_gpu_present() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  const bool present = init != nullptr && count != nullptr && init(0) == 0 && count(&n) == 0 && n > 0;
  ::dlclose(lib);
  return present;
}

TEST(Cli, SpecPrintsTheFamilysDefaultAsJson) {
  const CliResult r = run_cli({"spec", "--family", "luna", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << describe(r);
  EXPECT_EQ(j.value("family", ""), "luna") << describe(r);
  EXPECT_TRUE(j.contains("luna")) << describe(r);
}

TEST(Cli, EmitIsDeterministicWithASpecHeader) {
  const CliResult first = run_cli({"emit"});
  const CliResult second = run_cli({"emit"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_FALSE(first.out.empty());
  EXPECT_EQ(first.out, second.out) << "emit must give byte-identical source";
  EXPECT_TRUE(contains(first.out, "// spec:")) << first.out;
  // The default spec is bf16: its forward runs on tensor cores by default.
  EXPECT_TRUE(contains(first.out, "#include \"lunajit/linear_attention_mma.cuh\"")) << first.out;
}

TEST(Cli, OutOfRangeFieldExits2NamingFieldAndValue) {
  const CliResult r = run_cli({"emit", R"({"family":"luna","luna":{"projections":0}})"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "luna.projections = 0")) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
}

TEST(Cli, UnknownSpecFieldExits2NamingIt) {
  const CliResult r = run_cli({"emit", R"({"family":"luna","colour":1})"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "colour")) << describe(r);
}

TEST(Cli, UnknownFamilyExits2) {
  const CliResult r = run_cli({"emit", R"({"family":"lunar"})"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "lunar")) << describe(r);

  const CliResult spec = run_cli({"spec", "--family", "lunar"});
  EXPECT_EQ(spec.exit_code, 2) << describe(spec);
  EXPECT_TRUE(contains(spec.err, "lunar")) << describe(spec);
}

TEST(Cli, UnknownArchExits2) {
  const CliResult r = run_cli({"compile", "--arch", "sm_42"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "sm_42")) << describe(r);
}

TEST(Cli, CompileJsonReportsRegistersOfEveryKernel) {
  const CliResult r = run_cli({"compile", R"({"family":"elu"})", "--arch", "sm_80", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << describe(r);
  ASSERT_TRUE(j.contains("kernels") && j["kernels"].is_array()) << describe(r);
  // feature_map pass (1 kernel) + non-causal forward (state, output).
  ASSERT_GE(j["kernels"].size(), 3u) << describe(r);
  for (const json& k : j["kernels"]) {
    EXPECT_EQ(k.value("arch", ""), "sm_80") << k.dump();
    EXPECT_GT(k.value("registers", 0), 0) << k.dump();
  }
}

TEST(Cli, RunCheckOnHostPasses) {
  const CliResult r = run_cli({"run", R"({"family":"elu","dtype":"fp32"})", "--backend", "host", "--batch", "1",
                               "--heads", "2", "--seq", "33", "--check", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << describe(r);
  ASSERT_TRUE(j.contains("pass") && j.contains("rel_rms_error")) << describe(r);
  EXPECT_TRUE(j["pass"].get<bool>()) << describe(r);
  EXPECT_LT(j["rel_rms_error"].get<double>(), 1e-5) << describe(r);  // fp32 I/O, fp32 accumulation
}

TEST(Cli, RunSanitizedOnHostSaysWhichChecksRan) {
  const CliResult r = run_cli({"run", R"({"family":"elu","dtype":"fp32","causal":true})", "--backend", "host", "--batch",
                               "1", "--heads", "1", "--seq", "20", "--check", "--sanitize",
                               "race,init,bounds,sync,schedule=random:3"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.err, "sanitizers: init,bounds,sync,race; schedule random:3: clean (")) << describe(r);

  const CliResult bad = run_cli({"run", "--backend", "host", "--sanitize", "init,racecheck"});
  EXPECT_EQ(bad.exit_code, 2) << describe(bad);
  EXPECT_TRUE(contains(bad.err, "unknown check 'racecheck'")) << describe(bad);
  const CliResult cuda = run_cli({"run", "--backend", "cuda", "--sanitize", "race"});
  EXPECT_EQ(cuda.exit_code, 2) << describe(cuda);
  EXPECT_TRUE(contains(cuda.err, "not cuda")) << describe(cuda);
}

TEST(Cli, RunOnCudaWithoutGpuExits1WithHint) {
  if (cuda_gpu_present()) GTEST_SKIP() << "a CUDA GPU is present: --backend cuda would run";
  const CliResult r = run_cli({"run", "--backend", "cuda"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "no CUDA driver/GPU found; use --backend host")) << describe(r);
}

TEST(Cli, UnknownFlagExits2) {
  const CliResult r = run_cli({"emit", "--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--no-such-flag")) << describe(r);

  const CliResult none = run_cli({});
  EXPECT_EQ(none.exit_code, 2) << describe(none);  // a subcommand is required
}

TEST(Cli, MissingSpecFileExits2) {
  const std::string path = "/nonexistent-lunajit-dir/spec.json";
  const CliResult r = run_cli({"emit", path});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, path)) << describe(r);
}

// ---- issue 15 regressions, each named after its finding.
TEST(Cli, IntegersBeyond32BitsExit2NotWrapped) {
  CliResult r = run_cli({"emit", R"({"family":"luna","head_dim":4294967360})"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "head_dim = 4294967360: must be in [1, 256]")) << describe(r);
  r = run_cli({"emit", "--config", R"({"block_tokens": 4294967312})"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "config.block_tokens = 4294967312")) << describe(r);
  r = run_cli({"tune", "--shapes", "1,1,99999999999"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "seq = 99999999999: must be in [1, 2147483647]")) << describe(r);
}

TEST(Cli, TuneTopKIsANonNegativeCount) {
  for (const char* bad : {"-1", "many"}) {
    const CliResult r = run_cli({"tune", "--top-k", bad});
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, "--top-k")) << describe(r);
  }
}

TEST(Cli, FloatsBeyondFloatRangeExit2) {
  for (const char* spec : {R"({"family":"luna","eps":1e39})", R"({"family":"luna","eps":1e-320})",
                           R"({"family":"luna","eps":1e308})", R"({"family":"performer","performer":{"kernel_eps":1e39}})"}) {
    const CliResult r = run_cli({"emit", spec});
    EXPECT_EQ(r.exit_code, 2) << spec << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, "must be a finite number in")) << describe(r);
  }
}

TEST(Cli, NoTileConfigFitsExits2SayingWhatTheSmallestNeeds) {
  const std::string spec = R"({"family":"performer","head_dim":256,"value_dim":256,"performer":{"features":2048}})";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"emit", spec, "--arch", "sm_75"}, {"compile", spec, "--arch", "sm_75"},
        {"run", spec, "--arch", "sm_75", "--backend", "host", "--backward", "--check", "--seq", "4"}}) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, "no tile config fits sm_75")) << describe(r);
    EXPECT_TRUE(contains(r.err, "sm_75 allows 65536")) << describe(r);
  }
}

TEST(Cli, NumberOptionsNameTheOptionAndRange) {
  for (const char* v : {"0", "abc", "99999999999"}) {
    const CliResult r = run_cli({"run", "--seq", v});
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_TRUE(contains(r.err, "--seq")) << describe(r);
    EXPECT_TRUE(contains(r.err, "[1, 2147483647]")) << describe(r);
    EXPECT_FALSE(contains(r.err, "1797693134862315")) << describe(r);
  }
  const CliResult seed = run_cli({"run", "--seed", "-1"});
  EXPECT_EQ(seed.exit_code, 2) << describe(seed);
}

TEST(Cli, HugeShapesFailBeforeAllocating) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"run", "--backend", "host", "--seq", "2000000000"},
                                              {"run", "--backend", "host", "--batch", "65535", "--heads", "65535"}}) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_TRUE(contains(r.err, "GiB of host memory")) << describe(r);
  }
}

TEST(Cli, InlineJsonOfTheWrongTypeIsNotAFile) {
  const CliResult r = run_cli({"emit", "[1,2]"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "expected a JSON object, got array")) << describe(r);
  EXPECT_FALSE(contains(r.err, "cannot be opened")) << describe(r);
}

TEST(Cli, DevZeroAsSpecFileIsRefusedAtOnce) {
  const CliResult r = run_cli({"emit", "/dev/zero"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "not a regular file")) << describe(r);
}

TEST(Cli, JsonIsAcceptedBeforeOrAfterEveryCommand) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--json", "spec"}, {"spec", "--json"}, {"--json", "cache", "stats"},
        {"cache", "stats", "--json"}, {"--json", "emit"}}) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_FALSE(json::parse(r.out, nullptr, false).is_discarded()) << describe(r);
  }
  // report and demo take it too (their --help exits 0 without work).
  for (const char* cmd : {"report", "demo"}) {
    const CliResult r = run_cli({cmd, "--json", "--help"});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
  }
}

TEST(Cli, VersionAndDefaultsInHelp) {
  const CliResult v = run_cli({"--version"});
  EXPECT_EQ(v.exit_code, 0) << describe(v);
  EXPECT_TRUE(contains(v.out, "lunajit 0.")) << describe(v);
  const CliResult h = run_cli({"run", "--help"});
  EXPECT_EQ(h.exit_code, 0) << describe(h);
  EXPECT_TRUE(contains(h.out, "256")) << describe(h);  // --seq's default
}

TEST(Cli, DidYouMeanForCommandsAndOptions) {
  CliResult r = run_cli({"tun"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "did you mean 'tune'")) << describe(r);
  r = run_cli({"run", "--seqlen", "5"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "did you mean --seq")) << describe(r);
}

TEST(Cli, TinyGradientsPassWithinTheRoundingFloor) {
  // One key: o = v whatever phi is, so the exact feature-map gradients are
  // eps-sized differences of O(1) terms; a purely relative measure failed them.
  const CliResult r = run_cli({"run", R"({"family":"luna","dtype":"fp32","causal":true})", "--backend", "host",
                               "--batch", "1", "--heads", "1", "--seq", "1", "--backward", "--check"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "within the fp32 rounding floor")) << describe(r);
}

// docs/MATH.md §3a: a NaN in v at causal row j reaches rows i >= j only, never
// hangs, and `run --inputs` counts what went in and came out.
TEST(Cli, NonFiniteInputsPropagateCausallyAndAreCounted) {
  namespace fs = std::filesystem;
  using lunajit::Safetensors, lunajit::StTensor, lunajit::read_safetensors, lunajit::write_safetensors;
  const fs::path dir = fs::temp_directory_path() / ("lunajit-cli-nan-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const int64_t B = 1, N = 24, H = 1, d = 8, j = 10;
  std::vector<float> q(B * N * H * d), k(q.size()), v(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = 0.1f * float((i * 7) % 13) - 0.6f;
    k[i] = 0.1f * float((i * 5) % 11) - 0.5f;
    v[i] = 0.1f * float((i * 3) % 17) - 0.8f;
  }
  v[j * d + 3] = std::numeric_limits<float>::quiet_NaN();
  Safetensors in;
  for (auto& [name, data] : {std::pair<const char*, std::vector<float>*>{"q", &q}, {"k", &k}, {"v", &v}})
    in.tensors.push_back(StTensor::from_floats(name, {B, N, H, d}, *data));
  ASSERT_TRUE(write_safetensors(dir / "in.safetensors", in).ok());
  const CliResult r = run_cli({"run", R"({"family":"elu","dtype":"fp32","causal":true,"head_dim":8})", "--backend",
                               "host", "--inputs", (dir / "in.safetensors").string(), "--save",
                               (dir / "out.safetensors").string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);  // non-finite in, non-finite out: the documented propagation
  const json j_out = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j_out.is_discarded()) << describe(r);
  EXPECT_EQ(j_out["nonfinite_inputs"].get<int64_t>(), 1) << describe(r);
  auto out = read_safetensors(dir / "out.safetensors");
  ASSERT_TRUE(out.ok()) << out.error().message;
  const std::vector<float> o = out->find("o")->to_floats();
  for (int64_t i = 0; i < N; ++i) {
    bool finite = true;
    for (int64_t c = 0; c < d; ++c) finite &= std::isfinite(o[i * d + c]);
    EXPECT_EQ(finite, i < j) << "row " << i;
  }
  EXPECT_EQ(j_out["nonfinite_outputs"]["o"].get<int64_t>(), N - j) << describe(r);  // channel 3 of rows >= j
  fs::remove_all(dir);
}

}  // namespace
