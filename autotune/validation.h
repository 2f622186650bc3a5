// Validation of generated kernels against the double-precision reference: the
// check every tile configuration must pass before the tuner may pick it, and
// what `lunajit run --check` prints.
//
// Inputs are seeded random N(0, 1) values rounded to the spec's dtype first, so
// the reference sees exactly what the kernel sees and the error measured is the
// kernel's own (fp32 accumulation order, fp32 transcendental functions, and the
// final rounding of O to the I/O dtype).
//
// Tolerance on rel_rms = rms(out - ref) / rms(ref):
//   fp32 1e-5: every sum is fp32 over at most n * D terms; the observed error
//        is ~1e-7..1e-6 (fp32 epsilon 6e-8 times a few hundred accumulations
//        in the worst case) and a real bug (a wrong index, a missing mask
//        term) moves it to 1e-2..1.
//   fp16/bf16 1e-2: the output is rounded to the I/O dtype; bf16 keeps 8
//        significant bits (unit roundoff 2^-8 = 3.9e-3), so rounding alone gives
//        rel_rms ~1e-3; 1e-2 leaves 5x headroom for fp32 differences and
//        still fails any real bug. fp16 (2^-11) uses the same bound.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codegen/launch_plan.h"
#include "runtime/backend.h"

namespace lunajit {

// Memory layout of q, k, v in a check.
enum class InputLayout {
  contiguous,  // three [batch, seq, heads, dim] tensors
  fused_qkv,   // one [batch, seq, heads, d + d + dv] buffer, q/k/v are strided slices
};

struct CheckOptions {
  ProblemShape shape;
  uint64_t seed = 0;
  InputLayout layout = InputLayout::contiguous;
  double input_scale = 1.0;  // inputs ~ N(0, input_scale^2)
  // Tests only: judge the kernel against the reference of another spec (with
  // the same dims), to show that a wrong result is caught.
  std::optional<AttentionSpec> reference_spec{};
};

struct CheckReport {
  double max_abs_error = 0;
  double rms_error = 0;
  double rms_reference = 0;
  double rel_rms = 0;        // rms_error / rms_reference
  int64_t nonfinite = 0;     // outputs that are NaN or +-Inf (errors are then infinite)
  double tolerance = 0;
  bool pass = false;
  double kernel_seconds = 0;  // wall time of the forward on the backend
  std::string kernel_name;
};

// Host memory a check of `shape` allocates (estimate, bytes), and an error
// (invalid_argument, with the figure) when it exceeds this machine's memory:
// checked before anything is allocated, so a huge shape never ends in bad_alloc.
int64_t check_host_bytes(const AttentionSpec& spec, const ProblemShape& shape, bool backward);
Status check_host_memory(const AttentionSpec& spec, const ProblemShape& shape, bool backward);

// The bound rel_rms must stay under for dtype (see the comment above).
double forward_tolerance(DType dtype);

// Runs the forward kernels of (spec, config) on `backend` with random inputs and
// compares with reference::linear_attention_forward.
Result<CheckReport> check_forward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                  const CheckOptions& options);

// Error of one gradient tensor ("dq", "dk", "dv", or a parameter's name).
struct TensorError {
  std::string name;
  double max_abs_error = 0;
  double rel_rms = 0;  // rms(got - ref) / max(rms(ref), scale): see check_backward
  double rms_reference = 0;
  int64_t nonfinite = 0;
  // 16 fp32 units of roundoff of the rms magnitude of the terms the gradient
  // sums, and whether the tensor passed only within it (see check_backward).
  double rounding_floor = 0;
  bool within_rounding_floor = false;
  bool pass = false;
};

struct BackwardCheckReport {
  std::vector<TensorError> tensors;  // dq, dk, dv, then every learned parameter tensor
  double tolerance = 0;            // of dq, dk, dv: forward_tolerance
  double parameter_tolerance = 0;  // of the parameter gradients: parameter_gradient_tolerance
  bool pass = false;
  double kernel_seconds = 0;  // the backward alone
  std::string kernel_name;
  std::vector<float> dparams;  // the parameter gradients as computed (for determinism checks)
  std::vector<uint8_t> dq, dk, dv;  // raw gradient bytes in the I/O dtype
};

// Runs the forward (with `forward_config`) and the backward (with `config`) on
// random inputs and upstream gradients, and compares dq, dk, dv and every
// learned parameter gradient with reference::linear_attention_backward. The
// bounds are the forward's (forward_tolerance): the same fp32 accumulation and
// the same final rounding of dq, dk, dv to the I/O dtype.
// Every gradient (dq, dk, dv and each parameter's) also passes when its rms
// error is within 16 units of fp32 roundoff (16 * 2^-24) of the rms magnitude
// of the terms it sums (reference Gradients::*_terms: the same sums with every
// part taken absolute, e.g. |S| |g| + |z| |r| for dphi_q = S g + z r): a float sum
// of terms carries an error of up to (n - 1) u sum|terms| (Higham, Accuracy
// and Stability of Numerical Algorithms, §4.2), typically sqrt(n) u, so 16 u is
// what an honest fp32 result shows where the exact value cancels (at seq 1 every
// feature-map gradient is exactly 0: one key gives o = v whatever phi is), and a
// lost or doubled term, an error of ~1/N of that magnitude, is far above it.
// A parameter gradient's error is measured against the scale of all parameter
// gradients of the spec, max(rms(ref of the tensor), rms(ref of every learned
// tensor)): a gradient such as luna's db2 is a sum over all tokens whose terms
// cancel (normalized attention is invariant to scaling phi), so its own rms is
// far below the size of the terms it sums, and the rounding of those terms
// (fp32, and o saved in the I/O dtype) is what its error is made of.
Result<BackwardCheckReport> check_backward(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                           const CheckOptions& options);

}  // namespace lunajit
