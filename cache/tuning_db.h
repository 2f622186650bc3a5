// TuningDb: the autotuner's decisions on disk, one JSON file per device
// fingerprint, so a GPU is tuned once and every later process (and every rank
// of a job) reads the same choice.
//
// Learned from Triton's, CuPy's and PyTorch's caches:
//  - The key is what determines the best config and nothing else: spec hash,
//    pass, and a shape bucket (sequence length rounded up to a power of two,
//    batch x heads rounded up to a power of two, dtype). The candidate list is
//    NOT in the key: growing the search space does not throw decisions away
//    (re-tune explicitly to use new candidates).
//  - The device is the file: <dir>/tuning/<fingerprint id>.json, where the
//    fingerprint holds name, compute capability, SM count, memory size, driver,
//    NVRTC build and lunajit version. A driver or compiler update starts a new
//    file instead of trusting timings made with the old one.
//  - Writes never tear: a writer takes <dir>/tuning/.lock (fcntl, see
//    cache/file_lock.h), re-reads the file, merges its entries in, writes a temp
//    file and renames it into place. Readers do not lock. Four processes tuning
//    at once leave one file holding the union of their entries.
//  - Lookups are deterministic for a given file: the exact bucket, else the
//    nearest bucket of the same spec, pass and dtype (distance in log2 steps of
//    seq plus log2 steps of batch x heads; ties to the smaller seq, then the
//    smaller batch x heads), else nothing (the caller uses default_config).
//
// This component knows nothing of specs or tile configs: keys are strings and
// configs are JSON objects (codegen/tile_config.h reads them back).
//
// File layout (schema 1), entries sorted by key:
//   {"schema": 1, "device": {fingerprint}, "entries": [
//     {"key": "<spec_hash>/forward/seq1024/bh32/bf16", "spec_hash": ..., "pass": ...,
//      "seq_bucket": 1024, "bh_bucket": 32, "dtype": "bf16",
//      "config": {...}, "config_name": "T64.w4...", "method": "measured" | "model-ranked",
//      "timings": [{"config": {...}, "config_name": ..., "ms": 0.12, "status": "ok"}, ...],
//      "spec": {...}, "tuned_at": "2025-01-01T00:00:00Z",
//      "origin": "local" | "imported", "imported_from": "<file>", "imported_at": "<UTC>"}]}
//
// Damaged files (not JSON, a wrong schema type, an entry with a field of the
// wrong type or a bucket that is not a power of two in [1, kMaxShapeBucket])
// never stop a command: they are reported on stderr (and by `cache ls/stats`),
// renamed to <file>.corrupt-<UTC time>-<pid> and the database continues without
// them. Files are read with a bound (kMaxTuningFileBytes) and never through a
// symbolic link.
//
// Provenance: entries a process tunes are "local"; `cache import` marks what it
// brings in "imported" (whatever the file claims) with the file's name and the
// time. A local measurement beats anything imported, whatever method or
// tuned_at the import claims (preferred_entry).
#pragma once

#include <compare>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace lunajit {

inline constexpr int kTuningDbSchema = 1;
// The largest shape bucket: seq and batch x heads are ints (ProblemShape), and
// batch x heads is at most 65535^2 < 2^32, so every valid shape's buckets fit.
inline constexpr int64_t kMaxShapeBucket = int64_t{1} << 32;
// Tuning database files and import files larger than this are refused.
inline constexpr std::size_t kMaxTuningFileBytes = std::size_t{256} << 20;

// What makes one tuning result valid on another machine: the same GPU model
// with the same driver, compiler and lunajit. Without a GPU the tuner ranks by
// the cost model and fills in the arch's representative product with
// driver "none".
struct DeviceFingerprint {
  std::string name;          // "NVIDIA H200", or "model of NVIDIA H100 SXM 80GB" without a GPU
  int sm = 0;                // compute capability * 10 + minor: 90
  int sm_count = 0;
  uint64_t memory_bytes = 0;
  std::string driver;        // "12.4", or "none" without a GPU
  std::string nvrtc;         // nvrtc_build_identity()
  std::string lunajit;       // LUNAJIT_VERSION

  nlohmann::json to_json() const;
  static Result<DeviceFingerprint> from_json(const nlohmann::json& j);
  // File stem: "nvidia-h200-sm90-<8 hex digits of the hash of every field>".
  std::string id() const;
  bool operator==(const DeviceFingerprint&) const = default;
};

struct ShapeBucket {
  int64_t seq = 1;           // sequence length rounded up to a power of two
  int64_t batch_heads = 1;   // batch x heads rounded up to a power of two
  std::string dtype;     // "bf16"
  auto operator<=>(const ShapeBucket&) const = default;
};

// The bucket of a problem shape (64-bit arithmetic throughout; callers pass
// validated shapes, whose buckets are at most kMaxShapeBucket).
ShapeBucket shape_bucket(int64_t batch, int64_t heads, int64_t seq, std::string dtype);
// Smallest power of two >= v (1 for v <= 1); v must be at most 2^62.
int64_t round_up_pow2(int64_t v);
// Whether v is a power of two in [1, kMaxShapeBucket].
bool valid_bucket(int64_t v);

struct TuningKey {
  std::string spec_hash;
  std::string pass;  // "forward", "backward"
  ShapeBucket bucket;

  // "<spec_hash>/<pass>/seq<N>/bh<M>/<dtype>"
  std::string to_string() const;
  auto operator<=>(const TuningKey&) const = default;
};

// One candidate's line of the timing table.
struct TimingRow {
  nlohmann::json config;    // TileConfig::to_json()
  std::string config_name;  // TileConfig::to_string()
  double ms = 0;            // measured median, or the cost model's prediction
  std::string status;       // "ok", "slow (rejected early)", "wrong output: ...", "compile failed: ..."
};

struct TuningEntry {
  TuningKey key;
  nlohmann::json config;    // the chosen TileConfig
  std::string config_name;
  std::string method;       // "measured" or "model-ranked"
  std::vector<TimingRow> timings;
  nlohmann::json spec;      // the spec itself, for humans and for `cache ls`
  std::string tuned_at;     // UTC, ISO 8601
  std::string origin = "local";  // "local" or "imported"
  std::string imported_from;     // origin "imported": the import file's name
  std::string imported_at;       // origin "imported": when (UTC)

  nlohmann::json to_json() const;
  static Result<TuningEntry> from_json(const nlohmann::json& j);
};

// What one database file holds, as parse_tuning_db reads it.
struct TuningDbContents {
  std::optional<DeviceFingerprint> device;
  std::vector<TuningEntry> entries;  // in key order (a later equal key in the file replaces an earlier one)
};
// Parses a database file's text (schema 1, layout above), or says why it is
// damaged. Pure: TuningDb reads the file and calls this (a damaged file is set
// aside); tests/fuzz/tuning_db_fuzzer.cpp feeds it arbitrary bytes.
Result<TuningDbContents> parse_tuning_db(std::string_view text);

// How a lookup was answered.
enum class LookupKind { exact, nearest, none };
std::string_view to_string(LookupKind k);

struct TuningLookup {
  LookupKind kind = LookupKind::none;
  std::optional<TuningEntry> entry;  // set unless kind == none
};

class TuningDb {
 public:
  // The database of `device` under `dir` (an empty path: BinaryCache's default
  // directory); reads the file if it exists. A damaged file is set aside as
  // <file>.corrupt-<UTC time>-<pid> with a warning and the database starts empty.
  TuningDb(std::filesystem::path dir, DeviceFingerprint device);

  const DeviceFingerprint& device() const { return device_; }
  const std::filesystem::path& file() const { return file_; }

  // Re-reads the file (entries other processes stored meanwhile).
  void reload();
  TuningLookup lookup(const TuningKey& key) const;
  std::optional<TuningEntry> find(const TuningKey& key) const;
  std::vector<TuningEntry> entries() const;  // sorted by key

  // Stores entries (replacing equal keys) in memory and in the file, atomically
  // under the lock; a directory that cannot be written keeps them in memory
  // for this process, with one warning.
  Status store(const std::vector<TuningEntry>& entries);
  Status store(const TuningEntry& entry) { return store(std::vector<TuningEntry>{entry}); }
  bool persistent() const { return persistent_; }
  // Why entries were not written to file() (empty while persistent()).
  std::string not_saved_reason() const;

 private:
  std::filesystem::path dir_;
  DeviceFingerprint device_;
  std::filesystem::path file_;
  mutable std::mutex mu_;
  std::map<TuningKey, TuningEntry> entries_;
  bool persistent_ = true;
  bool warned_ = false;
  std::string not_saved_;
};

// Which of two entries for the same key a merge keeps: a local measurement
// beats everything; then measured beats model-ranked; then local beats
// imported; then the later tuned_at, then the smaller config name (so a merge
// gives the same file whatever the order of its inputs).
const TuningEntry& preferred_entry(const TuningEntry& a, const TuningEntry& b);

// Every database file under <dir>/tuning: (fingerprint, entries), and the
// damaged ones, with `problem` saying why and `moved_to` where they were set
// aside (the callers report them; nothing is skipped silently).
struct TuningFile {
  DeviceFingerprint device;
  std::filesystem::path file;
  std::vector<TuningEntry> entries;
  std::string problem;              // empty: a valid database
  std::filesystem::path moved_to;   // a damaged file's new name (empty if it could not be moved)
};
std::vector<TuningFile> list_tuning_files(const std::filesystem::path& dir);

// One JSON document holding every valid database under `dir`:
// {"lunajit_tuning_export": 1, "databases": [{"device": ..., "entries": [...]}]};
// damaged files are left out and listed in `damaged` when given.
nlohmann::json export_tuning(const std::filesystem::path& dir, std::vector<TuningFile>* damaged = nullptr);
// Checks that `doc` is a tuning export, every database and entry in it
// (invalid_argument naming the first bad one otherwise).
Status validate_tuning_export(const nlohmann::json& doc);
// Merges an export into the databases under `dir` (preferred_entry decides
// equal keys), all or nothing: the whole document is validated first, and a
// failure writing any database file restores the ones already written.
// Entries are marked origin "imported" from `source` (the file name). Returns
// the number of entries added or replaced.
Result<int> import_tuning(const std::filesystem::path& dir, const nlohmann::json& doc,
                          const std::string& source = "import");
// Removes every database file.
struct TuningClear {
  int removed = 0;
  int failed = 0;       // files that could not be removed
  int first_error = 0;  // errno of the first failure
};
TuningClear clear_tuning(const std::filesystem::path& dir);

}  // namespace lunajit
