// ddp_train_example: data-parallel training over c10d. A one-block causal LUNA
// transformer (lunajit::nn::MultiheadLinearAttention) learns the look-one-step-
// back task of train_luna_example; each of R ranks takes batch / R rows of
// every step's batch, and after backward the gradients are averaged across
// ranks by the process group's allreduce (lunajit::dist::all_reduce_gradients,
// flat buckets), so every rank takes the optimizer step the one process would
// take on the combined batch.
//
//   ddp_train_example [--nproc 2] [--steps 20] [--batch 8] [--seed 0] [--optimizer sgd|adam] [--lr 0.1]
//                     [--bucket-bytes 1048576] [--loss-out FILE] [--hostname 127.0.0.1]
//
// With --nproc R > 1 the program launches itself R times as ranks (a FileStore
// in a fresh temporary directory, Gloo over --hostname) and returns the worst
// exit code; --nproc 1 trains in this process with no process group at all,
// the baseline the ranks must follow. A rank is the same program with --rank r
// --store FILE (what the launcher adds; on several machines start each rank so
// by hand, with a store file on a filesystem all of them mount and each node's
// own --hostname). Rank 0 prints each step's loss (the mean over the combined
// batch: the ranks' local means averaged) and writes them to --loss-out; at the
// end every rank checks that its parameters equal rank 0's bit for bit.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include "apps/cli_support.h"
#include "codegen/attention_spec.h"
#include "torch_binding/distributed.h"
#include "torch_binding/modules.h"

namespace {

using torch::Tensor;
namespace dist = lunajit::dist;

constexpr int64_t kVocab = 16, kSeq = 32, kEmbed = 32, kHeads = 2;

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(const lunajit::AttentionSpec& spec) {
    lunajit::nn::MultiheadOptions mo;
    mo.embed_dim = kEmbed;
    mo.num_heads = kHeads;
    mo.batch_first = true;
    tok = register_module("tok", torch::nn::Embedding(kVocab, kEmbed));
    pos = register_module("pos", torch::nn::Embedding(kSeq, kEmbed));
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kEmbed})));
    attn = register_module("attn", lunajit::nn::MultiheadLinearAttention(mo, spec, lunajit::LinearAttentionOptions{}));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kEmbed})));
    head = register_module("head", torch::nn::Linear(kEmbed, kVocab));
  }
  Tensor forward(const Tensor& tokens) {  // [batch, seq] -> logits [batch, seq, vocab]
    Tensor x = tok->forward(tokens) + pos->forward(torch::arange(tokens.size(1)));
    const Tensor h = ln1->forward(x);
    x = x + std::get<0>(attn->forward(h, h, h, {}, /*need_weights=*/false));
    return head->forward(ln2->forward(x));
  }
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  lunajit::nn::MultiheadLinearAttention attn{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Model);

struct Args {
  int nproc = 2, steps = 20, batch = 8, rank = -1;
  uint64_t seed = 0;
  double lr = 0.1;
  std::string optimizer = "sgd";
  int64_t bucket_bytes = int64_t(1) << 20;
  std::string loss_out, store, hostname = "127.0.0.1";
};

// The combined batch of `step` (the same on every rank): random tokens x, target
// y_t = x_{t-1} (y_0 = x_0).
std::pair<Tensor, Tensor> batch_of(const Args& a, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed * 100003 + uint64_t(step) + 1);
  const Tensor x = torch::randint(kVocab, {a.batch, kSeq}, gen, torch::kLong);
  const Tensor y = torch::cat({x.narrow(1, 0, 1), x.narrow(1, 0, kSeq - 1)}, 1);
  return {x, y};
}

// One process (comm == nullptr) or one rank of R.
int train(const Args& a, dist::Communicator* comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world() : 1;
  torch::manual_seed(a.seed);
  const lunajit::AttentionSpec spec =
      lunajit::spec_from_string(R"({"family": "luna", "head_dim": 16, "value_dim": 16, "causal": true,
          "dtype": "fp32", "luna": {"projections": 4, "channels": 4, "mlp_width": 8}})")
          .value_or_throw();
  Model model(spec);
  const std::vector<Tensor> params = model->parameters();
  int64_t numel = 0;
  for (const Tensor& p : params) numel += p.numel();
  if (comm) {
    // As DDP does: every rank starts from rank 0's parameters.
    torch::NoGradGuard no_grad;
    for (Tensor p : params) comm->broadcast(p, 0);
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (a.optimizer == "sgd")
    opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(a.lr).momentum(0.9));
  else
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(a.lr));
  const int64_t rows = a.batch / world;
  std::ofstream loss_file;
  if (rank == 0 && !a.loss_out.empty()) loss_file.open(a.loss_out);
  if (rank == 0)
    std::printf("ddp_train_example: %d process%s, batch %d (%lld per rank) x seq %lld, %lld parameters\n", world,
                world == 1 ? "" : "es", a.batch, (long long)rows, (long long)kSeq, (long long)numel);
  double ms_total = 0;
  int64_t grad_bytes = 0;
  for (int step = 0; step < a.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto [x, y] = batch_of(a, step);
    const Tensor xr = x.narrow(0, rank * rows, rows), yr = y.narrow(0, rank * rows, rows);
    opt->zero_grad();
    const Tensor loss = torch::nn::functional::cross_entropy(model->forward(xr).reshape({-1, kVocab}), yr.reshape({-1}));
    loss.backward();
    Tensor mean_loss = loss.detach().clone().reshape({1});
    if (comm) {
      grad_bytes = dist::all_reduce_gradients(*comm, params, a.bucket_bytes);
      comm->all_reduce_sum(mean_loss);
      mean_loss.div_(world);
    }
    opt->step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step > 0) ms_total += ms;
    if (rank == 0) {
      std::printf("step %3d  loss %.6f  %.1f ms\n", step, mean_loss.item<double>(), ms);
      if (loss_file) {
        char line[64];
        std::snprintf(line, sizeof line, "%d %.9g\n", step, mean_loss.item<double>());
        loss_file << line;
      }
    }
  }
  if (rank == 0 && a.steps > 1) std::printf("mean step time (steps 1..%d): %.1f ms\n", a.steps - 1, ms_total / (a.steps - 1));
  if (comm) {
    if (rank == 0)
      std::printf("gradient all-reduce per step: %lld bytes handed to the group per rank (formula: 4 bytes x %lld "
                  "parameters = %lld); ring all-reduce wire traffic 2 (R-1)/R of that per rank\n",
                  (long long)grad_bytes, (long long)numel, (long long)(4 * numel));
    std::vector<Tensor> flat;
    for (const Tensor& p : params) flat.push_back(p.detach().reshape(-1));
    const std::vector<Tensor> all = comm->all_gather(torch::cat(flat));
    if (!torch::equal(all[size_t(rank)], all[0])) {
      std::fprintf(stderr, "ddp_train_example: rank %d's parameters differ from rank 0's after training\n", rank);
      return 1;
    }
    if (rank == 0) std::printf("parameters identical on all %d ranks\n", world);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ddp_train_example: data-parallel training of a causal LUNA block over c10d (Gloo)", "ddp_train_example"};
  app.option_defaults()->always_capture_default();
  app.add_option("--nproc", a.nproc, "number of ranks (processes)")->check(lunajit::int_in("--nproc", {1, 64}));
  app.add_option("--steps", a.steps, "optimizer steps")->check(lunajit::int_in("--steps", {1, 1000000}));
  app.add_option("--batch", a.batch, "combined batch (a multiple of --nproc)")->check(lunajit::int_in("--batch", {1, 65536}));
  app.add_option("--seed", a.seed, "seed of the data and the initialisation")->check(lunajit::uint64_value("--seed"));
  app.add_option("--optimizer", a.optimizer, "sgd (momentum 0.9) | adam")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--lr", a.lr, "learning rate")->check(CLI::PositiveNumber);
  app.add_option("--bucket-bytes", a.bucket_bytes, "gradient all-reduce bucket size")
      ->check(lunajit::int_in("--bucket-bytes", {1, int64_t(1) << 40}));
  app.add_option("--loss-out", a.loss_out, "file for rank 0's per-step losses ('step loss' lines)");
  app.add_option("--hostname", a.hostname, "address this rank's Gloo device binds");
  app.add_option("--rank", a.rank, "(set by the launcher) this process's rank")->check(lunajit::int_in("--rank", {0, 63}));
  app.add_option("--store", a.store, "(set by the launcher) the FileStore file");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const int rc = lunajit::parse_command_line(app, args); rc >= 0) return rc;
  if (a.batch % a.nproc != 0) {
    std::fprintf(stderr, "ddp_train_example: --batch = %d: must be a multiple of --nproc = %d\n", a.batch, a.nproc);
    return 2;
  }
  if ((a.rank >= 0) != !a.store.empty()) {
    std::fprintf(stderr, "ddp_train_example: --rank and --store go together (a rank of a launched group)\n");
    return 2;
  }
  if (a.rank >= a.nproc) {
    std::fprintf(stderr, "ddp_train_example: --rank = %d: must be in [0, %d] (--nproc %d)\n", a.rank, a.nproc - 1, a.nproc);
    return 2;
  }
  try {
    if (a.rank >= 0) {
      torch::set_num_threads(1);
      dist::GroupOptions go;
      go.hostname = a.hostname;
      dist::Communicator comm(dist::make_process_group(a.store, a.rank, a.nproc, go));
      return train(a, &comm);
    }
    if (a.nproc == 1) {
      torch::set_num_threads(1);  // the same thread count as each rank: the same kernels, the same sums
      return train(a, nullptr);
    }
    const std::string dir = dist::make_temp_dir("lunajit-ddp-");
    const std::string exe = dist::self_executable();
    const auto codes = dist::run_ranks(
        a.nproc,
        [&](int r) {
          std::vector<std::string> v{exe};
          v.insert(v.end(), args.begin(), args.end());
          v.push_back("--rank");
          v.push_back(std::to_string(r));
          v.push_back("--store");
          v.push_back(dir + "/store");
          return v;
        },
        std::chrono::minutes(10));
    std::filesystem::remove_all(dir);
    int worst = 0;
    for (int r = 0; r < a.nproc; ++r) {
      if (codes[r] != 0) std::fprintf(stderr, "ddp_train_example: rank %d exited with %d\n", r, codes[r]);
      worst = std::max(worst, codes[r]);
    }
    return worst;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train_example: %s\n", e.what());
    return 1;
  }
}
