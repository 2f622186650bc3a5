// TuningDb: JSON files per device fingerprint, merged under a lock and
// replaced by rename. Format and protocol: cache/tuning_db.h.
#include "cache/tuning_db.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <system_error>

#include <limits>
#include <utility>
#include <fmt/format.h>

#include "cache/binary_cache.h"
#include "cache/file_lock.h"
#include "common/hash.h"
#include "common/read_file.h"

namespace lunajit {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void warn(const std::string& msg) { std::fprintf(stderr, "lunajit: warning: %s\n", msg.c_str()); }

fs::path tuning_dir(const fs::path& dir) { return dir / "tuning"; }

std::string slug(std::string_view s) {
  std::string out;
  for (char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) out.push_back(c);
    else if (c >= 'A' && c <= 'Z') out.push_back(static_cast<char>(c - 'A' + 'a'));
    else if (!out.empty() && out.back() != '-') out.push_back('-');
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.substr(0, 48);
}

// j[key] as T, if it is a JSON integer within T's range: get<int>() on a float
// such as 1e82 is undefined behaviour and on a larger integer wraps (both found
// by tests/fuzz/tuning_db_fuzzer); throws json::out_of_range naming the field.
template <class T>
T integer_at(const json& j, const char* key) {
  const json& v = j.at(key);
  const bool ok = v.is_number_unsigned() ? std::in_range<T>(v.get<uint64_t>())
                                          : v.is_number_integer() && std::in_range<T>(v.get<int64_t>());
  if (!ok)
    throw json::out_of_range::create(401, fmt::format("{} = {}: expected an integer in [{}, {}]", key,
                                                      v.dump().substr(0, 40), std::numeric_limits<T>::min(),
                                                      std::numeric_limits<T>::max()),
                                     &v);
  return v.get<T>();
}

enum class FileState { missing, ok, corrupt };

struct FileRead {
  FileState state = FileState::missing;
  std::map<TuningKey, TuningEntry> entries;
  std::optional<DeviceFingerprint> device;
  std::string reason;
};

// The schema field, which must be the integer kTuningDbSchema.
std::string schema_problem(const json& j) {
  if (!j.contains("schema")) return "no schema field";
  const json& v = j["schema"];
  if (!v.is_number_integer()) return fmt::format("schema {} is not the integer {}", v.dump().substr(0, 40), kTuningDbSchema);
  if (v.get<int64_t>() != kTuningDbSchema) return fmt::format("schema {}, expected {}", v.get<int64_t>(), kTuningDbSchema);
  return "";
}

FileRead parse_db_text(const std::string& text) {
  FileRead r;
  r.state = FileState::corrupt;
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    r.reason = j.is_discarded() ? "not valid JSON" : "not a JSON object";
    return r;
  }
  if (std::string why = schema_problem(j); !why.empty()) {
    r.reason = why;
    return r;
  }
  if (j.contains("device")) {
    auto d = DeviceFingerprint::from_json(j["device"]);
    if (!d) {
      r.reason = d.error().message;
      return r;
    }
    r.device = *d;
  }
  if (!j.contains("entries") || !j["entries"].is_array()) {
    r.reason = "no entries array";
    return r;
  }
  for (const json& e : j["entries"]) {
    auto entry = TuningEntry::from_json(e);
    if (!entry) {
      r.reason = entry.error().message;
      return r;
    }
    r.entries.insert_or_assign(entry->key, std::move(*entry));
  }
  r.state = FileState::ok;
  return r;
}

FileRead read_db_file(const fs::path& file) {
  FileRead r;
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0) return r;  // missing
  if (!S_ISREG(st.st_mode)) {
    r.state = FileState::corrupt;
    r.reason = S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file";
    return r;
  }
  auto text = read_file_bounded(file, kMaxTuningFileBytes, "tuning database");
  if (!text) {
    if (::lstat(file.c_str(), &st) != 0) return r;  // removed meanwhile
    r.state = FileState::corrupt;
    r.reason = text.error().message;
    return r;
  }
  return parse_db_text(*text);
}

json db_document(const DeviceFingerprint& device, const std::map<TuningKey, TuningEntry>& entries) {
  json arr = json::array();
  for (const auto& [k, e] : entries) arr.push_back(e.to_json());
  return {{"schema", kTuningDbSchema}, {"device", device.to_json()}, {"entries", std::move(arr)}};
}

std::string temp_suffix() {
  static std::atomic<uint64_t> n{0};
  return fmt::format(".tmp-{}-{}", ::getpid(), n.fetch_add(1));
}

// Writes `text` to a temp file beside `file`, flushes it and renames it into
// place; 0 or an errno. The caller holds the lock.
int replace_file(const fs::path& file, const std::string& text) {
  fs::path tmp = file;
  tmp += temp_suffix();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno;
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fdatasync(fd) != 0 && errno != EINVAL) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), file.c_str()) != 0) err = errno;
  if (err != 0) ::unlink(tmp.c_str());
  return err;
}

std::string now_utc();

// Sets a damaged file aside as <file>.corrupt-<UTC time>-<pid> (the caller
// holds the lock) so that it can be inspected, and the database continues
// without it. Returns the new name, or empty when it could not be moved.
fs::path set_aside(const fs::path& file, const std::string& reason) {
  std::string stamp = now_utc();
  stamp.erase(std::remove(stamp.begin(), stamp.end(), ':'), stamp.end());
  stamp.erase(std::remove(stamp.begin(), stamp.end(), '-'), stamp.end());
  fs::path aside = file;
  aside += fmt::format(".corrupt-{}-{}", stamp, ::getpid());
  if (::rename(file.c_str(), aside.c_str()) != 0) {
    warn(fmt::format("tuning database {} is damaged ({}) and could not be moved aside ({}); ignoring it",
                     file.string(), reason, errno_message(errno)));
    return {};
  }
  warn(fmt::format("tuning database {} is damaged ({}); moved to {} and continuing without it", file.string(),
                   reason, aside.string()));
  return aside;
}

// mkdir -p <dir>/tuning with mode 0700 for what it creates; 0 or an errno.
int make_tuning_dir(const fs::path& dir) {
  fs::path prefix;
  for (const fs::path& part : tuning_dir(dir)) {
    prefix /= part;
    if (::mkdir(prefix.c_str(), 0700) != 0) {
      const int err = errno;
      struct stat st {};
      if (::stat(prefix.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) continue;
        return ENOTDIR;
      }
      return err;
    }
  }
  return 0;
}

// Why <dir>/tuning must not be used, or "" (also when it does not exist yet):
// a symbolic link, or a directory of another user or writable by others.
std::string tuning_dir_problem(const fs::path& dir) {
  const fs::path t = tuning_dir(dir);
  struct stat st {};
  if (::lstat(t.c_str(), &st) != 0) return "";
  if (S_ISLNK(st.st_mode)) return fmt::format("the tuning directory {} is a symbolic link", t.string());
  if (!S_ISDIR(st.st_mode)) return "";  // nothing to read; make_tuning_dir reports ENOTDIR to writers
  if (auto ok = BinaryCache::check_private_dir(t); !ok) return ok.error().message;
  return "";
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------- fingerprint
json DeviceFingerprint::to_json() const {
  return {{"name", name},     {"sm", sm},         {"sm_count", sm_count}, {"memory_bytes", memory_bytes},
          {"driver", driver}, {"nvrtc", nvrtc}, {"lunajit", lunajit}};
}

Result<DeviceFingerprint> DeviceFingerprint::from_json(const json& j) {
  try {
    DeviceFingerprint d;
    d.name = j.at("name").get<std::string>();
    d.sm = integer_at<int>(j, "sm");
    d.sm_count = integer_at<int>(j, "sm_count");
    d.memory_bytes = integer_at<uint64_t>(j, "memory_bytes");
    d.driver = j.at("driver").get<std::string>();
    d.nvrtc = j.at("nvrtc").get<std::string>();
    d.lunajit = j.at("lunajit").get<std::string>();
    return d;
  } catch (const json::exception& e) {
    return Error::invalid(fmt::format("device fingerprint: {}", e.what()));
  }
}

std::string DeviceFingerprint::id() const {
  return fmt::format("{}-sm{}-{}", slug(name), sm, content_hash(to_json().dump()).substr(0, 8));
}

// ---------------------------------------------------------------- keys
int64_t round_up_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v && p <= (int64_t{1} << 61)) p <<= 1;
  return p;
}

bool valid_bucket(int64_t v) { return v >= 1 && v <= kMaxShapeBucket && (v & (v - 1)) == 0; }

ShapeBucket shape_bucket(int64_t batch, int64_t heads, int64_t seq, std::string dtype) {
  return {round_up_pow2(seq), round_up_pow2(batch * heads), std::move(dtype)};
}

std::string TuningKey::to_string() const {
  return fmt::format("{}/{}/seq{}/bh{}/{}", spec_hash, pass, bucket.seq, bucket.batch_heads, bucket.dtype);
}

json TuningEntry::to_json() const {
  json rows = json::array();
  for (const auto& r : timings)
    rows.push_back({{"config", r.config}, {"config_name", r.config_name}, {"ms", r.ms}, {"status", r.status}});
  json j = {{"key", key.to_string()},
            {"spec_hash", key.spec_hash},
            {"pass", key.pass},
            {"seq_bucket", key.bucket.seq},
            {"bh_bucket", key.bucket.batch_heads},
            {"dtype", key.bucket.dtype},
            {"config", config},
            {"config_name", config_name},
            {"method", method},
            {"timings", std::move(rows)},
            {"spec", spec},
            {"tuned_at", tuned_at},
            {"origin", origin}};
  if (origin == "imported") {
    j["imported_from"] = imported_from;
    j["imported_at"] = imported_at;
  }
  return j;
}

Result<TuningEntry> TuningEntry::from_json(const json& j) {
  if (!j.is_object()) return Error::invalid(fmt::format("tuning entry: {} is not an object", j.dump().substr(0, 60)));
  auto str = [&](const char* field, std::string& out, bool required) -> Status {
    if (!j.contains(field)) {
      if (required) return Error::invalid(fmt::format("tuning entry: no \"{}\"", field));
      return ok_status();
    }
    if (!j[field].is_string())
      return Error::invalid(fmt::format("tuning entry: \"{}\" is {}, not a string", field, j[field].dump().substr(0, 40)));
    out = j[field].get<std::string>();
    return ok_status();
  };
  auto bucket = [&](const char* field, int64_t& out) -> Status {
    if (!j.contains(field) || !j[field].is_number_integer() || !valid_bucket(j[field].get<int64_t>()))
      return Error::invalid(fmt::format("tuning entry: \"{}\" is {}; must be a power of two from 1 to {}", field,
                                        j.contains(field) ? j[field].dump().substr(0, 40) : "missing",
                                        kMaxShapeBucket));
    out = j[field].get<int64_t>();
    return ok_status();
  };
  TuningEntry e;
  for (auto st : {str("spec_hash", e.key.spec_hash, true), str("pass", e.key.pass, true),
                  bucket("seq_bucket", e.key.bucket.seq), bucket("bh_bucket", e.key.bucket.batch_heads),
                  str("dtype", e.key.bucket.dtype, true), str("config_name", e.config_name, true),
                  str("method", e.method, true), str("tuned_at", e.tuned_at, false), str("origin", e.origin, false),
                  str("imported_from", e.imported_from, false), str("imported_at", e.imported_at, false)})
    if (!st) return st.error();
  if (e.method != "measured" && e.method != "model-ranked")
    return Error::invalid(fmt::format("tuning entry: method \"{}\"; allowed: measured, model-ranked", e.method));
  if (e.origin != "local" && e.origin != "imported")
    return Error::invalid(fmt::format("tuning entry: origin \"{}\"; allowed: local, imported", e.origin));
  e.config = j.value("config", json());
  if (!e.config.is_object()) return Error::invalid("tuning entry: config is not an object");
  e.spec = j.contains("spec") && !j["spec"].is_null() ? j["spec"] : json::object();
  if (!e.spec.is_object()) return Error::invalid("tuning entry: spec is not an object");
  if (e.spec.contains("family") && !e.spec["family"].is_string())
    return Error::invalid(
        fmt::format("tuning entry: spec.family is {}, not a string", e.spec["family"].dump().substr(0, 40)));
  if (!j.contains("timings") || !j["timings"].is_array()) return Error::invalid("tuning entry: no timings array");
  for (const json& r : j["timings"]) {
    if (!r.is_object() || !r.contains("config") || !r.value("config_name", json()).is_string() ||
        !r.value("ms", json()).is_number() || !r.value("status", json()).is_string())
      return Error::invalid(fmt::format("tuning entry: timing row {} is not {{config, config_name, ms, status}}",
                                        r.dump().substr(0, 60)));
    e.timings.push_back({r["config"], r["config_name"].get<std::string>(), r["ms"].get<double>(),
                         r["status"].get<std::string>()});
  }
  return e;
}

std::string_view to_string(LookupKind k) {
  switch (k) {
    case LookupKind::exact: return "exact";
    case LookupKind::nearest: return "nearest";
    case LookupKind::none: return "none";
  }
  return "none";
}

const TuningEntry& preferred_entry(const TuningEntry& a, const TuningEntry& b) {
  const bool am = a.method == "measured", bm = b.method == "measured";
  const bool al = a.origin != "imported", bl = b.origin != "imported";
  // What an imported file claims (method, tuned_at) cannot outrank a
  // measurement made here.
  if ((am && al) != (bm && bl)) return (am && al) ? a : b;
  if (am != bm) return am ? a : b;
  if (al != bl) return al ? a : b;
  if (a.tuned_at != b.tuned_at) return a.tuned_at > b.tuned_at ? a : b;
  return a.config_name <= b.config_name ? a : b;
}

// ---------------------------------------------------------------- TuningDb
TuningDb::TuningDb(fs::path dir, DeviceFingerprint device)
    : dir_(dir.empty() ? BinaryCache::default_dir() : std::move(dir)), device_(std::move(device)) {
  file_ = tuning_dir(dir_) / (device_.id() + ".json");
  reload();
}

void TuningDb::reload() {
  if (std::string problem = tuning_dir_problem(dir_); !problem.empty()) {
    std::lock_guard g(mu_);
    if (!warned_)
      warn(fmt::format("not using the tuning databases: {}; tuning results are kept in memory for this process",
                       problem));
    warned_ = true;
    persistent_ = false;
    not_saved_ = problem;
    return;
  }
  FileRead r = read_db_file(file_);
  if (r.state == FileState::corrupt) {
    FileLock lock(tuning_dir(dir_) / ".lock");
    // Re-check under the lock: a writer may have replaced it since.
    FileRead again = read_db_file(file_);
    if (again.state == FileState::corrupt) {
      if (lock.locked()) set_aside(file_, again.reason);
      else
        warn(fmt::format("tuning database {} is damaged ({}); ignoring it", file_.string(), again.reason));
    }
    r = again.state == FileState::ok ? std::move(again) : FileRead{};
  }
  std::lock_guard g(mu_);
  // Entries stored only in memory (read-only directory) stay.
  if (persistent_) entries_ = std::move(r.entries);
  else
    for (auto& [k, e] : r.entries) entries_.emplace(k, std::move(e));
}

std::optional<TuningEntry> TuningDb::find(const TuningKey& key) const {
  std::lock_guard g(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  return std::nullopt;
}

TuningLookup TuningDb::lookup(const TuningKey& key) const {
  std::lock_guard g(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) return {LookupKind::exact, it->second};
  // Nearest bucket of the same spec, pass and dtype, in log2 steps; the map
  // iterates in key order, and ties keep the first (smaller seq, then smaller
  // batch x heads), so the answer depends on the file alone. Every stored
  // bucket is a power of two >= 1 (from_json), so distances are finite.
  const TuningEntry* best = nullptr;
  double best_distance = 0;
  const double key_seq = std::log2(double(std::max<int64_t>(key.bucket.seq, 1)));
  const double key_bh = std::log2(double(std::max<int64_t>(key.bucket.batch_heads, 1)));
  for (const auto& [k, e] : entries_) {
    if (k.spec_hash != key.spec_hash || k.pass != key.pass || k.bucket.dtype != key.bucket.dtype) continue;
    if (!valid_bucket(k.bucket.seq) || !valid_bucket(k.bucket.batch_heads)) continue;
    const double d = std::abs(std::log2(double(k.bucket.seq)) - key_seq) +
                     std::abs(std::log2(double(k.bucket.batch_heads)) - key_bh);
    const bool better = best == nullptr || d < best_distance ||
                        (d == best_distance && std::tie(k.bucket.seq, k.bucket.batch_heads) <
                                                   std::tie(best->key.bucket.seq, best->key.bucket.batch_heads));
    if (better) {
      best = &e;
      best_distance = d;
    }
  }
  if (best == nullptr) return {};
  return {LookupKind::nearest, *best};
}

std::vector<TuningEntry> TuningDb::entries() const {
  std::lock_guard g(mu_);
  std::vector<TuningEntry> out;
  for (const auto& [k, e] : entries_) out.push_back(e);
  return out;
}

std::string TuningDb::not_saved_reason() const {
  std::lock_guard g(mu_);
  return not_saved_;
}

Status TuningDb::store(const std::vector<TuningEntry>& new_entries) {
  std::vector<TuningEntry> stamped = new_entries;
  for (auto& e : stamped) {
    if (e.tuned_at.empty()) e.tuned_at = now_utc();
    if (!valid_bucket(e.key.bucket.seq) || !valid_bucket(e.key.bucket.batch_heads))
      return Error::invalid(fmt::format("tuning entry {}: buckets must be powers of two from 1 to {}",
                                        e.key.to_string(), kMaxShapeBucket));
  }
  auto keep_in_memory = [&](const std::string& why) {
    std::lock_guard g(mu_);
    for (const auto& e : stamped) entries_.insert_or_assign(e.key, e);
    if (!warned_)
      warn(fmt::format("cannot write the tuning database {} ({}); tuning results are kept in memory for this "
                       "process. Set LUNAJIT_CACHE_DIR to a writable directory.",
                       file_.string(), why));
    warned_ = true;
    persistent_ = false;
    not_saved_ = why;
    return ok_status();
  };
  if (!persistent_) return keep_in_memory(not_saved_reason());
  if (const int err = make_tuning_dir(dir_); err != 0) return keep_in_memory(errno_message(err));
  if (std::string problem = tuning_dir_problem(dir_); !problem.empty()) return keep_in_memory(problem);
  FileLock lock(tuning_dir(dir_) / ".lock");
  if (!lock.locked()) return keep_in_memory(lock.message());
  // Merge into what is on disk now (other processes' entries since our read).
  FileRead r = read_db_file(file_);
  if (r.state == FileState::corrupt) set_aside(file_, r.reason);
  std::map<TuningKey, TuningEntry> merged = r.state == FileState::ok ? std::move(r.entries)
                                                                      : std::map<TuningKey, TuningEntry>{};
  for (const auto& e : stamped) merged.insert_or_assign(e.key, e);
  if (const int err = replace_file(file_, db_document(device_, merged).dump(1)); err != 0)
    return keep_in_memory(errno_message(err));
  std::lock_guard g(mu_);
  entries_ = std::move(merged);
  return ok_status();
}

// ---------------------------------------------------------------- files
std::vector<TuningFile> list_tuning_files(const fs::path& dir) {
  std::vector<TuningFile> out;
  if (std::string problem = tuning_dir_problem(dir); !problem.empty()) {
    TuningFile f;
    f.file = tuning_dir(dir);
    f.problem = problem;
    out.push_back(std::move(f));
    return out;
  }
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(tuning_dir(dir), ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code sec;
    const auto type = it->symlink_status(sec).type();
    if (it->path().extension() != ".json" || type == fs::file_type::directory) continue;
    files.push_back(it->path());
  }
  for (const fs::path& file : files) {
    FileRead r = read_db_file(file);
    if (r.state == FileState::missing) continue;
    if (r.state == FileState::ok && !r.device) {
      r.state = FileState::corrupt;
      r.reason = "no device fingerprint";
    }
    if (r.state == FileState::corrupt) {
      TuningFile f;
      f.file = file;
      f.problem = r.reason;
      FileLock lock(tuning_dir(dir) / ".lock");
      FileRead again = read_db_file(file);  // a writer may have replaced it since
      if (again.state == FileState::corrupt && lock.locked()) f.moved_to = set_aside(file, again.reason);
      if (again.state != FileState::ok || !again.device) {
        out.push_back(std::move(f));
        continue;
      }
      r = std::move(again);
    }
    TuningFile f{*r.device, file, {}, {}, {}};
    for (auto& [k, e] : r.entries) f.entries.push_back(std::move(e));
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const TuningFile& a, const TuningFile& b) { return a.file < b.file; });
  return out;
}

json export_tuning(const fs::path& dir, std::vector<TuningFile>* damaged) {
  json dbs = json::array();
  for (TuningFile& f : list_tuning_files(dir)) {
    if (!f.problem.empty()) {
      if (damaged) damaged->push_back(std::move(f));
      continue;
    }
    json entries = json::array();
    for (const auto& e : f.entries) entries.push_back(e.to_json());
    dbs.push_back({{"device", f.device.to_json()}, {"entries", std::move(entries)}});
  }
  return {{"lunajit_tuning_export", 1}, {"databases", std::move(dbs)}};
}

namespace {

struct ImportDb {
  DeviceFingerprint device;
  std::vector<TuningEntry> entries;
};

Result<std::vector<ImportDb>> parse_export(const json& doc) {
  const std::string expected = "expected {\"lunajit_tuning_export\": 1, \"databases\": [...]}";
  if (!doc.is_object())
    return Error::invalid(fmt::format("import: the document is {}, not an object; {}", doc.type_name(), expected));
  if (!doc.contains("lunajit_tuning_export"))
    return Error::invalid("import: not a lunajit tuning export (no \"lunajit_tuning_export\"); " + expected);
  const json& version = doc["lunajit_tuning_export"];
  if (!version.is_number_integer() || version.get<int64_t>() != 1)
    return Error::invalid(fmt::format("import: \"lunajit_tuning_export\" is {}; this lunajit reads version 1 (the "
                                      "integer 1)",
                                      version.dump().substr(0, 40)));
  if (!doc.contains("databases") || !doc["databases"].is_array())
    return Error::invalid(fmt::format("import: \"databases\" is {}, not an array; {}",
                                      doc.contains("databases") ? doc["databases"].dump().substr(0, 40) : "missing",
                                      expected));
  std::vector<ImportDb> out;
  size_t i = 0;
  for (const json& db : doc["databases"]) {
    const std::string where = fmt::format("import: databases[{}]", i++);
    if (!db.is_object())
      return Error::invalid(fmt::format("{} is {}, not {{\"device\": ..., \"entries\": [...]}}", where,
                                        db.dump().substr(0, 40)));
    if (!db.contains("device") || !db["device"].is_object())
      return Error::invalid(where + ": no \"device\" object");
    auto device = DeviceFingerprint::from_json(db["device"]);
    if (!device) return Error::invalid(where + ": " + device.error().message);
    if (!db.contains("entries") || !db["entries"].is_array())
      return Error::invalid(where + ": \"entries\" is not an array");
    ImportDb d{*device, {}};
    size_t k = 0;
    for (const json& e : db["entries"]) {
      auto entry = TuningEntry::from_json(e);
      if (!entry) return Error::invalid(fmt::format("{}.entries[{}]: {}", where, k, entry.error().message));
      ++k;
      d.entries.push_back(std::move(*entry));
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

Result<TuningDbContents> parse_tuning_db(std::string_view text) {
  FileRead r = parse_db_text(std::string(text));
  if (r.state != FileState::ok) return Error::invalid("tuning database: " + r.reason);
  TuningDbContents c;
  c.device = r.device;
  for (auto& [key, entry] : r.entries) c.entries.push_back(std::move(entry));
  return c;
}

Status validate_tuning_export(const json& doc) {
  auto dbs = parse_export(doc);
  if (!dbs) return dbs.error();
  return ok_status();
}

Result<int> import_tuning(const fs::path& dir, const json& doc, const std::string& source) {
  // 1. The whole document, before anything is written.
  auto dbs = parse_export(doc);
  if (!dbs) return dbs.error();
  const std::string at = now_utc();
  for (ImportDb& db : *dbs)
    for (TuningEntry& e : db.entries) {
      // Provenance is this machine's account, not the file's claim.
      e.origin = "imported";
      e.imported_from = source;
      e.imported_at = at;
      if (e.tuned_at.empty()) e.tuned_at = at;
    }
  if (const int err = make_tuning_dir(dir); err != 0)
    return Error::failure(fmt::format("import: cannot create {}: {}", tuning_dir(dir).string(), errno_message(err)));
  if (std::string problem = tuning_dir_problem(dir); !problem.empty()) return Error::failure("import: " + problem);
  // 2. Every merge under the one lock of the tuning directory, so no other
  // writer interleaves; each file's old text is kept to restore it.
  FileLock lock(tuning_dir(dir) / ".lock");
  if (!lock.locked()) return Error::failure("import: " + lock.message());
  struct Planned {
    fs::path file;
    std::optional<std::string> old_text;  // nullopt: the file did not exist
    std::string new_text;
  };
  std::map<fs::path, Planned> plan;
  std::map<fs::path, std::pair<DeviceFingerprint, std::map<TuningKey, TuningEntry>>> merged;
  int changed = 0;
  for (const ImportDb& db : *dbs) {
    const fs::path file = tuning_dir(dir) / (db.device.id() + ".json");
    auto it = merged.find(file);
    if (it == merged.end()) {
      Planned p{file, std::nullopt, {}};
      FileRead r = read_db_file(file);
      if (r.state == FileState::corrupt) {
        set_aside(file, r.reason);
        r = FileRead{};
      } else if (r.state == FileState::ok) {
        if (auto text = read_file_bounded(file, kMaxTuningFileBytes, "tuning database")) p.old_text = *text;
      }
      plan.emplace(file, std::move(p));
      it = merged.emplace(file, std::make_pair(db.device, std::move(r.entries))).first;
    }
    auto& entries = it->second.second;
    for (const TuningEntry& e : db.entries) {
      auto have = entries.find(e.key);
      if (have == entries.end()) {
        entries.emplace(e.key, e);
        ++changed;
      } else if (&preferred_entry(have->second, e) == &e && have->second.to_json() != e.to_json()) {
        have->second = e;
        ++changed;
      }
    }
  }
  // 3. Write; on a failure put back what was written.
  std::vector<const Planned*> written;
  for (auto& [file, p] : plan) {
    p.new_text = db_document(merged[file].first, merged[file].second).dump(1);
    if (p.old_text && *p.old_text == p.new_text) continue;
    if (const int err = replace_file(file, p.new_text); err != 0) {
      for (const Planned* w : written) {
        if (w->old_text) replace_file(w->file, *w->old_text);
        else ::unlink(w->file.c_str());
      }
      return Error::failure(fmt::format("import: cannot write {}: {}; nothing was imported", file.string(),
                                        errno_message(err)));
    }
    written.push_back(&p);
  }
  return changed;
}

TuningClear clear_tuning(const fs::path& dir) {
  TuningClear res;
  std::error_code ec;
  FileLock lock(tuning_dir(dir) / ".lock");
  for (fs::directory_iterator it(tuning_dir(dir), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code sec;
    if (name == ".lock" || it->symlink_status(sec).type() == fs::file_type::directory) continue;
    const bool db = it->path().extension() == ".json";
    if (::unlink(it->path().c_str()) == 0) {
      if (db) ++res.removed;
    } else if (res.failed++ == 0) {
      res.first_error = errno;
    }
  }
  return res;
}

}  // namespace lunajit
