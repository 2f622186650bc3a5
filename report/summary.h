// The hardware-comparison summary of one or more kernel reports (the top of
// report.html / report.md and of compare.html / compare.md, README "Kernel
// reports"): one row per (causal variant, shape), one column per arch of each
// report, each cell the layer's forward, backward and total (forward +
// backward) time, tokens per second and the speedup against a reference
// column; beside it two baselines on the same GPU (codegen/baseline_model.h:
// quadratic softmax attention at FlashAttention-like efficiency, the eager ATen
// composition) and the crossover sequence length where LUNA beats softmax.
//
// The summary is a JSON value computed from the reports' "kernels" (and their
// "spec" and "archs[].gpu" for the baselines), so it can be built for a fresh
// report (stored in it as "summary", docs/report_schema.json) and for old
// reports read back by `report compare` alike; the renderings print its
// numbers through format_number.
//
// Times: a pass's time is the sum of its kernels' times at the shape; it is
// "measured" when every kernel of the pass was timed on a GPU, else
// "predicted" (the cost model) when every kernel has a prediction, else
// absent. Total = forward + backward (forward alone when the backward was not
// reported, said by "total_covers"), its source "measured", "predicted" or
// "mixed". tokens/s = batch * seq / total. speedup = the reference column's
// total / this column's total at the same row (the reference column's is 1).
// The crossover compares predicted totals only (LUNA's and the softmax
// baseline's over the same passes): the smallest seq of the report's shapes at
// which LUNA's is below softmax's; null ("none in the range") otherwise.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace lunajit::report {

// The summary of `reports` (labels name them; a single report has label "",
// and its columns are its archs' names; several reports' columns are "label
// arch"). `reference` picks the reference column: a column name, an arch
// (its first column) or a report label (its first column); empty: the first
// column. Error (invalid argument) when `reference` names no column.
Result<nlohmann::json> build_summary(const std::vector<nlohmann::json>& reports, const std::vector<std::string>& labels,
                                     const std::string& reference = "");

// Renderings of a summary (build_summary): the HTML block (a <table
// id="summary"> whose cells carry data-row, data-column and data-field, the
// baseline table id="baselines" alike, the crossover list id="crossover"),
// styled by summary_css(), and the Markdown section (with the formulas).
std::string summary_html(const nlohmann::json& summary);
std::string summary_css();
std::string summary_markdown(const nlohmann::json& summary);
// The definitions and formulas of the summary's figures, one paragraph each.
std::vector<std::string> summary_formulas();

// The pixel height the HTML reserves for summary_html's section (fixed row
// heights), so the charts below it start at kHeaderHeight + this (report/render.h).
int summary_html_height(const nlohmann::json& summary);

// Charts of the summary: per causal variant, the total time by sequence length
// of every column with both baselines and the crossover marked, on a log-2
// sequence axis.
std::vector<std::string> summary_charts(const nlohmann::json& summary);

// The text printed for a field of a summary cell (format_number, "-" for null).
std::string summary_cell_text(const nlohmann::json& cell, const std::string& field);
// The cell fields of the summary table, in column order.
const std::vector<std::string>& summary_fields();

}  // namespace lunajit::report
