// BinaryCache: compiled artifacts (CUBIN, PTX, host object code) on disk by
// content key, so a kernel is compiled once per machine.
//
// Key: a hex digest the caller computes over everything that determines the
// bytes (full source with embedded headers, canonical options, compiler version,
// target, lunajit version). Location: LUNAJIT_CACHE_DIR, else
// $XDG_CACHE_HOME/lunajit, else ~/.cache/lunajit; entries under <dir>/bin/.
// Each entry: magic, schema version, payload size, XXH3 checksum, payload.
// Writes go to a temp file renamed into place (readers never see a torn file);
// a corrupted or truncated entry is reported as a miss, removed and logged.
// A directory that cannot be written degrades to memory-only with one warning.
// Size bound: LUNAJIT_CACHE_MAX_MB (default 2048) over the entry files; a hit
// touches the entry's atime/mtime, and a put that takes the total over the
// bound evicts the least recently used entries (oldest mtime first) down to it.
//
// On-disk layout of one entry, <dir>/bin/<key[0:2]>/<key>.bin (little endian):
//   offset  0  8 bytes  magic "LUNAJITB"
//   offset  8  u32      schema version (kBinaryCacheSchema)
//   offset 12  u64      payload size in bytes
//   offset 20  16 bytes XXH3-128 of the payload (XXH128_canonical_t, big endian)
//   offset 36           payload
// Writers create "<key>.bin.tmp-<pid>-<thread>-<n>" beside the entry and rename
// it into place while holding an fcntl write lock on <dir>/bin/.lock, after
// re-checking that no valid entry appeared meanwhile; readers never lock.
// Keys are expected to be hex digests; a key with characters other than
// [0-9A-Za-z_-] (or longer than 128) is stored under content_hash(key).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace lunajit {

inline constexpr std::uint32_t kBinaryCacheSchema = 1;

// One entry's file contents (header + payload, layout above) for `payload`.
std::string encode_cache_entry(std::string_view payload);
// The payload of one entry's file contents, or why they are damaged ("bad
// magic", "checksum mismatch", ...). Pure: BinaryCache::get reads the file and
// calls this; tests/fuzz/cache_entry_fuzzer.cpp feeds it arbitrary bytes.
Result<std::string> decode_cache_entry(std::string_view bytes);

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
};

class BinaryCache {
 public:
  // Opens (creating if needed) the cache at `dir`; an empty path means the
  // default location above.
  explicit BinaryCache(std::filesystem::path dir = {});

  // The process-wide cache at the default location (or LUNAJIT_CACHE_DIR).
  static BinaryCache& global();
  static std::filesystem::path default_dir();
  // LUNAJIT_CACHE_MAX_MB in bytes (a positive integer), else kDefaultCacheMaxMiB MiB.
  static uint64_t default_max_bytes();

  // The payload stored under `key`, or nullopt (a miss). A damaged entry counts
  // as a miss and as `corrupt`, is removed, and a warning goes to stderr.
  std::optional<std::string> get(std::string_view key);
  // Stores `bytes` under `key`. If another writer (thread or process) stored a
  // valid entry first, that one is kept: equal keys mean equal contents.
  // I/O failures are reported once on stderr and fall back to memory.
  void put(std::string_view key, std::string_view bytes);
  // Removes the entry; true if there was one.
  bool remove(std::string_view key);
  // Removes every entry and leftover temp file; returns the number of entries removed.
  uint64_t clear();
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
  bool persistent() const { return persistent_.load(); }
  // Where the entry for `key` lives (whether or not it exists).
  std::filesystem::path entry_path(std::string_view key) const;

 private:
  void degrade_to_memory(const std::string& why);
  void count_corrupt(const std::filesystem::path& path, const std::string& reason);
  // After a put of `added` bytes: evicts least recently used entries, other
  // than `keep`, when the directory exceeds max_bytes().
  void evict_if_needed(uint64_t added, const std::filesystem::path& keep);

  std::filesystem::path dir_;
  std::atomic<bool> persistent_{true};
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
