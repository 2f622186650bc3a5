// One rank of the sequence-parallel test (launched by sequence_parallel_test):
//
//   seq_parallel_worker --rank R --world W --store FILE --out DIR
//
// Joins a Gloo group at the FileStore FILE, and for every case of sp_cases.h
// takes its shard (shard_lengths(W)) of the seeded inputs, runs
// sequence_parallel_linear_attention forward and backward (loss = sum(o *
// dout)), runs it a second time to check the bits repeat, and saves
// DIR/<case>.rank<R>.pt: [o, dq, dk, dv, dparams, stats] with stats int64 =
// [allgather calls, allreduce calls, payload bytes, received bytes, repeated
// bit for bit (1/0)] of the first run. Exit 0, or 1 with the error on stderr.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "sp_cases.h"

namespace {

using torch::Tensor;
using namespace lunajit::dist;
using namespace lunajit::dist::testing;

std::vector<Tensor> run_case(Communicator& comm, const SpCase& c, const SpInputs& full,
                             const std::vector<int64_t>& lengths) {
  const lunajit::AttentionSpec spec = spec_of(c);
  const int64_t start = shard_start(lengths, comm.rank()), n = lengths[comm.rank()];
  auto shard = [&](const Tensor& t) { return t.narrow(1, start, n).clone().requires_grad_(true); };
  Tensor q = shard(full.q), k = shard(full.k), v = shard(full.v);
  Tensor params = full.params.clone().requires_grad_(true);
  SequenceParallelOptions opts;
  opts.chunk = kChunk;
  opts.reduction = c.reduction;
  opts.path = c.path;
  const Tensor o = sequence_parallel_linear_attention(comm, q, k, v, params, spec, opts);
  (o * full.dout.narrow(1, start, n)).sum().backward();
  return {o.detach(), q.grad(), k.grad(), v.grad(), params.grad().defined() ? params.grad() : torch::zeros_like(params)};
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, world = -1;
  std::string store, out;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], val = argv[i + 1];
    if (a == "--rank") rank = std::atoi(val.c_str());
    else if (a == "--world") world = std::atoi(val.c_str());
    else if (a == "--store") store = val;
    else if (a == "--out") out = val;
    else {
      std::fprintf(stderr, "seq_parallel_worker: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (rank < 0 || world < 1 || store.empty() || out.empty()) {
    std::fprintf(stderr, "usage: seq_parallel_worker --rank R --world W --store FILE --out DIR\n");
    return 2;
  }
  try {
    torch::set_num_threads(1);  // W ranks share this machine's cores
    Communicator comm(make_process_group(store, rank, world));
    const std::vector<int64_t> lengths = shard_lengths(world);
    const auto cases = sp_cases();
    for (size_t i = 0; i < cases.size(); ++i) {
      const SpInputs full = sp_inputs(cases[i], int(i));
      comm.reset_stats();
      std::vector<Tensor> got = run_case(comm, cases[i], full, lengths);
      const CommStats stats = comm.stats();
      const std::vector<Tensor> again = run_case(comm, cases[i], full, lengths);
      bool same = true;
      for (size_t j = 0; j < got.size(); ++j) same = same && torch::equal(got[j], again[j]);
      got.push_back(torch::tensor({stats.allgather_calls, stats.allreduce_calls, stats.payload_bytes,
                                   stats.received_bytes, int64_t(same)},
                                  torch::kInt64));
      torch::save(got, out + "/" + cases[i].name + ".rank" + std::to_string(rank) + ".pt");
    }
    comm.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seq_parallel_worker rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
