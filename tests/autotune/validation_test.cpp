// The error measures of the checks (autotune/validation.h): non-finite values
// are never reported as "max abs error 0".
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "autotune/forward_probe.h"
#include "autotune/validation.h"

namespace lunajit {
namespace {

TEST(ErrorMeasure, AllNanOutputIsAnInfiniteErrorNotZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> want{1.0, -2.0, 0.5};
  const CheckReport r = compare_outputs({nan, nan, nan}, want, DType::fp32);
  EXPECT_EQ(r.nonfinite, 3);
  EXPECT_TRUE(std::isinf(r.max_abs_error));
  EXPECT_FALSE(r.pass);
  const CheckReport inf = compare_outputs({1.0, std::numeric_limits<double>::infinity(), 0.5}, want, DType::fp32);
  EXPECT_EQ(inf.nonfinite, 1);
  EXPECT_FALSE(inf.pass);
  const CheckReport ok = compare_outputs(want, want, DType::fp32);
  EXPECT_EQ(ok.nonfinite, 0);
  EXPECT_EQ(ok.max_abs_error, 0.0);
  EXPECT_TRUE(ok.pass);
}

TEST(HostMemory, HugeShapesAreRefusedWithTheFigure) {
  const AttentionSpec spec = default_spec(Family::luna);
  auto st = check_host_memory(spec, {65535, 65535, 256}, false);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(st.error().message.find("GiB of host memory"), std::string::npos) << st.error().message;
  EXPECT_TRUE(check_host_memory(spec, {2, 4, 256}, true).ok());
  EXPECT_GT(check_host_bytes(spec, {1, 1, 1000}, true), check_host_bytes(spec, {1, 1, 1000}, false));
}

}  // namespace
}  // namespace lunajit
