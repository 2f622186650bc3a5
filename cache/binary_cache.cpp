// BinaryCache: entries on disk bound to their keys, with checksums, atomic
// rename under an fcntl lock, ownership and mode checks, memory-only fallback.
// Layout, protocol and threat model: cache/binary_cache.h.
//
// Why a lock at all when rename() is atomic: two processes that compiled the
// same key would otherwise both rename, which is harmless, but a writer that
// finds a *corrupted* entry must replace it without deleting a valid one that
// another process renamed into place a moment earlier. Holding the lock for the
// short "check, then rename or unlink" step makes that decision race-free.
// (cache/file_lock.h serializes threads as well as processes.)
//
// Everything inside the cache directory is reached with openat() from a
// descriptor of <dir>/bin opened once with O_NOFOLLOW, and every directory and
// entry is fstat'ed before use: a symbolic link, a FIFO, a device or a file of
// another user is never read, let alone executed.
#include "cache/binary_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <xxhash.h>

#include "cache/file_lock.h"
#include "common/hash.h"
#include "common/read_file.h"

namespace lunajit {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'L', 'U', 'N', 'A', 'J', 'I', 'T', 'B'};
// magic, schema, key length, payload size, checksum; the key follows.
constexpr std::size_t kFixedHeaderBytes = 8 + 4 + 4 + 8 + 16;

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// XXH3-128 over (key length, key, payload): the checksum covers the binding.
std::string checksum(std::string_view key, std::string_view payload) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_128bits_reset(s);
  const std::uint64_t n = key.size();
  XXH3_128bits_update(s, &n, sizeof n);
  XXH3_128bits_update(s, key.data(), key.size());
  XXH3_128bits_update(s, payload.data(), payload.size());
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s));
  XXH3_freeState(s);
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof c.digest);
}

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

std::string entry_name(std::string_view key) { return is_safe_key(key) ? std::string(key) : content_hash(key); }

std::string user_text(uid_t uid) {
  if (const passwd* pw = ::getpwuid(uid); pw && pw->pw_name) return fmt::format("{} (uid {})", pw->pw_name, uid);
  return fmt::format("uid {}", uid);
}

// Why a file or directory with this stat must not be trusted, or "".
std::string insecure_reason(const struct stat& st) {
  if (st.st_uid != ::geteuid())
    return fmt::format("owned by {}, not by you ({})", user_text(st.st_uid), user_text(::geteuid()));
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return fmt::format("writable by {} (mode {:04o})", (st.st_mode & S_IWOTH) ? "others" : "its group",
                       st.st_mode & 07777);
  return "";
}

std::string file_type_text(mode_t m) {
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
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

// missing: no entry; corrupt: damaged bytes; rejected: not something to trust
// (wrong key, link, FIFO, another user's file). Both of the last are removed.
enum class ReadOutcome { missing, ok, corrupt, rejected };

struct EntryRead {
  ReadOutcome outcome = ReadOutcome::missing;
  std::string payload;
  std::string reason;  // why it is corrupt or rejected
  bool stale = false;  // corrupt only in being of another schema: replaced without a warning
  dev_t dev = 0;
  ino_t ino = 0;
};

// Validates the bytes of one entry for `key` (layout: binary_cache.h).
EntryRead parse_entry(std::string_view data, std::string_view key) {
  EntryRead r;
  r.outcome = ReadOutcome::corrupt;
  const std::uint64_t file_size = data.size();
  if (file_size < kFixedHeaderBytes) {
    r.reason = "truncated header: " + std::to_string(file_size) + " bytes";
    return r;
  }
  if (std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    r.reason = "bad magic";
    return r;
  }
  const auto schema = static_cast<std::uint32_t>(get_le(data.data() + 8, 4));
  if (schema != kBinaryCacheSchema) {
    r.reason = "schema " + std::to_string(schema) + ", expected " + std::to_string(kBinaryCacheSchema);
    r.stale = true;
    return r;
  }
  const std::uint64_t key_size = get_le(data.data() + 12, 4);
  const std::uint64_t payload_size = get_le(data.data() + 16, 8);
  if (key_size > file_size - kFixedHeaderBytes) {
    r.reason = fmt::format("truncated: key of {} bytes in {} bytes", key_size, file_size - kFixedHeaderBytes);
    return r;
  }
  const std::uint64_t have = file_size - kFixedHeaderBytes - key_size;
  if (payload_size != have) {
    r.reason = (payload_size > have ? "truncated: " : "size mismatch: ") + std::to_string(have) +
               " payload bytes, header says " + std::to_string(payload_size);
    return r;
  }
  const std::string_view stored_key(data.data() + kFixedHeaderBytes, key_size);
  const std::string_view payload(data.data() + kFixedHeaderBytes + key_size, payload_size);
  if (checksum(stored_key, payload) != data.substr(24, 16)) {
    r.reason = "checksum mismatch";
    return r;
  }
  if (stored_key != key) {
    r.outcome = ReadOutcome::rejected;
    r.reason = fmt::format("it holds the entry of key {}, not of {}", std::string(stored_key.substr(0, 64)),
                           std::string(key.substr(0, 64)));
    return r;
  }
  r.outcome = ReadOutcome::ok;
  r.payload.assign(payload);
  return r;
}

// Reads and validates the entry `name` in directory `dirfd` for `key`, without
// locking (the file is only ever replaced by rename, so an open descriptor
// sees one complete version).
EntryRead read_entry(int dirfd, const std::string& name, std::string_view key) {
  EntryRead r;
  struct stat lst {};
  if (::fstatat(dirfd, name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) != 0) return r;  // missing
  r.dev = lst.st_dev;
  r.ino = lst.st_ino;
  r.outcome = ReadOutcome::rejected;
  if (!S_ISREG(lst.st_mode)) {
    r.reason = file_type_text(lst.st_mode);  // never opened: a FIFO would block
    return r;
  }
  if (std::string why = insecure_reason(lst); !why.empty()) {
    r.reason = why;
    return r;
  }
  // O_NOFOLLOW | O_NONBLOCK: should it have been swapped since the fstatat.
  Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ELOOP) {
      r.reason = "a symbolic link";
      return r;
    }
    r.outcome = ReadOutcome::missing;  // gone or unreadable: a miss either way
    return r;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != lst.st_dev || st.st_ino != lst.st_ino) {
    r.reason = "replaced while being opened";
    return r;
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  r.outcome = ReadOutcome::corrupt;
  if (file_size < kFixedHeaderBytes) {
    r.reason = "truncated header: " + std::to_string(file_size) + " bytes";
    return r;
  }
  if (file_size > kMaxCacheEntryBytes) {
    r.reason = fmt::format("{} bytes, more than any entry ({} bytes)", file_size, kMaxCacheEntryBytes);
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
  const dev_t dev = r.dev;
  const ino_t ino = r.ino;
  r = parse_entry(data, key);
  r.dev = dev;
  r.ino = ino;
  return r;
}

std::string encode_entry(std::string_view key, std::string_view payload) {
  std::string out;
  out.reserve(kFixedHeaderBytes + key.size() + payload.size());
  out.append(kMagic, sizeof kMagic);
  put_le(out, kBinaryCacheSchema, 4);
  put_le(out, key.size(), 4);
  put_le(out, payload.size(), 8);
  out += checksum(key, payload);
  out.append(key);
  out.append(payload);
  return out;
}

// Writes `data` to a new file `name` in `dirfd` (O_EXCL, 0600) and flushes it
// to disk; 0 or an errno.
int write_new_file(int dirfd, const std::string& name, std::string_view data) {
  Fd fd(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
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

// mkdir -p with mode 0700 for every directory it creates; 0 or an errno.
int make_private_dirs(const fs::path& dir) {
  fs::path prefix;
  for (const fs::path& part : dir) {
    prefix /= part;
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      const int err = errno;
      struct stat st {};
      // An existing directory we cannot write in (EACCES) is fine on the way.
      if (::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      return err;
    }
  }
  return 0;
}

std::string refusal_text(const fs::path& dir, const std::string& why) {
  return fmt::format(
      "cache directory {} is {}; lunajit runs code from its cache and only uses a directory that no one else can "
      "write (fix: {}, or set LUNAJIT_CACHE_DIR to a directory of your own)",
      dir.string(), why,
      why.rfind("owned by", 0) == 0 ? "use another directory" : fmt::format("chmod go-w {}", dir.string()));
}

}  // namespace

Result<std::string> decode_cache_entry(std::string_view bytes, std::string_view key) {
  EntryRead r = parse_entry(bytes, key);
  if (r.outcome != ReadOutcome::ok) return Error::invalid("cache entry: " + r.reason);
  return std::move(r.payload);
}

std::string encode_cache_entry(std::string_view key, std::string_view payload) { return encode_entry(key, payload); }

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
    if (const passwd* pw = ::getpwuid(::geteuid()); pw && pw->pw_dir && pw->pw_dir[0] == '/') home = pw->pw_dir;
  }
  if (!home.empty()) return fs::path(home) / ".cache" / "lunajit";
  // No home at all: a directory of this uid's own, never one shared by all
  // users. Another user could create it first; the constructor's ownership
  // check then refuses it.
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  return tmp / fmt::format("lunajit-cache-{}", ::geteuid());
}

Result<uint64_t> BinaryCache::max_bytes_from_environment() {
  const char* v = std::getenv("LUNAJIT_CACHE_MAX_MB");
  if (v == nullptr || *v == '\0') return kDefaultCacheMaxMiB << 20;
  const std::string_view text(v);
  const std::string shown = text.size() > 40 ? std::string(text.substr(0, 40)) + "..." : std::string(text);
  const std::string allowed = fmt::format("allowed: a whole number of MiB from 1 to {}", kMaxCacheMaxMiB);
  const bool digits = std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits)
    return Error::invalid(fmt::format("LUNAJIT_CACHE_MAX_MB=\"{}\": {}; {}", shown,
                                      text.front() == '-' ? "negative" : "not a whole number", allowed));
  std::uint64_t mb = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), mb);
  if (ec == std::errc::result_out_of_range || mb > kMaxCacheMaxMiB || mb == 0 || end != text.data() + text.size())
    return Error::invalid(fmt::format("LUNAJIT_CACHE_MAX_MB={}: out of range; {}", shown, allowed));
  return mb << 20;
}

uint64_t BinaryCache::default_max_bytes() {
  auto b = max_bytes_from_environment();
  if (b) return *b;
  warn(b.error().message + fmt::format("; using the default, {}", kDefaultCacheMaxMiB));
  return kDefaultCacheMaxMiB << 20;
}

Status BinaryCache::check_private_dir(const fs::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return Error::failure(fmt::format("cache directory {}: {}", dir.string(), errno_message(errno)));
  if (!S_ISDIR(st.st_mode)) return Error::failure(fmt::format("cache directory {} is not a directory", dir.string()));
  if (std::string why = insecure_reason(st); !why.empty()) return Error::failure(refusal_text(dir, why));
  struct stat bin {};
  if (::lstat((dir / "bin").c_str(), &bin) == 0) {
    if (!S_ISDIR(bin.st_mode))
      return Error::failure(refusal_text(dir / "bin", file_type_text(bin.st_mode) + ", not a directory"));
    if (std::string why = insecure_reason(bin); !why.empty()) return Error::failure(refusal_text(dir / "bin", why));
  }
  return ok_status();
}

Status BinaryCache::check_environment() {
  if (auto b = max_bytes_from_environment(); !b) return b.error();
  const fs::path dir = default_dir();
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return ok_status();  // created (0700) when first used
  return check_private_dir(dir);
}

BinaryCache& BinaryCache::global() {
  static BinaryCache cache;
  return cache;
}

BinaryCache::BinaryCache(fs::path dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {
  if (const int err = make_private_dirs(dir_); err != 0) {
    degrade_to_memory("cannot create " + dir_.string() + ": " + errno_message(err));
    return;
  }
  Fd dfd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  struct stat st {};
  if (dfd.get() < 0 || ::fstat(dfd.get(), &st) != 0) {
    degrade_to_memory("cannot open " + dir_.string() + ": " + errno_message(errno));
    return;
  }
  if (std::string why = insecure_reason(st); !why.empty()) {
    refusal_ = refusal_text(dir_, why);
    warn(refusal_ + "; compiled kernels are cached in memory only");
    warned_io_ = true;
    persistent_ = false;
    writable_ = false;
    return;
  }
  const int made = ::mkdirat(dfd.get(), "bin", 0700) == 0 ? 0 : errno;
  bin_fd_ = ::openat(dfd.get(), "bin", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (bin_fd_ < 0) {
    const int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      refusal_ = refusal_text(dir_ / "bin", "a symbolic link or not a directory");
      warn(refusal_ + "; compiled kernels are cached in memory only");
      warned_io_ = true;
      persistent_ = false;
      writable_ = false;
      return;
    }
    degrade_to_memory("cannot create " + (dir_ / "bin").string() + ": " + errno_message(made != 0 ? made : err));
    return;
  }
  if (::fstat(bin_fd_, &st) == 0) {
    if (std::string why = insecure_reason(st); !why.empty()) {
      refusal_ = refusal_text(dir_ / "bin", why);
      warn(refusal_ + "; compiled kernels are cached in memory only");
      warned_io_ = true;
      persistent_ = false;
      writable_ = false;
      return;
    }
  }
  // Probe with a real file: permission bits alone do not tell (root ignores
  // them; a read-only mount does not show in them). A directory that can be
  // read but not written is still read.
  const std::string probe = ".probe" + temp_suffix();
  Fd fd(::openat(bin_fd_, probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) {
    write_error_ = errno;
    writable_ = false;
    return;
  }
  ::unlinkat(bin_fd_, probe.c_str(), 0);
}

BinaryCache::~BinaryCache() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
}

void BinaryCache::degrade_to_memory(const std::string& why) {
  std::lock_guard lock(mu_);
  if (!warned_io_) {
    warn("cache directory " + dir_.string() + " is not writable (" + why +
         "); compiled kernels are cached in memory only. Set LUNAJIT_CACHE_DIR to a writable directory.");
    warned_io_ = true;
  }
  refusal_ = why;
  persistent_ = false;
  writable_ = false;
}

void BinaryCache::count_corrupt(const fs::path& path, const std::string& reason, bool security) {
  warn("cache entry " + path.string() + (security ? " rejected (" : " corrupted (") + reason + "); recompiling");
  std::lock_guard lock(mu_);
  ++counters_.corrupt;
}

int BinaryCache::open_subdir(const std::string& name, bool create, std::string* why) const {
  if (create && ::mkdirat(bin_fd_, name.c_str(), 0700) != 0 && errno != EEXIST) return -1;
  const int fd = ::openat(bin_fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOTDIR) *why = "a symbolic link or not a directory";
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(*why = insecure_reason(st)).empty()) {
    ::close(fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

fs::path BinaryCache::entry_path(std::string_view key) const {
  const std::string name = entry_name(key);
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
  auto miss = [&] {
    std::lock_guard lock(mu_);
    ++counters_.misses;
    return std::nullopt;
  };
  const std::string name = entry_name(key);
  const std::string file = name + ".bin";
  const fs::path path = entry_path(key);
  std::string why;
  Fd sub(open_subdir(name.substr(0, 2), false, &why));
  if (sub.get() < 0) {
    if (!why.empty()) count_corrupt(path.parent_path(), "its directory is " + why, true);
    return miss();
  }
  EntryRead r = read_entry(sub.get(), file, key);
  if (r.outcome == ReadOutcome::corrupt || r.outcome == ReadOutcome::rejected) {
    // An entry of an older lunajit (another schema) is just replaced; anything
    // else is worth a warning.
    if (!r.stale) count_corrupt(path, r.reason, r.outcome == ReadOutcome::rejected);
    // Remove under the lock, and only the very file that was read: a writer
    // may have renamed a good entry into place since.
    if (writable_) {
      FileLock dl(dir_ / "bin" / ".lock");
      struct stat st {};
      if (dl.locked() && ::fstatat(sub.get(), file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == r.dev &&
          st.st_ino == r.ino)
        ::unlinkat(sub.get(), file.c_str(), 0);
    }
  }
  if (r.outcome != ReadOutcome::ok) return miss();
  // Least recently used = oldest mtime: a hit makes the entry the newest. A
  // failure (read-only entry or directory) only makes eviction less precise.
  ::utimensat(sub.get(), file.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  std::lock_guard lock(mu_);
  ++counters_.hits;
  return std::move(r.payload);
}

void BinaryCache::put(std::string_view key, std::string_view bytes) {
  auto keep_in_memory = [&] {
    std::lock_guard lock(mu_);
    memory_.insert_or_assign(std::string(key), std::string(bytes));
    ++counters_.writes;
  };
  auto warn_once = [&](const std::string& msg) {
    bool first = false;
    {
      std::lock_guard lock(mu_);
      first = !warned_io_;
      warned_io_ = true;
    }
    if (first) warn(msg);
  };
  if (!persistent_) return keep_in_memory();
  if (!writable_) {
    warn_once("cache directory " + dir_.string() + " is read-only (" + errno_message(write_error_) +
              "); its entries are used, new ones are kept in memory for this process");
    return keep_in_memory();
  }

  const std::string name = entry_name(key);
  const std::string file = name + ".bin";
  const fs::path path = entry_path(key);
  const std::string tmp = file + temp_suffix();
  const std::string entry = encode_entry(key, bytes);
  std::string why;
  Fd sub(open_subdir(name.substr(0, 2), true, &why));
  std::string err_text;
  if (sub.get() < 0) {
    err_text = why.empty() ? errno_message(errno) : "its directory is " + why;
  } else if (const int err = write_new_file(sub.get(), tmp, entry); err != 0) {
    err_text = errno_message(err);
  }
  bool wrote = false;
  if (err_text.empty()) {
    FileLock dl(dir_ / "bin" / ".lock");
    if (!dl.locked()) {
      err_text = dl.message();
    } else if (read_entry(sub.get(), file, key).outcome == ReadOutcome::ok) {
      // Another writer got there first; equal keys mean equal bytes.
    } else if (::renameat(sub.get(), tmp.c_str(), sub.get(), file.c_str()) != 0) {
      err_text = errno_message(errno);
    } else {
      wrote = true;
    }
  }
  if (!wrote && sub.get() >= 0) ::unlinkat(sub.get(), tmp.c_str(), 0);
  if (!err_text.empty()) {
    warn_once("cannot write cache entry " + path.string() + " (" + err_text +
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
  // The iterator does not descend into linked directories.
  for (fs::recursive_directory_iterator it(dir_ / "bin", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_temp_name(name) || it->path().extension() != ".bin") continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
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
  const std::string name = entry_name(key);
  std::string why;
  Fd sub(open_subdir(name.substr(0, 2), false, &why));
  if (sub.get() < 0) return removed;
  FileLock dl(dir_ / "bin" / ".lock");
  return (::unlinkat(sub.get(), (name + ".bin").c_str(), 0) == 0) || removed;
}

ClearResult BinaryCache::clear() {
  ClearResult res;
  {
    std::lock_guard lock(mu_);
    res.removed = memory_.size();
    memory_.clear();
  }
  if (!persistent_) return res;
  // Without the lock (a read-only directory) clear() still tries, and says
  // what it could not remove.
  std::optional<FileLock> dl;
  if (writable_) dl.emplace(dir_ / "bin" / ".lock");
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir_ / "bin", ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code sec;
    if (it->symlink_status(sec).type() == fs::file_type::directory) continue;
    const std::string name = it->path().filename().string();
    if (is_temp_name(name)) {
      ::unlink(it->path().c_str());
    } else if (it->path().extension() == ".bin") {
      if (::unlink(it->path().c_str()) == 0) {
        ++res.removed;
      } else {
        if (res.failed++ == 0) res.first_error = errno;
      }
    }
  }
  {
    std::lock_guard lock(mu_);
    approx_bytes_ = UINT64_MAX;
  }
  return res;
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
      std::error_code sec;
      if (it->symlink_status(sec).type() == fs::file_type::regular && !is_temp_name(name) &&
          it->path().extension() == ".bin")
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
      u.bytes += kFixedHeaderBytes + k.size() + v.size();
    }
  }
  if (persistent_) {
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir_ / "bin", ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (is_temp_name(name) || name == ".lock") continue;
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
      std::string why = S_ISREG(st.st_mode) ? insecure_reason(st) : file_type_text(st.st_mode);
      if (why.empty() && it->path().extension() != ".bin") why = "not named like an entry";
      if (why.empty()) {
        ++u.entries;
        u.bytes += static_cast<uint64_t>(st.st_size);
      } else {
        if (u.foreign_examples.size() < 5) u.foreign_examples.push_back(it->path().string() + ": " + why);
        ++u.foreign;
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
