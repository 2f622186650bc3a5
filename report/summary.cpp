#include "report/summary.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "codegen/attention_spec.h"
#include "codegen/baseline_model.h"
#include "codegen/cost_model.h"
#include "codegen/gpu_specs.h"
#include "report/render.h"
#include "report/svg_chart.h"

namespace lunajit::report {
namespace {

using nlohmann::json;


// (causal, seq, batch, heads): rows sort by variant, then sequence length.
using RowKey = std::tuple<bool, int, int, int>;

// One pass of one arch at one row: its kernels' times summed.
struct PassSum {
  int kernels = 0, predicted = 0, measured = 0;
  double predicted_ms = 0, measured_ms = 0;
  std::string how;  // the config's account ("default (untuned)", ...)
};

struct Column {
  std::string name, label, arch;
  json gpu = nullptr;  // archs[].gpu of the report
  size_t report = 0;
  std::map<RowKey, std::map<std::string, PassSum>> passes;
};

// A pass's displayed time: measured when every kernel was timed, else predicted when every kernel has one.
struct PassValue {
  json ms = nullptr, source = nullptr;
  json predicted_ms = nullptr;
};
PassValue pass_value(const std::map<std::string, PassSum>& passes, const std::string& pass) {
  PassValue v;
  auto it = passes.find(pass);
  if (it == passes.end() || it->second.kernels == 0) return v;
  const PassSum& s = it->second;
  if (s.predicted == s.kernels) v.predicted_ms = s.predicted_ms;
  if (s.measured == s.kernels) v.ms = s.measured_ms, v.source = "measured";
  else if (s.predicted == s.kernels) v.ms = s.predicted_ms, v.source = "predicted";
  return v;
}

std::string config_text(const std::map<std::string, PassSum>& passes) {
  std::string out;
  for (const char* pass : {"forward", "backward"}) {
    auto it = passes.find(pass);
    if (it == passes.end()) continue;
    const std::string& how = it->second.how;
    const std::string text = how == "default (untuned)"  ? "default"
                             : how == "given (--config)" ? "given (--config)"
                                                         : "tuned: " + how;
    out += fmt::format("{}{} {}", out.empty() ? "" : "; ", pass == std::string("forward") ? "fwd" : "bwd", text);
  }
  return out.empty() ? "-" : out;
}

json shape_of(const RowKey& k) {
  return {{"batch", std::get<2>(k)}, {"heads", std::get<3>(k)}, {"seq", std::get<1>(k)}};
}

std::string num(const json& v) { return format_number(v); }

// Fixed heights of the HTML summary block (summary_css): a table row, a heading with its margins, a list line.
constexpr int kRowPx = 20, kHeadingPx = 36, kLinePx = 16, kGapPx = 12;

const char* kFormulas[] = {
    "Times are per attention layer: forward = the forward pass's kernels, backward = the backward pass's, total = "
    "forward + backward; measured where every kernel of the pass was timed on a GPU, else predicted by the cost model "
    "(codegen/cost_model.h). tokens/s = batch x seq / total. speedup = the reference column's total / this total.",
    "softmax (FlashAttention-like, predicted): FLOPs = 2 B H N^2 (d + dv) (= 4 B H N^2 d when dv = d), x 0.5 causal, "
    "backward 2.5x the forward's; bytes = Q, K, V read and O written (backward: Q, K, V, O, dO read, dQ, dK, dV "
    "written); time = max(FLOPs / (eff x dense tensor peak of the dtype), bytes / (0.8 x DRAM bandwidth)) + 3 us per "
    "launch, eff = 0.70 forward, 0.50 backward.",
    "eager (ATen composition of the same linear attention, predicted): every materialised intermediate (phi(Q), "
    "phi(K) and the feature map's own, S, z, num, den; causal: the chunk scores and prefix-summed states) written and "
    "read once in fp32, over 0.8 x DRAM bandwidth, + 3 us per op; backward 2x the forward (estimate). A bandwidth "
    "bound: the ops' arithmetic is not counted, so eager can only be slower than this. Formulas: "
    "codegen/baseline_model.h.",
    "crossover: the smallest sequence length of the sweep at which LUNA's predicted total is below the softmax "
    "baseline's (same B, H, same passes).",
};

}  // namespace

std::vector<std::string> summary_formulas() { return {std::begin(kFormulas), std::end(kFormulas)}; }

std::string summary_css() {
  return fmt::format(
      "#summary{{padding:0 {0}px;overflow:auto;box-sizing:border-box}}\n"
      "#summary h2{{font-size:15px;height:24px;line-height:24px;margin:6px 0}}\n"
      "#summary table{{margin:0 0 {1}px 0}}\n"
      "#summary th,#summary td{{height:16px;line-height:16px;padding:1px 4px}}\n"
      "#summary ul{{margin:0;padding-left:20px}} #summary li{{height:{2}px;line-height:{2}px;white-space:nowrap}}\n",
      kChartsLeft, kGapPx, kLinePx);
}

const std::vector<std::string>& summary_fields() {
  static const std::vector<std::string> f = {"forward_ms", "backward_ms", "total_ms", "total_source",
                                             "tokens_per_s", "speedup", "config"};
  return f;
}

namespace {
const std::vector<std::string>& baseline_fields() {
  static const std::vector<std::string> f = {"predicted_total_ms", "softmax_ms", "eager_ms", "vs_softmax", "vs_eager"};
  return f;
}
const char* field_header(const std::string& f) {
  static const std::map<std::string, const char*> h = {
      {"forward_ms", "fwd ms"}, {"backward_ms", "bwd ms"}, {"total_ms", "total ms"}, {"total_source", "source"},
      {"tokens_per_s", "tokens/s"}, {"speedup", "speedup"}, {"config", "config"},
      {"predicted_total_ms", "LUNA ms (predicted)"}, {"softmax_ms", "softmax ms"}, {"eager_ms", "eager ms"},
      {"vs_softmax", "LUNA speedup vs softmax"}, {"vs_eager", "vs eager"}};
  return h.at(f);
}
}  // namespace

std::string summary_cell_text(const json& cell, const std::string& field) {
  if (!cell.is_object() || !cell.contains(field)) return "-";
  const json& v = cell.at(field);
  if (field == "total_source" && v.is_string() && cell.contains("total_covers") && cell["total_covers"] == "forward")
    return v.get<std::string>() + " (fwd only)";
  return num(v);
}

Result<json> build_summary(const std::vector<json>& reports, const std::vector<std::string>& labels,
                           const std::string& reference) {
  std::vector<Column> columns;
  std::vector<std::optional<AttentionSpec>> specs;
  for (size_t ri = 0; ri < reports.size(); ++ri) {
    const json& r = reports[ri];
    const std::string label = ri < labels.size() ? labels[ri] : "";
    auto spec = r.contains("spec") ? spec_from_json(r["spec"]) : Result<AttentionSpec>(Error::invalid("no spec"));
    specs.push_back(spec ? std::optional(*spec) : std::nullopt);
    std::map<std::string, size_t> by_arch;
    for (const auto& a : json_at(r, "/archs")) {
      if (!json_at(a, "/arch").is_string()) continue;
      Column c;
      c.arch = a["arch"].get<std::string>();
      c.label = label;
      c.name = label.empty() ? c.arch : label + " " + c.arch;
      c.gpu = json_at(a, "/gpu");
      c.report = ri;
      by_arch[c.arch] = columns.size();
      columns.push_back(std::move(c));
    }
    for (const auto& k : json_at(r, "/kernels")) {
      const json &pass = json_at(k, "/pass"), &arch = json_at(k, "/arch");
      if (!pass.is_string() || !arch.is_string() || pass == "feature_map") continue;
      auto ci = by_arch.find(arch.get<std::string>());
      const json &causal = json_at(k, "/causal"), &b = json_at(k, "/shape/batch"), &h = json_at(k, "/shape/heads"),
                 &n = json_at(k, "/shape/seq");
      if (ci == by_arch.end() || !causal.is_boolean() || !b.is_number_integer() || !h.is_number_integer() ||
          !n.is_number_integer())
        continue;
      const RowKey key{causal.get<bool>(), n.get<int>(), b.get<int>(), h.get<int>()};
      PassSum& s = columns[ci->second].passes[key][pass.get<std::string>()];
      ++s.kernels;
      if (const json& p = json_at(k, "/predicted/time_ms"); p.is_number()) ++s.predicted, s.predicted_ms += p.get<double>();
      if (const json& m = json_at(k, "/measured/time_ms"); m.is_number()) ++s.measured, s.measured_ms += m.get<double>();
      if (const json& how = json_at(k, "/config/how"); how.is_string() && s.how.empty()) s.how = how.get<std::string>();
    }
  }
  if (columns.empty()) return Error::invalid("summary: the reports have no archs");

  size_t ref = 0;
  if (!reference.empty()) {
    auto find = [&](auto pred) {
      for (size_t i = 0; i < columns.size(); ++i)
        if (pred(columns[i])) return i;
      return columns.size();
    };
    ref = find([&](const Column& c) { return c.name == reference; });
    if (ref == columns.size()) ref = find([&](const Column& c) { return c.arch == reference; });
    if (ref == columns.size()) ref = find([&](const Column& c) { return c.label == reference; });
    if (ref == columns.size()) {
      std::string names;
      for (const auto& c : columns) names += (names.empty() ? "" : ", ") + c.name;
      return Error::invalid(fmt::format("--reference {}: no such column; the columns are {}", reference, names));
    }
  }

  std::vector<RowKey> keys;
  for (const auto& c : columns)
    for (const auto& [k, _] : c.passes)
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());

  json rows = json::array();
  for (const RowKey& key : keys) {
    json cells = json::array();
    for (const Column& c : columns) {
      json cell = {{"column", c.name}};
      auto pit = c.passes.find(key);
      if (pit == c.passes.end()) {
        cells.push_back(cell);
        continue;
      }
      const PassValue f = pass_value(pit->second, "forward"), b = pass_value(pit->second, "backward");
      cell["forward_ms"] = f.ms;
      cell["forward_source"] = f.source;
      cell["backward_ms"] = b.ms;
      cell["backward_source"] = b.source;
      const bool with_backward = !b.ms.is_null();
      cell["total_covers"] = with_backward ? "forward + backward" : "forward";
      cell["total_ms"] = nullptr;
      cell["total_source"] = nullptr;
      if (!f.ms.is_null()) {
        cell["total_ms"] = f.ms.get<double>() + (with_backward ? b.ms.get<double>() : 0.0);
        cell["total_source"] = !with_backward || f.source == b.source ? f.source : json("mixed");
        cell["tokens_per_s"] = double(std::get<2>(key)) * std::get<1>(key) / (cell["total_ms"].get<double>() * 1e-3);
      }
      // Predicted only, for the baselines and the crossover.
      cell["predicted_total_ms"] = nullptr;
      if (!f.predicted_ms.is_null() && (!with_backward || !b.predicted_ms.is_null()))
        cell["predicted_total_ms"] =
            f.predicted_ms.get<double>() + (with_backward ? b.predicted_ms.get<double>() : 0.0);
      cell["config"] = config_text(pit->second);
      const GpuSpec* gpu = json_at(c.gpu, "/key").is_string() ? find_gpu(c.gpu["key"].get<std::string>()) : nullptr;
      cell["gpu"] = gpu ? json(gpu->key) : json(nullptr);
      cell["softmax_ms"] = nullptr;
      cell["eager_ms"] = nullptr;
      if (gpu && specs[c.report]) {
        AttentionSpec spec = *specs[c.report];
        spec.causal = std::get<0>(key);
        const ProblemShape shape{std::get<2>(key), std::get<3>(key), std::get<1>(key)};
        const BaselinePrediction sm = softmax_attention_baseline(spec, shape, *gpu);
        const BaselinePrediction ea = eager_linear_attention_baseline(spec, shape, *gpu);
        cell["softmax_ms"] = with_backward ? sm.total_ms() : sm.forward.ms;
        cell["eager_ms"] = with_backward ? ea.total_ms() : ea.forward.ms;
        cell["softmax"] = {{"forward_ms", sm.forward.ms}, {"backward_ms", sm.backward.ms},
                           {"forward_flops", sm.forward.flops}, {"forward_bytes", sm.forward.bytes},
                           {"limiter", sm.forward.limiter}};
        cell["eager"] = {{"forward_ms", ea.forward.ms}, {"backward_ms", ea.backward.ms},
                         {"forward_bytes", ea.forward.bytes}, {"forward_ops", ea.forward.launches}};
        if (cell["predicted_total_ms"].is_number()) {
          cell["vs_softmax"] = cell["softmax_ms"].get<double>() / cell["predicted_total_ms"].get<double>();
          cell["vs_eager"] = cell["eager_ms"].get<double>() / cell["predicted_total_ms"].get<double>();
        }
      }
      cells.push_back(cell);
    }
    // Speedup against the reference column of this row.
    const json& ref_total = cells[ref].contains("total_ms") ? cells[ref]["total_ms"] : json(nullptr);
    for (auto& cell : cells)
      if (ref_total.is_number() && cell.contains("total_ms") && cell["total_ms"].is_number())
        cell["speedup"] = ref_total.get<double>() / cell["total_ms"].get<double>();
    rows.push_back({{"causal", std::get<0>(key)}, {"shape", shape_of(key)}, {"cells", cells}});
  }

  // Crossover per (variant, column): the first row, by sequence length, where LUNA beats softmax.
  json crossover = json::array();
  for (bool causal : {false, true}) {
    for (size_t ci = 0; ci < columns.size(); ++ci) {
      bool any = false;
      json hit = nullptr;
      for (const auto& row : rows) {
        if (row["causal"] != causal) continue;
        const json& cell = row["cells"][ci];
        if (!cell.contains("softmax_ms") || !cell["softmax_ms"].is_number() || !cell["predicted_total_ms"].is_number())
          continue;
        any = true;
        if (cell["predicted_total_ms"].get<double>() < cell["softmax_ms"].get<double>()) {
          hit = row["shape"];
          break;
        }
      }
      if (!any) continue;
      crossover.push_back({{"causal", causal}, {"column", columns[ci].name},
                           {"seq", hit.is_null() ? json(nullptr) : hit["seq"]}, {"shape", hit}});
    }
  }

  json cols = json::array();
  for (const auto& c : columns)
    cols.push_back({{"column", c.name}, {"label", c.label}, {"arch", c.arch},
                    {"gpu", json_at(c.gpu, "/key")}, {"gpu_name", json_at(c.gpu, "/name")}});
  return json{{"reference", columns[ref].name}, {"columns", cols}, {"rows", rows}, {"crossover", crossover}};
}

namespace {

std::string table_html(const json& s, const char* id, const std::vector<std::string>& fields) {
  std::string t = fmt::format("<table id=\"{}\">\n<tr><th rowspan=\"2\">causal</th><th rowspan=\"2\">B,H,N</th>", id);
  for (const auto& c : s["columns"]) {
    const std::string gpu = c["gpu_name"].is_string() ? c["gpu_name"].get<std::string>() : "no GPU in the table";
    t += fmt::format("<th colspan=\"{}\">{}{} ({})</th>", fields.size(), html_escape(c["column"].get<std::string>()),
                     c["column"] == s["reference"] ? " = reference" : "", html_escape(gpu));
  }
  t += "</tr>\n<tr>";
  for (size_t i = 0; i < s["columns"].size(); ++i)
    for (const auto& f : fields) t += fmt::format("<th>{}</th>", field_header(f));
  t += "</tr>\n";
  int ri = 0;
  for (const auto& row : s["rows"]) {
    const json& sh = row["shape"];
    t += fmt::format("<tr class=\"summary\" data-row=\"{}\"><td class=\"text\">{}</td><td class=\"text\">{},{},{}</td>",
                     ri, row["causal"].get<bool>() ? "causal" : "non-causal", sh["batch"].get<int>(),
                     sh["heads"].get<int>(), sh["seq"].get<int>());
    for (const auto& cell : row["cells"])
      for (const auto& f : fields)
        t += fmt::format("<td data-row=\"{}\" data-column=\"{}\" data-field=\"{}\"{}>{}</td>", ri,
                         html_escape(cell["column"].get<std::string>()), f,
                         f == "config" || f == "total_source" ? " class=\"text\"" : "",
                         html_escape(summary_cell_text(cell, f)));
    t += "</tr>\n";
    ++ri;
  }
  return t + "</table>\n";
}

std::string crossover_text(const json& x) {
  const std::string variant = x["causal"].get<bool>() ? "causal" : "non-causal";
  if (x["seq"].is_null())
    return fmt::format("{}, {}: none in the range (softmax is faster at every swept length)", variant,
                       x["column"].get<std::string>());
  const json& sh = x["shape"];
  return fmt::format("{}, {}: N = {} (B,H = {},{})", variant, x["column"].get<std::string>(), x["seq"].get<int>(),
                     sh["batch"].get<int>(), sh["heads"].get<int>());
}

}  // namespace

int summary_html_height(const json& s) {
  const int rows = int(s["rows"].size()) + 2;
  return 3 * kHeadingPx + 2 * (rows * kRowPx + kGapPx) + int(s["crossover"].size()) * kLinePx + kGapPx;
}

std::string summary_html(const json& s) {
  std::string h = fmt::format("<div id=\"summary\" style=\"height:{}px\">\n", summary_html_height(s));
  h += "<h2>Summary: time per layer by arch (reference " + html_escape(s["reference"].get<std::string>()) + ")</h2>\n";
  h += table_html(s, "summary", summary_fields());
  h += "<h2>Baselines on the same GPU (predicted)</h2>\n" + table_html(s, "baselines", baseline_fields());
  h += "<h2>Crossover: where LUNA beats softmax attention</h2>\n<ul id=\"crossover\">\n";
  for (const auto& x : s["crossover"])
    h += fmt::format("<li data-column=\"{}\" data-causal=\"{}\">{}</li>\n", html_escape(x["column"].get<std::string>()),
                     x["causal"].get<bool>(), html_escape(crossover_text(x)));
  return h + "</ul>\n</div>\n";
}

std::string summary_markdown(const json& s) {
  std::string m = "## Summary: time per layer by arch (reference " + s["reference"].get<std::string>() + ")\n\n";
  auto table = [&](const std::vector<std::string>& fields) {
    std::string t = "| causal | B,H,N |", rule = "|---|---|";
    for (const auto& c : s["columns"])
      for (const auto& f : fields) {
        t += fmt::format(" {} {} |", c["column"].get<std::string>(), field_header(f));
        rule += f == "config" || f == "total_source" ? "---|" : "---:|";
      }
    t += "\n" + rule + "\n";
    for (const auto& row : s["rows"]) {
      const json& sh = row["shape"];
      t += fmt::format("| {} | {},{},{} |", row["causal"].get<bool>() ? "causal" : "non-causal",
                       sh["batch"].get<int>(), sh["heads"].get<int>(), sh["seq"].get<int>());
      for (const auto& cell : row["cells"])
        for (const auto& f : fields) {
          std::string v = summary_cell_text(cell, f);
          for (size_t p = 0; (p = v.find('|', p)) != std::string::npos; p += 2) v.replace(p, 1, "\\|");
          t += " " + v + " |";
        }
      t += "\n";
    }
    return t;
  };
  m += table(summary_fields());
  m += "\nGPUs:";
  for (const auto& c : s["columns"])
    m += fmt::format(" {} = {};", c["column"].get<std::string>(),
                     c["gpu_name"].is_string() ? c["gpu_name"].get<std::string>() : "no GPU in the table");
  m += "\n\n### Baselines on the same GPU (predicted)\n\n" + table(baseline_fields());
  m += "\n### Crossover: where LUNA beats softmax attention\n\n";
  for (const auto& x : s["crossover"]) m += "- " + crossover_text(x) + "\n";
  m += "\n";
  for (const char* f : kFormulas) m += f + std::string("\n\n");
  return m;
}

std::vector<std::string> summary_charts(const json& s) {
  std::vector<std::string> out;
  for (bool causal : {false, true}) {
    LineChart c{fmt::format("Layer time (fwd + bwd) by sequence length: {}", causal ? "causal" : "non-causal"),
                "sequence length", "time (ms)", {}, std::nullopt, "", true, {}};
    bool any = false, measured = false;
    for (size_t ci = 0; ci < s["columns"].size(); ++ci) {
      const std::string col = s["columns"][ci]["column"].get<std::string>();
      const std::string color = kSeriesColors[ci % 6];
      ChartSeries luna{col + " LUNA predicted", color, false, {}, ""}, meas{col + " LUNA measured", color, true, {}, ""},
          soft{col + " softmax (FA-like)", color, false, {}, "2 3"}, eager{col + " eager", color, false, {}, "9 3 2 3"};
      for (const auto& row : s["rows"]) {
        if (row["causal"] != causal) continue;
        const json& cell = row["cells"][ci];
        const double seq = row["shape"]["seq"].get<double>();
        if (json_at(cell, "/predicted_total_ms").is_number()) luna.points.push_back({seq, cell["predicted_total_ms"].get<double>()});
        if (cell.value("total_source", json()) == "measured") meas.points.push_back({seq, cell["total_ms"].get<double>()});
        if (json_at(cell, "/softmax_ms").is_number()) soft.points.push_back({seq, cell["softmax_ms"].get<double>()});
        if (json_at(cell, "/eager_ms").is_number()) eager.points.push_back({seq, cell["eager_ms"].get<double>()});
      }
      for (ChartSeries* ser : {&luna, &meas, &soft, &eager})
        if (!ser->points.empty()) c.series.push_back(*ser), any = true;
      measured = measured || !meas.points.empty();
      for (const auto& x : s["crossover"])
        if (x["causal"] == causal && x["column"] == col && x["seq"].is_number())
          c.x_markers.push_back({x["seq"].get<double>(), "crossover " + col, color});
    }
    if (!any) continue;
    c.note = std::string("solid: LUNA predicted") + (measured ? ", long dashes: measured" : "") +
             "; dotted: softmax; dash-dot: eager; vertical: crossover";
    out.push_back(svg_line_chart(c, kChartWidth, kChartHeight));
  }
  return out;
}

}  // namespace lunajit::report
