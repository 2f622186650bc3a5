// `lunajit cache` and `lunajit tune` as a user meets them (issue 15): each
// command run as a subprocess of the built binary with its own
// LUNAJIT_CACHE_DIR, asserting the exit code, the message and what is on disk.
// Some run the binary as the unprivileged user nobody (tests run as root) or
// under a file size limit, set up in the forked child before exec.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uid_t kNobody = 65534;

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

struct RunOptions {
  fs::path cache_dir;
  std::vector<std::string> env;       // extra NAME=VALUE
  uid_t uid = 0;                      // 0: as the caller
  long max_file_bytes = -1;           // RLIMIT_FSIZE in the child, SIGXFSZ ignored
};

// fork + exec of LUNAJIT_CLI with `args`, stdout and stderr drained together.
CliResult run_cli(const std::vector<std::string>& args, const RunOptions& o) {
  CliResult r;
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) {
    ADD_FAILURE() << "pipe failed";
    return r;
  }
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("LUNAJIT_CACHE_DIR=", 0) == 0 || kv.rfind("LUNAJIT_CACHE_MAX_MB=", 0) == 0) continue;
    env_s.push_back(kv);
  }
  env_s.push_back("LUNAJIT_CACHE_DIR=" + o.cache_dir.string());
  for (const auto& kv : o.env) env_s.push_back(kv);
  std::vector<char*> envp;
  for (auto& kv : env_s) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_s{LUNAJIT_CLI};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    if (o.max_file_bytes >= 0) {
      ::signal(SIGXFSZ, SIG_IGN);  // ignored stays ignored across exec: write() fails with EFBIG
      struct rlimit rl {static_cast<rlim_t>(o.max_file_bytes), static_cast<rlim_t>(o.max_file_bytes)};
      ::setrlimit(RLIMIT_FSIZE, &rl);
    }
    if (o.uid != 0 && (::setgroups(0, nullptr) != 0 || ::setgid(o.uid) != 0 || ::setuid(o.uid) != 0)) {
      std::fprintf(stderr, "cache_cli_test: cannot become uid %u: %s\n", unsigned(o.uid), std::strerror(errno));
      ::_exit(127);
    }
    ::execve(LUNAJIT_CLI, argv.data(), envp.data());
    std::fprintf(stderr, "cache_cli_test: exec %s as uid %u: %s\n", LUNAJIT_CLI, unsigned(::getuid()),
                 std::strerror(errno));
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
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

std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout:\n" + r.out + "\n--- stderr:\n" + r.err;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

// A fresh directory per test (0755 so that nobody can reach what is handed to it).
class CacheCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lunajit-cache-cli-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    ::chmod(root_.c_str(), 0755);
    opt_.cache_dir = root_ / "cache";
  }
  void TearDown() override {
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(root_, ec)) ::chmod(e.path().c_str(), 0700);
    fs::remove_all(root_, ec);
  }
  CliResult cli(const std::vector<std::string>& args) { return run_cli(args, opt_); }
  fs::path tuning_dir() const { return opt_.cache_dir / "tuning"; }
  // A small valid tuning export with `n` entries (one database).
  static json export_doc(int n) {
    json entries = json::array();
    for (int i = 0; i < n; ++i) {
      const int64_t seq = int64_t{1} << (4 + i % 20), bh = int64_t{1} << (i / 20);
      entries.push_back({{"spec_hash", "0123456789abcdef0123456789abcdef"},
                         {"pass", "forward"},
                         {"seq_bucket", seq},
                         {"bh_bucket", bh},
                         {"dtype", "bf16"},
                         {"config", {{"block_tokens", 64}}},
                         {"config_name", "T64"},
                         {"method", "model-ranked"},
                         {"timings", json::array()},
                         {"spec", {{"family", "luna"}}},
                         {"tuned_at", "2026-01-01T00:00:00Z"}});
    }
    const json device = {{"name", "model of NVIDIA H100"}, {"sm", 90}, {"sm_count", 132},
                         {"memory_bytes", 1}, {"driver", "none"}, {"nvrtc", "x"}, {"lunajit", "0"}};
    return {{"lunajit_tuning_export", 1}, {"databases", json::array({{{"device", device}, {"entries", entries}}})}};
  }
  fs::path root_;
  RunOptions opt_;
};

TEST_F(CacheCli, ExportToDevFullFailsWithTheErrnoReason) {
  spit(root_ / "in.json", export_doc(3).dump());
  ASSERT_EQ(cli({"cache", "import", (root_ / "in.json").string()}).exit_code, 0);
  const CliResult r = cli({"cache", "export", "/dev/full"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "cache export: cannot write /dev/full: No space left on device")) << describe(r);
  EXPECT_FALSE(contains(r.out, "exported")) << describe(r);
}

TEST_F(CacheCli, ExportFailureKeepsThePreviousExport) {
  spit(root_ / "in.json", export_doc(40).dump());
  ASSERT_EQ(cli({"cache", "import", (root_ / "in.json").string()}).exit_code, 0);
  const fs::path out = root_ / "export.json";
  spit(out, "previous export");
  // Writes past 512 bytes fail (EFBIG) in the child: the export is far larger.
  RunOptions limited = opt_;
  limited.max_file_bytes = 512;
  const CliResult r = run_cli({"cache", "export", out.string()}, limited);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "File too large")) << describe(r);
  EXPECT_EQ(slurp(out), "previous export");
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_FALSE(contains(e.path().filename().string(), ".tmp-")) << "temp file left: " << e.path();
  // Without the limit it is replaced whole.
  const CliResult ok = cli({"cache", "export", out.string()});
  ASSERT_EQ(ok.exit_code, 0) << describe(ok);
  EXPECT_EQ(json::parse(slurp(out))["databases"][0]["entries"].size(), 40u);
}

TEST_F(CacheCli, ImportOfMalformedExportsExits2WithAMessage) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"lunajit_tuning_export":"1"})", "\"lunajit_tuning_export\" is \"1\""},
      {R"({"lunajit_tuning_export":1,"databases":5})", "\"databases\" is 5, not an array"},
      {R"([5])", "not an object"},
      {R"({"lunajit_tuning_export":1,"databases":[5]})", "databases[0] is 5"},
      {R"({"lunajit_tuning_export":1)", "is not valid JSON"},
  };
  for (const auto& [text, expected] : cases) {
    spit(root_ / "bad.json", text);
    const CliResult r = cli({"cache", "import", (root_ / "bad.json").string()});
    EXPECT_EQ(r.exit_code, 2) << text << describe(r);
    EXPECT_TRUE(contains(r.err, expected)) << text << describe(r);
    EXPECT_FALSE(contains(r.err, "internal error")) << describe(r);
  }
}

TEST_F(CacheCli, ImportOfDevZeroFailsFastWithAMessage) {
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = cli({"cache", "import", "/dev/zero"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "'/dev/zero': more than the limit of 268435456 bytes")) << describe(r);
}

TEST_F(CacheCli, ImportOfGoodThenBadDatabaseIsAllOrNothing) {
  json doc = export_doc(2);
  json bad = doc["databases"][0];
  bad["device"]["name"] = "other";
  bad["entries"][1]["spec"] = {{"family", 7}};
  doc["databases"].push_back(bad);
  spit(root_ / "mixed.json", doc.dump());
  const CliResult r = cli({"cache", "import", (root_ / "mixed.json").string()});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "databases[1].entries[1]: tuning entry: spec.family is 7")) << describe(r);
  const CliResult stats = cli({"cache", "stats", "--json"});
  ASSERT_EQ(stats.exit_code, 0) << describe(stats);
  EXPECT_EQ(json::parse(stats.out)["tuning"]["entries"], 0) << describe(stats);
}

TEST_F(CacheCli, DamagedTuningDatabaseIsReportedMovedAsideAndNeverBlocks) {
  spit(root_ / "in.json", export_doc(2).dump());
  ASSERT_EQ(cli({"cache", "import", (root_ / "in.json").string()}).exit_code, 0);
  for (const std::string bad : {R"({"schema": "1", "entries": []})", R"({"schema": null, "entries": []})",
                                R"({"schema": 1, "entries": [{"spec": {"family": 7}}]})"}) {
    spit(tuning_dir() / "damaged.json", bad);
    const CliResult ls = cli({"cache", "ls"});
    EXPECT_EQ(ls.exit_code, 0) << bad << describe(ls);
    EXPECT_TRUE(contains(ls.err, "damaged tuning database " + (tuning_dir() / "damaged.json").string())) << describe(ls);
    EXPECT_TRUE(contains(ls.err, "moved to " + (tuning_dir() / "damaged.json.corrupt-").string())) << describe(ls);
    EXPECT_TRUE(contains(ls.out, "T64")) << "the valid database is still listed\n" << describe(ls);
    EXPECT_FALSE(fs::exists(tuning_dir() / "damaged.json"));
    spit(tuning_dir() / "damaged.json", bad);
    const CliResult stats = cli({"cache", "stats"});
    EXPECT_EQ(stats.exit_code, 0) << describe(stats);
    EXPECT_TRUE(contains(stats.out, "damaged: " + (tuning_dir() / "damaged.json").string())) << describe(stats);
    EXPECT_TRUE(contains(stats.out, "2 entries in 1 device database(s)")) << describe(stats);
    spit(tuning_dir() / "damaged.json", bad);
    const CliResult exp = cli({"cache", "export", (root_ / "out.json").string()});
    EXPECT_EQ(exp.exit_code, 0) << describe(exp);
    EXPECT_TRUE(contains(exp.out, "1 damaged database(s) left out")) << describe(exp);
  }
}

TEST_F(CacheCli, CacheMaxMbOverflowNegativeNonNumericExit2NamingTheRange) {
  for (const std::string v : {"17592186044416", "-1", "99999999999999999999", "lots"}) {
    RunOptions o = opt_;
    o.env = {"LUNAJIT_CACHE_MAX_MB=" + v};
    for (const std::vector<std::string> args :
         {std::vector<std::string>{"cache", "stats"}, {"run", "--backend", "host", "--seq", "16"}}) {
      const CliResult r = run_cli(args, o);
      EXPECT_EQ(r.exit_code, 2) << v << describe(r);
      EXPECT_TRUE(contains(r.err, "LUNAJIT_CACHE_MAX_MB=")) << describe(r);
      EXPECT_TRUE(contains(r.err, v.substr(0, 8))) << describe(r);
      EXPECT_TRUE(contains(r.err, "from 1 to 17592186044415")) << describe(r);
    }
  }
}

TEST_F(CacheCli, InsecureCacheDirectoryIsRefusedWithExit1) {
  ASSERT_EQ(cli({"cache", "stats"}).exit_code, 0);  // creates it, 0700
  ASSERT_EQ(::chmod(opt_.cache_dir.c_str(), 0777), 0);
  CliResult r = cli({"cache", "stats"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "is writable by others (mode 0777)")) << describe(r);
  r = cli({"run", "--backend", "host", "--seq", "16"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "chmod go-w")) << describe(r);
  ASSERT_EQ(::chmod(opt_.cache_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(opt_.cache_dir.c_str(), kNobody, kNobody), 0);
  r = cli({"tune", "--backend", "host", "--max-candidates", "1"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "is owned by nobody (uid 65534), not by you")) << describe(r);
}

// The first directory on the way to `path` that others cannot search (o+x),
// or empty: whether a process of another user (nobody) can exec the CLI.
std::string unreachable_by_others(const fs::path& path) {
  for (fs::path p = fs::absolute(path).parent_path(); !p.empty(); p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) return p.string();
    if (p == p.root_path()) break;
  }
  return "";
}

TEST_F(CacheCli, ReadOnlyCacheAsNonRootUserIsReadCountedAndClearSaysWhatFailed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to hand the cache to nobody";
  // A build tree under a 0700 directory (mktemp -d) cannot be run by nobody:
  // the test would only see exec fail.
  if (const std::string dir = unreachable_by_others(LUNAJIT_CLI); !dir.empty())
    GTEST_SKIP() << "nobody cannot reach the CLI " << LUNAJIT_CLI << ": " << dir
                 << " is not searchable by others (chmod o+x it, or build in a checkout others can read)";
  const CliResult warm = cli({"run", "--backend", "host", "--batch", "1", "--heads", "1", "--seq", "16"});
  ASSERT_EQ(warm.exit_code, 0) << describe(warm);
  spit(root_ / "in.json", export_doc(2).dump());
  ASSERT_EQ(cli({"cache", "import", (root_ / "in.json").string()}).exit_code, 0);
  const CliResult before = cli({"cache", "stats", "--json"});
  const uint64_t entries = json::parse(before.out)["binaries"]["entries"].get<uint64_t>();
  ASSERT_GE(entries, 1u) << describe(before);
  for (const auto& e : fs::recursive_directory_iterator(opt_.cache_dir)) {
    ASSERT_EQ(::lchown(e.path().c_str(), kNobody, kNobody), 0);
    ::chmod(e.path().c_str(), e.is_directory() ? 0500 : 0400);
  }
  ASSERT_EQ(::chown(opt_.cache_dir.c_str(), kNobody, kNobody), 0);
  ASSERT_EQ(::chmod(opt_.cache_dir.c_str(), 0500), 0);
  RunOptions nobody = opt_;
  nobody.uid = kNobody;
  const CliResult stats = run_cli({"cache", "stats", "--json"}, nobody);
  ASSERT_EQ(stats.exit_code, 0) << describe(stats);
  const json j = json::parse(stats.out);
  EXPECT_EQ(j["binaries"]["entries"].get<uint64_t>(), entries) << describe(stats);
  EXPECT_EQ(j["writable"], false);
  EXPECT_EQ(j["tuning"]["entries"], 2);
  // The entries are read: the run compiles nothing, so it warns of nothing.
  const CliResult run = run_cli({"run", "--backend", "host", "--batch", "1", "--heads", "1", "--seq", "16"}, nobody);
  EXPECT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_FALSE(contains(run.err, "read-only")) << "a hit needs no write\n" << describe(run);
  EXPECT_FALSE(contains(run.err, "rejected")) << describe(run);
  const CliResult clear = run_cli({"cache", "clear"}, nobody);
  EXPECT_EQ(clear.exit_code, 1) << describe(clear);
  EXPECT_TRUE(contains(clear.err, "could not remove " + std::to_string(entries) + " compiled kernel entr"))
      << describe(clear);
  EXPECT_TRUE(contains(clear.err, "(Permission denied)")) << describe(clear);
}

TEST_F(CacheCli, TuneMaxCandidatesMinusOneIsRejected) {
  const CliResult r = cli({"tune", "--backend", "host", "--max-candidates", "-1"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--max-candidates")) << describe(r);
  EXPECT_FALSE(fs::exists(tuning_dir())) << "nothing tuned";
}

// One tune as a user whose stderr is a log (a pipe here): progress lines with
// an ETA, each shape saved as it completes; a rerun skips what is done and
// says so; a database that cannot be written is not reported as saved.
TEST_F(CacheCli, TuneLogsProgressSavesEachShapeResumesAndNeverClaimsAnUnsavedDatabase) {
  const std::vector<std::string> tune = {"tune",   "--backend",          "host", "--pass", "forward",
                                         "--max-candidates", "1", "--shapes", "1,1,64;1,2,64"};
  const CliResult first = cli(tune);
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  EXPECT_TRUE(contains(first.err, "lunajit tune: compile forward 1/")) << describe(first);
  EXPECT_TRUE(contains(first.err, "ETA ") || contains(first.err, "done in")) << describe(first);
  EXPECT_TRUE(contains(first.err, "lunajit tune: forward 1x1x64 -> ")) << describe(first);
  EXPECT_TRUE(contains(first.err, "saved")) << describe(first);
  EXPECT_TRUE(contains(first.out, "; database " + tuning_dir().string())) << describe(first);

  // As if stopped after the first shape: keep only its entry.
  fs::path db;
  for (const auto& e : fs::directory_iterator(tuning_dir()))
    if (e.path().extension() == ".json") db = e.path();
  ASSERT_FALSE(db.empty());
  json doc = json::parse(slurp(db));
  ASSERT_EQ(doc["entries"].size(), 2u);
  json kept = json::array();
  for (const auto& e : doc["entries"])
    if (e["bh_bucket"] == 1) kept.push_back(e);
  ASSERT_EQ(kept.size(), 1u);
  doc["entries"] = kept;
  spit(db, doc.dump());
  const CliResult resumed = cli(tune);
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_TRUE(contains(resumed.err, "forward 1x1x64 already tuned (model-ranked")) << describe(resumed);
  EXPECT_TRUE(contains(resumed.err, "skipped; --retune tunes it again")) << describe(resumed);
  EXPECT_TRUE(contains(resumed.err, "lunajit tune: forward 1x2x64 -> ")) << describe(resumed);
  EXPECT_EQ(json::parse(slurp(db))["entries"].size(), 2u);

  // The tuning directory replaced by a file: nothing can be written there.
  fs::rename(tuning_dir(), root_ / "tuning.saved");
  spit(tuning_dir(), "not a directory");
  const CliResult unsaved = cli({"tune", "--backend", "host", "--pass", "forward", "--max-candidates", "1",
                                 "--shapes", "1,1,64"});
  EXPECT_EQ(unsaved.exit_code, 1) << describe(unsaved);
  EXPECT_TRUE(contains(unsaved.err, "the tuning results were NOT saved: cannot write " + tuning_dir().string()))
      << describe(unsaved);
  EXPECT_FALSE(contains(unsaved.out, "; database ")) << describe(unsaved);
  EXPECT_TRUE(contains(unsaved.out, "NOT saved")) << describe(unsaved);
}

}  // namespace
