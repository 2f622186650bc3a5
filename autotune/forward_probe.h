// ForwardProbe: one fixed problem (seeded random q, k, v rounded to the spec's
// dtype, in the layout the options ask for, and the family's initial
// parameters) on which the tuner runs every candidate config, so that outputs
// can be compared with each other and with the double-precision reference.
// validation.h's check_forward and check_backward are built on it; the
// tolerances are validation.h's.
#pragma once

#include <vector>

#include "autotune/validation.h"
#include "lunajit/kernel_args.cuh"

namespace lunajit {

// A contiguous [batch, seq, heads, dim] device tensor of an I/O dtype, zeroed.
struct DeviceTensor {
  Buffer buf;
  MutableTensorRef ref{};
  TensorRef cref() const { return {ref.data, ref.stride_batch, ref.stride_seq, ref.stride_head}; }
};
Result<DeviceTensor> make_device_tensor(Backend& backend, const ProblemShape& shape, int dim, DType dtype);

// Bytes of `values` in `dtype`, rounding `values` in place to what the dtype holds.
std::vector<uint8_t> encode_rounded(std::vector<double>& values, DType dtype);
// The values of a buffer of `dtype` elements.
std::vector<double> decode_values(const std::vector<uint8_t>& bytes, DType dtype);

class ForwardProbe {
 public:
  // Inputs of options.shape from options.seed, laid out as options.layout.
  static Result<ForwardProbe> create(const AttentionSpec& spec, const CheckOptions& options);

  // q, k, v (strided slices of one buffer for InputLayout::fused_qkv) and the
  // parameters, on a backend.
  struct DeviceInputs {
    Buffer qkv, q_buf, k_buf, v_buf, params;
    TensorRef q{}, k{}, v{};
  };
  Result<DeviceInputs> upload(Backend& backend) const;

  // The output of `config` on `backend`, decoded to double, [batch, seq, heads, dv];
  // `kernel_seconds` (when given) gets the wall time of the forward alone.
  Result<std::vector<double>> run(Backend& backend, const TileConfig& config, double* kernel_seconds = nullptr) const;
  // The reference output (double precision; of options.reference_spec when set).
  Result<std::vector<double>> reference() const;

  const AttentionSpec& spec() const { return spec_; }
  const CheckOptions& options() const { return options_; }
  const ProblemShape& shape() const { return options_.shape; }
  // What the reference sees: the inputs as rounded to the dtype, and the parameters.
  const std::vector<double>& q() const { return q_; }
  const std::vector<double>& k() const { return k_; }
  const std::vector<double>& v() const { return v_; }
  const std::vector<float>& params() const { return params_; }

 private:
  AttentionSpec spec_;
  CheckOptions options_;
  std::vector<double> q_, k_, v_;  // rounded to the dtype
  std::vector<uint8_t> q_bytes_, k_bytes_, v_bytes_;
  std::vector<float> params_;
};

// rel_rms etc. of `got` against `want` with `dtype`'s forward tolerance; a
// non-finite value or a size mismatch fails.
// Error of `got` against `want`: max abs, rms, rms of the reference, and the
// count of non-finite values of `got` (which make the errors infinite).
struct ErrorStats {
  double max_abs_error = 0, rms_error = 0, rms_reference = 0;
  int64_t nonfinite = 0;
  bool size_mismatch = false;
  bool finite() const { return nonfinite == 0 && !size_mismatch; }
};
ErrorStats measure_error(const std::vector<double>& got, const std::vector<double>& want);

CheckReport compare_outputs(const std::vector<double>& got, const std::vector<double>& want, DType dtype);

}  // namespace lunajit
