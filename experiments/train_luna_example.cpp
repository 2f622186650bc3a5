// train_luna_example: a two-layer causal transformer with LUNA attention
// (lunajit::nn::MultiheadLinearAttention) trained for a few steps on a synthetic
// task, then saved with torch::save and loaded back.
//
// Task: sequences of random tokens; the target at position t is the token at
// t - 1 (position 0: itself), so the model must look one step back. Loss starts
// near log(vocab) and falls within tens of steps.
//
//   train_luna_example [--steps 30] [--path aten|host|host-fwd] [--out luna_example.pt] [--seed 0]
//
// --path host runs every attention through the generated kernels on the host
// emulator, forward and backward kernels; host-fwd takes the gradients from the
// ATen path instead (torch_binding/linear_attention.h).
// Prints the loss of every step, the mean step time (first step excluded: it
// JIT-compiles the kernels on the host path) and the loss after reloading.
#include <chrono>
#include <cstdio>
#include <string>

#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include "apps/cli_support.h"

#include "codegen/attention_spec.h"
#include "torch_binding/modules.h"

namespace {

using torch::Tensor;

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t embed, int64_t heads, const lunajit::AttentionSpec& spec, lunajit::LinearAttentionOptions op) {
    lunajit::nn::MultiheadOptions mo;
    mo.embed_dim = embed;
    mo.num_heads = heads;
    mo.batch_first = true;
    mo.dwc = true;
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));
    attn = register_module("attn", lunajit::nn::MultiheadLinearAttention(mo, spec, op));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));
    fc1 = register_module("fc1", torch::nn::Linear(embed, 4 * embed));
    fc2 = register_module("fc2", torch::nn::Linear(4 * embed, embed));
  }
  Tensor forward(Tensor x) {
    const Tensor h = ln1->forward(x);
    x = x + std::get<0>(attn->forward(h, h, h, {}, /*need_weights=*/false));
    return x + fc2->forward(torch::gelu(fc1->forward(ln2->forward(x))));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  lunajit::nn::MultiheadLinearAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  ModelImpl(int64_t vocab, int64_t seq, int64_t embed, int64_t heads, const lunajit::AttentionSpec& spec,
            lunajit::LinearAttentionOptions op) {
    tok = register_module("tok", torch::nn::Embedding(vocab, embed));
    pos = register_module("pos", torch::nn::Embedding(seq, embed));
    b1 = register_module("b1", Block(embed, heads, spec, op));
    b2 = register_module("b2", Block(embed, heads, spec, op));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));
    head = register_module("head", torch::nn::Linear(embed, vocab));
  }
  Tensor forward(const Tensor& tokens) {  // [batch, seq] -> logits [batch, seq, vocab]
    Tensor x = tok->forward(tokens) + pos->forward(torch::arange(tokens.size(1)));
    x = b2->forward(b1->forward(x));
    return head->forward(ln->forward(x));
  }
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  Block b1{nullptr}, b2{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Model);

}  // namespace

int main(int argc, char** argv) {
  int steps = 30;
  std::string path = "aten", out = "luna_example.pt";
  uint64_t seed = 0;
  // The project's parser: --help prints and exits, a flag missing its value or
  // an unknown flag is an error (exit 2), never a training run.
  CLI::App app{"train_luna_example: a two-layer causal LUNA transformer on a synthetic look-one-step-back task", "train_luna_example"};
  app.option_defaults()->always_capture_default();
  app.add_option("--steps", steps, "optimizer steps")->check(lunajit::int_in("--steps", {1, 1000000}));
  app.add_option("--path", path, "aten | host | host-fwd")->check(CLI::IsMember({"aten", "host", "host-fwd"}));
  app.add_option("--out", out, "checkpoint file written at the end");
  app.add_option("--seed", seed, "seed of the data and the initialisation")->check(lunajit::uint64_value("--seed"));
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const int rc = lunajit::parse_command_line(app, args); rc >= 0) return rc;
  torch::manual_seed(seed);
  const int64_t vocab = 16, seq = 64, batch = 16, embed = 64, heads = 4;
  // LUNA, causal, fp32 I/O; M = L = 8 projections x channels, Hm = 32.
  const lunajit::AttentionSpec spec =
      lunajit::spec_from_string(R"({"family": "luna", "head_dim": 16, "value_dim": 16, "causal": true,
          "dtype": "fp32", "luna": {"projections": 8, "channels": 8, "mlp_width": 32}})")
          .value_or_throw();
  lunajit::LinearAttentionOptions op;
  op.path = path == "aten" ? lunajit::AttentionPath::aten : lunajit::AttentionPath::host_kernels;
  op.kernel_backward = path == "host";
  Model model(vocab, seq, embed, heads, spec, op);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));

  auto batch_of = [&](int64_t n) {
    const Tensor x = torch::randint(vocab, {n, seq}, torch::kLong);
    const Tensor y = torch::cat({x.narrow(1, 0, 1), x.narrow(1, 0, seq - 1)}, 1);
    return std::make_pair(x, y);
  };
  auto loss_of = [&](Model& m, const Tensor& x, const Tensor& y) {
    return torch::nn::functional::cross_entropy(m->forward(x).reshape({-1, vocab}), y.reshape({-1}));
  };

  std::printf("train_luna_example: path %s, %lld threads, batch %lld x seq %lld, embed %lld, %lld heads\n",
              path.c_str(), (long long)torch::get_num_threads(), (long long)batch, (long long)seq,
              (long long)embed, (long long)heads);
  double timed_ms = 0;
  for (int step = 0; step < steps; ++step) {
    const auto [x, y] = batch_of(batch);
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    const Tensor loss = loss_of(model, x, y);
    loss.backward();
    opt.step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step > 0) timed_ms += ms;
    std::printf("step %3d  loss %.4f  %.1f ms\n", step, loss.item<double>(), ms);
  }
  if (steps > 1) std::printf("mean step time (steps 1..%d): %.1f ms\n", steps - 1, timed_ms / (steps - 1));

  torch::save(model, out);
  Model reloaded(vocab, seq, embed, heads, spec, op);
  torch::load(reloaded, out);
  torch::NoGradGuard no_grad;
  const auto [x, y] = batch_of(64);
  std::printf("saved %s; eval loss: trained %.4f, reloaded %.4f\n", out.c_str(),
              loss_of(model, x, y).item<double>(), loss_of(reloaded, x, y).item<double>());
  return 0;
}
