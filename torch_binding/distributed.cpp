// c10d process groups, counted collectives, fixed-order reductions as autograd
// functions, bucketed gradient all-reduce and a local rank launcher
// (torch_binding/distributed.h).
#include "torch_binding/distributed.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if LUNAJIT_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

extern char** environ;

namespace lunajit::dist {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

void wait(const c10::intrusive_ptr<c10d::Work>& work) {
  // Work::wait throws on a failed or timed-out collective; it propagates.
  work->wait();
}

// acc = parts[first] + parts[first + 1] + ... + parts[last - 1], left to right
// (zeros shaped like `like` when the range is empty).
Tensor sum_in_order(const std::vector<Tensor>& parts, size_t first, size_t last, const Tensor& like) {
  Tensor acc = torch::zeros_like(like);
  for (size_t i = first; i < last; ++i) acc.add_(parts[i]);
  return acc;
}

Communicator& comm_of(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
}

// The gradient arriving at an output no loss depends on is undefined; the rank
// must still take part in the collective.
Tensor defined_or_zeros(const Tensor& grad, AutogradContext* ctx) {
  if (grad.defined()) return grad.contiguous();
  const auto sizes = ctx->saved_data["sizes"].toIntVector();
  return torch::zeros(sizes, ctx->saved_data["like"].toTensor().options());
}

void remember(AutogradContext* ctx, Communicator& comm, const Tensor& delta) {
  ctx->saved_data["comm"] = int64_t(reinterpret_cast<intptr_t>(&comm));
  ctx->saved_data["sizes"] = delta.sizes().vec();
  ctx->saved_data["like"] = torch::empty({0}, delta.options());
}

struct SumOverRanks : torch::autograd::Function<SumOverRanks> {
  static Tensor forward(AutogradContext* ctx, const Tensor& delta, int64_t comm_ptr, int64_t reduction) {
    Communicator& comm = *reinterpret_cast<Communicator*>(comm_ptr);
    remember(ctx, comm, delta);
    ctx->saved_data["reduction"] = reduction;
    return reduce(comm, delta.contiguous(), Reduction(reduction));
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    Communicator& comm = comm_of(ctx);
    const Tensor g = defined_or_zeros(grads[0], ctx);
    return {reduce(comm, g, Reduction(ctx->saved_data["reduction"].toInt())), Tensor(), Tensor()};
  }
  static Tensor reduce(Communicator& comm, const Tensor& t, Reduction reduction) {
    if (reduction == Reduction::backend_allreduce) {
      Tensor out = t.clone();
      comm.all_reduce_sum(out);
      return out;
    }
    const std::vector<Tensor> all = comm.all_gather(t);
    return sum_in_order(all, 0, all.size(), t);
  }
};

struct ExclusivePrefixOverRanks : torch::autograd::Function<ExclusivePrefixOverRanks> {
  static Tensor forward(AutogradContext* ctx, const Tensor& delta, int64_t comm_ptr) {
    Communicator& comm = *reinterpret_cast<Communicator*>(comm_ptr);
    remember(ctx, comm, delta);
    const std::vector<Tensor> all = comm.all_gather(delta.contiguous());
    return sum_in_order(all, 0, size_t(comm.rank()), delta);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    Communicator& comm = comm_of(ctx);
    const Tensor g = defined_or_zeros(grads[0], ctx);
    const std::vector<Tensor> all = comm.all_gather(g);
    return {sum_in_order(all, size_t(comm.rank()) + 1, all.size(), g), Tensor()};
  }
};

}  // namespace

bool nccl_available() { return LUNAJIT_WITH_NCCL != 0; }

ProcessGroupPtr make_process_group(const std::string& store_path, int rank, int world, const GroupOptions& options) {
  TORCH_CHECK(world >= 1, "make_process_group: world = ", world, ": must be >= 1");
  TORCH_CHECK(rank >= 0 && rank < world, "make_process_group: rank = ", rank, ": must be in [0, ", world - 1, "]");
  TORCH_CHECK(!store_path.empty(), "make_process_group: store_path is empty: give the FileStore's file path");
  TORCH_CHECK(options.timeout.count() > 0, "make_process_group: timeout = ", options.timeout.count(),
              " ms: must be > 0");
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
  store->setTimeout(options.timeout);
  if (options.backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
  }
  if (options.backend == "nccl") {
#if LUNAJIT_WITH_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = options.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
#else
    TORCH_CHECK(false, "make_process_group: backend = \"nccl\": this build has no NCCL (it needs a CUDA LibTorch and "
                       "NCCL's header; LUNAJIT_WITH_NCCL is off); use \"gloo\"");
#endif
  }
  TORCH_CHECK(false, "make_process_group: backend = \"", options.backend, "\": must be \"gloo\" or \"nccl\"");
  return {};
}

Communicator::Communicator(ProcessGroupPtr group) : group_(std::move(group)) {
  TORCH_CHECK(group_, "Communicator: the process group is null");
  rank_ = group_->getRank();
  world_ = group_->getSize();
}

std::vector<Tensor> Communicator::all_gather(const Tensor& t_in) {
  Tensor t = t_in.contiguous();
  std::vector<std::vector<Tensor>> out(1);
  for (int r = 0; r < world_; ++r) out[0].push_back(torch::empty_like(t));
  std::vector<Tensor> in{t};
  wait(group_->allgather(out, in));
  stats_.calls++;
  stats_.allgather_calls++;
  stats_.payload_bytes += int64_t(t.nbytes());
  stats_.received_bytes += int64_t(t.nbytes()) * (world_ - 1);
  return out[0];
}

void Communicator::all_reduce_sum(Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), "Communicator::all_reduce_sum: the tensor must be contiguous");
  std::vector<Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  wait(group_->allreduce(ts, o));
  stats_.calls++;
  stats_.allreduce_calls++;
  stats_.payload_bytes += int64_t(t.nbytes());
}

void Communicator::broadcast(Tensor& t, int root) {
  TORCH_CHECK(root >= 0 && root < world_, "Communicator::broadcast: root = ", root, ": must be in [0, ", world_ - 1,
              "]");
  TORCH_CHECK(t.is_contiguous(), "Communicator::broadcast: the tensor must be contiguous");
  std::vector<Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  wait(group_->broadcast(ts, o));
  stats_.calls++;
  if (rank_ == root) stats_.payload_bytes += int64_t(t.nbytes());
}

void Communicator::barrier() { wait(group_->barrier()); }

Tensor sum_over_ranks(Communicator& comm, const Tensor& delta, Reduction reduction) {
  return SumOverRanks::apply(delta, int64_t(reinterpret_cast<intptr_t>(&comm)), int64_t(reduction));
}

Tensor exclusive_prefix_over_ranks(Communicator& comm, const Tensor& delta) {
  return ExclusivePrefixOverRanks::apply(delta, int64_t(reinterpret_cast<intptr_t>(&comm)));
}

int64_t all_reduce_gradients(Communicator& comm, const std::vector<Tensor>& params, int64_t bucket_bytes) {
  TORCH_CHECK(bucket_bytes > 0, "all_reduce_gradients: bucket_bytes = ", bucket_bytes, ": must be > 0");
  int64_t sent = 0;
  std::vector<Tensor> bucket;
  int64_t bucket_size = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    std::vector<Tensor> flat;
    for (const Tensor& g : bucket) flat.push_back(g.reshape(-1));
    Tensor buf = torch::cat(flat);
    comm.all_reduce_sum(buf);
    buf.div_(comm.world());
    int64_t at = 0;
    for (const Tensor& g : bucket) {
      g.copy_(buf.narrow(0, at, g.numel()).view_as(g));
      at += g.numel();
    }
    sent += int64_t(buf.nbytes());
    bucket.clear();
    bucket_size = 0;
  };
  for (const Tensor& p : params) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (!bucket.empty() && (bucket.front().scalar_type() != g.scalar_type() ||
                            bucket.front().device() != g.device() || bucket_size + int64_t(g.nbytes()) > bucket_bytes))
      flush();
    bucket.push_back(g);
    bucket_size += int64_t(g.nbytes());
  }
  flush();
  return sent;
}

std::string make_temp_dir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  TORCH_CHECK(::mkdtemp(buf.data()) != nullptr, "make_temp_dir: mkdtemp(", pattern, ") failed: ", std::strerror(errno));
  return std::string(buf.data());
}

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::vector<int> run_ranks(int world, const std::function<std::vector<std::string>(int)>& argv_of,
                           std::chrono::milliseconds timeout) {
  TORCH_CHECK(world >= 1, "run_ranks: world = ", world, ": must be >= 1");
  std::vector<pid_t> pids(world, -1);
  std::vector<int> codes(world, -1);
  auto kill_all = [&] {
    for (int r = 0; r < world; ++r)
      if (pids[r] > 0 && codes[r] < 0) ::kill(pids[r], SIGKILL);
  };
  for (int r = 0; r < world; ++r) {
    const std::vector<std::string> args = argv_of(r);
    TORCH_CHECK(!args.empty(), "run_ranks: argv_of(", r, ") is empty: argv[0] must be the executable");
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
    if (rc != 0) {
      kill_all();
      for (int j = 0; j < r; ++j) ::waitpid(pids[j], nullptr, 0);
      TORCH_CHECK(false, "run_ranks: cannot start rank ", r, " (", args[0], "): ", std::strerror(rc));
    }
    pids[r] = pid;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int running = world;
  bool timed_out = false;
  while (running > 0) {
    for (int r = 0; r < world; ++r) {
      if (codes[r] >= 0) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, timed_out ? 0 : WNOHANG);
      if (got == pids[r]) {
        codes[r] = timed_out && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? 124
                   : WIFEXITED(status)                                           ? WEXITSTATUS(status)
                   : WIFSIGNALED(status)                                         ? 128 + WTERMSIG(status)
                                                                                 : 1;
        --running;
      }
    }
    if (running == 0) break;
    if (!timed_out && std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      kill_all();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

}  // namespace lunajit::dist
