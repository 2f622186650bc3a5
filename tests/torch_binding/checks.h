// Assertions shared by the binding's tests (op_test.cpp, varlen_test.cpp).
#pragma once

#include <functional>
#include <string>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lunajit::testing {

// max |a - b| <= atol + rtol * max |b| (in double); shapes must agree; empty tensors pass.
inline void expect_close(const torch::Tensor& a, const torch::Tensor& b, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  if (b.numel() == 0) return;
  const double err = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  const double scale = b.to(torch::kDouble).abs().max().item<double>();
  EXPECT_LE(err, atol + rtol * scale) << what << ": max abs error " << err << ", max |ref| " << scale;
}

// fn throws a c10::Error whose message contains `message`.
inline void expect_rejected(const std::function<void()>& fn, const std::string& message) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected an error containing: " << message;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
        << "message: " << e.what_without_backtrace() << "\nexpected to contain: " << message;
  }
}

}  // namespace lunajit::testing
