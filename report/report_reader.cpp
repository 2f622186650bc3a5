#include "report/report_reader.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "report/kernel_report.h"

namespace lunajit::report {
namespace {

using nlohmann::json;

// Checks one field of a report against what the comparison reads from it.
class Checker {
 public:
  explicit Checker(const std::string& name) : name_(name) {}

  Status object(const json& j, const std::string& where) const {
    if (!j.is_object()) return bad(where, j, "an object");
    return ok_status();
  }
  Status array(const json& j, const std::string& where) const {
    if (!j.is_array()) return bad(where, j, "an array");
    return ok_status();
  }
  // A member that must be present, of the kind `test` accepts.
  template <class Test>
  Status member(const json& parent, const std::string& where, const char* key, Test test, const char* kind) const {
    const std::string path = where + "/" + key;
    auto it = parent.find(key);
    if (it == parent.end()) return Error::invalid(fmt::format("report compare: {}: {}: missing", name_, path));
    if (!test(*it)) return bad(path, *it, kind);
    return ok_status();
  }
  Status string(const json& p, const std::string& w, const char* key) const {
    return member(p, w, key, [](const json& v) { return v.is_string(); }, "a string");
  }
  Status integer(const json& p, const std::string& w, const char* key) const {
    return member(
        p, w, key,
        [](const json& v) {
          if (v.is_number_unsigned()) return v.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<int>::max());
          return v.is_number_integer() && v.get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                 v.get<std::int64_t>() <= std::numeric_limits<int>::max();
        },
        "an integer in the range of int");
  }

 private:
  Status bad(const std::string& where, const json& v, const char* kind) const {
    std::string got = v.dump();
    if (got.size() > 80) got = got.substr(0, 77) + "...";
    return Error::invalid(fmt::format("report compare: {}: {} = {}: expected {}", name_, where.empty() ? "/" : where,
                                      got, kind));
  }
  const std::string& name_;
};

#define LUNAJIT_CHECK(expr)                          \
  do {                                               \
    if (auto st_ = (expr); !st_) return st_.error(); \
  } while (0)

// Every field render_compare_markdown / render_compare_html read without a
// null check (report/render.cpp: summary lines, compare_table, time_charts).
Status check_report(const json& j, const Checker& c) {
  LUNAJIT_CHECK(c.string(j, "", "spec_hash"));
  LUNAJIT_CHECK(c.member(j, "", "generator", [](const json& v) { return v.is_object(); }, "an object"));
  LUNAJIT_CHECK(c.string(j["generator"], "/generator", "created_utc"));
  LUNAJIT_CHECK(c.member(j, "", "machine", [](const json& v) { return v.is_object(); }, "an object"));
  LUNAJIT_CHECK(c.string(j["machine"], "/machine", "mode"));
  LUNAJIT_CHECK(c.member(j["machine"], "/machine", "device", [](const json&) { return true; }, "any value"));
  LUNAJIT_CHECK(c.member(j, "", "archs", [](const json& v) { return v.is_array(); }, "an array"));
  const json& archs = j["archs"];
  for (size_t i = 0; i < archs.size(); ++i) {
    const std::string w = fmt::format("/archs/{}", i);
    LUNAJIT_CHECK(c.object(archs[i], w));
    LUNAJIT_CHECK(c.string(archs[i], w, "arch"));
  }
  LUNAJIT_CHECK(c.member(j, "", "kernels", [](const json& v) { return v.is_array(); }, "an array"));
  const json& kernels = j["kernels"];
  for (size_t i = 0; i < kernels.size(); ++i) {
    const json& k = kernels[i];
    const std::string w = fmt::format("/kernels/{}", i);
    LUNAJIT_CHECK(c.object(k, w));
    LUNAJIT_CHECK(c.string(k, w, "pass"));
    if (k["pass"] != "feature_map")
      LUNAJIT_CHECK(c.member(k, w, "causal", [](const json& v) { return v.is_boolean(); }, "true or false"));
    LUNAJIT_CHECK(c.string(k, w, "kernel"));
    LUNAJIT_CHECK(c.string(k, w, "arch"));
    LUNAJIT_CHECK(c.member(k, w, "gpu", [](const json& v) { return v.is_null() || v.is_string(); },
                           "a string or null"));
    LUNAJIT_CHECK(c.member(k, w, "shape", [](const json& v) { return v.is_object(); }, "an object"));
    for (const char* dim : {"batch", "heads", "seq"}) LUNAJIT_CHECK(c.integer(k["shape"], w + "/shape", dim));
  }
  return ok_status();
}

}  // namespace

Result<json> parse_report(std::string_view text, const std::string& name) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error::invalid(fmt::format("report compare: {} is not valid JSON", name));
  if (!j.is_object() || !j.contains("schema") || j["schema"] != "lunajit.report")
    return Error::invalid(
        fmt::format("report compare: {} is not a lunajit report (schema != \"lunajit.report\")", name));
  if (!j.contains("schema_version") || j["schema_version"] != kReportSchemaVersion)
    return Error::invalid(fmt::format("report compare: {} has schema_version {}; this lunajit reads version {}", name,
                                      j.contains("schema_version") ? j["schema_version"].dump() : "(missing)",
                                      kReportSchemaVersion));
  const Checker checker(name);
  if (auto st = check_report(j, checker); !st) return st.error();
  return j;
}

Result<json> read_report_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    return Error::invalid(fmt::format("report compare: cannot read {}: {}", path.string(),
                                      ec ? ec.message() : "no such file"));
  if (!std::filesystem::is_regular_file(status))
    return Error::invalid(fmt::format("report compare: {} is not a regular file (expected a report.json)",
                                      path.string()));
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxReportFileBytes)
    return Error::invalid(fmt::format("report compare: {} is {} bytes; a report is at most {} bytes", path.string(),
                                      size, kMaxReportFileBytes));
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error::invalid(fmt::format("report compare: cannot read {}", path.string()));
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_report(ss.str(), path.string());
}

}  // namespace lunajit::report
