// Dumps lunajit's slay parameters (codegen init_params, defaults R=3 P=8 M=16, d=16) and the
// reference FeatureMap's phi of 64 N(0,1) rows to slay_dump.txt, for
// `python3 scripts/slay_error_budget.py --check-reference slay_dump.txt` (an independent numpy map).
// Build from the repo root (no CMake, no LibTorch):
//   g++ -std=c++20 -O1 -DLUNAJIT_VERSION='"dev"' -I. scripts/slay_reference_dump.cpp reference/feature_map.cpp \
//     reference/luna_feature_map.cpp codegen/feature_params.cpp codegen/attention_spec.cpp \
//     codegen/feature_map_info.cpp common/*.cpp -lfmt -lxxhash -o /tmp/slay_reference_dump
#include <cstdio>
#include <vector>
#include <random>
#include "codegen/attention_spec.h"
#include "codegen/feature_params.h"
#include "reference/feature_map.h"
using namespace lunajit;
int main() {
  AttentionSpec s;
  s.family = Family::slay;
  s.head_dim = 16;
  s.params_per_head = false;
  const int n = 64, d = 16;
  auto pf = init_params(s, 1, 0);
  std::vector<double> p(pf.begin(), pf.end());
  reference::FeatureMap fm(s, p);
  std::mt19937_64 g(123);
  std::normal_distribution<double> N01;
  std::vector<double> x(n * d);
  for (auto& v : x) v = N01(g);
  std::vector<double> phi(size_t(n) * fm.dim());
  fm.forward(x.data(), n, reference::RowContext{}, phi.data());
  FILE* f = std::fopen("slay_dump.txt", "w");
  std::fprintf(f, "%d %d %d %zu\n", n, d, fm.dim(), p.size());
  for (double v : p) std::fprintf(f, "%.17g\n", v);
  for (double v : x) std::fprintf(f, "%.17g\n", v);
  for (double v : phi) std::fprintf(f, "%.17g\n", v);
  std::fclose(f);
  std::printf("D=%d params=%zu\n", fm.dim(), p.size());
}
