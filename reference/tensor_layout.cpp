#include "reference/tensor_layout.h"

#include <fmt/format.h>

#include "codegen/feature_params.h"

namespace lunajit::reference {

std::vector<double> gather_head(std::span<const double> x, const AttentionShape& shape, int width,
                                int b, int h) {
  std::vector<double> out(size_t(shape.seq) * width);
  for (int t = 0; t < shape.seq; ++t) {
    const double* src = x.data() + shape.row(b, t, h) * width;
    for (int c = 0; c < width; ++c) out[size_t(t) * width + c] = src[c];
  }
  return out;
}

void scatter_head(std::span<const double> head, const AttentionShape& shape, int width, int b,
                  int h, std::span<double> x, bool accumulate) {
  for (int t = 0; t < shape.seq; ++t) {
    double* dst = x.data() + shape.row(b, t, h) * width;
    for (int c = 0; c < width; ++c)
      dst[c] = (accumulate ? dst[c] : 0.0) + head[size_t(t) * width + c];
  }
}

std::vector<double> to_double(std::span<const float> x) { return {x.begin(), x.end()}; }

int64_t param_block_offset(const AttentionSpec& spec, int h) {
  return spec.params_per_head ? h * param_layout(spec).per_head_floats : 0;
}

Status check_sizes(const AttentionSpec& spec, const AttentionShape& shape, size_t q_size,
                   size_t k_size, size_t v_size, size_t params_size) {
  if (shape.batch < 1 || shape.seq < 1 || shape.heads < 1)
    return Error::invalid(fmt::format("shape batch={} seq={} heads={}: every count must be >= 1",
                                      shape.batch, shape.seq, shape.heads));
  auto check = [](const char* name, size_t got, int64_t want) -> Status {
    if (int64_t(got) != want)
      return Error::invalid(fmt::format("{} has {} elements: expected {} for the spec and shape",
                                        name, got, want));
    return ok_status();
  };
  const int64_t rows = shape.rows();
  if (Status s = check("q", q_size, rows * spec.head_dim); !s) return s;
  if (Status s = check("k", k_size, rows * spec.head_dim); !s) return s;
  if (Status s = check("v", v_size, rows * spec.value_dim); !s) return s;
  const int64_t params = param_layout(spec).total_floats(spec, shape.heads);
  return check("params", params_size, params);
}

}  // namespace lunajit::reference
