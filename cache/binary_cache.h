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
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace lunajit {

struct CacheCounters {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t writes = 0;
  uint64_t corrupt = 0;  // entries found damaged and removed
};

class BinaryCache {
 public:
  // Opens (creating if needed) the cache at `dir`; an empty path means the
  // default location above.
  explicit BinaryCache(std::filesystem::path dir = {});

  // The process-wide cache at the default location (or LUNAJIT_CACHE_DIR).
  static BinaryCache& global();
  static std::filesystem::path default_dir();

  std::optional<std::string> get(std::string_view key);
  void put(std::string_view key, std::string_view bytes);

  CacheCounters counters() const;
  void reset_counters();
  const std::filesystem::path& dir() const { return dir_; }
  bool persistent() const { return persistent_; }

 private:
  std::filesystem::path entry_path(std::string_view key) const;

  std::filesystem::path dir_;
  bool persistent_ = true;
  mutable std::mutex mu_;
  std::map<std::string, std::string, std::less<>> memory_;  // used when not persistent
  CacheCounters counters_;
};

}  // namespace lunajit
