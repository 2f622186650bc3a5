// Shared by forward_host_test.cpp and backward_host_test.cpp: the host
// backend, the arch whose limits the host runs under, and the unusual-dims
// cases (d 48 / dv 40 and d 96 / dv 96 for every family; luna also with
// M = 6, L = 5, Hm = 24).
#pragma once

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
