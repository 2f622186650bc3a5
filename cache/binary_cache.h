// BinaryCache: compiled artifacts (CUBIN, PTX, host object code) on disk by
// content key, so a kernel is compiled once per machine.
//
// Key: a hex digest the caller computes over everything that determines the
// bytes (full source with embedded headers, canonical options, compiler version,
// target, lunajit version). Location: LUNAJIT_CACHE_DIR, else
// $XDG_CACHE_HOME/lunajit, else ~/.cache/lunajit (default_dir() below);
// entries under <dir>/bin/.
// Each entry: magic, schema version, its key, payload size, XXH3 checksum, payload.
// Writes go to a temp file renamed into place (readers never see a torn file);
// a corrupted, truncated or misplaced entry is reported as a miss, removed and logged
// (an entry of another schema, left by an older lunajit, is replaced silently).
// A directory that cannot be created degrades to memory-only with one warning.
// Size bound: LUNAJIT_CACHE_MAX_MB (default 2048, 1 to 2^44-1) over the entry files; a hit
// touches the entry's atime/mtime, and a put that takes the total over the
// bound evicts the least recently used entries (oldest mtime first) down to it.
//
// On-disk layout of one entry, <dir>/bin/<key[0:2]>/<key>.bin (little endian):
//   offset  0  8 bytes  magic "LUNAJITB"
//   offset  8  u32      schema version (kBinaryCacheSchema)
//   offset 12  u32      key length K
//   offset 16  u64      payload size in bytes
//   offset 24  16 bytes XXH3-128 of (key, payload) (XXH128_canonical_t, big endian)
//   offset 40  K bytes  the full key the entry was stored under
//   offset 40+K         payload
// get() returns a payload only when the header's key equals the requested key,
// so an entry copied or renamed over another key's file is rejected (warned,
// removed, recompiled), not executed.
//
// Trust (the threat model): the cache holds code that is executed, so it is
// trusted exactly as much as the user's own files. The cache directory and
// everything in it must be owned by the effective user and not be writable by
// group or others (as ssh demands of ~/.ssh): an insecure cache directory is
// refused (memory-only, with a message naming the owner or the mode; the CLI
// exits 1), an insecure entry is rejected and recompiled. Directories are
// created 0700 and entries 0600; nothing inside the cache directory is reached
// through a symbolic link (openat with O_NOFOLLOW from the cache directory
// down), and only regular files are read (a FIFO does not hang a reader).
// Given that, whoever can write an entry can already run code as the user, so
// the checksum's job is to catch accidents (torn or truncated writes, bit rot,
// an entry copied to the wrong name, a stale format): XXH3-128 over key and
// payload does that (a random collision has probability ~2^-128), and a
// cryptographic hash would add nothing without a secret key, which a local
// cache has no place to keep from the attacker it would be meant to stop.
// Keys are themselves XXH3-128 digests of everything that determines the bytes.
//
// Writers create "<key>.bin.tmp-<pid>-<thread>-<n>" beside the entry and rename
// it into place while holding an fcntl write lock on <dir>/bin/.lock, after
// re-checking that no valid entry appeared meanwhile; readers never lock. A
// lock held too long (a stopped process) times out (cache/file_lock.h) and the
// entry stays in memory.
// A directory that can be read but not written (a read-only cache, shared or
// on a read-only mount) is still read: valid entries are hits, new ones stay in
// memory.
// Keys are expected to be hex digests; a key with characters other than
// [0-9A-Za-z_-] (or longer than 128) is stored under content_hash(key).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sys/types.h>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace lunajit {

inline constexpr std::uint32_t kBinaryCacheSchema = 2;
// Entries larger than this are damaged by definition (a CUBIN is a few MiB).
inline constexpr std::uint64_t kMaxCacheEntryBytes = std::uint64_t{1} << 30;
// LUNAJIT_CACHE_MAX_MB: 1 to kMaxCacheMaxMiB (2^44 - 1, the most MiB whose byte
// count fits in 64 bits).
inline constexpr std::uint64_t kMaxCacheMaxMiB = (std::uint64_t{1} << 44) - 1;


struct CacheCounters {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t writes = 0;
  uint64_t corrupt = 0;  // entries found damaged and removed
  uint64_t evictions = 0;  // entries removed to keep the size bound
};

inline constexpr uint64_t kDefaultCacheMaxMiB = 2048;

// What is on disk (or in memory, when not persistent).
struct CacheUsage {
  uint64_t entries = 0;
  uint64_t bytes = 0;  // file sizes, headers included
  // Files under bin/ that are not entries lunajit would read: not regular files
  // (FIFOs, symbolic links, devices), owned by another user or writable by
  // group/others. `cache stats` reports them; the first few paths, with why.
  uint64_t foreign = 0;
  std::vector<std::string> foreign_examples;
};

// What clear() did: entries removed, entries that could not be removed (the
// errno of the first failure, e.g. EACCES in a read-only cache).
struct ClearResult {
  uint64_t removed = 0;
  uint64_t failed = 0;
  int first_error = 0;
};

// The entry format on its own (what get() and put() read and write, without
// the file checks), for tests and fuzzing: the payload of `bytes` if they are
// a valid entry for `key`, else invalid_argument with the reason.
Result<std::string> decode_cache_entry(std::string_view bytes, std::string_view key);
std::string encode_cache_entry(std::string_view key, std::string_view payload);

class BinaryCache {
 public:
  // Opens (creating if needed) the cache at `dir`; an empty path means the
  // default location above.
  explicit BinaryCache(std::filesystem::path dir = {});
  ~BinaryCache();
  BinaryCache(const BinaryCache&) = delete;
  BinaryCache& operator=(const BinaryCache&) = delete;

  // The process-wide cache at the default location (or LUNAJIT_CACHE_DIR).
  static BinaryCache& global();
  // LUNAJIT_CACHE_DIR, else $XDG_CACHE_HOME/lunajit (absolute values only),
  // else $HOME/.cache/lunajit, else <home of the user in the password
  // database>/.cache/lunajit, else <tmp>/lunajit-cache-<uid> (checked like any
  // cache directory: created 0700, refused if another user made it first).
  static std::filesystem::path default_dir();
  // LUNAJIT_CACHE_MAX_MB in bytes: an error naming the variable, its value and
  // the allowed range (1 to kMaxCacheMaxMiB) unless it is unset, empty or a
  // plain decimal integer in range.
  static Result<uint64_t> max_bytes_from_environment();
  // max_bytes_from_environment(), or kDefaultCacheMaxMiB MiB with a warning
  // when it is invalid (the CLI refuses invalid values before: check_environment).
  static uint64_t default_max_bytes();
  // What the CLI checks before any command that uses the cache: a valid
  // LUNAJIT_CACHE_MAX_MB (else invalid_argument) and, when the default
  // directory exists, that it is safe to use (else runtime_failure).
  static Status check_environment();
  // Whether `dir` (which must exist) is a directory owned by the effective user
  // and not writable by group or others; the error says what is wrong and how
  // to fix it.
  static Status check_private_dir(const std::filesystem::path& dir);

  // The payload stored under `key`, or nullopt (a miss). A damaged entry counts
  // as a miss and as `corrupt`, is removed, and a warning goes to stderr.
  std::optional<std::string> get(std::string_view key);
  // Stores `bytes` under `key`. If another writer (thread or process) stored a
  // valid entry first, that one is kept: equal keys mean equal contents.
  // I/O failures are reported once on stderr and fall back to memory.
  void put(std::string_view key, std::string_view bytes);
  // Removes the entry; true if there was one.
  bool remove(std::string_view key);
  // Removes every entry and leftover temp file (and anything else under bin/
  // named like an entry, FIFOs and links included).
  ClearResult clear();
  // The keys present (entries whose file name is a stored key), sorted.
  std::vector<std::string> keys() const;
  CacheUsage usage() const;

  // The size bound in bytes (entry files, headers included). Lowering it evicts
  // at the next put.
  uint64_t max_bytes() const { return max_bytes_.load(); }
  void set_max_bytes(uint64_t bytes) { max_bytes_ = bytes; }

  CacheCounters counters() const;
  void reset_counters();
  const std::filesystem::path& dir() const { return dir_; }
  // Whether entries are read from disk (false: memory only, e.g. refused or
  // uncreatable directory) and whether new ones are written there.
  bool persistent() const { return persistent_.load(); }
  bool writable() const { return writable_.load(); }
  // Why the directory is not used (refused as insecure, or not creatable);
  // empty when persistent().
  const std::string& refusal() const { return refusal_; }
  // Where the entry for `key` lives (whether or not it exists).
  std::filesystem::path entry_path(std::string_view key) const;

 private:
  void degrade_to_memory(const std::string& why);
  void count_corrupt(const std::filesystem::path& path, const std::string& reason, bool security);
  // The directory bin/<name> as a descriptor (created 0700 when `create`),
  // never through a link, checked like the cache directory; -1 and errno.
  int open_subdir(const std::string& name, bool create, std::string* why) const;
  // After a put of `added` bytes: evicts least recently used entries, other
  // than `keep`, when the directory exceeds max_bytes().
  void evict_if_needed(uint64_t added, const std::filesystem::path& keep);

  std::filesystem::path dir_;
  int bin_fd_ = -1;  // <dir>/bin, opened once (O_NOFOLLOW) and checked
  std::string refusal_;
  std::atomic<bool> persistent_{true};
  std::atomic<bool> writable_{true};
  int write_error_ = 0;  // why not writable_ (errno of the probe)
  mutable std::mutex mu_;
  std::map<std::string, std::string, std::less<>> memory_;  // used when not persistent
  CacheCounters counters_;
  bool warned_io_ = false;
  std::atomic<uint64_t> max_bytes_{default_max_bytes()};
  // Bytes on disk as this process last counted them plus its own puts since;
  // UINT64_MAX until the first count. Other processes' puts are seen at the
  // next count, which every put past the bound triggers.
  uint64_t approx_bytes_ = UINT64_MAX;
};

}  // namespace lunajit
