// lunajit::torch from an installed tree: a LibTorch model with
// MultiheadLinearAttention, forward and backward, a few optimizer steps, and
// a safetensors checkpoint that refuses a module of another spec.
#include <cstdio>
#include <filesystem>

#include <torch/torch.h>

#include "torch_binding/modules.h"

int main() {
  using namespace lunajit;
  torch::manual_seed(0);
  nn::MultiheadOptions o;
  o.embed_dim = 32;
  o.num_heads = 4;
  o.batch_first = true;
  const AttentionSpec spec = spec_from_string(R"({"family": "luna", "head_dim": 8, "value_dim": 8, "dtype": "fp32",
      "causal": true, "luna": {"projections": 2, "channels": 2, "mlp_width": 4}})").value_or_throw();
  nn::MultiheadLinearAttention model(o, spec);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  const torch::Tensor x = torch::randn({2, 12, 32});
  const torch::Tensor target = x.cumsum(1) / 4;
  double first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    auto [y, w] = model->forward(x, x, x, {}, /*need_weights=*/false);
    torch::Tensor loss = torch::mse_loss(y, target);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  const torch::Tensor g = model->linear()->feature_map->params.grad();
  if (!g.defined() || g.abs().sum().item<double>() == 0) return std::fprintf(stderr, "no feature-map gradient\n"), 1;
  if (!(last < first)) return std::fprintf(stderr, "loss did not decrease: %g -> %g\n", first, last), 1;

  const std::string path = (std::filesystem::temp_directory_path() / "lunajit_consumer.safetensors").string();
  nn::save_safetensors(*model, path);
  nn::MultiheadLinearAttention copy(o, spec, LinearAttentionOptions{}, /*seed=*/9);
  nn::load_safetensors(*copy, path);
  if (!torch::equal(std::get<0>(copy->forward(x, x, x)), std::get<0>(model->forward(x, x, x))))
    return std::fprintf(stderr, "checkpoint did not round-trip\n"), 1;
  AttentionSpec other = spec;
  other.causal = false;
  nn::MultiheadLinearAttention wrong(o, other);
  try {
    nn::load_safetensors(*wrong, path);
    return std::fprintf(stderr, "a checkpoint of another spec loaded\n"), 1;
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("was saved with spec") == std::string::npos) return 1;
  }
  std::filesystem::remove(path);
  // The dtype follows the module: bf16 weights, bf16 inputs, gradients in bf16.
  model->to(torch::kBFloat16);
  const torch::Tensor xb = x.to(torch::kBFloat16);
  auto [yb, wb] = model->forward(xb, xb, xb, {}, /*need_weights=*/false);
  if (yb.scalar_type() != torch::kBFloat16) return std::fprintf(stderr, "bf16 module gave %s\n", c10::toString(yb.scalar_type())), 1;
  yb.to(torch::kFloat).sum().backward();
  std::printf("torch consumer ok: loss %.4f -> %.4f over 10 steps\n", first, last);
  return 0;
}
