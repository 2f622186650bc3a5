// Sequence parallelism over c10d (ProcessGroupGloo, FileStore rendezvous in a
// temporary directory): launches 2 and 4 rank processes of seq_parallel_worker
// on this machine, then compares each rank's output and q, k, v gradients with
// its slice of the single-process lunajit::linear_attention (ATen path) on the
// whole sequence, and the sum over ranks of the feature-parameter gradients with
// the single-process one; causal and non-causal, luna (two variants), elu
// (with grouped-query k, v) and hedgehog, on the ATen path and on the host
// kernels (sp_cases.h). Also: each rank's run
// repeats bit for bit, the bytes the communicator counted equal the formula,
// and the rejections (families, reduction).
//
// Tolerance: atol 2e-5 + rtol 2e-4 * max|ref| (fp32 both sides; only the
// summation order differs: per-rank deltas added in rank order against chunk
// states cumulated over the whole sequence, n * D terms of O(1) values), as
// for the fp32 comparisons of tests/torch_binding/op_test.cpp. The host
// kernels' cases are held to the same bound: their fp32 sums differ from
// ATen's only in order too (their own error against the double reference is
// checked in tests/autotune at 5e-6 + 1e-6).
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sp_cases.h"

#ifndef LUNAJIT_SEQ_PARALLEL_WORKER
#error "LUNAJIT_SEQ_PARALLEL_WORKER (the worker's path) must be defined by the build"
#endif

namespace lunajit::dist::testing {
namespace {

using torch::Tensor;

double g_worst = 0;  // the largest err / (atol + rtol * max|ref|) seen, printed per test

void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a - b).abs().max().item<double>();
  const double scale = b.abs().max().item<double>();
  g_worst = std::max(g_worst, err / (2e-5 + 2e-4 * scale));
  EXPECT_LE(err, 2e-5 + 2e-4 * scale) << what << ": max abs error " << err << ", max |ref| " << scale;
}

// The single-process [o, dq, dk, dv, dparams] of case i.
std::vector<Tensor> single_process(const SpCase& c, int i) {
  const SpInputs in = sp_inputs(c, i);
  Tensor q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true),
         v = in.v.clone().requires_grad_(true), params = in.params.clone().requires_grad_(true);
  LinearAttentionOptions opts;
  opts.path = AttentionPath::aten;
  const Tensor o = linear_attention(q, k, v, params, spec_of(c), opts);
  (o * in.dout).sum().backward();
  return {o.detach(), q.grad(), k.grad(), v.grad(), params.grad().defined() ? params.grad() : torch::zeros_like(params)};
}

void run_and_compare(int world) {
  const std::string dir = make_temp_dir("lunajit-sp-test-");
  const std::string store = dir + "/store";
  const auto codes = run_ranks(
      world,
      [&](int r) {
        return std::vector<std::string>{LUNAJIT_SEQ_PARALLEL_WORKER, "--rank", std::to_string(r), "--world",
                                        std::to_string(world), "--store", store, "--out", dir};
      },
      std::chrono::seconds(600));  // cold: the ranks wait for one another's host-kernel compiles
  for (int r = 0; r < world; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r << " of " << world << " failed";

  const std::vector<int64_t> lengths = shard_lengths(world);
  const auto cases = sp_cases();
  const char* names[] = {"o", "dq", "dk", "dv"};
  for (size_t i = 0; i < cases.size(); ++i) {
    const SpCase& c = cases[i];
    SCOPED_TRACE(c.name + ", " + std::to_string(world) + " ranks");
    const std::vector<Tensor> want = single_process(c, int(i));
    const AttentionSpec spec = spec_of(c);
    const int64_t payload = sequence_parallel_payload_bytes(spec, kBatch, kHeads, torch::kFloat);
    Tensor dparams = torch::zeros_like(want[4]);
    for (int r = 0; r < world; ++r) {
      std::vector<Tensor> got;
      torch::load(got, dir + "/" + c.name + ".rank" + std::to_string(r) + ".pt");
      ASSERT_EQ(got.size(), 6u);
      const int64_t start = shard_start(lengths, r), n = lengths[r];
      for (int j = 0; j < 4; ++j)
        expect_close(got[j], want[j].narrow(1, start, n), std::string(names[j]) + " on rank " + std::to_string(r));
      dparams += got[4];
      const auto st = got[5];
      const bool allreduce = c.reduction == Reduction::backend_allreduce;
      // Forward and backward: one collective each, of the packed (S | z) delta.
      EXPECT_EQ(st[0].item<int64_t>(), allreduce ? 0 : 2) << "allgather calls, rank " << r;
      EXPECT_EQ(st[1].item<int64_t>(), allreduce ? 2 : 0) << "allreduce calls, rank " << r;
      EXPECT_EQ(st[2].item<int64_t>(), 2 * payload) << "payload bytes, rank " << r;
      EXPECT_EQ(st[3].item<int64_t>(), allreduce ? 0 : 2 * payload * (world - 1)) << "received bytes, rank " << r;
      EXPECT_EQ(st[4].item<int64_t>(), 1) << "a second run on rank " << r << " differed in some bit";
    }
    if (want[4].numel()) expect_close(dparams, want[4], "dparams summed over ranks");
  }
  std::printf("%d ranks: largest error / tolerance over all cases, outputs and gradients: %.3g\n", world, g_worst);
  g_worst = 0;
  std::filesystem::remove_all(dir);
}

TEST(SequenceParallel, TwoRanksMatchOneProcess) { run_and_compare(2); }
TEST(SequenceParallel, FourRanksMatchOneProcess) { run_and_compare(4); }

// A group of one rank, in this process: the op's rejections name what is wrong.
class OneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir("lunajit-sp-one-");
    comm_ = std::make_unique<Communicator>(make_process_group(dir_ + "/store", 0, 1));
  }
  void TearDown() override {
    comm_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<Communicator> comm_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_F(OneRank, MatchesOneProcessAndCountsNoReceivedBytes) {
  const SpCase c = sp_cases()[1];  // luna causal
  const SpInputs in = sp_inputs(c, 1);
  const Tensor o = sequence_parallel_linear_attention(*comm_, in.q, in.k, in.v, in.params, spec_of(c));
  expect_close(o, single_process(c, 1)[0], "o, one rank");
  EXPECT_EQ(comm_->stats().allgather_calls, 1);
  EXPECT_EQ(comm_->stats().received_bytes, 0);
}

TEST_F(OneRank, RejectsWholeSequenceFamiliesAndCausalAllreduce) {
  for (const char* fam : {R"("family": "performer", "performer": {"features": 6})", R"("family": "cosformer")"}) {
    const SpCase c{"x", fam, false};
    const SpInputs in = sp_inputs(c, 0);
    const std::string err =
        error_of([&] { sequence_parallel_linear_attention(*comm_, in.q, in.k, in.v, in.params, spec_of(c)); });
    EXPECT_NE(err.find("is not supported"), std::string::npos) << fam << ": " << err;
    EXPECT_NE(err.find("supported: luna"), std::string::npos) << err;
  }
  const SpCase c = sp_cases()[1];  // causal
  const SpInputs in = sp_inputs(c, 1);
  SequenceParallelOptions opts;
  opts.reduction = Reduction::backend_allreduce;
  const std::string err =
      error_of([&] { sequence_parallel_linear_attention(*comm_, in.q, in.k, in.v, in.params, spec_of(c), opts); });
  EXPECT_NE(err.find("backend_allreduce is for non-causal"), std::string::npos) << err;
  EXPECT_NE(error_of([&] { make_process_group(dir_ + "/other", 0, 1, {.backend = "mpi"}); }).find("must be \"gloo\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_process_group(dir_ + "/other", 3, 2); }).find("rank = 3"), std::string::npos);
}

}  // namespace
}  // namespace lunajit::dist::testing

namespace lunajit::dist {
namespace {

// The launcher the tests and examples rely on: exit codes per rank, and a
// rank that hangs is killed at the timeout (124) instead of hanging the test.
TEST(RunRanks, ReportsEachRanksExitCodeAndKillsAtTheTimeout) {
  const auto codes = run_ranks(
      2, [](int r) { return std::vector<std::string>{"/bin/sh", "-c", "exit " + std::to_string(3 * r)}; },
      std::chrono::seconds(30));
  EXPECT_EQ(codes, (std::vector<int>{0, 3}));
  const auto t0 = std::chrono::steady_clock::now();
  const auto hung = run_ranks(
      2,
      [](int r) {
        return r == 0 ? std::vector<std::string>{"/bin/sh", "-c", "exit 0"}
                      : std::vector<std::string>{"/bin/sleep", "30"};
      },
      std::chrono::milliseconds(300));
  EXPECT_EQ(hung, (std::vector<int>{0, 124}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_THROW(run_ranks(1, [](int) { return std::vector<std::string>{"/nonexistent/lunajit-rank"}; },
                         std::chrono::seconds(5)),
               c10::Error);
}

}  // namespace
}  // namespace lunajit::dist
