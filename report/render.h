// Renderings of a report's JSON (report/kernel_report.h): Markdown, one
// self-contained HTML page with inline SVG charts (no script, no external
// file), and the side-by-side comparison of several reports.
//
// Both renderings print every number of the kernel table from the JSON through
// format_number, in the columns of kernel_table_columns(), one row per entry of
// "kernels" in order; tests re-read the cells and compare them with the JSON.
//
// HTML layout (fixed, so a screenshot test knows where the charts are): a
// header band of kHeaderHeight pixels, the hardware-comparison summary
// (report/summary.h) in a block of summary_html_height pixels, then the charts
// in a grid of two columns, each an SVG of kChartWidth x kChartHeight with
// kChartGap between them, starting at (kChartsLeft, kHeaderHeight +
// summary_html_height): per causal variant the layer time (fwd + bwd) with the
// baselines and the crossover, per (pass, causal) the time by sequence length
// (forward and backward with their baselines) and, only where something was
// measured, the roofline fraction by sequence length; then one resource chart
// per arch; then the tables. Sequence axes are log 2.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace lunajit::report {

// The value at a JSON pointer (e.g. "/config/tile"), or null when `j` is not an
// object or has nothing there: readers of reports use it for optional fields.
const nlohmann::json& json_at(const nlohmann::json& j, const char* pointer);

inline constexpr int kHeaderHeight = 150;
inline constexpr int kChartsLeft = 20;
inline constexpr int kChartWidth = 580;
inline constexpr int kChartHeight = 340;
inline constexpr int kChartGap = 10;

// Series colours: arch i of the report takes kSeriesColors[i % 6]; resource
// bars are registers kSeriesColors[0], shared memory [1], occupancy [2].
inline constexpr const char* kSeriesColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
inline constexpr const char* kResourceColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c"};

// Integers (as JSON stores byte and FLOP counts) in full, other numbers with 4
// significant digits; "-" for null.
std::string format_number(const nlohmann::json& v);

struct TableColumn {
  const char* header;
  const char* pointer;  // JSON pointer into one "kernels" entry
  bool numeric;
};
// The kernel table's columns, in order.
const std::vector<TableColumn>& kernel_table_columns();
// The text of one cell: numbers through format_number; "/shape" as "B,H,N";
// "/causal" as "causal" / "non-causal"; null or absent as "-".
std::string cell_text(const nlohmann::json& kernel, const TableColumn& column);

std::string render_markdown(const nlohmann::json& report);
std::string render_html(const nlohmann::json& report);

// Writes report.json, report.md and report.html into `dir` (created if needed).
Status write_report(const nlohmann::json& report, const std::filesystem::path& dir);

// Several reports on one multi-arch page: the summary of all of them (report/summary.h
// build_summary; columns "label arch", speedups against `reference`, the first
// column when empty or unknown), the charts of every report and arch (layer time
// with baselines, per-pass time), then side by side one row per (pass, causal,
// kernel, shape), one column group per report and arch (labelled by `labels`,
// e.g. the file names): GPU, predicted and measured time, roofline fraction,
// registers, occupancy.
std::string render_compare_markdown(const std::vector<nlohmann::json>& reports, const std::vector<std::string>& labels,
                                    const std::string& reference = "");
std::string render_compare_html(const std::vector<nlohmann::json>& reports, const std::vector<std::string>& labels,
                                const std::string& reference = "");
// Reads the reports (report_reader.h read_report_file) and writes compare.md and compare.html into `dir`;
// Error (invalid argument) when `reference` names no column of the summary.
Status write_compare(const std::vector<std::filesystem::path>& reports, const std::filesystem::path& dir,
                     const std::string& reference = "");

}  // namespace lunajit::report
