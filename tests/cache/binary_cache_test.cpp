// BinaryCache: counters, recovery from damaged entries, the memory-only
// fallback, and concurrent writers from several processes.
#include "cache/binary_cache.h"
#include "cache/file_lock.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grp.h>
#include <pwd.h>
#include <signal.h>

#include <chrono>
#include <functional>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace lunajit {
namespace {
namespace fs = std::filesystem;

const std::string kKey = "0123456789abcdef0123456789abcdef";
// magic, schema, key length, payload size, checksum, then the 32-character key.
constexpr std::size_t kHeaderBytes = 40 + 32;

// A fresh directory per test, removed afterwards.
class CacheDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lunajit-cache-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    ::chmod(root_.c_str(), 0755);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  static std::string payload(std::size_t n, char seed = 'a') {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 31 % 251);
    return s;
  }
  fs::path root_;
};

// 32 hex digits ending in the number i.
std::string fmt_key(int i) {
  std::string k = std::to_string(i);
  return std::string(32 - k.size(), 'a') + k;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST_F(CacheDir, MissThenHitCounted) {
  BinaryCache cache(root_);
  EXPECT_TRUE(cache.persistent());
  EXPECT_FALSE(cache.get(kKey).has_value());
  const std::string data = payload(1000);
  cache.put(kKey, data);
  auto got = cache.get(kKey);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, data);
  const CacheCounters c = cache.counters();
  EXPECT_EQ(c.misses, 1u);
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.writes, 1u);
  EXPECT_EQ(c.corrupt, 0u);
  cache.reset_counters();
  EXPECT_EQ(cache.counters().hits, 0u);
}

TEST_F(CacheDir, EntryLayoutOnDisk) {
  BinaryCache cache(root_);
  const std::string data = payload(77);
  cache.put(kKey, data);
  const fs::path p = root_ / "bin" / "01" / (kKey + ".bin");
  EXPECT_EQ(cache.entry_path(kKey), p);
  ASSERT_TRUE(fs::exists(p));
  const std::string raw = read_file(p);
  ASSERT_EQ(raw.size(), kHeaderBytes + data.size());
  EXPECT_EQ(raw.substr(0, 8), "LUNAJITB");
  EXPECT_EQ(static_cast<unsigned char>(raw[8]), kBinaryCacheSchema);
  EXPECT_EQ(static_cast<unsigned char>(raw[12]), kKey.size());
  EXPECT_EQ(static_cast<unsigned char>(raw[16]), 77);
  EXPECT_EQ(raw.substr(40, kKey.size()), kKey);
  EXPECT_EQ(raw.substr(kHeaderBytes), data);
  // No temp files left behind.
  for (const auto& e : fs::recursive_directory_iterator(root_ / "bin"))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(CacheDir, SecondInstanceSeesEntries) {
  const std::string data = payload(4096);
  BinaryCache(root_).put(kKey, data);
  BinaryCache other(root_);
  auto got = other.get(kKey);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, data);
  EXPECT_EQ(other.keys(), std::vector<std::string>{kKey});
  EXPECT_EQ(other.usage().entries, 1u);
  EXPECT_EQ(other.usage().bytes, kHeaderBytes + data.size());
  EXPECT_TRUE(other.remove(kKey));
  EXPECT_FALSE(other.get(kKey).has_value());
}

TEST_F(CacheDir, TruncatedEntryIsMissRemovedAndRecovered) {
  BinaryCache cache(root_);
  const std::string data = payload(5000);
  cache.put(kKey, data);
  const fs::path p = cache.entry_path(kKey);
  fs::resize_file(p, kHeaderBytes + data.size() / 2);

  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.get(kKey).has_value());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("lunajit: warning: cache entry " + p.string() + " corrupted (truncated"), std::string::npos)
      << err;
  EXPECT_NE(err.find("recompiling"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(p));
  EXPECT_EQ(cache.counters().corrupt, 1u);
  EXPECT_EQ(cache.counters().misses, 1u);

  cache.put(kKey, data);
  auto got = cache.get(kKey);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, data);
}

TEST_F(CacheDir, TruncatedInsideHeader) {
  BinaryCache cache(root_);
  cache.put(kKey, payload(100));
  fs::resize_file(cache.entry_path(kKey), 10);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.get(kKey).has_value());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("truncated header"), std::string::npos);
  EXPECT_EQ(cache.counters().corrupt, 1u);
}

TEST_F(CacheDir, BitFlipIsDetected) {
  BinaryCache cache(root_);
  const std::string data = payload(3000);
  for (std::size_t offset : {kHeaderBytes + 1234, std::size_t{3}, std::size_t{25}}) {
    cache.put(kKey, data);
    const fs::path p = cache.entry_path(kKey);
    std::string raw = read_file(p);
    raw[offset] ^= 0x10;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << raw;

    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(cache.get(kKey).has_value()) << "offset " << offset;
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("corrupted ("), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(p));
  }
  EXPECT_EQ(cache.counters().corrupt, 3u);
  cache.put(kKey, data);
  EXPECT_EQ(cache.get(kKey).value_or(""), data);
}

TEST_F(CacheDir, CorruptEntryIsReplacedByPut) {
  BinaryCache cache(root_);
  const fs::path p = cache.entry_path(kKey);
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << "garbage that is not an entry at all, but long enough";
  cache.put(kKey, "fresh");
  EXPECT_EQ(cache.get(kKey).value_or(""), "fresh");
  EXPECT_EQ(cache.counters().corrupt, 0u);
}

// The fallback when the directory cannot be made: a path below a regular file
// fails mkdir for every user, root included (chmod does not stop root).
TEST_F(CacheDir, UncreatableDirectoryFallsBackToMemory) {
  const fs::path blocker = root_ / "a_regular_file";
  std::ofstream(blocker) << "x";
  const fs::path dir = blocker / "cache";

  ::testing::internal::CaptureStderr();
  BinaryCache cache(dir);
  cache.put(kKey, "one");
  cache.put("fedcba9876543210", "two");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(cache.persistent());
  const auto first = err.find("lunajit: warning: cache directory");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("lunajit: warning", first + 1), std::string::npos) << "warned twice: " << err;

  EXPECT_EQ(cache.get(kKey).value_or(""), "one");
  EXPECT_EQ(cache.get("fedcba9876543210").value_or(""), "two");
  EXPECT_FALSE(cache.get("00000000").has_value());
  EXPECT_EQ(cache.counters().hits, 2u);
  EXPECT_EQ(cache.counters().misses, 1u);
  EXPECT_EQ(cache.counters().writes, 2u);
  EXPECT_EQ(cache.usage().entries, 2u);
  EXPECT_FALSE(fs::exists(dir));
}

// A directory without write permission. Root is not stopped by mode bits, so
// there the read-only case is made with /proc, where mkdir fails for root too.
TEST_F(CacheDir, ReadOnlyDirectoryFallsBackToMemory) {
  fs::path dir;
  if (::geteuid() == 0) {
    dir = "/proc/self/lunajit-cache";  // procfs refuses new directories
  } else {
    dir = root_ / "ro";
    fs::create_directories(dir);
    ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  }
  ::testing::internal::CaptureStderr();
  BinaryCache cache(dir);
  cache.put(kKey, "payload");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(cache.persistent()) << dir;
  EXPECT_NE(err.find("is not writable"), std::string::npos) << err;
  EXPECT_EQ(cache.get(kKey).value_or(""), "payload");
  EXPECT_FALSE(fs::exists(dir / "bin"));
}

TEST_F(CacheDir, UnsafeKeysAreHashedIntoFileNames) {
  BinaryCache cache(root_);
  const std::string key = "../../etc/passwd";
  cache.put(key, "data");
  EXPECT_EQ(cache.get(key).value_or(""), "data");
  const fs::path p = cache.entry_path(key);
  EXPECT_EQ(p.parent_path().parent_path(), root_ / "bin");
  EXPECT_TRUE(fs::exists(p));
}

TEST_F(CacheDir, ClearRemovesEverything) {
  BinaryCache cache(root_);
  cache.put("aa11", "1");
  cache.put("bb22", "2");
  std::ofstream(root_ / "bin" / "aa" / "aa33.bin.tmp-1-2-3") << "left over";
  const ClearResult cleared = cache.clear();
  EXPECT_EQ(cleared.removed, 2u);
  EXPECT_EQ(cleared.failed, 0u);
  EXPECT_TRUE(cache.keys().empty());
  EXPECT_FALSE(fs::exists(root_ / "bin" / "aa" / "aa33.bin.tmp-1-2-3"));
}

TEST_F(CacheDir, ConcurrentThreadsReadAndWrite) {
  BinaryCache cache(root_);
  const std::string data = payload(100000, 'q');
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        if (auto got = cache.get(kKey); got && *got != data) ++bad;
        cache.put(kKey, data);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(cache.counters().corrupt, 0u);
  EXPECT_EQ(cache.get(kKey).value_or(""), data);
}

// Four processes write the same keys (and read them back) at once; every read
// sees either nothing or the complete payload, and a valid entry remains.
TEST_F(CacheDir, ConcurrentWritersFromFourProcesses) {
  const std::string data = payload(1 << 20, 'p');
  const std::vector<std::string> keys = {"aaaa0001", "aaaa0002", "bbbb0003"};
  std::vector<pid_t> children;
  for (int p = 0; p < 4; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int status = 0;
      {
        BinaryCache cache(root_);
        for (int i = 0; i < 20; ++i) {
          for (const auto& k : keys) {
            if (auto got = cache.get(k); got && *got != data + k) status = 1;
            cache.put(k, data + k);
          }
        }
        if (cache.counters().corrupt != 0) status = 2;
        if (!cache.persistent()) status = 3;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = -1;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child saw a torn or corrupt entry";
  }
  BinaryCache cache(root_);
  for (const auto& k : keys) EXPECT_EQ(cache.get(k).value_or(""), data + k) << k;
  EXPECT_EQ(cache.counters().corrupt, 0u);
  EXPECT_EQ(cache.keys().size(), keys.size());  // and no temp files counted as keys
  for (const auto& e : fs::recursive_directory_iterator(root_ / "bin"))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// Sets the entry's mtime to `seconds` after the epoch: the LRU order the tests
// want, independent of the file system's timestamp resolution.
void set_mtime(const fs::path& p, long seconds) {
  struct timespec t[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), t, 0), 0) << p;
}

TEST_F(CacheDir, EvictionKeepsTheBound) {
  BinaryCache cache(root_);
  const std::size_t entry_bytes = kHeaderBytes + 1000;
  cache.set_max_bytes(5 * entry_bytes);  // room for five entries
  for (int i = 0; i < 12; ++i) {
    cache.put(fmt_key(i), payload(1000, char('a' + i)));
    if (fs::exists(cache.entry_path(fmt_key(i)))) set_mtime(cache.entry_path(fmt_key(i)), 1000 + i);
    EXPECT_LE(cache.usage().bytes, cache.max_bytes()) << "after put " << i;
  }
  EXPECT_EQ(cache.usage().entries, 5u);
  EXPECT_EQ(cache.counters().evictions, 7u);
  // The most recent puts survive.
  for (int i = 7; i < 12; ++i) EXPECT_TRUE(cache.get(fmt_key(i)).has_value()) << i;
}

TEST_F(CacheDir, EvictionIsLeastRecentlyUsed) {
  BinaryCache cache(root_);
  const std::size_t entry_bytes = kHeaderBytes + 100;
  cache.set_max_bytes(3 * entry_bytes);
  for (int i = 0; i < 3; ++i) {
    cache.put(fmt_key(i), payload(100));
    set_mtime(cache.entry_path(fmt_key(i)), 1000 + i);  // 0 oldest, 2 newest
  }
  // A hit makes entry 0 the most recently used, so entry 1 goes first.
  ASSERT_TRUE(cache.get(fmt_key(0)).has_value());
  struct stat st {};
  ASSERT_EQ(::stat(cache.entry_path(fmt_key(0)).c_str(), &st), 0);
  EXPECT_GT(st.st_mtim.tv_sec, 1002) << "a hit touches the entry";
  cache.put(fmt_key(3), payload(100));
  EXPECT_FALSE(fs::exists(cache.entry_path(fmt_key(1))));
  EXPECT_TRUE(fs::exists(cache.entry_path(fmt_key(0))));
  EXPECT_TRUE(fs::exists(cache.entry_path(fmt_key(2))));
  EXPECT_TRUE(fs::exists(cache.entry_path(fmt_key(3))));
  EXPECT_EQ(cache.counters().evictions, 1u);
}

TEST_F(CacheDir, EntryLargerThanTheBoundIsKeptAlone) {
  BinaryCache cache(root_);
  cache.set_max_bytes(500);
  cache.put(fmt_key(0), payload(100));
  cache.put(fmt_key(1), payload(2000));  // the new entry is never its own victim
  EXPECT_TRUE(cache.get(fmt_key(1)).has_value());
  EXPECT_FALSE(cache.get(fmt_key(0)).has_value());
}

TEST(BinaryCacheMaxBytes, FromEnvironment) {
  const char* old = std::getenv("LUNAJIT_CACHE_MAX_MB");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  ::unsetenv("LUNAJIT_CACHE_MAX_MB");
  EXPECT_EQ(BinaryCache::default_max_bytes(), kDefaultCacheMaxMiB << 20);
  ::setenv("LUNAJIT_CACHE_MAX_MB", "3", 1);
  EXPECT_EQ(BinaryCache::default_max_bytes(), 3ull << 20);
  ::setenv("LUNAJIT_CACHE_MAX_MB", "lots", 1);  // an error; the library warns and keeps the default
  EXPECT_FALSE(BinaryCache::max_bytes_from_environment().ok());
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(BinaryCache::default_max_bytes(), kDefaultCacheMaxMiB << 20);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("LUNAJIT_CACHE_MAX_MB"), std::string::npos);
  if (saved) ::setenv("LUNAJIT_CACHE_MAX_MB", saved->c_str(), 1);
  else ::unsetenv("LUNAJIT_CACHE_MAX_MB");
}

TEST(BinaryCacheDefaultDir, ResolutionOrder) {
  auto save = [](const char* n) -> std::optional<std::string> {
    const char* v = std::getenv(n);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  auto restore = [](const char* n, const std::optional<std::string>& v) {
    if (v) ::setenv(n, v->c_str(), 1);
    else ::unsetenv(n);
  };
  const auto cache_dir = save("LUNAJIT_CACHE_DIR"), xdg = save("XDG_CACHE_HOME"), home = save("HOME");

  ::setenv("LUNAJIT_CACHE_DIR", "/x/explicit", 1);
  ::setenv("XDG_CACHE_HOME", "/x/xdg", 1);
  ::setenv("HOME", "/x/home", 1);
  EXPECT_EQ(BinaryCache::default_dir(), fs::path("/x/explicit"));
  ::unsetenv("LUNAJIT_CACHE_DIR");
  EXPECT_EQ(BinaryCache::default_dir(), fs::path("/x/xdg/lunajit"));
  ::setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  EXPECT_EQ(BinaryCache::default_dir(), fs::path("/x/home/.cache/lunajit"));
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(BinaryCache::default_dir(), fs::path("/x/home/.cache/lunajit"));

  restore("LUNAJIT_CACHE_DIR", cache_dir);
  restore("XDG_CACHE_HOME", xdg);
  restore("HOME", home);
}

// ---------------------------------------------------------------- issue 15
// The findings of issue 15 (hangs, security, a read-only cache), one test each.

constexpr uid_t kNobody = 65534;

bool is_root() { return ::geteuid() == 0; }

// Runs `body` in a forked child as uid/gid `uid` (root only); the child's exit
// status (body's return value, 100+ for a failed setuid).
int run_as(uid_t uid, const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(100);
    ::_exit(body());
  }
  int status = -1;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
}

void chown_tree(const fs::path& root, uid_t uid) {
  ASSERT_EQ(::lchown(root.c_str(), uid, uid), 0);
  for (const auto& e : fs::recursive_directory_iterator(root)) ASSERT_EQ(::lchown(e.path().c_str(), uid, uid), 0);
}

TEST_F(CacheDir, EntryOfAnOlderSchemaIsReplacedWithoutAWarning) {
  BinaryCache cache(root_);
  cache.put(kKey, "new");
  const fs::path p = cache.entry_path(kKey);
  std::string raw = read_file(p);
  raw[8] = 1;  // schema 1, the format before keys were stored
  std::ofstream(p, std::ios::binary | std::ios::trunc) << raw;
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.get(kKey).has_value());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(cache.counters().corrupt, 0u);
  EXPECT_FALSE(fs::exists(p));
  cache.put(kKey, "new");
  EXPECT_EQ(BinaryCache(root_).get(kKey).value_or(""), "new");
}

TEST_F(CacheDir, FifoInPlaceOfEntryDoesNotHang) {
  BinaryCache cache(root_);
  cache.put(kKey, payload(100));
  const fs::path p = cache.entry_path(kKey);
  ASSERT_EQ(::unlink(p.c_str()), 0);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  ::testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(cache.get(kKey).has_value());  // a blocking open would never return
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("rejected (a FIFO); recompiling"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(fs::symlink_status(p))) << "the FIFO is removed";
  cache.put(kKey, "fresh");
  EXPECT_EQ(BinaryCache(root_).get(kKey).value_or(""), "fresh");
}

TEST_F(CacheDir, LockHeldByStoppedProcessTimesOutNamingThePid) {
  BinaryCache cache(root_);
  const fs::path lock_file = root_ / "bin" / ".lock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT, 0600);
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fd < 0 || ::fcntl(fd, F_SETLK, &fl) != 0) ::_exit(1);
    (void)!::write(ready[1], "x", 1);
    ::raise(SIGSTOP);  // holds the lock, stopped, like a ^Z'd lunajit
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(holder, &status, WUNTRACED), holder);
  ASSERT_TRUE(WIFSTOPPED(status));

  const auto saved = file_lock_timeout();
  set_file_lock_timeout(std::chrono::milliseconds(1500));  // past kLockNoticeAfter
  ::testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  cache.put(kKey, "kept");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_file_lock_timeout(saved);
  ::kill(holder, SIGKILL);
  ::waitpid(holder, &status, 0);

  EXPECT_LT(waited, 5.0);
  EXPECT_GE(waited, 1.4);
  const std::string pid = "held by pid " + std::to_string(holder);
  EXPECT_NE(err.find("waiting for lock " + lock_file.string() + " " + pid), std::string::npos) << err;
  EXPECT_NE(err.find("timed out after 1.5 s waiting for lock " + lock_file.string() + " " + pid), std::string::npos)
      << err;
  EXPECT_EQ(cache.get(kKey).value_or(""), "kept");  // in memory
  // With the holder gone, the lock is free again.
  cache.put("aa00", "on disk");
  EXPECT_EQ(BinaryCache(root_).get("aa00").value_or(""), "on disk");
}

TEST_F(CacheDir, EntryCopiedOverAnotherKeyIsRejected) {
  const std::string other = "fedcba9876543210fedcba9876543210";
  BinaryCache cache(root_);
  cache.put(kKey, "kernel A");
  cache.put(other, "kernel B");
  fs::copy_file(cache.entry_path(other), cache.entry_path(kKey), fs::copy_options::overwrite_existing);
  BinaryCache fresh(root_);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(fresh.get(kKey).has_value());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("rejected (it holds the entry of key " + other + ", not of " + kKey + "); recompiling"),
            std::string::npos)
      << err;
  EXPECT_EQ(fresh.counters().corrupt, 1u);
  EXPECT_FALSE(fs::exists(fresh.entry_path(kKey)));
  EXPECT_EQ(fresh.get(other).value_or(""), "kernel B");
}

TEST_F(CacheDir, CacheDirectoriesAre0700AndEntries0600) {
  const fs::path dir = root_ / "new" / "cache";
  BinaryCache cache(dir);
  cache.put(kKey, "x");
  for (const fs::path& d : {root_ / "new", dir, dir / "bin", cache.entry_path(kKey).parent_path()}) {
    struct stat st {};
    ASSERT_EQ(::stat(d.c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << d;
  }
  struct stat st {};
  ASSERT_EQ(::stat(cache.entry_path(kKey).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(CacheDir, GroupOrOtherWritableCacheDirectoryIsRefused) {
  BinaryCache(root_).put(kKey, "planted");
  for (mode_t mode : {0770, 0707, 01777}) {
    ASSERT_EQ(::chmod(root_.c_str(), mode), 0);
    ::testing::internal::CaptureStderr();
    BinaryCache cache(root_);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(cache.persistent()) << std::oct << mode;
    EXPECT_FALSE(cache.get(kKey).has_value()) << "an entry of a refused directory is never read";
    EXPECT_NE(err.find("is writable by"), std::string::npos) << err;
    EXPECT_NE(err.find("chmod go-w " + root_.string()), std::string::npos) << err;
    EXPECT_FALSE(BinaryCache::check_private_dir(root_).ok());
  }
  ASSERT_EQ(::chmod(root_.c_str(), 0700), 0);
  EXPECT_TRUE(BinaryCache::check_private_dir(root_).ok());
  EXPECT_EQ(BinaryCache(root_).get(kKey).value_or(""), "planted");
}

TEST_F(CacheDir, CacheDirectoryOwnedByAnotherUserIsRefused) {
  if (!is_root()) GTEST_SKIP() << "needs root to chown the directory to nobody";
  BinaryCache(root_).put(kKey, "planted by nobody");
  chown_tree(root_, kNobody);
  ::testing::internal::CaptureStderr();
  BinaryCache cache(root_);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(cache.persistent());
  EXPECT_FALSE(cache.get(kKey).has_value());
  EXPECT_NE(err.find("is owned by nobody (uid 65534), not by you"), std::string::npos) << err;
  EXPECT_NE(cache.refusal().find("owned by nobody"), std::string::npos);
  const std::string saved = std::getenv("LUNAJIT_CACHE_DIR") ? std::getenv("LUNAJIT_CACHE_DIR") : "";
  ::setenv("LUNAJIT_CACHE_DIR", root_.c_str(), 1);
  const Status st = BinaryCache::check_environment();
  if (saved.empty()) ::unsetenv("LUNAJIT_CACHE_DIR");
  else ::setenv("LUNAJIT_CACHE_DIR", saved.c_str(), 1);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().kind, ErrorKind::runtime_failure);
  EXPECT_NE(st.error().message.find("owned by nobody"), std::string::npos) << st.error().message;
  chown_tree(root_, 0);
}

TEST_F(CacheDir, EntryOwnedByAnotherUserOrWritableByOthersIsRejected) {
  BinaryCache cache(root_);
  cache.put(kKey, "payload");
  const fs::path p = cache.entry_path(kKey);
  ASSERT_EQ(::chmod(p.c_str(), 0666), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.get(kKey).has_value());
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("rejected (writable by others (mode 0666))"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(p));
  if (!is_root()) GTEST_SKIP() << "the ownership half needs root to chown the entry";
  cache.put(kKey, "payload");
  ASSERT_EQ(::chown(p.c_str(), kNobody, kNobody), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.get(kKey).has_value());
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("rejected (owned by nobody (uid 65534)"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(CacheDir, SymbolicLinksInsideTheCacheAreNotFollowed) {
  const fs::path elsewhere = root_ / "elsewhere";
  {
    BinaryCache other(elsewhere);
    other.put(kKey, "via a link");
  }
  BinaryCache cache(root_ / "c");
  const fs::path p = cache.entry_path(kKey);
  fs::create_directories(p.parent_path());
  // The entry a link to a valid entry of the same key.
  fs::create_symlink(BinaryCache(elsewhere).entry_path(kKey), p);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.get(kKey).has_value());
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("rejected (a symbolic link)"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(BinaryCache(elsewhere).entry_path(kKey))) << "the link's target is left alone";
  // The entry's directory a link to the other cache's.
  fs::remove(p);
  fs::remove(p.parent_path());
  fs::create_directory_symlink(BinaryCache(elsewhere).entry_path(kKey).parent_path(), p.parent_path());
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.get(kKey).has_value());
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("its directory is a symbolic link"), std::string::npos) << err;
  // And bin/ itself a link: the directory is refused.
  fs::remove_all(root_ / "c");
  fs::create_directories(root_ / "c");
  ::chmod((root_ / "c").c_str(), 0700);
  fs::create_directory_symlink(elsewhere / "bin", root_ / "c" / "bin");
  ::testing::internal::CaptureStderr();
  BinaryCache linked(root_ / "c");
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(linked.persistent());
  EXPECT_FALSE(linked.get(kKey).has_value());
  EXPECT_NE(err.find("symbolic link"), std::string::npos) << err;
}

TEST_F(CacheDir, StatsReportFilesThatAreNotUsableEntries) {
  BinaryCache cache(root_);
  cache.put(kKey, "good");
  const fs::path dir = cache.entry_path(kKey).parent_path();
  ASSERT_EQ(::mkfifo((dir / "aaaa.bin").c_str(), 0600), 0);
  std::ofstream(dir / "bbbb.bin") << "x";
  ::chmod((dir / "bbbb.bin").c_str(), 0620);
  const CacheUsage u = cache.usage();
  EXPECT_EQ(u.entries, 1u);
  EXPECT_EQ(u.foreign, 2u);
  ASSERT_EQ(u.foreign_examples.size(), 2u);
  const std::string all = u.foreign_examples[0] + "\n" + u.foreign_examples[1];
  EXPECT_NE(all.find("aaaa.bin: a FIFO"), std::string::npos) << all;
  EXPECT_NE(all.find("bbbb.bin: writable by its group (mode 0620)"), std::string::npos) << all;
}

TEST_F(CacheDir, HomeUnsetFallbackIsPerUserNotSharedTmp) {
  if (!is_root()) GTEST_SKIP() << "needs root to become a uid without a home";
  const char* home = std::getenv("HOME");
  const std::string saved_home = home ? home : "";
  // A uid the password database does not know: no home at all.
  constexpr uid_t kStranger = 54321;
  ASSERT_EQ(::getpwuid(kStranger), nullptr);
  std::error_code ec;
  const fs::path expected = fs::temp_directory_path() / ("lunajit-cache-" + std::to_string(kStranger));
  fs::remove_all(expected, ec);
  // Another user (root, here) made that directory first: refused.
  fs::create_directories(expected);
  const int planted = run_as(kStranger, [&] {
    ::unsetenv("HOME");
    ::unsetenv("XDG_CACHE_HOME");
    ::unsetenv("LUNAJIT_CACHE_DIR");
    if (BinaryCache::default_dir() != expected) return 1;
    BinaryCache cache(BinaryCache::default_dir());
    return cache.persistent() ? 2 : 0;
  });
  EXPECT_EQ(planted, 0) << "1: wrong default dir, 2: a directory of another user was used";
  fs::remove_all(expected, ec);
  const int fresh = run_as(kStranger, [&] {
    ::unsetenv("HOME");
    ::unsetenv("XDG_CACHE_HOME");
    ::unsetenv("LUNAJIT_CACHE_DIR");
    BinaryCache cache(BinaryCache::default_dir());
    cache.put(kKey, "mine");
    struct stat st {};
    if (::stat(expected.c_str(), &st) != 0 || st.st_uid != kStranger || (st.st_mode & 0777) != 0700) return 3;
    return cache.persistent() && BinaryCache(expected).get(kKey) ? 0 : 4;
  });
  EXPECT_EQ(fresh, 0) << "3: not created 0700 and owned by the user, 4: not used";
  fs::remove_all(expected, ec);
  // HOME unset, a user with a home: the password database's home.
  ::unsetenv("HOME");
  const char* cache_dir = std::getenv("LUNAJIT_CACHE_DIR");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_cache = cache_dir ? cache_dir : "", saved_xdg = xdg ? xdg : "";
  ::unsetenv("LUNAJIT_CACHE_DIR");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(BinaryCache::default_dir(), fs::path(::getpwuid(::geteuid())->pw_dir) / ".cache" / "lunajit");
  if (!saved_home.empty()) ::setenv("HOME", saved_home.c_str(), 1);
  if (!saved_cache.empty()) ::setenv("LUNAJIT_CACHE_DIR", saved_cache.c_str(), 1);
  if (!saved_xdg.empty()) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
}

TEST_F(CacheDir, ReadOnlyCacheAsNonRootUserIsRead) {
  if (!is_root()) GTEST_SKIP() << "needs root to hand the cache to nobody";
  ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
  const fs::path dir = root_ / "ro";
  {
    BinaryCache cache(dir);
    for (int i = 0; i < 8; ++i) cache.put(fmt_key(i), payload(100, char('a' + i)));
  }
  chown_tree(dir, kNobody);
  for (const auto& e : fs::recursive_directory_iterator(dir)) ::chmod(e.path().c_str(), e.is_directory() ? 0500 : 0400);
  ::chmod(dir.c_str(), 0500);
  const int rc = run_as(kNobody, [&] {
    ::testing::internal::CaptureStderr();
    BinaryCache cache(dir);
    int hits = 0;
    for (int i = 0; i < 8; ++i) hits += cache.get(fmt_key(i)).value_or("") == payload(100, char('a' + i));
    cache.put("aa99", "new");  // kept in memory, with one warning
    const bool in_memory = cache.get("aa99").value_or("") == "new";
    const CacheUsage u = cache.usage();
    const ClearResult cleared = cache.clear();
    const std::string err = ::testing::internal::GetCapturedStderr();
    if (!cache.persistent() || cache.writable()) return 10;
    if (hits != 8) return 20 + hits;
    if (!in_memory) return 30;
    if (u.entries != 8 + 1) return 40;  // 8 on disk, 1 in memory
    if (cleared.failed != 8 || cleared.first_error != EACCES) return 50;
    if (err.find("is read-only") == std::string::npos) return 60;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: not read-only, 2x: x of 8 entries read, 30: put lost, 40: usage, 50: clear's "
                      "failures not reported, 60: no warning";
  ::chmod(dir.c_str(), 0700);
  for (const auto& e : fs::recursive_directory_iterator(dir)) ::chmod(e.path().c_str(), 0700);
}

TEST(CacheEntryFormat, DecodeChecksKeyChecksumAndSizes) {
  const std::string entry = encode_cache_entry(kKey, "payload bytes");
  EXPECT_EQ(decode_cache_entry(entry, kKey).value(), "payload bytes");
  auto other = decode_cache_entry(entry, "another key");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("holds the entry of key " + kKey), std::string::npos);
  for (std::size_t cut : {std::size_t{0}, std::size_t{10}, std::size_t{39}, entry.size() - 1}) {
    auto r = decode_cache_entry(entry.substr(0, cut), kKey);
    EXPECT_FALSE(r.ok()) << cut;
  }
  std::string flipped = entry;
  flipped[45] ^= 1;  // inside the stored key: the checksum covers it
  auto r = decode_cache_entry(flipped, kKey);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("checksum mismatch"), std::string::npos) << r.error().message;
  std::string huge_key = entry;
  huge_key[12] = huge_key[13] = huge_key[14] = huge_key[15] = char(0xff);  // key length 2^32 - 1
  EXPECT_FALSE(decode_cache_entry(huge_key, kKey).ok());
}

TEST(BinaryCacheMaxBytes, CacheMaxMbOverflowNegativeAndNonNumericAreErrors) {
  const char* old = std::getenv("LUNAJIT_CACHE_MAX_MB");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  for (const char* bad : {"17592186044416", "-1", "99999999999999999999", "0", "lots", " 5", "5MB", "+5", "1e3"}) {
    ::setenv("LUNAJIT_CACHE_MAX_MB", bad, 1);
    auto r = BinaryCache::max_bytes_from_environment();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument);
    EXPECT_NE(r.error().message.find("LUNAJIT_CACHE_MAX_MB="), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(std::string(bad).substr(0, 5)), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("from 1 to 17592186044415"), std::string::npos) << r.error().message;
    EXPECT_FALSE(BinaryCache::check_environment().ok()) << bad;
  }
  ::setenv("LUNAJIT_CACHE_MAX_MB", "17592186044415", 1);  // the largest: 2^44 - 1 MiB
  EXPECT_EQ(BinaryCache::max_bytes_from_environment().value(), kMaxCacheMaxMiB << 20);
  EXPECT_EQ(kMaxCacheMaxMiB << 20 >> 20, kMaxCacheMaxMiB) << "no overflow";
  ::setenv("LUNAJIT_CACHE_MAX_MB", "1", 1);
  EXPECT_EQ(BinaryCache::max_bytes_from_environment().value(), 1u << 20);
  if (saved) ::setenv("LUNAJIT_CACHE_MAX_MB", saved->c_str(), 1);
  else ::unsetenv("LUNAJIT_CACHE_MAX_MB");
}

}  // namespace
}  // namespace lunajit
