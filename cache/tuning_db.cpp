// TuningDb: JSON files per device fingerprint, merged under a lock and
// replaced by rename. Format and protocol: cache/tuning_db.h.
#include "cache/tuning_db.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "cache/binary_cache.h"
#include "cache/file_lock.h"
#include "common/hash.h"

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

enum class FileState { missing, ok, corrupt };

struct FileRead {
  FileState state = FileState::missing;
  std::map<TuningKey, TuningEntry> entries;
  std::optional<DeviceFingerprint> device;
  std::string reason;
};

FileRead read_db_file(const fs::path& file) {
  FileRead r;
  std::ifstream in(file, std::ios::binary);
  if (!in) return r;
  std::stringstream ss;
  ss << in.rdbuf();
  auto parsed = parse_tuning_db(ss.str());
  if (!parsed) {
    r.state = FileState::corrupt;
    r.reason = parsed.error().message;
    return r;
  }
  r.device = std::move(parsed->device);
  for (auto& e : parsed->entries) r.entries.insert_or_assign(e.key, std::move(e));
  r.state = FileState::ok;
  return r;
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
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
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

// Sets a damaged file aside (the caller holds the lock) so that it can be
// inspected, and the database continues empty.
void set_aside(const fs::path& file, const std::string& reason) {
  fs::path aside = file;
  aside += fmt::format(".corrupt-{}", ::getpid());
  warn(fmt::format("tuning database {} is damaged ({}); moved to {} and starting empty", file.string(), reason,
                   aside.string()));
  ::rename(file.c_str(), aside.c_str());
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// j.at(key) as an integer of type T. nlohmann's get<int>() converts a float
// such as 1e82 with undefined behaviour and wraps 2^32 + 64 to 64; both are
// errors here. Throws json::exception (out_of_range 401), as j.at() does.
template <class T>
T integer_at(const json& j, const char* key) {
  const json& v = j.at(key);
  const bool ok = v.is_number_unsigned() ? std::in_range<T>(v.get<uint64_t>())
                                          : v.is_number_integer() && std::in_range<T>(v.get<int64_t>());
  if (!ok)
    throw json::out_of_range::create(401, fmt::format("{} = {}: expected an integer in [{}, {}]", key, v.dump(),
                                                      std::numeric_limits<T>::min(), std::numeric_limits<T>::max()),
                                     &v);
  return v.get<T>();
}

}  // namespace

// ---------------------------------------------------------------- file contents
Result<TuningDbContents> parse_tuning_db(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error::invalid("not valid JSON");
  const json schema = j.contains("schema") ? j["schema"] : json();
  if (!schema.is_number_integer() || schema != kTuningDbSchema)
    return Error::invalid(fmt::format("schema {}, expected {}", j.contains("schema") ? schema.dump() : "(missing)",
                                      kTuningDbSchema));
  TuningDbContents out;
  if (j.contains("device")) {
    auto d = DeviceFingerprint::from_json(j["device"]);
    if (!d) return d.error();
    out.device = *d;
  }
  if (!j.contains("entries") || !j["entries"].is_array()) return Error::invalid("no entries array");
  for (const json& e : j["entries"]) {
    auto entry = TuningEntry::from_json(e);
    if (!entry) return entry.error();
    out.entries.push_back(std::move(*entry));
  }
  return out;
}

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
  while (p < v) p <<= 1;
  return p;
}

ShapeBucket shape_bucket(int64_t batch, int64_t heads, int64_t seq, std::string dtype) {
  return {static_cast<int>(round_up_pow2(seq)), static_cast<int>(round_up_pow2(batch * heads)), std::move(dtype)};
}

std::string TuningKey::to_string() const {
  return fmt::format("{}/{}/seq{}/bh{}/{}", spec_hash, pass, bucket.seq, bucket.batch_heads, bucket.dtype);
}

json TuningEntry::to_json() const {
  json rows = json::array();
  for (const auto& r : timings)
    rows.push_back({{"config", r.config}, {"config_name", r.config_name}, {"ms", r.ms}, {"status", r.status}});
  return {{"key", key.to_string()},
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
          {"tuned_at", tuned_at}};
}

Result<TuningEntry> TuningEntry::from_json(const json& j) {
  try {
    TuningEntry e;
    e.key.spec_hash = j.at("spec_hash").get<std::string>();
    e.key.pass = j.at("pass").get<std::string>();
    e.key.bucket.seq = integer_at<int>(j, "seq_bucket");
    e.key.bucket.batch_heads = integer_at<int>(j, "bh_bucket");
    e.key.bucket.dtype = j.at("dtype").get<std::string>();
    e.config = j.at("config");
    e.config_name = j.at("config_name").get<std::string>();
    e.method = j.at("method").get<std::string>();
    for (const json& r : j.at("timings"))
      e.timings.push_back({r.at("config"), r.at("config_name").get<std::string>(), r.at("ms").get<double>(),
                           r.at("status").get<std::string>()});
    e.spec = j.value("spec", json::object());
    e.tuned_at = j.value("tuned_at", "");
    if (!e.config.is_object()) return Error::invalid("tuning entry: config is not an object");
    return e;
  } catch (const json::exception& ex) {
    return Error::invalid(fmt::format("tuning entry: {}", ex.what()));
  }
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
  if (am != bm) return am ? a : b;
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
  FileRead r = read_db_file(file_);
  if (r.state == FileState::corrupt) {
    FileLock lock(tuning_dir(dir_) / ".lock");
    // Re-check under the lock: a writer may have replaced it since.
    FileRead again = read_db_file(file_);
    if (again.state == FileState::corrupt && lock.locked()) set_aside(file_, again.reason);
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
  // batch x heads), so the answer depends on the file alone.
  const TuningEntry* best = nullptr;
  double best_distance = 0;
  for (const auto& [k, e] : entries_) {
    if (k.spec_hash != key.spec_hash || k.pass != key.pass || k.bucket.dtype != key.bucket.dtype) continue;
    const double d = std::abs(std::log2(double(k.bucket.seq)) - std::log2(double(key.bucket.seq))) +
                     std::abs(std::log2(double(k.bucket.batch_heads)) - std::log2(double(key.bucket.batch_heads)));
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

Status TuningDb::store(const std::vector<TuningEntry>& new_entries) {
  std::vector<TuningEntry> stamped = new_entries;
  for (auto& e : stamped)
    if (e.tuned_at.empty()) e.tuned_at = now_utc();
  auto keep_in_memory = [&](const std::string& why) {
    std::lock_guard g(mu_);
    for (const auto& e : stamped) entries_.insert_or_assign(e.key, e);
    if (!warned_)
      warn(fmt::format("cannot write the tuning database {} ({}); tuning results are kept in memory for this "
                       "process. Set LUNAJIT_CACHE_DIR to a writable directory.",
                       file_.string(), why));
    warned_ = true;
    persistent_ = false;
    return ok_status();
  };
  if (!persistent_) return keep_in_memory("read-only earlier");
  std::error_code ec;
  fs::create_directories(tuning_dir(dir_), ec);
  if (ec) return keep_in_memory(ec.message());
  FileLock lock(tuning_dir(dir_) / ".lock");
  if (!lock.locked()) return keep_in_memory(std::error_code(lock.error(), std::generic_category()).message());
  // Merge into what is on disk now (other processes' entries since our read).
  FileRead r = read_db_file(file_);
  if (r.state == FileState::corrupt) set_aside(file_, r.reason);
  std::map<TuningKey, TuningEntry> merged = r.state == FileState::ok ? std::move(r.entries)
                                                                      : std::map<TuningKey, TuningEntry>{};
  for (const auto& e : stamped) merged.insert_or_assign(e.key, e);
  if (const int err = replace_file(file_, db_document(device_, merged).dump(1)); err != 0)
    return keep_in_memory(std::error_code(err, std::generic_category()).message());
  std::lock_guard g(mu_);
  entries_ = std::move(merged);
  return ok_status();
}

// ---------------------------------------------------------------- files
std::vector<TuningFile> list_tuning_files(const fs::path& dir) {
  std::vector<TuningFile> out;
  std::error_code ec;
  for (fs::directory_iterator it(tuning_dir(dir), ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file() || it->path().extension() != ".json") continue;
    FileRead r = read_db_file(it->path());
    if (r.state != FileState::ok || !r.device) continue;
    TuningFile f{*r.device, it->path(), {}};
    for (auto& [k, e] : r.entries) f.entries.push_back(std::move(e));
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const TuningFile& a, const TuningFile& b) { return a.file < b.file; });
  return out;
}

json export_tuning(const fs::path& dir) {
  json dbs = json::array();
  for (const TuningFile& f : list_tuning_files(dir)) {
    json entries = json::array();
    for (const auto& e : f.entries) entries.push_back(e.to_json());
    dbs.push_back({{"device", f.device.to_json()}, {"entries", std::move(entries)}});
  }
  return {{"lunajit_tuning_export", 1}, {"databases", std::move(dbs)}};
}

Result<int> import_tuning(const fs::path& dir, const json& doc) {
  if (!doc.is_object() || !doc.contains("lunajit_tuning_export") || doc["lunajit_tuning_export"] != 1 ||
      !doc.contains("databases"))
    return Error::invalid("import: not a lunajit tuning export (expected {\"lunajit_tuning_export\": 1, ...})");
  auto shown = [](const json& v) {
    std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  };
  const json& databases = doc["databases"];
  if (!databases.is_array())
    return Error::invalid(fmt::format("import: databases = {}: expected an array of {{\"device\": ..., \"entries\": [...]}}",
                                      shown(databases)));
  // Every database and entry is read before any is stored: a bad one imports nothing.
  std::vector<std::pair<DeviceFingerprint, std::vector<TuningEntry>>> parsed;
  for (size_t i = 0; i < databases.size(); ++i) {
    const json& db = databases[i];
    if (!db.is_object())
      return Error::invalid(fmt::format("import: databases[{}] = {}: expected an object {{\"device\": ..., \"entries\": [...]}}",
                                        i, shown(db)));
    auto device = DeviceFingerprint::from_json(db.contains("device") ? db["device"] : json::object());
    if (!device) return device.error();
    const json entries = db.contains("entries") ? db["entries"] : json::array();
    if (!entries.is_array())
      return Error::invalid(fmt::format("import: databases[{}].entries = {}: expected an array", i, shown(entries)));
    std::vector<TuningEntry> incoming;
    for (const json& e : entries) {
      auto entry = TuningEntry::from_json(e);
      if (!entry) return entry.error();
      incoming.push_back(std::move(*entry));
    }
    parsed.emplace_back(std::move(*device), std::move(incoming));
  }
  int changed = 0;
  for (const auto& [device, incoming] : parsed) {
    TuningDb target(dir, device);
    std::vector<TuningEntry> winners;
    for (const auto& e : incoming) {
      auto have = target.find(e.key);
      if (!have || (&preferred_entry(*have, e) == &e && have->to_json() != e.to_json())) winners.push_back(e);
    }
    changed += static_cast<int>(winners.size());
    if (!winners.empty())
      if (auto st = target.store(winners); !st) return st.error();
  }
  return changed;
}

int clear_tuning(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  FileLock lock(tuning_dir(dir) / ".lock");
  for (fs::directory_iterator it(tuning_dir(dir), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_regular_file() && name != ".lock" && ::unlink(it->path().c_str()) == 0 &&
        it->path().extension() == ".json")
      ++n;
  }
  return n;
}

}  // namespace lunajit
