// Shared by the host tests (forward, backward, mma): the host
// backend, the arch whose limits the host runs under, and the unusual-dims
// cases (d 48 / dv 40 and d 96 / dv 96 for every family; luna also with
// M = 6, L = 5, Hm = 24).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/host/host_backend.h"

namespace lunajit::testing_host {

inline Backend& host_backend() {
  static std::unique_ptr<Backend> backend = make_host_backend();
  return *backend;
}

// bf16 buffers on the host backend for the tests that drive AttentionRunner
// directly (mma_host_test.cpp, mma_backward_host_test.cpp: packed batches).
namespace buffers {

inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// data == nullptr: zero-filled.
inline Buffer upload(const void* data, size_t bytes) {
  Buffer b = host_backend().allocate(std::max<size_t>(bytes, 4)).value_or_throw();
  const std::vector<char> zeros(data == nullptr ? bytes : 0, 0);
  if (bytes) {
    EXPECT_TRUE(host_backend().copy_to_device(b, data != nullptr ? data : zeros.data(), bytes).ok());
  }
  return b;
}
template <class T>
std::vector<T> download(const Buffer& b, size_t n) {
  std::vector<T> x(n);
  EXPECT_TRUE(host_backend().copy_to_host(x.data(), b, n * sizeof(T)).ok());
  return x;
}
inline double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace buffers

// The host emulator has no arch of its own; configs are chosen under sm_90's limits.
inline const Arch& sm90() {
  static const Arch a = arch_from_sm(90).value_or_throw();
  return a;
}

enum class Which { default_config, smallest, largest };

inline const char* which_name(Which w) {
  return w == Which::default_config ? "default" : w == Which::smallest ? "smallest" : "largest";
}

struct DimsCase {
  Family family;
  int d, dv;
  bool causal;
};

inline std::vector<DimsCase> unusual_dims_cases() {
  std::vector<DimsCase> cases;
  for (Family f : kAllFamilies)
    for (bool causal : {false, true}) {
      cases.push_back({f, 48, 40, causal});
      cases.push_back({f, 96, 96, causal});
    }
  return cases;
}

inline std::string dims_case_name(const ::testing::TestParamInfo<DimsCase>& info) {
  const DimsCase& c = info.param;
  return fmt::format("{}_d{}_dv{}_{}", to_string(c.family), c.d, c.dv, c.causal ? "causal" : "noncausal");
}

// The family's default spec at the case's dims (feature counts follow d).
inline AttentionSpec unusual_dims_spec(const DimsCase& c) {
  AttentionSpec spec = default_spec(c.family);
  spec.head_dim = c.d;
  spec.value_dim = c.dv;
  spec.causal = c.causal;
  spec.t2r.features = c.d;
  spec.hedgehog.features = c.d;
  spec.luna.projections = 6;
  spec.luna.channels = 5;
  spec.luna.mlp_width = 24;
  return spec;
}

}  // namespace lunajit::testing_host
