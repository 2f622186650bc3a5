// BinaryCache: counters, recovery from damaged entries, the memory-only
// fallback, and concurrent writers from several processes.
#include "cache/binary_cache.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace lunajit {
namespace {
namespace fs = std::filesystem;

constexpr std::size_t kHeaderBytes = 36;
const std::string kKey = "0123456789abcdef0123456789abcdef";

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
  EXPECT_EQ(static_cast<unsigned char>(raw[12]), 77);
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
  EXPECT_EQ(cache.clear(), 2u);
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
  ::setenv("LUNAJIT_CACHE_MAX_MB", "lots", 1);  // warns, keeps the default
  EXPECT_EQ(BinaryCache::default_max_bytes(), kDefaultCacheMaxMiB << 20);
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

// decode_cache_entry: the pure reader of an entry's bytes (what get applies to
// the file; tests/fuzz/cache_entry_fuzzer feeds it arbitrary bytes).
TEST(CacheEntryCodec, DecodeInvertsEncodeAndNamesEachDamage) {
  for (const std::string payload : {std::string(), std::string("x"), std::string(1000, '\0')}) {
    const std::string bytes = encode_cache_entry(payload);
    EXPECT_EQ(bytes.size(), 36 + payload.size());
    auto back = decode_cache_entry(bytes);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(*back, payload);
  }
  const std::string good = encode_cache_entry("payload");
  auto reason = [](const std::string& bytes) {
    auto r = decode_cache_entry(bytes);
    return r.ok() ? std::string("accepted") : r.error().message;
  };
  EXPECT_EQ(reason(good.substr(0, 35)), "truncated header: 35 bytes");
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_EQ(reason(bad), "bad magic");
  bad = good;
  bad[8] = 2;
  EXPECT_EQ(reason(bad), "schema 2, expected 1");
  EXPECT_EQ(reason(good.substr(0, good.size() - 1)), "truncated: 6 payload bytes, header says 7");
  EXPECT_EQ(reason(good + "z"), "size mismatch: 8 payload bytes, header says 7");
  bad = good;
  bad.back() ^= 1;
  EXPECT_EQ(reason(bad), "checksum mismatch");
}

}  // namespace
}  // namespace lunajit
