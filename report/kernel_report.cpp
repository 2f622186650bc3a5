#include "report/kernel_report.h"

#include <algorithm>
#include <charconv>
#include <ctime>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "autotune/tuner.h"
#include "cache/binary_cache.h"
#include "cache/tuning_db.h"
#include "codegen/generator.h"
#include "codegen/gpu_specs.h"
#include "codegen/cost_model.h"
#include "report/measure.h"
#include "report/ptx_census.h"
#include "report/summary.h"
#include "report/occupancy.h"
#include "autotune/validation.h"
#include "runtime/host/host_backend.h"
#include "runtime/host/sanitizer.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/nvrtc_compiler.h"

namespace lunajit::report {
namespace {

using nlohmann::json;

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json shape_json(const ProblemShape& s) { return {{"batch", s.batch}, {"heads", s.heads}, {"seq", s.seq}}; }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// The host bank profile (ReportOptions::bank_profile): per causal variant and
// pass, the sites of block (0,0,0) with wavefronts above the conflict-free count.
json bank_profile(const AttentionSpec& spec_in, const std::vector<bool>& variants, const Arch& arch,
                  const ProblemShape& first, const json& given, json& notes) {
  const ProblemShape shape{1, 1, std::min(first.seq, 256)};
  HostBackend host;
  host.set_sanitize(host::parse_sanitize("banks").value_or_throw());
  json sites = json::array(), kernels = json::array();
  std::uint64_t total = 0, ideal = 0;
  for (bool causal : variants) {
    AttentionSpec spec = spec_in;
    spec.causal = causal;
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const std::vector<host::KernelBankSite> before = host::bank_sites_so_far();
      CheckOptions o;
      o.shape = shape;
      // One config for the check and the model rows beside it: the default,
      // or the given one over it (build_report has checked that it parses).
      TileConfig config = default_config(spec, arch, pass);
      if (!given.is_null()) config = tile_config_from_json(given, config).value_or_throw();
      Status st = ok_status();
      if (pass == Pass::forward) {
        auto r = check_forward(host, spec, config, o);
        if (!r) st = r.error();
      } else {
        auto r = check_backward(host, spec, config, o);
        if (!r) st = r.error();
      }
      if (!st) {
        notes.push_back(fmt::format("bank profile of the {} {}: {}", causal ? "causal" : "non-causal", to_string(pass),
                                    first_line(st.error().message)));
        continue;
      }
      // Per kernel of the pass: block (0,0,0)'s wavefronts beside the cost
      // model's shared-memory wavefronts per block at the same shape (its
      // layout formulas; they also count the feature map's parameter reads
      // through the L1 datapath, which the emulator does not see).
      std::map<std::string, std::string> role_of;  // name expression -> role
      if (auto src = generate(spec, config, pass))
        for (const KernelEntry& e : src->entries) role_of[e.name_expression] = e.role;
      std::map<std::string, std::pair<double, double>> model;  // role -> (wavefronts per block, blocks)
      if (auto counts = pass_counts(spec, config, pass, shape))
        for (const KernelCounts& c : *counts)
          model[c.role] = {c.blocks > 0 ? c.smem_wavefronts / c.blocks : 0.0, c.blocks};
      std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> per_kernel;  // kernel -> (wavefronts, ideal)
      // What this pass added to the process-wide statistics.
      for (const host::KernelBankSite& k : host::bank_sites_so_far()) {
        std::uint64_t ex = k.site.executions, wf = k.site.wavefronts, id = k.site.ideal;
        for (const host::KernelBankSite& b : before) {
          if (b.kernel == k.kernel && b.site.file == k.site.file && b.site.line == k.site.line &&
              b.site.column == k.site.column && b.site.bytes == k.site.bytes && b.site.write == k.site.write) {
            ex -= b.site.executions;
            wf -= b.site.wavefronts;
            id -= b.site.ideal;
          }
        }
        // Only the pass's own kernels: a backward check runs the forward's first.
        if (ex == 0 || role_of.count(k.kernel) == 0) continue;
        total += wf;
        ideal += id;
        per_kernel[k.kernel].first += wf;
        per_kernel[k.kernel].second += id;
        if (wf == id) continue;
        std::string file = k.site.file;
        if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
        sites.push_back({{"causal", causal}, {"pass", to_string(pass)}, {"kernel", k.kernel},
                         {"site", fmt::format("{}:{}:{}", file, k.site.line, k.site.column)},
                         {"access", k.site.write ? "store" : "load"}, {"bytes", k.site.bytes},
                         {"warp_accesses", ex}, {"wavefronts", wf}, {"conflict_free_wavefronts", id},
                         {"wavefronts_per_access", static_cast<double>(wf) / static_cast<double>(ex)}});
      }
      for (const auto& [kernel, counts] : per_kernel) {
        const auto role = role_of.find(kernel);
        json row = {{"causal", causal},
                    {"pass", to_string(pass)},
                    {"kernel", kernel},
                    {"role", role->second},
                    {"wavefronts", counts.first},
                    {"conflict_free_wavefronts", counts.second}};
        if (auto m = model.find(role->second); m != model.end()) {
          row["model_wavefronts_per_block"] = m->second.first;
          row["blocks"] = m->second.second;
        }
        kernels.push_back(std::move(row));
      }
    }
  }
  std::stable_sort(sites.begin(), sites.end(), [](const json& a, const json& b) {
    return a["wavefronts"].get<std::uint64_t>() - a["conflict_free_wavefronts"].get<std::uint64_t>() >
           b["wavefronts"].get<std::uint64_t>() - b["conflict_free_wavefronts"].get<std::uint64_t>();
  });
  if (sites.size() > 30) sites.erase(sites.begin() + 30, sites.end());
  return {{"shape", shape_json(shape)}, {"arch", arch.name()}, {"block", "(0,0,0)"}, {"total_wavefronts", total},
          {"conflict_free_wavefronts", ideal}, {"kernels", kernels}, {"sites", sites}};
}

json arch_json(const Arch& a, const GpuSpec* gpu, bool gpu_is_device) {
  json limits = {{"max_smem_per_block", a.max_smem_per_block},
                 {"max_smem_per_sm", a.max_smem_per_sm},
                 {"smem_reserved_per_block", a.smem_reserved_per_block},
                 {"max_threads_per_block", a.max_threads_per_block},
                 {"max_threads_per_sm", a.max_threads_per_sm},
                 {"registers_per_sm", a.registers_per_sm},
                 {"max_registers_per_thread", a.max_registers_per_thread},
                 {"register_alloc_unit", a.register_alloc_unit},
                 {"max_blocks_per_sm", a.max_blocks_per_sm}};
  json g = nullptr;
  if (gpu)
    g = {{"key", gpu->key},
         {"name", gpu->name},
         {"sm_count", gpu->sm_count},
         {"memory_gbps", gpu->memory_gbps},
         {"fp32_tflops", gpu->fp32_tflops},
         {"bf16_tensor_tflops", gpu->bf16_tensor_tflops},
         {"l2_mib", gpu->l2_mib},
         {"source", gpu->source},
         {"chosen_as", gpu_is_device ? "the measured device" : "representative of the arch"}};
  return {{"arch", a.name()}, {"sm", a.sm}, {"limits", limits}, {"gpu", g}};
}

// Compiles once per (source, arch); the resources of every kernel of a source.
class ResourceTable {
 public:
  explicit ResourceTable(BinaryCache* cache) {
    opts_.cache = cache;
    opts_.emit_ptx = true;  // for the PTX census (report/ptx_census.h)
  }
  const Result<CompiledKernel>& get(const KernelSource& src, const Arch& arch) {
    const std::string key = src.content_hash() + arch.name();
    auto it = compiled_.find(key);
    if (it == compiled_.end()) it = compiled_.emplace(key, compile_nvrtc(src, arch, opts_)).first;
    return it->second;
  }

 private:
  NvrtcOptions opts_;
  std::map<std::string, Result<CompiledKernel>> compiled_;
};


}  // namespace

ReportConfig report_config(const AttentionSpec& spec, const Arch& arch, Pass pass, const ProblemShape& shape) {
  const TuningDb db(BinaryCache::default_dir(), model_fingerprint(arch));
  const ConfigChoice choice = choose_config(db, spec, pass, shape, arch);
  if (choice.from == LookupKind::none) return {choice.config, "default (untuned)", false, ""};
  // The bucket of the entry the choice came from (for "nearest", not the shape's own).
  const TuningLookup hit = db.lookup(tuning_key(spec, pass, shape));
  const std::string bucket =
      hit.entry ? fmt::format("seq{}/bh{}", hit.entry->key.bucket.seq, hit.entry->key.bucket.batch_heads) : "";
  return {choice.config, fmt::format("{} ({} bucket {})", choice.method, to_string(choice.from), bucket), true, bucket};
}

Result<ReportConfig> report_config(const AttentionSpec& spec, const Arch& arch, Pass pass, const ProblemShape& shape,
                                   const json& given) {
  if (given.is_null()) return report_config(spec, arch, pass, shape);
  auto c = tile_config_from_json(given, default_config(spec, arch, pass));
  if (!c) return Error::invalid("--config: " + c.error().message);
  return ReportConfig{*c, "given (--config)", false, ""};
}

Result<json> build_report(const AttentionSpec& spec_in, const ReportOptions& opt) {
  if (auto st = validate(spec_in); !st) return st.error();
  if (opt.archs.empty()) return Error::invalid("archs: empty; expected e.g. sm_80,sm_90,sm_100");
  if (opt.shapes.empty()) return Error::invalid("shapes: empty; expected B,H,N[;B,H,N...]");
  for (const auto& s : opt.shapes)
    if (auto st = validate(s); !st) return st.error();
  if (!opt.reference.empty() &&
      std::none_of(opt.archs.begin(), opt.archs.end(), [&](const Arch& a) { return a.name() == opt.reference; }))
    return Error::invalid(fmt::format("--reference {}: not one of the report's archs", opt.reference));

  json notes = json::array();
  std::unique_ptr<CudaBackend> gpu;
  if (opt.measure) {
    auto b = CudaBackend::create();
    if (b) gpu = std::move(*b);
    else {
      // The driver's message ends in a hint for `run` ("use --backend host"), an option report has not.
      std::string why = first_line(b.error().message);
      if (const size_t hint = why.find("; use --backend host"); hint != std::string::npos) why.erase(hint);
      notes.push_back("no GPU: every time is predicted from the roofline (" + why + ")");
    }
  } else {
    notes.push_back("measurement off: every time is predicted from the roofline");
  }
  const int device_sm = gpu ? gpu->device().sm() : 0;
  bool any_measured = false;

  std::vector<bool> variants;
  if (opt.causal == CausalVariants::both) variants = {false, true};
  else variants = {spec_in.causal};

  ResourceTable resources(opt.cache);
  json archs = json::array(), passes = json::array(), kernels = json::array();
  for (const Arch& arch : opt.archs) {
    const GpuSpec* device_gpu = gpu && device_sm == arch.sm ? find_gpu(gpu->device().name) : nullptr;
    const GpuSpec* product = device_gpu ? device_gpu : representative_gpu(arch.sm);
    archs.push_back(arch_json(arch, product, device_gpu != nullptr));
    if (!product) notes.push_back(fmt::format("{}: no GPU product in the table; no predicted times", arch.name()));
    const bool measure_here = gpu && device_sm == arch.sm;
    if (gpu && !measure_here)
      notes.push_back(fmt::format("{}: predicted only (the GPU here is {}, sm_{})", arch.name(),
                                  gpu->device().name, device_sm));

    for (size_t vi = 0; vi < variants.size(); ++vi) {
      AttentionSpec spec = spec_in;
      spec.causal = variants[vi];
      for (Pass pass : {Pass::feature_map, Pass::forward, Pass::backward}) {
        // The feature map kernel does not depend on causality: reported once.
        if (pass == Pass::feature_map && vi > 0) continue;
        json pass_row = {{"arch", arch.name()}, {"pass", to_string(pass)}, {"causal", spec.causal}};
        auto probed = report_config(spec, arch, pass, opt.shapes.front(), opt.config);
        if (!probed) return probed.error();
        const ReportConfig& probe = *probed;
        auto probe_src = generate(spec, probe.config, pass);
        // A given config may not fit this arch or pass (the tuner's and the
        // defaults' configs do): the pass is skipped with can_implement's reason.
        Status fits = ok_status();
        if (!opt.config.is_null()) fits = can_implement(spec, probe.config, arch, pass);
        if (!probe_src || !fits) {
          pass_row["status"] = "skipped";
          pass_row["note"] = !fits ? fits.error().message : probe_src.error().message;
          passes.push_back(pass_row);
          continue;
        }
        pass_row["status"] = "reported";
        pass_row["note"] = "";
        passes.push_back(pass_row);

        for (const ProblemShape& shape : opt.shapes) {
          auto chosen = report_config(spec, arch, pass, shape, opt.config);
          if (!chosen) return chosen.error();
          const ReportConfig& choice = *chosen;
          auto src = generate(spec, choice.config, pass);
          if (!src) return src.error();
          const auto& compiled = opt.compile ? resources.get(*src, arch)
                                             : Result<CompiledKernel>(Error::unavailable("compilation off"));
          // At the split count the cost model picks for the product (what
          // CudaBackend::plan_splits runs on it), with ptxas registers.
          const std::map<std::string, KernelUsage> usage =
              compiled ? usage_by_role(*src, *compiled) : std::map<std::string, KernelUsage>{};
          const int splits = product ? best_splits(spec, choice.config, pass, shape, *product, arch, usage) : 0;
          auto plan = plan_launches(spec, choice.config, pass, shape, splits);
          std::map<std::string, KernelTiming> timings;
          json timing_note = nullptr;
          if (measure_here) {
            auto t = measure_pass(*gpu, spec, choice.config, pass, shape, opt.measure_repeats);
            if (t) timings = std::move(*t);
            else timing_note = "not measured: " + first_line(t.error().message);
          }
          // Kernels the plan does not launch at this shape (the reduces at
          // one range, the causal forward's state pass at one range): no row,
          // one note; the rows are what the pass runs.
          std::vector<std::string> idle;
          if (plan)
            for (const KernelEntry& entry : src->entries)
              if (std::none_of(plan->launches.begin(), plan->launches.end(),
                               [&](const KernelLaunch& l) { return l.role == entry.role; }))
                idle.push_back(entry.role);
          if (!idle.empty())
            notes.push_back(fmt::format("{} {}{} at {}x{}x{}: {} ranges of the config's {}; not launched: {}",
                                        arch.name(), to_string(pass), spec.causal ? " (causal)" : "", shape.batch,
                                        shape.heads, shape.seq, plan->splits, choice.config.state_splits(),
                                        fmt::join(idle, ", ")));
          for (const KernelEntry& entry : src->entries) {
            if (std::find(idle.begin(), idle.end(), entry.role) != idle.end()) continue;
            json k;
            json knotes = json::array();
            k["arch"] = arch.name();
            k["gpu"] = product ? json(product->key) : json(nullptr);
            k["pass"] = to_string(pass);
            k["causal"] = spec.causal;
            k["kernel"] = entry.role;
            k["name_expression"] = entry.name_expression;
            k["shape"] = shape_json(shape);
            k["config"] = {{"tile", choice.config.to_json()}, {"string", choice.config.to_string()},
                           {"how", choice.how}, {"tuned", choice.tuned},
                           {"bucket", choice.tuned ? json(choice.bucket) : json(nullptr)}};

            const KernelLaunch* launch = nullptr;
            if (plan) {
              for (const auto& l : plan->launches)
                if (l.role == entry.role) launch = &l;
            } else {
              knotes.push_back("no launch plan: " + plan.error().message);
            }
            k["launch"] = launch ? json{{"grid", launch->grid}, {"threads", launch->threads},
                                        {"dynamic_smem_bytes", launch->smem_bytes}, {"splits", plan->splits}}
                                 : json(nullptr);

            const KernelResources* res = compiled ? compiled->find(entry.name_expression) : nullptr;
            if (!compiled) knotes.push_back("no resource usage: " + first_line(compiled.error().message));
            k["resources"] = res ? json{{"registers", res->registers},
                                        {"static_smem_bytes", res->smem_bytes},
                                        {"spill_stores", res->spill_stores},
                                        {"spill_loads", res->spill_loads},
                                        {"stack_bytes", res->stack_bytes}}
                                 : json(nullptr);
            k["ptx_census"] = nullptr;
            if (res && compiled) {
              if (auto ln = compiled->lowered_names.find(entry.name_expression); ln != compiled->lowered_names.end()) {
                const PtxCensus census = ptx_census(compiled->ptx, ln->second);
                if (census.found) k["ptx_census"] = census.to_json();
                else knotes.push_back("no PTX census: the PTX has no entry " + ln->second);
              }
            }
            if (res && launch) {
              const Occupancy o = theoretical_occupancy(
                  arch, {int(launch->threads), res->registers, res->smem_bytes, launch->smem_bytes});
              k["occupancy"] = {{"blocks_per_sm", o.blocks_per_sm},
                                {"limited_by", o.limited_by},
                                {"blocks_by_threads", o.blocks_by_threads},
                                {"blocks_by_registers", o.blocks_by_registers},
                                {"blocks_by_smem", o.blocks_by_smem},
                                {"blocks_by_limit", o.blocks_by_limit},
                                {"active_warps", o.active_warps},
                                {"max_warps", o.max_warps},
                                {"fraction", o.fraction}};
            } else {
              k["occupancy"] = nullptr;
            }

            // Counted with the split count the plan runs it with.
            auto cost = kernel_counts(
                spec, plan ? choice.config.with_state_splits(plan->splits) : choice.config, pass, entry.role, shape);
            std::optional<KernelPrediction> predicted;
            if (cost) {
              if (launch) {
                cost->blocks = double(launch->grid[0]) * launch->grid[1] * launch->grid[2];
                cost->threads = int(launch->threads);
                cost->dynamic_smem = launch->smem_bytes;
              }
              k["cost"] = {{"bytes", cost->bytes},
                           {"flops", cost->flops},
                           {"arithmetic_intensity", cost->arithmetic_intensity()},
                           {"tensor_flops", cost->tc_flops},
                           {"cuda_core_flops", cost->cuda_flops},
                           {"shared_wavefronts", cost->smem_wavefronts},
                           {"sfu_ops", cost->sfu_ops},
                           {"serial_steps", cost->serial_steps}};
              if (product && launch)
                predicted = predict_kernel(*cost, *product, arch,
                                           res ? std::optional(KernelUsage{res->registers, res->smem_bytes})
                                               : std::nullopt);
            } else {
              k["cost"] = nullptr;
              knotes.push_back(cost.error().message);
            }
            if (predicted)
              k["predicted"] = {{"time_ms", predicted->ms},
                                {"memory_time_ms", predicted->dram_ms},
                                {"compute_time_ms", std::max({predicted->tensor_ms, predicted->fp32_ms,
                                                              predicted->shared_ms, predicted->sfu_ms})},
                                {"bound", predicted->limiter == "dram" ? "memory" : "compute"},
                                {"limiter", predicted->limiter},
                                {"roofline_ms", predicted->limb_ms()},
                                {"tensor_time_ms", predicted->tensor_ms},
                                {"fp32_time_ms", predicted->fp32_ms},
                                {"shared_time_ms", predicted->shared_ms},
                                {"sfu_time_ms", predicted->sfu_ms},
                                {"serial_time_ms", predicted->serial_ms},
                                {"efficiency", predicted->efficiency}};
            else
              k["predicted"] = nullptr;

            k["measured"] = nullptr;
            if (auto it = timings.find(entry.role); it != timings.end() && it->second.time_ms > 0) {
              const double ms = it->second.time_ms;
              json m = {{"time_ms", ms}, {"repeats", it->second.repeats}, {"device", gpu->device().name}};
              if (cost) {
                m["gbps"] = cost->bytes / (ms * 1e-3) / 1e9;
                m["tflops"] = cost->flops / (ms * 1e-3) / 1e12;
              }
              if (predicted) m["roofline_fraction"] = predicted->limb_ms() / ms;
              k["measured"] = m;
              any_measured = true;
            } else if (!timing_note.is_null()) {
              knotes.push_back(timing_note);
            }
            k["status"] = k["measured"].is_null() ? "predicted" : "measured";
            k["notes"] = knotes;
            kernels.push_back(std::move(k));
          }
        }
      }
    }
  }

  json report;
  report["schema"] = "lunajit.report";
  report["schema_version"] = kReportSchemaVersion;
  report["generator"] = {{"lunajit_version", LUNAJIT_VERSION}, {"nvrtc_version", opt.compile ? nvrtc_version() : ""},
                         {"created_utc", utc_now()}};
  report["machine"] = {{"mode", any_measured ? "measured" : "predicted"},
                       {"device", gpu ? json(gpu->description()) : json(nullptr)},
                       {"device_sm", gpu ? json(device_sm) : json(nullptr)}};
  report["spec"] = to_json(spec_in);
  report["spec_hash"] = spec_hash(spec_in);
  report["causal_variants"] = opt.causal == CausalVariants::both ? "both" : "spec";
  json shapes = json::array();
  for (const auto& s : opt.shapes) shapes.push_back(shape_json(s));
  report["shapes"] = shapes;
  report["archs"] = archs;
  if (opt.bank_profile)
    report["bank_conflicts"] = bank_profile(spec_in, variants, opt.archs.front(), opt.shapes.front(), opt.config, notes);
  report["passes"] = passes;
  report["kernels"] = kernels;
  report["notes"] = notes;
  auto summary = build_summary({report}, {""}, opt.reference);
  if (!summary) return summary.error();
  report["summary"] = std::move(*summary);
  return report;
}

}  // namespace lunajit::report
