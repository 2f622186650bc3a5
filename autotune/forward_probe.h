// ForwardProbe: one fixed forward problem (seeded random q, k, v rounded to the
// spec's dtype, the family's initial parameters) on which the tuner runs every
// candidate config, so that outputs can be compared with each other and with
// the double-precision reference. validation.h's check_forward is the
// one-shot form of the same check; the tolerances are its forward_tolerance.
#pragma once

#include <vector>

#include "autotune/validation.h"

namespace lunajit {

class ForwardProbe {
 public:
  // Inputs of options.shape from options.seed (contiguous layout).
  static Result<ForwardProbe> create(const AttentionSpec& spec, const CheckOptions& options);

  // The output of `config` on `backend`, decoded to double, [batch, seq, heads, dv].
  Result<std::vector<double>> run(Backend& backend, const TileConfig& config) const;
  // The reference output (double precision; of options.reference_spec when set).
  Result<std::vector<double>> reference() const;

  const AttentionSpec& spec() const { return spec_; }
  const ProblemShape& shape() const { return options_.shape; }

 private:
  AttentionSpec spec_;
  CheckOptions options_;
  std::vector<double> q_, k_, v_;  // rounded to the dtype
  std::vector<uint8_t> q_bytes_, k_bytes_, v_bytes_;
  std::vector<float> params_;
};

// rel_rms etc. of `got` against `want` with `dtype`'s forward tolerance; a
// non-finite value or a size mismatch fails.
CheckReport compare_outputs(const std::vector<double>& got, const std::vector<double>& want, DType dtype);

}  // namespace lunajit
