#include "apps/report_command.h"

#include <cstdio>
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "report/kernel_report.h"
#include "report/render.h"

namespace lunajit {
namespace {

int fail(const Error& e) {
  std::fprintf(stderr, "lunajit: %s\n", e.message.c_str());
  return e.kind == ErrorKind::invalid_argument ? 2 : 1;
}

Result<report::ReportOptions> options_from(const ReportArgs& a) {
  report::ReportOptions o;
  auto archs = parse_arch_list(a.archs);
  if (!archs) return archs.error();
  o.archs = std::move(*archs);
  auto shapes = parse_shapes(a.shapes, "--shapes");
  if (!shapes) return shapes.error();
  o.shapes = std::move(*shapes);
  if (a.causal == "both") o.causal = report::CausalVariants::both;
  else if (a.causal != "spec") return Error::invalid(fmt::format("--causal = {}: allowed: spec, both", a.causal));
  o.measure = !a.no_measure;
  o.bank_profile = a.bank_profile;
  o.compile = !a.no_compile;
  if (a.repeats < 1) return Error::invalid(fmt::format("--repeats = {}: must be >= 1", a.repeats));
  o.measure_repeats = a.repeats;
  o.reference = a.reference;
  if (!a.config.empty()) {
    try {
      o.config = nlohmann::json::parse(a.config);
    } catch (const nlohmann::json::exception& e) {
      return Error::invalid(fmt::format("--config: not JSON ({})", e.what()));
    }
  }
  return o;
}

void print_written(const std::filesystem::path& dir, std::initializer_list<const char*> files, bool as_json,
                   const nlohmann::json& extra) {
  if (as_json) {
    nlohmann::json j = extra;
    j["out"] = std::filesystem::absolute(dir).string();
    j["files"] = nlohmann::json::array();
    for (const char* f : files) j["files"].push_back((std::filesystem::absolute(dir) / f).string());
    std::puts(j.dump(2).c_str());
    return;
  }
  for (const char* f : files) std::printf("wrote %s\n", (std::filesystem::absolute(dir) / f).string().c_str());
}

int run_report(const ReportArgs& a, bool as_json) {
  auto spec = load_spec(a.spec);
  if (!spec) return fail(spec.error());
  auto opts = options_from(a);
  if (!opts) return fail(opts.error());
  auto r = report::build_report(*spec, *opts);
  if (!r) return fail(r.error());
  if (auto st = report::write_report(*r, a.out); !st) return fail(st.error());
  print_written(a.out, {"report.json", "report.md", "report.html"}, as_json,
                {{"mode", (*r)["machine"]["mode"]}, {"kernels", (*r)["kernels"].size()}});
  return 0;
}

}  // namespace

ReportCommand add_report_command(CLI::App& app, ReportArgs& a) {
  ReportCommand c;
  c.report = app.add_subcommand("report", "kernel report: resources, occupancy, PTX census, bytes/FLOPs, the cost "
                                          "model's prediction and limiter (and measured) time per kernel as JSON, "
                                          "Markdown and HTML");
  c.report->add_option("SPEC", a.spec, "spec JSON file or inline JSON text (default: the default LUNA spec)");
  c.report->add_option("--arch", a.archs, "comma-separated archs, e.g. sm_80,sm_90,sm_100");
  c.report->add_option("--shapes", a.shapes, "problem shapes B,H,N[;B,H,N...]");
  c.report->add_option("--out", a.out, "output directory (report.json, report.md, report.html)");
  c.report->add_option("--causal", a.causal, "spec: the spec's causality; both: causal and non-causal");
  c.report->add_flag("--no-measure", a.no_measure, "predict only, even on a GPU");
  c.report->add_flag("--bank-profile", a.bank_profile,
                     "run every pass on the host under the banks sanitizer and add a table of the worst "
                     "shared-memory bank-conflict sites");
  c.report->add_flag("--no-compile", a.no_compile, "skip NVRTC (no registers, spills or occupancy)");
  c.report->add_option("--repeats", a.repeats, "launches per timed kernel on a GPU");
  c.report->add_option("--config", a.config,
                       "tile config JSON over every pass's default (in place of the tuning database), e.g. "
                       "'{\"state_splits\": 1}'; also used by --bank-profile");
  c.report->add_option("--reference", a.reference,
                       "the arch the summary's speedups are relative to (default: the first --arch)");
  c.compare = c.report->add_subcommand("compare", "several report.json on one multi-arch page: the summary with "
                                                   "baselines and crossover, charts, kernels side by side "
                                                   "(compare.md, compare.html)");
  c.compare->add_option("REPORTS", a.compare_inputs, "report JSON files")->required();
  c.compare->add_option("--out", a.compare_out, "output directory");
  c.compare->add_option("--reference", a.compare_reference,
                        "the summary column speedups are relative to: \"label arch\", an arch or a label "
                        "(default: the first column)");
  return c;
}

int run_report_command(const ReportCommand& c, const ReportArgs& a, bool as_json) {
  if (c.compare && *c.compare) {
    std::vector<std::filesystem::path> paths(a.compare_inputs.begin(), a.compare_inputs.end());
    if (auto st = report::write_compare(paths, a.compare_out, a.compare_reference); !st) return fail(st.error());
    print_written(a.compare_out, {"compare.md", "compare.html"}, as_json, {{"reports", paths.size()}});
    return 0;
  }
  return run_report(a, as_json);
}

int write_demo_report() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path dir = !ec && exe.parent_path().filename() == "apps" ? exe.parent_path().parent_path() / "report"
                                                                     : fs::current_path() / "lunajit-report";
  ReportArgs a;
  a.out = dir.string();
  std::printf("== kernel report: default LUNA spec, %s, shapes %s ==\n", a.archs.c_str(), a.shapes.c_str());
  const int rc = run_report(a, false);
  if (rc == 0) std::printf("report: open %s\n", (dir / "report.html").string().c_str());
  return rc;
}

}  // namespace lunajit
