#include "apps/cache_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/binary_cache.h"
#include "cache/tuning_db.h"
#include "common/read_file.h"

namespace lunajit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CacheArgs {
  std::string action;
  std::string file;
  bool json = false;
};

int fail(const std::string& msg, int code) {
  std::fprintf(stderr, "lunajit: %s\n", msg.c_str());
  return code;
}

int fail(const Error& e) { return fail(e.message, e.kind == ErrorKind::invalid_argument ? 2 : 1); }

// Damaged tuning databases, on stderr: what was wrong and where it went.
void report_damaged(const std::vector<TuningFile>& files) {
  for (const auto& f : files) {
    if (f.problem.empty()) continue;
    std::fprintf(stderr, "lunajit: warning: damaged tuning database %s (%s)%s\n", f.file.string().c_str(),
                 f.problem.c_str(),
                 f.moved_to.empty() ? "" : fmt::format("; moved to {}", f.moved_to.string()).c_str());
  }
}

// Writes `text` to `target`: a regular file (or a new one) through a temp file
// in the same directory renamed over it, so a failure leaves the old file; a
// device or FIFO (/dev/stdout, /dev/full) directly. Every write is checked.
Status write_output(const fs::path& target, const std::string& text) {
  auto write_all = [&](int fd) -> int {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      done += static_cast<size_t>(n);
    }
    return 0;
  };
  fs::path real = target;
  std::error_code ec;
  if (fs::is_symlink(target, ec)) real = fs::weakly_canonical(target, ec);
  struct stat st {};
  if (::stat(real.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) return Error::invalid(fmt::format("cache export: {} is a directory", target.string()));
    const int fd = ::open(real.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Error::failure(fmt::format("cache export: cannot open {}: {}", target.string(), errno_message(errno)));
    int err = write_all(fd);
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) return Error::failure(fmt::format("cache export: cannot write {}: {}", target.string(), errno_message(err)));
    return ok_status();
  }
  const fs::path dir = real.has_parent_path() ? real.parent_path() : fs::path(".");
  const fs::path tmp = dir / fmt::format(".{}.tmp-{}", real.filename().string(), ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return Error::failure(fmt::format("cache export: cannot write {}: cannot create a temp file in {}: {}",
                                      target.string(), dir.string(), errno_message(errno)));
  int err = write_all(fd);
  if (err == 0 && ::fsync(fd) != 0 && errno != EINVAL) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), real.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return Error::failure(fmt::format("cache export: cannot write {}: {} (the previous file, if any, is unchanged)",
                                      target.string(), errno_message(err)));
  }
  return ok_status();
}

int run_cache(const CacheArgs& a) {
  if (auto st = BinaryCache::check_environment(); !st) return fail(st.error());
  const auto dir = BinaryCache::default_dir();
  if (a.action == "stats") {
    BinaryCache cache(dir);
    const CacheUsage u = cache.usage();
    size_t entries = 0, dbs = 0;
    const auto files = list_tuning_files(dir);
    report_damaged(files);
    json damaged = json::array();
    for (const auto& f : files) {
      if (!f.problem.empty()) {
        damaged.push_back({{"file", f.file.string()}, {"problem", f.problem}, {"moved_to", f.moved_to.string()}});
        continue;
      }
      entries += f.entries.size();
      ++dbs;
    }
    if (a.json) {
      std::puts(json{{"dir", dir.string()},
                     {"writable", cache.writable()},
                     {"binaries",
                      {{"entries", u.entries},
                       {"bytes", u.bytes},
                       {"max_bytes", cache.max_bytes()},
                       {"foreign_files", u.foreign},
                       {"foreign_examples", u.foreign_examples}}},
                     {"tuning", {{"databases", dbs}, {"entries", entries}, {"damaged", damaged}}}}
                    .dump(2)
                    .c_str());
    } else {
      std::printf("cache directory  %s%s\n", dir.string().c_str(),
                  !cache.persistent() ? " (not usable)" : cache.writable() ? "" : " (read-only)");
      std::printf("compiled kernels %llu entries, %.1f MiB of %.0f MiB (LUNAJIT_CACHE_MAX_MB)\n",
                  static_cast<unsigned long long>(u.entries), u.bytes / 1048576.0, cache.max_bytes() / 1048576.0);
      if (u.foreign > 0) {
        std::printf("                 %llu file(s) that are not usable entries (never read):\n",
                    static_cast<unsigned long long>(u.foreign));
        for (const auto& ex : u.foreign_examples) std::printf("                   %s\n", ex.c_str());
      }
      std::printf("tuning           %zu entries in %zu device database(s)\n", entries, dbs);
      for (const auto& f : files) {
        if (f.problem.empty())
          std::printf("  %-40s %4zu entries  %s\n", f.device.name.c_str(), f.entries.size(), f.file.string().c_str());
        else
          std::printf("  damaged: %s (%s)%s\n", f.file.string().c_str(), f.problem.c_str(),
                      f.moved_to.empty() ? "" : fmt::format(", moved to {}", f.moved_to.filename().string()).c_str());
      }
    }
    return 0;
  }
  if (a.action == "ls") {
    json out = json::array();
    const auto files = list_tuning_files(dir);
    report_damaged(files);
    for (const auto& f : files) {
      if (!f.problem.empty()) continue;
      if (!a.json) std::printf("== %s (sm_%d, driver %s) %s\n", f.device.name.c_str(), f.device.sm,
                               f.device.driver.c_str(), f.file.filename().string().c_str());
      for (const auto& e : f.entries) {
        // from_json made sure a family, when present, is a string.
        const std::string family = e.spec.is_object() && e.spec.contains("family") && e.spec["family"].is_string()
                                       ? e.spec["family"].get<std::string>()
                                       : "?";
        if (a.json) {
          json j = e.to_json();
          j.erase("timings");
          j["device"] = f.device.name;
          out.push_back(std::move(j));
        } else {
          std::printf("  %-10s %s %-9s seq %-10lld bh %-10lld %-5s %-30s %s, %s (%zu candidates)\n", family.c_str(),
                      e.key.spec_hash.substr(0, 8).c_str(), e.key.pass.c_str(),
                      static_cast<long long>(e.key.bucket.seq), static_cast<long long>(e.key.bucket.batch_heads),
                      e.key.bucket.dtype.c_str(), e.config_name.c_str(), e.method.c_str(),
                      e.origin == "imported" ? ("imported from " + e.imported_from).c_str() : "local",
                      e.timings.size());
        }
      }
    }
    if (a.json) std::puts(out.dump(2).c_str());
    return 0;
  }
  if (a.action == "clear") {
    BinaryCache cache(dir);
    const ClearResult bins = cache.clear();
    const TuningClear dbs = clear_tuning(dir);
    std::printf("removed %llu compiled kernels and %d tuning database(s) from %s\n",
                static_cast<unsigned long long>(bins.removed), dbs.removed, dir.string().c_str());
    int code = 0;
    if (bins.failed > 0)
      code = fail(fmt::format("cache clear: could not remove {} compiled kernel entr{} ({})", bins.failed,
                              bins.failed == 1 ? "y" : "ies", errno_message(bins.first_error)),
                  1);
    if (dbs.failed > 0)
      code = fail(fmt::format("cache clear: could not remove {} tuning file(s) ({})", dbs.failed,
                              errno_message(dbs.first_error)),
                  1);
    return code;
  }
  if (a.file.empty()) return fail(fmt::format("cache {}: FILE is required", a.action), 2);
  if (a.action == "export") {
    // Collect first: nothing touches FILE until the document is complete.
    std::vector<TuningFile> damaged;
    const json doc = export_tuning(dir, &damaged);
    report_damaged(damaged);
    if (auto st = write_output(a.file, doc.dump(1) + "\n"); !st) return fail(st.error());
    size_t n = 0;
    for (const auto& db : doc["databases"]) n += db["entries"].size();
    std::printf("exported %zu entries of %zu database(s) to %s%s\n", n, doc["databases"].size(), a.file.c_str(),
                damaged.empty() ? "" : fmt::format(" ({} damaged database(s) left out)", damaged.size()).c_str());
    return 0;
  }
  // import
  auto text = read_file_bounded(a.file, kMaxTuningFileBytes, "cache import: file");
  if (!text) return fail(text.error().message, 2);
  const json doc = json::parse(*text, nullptr, false);
  if (doc.is_discarded()) return fail(fmt::format("cache import: {} is not valid JSON", a.file), 2);
  auto n = import_tuning(dir, doc, fs::path(a.file).filename().string());
  if (!n) return fail("cache " + n.error().message, n.error().kind == ErrorKind::invalid_argument ? 2 : 1);
  std::printf("imported %s: %d entries added or replaced\n", a.file.c_str(), *n);
  return 0;
}

}  // namespace

Status check_cache_environment() { return BinaryCache::check_environment(); }

Subcommand add_cache_command(CLI::App& app) {
  auto args = std::make_shared<CacheArgs>();
  auto* cmd = app.add_subcommand("cache", "inspect or manage the kernel cache and the tuning databases");
  cmd->add_option("ACTION", args->action, "stats | ls | clear | export | import")
      ->required()
      ->check(CLI::IsMember({"stats", "ls", "clear", "export", "import"}));
  cmd->add_option("FILE", args->file, "export/import: the JSON file");
  cmd->add_flag("--json", args->json, "machine-readable output");
  return {cmd, [args] { return run_cache(*args); }};
}

}  // namespace lunajit
