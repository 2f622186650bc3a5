#include "report/render.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <sstream>

#include <fmt/format.h>

#include "report/kernel_report.h"
#include "report/report_reader.h"
#include "report/summary.h"
#include "report/svg_chart.h"

namespace lunajit::report {

const nlohmann::json& json_at(const nlohmann::json& j, const char* pointer) {
  static const nlohmann::json null_value = nullptr;
  const nlohmann::json::json_pointer p(pointer);
  return j.is_object() && j.contains(p) ? j.at(p) : null_value;
}

namespace {

using nlohmann::json;


std::string shape_text(const json& s) {
  return fmt::format("{},{},{}", s.at("batch").get<int>(), s.at("heads").get<int>(), s.at("seq").get<int>());
}

std::string pass_key(const json& k) {
  return fmt::format("{}{}", k.at("pass").get<std::string>(),
                     k.at("pass") == "feature_map" ? "" : (k.at("causal").get<bool>() ? " (causal)" : " (non-causal)"));
}

std::string md_escape(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

// The summary lines above the tables, shared by both renderings.
std::vector<std::pair<std::string, std::string>> summary(const json& r) {
  std::vector<std::pair<std::string, std::string>> out;
  out.push_back({"spec", r.at("spec").dump()});
  out.push_back({"spec hash", r.at("spec_hash").get<std::string>()});
  const std::string mode = r.at("machine").at("mode").get<std::string>();
  out.push_back({"mode", mode == "predicted" ? "predicted (roofline model; no measurement on a GPU)"
                                             : "measured on " + r.at("machine").at("device").get<std::string>()});
  out.push_back({"generated", fmt::format("{} by lunajit {} (NVRTC {}), schema {} v{}",
                                          r.at("generator").at("created_utc").get<std::string>(),
                                          r.at("generator").at("lunajit_version").get<std::string>(),
                                          r.at("generator").at("nvrtc_version").get<std::string>(),
                                          r.at("schema").get<std::string>(), r.at("schema_version").get<int>())});
  return out;
}

const char* kMethod =
    "Bytes are compulsory DRAM traffic (inputs read once, outputs written once, workspace written and read once, "
    "parameters once); FLOPs are the arithmetic the kernels execute (FMA = 2, any other op or special function = 1), "
    "including the feature map recomputed per dv block. Predicted time (the cost model): the largest of the DRAM, "
    "tensor-core, FP32, shared-memory and SFU times at the arch's GPU's peak rates, over the launch's efficiency "
    "(SM fill, latency hiding, waves), plus the causal walk's serial latency and 3 us per launch. Baselines and the "
    "crossover: codegen/baseline_model.h (the summary states the formulas). Occupancy is theoretical: blocks per SM limited by threads, "
    "registers (256 per warp allocation unit, 4 sub-partitions), shared memory (128 B units + 1 KiB reserved per "
    "block on sm_80+) and the block limit. Formulas: codegen/cost_model.h, codegen/occupancy.h.";

std::vector<std::string> arch_order(const json& r) {
  std::vector<std::string> out;
  for (const auto& a : r.at("archs")) out.push_back(a.at("arch").get<std::string>());
  return out;
}

// Sum of the kernel times of one pass at one shape: {key -> {arch -> {(seq, batch, heads) -> ms}}}.
using ShapeKey = std::tuple<int, int, int>;
struct PassTimes {
  std::map<std::string, std::map<std::string, std::map<ShapeKey, double>>> predicted, measured, fraction;
};

PassTimes pass_times(const json& r) {
  PassTimes t;
  // The roofline fraction of a pass is its predicted total over its measured total.
  std::map<std::string, std::map<std::string, std::map<ShapeKey, double>>> pred_of_measured;
  for (const auto& k : r.at("kernels")) {
    const std::string key = pass_key(k), arch = k.at("arch").get<std::string>();
    const ShapeKey seq{k.at("shape").at("seq").get<int>(), k.at("shape").at("batch").get<int>(),
                       k.at("shape").at("heads").get<int>()};
    const json& p = json_at(k, "/predicted/time_ms");
    const json& m = json_at(k, "/measured/time_ms");
    if (p.is_number()) t.predicted[key][arch][seq] += p.get<double>();
    if (m.is_number()) {
      t.measured[key][arch][seq] += m.get<double>();
      if (p.is_number()) pred_of_measured[key][arch][seq] += p.get<double>();
    }
  }
  for (auto& [key, archs] : t.measured)
    for (auto& [arch, seqs] : archs)
      for (auto& [seq, ms] : seqs) t.fraction[key][arch][seq] = pred_of_measured[key][arch][seq] / ms;
  return t;
}

std::string css() {
  return fmt::format(
      "body{{margin:0;font-family:DejaVu Sans,Arial,sans-serif;font-size:13px;color:#222;background:#ffffff}}\n"
      "#header{{height:{0}px;overflow:hidden;padding:8px {1}px;box-sizing:border-box}}\n"
      "#header h1{{font-size:20px;margin:4px 0 6px 0}}\n"
      "#header p{{margin:2px 0;font-size:12px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}}\n"
      ".charts{{display:grid;grid-template-columns:{2}px {2}px;grid-auto-rows:{3}px;gap:{4}px;"
      "padding:0 {1}px;margin:0}}\n"
      ".charts svg{{display:block}}\n"
      "section{{padding:0 {1}px}}\n"
      "table{{border-collapse:collapse;font-size:11px;margin:8px 0}}\n"
      "th,td{{border:1px solid #ccc;padding:2px 5px;text-align:right;white-space:nowrap}}\n"
      "th{{background:#f3f3f3}} td.text{{text-align:left}}\n",
      kHeaderHeight, kChartsLeft, kChartWidth, kChartHeight, kChartGap) + summary_css();
}

std::string html_kernel_table(const json& r) {
  std::string s = "<table id=\"kernels\">\n<tr>";
  for (const auto& c : kernel_table_columns()) s += "<th>" + html_escape(c.header) + "</th>";
  s += "</tr>\n";
  int i = 0;
  for (const auto& k : r.at("kernels")) {
    s += fmt::format("<tr class=\"kernel\" data-index=\"{}\">", i++);
    for (const auto& c : kernel_table_columns())
      s += fmt::format("<td{}>{}</td>", c.numeric ? "" : " class=\"text\"", html_escape(cell_text(k, c)));
    s += "</tr>\n";
  }
  return s + "</table>\n";
}

std::string html_arch_table(const json& r) {
  std::string s =
      "<table id=\"archs\">\n<tr><th>arch</th><th>GPU</th><th>SMs</th><th>DRAM GB/s</th><th>FP32 TFLOP/s</th>"
      "<th>BF16 tensor TFLOP/s</th><th>L2 MiB</th><th>smem/block</th><th>smem/SM</th><th>threads/SM</th>"
      "<th>regs/SM</th><th>blocks/SM</th><th>source</th></tr>\n";
  for (const auto& a : r.at("archs")) {
    const json& g = a.at("gpu");
    const json& l = a.at("limits");
    auto num = [&](const json& j, const char* p) { return format_number(json_at(j, p)); };
    s += fmt::format(
        "<tr><td class=\"text\">{}</td><td class=\"text\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"text\">{}</td></tr>\n",
        a.at("arch").get<std::string>(), g.is_null() ? "-" : html_escape(g.at("name").get<std::string>()),
        num(g, "/sm_count"), num(g, "/memory_gbps"), num(g, "/fp32_tflops"), num(g, "/bf16_tensor_tflops"),
        num(g, "/l2_mib"), num(l, "/max_smem_per_block"), num(l, "/max_smem_per_sm"), num(l, "/max_threads_per_sm"),
        num(l, "/registers_per_sm"), num(l, "/max_blocks_per_sm"),
        g.is_null() ? "-" : html_escape(g.at("source").get<std::string>()));
  }
  return s + "</table>\n";
}

// Line charts of a set of reports: per pass key, the time by seq (log-2 axis) with the
// summary's baselines of that pass (forward, backward), and, where something was
// measured, the roofline fraction by seq. `summary` is build_summary of the same
// reports (its columns in the same order: report by report, arch by arch), or null.
std::vector<std::string> time_charts(const std::vector<json>& reports, const std::vector<std::string>& labels,
                                     const json& summary) {
  std::vector<std::string> out;
  std::vector<PassTimes> times;
  std::set<std::string> keys;
  std::vector<std::string> key_order;
  for (const auto& r : reports) {
    times.push_back(pass_times(r));
    for (const auto& k : r.at("kernels"))
      if (keys.insert(pass_key(k)).second) key_order.push_back(pass_key(k));
  }
  for (const std::string& key : key_order) {
    LineChart time{"Time by sequence length: " + key, "sequence length", "time (ms)", {}, std::nullopt, "", true, {}};
    LineChart frac{"Fraction of roofline by sequence length: " + key, "sequence length",
                   "roofline time / measured time", {}, 1.2, "", true, {}};
    const std::string pass = key.substr(0, key.find(' '));
    const bool causal = key.find("(causal)") != std::string::npos;
    int color = 0;
    size_t column = 0;
    bool any_measured = false, any_baseline = false;
    for (size_t ri = 0; ri < reports.size(); ++ri) {
      for (const std::string& arch : arch_order(reports[ri])) {
        const std::string name = labels.size() > 1 ? labels[ri] + " " + arch : arch;
        const std::string col = kSeriesColors[color++ % 6];
        ChartSeries pred{name + " predicted", col, false, {}, ""}, meas{name + " measured", col, true, {}, ""};
        for (auto [shape, ms] : times[ri].predicted[key][arch]) pred.points.push_back({double(std::get<0>(shape)), ms});
        for (auto [shape, ms] : times[ri].measured[key][arch]) meas.points.push_back({double(std::get<0>(shape)), ms});
        if (!pred.points.empty()) time.series.push_back(pred);
        if (!meas.points.empty()) time.series.push_back(meas), any_measured = true;
        // The baselines of this pass from the summary's cells of this column.
        if (summary.is_object() && (pass == "forward" || pass == "backward")) {
          ChartSeries soft{name + " softmax (FA-like)", col, false, {}, "2 3"}, eager{name + " eager", col, false, {}, "9 3 2 3"};
          for (const auto& row : summary["rows"]) {
            if (row["causal"] != causal || column >= row["cells"].size()) continue;
            const json& cell = row["cells"][column];
            const double seq = row["shape"]["seq"].get<double>();
            const std::string f = "/" + pass + "_ms";
            if (const json& v = json_at(cell, ("/softmax" + f).c_str()); v.is_number()) soft.points.push_back({seq, v.get<double>()});
            if (const json& v = json_at(cell, ("/eager" + f).c_str()); v.is_number()) eager.points.push_back({seq, v.get<double>()});
          }
          for (ChartSeries* b : {&soft, &eager})
            if (!b->points.empty()) time.series.push_back(*b), any_baseline = true;
        }
        ++column;
        ChartSeries fr{name, col, false, {}, ""};
        for (auto [shape, v] : times[ri].fraction[key][arch]) fr.points.push_back({double(std::get<0>(shape)), v});
        if (!fr.points.empty()) frac.series.push_back(fr);
      }
    }
    if (time.series.empty()) continue;  // no predicted time (no GPU product for the arch) and no measurement
    time.note = "sum of the pass's kernels; solid: predicted" + std::string(any_measured ? ", dashed: measured" : "") +
                (any_baseline ? "; dotted: softmax, dash-dot: eager" : "");
    frac.note = "measured on the GPU";
    out.push_back(svg_line_chart(time, kChartWidth, kChartHeight));
    // Without a measurement there is no fraction to show (a prediction is at its own roofline by definition).
    if (!frac.series.empty()) out.push_back(svg_line_chart(frac, kChartWidth, kChartHeight));
  }
  return out;
}

std::vector<std::string> resource_charts(const json& r) {
  std::vector<std::string> out;
  for (const auto& a : r.at("archs")) {
    const std::string arch = a.at("arch").get<std::string>();
    const double regs_max = a.at("limits").at("max_registers_per_thread").get<double>();
    const double smem_max = a.at("limits").at("max_smem_per_block").get<double>();
    BarChart c{"Resources per kernel: " + arch, {"registers / thread", "shared memory", "occupancy"},
               {kResourceColors[0], kResourceColors[1], kResourceColors[2]}, {},
               "first shape; bars as a fraction of the arch's limit"};
    const json first_shape = r.at("shapes").at(0);
    for (const auto& k : r.at("kernels")) {
      if (k.at("arch") != arch || k.at("shape") != first_shape) continue;
      const json& regs = json_at(k, "/resources/registers");
      if (!regs.is_number()) continue;
      const double smem = json_at(k, "/resources/static_smem_bytes").get<double>() +
                          (json_at(k, "/launch/dynamic_smem_bytes").is_number()
                               ? json_at(k, "/launch/dynamic_smem_bytes").get<double>() : 0.0);
      const json& occ = json_at(k, "/occupancy/fraction");
      BarGroup g;
      std::string pass = k.at("pass").get<std::string>();
      g.label = (pass == "feature_map" ? std::string("fm") : pass.substr(0, 3) + (k.at("causal").get<bool>() ? "/c" : "")) +
                ":" + k.at("kernel").get<std::string>();
      g.fractions = {regs.get<double>() / regs_max, smem / smem_max, occ.is_number() ? occ.get<double>() : 0.0};
      g.texts = {format_number(regs), fmt::format("{:.1f} KiB", smem / 1024),
                 occ.is_number() ? fmt::format("{:.0f}%", occ.get<double>() * 100) : "-"};
      c.groups.push_back(g);
    }
    out.push_back(svg_bar_chart(c, kChartWidth, kChartHeight));
  }
  return out;
}

std::string html_page(const std::string& title, const std::vector<std::pair<std::string, std::string>>& lines,
                      const std::string& top, const std::vector<std::string>& charts, const std::string& body) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  html_escape(title) + "</title>\n<style>\n" + css() + "</style>\n</head>\n<body>\n<div id=\"header\">\n";
  s += "<h1>" + html_escape(title) + "</h1>\n";
  for (const auto& [k, v] : lines) s += "<p><b>" + html_escape(k) + ":</b> " + html_escape(v) + "</p>\n";
  s += "</div>\n" + top + "<div class=\"charts\">\n";
  for (const auto& c : charts) s += c;
  s += "</div>\n" + body + "</body>\n</html>\n";
  return s;
}

Status write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) return Error::failure(fmt::format("cannot write {}", path.string()));
  return ok_status();
}

// The report's stored summary (build_report writes it), else one computed from its kernels; null when
// there is none to compute (no archs).
json summary_of(const json& r) {
  if (r.contains("summary") && r["summary"].is_object()) return r["summary"];
  auto s = build_summary({r}, {""});
  return s ? *s : json(nullptr);
}

std::string formulas_html() {
  std::string s = "<h2>Summary and baselines: definitions</h2>\n";
  for (const std::string& f : summary_formulas()) s += "<p class=\"formula\">" + html_escape(f) + "</p>\n";
  return s;
}

// One row key of the comparison.
std::string compare_key(const json& k) {
  return fmt::format("{} | {} | {}", pass_key(k), k.at("kernel").get<std::string>(), shape_text(k.at("shape")));
}

struct CompareCell {
  std::string gpu, predicted, measured, fraction, registers, occupancy;
};

// {row key -> {column "label arch" -> cell}} plus the orders of both.
struct CompareTable {
  std::vector<std::string> rows, columns;
  std::map<std::string, std::map<std::string, CompareCell>> cells;
};

CompareTable compare_table(const std::vector<json>& reports, const std::vector<std::string>& labels) {
  CompareTable t;
  std::set<std::string> seen_rows, seen_cols;
  for (size_t i = 0; i < reports.size(); ++i)
    for (const auto& k : reports[i].at("kernels")) {
      const std::string row = compare_key(k), col = labels[i] + " " + k.at("arch").get<std::string>();
      if (seen_rows.insert(row).second) t.rows.push_back(row);
      if (seen_cols.insert(col).second) t.columns.push_back(col);
      t.cells[row][col] = CompareCell{k.at("gpu").is_null() ? "-" : k.at("gpu").get<std::string>(),
                                      format_number(json_at(k, "/predicted/time_ms")),
                                      format_number(json_at(k, "/measured/time_ms")),
                                      format_number(json_at(k, "/measured/roofline_fraction")),
                                      format_number(json_at(k, "/resources/registers")),
                                      format_number(json_at(k, "/occupancy/fraction"))};
    }
  return t;
}

const char* kCompareMetrics[] = {"GPU", "predicted ms", "measured ms", "roofline fraction", "regs", "occupancy"};

std::vector<std::string> cell_values(const CompareCell& c) {
  return {c.gpu, c.predicted, c.measured, c.fraction, c.registers, c.occupancy};
}

}  // namespace

std::string format_number(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return fmt::format("{}", v.get<int64_t>());
  if (v.is_number()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) return fmt::format("{:.0f}", d);
    return fmt::format("{:.4g}", d);
  }
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

const std::vector<TableColumn>& kernel_table_columns() {
  static const std::vector<TableColumn> cols = {
      {"arch", "/arch", false},
      {"pass", "/pass", false},
      {"causal", "/causal", false},
      {"kernel", "/kernel", false},
      {"B,H,N", "/shape", false},
      {"config", "/config/string", false},
      {"how chosen", "/config/how", false},
      {"regs", "/resources/registers", true},
      {"static smem B", "/resources/static_smem_bytes", true},
      {"dyn smem B", "/launch/dynamic_smem_bytes", true},
      {"spill st B", "/resources/spill_stores", true},
      {"spill ld B", "/resources/spill_loads", true},
      {"threads", "/launch/threads", true},
      {"blocks/SM", "/occupancy/blocks_per_sm", true},
      {"limited by", "/occupancy/limited_by", false},
      {"occupancy", "/occupancy/fraction", true},
      {"PTX mma", "/ptx_census/mma", true},
      {"PTX fma", "/ptx_census/fma", true},
      {"PTX ld.shared", "/ptx_census/ld_shared", true},
      {"PTX ld.global", "/ptx_census/ld_global", true},
      {"PTX cp.async", "/ptx_census/cp_async", true},
      {"PTX ldmatrix", "/ptx_census/ldmatrix", true},
      {"bytes", "/cost/bytes", true},
      {"FLOPs", "/cost/flops", true},
      {"FLOP/B", "/cost/arithmetic_intensity", true},
      {"GPU", "/gpu", false},
      {"predicted ms", "/predicted/time_ms", true},
      {"model limiter", "/predicted/limiter", false},
      {"measured ms", "/measured/time_ms", true},
      {"GB/s", "/measured/gbps", true},
      {"TFLOP/s", "/measured/tflops", true},
      {"roofline fraction", "/measured/roofline_fraction", true},
      {"status", "/status", false},
  };
  return cols;
}

std::string cell_text(const json& kernel, const TableColumn& c) {
  const json& v = json_at(kernel, c.pointer);
  if (v.is_null()) return "-";
  if (std::string_view(c.pointer) == "/shape") return shape_text(v);
  if (std::string_view(c.pointer) == "/causal") return v.get<bool>() ? "causal" : "non-causal";
  return format_number(v);
}

std::string render_markdown(const json& r) {
  std::string s = "# lunajit kernel report\n\n";
  for (const auto& [k, v] : summary(r)) s += fmt::format("- **{}**: {}\n", k, k == "spec" ? "`" + v + "`" : v);
  if (const json t = summary_of(r); !t.is_null()) s += "\n" + summary_markdown(t);
  s += "\n## GPUs and arch limits\n\n| arch | GPU | SMs | DRAM GB/s | FP32 TFLOP/s | BF16 tensor TFLOP/s | L2 MiB | "
       "smem/block | smem/SM | threads/SM | regs/SM | blocks/SM | source |\n"
       "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& a : r.at("archs")) {
    const json& g = a.at("gpu");
    const json& l = a.at("limits");
    auto num = [&](const json& j, const char* p) { return format_number(json_at(j, p)); };
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                     a.at("arch").get<std::string>(), g.is_null() ? "-" : g.at("name").get<std::string>(),
                     num(g, "/sm_count"), num(g, "/memory_gbps"), num(g, "/fp32_tflops"), num(g, "/bf16_tensor_tflops"),
                     num(g, "/l2_mib"), num(l, "/max_smem_per_block"), num(l, "/max_smem_per_sm"),
                     num(l, "/max_threads_per_sm"), num(l, "/registers_per_sm"), num(l, "/max_blocks_per_sm"),
                     g.is_null() ? "-" : md_escape(g.at("source").get<std::string>()));
  }
  s += "\n## Kernels\n\n|";
  std::string rule = "|";
  for (const auto& c : kernel_table_columns()) {
    s += fmt::format(" {} |", c.header);
    rule += c.numeric ? "---:|" : "---|";
  }
  s += "\n" + rule + "\n";
  for (const auto& k : r.at("kernels")) {
    s += "|";
    for (const auto& c : kernel_table_columns()) s += " " + md_escape(cell_text(k, c)) + " |";
    s += "\n";
  }
  s += "\n## Passes\n\n| arch | pass | causal | status | note |\n|---|---|---|---|---|\n";
  for (const auto& p : r.at("passes"))
    s += fmt::format("| {} | {} | {} | {} | {} |\n", p.at("arch").get<std::string>(), p.at("pass").get<std::string>(),
                     p.at("causal").get<bool>() ? "causal" : "non-causal", p.at("status").get<std::string>(),
                     md_escape(p.at("note").get<std::string>()));
  if (r.contains("bank_conflicts")) {
    const json& b = r.at("bank_conflicts");
    const json& sh = b.at("shape");
    s += fmt::format("\n## Shared-memory bank conflicts (host-profiled)\n\nBlock {} of every kernel at B,H,N = {},{},{} "
                     "(default config of {}): {} wavefronts where a conflict-free layout needs {}.\n",
                     b.at("block").get<std::string>(), sh.at("batch").get<int>(), sh.at("heads").get<int>(),
                     sh.at("seq").get<int>(), b.at("arch").get<std::string>(), b.at("total_wavefronts").get<std::uint64_t>(),
                     b.at("conflict_free_wavefronts").get<std::uint64_t>());
    if (b.contains("kernels") && !b.at("kernels").empty()) {
      s += "\nPer kernel: block (0,0,0)'s shared-memory wavefronts (emulator) beside the cost model's per block "
           "(its layout formulas, which also count parameter reads through L1):\n\n"
           "| causal | pass | role | wavefronts | conflict-free | model per block | emulator / model |\n"
           "|---|---|---|---:|---:|---:|---:|\n";
      for (const auto& x : b.at("kernels")) {
        const double wf = static_cast<double>(x.at("wavefronts").get<std::uint64_t>());
        const bool m = x.contains("model_wavefronts_per_block");
        const double mw = m ? x.at("model_wavefronts_per_block").get<double>() : 0.0;
        s += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", x.at("causal").get<bool>() ? "causal" : "non-causal",
                         x.at("pass").get<std::string>(), x.at("role").get<std::string>(), wf,
                         x.at("conflict_free_wavefronts").get<std::uint64_t>(), m ? fmt::format("{:.0f}", mw) : "-",
                         m && mw > 0 ? fmt::format("{:.2f}", wf / mw) : "-");
      }
    }
    s += "\nWorst sites:\n\n| causal | pass | kernel | site | access | bytes | warp accesses | wavefronts | "
         "conflict-free | per access |\n|---|---|---|---|---|---:|---:|---:|---:|---:|\n";
    for (const auto& x : b.at("sites"))
      s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1f} |\n",
                       x.at("causal").get<bool>() ? "causal" : "non-causal", x.at("pass").get<std::string>(),
                       md_escape(x.at("kernel").get<std::string>()), x.at("site").get<std::string>(),
                       x.at("access").get<std::string>(), x.at("bytes").get<unsigned>(),
                       x.at("warp_accesses").get<std::uint64_t>(), x.at("wavefronts").get<std::uint64_t>(),
                       x.at("conflict_free_wavefronts").get<std::uint64_t>(), x.at("wavefronts_per_access").get<double>());
  }
  if (!r.at("notes").empty()) {
    s += "\n## Notes\n\n";
    for (const auto& n : r.at("notes")) s += "- " + n.get<std::string>() + "\n";
  }
  s += std::string("\n## Method\n\n") + kMethod + "\n";
  return s;
}

std::string render_html(const json& r) {
  const json t = summary_of(r);
  std::vector<std::string> charts = t.is_null() ? std::vector<std::string>{} : summary_charts(t);
  for (auto& c : time_charts({r}, {""}, t)) charts.push_back(std::move(c));
  for (auto& c : resource_charts(r)) charts.push_back(std::move(c));
  std::string body = "<section>\n<h2>GPUs and arch limits</h2>\n" + html_arch_table(r);
  body += "<h2>Kernels</h2>\n" + html_kernel_table(r);
  body += "<h2>Passes</h2>\n<table id=\"passes\"><tr><th>arch</th><th>pass</th><th>causal</th><th>status</th>"
          "<th>note</th></tr>\n";
  for (const auto& p : r.at("passes"))
    body += fmt::format("<tr><td class=\"text\">{}</td><td class=\"text\">{}</td><td class=\"text\">{}</td>"
                        "<td class=\"text\">{}</td><td class=\"text\">{}</td></tr>\n",
                        p.at("arch").get<std::string>(), p.at("pass").get<std::string>(),
                        p.at("causal").get<bool>() ? "causal" : "non-causal", p.at("status").get<std::string>(),
                        html_escape(p.at("note").get<std::string>()));
  body += "</table>\n";
  if (!r.at("notes").empty()) {
    body += "<h2>Notes</h2>\n<ul>\n";
    for (const auto& n : r.at("notes")) body += "<li>" + html_escape(n.get<std::string>()) + "</li>\n";
    body += "</ul>\n";
  }
  body += std::string("<h2>Method</h2>\n<p>") + html_escape(kMethod) + "</p>\n" + formulas_html() + "</section>\n";
  return html_page("lunajit kernel report", summary(r), t.is_null() ? "" : summary_html(t), charts, body);
}

Status write_report(const json& r, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error::failure(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  if (auto st = write_file(dir / "report.json", r.dump(2) + "\n"); !st) return st;
  if (auto st = write_file(dir / "report.md", render_markdown(r)); !st) return st;
  return write_file(dir / "report.html", render_html(r));
}

std::string render_compare_markdown(const std::vector<json>& reports, const std::vector<std::string>& labels,
                                    const std::string& reference) {
  const CompareTable t = compare_table(reports, labels);
  std::string s = "# lunajit kernel reports side by side\n\n";
  for (size_t i = 0; i < reports.size(); ++i)
    s += fmt::format("- **{}**: {}, mode {}, spec hash {}\n", labels[i],
                     reports[i].at("generator").at("created_utc").get<std::string>(),
                     reports[i].at("machine").at("mode").get<std::string>(),
                     reports[i].at("spec_hash").get<std::string>());
  if (auto summary = build_summary(reports, labels, reference); summary) s += "\n" + summary_markdown(*summary);
  for (const auto& col : t.columns) {
    s += fmt::format("\n## {}\n\n| pass | kernel | B,H,N |", col);
    for (const char* m : kCompareMetrics) s += fmt::format(" {} |", m);
    s += "\n|---|---|---|---|---:|---:|---:|---:|---:|\n";
    for (const auto& row : t.rows) {
      auto it = t.cells.at(row).find(col);
      if (it == t.cells.at(row).end()) continue;
      s += "| " + row + " |";
      for (const auto& v : cell_values(it->second)) s += " " + v + " |";
      s += "\n";
    }
  }
  s += "\n## Predicted (measured) ms by kernel\n\n| pass | kernel | B,H,N |";
  for (const auto& col : t.columns) s += " " + col + " |";
  s += "\n|---|---|---|";
  for (size_t i = 0; i < t.columns.size(); ++i) s += "---:|";
  s += "\n";
  for (const auto& row : t.rows) {
    s += "| " + row + " |";
    for (const auto& col : t.columns) {
      auto it = t.cells.at(row).find(col);
      if (it == t.cells.at(row).end()) s += " - |";
      else s += " " + it->second.predicted + (it->second.measured == "-" ? "" : " (" + it->second.measured + ")") + " |";
    }
    s += "\n";
  }
  return s;
}

std::string render_compare_html(const std::vector<json>& reports, const std::vector<std::string>& labels,
                                const std::string& reference) {
  const CompareTable t = compare_table(reports, labels);
  auto built = build_summary(reports, labels, reference);
  const json summary = built ? *built : json(nullptr);
  std::vector<std::pair<std::string, std::string>> lines;
  for (size_t i = 0; i < reports.size(); ++i)
    lines.push_back({labels[i], fmt::format("{}, mode {}, device {}", reports[i].at("generator").at("created_utc").get<std::string>(),
                                            reports[i].at("machine").at("mode").get<std::string>(),
                                            format_number(reports[i].at("machine").at("device")))});
  std::vector<std::string> charts = summary.is_null() ? std::vector<std::string>{} : summary_charts(summary);
  for (auto& c : time_charts(reports, labels, summary)) charts.push_back(std::move(c));
  std::string body = "<section>\n<h2>Side by side</h2>\n<table id=\"compare\">\n<tr><th rowspan=\"2\">pass</th>"
                     "<th rowspan=\"2\">kernel</th><th rowspan=\"2\">B,H,N</th>";
  for (const auto& col : t.columns) body += fmt::format("<th colspan=\"6\">{}</th>", html_escape(col));
  body += "</tr>\n<tr>";
  for (size_t i = 0; i < t.columns.size(); ++i)
    for (const char* m : kCompareMetrics) body += fmt::format("<th>{}</th>", m);
  body += "</tr>\n";
  for (const auto& row : t.rows) {
    std::string a = row, b, c;
    // row = "pass | kernel | shape"
    const size_t p1 = a.find(" | "), p2 = a.find(" | ", p1 + 3);
    b = a.substr(p1 + 3, p2 - p1 - 3);
    c = a.substr(p2 + 3);
    a = a.substr(0, p1);
    body += fmt::format("<tr><td class=\"text\">{}</td><td class=\"text\">{}</td><td class=\"text\">{}</td>",
                        html_escape(a), html_escape(b), html_escape(c));
    for (const auto& col : t.columns) {
      auto it = t.cells.at(row).find(col);
      for (int m = 0; m < 6; ++m)
        body += "<td>" + (it == t.cells.at(row).end() ? std::string("-") : html_escape(cell_values(it->second)[m])) +
                "</td>";
    }
    body += "</tr>\n";
  }
  body += "</table>\n" + formulas_html() + "</section>\n";
  return html_page("lunajit kernel reports side by side", lines, summary.is_null() ? "" : summary_html(summary), charts,
                   body);
}

Status write_compare(const std::vector<std::filesystem::path>& paths, const std::filesystem::path& dir,
                     const std::string& reference) {
  if (paths.empty()) return Error::invalid("report compare: no reports given; expected A.json B.json ...");
  std::vector<json> reports;
  std::vector<std::string> labels;
  for (const auto& p : paths) {
    auto j = read_report_file(p);
    if (!j) return j.error();
    std::string label = p.stem().string() == "report" ? p.parent_path().filename().string() : p.stem().string();
    if (label.empty()) label = p.string();
    while (std::find(labels.begin(), labels.end(), label) != labels.end()) label += "'";
    labels.push_back(label);
    reports.push_back(std::move(*j));
  }
  // A bad --reference is the caller's error; reports without archs just have no summary.
  if (auto summary = build_summary(reports, labels, reference); !summary && !reference.empty()) return summary.error();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error::failure(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  if (auto st = write_file(dir / "compare.md", render_compare_markdown(reports, labels, reference)); !st) return st;
  return write_file(dir / "compare.html", render_compare_html(reports, labels, reference));
}

}  // namespace lunajit::report
