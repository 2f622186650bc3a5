// Multi-process plumbing on LibTorch's own distributed engine (c10d): process
// groups (ProcessGroupGloo on CPUs; ProcessGroupNCCL where LibTorch has CUDA and
// NCCL's header was found, LUNAJIT_WITH_NCCL), a communicator that counts the
// bytes it hands to the group, deterministic fixed-rank-order reductions as
// autograd functions (what sequence parallelism needs), the gradient
// all-reduce of data-parallel training, and a launcher that runs R ranks as
// child processes on this machine (tests, examples, benchmarks).
//
// Rendezvous is a c10d::FileStore: one file that every rank opens, in a
// temporary directory on one machine, or on a filesystem every node mounts
// (docs/ARCHITECTURE.md, "Distributed"). Gloo's TCP device binds `hostname`
// (127.0.0.1 on one machine; the node's reachable address across nodes).
//
// Collective discipline: every call here is a collective; every rank must make
// the same calls in the same order, including the backward ones (so every rank
// runs backward when any does, with the same tensors requiring grad). A rank
// that throws leaves the others waiting until the group's timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

namespace lunajit::dist {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

struct GroupOptions {
  std::string backend = "gloo";         // "gloo" (CPU tensors) or "nccl" (CUDA tensors; LUNAJIT_WITH_NCCL builds)
  std::string hostname = "127.0.0.1";   // gloo: the address this rank's TCP device binds
  std::chrono::milliseconds timeout{60'000};  // a collective (and the rendezvous) waiting longer fails
};

// A process group of `world` ranks meeting at the FileStore `store_path` (the
// file is created by the first rank to arrive; it must not be left over from
// an earlier group). TORCH_CHECK errors name the bad argument.
ProcessGroupPtr make_process_group(const std::string& store_path, int rank, int world, const GroupOptions& options = {});

// Whether make_process_group can make a "nccl" group in this build.
bool nccl_available();

// What this rank handed to the process group: calls, the bytes of the tensors
// it contributed (payload_bytes) and the bytes of other ranks' tensors it
// received into its output buffers (received_bytes; all-gathers only: an
// all-reduce's wire traffic depends on the backend's algorithm, ring: 2 (R-1)/R
// of the payload sent and received per rank).
struct CommStats {
  int64_t calls = 0;
  int64_t allgather_calls = 0;
  int64_t allreduce_calls = 0;
  int64_t payload_bytes = 0;
  int64_t received_bytes = 0;
};

// A process group plus counters. Not thread-safe; one per group.
class Communicator {
 public:
  explicit Communicator(ProcessGroupPtr group);
  int rank() const { return rank_; }
  int world() const { return world_; }
  const ProcessGroupPtr& group() const { return group_; }

  // Every rank's `t` (same shape, dtype and device on every rank), indexed by
  // rank. One allgather.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t);
  // t := the sum of every rank's t, in place, by the backend's allreduce (its
  // summation order is the algorithm's: Gloo's ring reduces each chunk of the
  // buffer starting at a different rank, so the bits may differ from a sum in
  // rank order, though every rank gets the same bits). t contiguous.
  void all_reduce_sum(torch::Tensor& t);
  // Rank `root`'s t into every rank's t, in place.
  void broadcast(torch::Tensor& t, int root = 0);
  void barrier();

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  ProcessGroupPtr group_;
  int rank_ = 0, world_ = 1;
  CommStats stats_;
};

// How a sum over ranks is formed.
enum class Reduction {
  // allgather, then every rank adds the R tensors in rank order 0, 1, ..., R-1:
  // the same bits on every rank and in every run, whatever the arrival order.
  // Receives x the payload.
  fixed_order,
  // the backend's allreduce (less traffic for large R; see all_reduce_sum).
  backend_allreduce,
};

// Differentiable collectives over `comm` (which must outlive the backward pass).
// delta: this rank's contribution, the same shape on every rank.
//
// sum_over_ranks: sum_j delta_j on every rank. Backward: d delta_r = sum_j
// grad_j (every rank's output gradient, summed the same way).
torch::Tensor sum_over_ranks(Communicator& comm, const torch::Tensor& delta, Reduction reduction = Reduction::fixed_order);
// exclusive_prefix_over_ranks: sum_{j<r} delta_j on rank r (zeros on rank 0),
// summed in rank order. Backward, the reverse exclusive prefix: d delta_r =
// sum_{j>r} grad_j, summed in rank order. One allgather each way.
torch::Tensor exclusive_prefix_over_ranks(Communicator& comm, const torch::Tensor& delta);

// Data-parallel gradient averaging: every defined .grad() of `params` := the
// mean over ranks, by the backend's allreduce on flat buckets of at most
// `bucket_bytes` (grads grouped in parameter order by dtype and device; a
// parameter larger than a bucket is a bucket of its own). Returns the bytes
// handed to the group. Every rank must pass the same parameters in the same
// order with the same grads defined.
int64_t all_reduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& params,
                             int64_t bucket_bytes = int64_t(1) << 20);

// ---- single-machine launcher -------------------------------------------------

// A fresh private directory under $TMPDIR (or /tmp) for a FileStore; the caller
// removes it (std::filesystem::remove_all) when the ranks are done.
std::string make_temp_dir(const std::string& prefix = "lunajit-dist-");

// Runs argv_of(rank) for rank = 0 .. world-1 as child processes (argv[0] is the
// executable path; no shell), waits for all of them and returns each rank's exit
// code: 0.. from exit(), 128 + signal when killed by a signal, 124 for a rank
// still running after `timeout` (then every remaining rank is killed).
// Throws (TORCH_CHECK) when a process cannot be started.
std::vector<int> run_ranks(int world, const std::function<std::vector<std::string>(int rank)>& argv_of,
                           std::chrono::milliseconds timeout);

// The path of the running executable (/proc/self/exe), for programs that
// launch themselves as ranks.
std::string self_executable();

}  // namespace lunajit::dist
