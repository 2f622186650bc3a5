// Kernel reports (docs/ARCHITECTURE.md "report/"): for a spec, a set of problem
// shapes and a set of archs, one row per kernel of every pass the generator
// accepts (feature map, forward, backward) with its resources (NVRTC/ptxas),
// theoretical occupancy (codegen/occupancy.h), its PTX instruction census
// (report/ptx_census.h), the cost model's counts and predicted time with its
// limiting resource on the arch's representative GPU (codegen/cost_model.h,
// codegen/gpu_specs.h), the tile config and how it was chosen; on a GPU of
// one of the archs also the measured time, achieved GB/s and TFLOP/s and the
// fraction of the roofline (the model's largest limb at peak); and the
// hardware-comparison summary of all of it (report/summary.h) as "summary".
//
// The report is a JSON document (schema: docs/report_schema.json, version
// kReportSchemaVersion); the Markdown and HTML renderings (report/render.h) are
// made from that JSON, so their numbers are the JSON's by construction.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "codegen/arch.h"
#include "codegen/attention_spec.h"
#include "codegen/launch_plan.h"
#include "codegen/tile_config.h"
#include "common/result.h"

namespace lunajit {
class BinaryCache;
}

namespace lunajit::report {

// Bumped on any change that breaks a reader of the JSON (a field removed,
// renamed or retyped); adding an optional field keeps the version.
inline constexpr int kReportSchemaVersion = 1;
inline constexpr const char* kReportSchemaId = "https://lunajit.dev/schemas/report-1.json";

enum class CausalVariants { spec, both };

struct ReportOptions {
  std::vector<Arch> archs;
  std::vector<ProblemShape> shapes;
  CausalVariants causal = CausalVariants::spec;
  bool compile = true;   // resources from NVRTC (else registers/spills are null)
  bool measure = true;   // time on the GPU when there is one of a requested arch
  int measure_repeats = 20;
  BinaryCache* cache = nullptr;  // nullptr: BinaryCache::global()
  // Host bank profile (README "Host sanitizers", banks): every pass at the
  // default config of the first arch (or `config` over it), run on the host
  // under the banks check at shape (1, 1, min(seq of the first shape, 256));
  // the report gains
  // "bank_conflicts" (the sites with the most wavefronts above conflict-free).
  bool bank_profile = false;
  // A tile config (JSON, `lunajit run --config`'s form) applied over every
  // pass's config in place of the tuning database's choice, and over the
  // bank profile's default: every kernel is reported at it, marked "given".
  // null: none. A pass the config cannot implement is listed as skipped.
  nlohmann::json config;
  // The arch whose column the summary's speedups are relative to (report/summary.h);
  // empty: the first of `archs`. Error when it is not one of them.
  std::string reference;
};

// The tile config a report uses for (spec, arch, shape) and how it was chosen:
// the tuning database of the arch's model fingerprint (what `lunajit tune
// --arch` writes without a GPU; autotune/tuner.h choose_config: exact bucket,
// else nearest, else the default), e.g. "model-ranked (exact bucket
// seq1024/bh8)" (the bucket of the database entry used) or "default (untuned)".
struct ReportConfig {
  TileConfig config;
  std::string how;
  bool tuned = false;  // from the tuning database
  std::string bucket;  // the entry's shape bucket, "seq1024/bh8"; empty when not tuned
};
ReportConfig report_config(const AttentionSpec& spec, const Arch& arch, Pass pass, const ProblemShape& shape);
// With a given config (ReportOptions::config, non-null): the default config of
// (spec, arch, pass) with it applied, how = "given (--config)". Error names
// the field when the JSON is not a tile config.
Result<ReportConfig> report_config(const AttentionSpec& spec, const Arch& arch, Pass pass, const ProblemShape& shape,
                                   const nlohmann::json& given);

// Builds the report; Error only for bad input (no archs or shapes, an invalid
// spec or shape). A pass the generator rejects (backward, until it exists) is
// listed under "passes" as skipped with the generator's message; a kernel
// NVRTC cannot compile keeps null resources and a note.
Result<nlohmann::json> build_report(const AttentionSpec& spec, const ReportOptions& options);


}  // namespace lunajit::report
