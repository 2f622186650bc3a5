#include "apps/cache_command.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/binary_cache.h"
#include "cache/tuning_db.h"

namespace lunajit {
namespace {

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

int run_cache(const CacheArgs& a) {
  const auto dir = BinaryCache::default_dir();
  if (a.action == "stats") {
    BinaryCache cache(dir);
    const CacheUsage u = cache.usage();
    size_t entries = 0;
    const auto files = list_tuning_files(dir);
    for (const auto& f : files) entries += f.entries.size();
    if (a.json) {
      std::puts(json{{"dir", dir.string()},
                     {"binaries", {{"entries", u.entries}, {"bytes", u.bytes}, {"max_bytes", cache.max_bytes()}}},
                     {"tuning", {{"databases", files.size()}, {"entries", entries}}}}
                    .dump(2)
                    .c_str());
    } else {
      std::printf("cache directory  %s%s\n", dir.string().c_str(), cache.persistent() ? "" : " (not writable)");
      std::printf("compiled kernels %llu entries, %.1f MiB of %.0f MiB (LUNAJIT_CACHE_MAX_MB)\n",
                  static_cast<unsigned long long>(u.entries), u.bytes / 1048576.0, cache.max_bytes() / 1048576.0);
      std::printf("tuning           %zu entries in %zu device database(s)\n", entries, files.size());
      for (const auto& f : files)
        std::printf("  %-40s %4zu entries  %s\n", f.device.name.c_str(), f.entries.size(), f.file.string().c_str());
    }
    return 0;
  }
  if (a.action == "ls") {
    json out = json::array();
    for (const auto& f : list_tuning_files(dir)) {
      if (!a.json) std::printf("== %s (sm_%d, driver %s) %s\n", f.device.name.c_str(), f.device.sm,
                               f.device.driver.c_str(), f.file.filename().string().c_str());
      for (const auto& e : f.entries) {
        const std::string family = e.spec.is_object() ? e.spec.value("family", "?") : "?";
        if (a.json) {
          json j = e.to_json();
          j.erase("timings");
          j["device"] = f.device.name;
          out.push_back(std::move(j));
        } else {
          std::printf("  %-10s %s %-9s seq %-6d bh %-5d %-5s %-30s %s (%zu candidates)\n", family.c_str(),
                      e.key.spec_hash.substr(0, 8).c_str(), e.key.pass.c_str(), e.key.bucket.seq,
                      e.key.bucket.batch_heads, e.key.bucket.dtype.c_str(), e.config_name.c_str(), e.method.c_str(),
                      e.timings.size());
        }
      }
    }
    if (a.json) std::puts(out.dump(2).c_str());
    return 0;
  }
  if (a.action == "clear") {
    BinaryCache cache(dir);
    const uint64_t bins = cache.clear();
    const int dbs = clear_tuning(dir);
    std::printf("removed %llu compiled kernels and %d tuning database(s) from %s\n",
                static_cast<unsigned long long>(bins), dbs, dir.string().c_str());
    return 0;
  }
  if (a.file.empty()) return fail(fmt::format("cache {}: FILE is required", a.action), 2);
  if (a.action == "export") {
    std::ofstream out(a.file);
    if (!out) return fail(fmt::format("cache export: cannot write {}", a.file), 1);
    const json doc = export_tuning(dir);
    out << doc.dump(1) << "\n";
    size_t n = 0;
    for (const auto& db : doc["databases"]) n += db["entries"].size();
    std::printf("exported %zu entries of %zu database(s) to %s\n", n, doc["databases"].size(), a.file.c_str());
    return 0;
  }
  // import
  std::ifstream in(a.file);
  if (!in) return fail(fmt::format("cache import: cannot read {}", a.file), 2);
  std::stringstream ss;
  ss << in.rdbuf();
  const json doc = json::parse(ss.str(), nullptr, false);
  if (doc.is_discarded()) return fail(fmt::format("cache import: {} is not valid JSON", a.file), 2);
  auto n = import_tuning(dir, doc);
  if (!n) return fail("cache " + n.error().message, 2);
  std::printf("imported %s: %d entries added or replaced\n", a.file.c_str(), *n);
  return 0;
}

}  // namespace

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
