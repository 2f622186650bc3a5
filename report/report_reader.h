// Reading a report back for `lunajit report compare`: the JSON written by
// write_report (report/render.h), checked for every field the comparison
// reads, so a file that is not a lunajit report, or a report with a field
// missing or of the wrong type, is an error naming the file and the field
// (JSON pointer) instead of an exception from inside the renderer.
//
// No LLVM, runtime or GPU code: this and report/render.cpp, svg_chart.cpp form
// lunajit_report_read, which the fuzz build (tests/fuzz) links on its own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace lunajit::report {

// Largest report file `report compare` reads (a report of every arch, pass and
// many shapes is well under 1 MiB).
inline constexpr std::uintmax_t kMaxReportFileBytes = 64ull << 20;

// Parses one report's text and checks it; `name` (the file name) labels errors.
Result<nlohmann::json> parse_report(std::string_view text, const std::string& name);
// Reads a report file (a regular file of at most kMaxReportFileBytes), then parse_report.
Result<nlohmann::json> read_report_file(const std::filesystem::path& path);

}  // namespace lunajit::report
