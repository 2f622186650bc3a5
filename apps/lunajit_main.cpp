// lunajit: the command-line tool (docs/ARCHITECTURE.md "Command line").
// Exit codes: 0 success, 2 bad usage or bad spec (the message names the field),
// 1 failure (compile error, failed check, missing driver).
#include <chrono>
#include <cstdio>
#include <iostream>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/cache_command.h"
#include "apps/cli_support.h"
#include "apps/report_command.h"
#include "apps/sanitize_option.h"
#include "apps/run_files.h"
#include "apps/tune_command.h"
#include "autotune/validation.h"
#include "codegen/generator.h"
#include "codegen/launch_plan.h"
#include "runtime/backend.h"
#include "runtime/nvrtc_compiler.h"

namespace lunajit {
namespace {

using nlohmann::json;

int exit_code(const Error& e) { return e.kind == ErrorKind::invalid_argument ? 2 : 1; }

int fail(const Error& e) {
  std::fprintf(stderr, "lunajit: %s\n", e.message.c_str());
  return exit_code(e);
}

// Options shared by the commands that take a spec.
struct SpecArgs {
  std::string spec = R"({"family": "luna"})";
  std::string config_json;
  std::string arch = "sm_90";
};

Result<AttentionSpec> read_spec(const SpecArgs& a) { return load_spec(a.spec); }

Result<TileConfig> read_config(const SpecArgs& a, const AttentionSpec& spec, const Arch& arch,
                               Pass pass = Pass::forward) {
  if (a.config_json.empty()) return fitting_default_config(spec, arch, pass);
  auto c = tile_config_from_string(a.config_json, default_config(spec, arch, pass));
  if (!c) return c.error();
  if (auto st = can_implement(spec, *c, arch, pass); !st) return st.error();
  return c;
}

void add_spec_args(CLI::App* cmd, SpecArgs& a, bool with_arch) {
  cmd->add_option("SPEC", a.spec, "spec JSON file or inline JSON text (default: the default LUNA spec)");
  cmd->add_option("--config", a.config_json, "tile config JSON overriding the default, e.g. '{\"chunk\": 32}'");
  if (with_arch) cmd->add_option("--arch", a.arch, "arch whose default config is used (sm_80, sm_90, ...)");
}

// ---------------------------------------------------------------- spec
int cmd_spec(const std::string& family, bool as_json) {
  auto f = parse_family(family);
  if (!f) return fail(f.error());
  std::puts(to_json(default_spec(*f)).dump(as_json ? -1 : 2).c_str());
  return 0;
}

// ---------------------------------------------------------------- emit
int cmd_emit(const SpecArgs& a, const std::string& pass_name, bool as_json) {
  auto spec = read_spec(a);
  if (!spec) return fail(spec.error());
  auto pass = parse_pass(pass_name);
  if (!pass) return fail(pass.error());
  auto arch = parse_arch(a.arch);
  if (!arch) return fail(arch.error());
  auto config = read_config(a, *spec, *arch, *pass);
  if (!config) return fail(config.error());
  auto src = generate(*spec, *config, *pass);
  if (!src) return fail(src.error());
  if (as_json) {
    json entries = json::array();
    for (const auto& e : src->entries) entries.push_back({{"role", e.role}, {"name_expression", e.name_expression}});
    std::puts(json{{"name", src->name}, {"code", src->code}, {"entries", entries},
                   {"content_hash", src->content_hash()}, {"config", config->to_json()}}
                  .dump(2)
                  .c_str());
  } else {
    std::fputs(src->code.c_str(), stdout);
  }
  return 0;
}

// ---------------------------------------------------------------- compile
struct CompileRow {
  std::string arch, pass, role;
  KernelResources res;
  int64_t dynamic_smem = 0;
  double seconds = 0;
  bool cached = false;
};

void print_compile_table(const std::vector<CompileRow>& rows);

Result<std::vector<CompileRow>> compile_all(const AttentionSpec& spec, const SpecArgs& a,
                                            const std::vector<Arch>& archs) {
  std::vector<CompileRow> rows;
  std::vector<std::string> not_fitting;
  for (const Arch& arch : archs) {
    for (Pass pass : {Pass::feature_map, Pass::forward, Pass::backward}) {
      auto config = read_config(a, spec, arch, pass);
      if (!config) {
        // One arch or pass that does not fit must not hide the others' results.
        if (config.error().kind != ErrorKind::invalid_argument) return config.error();
        not_fitting.push_back(config.error().message);
        std::fprintf(stderr, "lunajit: %s %s: does not fit: %s\n", arch.name().c_str(), to_string(pass).data(),
                     config.error().message.c_str());
        continue;
      }
      auto src = generate(spec, *config, pass);
      if (!src) return src.error();
      // NVRTC takes seconds per pass: say what is being compiled (stderr).
      std::fprintf(stderr, "lunajit: compiling %s %s (%s)...\n", arch.name().c_str(), to_string(pass).data(),
                   config->to_string().c_str());
      auto compiled = compile_nvrtc(*src, arch);
      if (!compiled) return compiled.error();
      for (const auto& e : src->entries) {
        CompileRow r{arch.name(), std::string(to_string(pass)), e.role, {}, 0, compiled->compile_seconds,
                     compiled->from_cache};
        if (const KernelResources* res = compiled->find(e.name_expression)) r.res = *res;
        r.dynamic_smem = dynamic_smem_bytes(spec, *config, pass, e.role);
        rows.push_back(r);
      }
    }
  }
  if (!not_fitting.empty()) {
    if (rows.empty()) return Error::invalid(not_fitting.front());
    print_compile_table(rows);
    return Error::invalid(fmt::format("{} of the passes do not fit (above); the others compiled", not_fitting.size()));
  }
  return rows;
}

void print_compile_table(const std::vector<CompileRow>& rows) {
  std::printf("%-7s %-12s %-13s %5s %9s %9s %7s %7s %6s %9s\n", "arch", "pass", "kernel", "regs", "smem", "dyn_smem",
              "spill_st", "spill_ld", "stack", "compile");
  for (const auto& r : rows)
    std::printf("%-7s %-12s %-13s %5d %9d %9lld %7d %7d %6d %8.3fs%s\n", r.arch.c_str(), r.pass.c_str(),
                r.role.c_str(), r.res.registers, r.res.smem_bytes, static_cast<long long>(r.dynamic_smem),
                r.res.spill_stores, r.res.spill_loads, r.res.stack_bytes, r.seconds, r.cached ? " (cached)" : "");
}

json compile_json(const std::vector<CompileRow>& rows) {
  json out = json::array();
  for (const auto& r : rows)
    out.push_back({{"arch", r.arch},
                   {"pass", r.pass},
                   {"kernel", r.role},
                   {"name_expression", r.res.name_expression},
                   {"lowered_name", r.res.lowered_name},
                   {"registers", r.res.registers},
                   {"static_smem_bytes", r.res.smem_bytes},
                   {"dynamic_smem_bytes", r.dynamic_smem},
                   {"spill_stores", r.res.spill_stores},
                   {"spill_loads", r.res.spill_loads},
                   {"stack_bytes", r.res.stack_bytes},
                   {"compile_seconds", r.seconds},
                   {"from_cache", r.cached}});
  return out;
}

int cmd_compile(const SpecArgs& a, const std::string& arch_list, bool as_json) {
  auto spec = read_spec(a);
  if (!spec) return fail(spec.error());
  auto archs = parse_arch_list(arch_list);
  if (!archs) return fail(archs.error());
  auto rows = compile_all(*spec, a, *archs);
  if (!rows) return fail(rows.error());
  if (as_json) std::puts(json{{"spec", to_json(*spec)}, {"kernels", compile_json(*rows)}}.dump(2).c_str());
  else print_compile_table(*rows);
  return 0;
}

// ---------------------------------------------------------------- run
struct RunArgs {
  std::string backend = "auto";
  int batch = 2, heads = 4, seq = 256;
  bool check = false, backward = false, fused = false;
  uint64_t seed = 0;
  std::string sanitize;  // --sanitize (apps/sanitize_option.h)
};

// JSON has no NaN or Infinity: a non-finite error is written as null.
json number_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

json report_json(const CheckReport& r, bool checked) {
  json j = {{"kernel", r.kernel_name}, {"seconds", r.kernel_seconds}, {"nonfinite_outputs", r.nonfinite}};
  if (checked)
    j.update({{"max_abs_error", number_or_null(r.max_abs_error)},
              {"rms_error", number_or_null(r.rms_error)},
              {"rel_rms_error", number_or_null(r.rel_rms)},
              {"tolerance", r.tolerance},
              {"pass", r.pass}});
  return j;
}

int run_backward(Backend& backend, const AttentionSpec& spec, const TileConfig& config, const CheckOptions& opt,
                 bool check, bool as_json) {
  auto rep = check_backward(backend, spec, config, opt);
  if (!rep) return fail(rep.error());
  if (as_json) {
    json tensors = json::array();
    for (const auto& t : rep->tensors)
      tensors.push_back({{"name", t.name},
                         {"max_abs_error", number_or_null(t.max_abs_error)},
                         {"rel_rms_error", number_or_null(t.rel_rms)},
                         {"nonfinite", t.nonfinite},
                         {"pass", t.pass}});
    json j = {{"kernel", rep->kernel_name}, {"seconds", rep->kernel_seconds}, {"backend", backend.description()},
              {"config", config.to_json()}};
    if (check) j.update({{"gradients", tensors}, {"tolerance", rep->tolerance}, {"pass", rep->pass}});
    std::puts(j.dump(2).c_str());
  } else {
    std::printf("%s on %s, config %s, batch %d heads %d seq %d: backward %.3f ms\n", rep->kernel_name.c_str(),
                backend.description().c_str(), config.to_string().c_str(), opt.shape.batch, opt.shape.heads,
                opt.shape.seq, rep->kernel_seconds * 1e3);
    for (const auto& t : rep->tensors)
      if (t.nonfinite > 0 && !check)
        std::printf("  %-6s %lld values are NaN or Inf\n", t.name.c_str(), static_cast<long long>(t.nonfinite));
    if (check) {
      for (const auto& t : rep->tensors) {
        std::printf("  %-6s max abs error %.3e, rms error ratio %.3e%s: %s\n", t.name.c_str(), t.max_abs_error,
                    t.rel_rms,
                    t.nonfinite ? fmt::format(" ({} values NaN or Inf)", t.nonfinite).c_str()
                    : t.within_rounding_floor
                        ? fmt::format(" (within the fp32 rounding floor {:.1e} of its terms)", t.rounding_floor).c_str()
                        : "",
                    t.pass ? "PASS" : "FAIL");
      }
      std::printf("check vs double reference (tolerance %.0e, parameter gradients %.0e): %s\n", rep->tolerance,
                  rep->parameter_tolerance, rep->pass ? "PASS" : "FAIL");
    }
  }
  // Random finite inputs never give a non-finite gradient: say so and fail, even without --check.
  int64_t nonfinite = 0;
  for (const auto& t : rep->tensors) nonfinite += t.nonfinite;
  if (nonfinite > 0) {
    std::fprintf(stderr, "lunajit: %lld gradient values are NaN or Inf (docs/MATH.md \"Non-finite values\")\n",
                 static_cast<long long>(nonfinite));
    return 1;
  }
  return check && !rep->pass ? 1 : 0;
}

int cmd_run(const SpecArgs& a, const RunArgs& r, bool as_json) {
  auto spec = read_spec(a);
  if (!spec) return fail(spec.error());
  auto backend = make_backend(r.backend);
  if (!backend) return fail(backend.error());
  // The default config of the arch named by --arch (the device's own arch on CUDA).
  auto arch = parse_arch(a.arch);
  if (!arch) return fail(arch.error());
  auto config = read_config(a, *spec, *arch, r.backward ? Pass::backward : Pass::forward);
  if (!config) return fail(config.error());
  CheckOptions opt;
  opt.shape = {r.batch, r.heads, r.seq};
  opt.seed = r.seed;
  opt.layout = r.fused ? InputLayout::fused_qkv : InputLayout::contiguous;
  if (r.backward) return run_backward(**backend, *spec, *config, opt, r.check, as_json);
  auto rep = check_forward(**backend, *spec, *config, opt);
  if (!rep) return fail(rep.error());
  if (as_json) {
    json j = report_json(*rep, r.check);
    j["backend"] = (*backend)->description();
    j["config"] = config->to_json();
    std::puts(j.dump(2).c_str());
  } else {
    std::printf("%s on %s, config %s, batch %d heads %d seq %d: %.3f ms\n", rep->kernel_name.c_str(),
                (*backend)->description().c_str(), config->to_string().c_str(), r.batch, r.heads, r.seq,
                rep->kernel_seconds * 1e3);
    if (rep->nonfinite > 0)
      std::printf("%lld of the outputs are NaN or Inf\n", static_cast<long long>(rep->nonfinite));
    if (r.check)
      std::printf("check vs double reference: max abs error %.3e, rms error ratio %.3e (tolerance %.0e): %s\n",
                  rep->max_abs_error, rep->rel_rms, rep->tolerance, rep->pass ? "PASS" : "FAIL");
  }
  if (rep->nonfinite > 0) {
    std::fprintf(stderr, "lunajit: %lld outputs are NaN or Inf (docs/MATH.md \"Non-finite values\")\n",
                 static_cast<long long>(rep->nonfinite));
    return 1;
  }
  return r.check && !rep->pass ? 1 : 0;
}

// ---------------------------------------------------------------- demo
int cmd_demo() {
  std::puts("lunajit demo: the default LUNA spec (bf16), causal and non-causal\n");
  SpecArgs a;
  int status = 0;
  for (bool causal : {false, true}) {
    AttentionSpec spec = default_spec(Family::luna);
    spec.causal = causal;
    a.spec = canonical_json(spec);
    std::printf("== %s ==\n%s\n\n", causal ? "causal" : "non-causal", a.spec.c_str());
    const Arch sm90 = arch_from_sm(90).value_or_throw();
    const auto t0 = std::chrono::steady_clock::now();
    auto src = generate(spec, default_config(spec, sm90), Pass::forward);
    const auto t1 = std::chrono::steady_clock::now();
    if (!src) return fail(src.error());
    std::printf("generated %s: %zu bytes in %.3f ms\n\n", src->name.c_str(), src->code.size(),
                std::chrono::duration<double, std::milli>(t1 - t0).count());
    auto rows = compile_all(spec, a, {arch_from_sm(80).value_or_throw(), sm90});
    if (!rows) return fail(rows.error());
    print_compile_table(*rows);
    std::puts("");

    auto backend = make_backend("auto");
    if (!backend) return fail(backend.error());
    CheckOptions opt;
    opt.shape = {2, 4, 200};
    auto rep = check_forward(**backend, spec, default_config(spec, sm90), opt);
    if (!rep) return fail(rep.error());
    std::printf("validated on %s (batch 2, heads 4, seq 200): rms error ratio %.2e, max abs error %.2e "
                "(tolerance %.0e): %s\n\n",
                (*backend)->description().c_str(), rep->rel_rms, rep->max_abs_error, rep->tolerance,
                rep->pass ? "PASS" : "FAIL");
    if (!rep->pass) status = 1;

    CheckOptions bopt;
    bopt.shape = {1, 2, 100};
    auto brep = check_backward(**backend, spec, default_config(spec, sm90, Pass::backward), bopt);
    if (!brep) return fail(brep.error());
    const TensorError* worst = &brep->tensors.front();
    for (const auto& t : brep->tensors)
      if (t.rel_rms > worst->rel_rms) worst = &t;
    std::printf("backward validated (batch 1, heads 2, seq 100): %zu gradients (dq, dk, dv and every parameter), "
                "worst rms error ratio %.2e (%s): %s\n\n",
                brep->tensors.size(), worst->rel_rms, worst->name.c_str(), brep->pass ? "PASS" : "FAIL");
    if (!brep->pass) status = 1;
    std::fflush(stdout);  // the tuner's progress bar below goes to stderr
  }
  if (const int rc = run_demo_tune(); rc != 0) status = rc;
  if (const int rc = write_demo_report(); rc != 0) return rc;
  return status;
}

// `demo --json`: the demo's text goes to stderr and one JSON summary (exit
// code and what was validated) to stdout, so scripts can read the result.
int cmd_demo_json() {
  std::fflush(stdout);
  const int saved = ::dup(1);
  ::dup2(2, 1);
  const int rc = cmd_demo();
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  std::puts(json{{"demo", "default LUNA spec, causal and non-causal"}, {"exit_code", rc}, {"pass", rc == 0}}
                .dump(2)
                .c_str());
  return rc;
}

}  // namespace
}  // namespace lunajit

int main(int argc, char** argv) {
  using namespace lunajit;
  CLI::App app{"lunajit: JIT kernels for kernelized linear attention (LUNA and relatives)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("lunajit ") + LUNAJIT_VERSION);
  app.option_defaults()->always_capture_default();  // --help shows every default
  bool as_json = false;

  std::string family = "luna";
  auto* spec_cmd = app.add_subcommand("spec", "print the default spec of a family");
  spec_cmd->add_option("--family", family, "luna, performer, rff, elu, relu, t2r, hedgehog, cosformer, slay");
  spec_cmd->add_flag("--json", as_json, "compact JSON");

  SpecArgs emit_args;
  std::string pass = "forward";
  auto* emit_cmd = app.add_subcommand("emit", "print the generated CUDA source");
  add_spec_args(emit_cmd, emit_args, true);
  emit_cmd->add_option("--pass", pass, "feature_map | forward | backward");

  SpecArgs compile_args;
  std::string archs = "sm_80,sm_90";
  auto* compile_cmd = app.add_subcommand("compile", "compile every kernel with NVRTC; print resource usage");
  add_spec_args(compile_cmd, compile_args, false);
  compile_cmd->add_option("--arch", archs, "comma-separated archs: sm_75 ... sm_121");

  SpecArgs run_args;
  RunArgs run;
  auto* run_cmd = app.add_subcommand("run", "run the kernels on random inputs; --check compares with the reference");
  add_spec_args(run_cmd, run_args, true);
  run_cmd->add_option("--backend", run.backend, "auto | cuda | host")->check(CLI::IsMember({"auto", "cuda", "host"}));
  run_cmd->add_option("--batch", run.batch, "batch size")->check(int_in("--batch", limits::kBatch));
  run_cmd->add_option("--heads", run.heads, "heads")->check(int_in("--heads", limits::kHeads));
  run_cmd->add_option("--seq", run.seq, "sequence length")->check(int_in("--seq", limits::kSeq));
  run_cmd->add_option("--seed", run.seed, "seed of the random inputs and parameters")->check(uint64_value("--seed"));
  run_cmd->add_flag("--check", run.check, "compare with the double-precision reference (exit 1 on failure)");
  run_cmd->add_flag("--backward", run.backward, "run the backward pass (checks dq, dk, dv and parameter gradients)");
  run_cmd->add_flag("--fused-qkv", run.fused, "q, k, v as strided slices of one fused buffer");
  RunFiles run_files;  // --inputs / --save (apps/run_files.h)
  add_run_file_options(run_cmd, run_files);
  run_cmd->add_option("--sanitize", run.sanitize, "host sanitizers: init,bounds,sync,race,banks,all,schedule=reverse|random:SEED");

  ReportArgs report_args;
  const ReportCommand report_cmd = add_report_command(app, report_args);

  const Subcommand tune_cmd = add_tune_command(app);
  const Subcommand cache_cmd = add_cache_command(app);

  auto* demo_cmd = app.add_subcommand("demo", "the main job on its defaults: generate, compile, validate");
  add_json_everywhere(app, as_json);

  if (const int rc = parse_command_line(app, normalize_argv(app, argc, argv)); rc >= 0) return rc;
  try {
    if (*compile_cmd || *run_cmd || *demo_cmd || *report_cmd.report)
      if (auto st = check_cache_environment(); !st) return fail(st.error());
    if (*spec_cmd) return cmd_spec(family, as_json);
    if (*emit_cmd) return cmd_emit(emit_args, pass, as_json);
    if (*compile_cmd) return cmd_compile(compile_args, archs, as_json);
    if (*run_cmd && !run_files.inputs.empty())
      return run_with_sanitize(run.sanitize, run.backend, [&] {
        return run_with_files(run_files, run_args.spec, run_args.config_json, run_args.arch, run.backend, run.backward,
                              run.seed, as_json);
      });
    if (*run_cmd) return run_with_sanitize(run.sanitize, run.backend, [&] { return cmd_run(run_args, run, as_json); });
    if (*demo_cmd) return as_json ? cmd_demo_json() : cmd_demo();
    if (*tune_cmd.cmd) return tune_cmd.run();
    if (*cache_cmd.cmd) return cache_cmd.run();
    if (*report_cmd.report) return run_report_command(report_cmd, report_args, as_json);
  } catch (const LunajitError& e) {
    return fail(e.error());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lunajit: internal error: %s\n", e.what());
    return 1;
  }
  return 2;
}
