// `lunajit report`: kernel reports (report/) from the command line.
//
//   lunajit report SPEC --arch sm_80,sm_90 --shapes 2,8,1024[;B,H,N...] --out DIR
//                  [--causal spec|both] [--no-measure] [--no-compile] [--repeats R] [--reference ARCH]
//   lunajit report compare A.json B.json ... --out DIR [--reference COLUMN]
//
// The first writes DIR/report.json, report.md and report.html; the second
// DIR/compare.md and compare.html. Exit codes as every command: 0, 2 for bad
// input (the message names it), 1 for a failure.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace lunajit {

struct ReportArgs {
  std::string spec = R"({"family": "luna"})";
  std::string archs = "sm_80,sm_90,sm_100";
  std::string shapes = "2,16,1024;2,16,4096;2,16,16384";
  std::string out = "lunajit-report";
  std::string causal = "spec";
  bool no_measure = false;
  bool bank_profile = false;  // --bank-profile
  std::string config;         // --config: a tile config JSON over every pass's default
  bool no_compile = false;
  int repeats = 20;
  std::string reference;          // --reference: the summary's speedup reference (default: the first arch)
  std::vector<std::string> compare_inputs;
  std::string compare_out = "lunajit-compare";
  std::string compare_reference;  // compare --reference: a column "label arch", an arch or a label
};

struct ReportCommand {
  CLI::App* report = nullptr;
  CLI::App* compare = nullptr;
};

// Adds `report` (and its `compare` subcommand) to `app`, bound to `args`.
ReportCommand add_report_command(CLI::App& app, ReportArgs& args);

// Runs whichever of the two was parsed; prints where the files are.
int run_report_command(const ReportCommand& cmd, const ReportArgs& args, bool as_json);

// The end of `lunajit demo`: a report of the default spec for sm_80, sm_90 and
// sm_100 (predicted; measured on a GPU of one of them) next to the build
// (<build>/report when run from <build>/apps, else ./lunajit-report).
int write_demo_report();

}  // namespace lunajit
