// BinaryCache: entries on disk with checksums, atomic rename under an fcntl
// lock, memory-only fallback. Layout and protocol: cache/binary_cache.h.
//
// Why a lock at all when rename() is atomic: two processes that compiled the
// same key would otherwise both rename, which is harmless, but a writer that
// finds a *corrupted* entry must replace it without deleting a valid one that
// another process renamed into place a moment earlier. Holding the lock for the
// short "check, then rename or unlink" step makes that decision race-free.
// (cache/file_lock.h serializes threads as well as processes.)
#include "cache/binary_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>
#include <tuple>

#include <xxhash.h>

#include "cache/file_lock.h"
#include "common/hash.h"

namespace lunajit {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'L', 'U', 'N', 'A', 'J', 'I', 'T', 'B'};
constexpr std::size_t kHeaderBytes = 8 + 4 + 8 + 16;  // magic, schema, size, checksum

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string checksum(std::string_view payload) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(payload.data(), payload.size()));
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof c.digest);
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

void warn(const std::string& msg) { std::fprintf(stderr, "lunajit: warning: %s\n", msg.c_str()); }

bool is_safe_key(std::string_view key) {
  if (key.size() < 2 || key.size() > 128) return false;
  for (char c : key) {
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// File descriptor that closes itself.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

enum class ReadOutcome { missing, ok, corrupt };

struct EntryRead {
  ReadOutcome outcome = ReadOutcome::missing;
  std::string payload;
  std::string reason;  // why it is corrupt
  dev_t dev = 0;
  ino_t ino = 0;
};

// Reads and validates one entry without locking (the file is only ever
// replaced by rename, so an open descriptor sees one complete version).
EntryRead read_entry(const fs::path& path) {
  EntryRead r;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return r;  // missing or unreadable: a miss either way
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return r;
  r.dev = st.st_dev;
  r.ino = st.st_ino;
  r.outcome = ReadOutcome::corrupt;
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < kHeaderBytes) {
    r.reason = "truncated header: " + std::to_string(file_size) + " bytes";
    return r;
  }
  std::string data(file_size, '\0');
  std::size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got != data.size()) {
    r.reason = "short read: " + std::to_string(got) + " of " + std::to_string(data.size()) + " bytes";
    return r;
  }
  auto decoded = decode_cache_entry(data);
  if (!decoded) {
    r.reason = decoded.error().message;
    return r;
  }
  r.outcome = ReadOutcome::ok;
  r.payload = std::move(*decoded);
  return r;
}

// Writes `data` to a new file at `path` (O_EXCL) and flushes it to disk; 0 or an errno.
int write_new_file(const fs::path& path, std::string_view data) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return errno;
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    done += static_cast<std::size_t>(n);
  }
  // The entry must be complete on disk before the rename publishes it, or a
  // crash could leave a named but empty file (which the checksum would catch).
  if (::fdatasync(fd.get()) != 0 && errno != EINVAL) return errno;
  if (::close(fd.release()) != 0) return errno;
  return 0;
}

std::string temp_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  return ".tmp-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000000007ull) + "-" +
         std::to_string(counter.fetch_add(1));
}

bool is_temp_name(const std::string& name) { return name.find(".tmp-") != std::string::npos; }

}  // namespace

std::string encode_cache_entry(std::string_view payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size());
  out.append(kMagic, sizeof kMagic);
  put_le(out, kBinaryCacheSchema, 4);
  put_le(out, payload.size(), 8);
  out += checksum(payload);
  out.append(payload);
  return out;
}

Result<std::string> decode_cache_entry(std::string_view data) {
  if (data.size() < kHeaderBytes)
    return Error::invalid("truncated header: " + std::to_string(data.size()) + " bytes");
  if (std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) return Error::invalid("bad magic");
  const auto schema = static_cast<std::uint32_t>(get_le(data.data() + 8, 4));
  if (schema != kBinaryCacheSchema)
    return Error::invalid("schema " + std::to_string(schema) + ", expected " + std::to_string(kBinaryCacheSchema));
  const std::uint64_t payload_size = get_le(data.data() + 12, 8);
  const std::uint64_t have = data.size() - kHeaderBytes;
  if (payload_size != have)
    return Error::invalid((payload_size > have ? "truncated: " : "size mismatch: ") + std::to_string(have) +
                          " payload bytes, header says " + std::to_string(payload_size));
  std::string_view payload(data.data() + kHeaderBytes, payload_size);
  if (checksum(payload) != data.substr(20, 16)) return Error::invalid("checksum mismatch");
  return std::string(payload);
}

fs::path BinaryCache::default_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  if (auto d = env("LUNAJIT_CACHE_DIR"); !d.empty()) return d;
  // The XDG spec says relative values are invalid and must be ignored.
  if (auto x = env("XDG_CACHE_HOME"); !x.empty() && x.front() == '/') return fs::path(x) / "lunajit";
  std::string home = env("HOME");
  if (home.empty()) {
    if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  }
  if (!home.empty()) return fs::path(home) / ".cache" / "lunajit";
  std::error_code ec;
  return fs::temp_directory_path(ec) / "lunajit-cache";
}

uint64_t BinaryCache::default_max_bytes() {
  if (const char* v = std::getenv("LUNAJIT_CACHE_MAX_MB"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0' && mb > 0) return mb << 20;
    warn(std::string("LUNAJIT_CACHE_MAX_MB=") + v + " is not a positive integer; using " +
         std::to_string(kDefaultCacheMaxMiB));
  }
  return kDefaultCacheMaxMiB << 20;
}

BinaryCache& BinaryCache::global() {
  static BinaryCache cache;
  return cache;
}

BinaryCache::BinaryCache(fs::path dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {
  const fs::path bin = dir_ / "bin";
  std::error_code ec;
  fs::create_directories(bin, ec);
  if (ec) {
    degrade_to_memory("cannot create " + bin.string() + ": " + ec.message());
    return;
  }
  // Probe with a real file: permission bits alone do not tell (root ignores
  // them; a read-only mount does not show in them).
  const fs::path probe = bin / (".probe" + temp_suffix());
  Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    degrade_to_memory("cannot write in " + bin.string() + ": " + errno_text(errno));
    return;
  }
  ::unlink(probe.c_str());
}

void BinaryCache::degrade_to_memory(const std::string& why) {
  std::lock_guard lock(mu_);
  if (!warned_io_) {
    warn("cache directory " + dir_.string() + " is not writable (" + why +
         "); compiled kernels are cached in memory only. Set LUNAJIT_CACHE_DIR to a writable directory.");
    warned_io_ = true;
  }
  persistent_ = false;
}

void BinaryCache::count_corrupt(const fs::path& path, const std::string& reason) {
  warn("cache entry " + path.string() + " corrupted (" + reason + "); recompiling");
  std::lock_guard lock(mu_);
  ++counters_.corrupt;
}

fs::path BinaryCache::entry_path(std::string_view key) const {
  const std::string name = is_safe_key(key) ? std::string(key) : content_hash(key);
  return dir_ / "bin" / name.substr(0, 2) / (name + ".bin");
}

std::optional<std::string> BinaryCache::get(std::string_view key) {
  {
    std::lock_guard lock(mu_);
    if (auto it = memory_.find(key); it != memory_.end()) {
      ++counters_.hits;
      return it->second;
    }
    if (!persistent_) {
      ++counters_.misses;
      return std::nullopt;
    }
  }
  const fs::path path = entry_path(key);
  EntryRead r = read_entry(path);
  if (r.outcome == ReadOutcome::corrupt) {
    count_corrupt(path, r.reason);
    // Remove under the lock, and only the very file that was read: a writer
    // may have renamed a good entry into place since.
    FileLock dl(dir_ / "bin" / ".lock");
    struct stat st {};
    if (dl.locked() && ::stat(path.c_str(), &st) == 0 && st.st_dev == r.dev && st.st_ino == r.ino)
      ::unlink(path.c_str());
  }
  // Least recently used = oldest mtime: a hit makes the entry the newest. A
  // failure (read-only entry or directory) only makes eviction less precise.
  if (r.outcome == ReadOutcome::ok) ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  std::lock_guard lock(mu_);
  if (r.outcome == ReadOutcome::ok) {
    ++counters_.hits;
    return std::move(r.payload);
  }
  ++counters_.misses;
  return std::nullopt;
}

void BinaryCache::put(std::string_view key, std::string_view bytes) {
  auto keep_in_memory = [&] {
    std::lock_guard lock(mu_);
    memory_.insert_or_assign(std::string(key), std::string(bytes));
    ++counters_.writes;
  };
  if (!persistent_) return keep_in_memory();

  const fs::path path = entry_path(key);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  fs::path tmp = path;
  tmp += temp_suffix();
  const std::string entry = encode_cache_entry(bytes);
  int err = ec ? ec.value() : write_new_file(tmp, entry);
  bool wrote = false;
  if (err == 0) {
    FileLock dl(dir_ / "bin" / ".lock");
    if (!dl.locked()) {
      err = dl.error();
    } else if (read_entry(path).outcome == ReadOutcome::ok) {
      // Another writer got there first; equal keys mean equal bytes.
    } else if (::rename(tmp.c_str(), path.c_str()) != 0) {
      err = errno;
    } else {
      wrote = true;
    }
  }
  if (!wrote) ::unlink(tmp.c_str());
  if (err != 0) {
    bool first = false;
    {
      std::lock_guard lock(mu_);
      first = !warned_io_;
      warned_io_ = true;
    }
    if (first)
      warn("cannot write cache entry " + path.string() + " (" + errno_text(err) +
           "); keeping it in memory for this process");
    return keep_in_memory();
  }
  {
    std::lock_guard lock(mu_);
    ++counters_.writes;
  }
  evict_if_needed(entry.size(), path);
}

void BinaryCache::evict_if_needed(uint64_t added, const fs::path& keep) {
  const uint64_t bound = max_bytes_.load();
  {
    std::lock_guard lock(mu_);
    if (approx_bytes_ != UINT64_MAX) {
      approx_bytes_ += added;
      if (approx_bytes_ <= bound) return;
    }
  }
  // Count (and, past the bound, evict) under the directory lock, so that two
  // processes do not both evict down from the same listing.
  FileLock dl(dir_ / "bin" / ".lock");
  if (!dl.locked()) return;
  struct Entry {
    struct timespec mtime;
    std::string path;
    uint64_t bytes;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir_ / "bin", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_temp_name(name) || it->path().extension() != ".bin") continue;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    entries.push_back({st.st_mtim, it->path().string(), static_cast<uint64_t>(st.st_size)});
    total += static_cast<uint64_t>(st.st_size);
  }
  uint64_t evicted = 0;
  if (total > bound) {
    // Oldest first; equal times by path, so every process picks the same victims.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.path) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.path);
    });
    for (const Entry& e : entries) {
      if (total <= bound) break;
      if (e.path == keep.string()) continue;
      if (::unlink(e.path.c_str()) == 0) {
        total -= e.bytes;
        ++evicted;
      }
    }
  }
  std::lock_guard lock(mu_);
  approx_bytes_ = total;
  counters_.evictions += evicted;
}

bool BinaryCache::remove(std::string_view key) {
  bool removed = false;
  {
    std::lock_guard lock(mu_);
    removed = memory_.erase(std::string(key)) > 0;
  }
  if (!persistent_) return removed;
  FileLock dl(dir_ / "bin" / ".lock");
  return (::unlink(entry_path(key).c_str()) == 0) || removed;
}

uint64_t BinaryCache::clear() {
  uint64_t n = 0;
  {
    std::lock_guard lock(mu_);
    n = memory_.size();
    memory_.clear();
  }
  if (!persistent_) return n;
  FileLock dl(dir_ / "bin" / ".lock");
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir_ / "bin", ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string name = it->path().filename().string();
    if (is_temp_name(name)) {
      ::unlink(it->path().c_str());
    } else if (it->path().extension() == ".bin" && ::unlink(it->path().c_str()) == 0) {
      ++n;
    }
  }
  return n;
}

std::vector<std::string> BinaryCache::keys() const {
  std::vector<std::string> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& [k, v] : memory_) out.push_back(k);
  }
  if (persistent_) {
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir_ / "bin", ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (it->is_regular_file() && !is_temp_name(name) && it->path().extension() == ".bin")
        out.push_back(it->path().stem().string());
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

CacheUsage BinaryCache::usage() const {
  CacheUsage u;
  {
    std::lock_guard lock(mu_);
    for (const auto& [k, v] : memory_) {
      ++u.entries;
      u.bytes += kHeaderBytes + v.size();
    }
  }
  if (persistent_) {
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir_ / "bin", ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (it->is_regular_file() && !is_temp_name(name) && it->path().extension() == ".bin") {
        ++u.entries;
        u.bytes += it->file_size(ec);
      }
    }
  }
  return u;
}

CacheCounters BinaryCache::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void BinaryCache::reset_counters() {
  std::lock_guard lock(mu_);
  counters_ = {};
}

}  // namespace lunajit
