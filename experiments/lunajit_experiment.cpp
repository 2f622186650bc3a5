// lunajit-experiment: train, convert, ablate and kernel-fit runs on the LibTorch
// binding (docs/EXPERIMENTS.md). Every run writes a run directory:
//
//   config.json      the resolved configuration, seeds, thread count, git revision
//   metrics.jsonl    one JSON object per logged step / evaluation
//   results.json     the final figures (absent while a run is interrupted)
//   checkpoint/      model.safetensors (+ optim.pt, state.json) for --resume
//   *.svg            loss / accuracy curves and bar charts of the final table
//   summary.md       the results as a table
//
// Runs are deterministic on the CPU at a fixed thread count: the data order is
// a function of (seed, phase, epoch), there is no dropout, and a checkpoint
// holds the model, AdamW's state and the step, so `--resume DIR` ends with the
// same figures as an uninterrupted run, bit for bit. The CPU path is ATen
// (torch_binding/aten_attention.h).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/cli_support.h"
#include "codegen/attention_spec.h"
#include "experiments/tasks.h"
#include "report/svg_chart.h"
#include "torch_binding/modules.h"

namespace fs = std::filesystem;
using nlohmann::json;
using torch::Tensor;

namespace lunajit::experiment {
namespace {

// ---------------------------------------------------------------- configuration

// Every setting with its default; a config file or --set may change only these
// keys, to values of the same JSON type.
json default_config() {
  return {
      {"task", "kv_recall"},
      {"attention", "luna"},      // train: softmax | yat | spherical_yat | a family | luna-<variant> | spec JSON
      {"to", "luna"},             // convert: the target attention
      {"seed", 0},
      {"data_seed", 1234},
      {"threads", 1},
      {"train_size", 0}, {"val_size", 0}, {"test_size", 0},  // 0: the task's default
      {"seq_len", 0},
      {"patch", 4},
      {"fmnist_dir", "/usr/share/datasets/fashion-mnist"},
      {"listops_max_depth", 6}, {"listops_max_args", 5}, {"listops_min_length", 32}, {"listops_max_length", 128},
      {"embed", 64}, {"heads", 4}, {"layers", 2}, {"mlp_ratio", 2},
      {"pooling", "cls"},         // cls | mean (per-token tasks score every position)
      {"dwc", false},
      {"luna_projections", 8}, {"luna_channels", 8}, {"luna_mlp_width", 64},
      {"batch", 32}, {"epochs", 5}, {"lr", 1e-3}, {"weight_decay", 0.01}, {"warmup", 0.05},
      {"check_kernels", false}, {"check_steps", 3},
      // train: where the linear attention runs (aten | host_kernels | cuda_kernels); on a kernel path
      // the model's attention shapes are first tuned into the tuning database (tune, tune_top_k).
      {"path", "aten"}, {"tune", true}, {"tune_top_k", 6},
      {"log_every", 10}, {"checkpoint_every", 100}, {"eval_batch", 256},
      // convert (docs/MATH.md §4)
      {"teacher_dir", ""}, {"teacher_epochs", 5}, {"distill_epochs", 1}, {"distill_lr", 1e-2},
      {"distill_output_mse", 1.0}, {"finetune_epochs", 1}, {"finetune_lr", 2e-4}, {"attention_maps", 4},
      // ablate
      {"grid", "ml"},             // ml | variants | attention | convert
      {"grid_values", json::array({2, 4, 8, 16})},
      {"budget", 64},             // variants: D = M * L
      {"attentions", json::array({"softmax", "luna", "performer", "elu", "hedgehog", "t2r", "cosformer", "slay"})},
      {"targets", json::array({"luna", "hedgehog", "t2r", "performer", "elu"})},
      {"seeds", json::array({0, 1, 2})},
      {"tasks", json::array()},   // attention / convert grids: several tasks (empty: just `task`)
      // kernel-fit
      {"families", json::array({"luna", "performer", "rff", "elu", "relu", "t2r", "hedgehog", "cosformer", "slay"})},
      {"kf_seq", 128}, {"kf_head_dim", 16}, {"kf_heads", 2}, {"kf_batch", 4}, {"kf_fit_steps", 200},
      {"kf_lr", 1e-2}, {"kf_input_scale", 1.0},
  };
}

// --quick: toy sizes that finish in about a minute on one core.
json quick_overrides(const std::string& command, const std::string& task) {
  json q = {{"train_size", 512}, {"val_size", 128}, {"test_size", 256}, {"seq_len", 16},
            {"embed", 32}, {"heads", 2}, {"layers", 1}, {"epochs", 3}, {"batch", 32}, {"lr", 3e-3},
            {"luna_mlp_width", 16}, {"log_every", 4}, {"checkpoint_every", 8},
            {"teacher_epochs", 3}, {"distill_epochs", 1}, {"finetune_epochs", 1},
            {"listops_max_depth", 4}, {"listops_max_args", 4}, {"listops_min_length", 8}, {"listops_max_length", 48},
            {"patch", 7}, {"seeds", json::array({0})}, {"grid_values", json::array({2, 4})},
            {"attentions", json::array({"softmax", "luna"})}, {"targets", json::array({"luna"})},
            {"kf_seq", 32}, {"kf_fit_steps", 20}, {"kf_batch", 2},
            {"attention_maps", 2}};
  if (task == "fmnist-seq") q.update({{"train_size", 128}, {"val_size", 64}, {"test_size", 64}, {"epochs", 1},
                                      {"batch", 16}});
  if (command == "ablate") q["epochs"] = 2;
  return q;
}

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct Interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void merge_checked(json& cfg, const json& in, const std::string& where) {
  if (!in.is_object()) throw Usage(fmt::format("{}: must be a JSON object of settings", where));
  for (const auto& [k, v] : in.items()) {
    if (!cfg.contains(k)) throw Usage(fmt::format("{}: \"{}\" is not a setting (see docs/EXPERIMENTS.md)", where, k));
    const json& d = cfg[k];
    const bool same = (d.is_number() && v.is_number() && (d.is_number_float() || !v.is_number_float())) ||
                      d.type() == v.type();
    if (!same) throw Usage(fmt::format("{}: \"{}\" = {}: must be a {} like the default {}", where, k, v.dump(),
                                       d.type_name(), d.dump()));
    cfg[k] = v;
  }
}

int64_t geti(const json& c, const char* k) { return c.at(k).get<int64_t>(); }
double getd(const json& c, const char* k) { return c.at(k).get<double>(); }
std::string gets(const json& c, const char* k) { return c.at(k).get<std::string>(); }

void check_range(const json& c, const char* k, int64_t lo, int64_t hi) {
  const int64_t v = geti(c, k);
  if (v < lo || v > hi) throw Usage(fmt::format("{} = {}: must be in [{}, {}]", k, v, lo, hi));
}

void validate(const json& c) {
  check_range(c, "threads", 1, 256);
  check_range(c, "embed", 4, 4096);
  check_range(c, "heads", 1, 64);
  if (geti(c, "embed") % geti(c, "heads")) throw Usage(fmt::format("embed = {}: must be a multiple of heads = {}",
                                                                   geti(c, "embed"), geti(c, "heads")));
  check_range(c, "layers", 1, 64);
  check_range(c, "mlp_ratio", 1, 16);
  check_range(c, "batch", 1, 65536);
  check_range(c, "epochs", 1, 100000);
  check_range(c, "teacher_epochs", 1, 100000);
  check_range(c, "distill_epochs", 0, 100000);
  check_range(c, "finetune_epochs", 0, 100000);
  check_range(c, "log_every", 1, 1000000);
  check_range(c, "checkpoint_every", 1, 100000000);
  check_range(c, "eval_batch", 1, 65536);
  const std::string pool = gets(c, "pooling");
  if (pool != "cls" && pool != "mean") throw Usage(fmt::format("pooling = \"{}\": must be cls or mean", pool));
  const std::string grid = gets(c, "grid");
  if (grid != "ml" && grid != "variants" && grid != "attention" && grid != "convert")
    throw Usage(fmt::format("grid = \"{}\": must be ml, variants, attention or convert", grid));
  for (const char* k : {"lr", "distill_lr", "finetune_lr", "kf_lr"})
    if (!(getd(c, k) > 0 && getd(c, k) < 10)) throw Usage(fmt::format("{} = {}: must be in (0, 10)", k, getd(c, k)));
  if (!(getd(c, "warmup") >= 0 && getd(c, "warmup") < 1)) throw Usage("warmup: must be in [0, 1)");
  if (c.at("seeds").empty()) throw Usage("seeds: must list at least one seed");
  const std::string path = gets(c, "path");
  if (path != "aten" && path != "host_kernels" && path != "cuda_kernels")
    throw Usage(fmt::format("path = \"{}\": must be aten, host_kernels or cuda_kernels", path));
  if (path == "cuda_kernels" && !cuda_kernels_available())
    throw Usage("path = \"cuda_kernels\": this build cannot run the CUDA kernels (LibTorch without CUDA, or no GPU); "
                "use aten or host_kernels");
  check_range(c, "tune_top_k", 0, 1000);
}

TaskOptions task_options(const json& c) {
  TaskOptions o;
  o.name = gets(c, "task");
  o.train_size = geti(c, "train_size");
  o.val_size = geti(c, "val_size");
  o.test_size = geti(c, "test_size");
  o.data_seed = c.at("data_seed").get<uint64_t>();
  o.seq_len = geti(c, "seq_len");
  o.patch = geti(c, "patch");
  o.fmnist_dir = gets(c, "fmnist_dir");
  o.listops_max_depth = geti(c, "listops_max_depth");
  o.listops_max_args = geti(c, "listops_max_args");
  o.listops_min_length = geti(c, "listops_min_length");
  o.listops_max_length = geti(c, "listops_max_length");
  return o;
}

std::string shell_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string git_revision() {
  const std::string dir = LUNAJIT_SOURCE_DIR;
  std::string rev = shell_output("git -C '" + dir + "' rev-parse HEAD 2>/dev/null");
  if (rev.empty()) return "unknown";
  if (!shell_output("git -C '" + dir + "' status --porcelain --untracked-files=no 2>/dev/null").empty())
    rev += "-dirty";
  return rev;
}

// ---------------------------------------------------------------- files

void write_text(const fs::path& p, const std::string& s) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << s;
    if (!f) throw std::runtime_error("cannot write " + tmp.string());
  }
  fs::rename(tmp, p);
}
std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw Usage(fmt::format("cannot read {}", p.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
json read_json(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::parse_error& e) {
    throw Usage(fmt::format("{}: not valid JSON: {}", p.string(), e.what()));
  }
}

// ---------------------------------------------------------------- progress bar

class Progress {
 public:
  Progress(std::string name, int64_t total, int64_t start)
      : name_(std::move(name)), total_(total), start_step_(start), t0_(std::chrono::steady_clock::now()) {}
  void update(int64_t step, double loss) {
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (step < total_ && since < (isatty(2) ? 0.25 : 10.0)) return;
    last_ = now;
    const double el = std::chrono::duration<double>(now - t0_).count();
    const double done = static_cast<double>(step - start_step_);
    const double eta = done > 0 ? el / done * static_cast<double>(total_ - step) : 0;
    const int width = 24, fill = total_ ? static_cast<int>(width * step / total_) : width;
    std::string bar(fill, '#');
    bar += std::string(width - fill, '.');
    std::fprintf(stderr, "%s%-9s [%s] %lld/%lld loss %.4f  %.0fs  ETA %d:%02d%s", isatty(2) ? "\r" : "",
                 name_.c_str(), bar.c_str(), (long long)step, (long long)total_, loss, el,
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60, isatty(2) && step < total_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  std::string name_;
  int64_t total_, start_step_;
  std::chrono::steady_clock::time_point t0_, last_{};
};

// ---------------------------------------------------------------- models

// Text make_multihead_attention understands, for an attention name of ours.
std::string attention_kind(const std::string& name, const json& c) {
  if (name == "softmax" || name == "yat" || name == "spherical_yat" || name == "spherical-yat") return name;
  const int64_t hd = geti(c, "embed") / geti(c, "heads");
  auto luna = [&](const std::string& variant, int64_t M, int64_t L, bool envelope) {
    return json{{"family", "luna"}, {"head_dim", hd}, {"value_dim", hd}, {"dtype", "fp32"},
                {"luna", {{"projections", M}, {"channels", L}, {"mlp_width", geti(c, "luna_mlp_width")},
                          {"variant", variant}, {"envelope", envelope}}}}
        .dump();
  };
  const int64_t M = geti(c, "luna_projections"), L = geti(c, "luna_channels");
  if (name == "luna" || name == "luna-neural") return luna("neural", M, L, false);
  if (name == "luna-envelope") return luna("neural", M, L, true);
  if (name == "luna-bank_coef") return luna("bank_coef", M, L, false);
  if (name == "luna-rff") return luna("rff", M, 2, false);
  if (!name.empty() && name[0] == '{') return name;
  if (parse_family(name).ok())
    return json{{"family", name}, {"head_dim", hd}, {"value_dim", hd}, {"dtype", "fp32"}}.dump();
  throw Usage(fmt::format("attention = \"{}\": one of softmax, yat, spherical_yat, luna, luna-envelope, "
                          "luna-bank_coef, luna-rff, performer, rff, elu, relu, t2r, hedgehog, cosformer, slay, "
                          "or spec JSON", name));
}

// listops pads its sequences and masks the pad keys; cosformer's position
// features cannot be masked (lunajit::linear_attention rejects key_mask for it).
void check_mask_support(const std::string& task, const std::string& attention, const json& c) {
  if (task != "listops") return;
  const std::string kind = attention_kind(attention, c);
  if (kind.starts_with("{") && json::parse(kind).value("family", "") == "cosformer")
    throw Usage(fmt::format("attention = \"{}\" on task listops: cosformer cannot mask padding (its features depend "
                            "on positions and the sequence length); choose another attention or task", attention));
}

std::shared_ptr<nn::MultiheadAttentionBaseImpl> make_attention(const std::string& name, const json& c, uint64_t seed,
                                                               AttentionPath path = AttentionPath::aten) {
  nn::MultiheadOptions mo;
  mo.embed_dim = geti(c, "embed");
  mo.num_heads = geti(c, "heads");
  mo.batch_first = true;
  mo.dwc = c.at("dwc").get<bool>();
  LinearAttentionOptions op;
  op.path = path;
  try {
    return nn::make_multihead_attention(attention_kind(name, c), mo, false, op, seed);
  } catch (const c10::Error& e) {
    throw Usage(fmt::format("attention = \"{}\": {}", name, e.what_without_backtrace()));
  } catch (const LunajitError& e) {
    throw Usage(fmt::format("attention = \"{}\": {}", name, e.what()));
  }
}

struct BlockImpl : torch::nn::Module {
  BlockImpl(const json& c, const std::string& attention, uint64_t seed, AttentionPath path) {
    const int64_t E = geti(c, "embed");
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({E})));
    attn = register_module("attn", make_attention(attention, c, seed, path));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({E})));
    fc1 = register_module("fc1", torch::nn::Linear(E, geti(c, "mlp_ratio") * E));
    fc2 = register_module("fc2", torch::nn::Linear(geti(c, "mlp_ratio") * E, E));
  }
  void swap_attention(std::shared_ptr<nn::MultiheadAttentionBaseImpl> a) {
    torch::NoGradGuard g;
    for (auto [dst, src] : {std::pair{a->q_proj, attn->q_proj}, {a->k_proj, attn->k_proj},
                            {a->v_proj, attn->v_proj}, {a->out_proj, attn->out_proj}}) {
      dst->weight.copy_(src->weight);
      if (src->bias.defined()) dst->bias.copy_(src->bias);
    }
    if (a->dwc && attn->dwc) a->dwc->weight.copy_(attn->dwc->weight);
    attn = replace_module("attn", a);
  }
  // trace: the attention inputs (after ln1) of this block are pushed there.
  Tensor forward(Tensor x, const Tensor& pad, std::vector<Tensor>* trace) {
    const Tensor h = ln1->forward(x);
    if (trace) trace->push_back(h);
    x = x + std::get<0>(attn->forward(h, h, h, pad));
    return x + fc2->forward(torch::gelu(fc1->forward(ln2->forward(x))));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  std::shared_ptr<nn::MultiheadAttentionBaseImpl> attn;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

// Pre-LN encoder classifier; with patch input (fmnist-vit) a small ViT.
struct ModelImpl : torch::nn::Module {
  ModelImpl(const json& c, const Dataset& d, const std::string& attention, uint64_t seed,
            AttentionPath path = AttentionPath::aten)
      : per_token(d.per_token), patch_pixels(d.patch_pixels) {
    const int64_t E = geti(c, "embed");
    use_cls = !d.per_token && gets(c, "pooling") == "cls";
    tokens = d.patch_pixels ? d.seq / d.patch_pixels : d.seq;
    if (d.patch_pixels) patch = register_module("patch", torch::nn::Linear(d.patch_pixels, E));
    else embed = register_module("embed", torch::nn::Embedding(d.vocab, E));
    pos = register_parameter("pos", torch::randn({1, tokens + (use_cls ? 1 : 0), E}) * 0.02);
    if (use_cls) cls = register_parameter("cls", torch::randn({1, 1, E}) * 0.02);
    for (int64_t i = 0; i < geti(c, "layers"); ++i)
      blocks.push_back(register_module("block" + std::to_string(i), Block(c, attention, seed + 7919 * i, path)));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({E})));
    head = register_module("head", torch::nn::Linear(E, d.classes));
  }
  // input: long [B, S] tokens or float [B, tokens, patch_pixels]; pad: bool [B, S] (true = pad) or undefined.
  Tensor forward(const Tensor& input, Tensor pad, std::vector<Tensor>* trace = nullptr) {
    Tensor x = patch_pixels ? patch->forward(input) : embed->forward(input);
    const int64_t B = x.size(0);
    if (use_cls) {
      x = torch::cat({cls.expand({B, 1, x.size(2)}), x}, 1);
      if (pad.defined()) pad = torch::cat({torch::zeros({B, 1}, pad.options()), pad}, 1);
    }
    x = x + pos;
    for (auto& b : blocks) x = b->forward(x, pad, trace);
    x = ln->forward(x);
    if (per_token) return head->forward(x);
    if (use_cls) return head->forward(x.select(1, 0));
    if (!pad.defined()) return head->forward(x.mean(1));
    const Tensor keep = pad.logical_not().unsqueeze(-1).to(x.scalar_type());
    return head->forward((x * keep).sum(1) / keep.sum(1).clamp_min(1));
  }
  bool per_token, use_cls = false;
  int64_t patch_pixels, tokens = 0;
  torch::nn::Linear patch{nullptr}, head{nullptr};
  torch::nn::Embedding embed{nullptr};
  Tensor pos, cls;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(Model);

struct Batch {
  Tensor input, labels, pad;
};

// Where train runs its model and batches: CUDA for path cuda_kernels, else the CPU.
torch::Device g_device = torch::kCPU;

Batch make_batch(const Dataset& d, const std::vector<int64_t>& idx) {
  const auto B = static_cast<int64_t>(idx.size());
  Tensor tok = torch::empty({B, d.seq}, torch::kUInt8);
  const int64_t ly = d.per_token ? d.seq : 1;
  Tensor lab = torch::empty({B, ly}, torch::kInt16);
  for (int64_t i = 0; i < B; ++i) {
    std::memcpy(tok.data_ptr<uint8_t>() + i * d.seq, d.tokens.data() + idx[i] * d.seq, d.seq);
    std::memcpy(lab.data_ptr<int16_t>() + i * ly, d.labels.data() + idx[i] * ly, ly * sizeof(int16_t));
  }
  Batch b;
  if (d.patch_pixels) b.input = tok.to(torch::kFloat).div_(255.0).reshape({B, d.seq / d.patch_pixels, d.patch_pixels});
  else b.input = tok.to(torch::kLong);
  b.labels = d.per_token ? lab.to(torch::kLong) : lab.to(torch::kLong).reshape({B});
  if (d.pad_token >= 0) b.pad = tok.eq(d.pad_token);
  if (g_device != torch::Device(torch::kCPU)) {
    b.input = b.input.to(g_device);
    b.labels = b.labels.to(g_device);
    if (b.pad.defined()) b.pad = b.pad.to(g_device);
  }
  return b;
}

Tensor task_loss(Model& m, const Batch& b) {
  const Tensor logits = m->forward(b.input, b.pad);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.labels.reshape({-1}),
                                              torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
}

// Accuracy (per labelled position for per-token tasks).
double accuracy(Model& m, const Dataset& d, int64_t eval_batch) {
  torch::NoGradGuard g;
  int64_t right = 0, total = 0;
  for (int64_t s = 0; s < d.size(); s += eval_batch) {
    std::vector<int64_t> idx(static_cast<size_t>(std::min(eval_batch, d.size() - s)));
    std::iota(idx.begin(), idx.end(), s);
    const Batch b = make_batch(d, idx);
    const Tensor pred = m->forward(b.input, b.pad).argmax(-1);
    const Tensor lab = b.labels;
    const Tensor valid = lab.ne(-1);
    right += pred.eq(lab).logical_and(valid).sum().item<int64_t>();
    total += valid.sum().item<int64_t>();
  }
  return total ? static_cast<double>(right) / static_cast<double>(total) : 0.0;
}

// ---------------------------------------------------------------- phases, checkpoints, resume

int64_t g_steps_done = 0;   // steps taken by this process (all phases): --stop-after
int64_t g_stop_after = -1;

struct RunDir {
  fs::path dir;
  json state = {{"done", json::array()}, {"phase", ""}, {"step", 0}, {"metrics_bytes", 0}};
  std::ofstream metrics;
  bool resumed = false;

  fs::path ck(const std::string& f) const { return dir / "checkpoint" / f; }
  void open(bool resume) {
    fs::create_directories(dir / "checkpoint");
    resumed = resume && fs::exists(ck("state.json"));
    if (resumed) {  // back to the last checkpoint: metrics logged after it are dropped (they are logged again)
      state = read_json(ck("state.json"));
      fs::resize_file(dir / "metrics.jsonl", state.at("metrics_bytes").get<uintmax_t>());
    } else {  // a fresh start, or interrupted before its first checkpoint
      write_text(dir / "metrics.jsonl", "");
    }
    fs::remove(dir / "results.json");
    metrics.open(dir / "metrics.jsonl", std::ios::app | std::ios::binary);
  }
  void log(const json& j) {
    metrics << j.dump() << "\n";
    metrics.flush();
  }
  bool done(const std::string& phase) const {
    const auto& d = state.at("done");
    return std::find(d.begin(), d.end(), phase) != d.end();
  }
  void save_state() {
    metrics.flush();
    state["metrics_bytes"] = static_cast<uintmax_t>(fs::file_size(dir / "metrics.jsonl"));
    write_text(ck("state.json"), state.dump(2));
  }
};

struct Phase {
  std::string name;
  Model model{nullptr};
  std::vector<Tensor> params;
  double lr = 1e-3, weight_decay = 0.01, warmup = 0.05;
  int64_t epochs = 1, batch = 32;
  std::function<Tensor(const Batch&)> loss;
  std::function<json()> evaluate;  // at each epoch end
};

struct PhaseResult {
  double seconds = 0, last_loss = 0, first_loss = 0;
  int64_t steps = 0, tokens = 0;
};

// Trains `p` (or restores it when the run dir says it is done). The
// in-progress checkpoint is model.safetensors + optim.pt + state.json; a finished
// phase leaves <name>.safetensors.
PhaseResult run_phase(RunDir& run, Phase& p, const Dataset& train, uint64_t seed, int64_t checkpoint_every,
                      int64_t log_every) {
  PhaseResult r;
  const fs::path final_ck = run.ck(p.name + ".safetensors");
  if (run.done(p.name)) {
    nn::load_safetensors(*p.model, final_ck.string());
    r = {};
    const json& s = run.state.at("phase_results").at(p.name);
    r.seconds = s.at("seconds"); r.last_loss = s.at("last_loss"); r.first_loss = s.at("first_loss");
    r.steps = s.at("steps"); r.tokens = s.at("tokens");
    return r;
  }
  const int64_t n = train.size(), per_epoch = (n + p.batch - 1) / p.batch, total = per_epoch * p.epochs;
  torch::optim::AdamW opt(p.params, torch::optim::AdamWOptions(p.lr).weight_decay(p.weight_decay));
  int64_t step = 0;
  if (run.state.at("phase") == p.name) {
    nn::load_safetensors(*p.model, run.ck("model.safetensors").string());
    torch::load(opt, run.ck("optim.pt").string());
    step = run.state.at("step");
    const json& s = run.state.at("partial");
    r.seconds = s.at("seconds"); r.first_loss = s.at("first_loss"); r.last_loss = s.at("last_loss");
    r.tokens = s.at("tokens");
  }
  auto checkpoint = [&] {
    nn::save_safetensors(*p.model, run.ck("model.safetensors").string());
    torch::save(opt, run.ck("optim.pt").string());
    run.state["phase"] = p.name;
    run.state["step"] = step;
    run.state["partial"] = {{"seconds", r.seconds}, {"first_loss", r.first_loss}, {"last_loss", r.last_loss},
                            {"tokens", r.tokens}};
    run.save_state();
  };
  Progress bar(p.name, total, step);
  const int64_t warm = static_cast<int64_t>(p.warmup * static_cast<double>(total));
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  p.model->train();
  while (step < total) {
    const int64_t epoch = step / per_epoch, in_epoch = step % per_epoch;
    if (epoch != order_epoch) {  // the epoch's permutation, a function of (seed, phase, epoch) only
      order.resize(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      uint64_t h = 14695981039346656037ULL;  // FNV-1a of the phase name: portable, unlike std::hash
      for (const unsigned char ch : p.name) h = (h ^ ch) * 1099511628211ULL;
      Rng rng(seed * 0x9E3779B97F4A7C15ULL + h + static_cast<uint64_t>(epoch) * 1315423911ULL);
      for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i + 1))]);
      order_epoch = epoch;
    }
    const int64_t s0 = in_epoch * p.batch, s1 = std::min(n, s0 + p.batch);
    const std::vector<int64_t> idx(order.begin() + s0, order.begin() + s1);
    const Batch b = make_batch(train, idx);
    // Linear warmup, then cosine decay to 0.
    const double lr = step < warm ? p.lr * static_cast<double>(step + 1) / static_cast<double>(warm)
                                  : p.lr * 0.5 * (1 + std::cos(M_PI * static_cast<double>(step - warm) /
                                                               static_cast<double>(std::max<int64_t>(1, total - warm))));
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    const Tensor loss = p.loss(b);
    loss.backward();
    opt.step();
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double lv = loss.item<double>();
    if (step == 0) r.first_loss = lv;
    r.last_loss = lv;
    r.tokens += static_cast<int64_t>(idx.size()) * (train.patch_pixels ? train.seq / train.patch_pixels : train.seq);
    ++step;
    ++g_steps_done;
    if (step % log_every == 0 || step == total)
      run.log({{"phase", p.name}, {"step", step}, {"epoch", epoch}, {"loss", lv}, {"lr", lr}});
    if (step % per_epoch == 0 && p.evaluate) {
      p.model->eval();
      json e = p.evaluate();
      p.model->train();
      e["phase"] = p.name;
      e["step"] = step;
      e["epoch"] = epoch + 1;
      run.log(e);
    }
    bar.update(step, lv);
    const bool stop = g_stop_after >= 0 && g_steps_done >= g_stop_after && step < total;
    if (step % checkpoint_every == 0 || stop) checkpoint();
    if (stop) throw Interrupted(fmt::format("stopped after {} steps (--stop-after); continue with --resume {}",
                                            g_steps_done, run.dir.string()));
  }
  p.model->eval();
  r.steps = total;
  nn::save_safetensors(*p.model, final_ck.string());
  run.state["done"].push_back(p.name);
  run.state["phase_results"][p.name] = {{"seconds", r.seconds}, {"last_loss", r.last_loss},
                                        {"first_loss", r.first_loss}, {"steps", r.steps}, {"tokens", r.tokens}};
  run.state["phase"] = "";
  run.state["step"] = 0;
  run.save_state();
  return r;
}

// ---------------------------------------------------------------- plots and summaries

const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

void write_svg(const fs::path& p, const std::string& svg) { write_text(p, "<?xml version=\"1.0\"?>\n" + svg); }

// Loss and accuracy curves from metrics.jsonl, one series per phase.
void plot_curves(const fs::path& dir, const std::string& title) {
  std::map<std::string, report::ChartSeries> loss, acc;
  std::ifstream f(dir / "metrics.jsonl");
  std::string line;
  std::map<std::string, int64_t> offset;  // phases one after another on the x axis
  int64_t last_end = 0;
  std::string last_phase;
  while (std::getline(f, line)) {
    const json j = json::parse(line);
    const std::string ph = j.at("phase");
    if (!offset.count(ph)) { offset[ph] = last_end; }
    const double x = static_cast<double>(offset[ph] + j.at("step").get<int64_t>());
    last_end = std::max<int64_t>(last_end, offset[ph] + j.at("step").get<int64_t>());
    if (j.contains("loss")) loss[ph].points.push_back({x, j.at("loss").get<double>()});
    if (j.contains("val_accuracy")) acc[ph].points.push_back({x, j.at("val_accuracy").get<double>()});
  }
  auto chart = [&](std::map<std::string, report::ChartSeries>& m, const std::string& t, const std::string& y,
                   std::optional<double> ymax) {
    report::LineChart c;
    c.title = title + ": " + t;
    c.x_label = "step";
    c.y_label = y;
    c.y_max = ymax;
    int i = 0;
    for (auto& [name, s] : m) {
      s.name = name;
      s.color = kColors[i++ % 8];
      c.series.push_back(s);
    }
    return report::svg_line_chart(c, 640, 360);
  };
  if (!loss.empty()) write_svg(dir / "loss.svg", chart(loss, "training loss", "loss", std::nullopt));
  if (!acc.empty()) write_svg(dir / "accuracy.svg", chart(acc, "validation accuracy", "accuracy", 1.0));
}

void plot_bars(const fs::path& p, const std::string& title, const std::vector<std::string>& metrics,
               const std::vector<std::pair<std::string, std::vector<double>>>& groups) {
  report::BarChart c;
  c.title = title;
  c.metric_names = metrics;
  for (size_t i = 0; i < metrics.size(); ++i) c.metric_colors.push_back(kColors[i % 8]);
  for (const auto& [label, vals] : groups) {
    report::BarGroup g;
    g.label = label;
    for (double v : vals) {
      g.fractions.push_back(std::clamp(v, 0.0, 1.0));
      g.texts.push_back(fmt::format("{:.3f}", v));
    }
    c.groups.push_back(g);
  }
  write_svg(p, report::svg_bar_chart(c, std::max<int>(480, 90 * static_cast<int>(groups.size()) + 120), 360));
}

// CLS-row attention of the last layer (mean over heads) as a heat map beside each image.
std::string attention_maps_svg(const std::vector<std::vector<uint8_t>>& images,
                               const std::vector<std::pair<std::string, std::vector<std::vector<float>>>>& maps,
                               int64_t grid) {
  const int cell = 4, img = 28 * cell, gap = 16, cols = 1 + static_cast<int>(maps.size());
  const int W = cols * (img + gap) + gap, H = static_cast<int>(images.size()) * (img + gap) + 40;
  std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                              "viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"12\">\n"
                              "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", W, H, W, H);
  s += fmt::format("<text x=\"{}\" y=\"20\">image</text>\n", gap);
  for (size_t m = 0; m < maps.size(); ++m)
    s += fmt::format("<text x=\"{}\" y=\"20\">{}</text>\n", gap + (m + 1) * (img + gap), report::html_escape(maps[m].first));
  for (size_t i = 0; i < images.size(); ++i) {
    const int y0 = 30 + static_cast<int>(i) * (img + gap);
    for (int r = 0; r < 28; ++r)
      for (int c = 0; c < 28; ++c) {
        const int v = 255 - images[i][r * 28 + c];
        s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},{})\"/>", gap + c * cell,
                         y0 + r * cell, cell, cell, v, v, v);
      }
    s += "\n";
    for (size_t m = 0; m < maps.size(); ++m) {
      const auto& a = maps[m].second[i];
      const float mx = std::max(1e-12f, *std::max_element(a.begin(), a.end()));
      const int x0 = gap + static_cast<int>(m + 1) * (img + gap), pc = img / static_cast<int>(grid);
      for (int64_t k = 0; k < grid * grid; ++k) {
        const double t = a[k] / mx;  // white (0) to dark red (max)
        s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},{})\"/>",
                         x0 + (k % grid) * pc, y0 + (k / grid) * pc, pc, pc, 255 - static_cast<int>(100 * t),
                         255 - static_cast<int>(230 * t), 255 - static_cast<int>(230 * t));
      }
      s += "\n";
    }
  }
  return s + "</svg>\n";
}

std::string fmt_fig(double v) { return fmt::format("{:.4f}", v); }

// ---------------------------------------------------------------- train

TaskData load_task(const json& c) {
  auto t = make_task(task_options(c));
  if (!t) {
    if (t.error().kind == ErrorKind::invalid_argument) throw Usage(t.error().message);
    throw std::runtime_error(t.error().message);
  }
  return std::move(t).value();
}

// --check-kernels: the first check_steps training steps from the same
// initialisation and batches on the ATen path and on the generated kernels
// (host emulation, forward and backward kernels); the losses must agree to
// 1e-4 relative (fp32 kernels vs fp32 ATen differ in summation order only, and
// AdamW's first steps amplify such differences little). Throws when they do not.
json check_kernels(const json& c, const Dataset& train, const std::string& att, uint64_t seed) {
  if (!attention_kind(att, c).starts_with("{"))
    return {{"skipped", "a quadratic attention has no generated kernels"}};
  std::vector<Model> models;
  std::vector<std::unique_ptr<torch::optim::AdamW>> opts;
  for (auto path : {AttentionPath::aten, AttentionPath::host_kernels}) {
    torch::manual_seed(seed);
    models.emplace_back(c, train, att, seed, path);
    opts.push_back(std::make_unique<torch::optim::AdamW>(
        models.back()->parameters(), torch::optim::AdamWOptions(getd(c, "lr")).weight_decay(getd(c, "weight_decay"))));
  }
  json aten_losses = json::array(), kernel_losses = json::array();
  double worst = 0;
  const int64_t steps = c.at("check_steps").get<int64_t>(), B = geti(c, "batch");
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < B && (s * B + i) < train.size(); ++i) idx.push_back(s * B + i);
    const Batch b = make_batch(train, idx);
    double l[2];
    for (int m = 0; m < 2; ++m) {
      opts[m]->zero_grad();
      const Tensor loss = task_loss(models[m], b);
      loss.backward();
      opts[m]->step();
      l[m] = loss.item<double>();
    }
    aten_losses.push_back(l[0]);
    kernel_losses.push_back(l[1]);
    worst = std::max(worst, std::abs(l[0] - l[1]) / std::max(1.0, std::abs(l[0])));
    std::fprintf(stderr, "check-kernels step %lld: loss aten %.7f, host kernels %.7f\n", (long long)s, l[0], l[1]);
  }
  if (!(worst <= 1e-4))
    throw std::runtime_error(fmt::format("--check-kernels: losses differ by {:.3g} relative (> 1e-4): aten {}, "
                                         "host kernels {}", worst, aten_losses.dump(), kernel_losses.dump()));
  return {{"steps", steps}, {"aten_losses", aten_losses}, {"host_kernel_losses", kernel_losses},
          {"max_relative_difference", worst}, {"tolerance", 1e-4}};
}

AttentionPath path_of(const json& c) {
  const std::string p = gets(c, "path");
  return p == "host_kernels" ? AttentionPath::host_kernels
         : p == "cuda_kernels" ? AttentionPath::cuda_kernels
                               : AttentionPath::aten;
}

// "Autotune before training": on a kernel path, every distinct linear
// attention spec of the model is tuned at the shapes it will see (the
// training batch, forward and backward; the evaluation batch, forward) into
// the tuning database the kernel paths read, and the configs are reported.
// Self-attention over N = tokens (+ CLS) positions, the model's heads.
json tune_model(const json& c, Model& model, AttentionPath path) {
  if (path == AttentionPath::aten) return {{"path", "aten"}, {"note", "no kernels to tune on the ATen path"}};
  if (!c.at("tune").get<bool>())
    return {{"path", gets(c, "path")}, {"note", "tune = false: the tuning database's choice or the default config"}};
  const int64_t N = model->tokens + (model->use_cls ? 1 : 0), H = geti(c, "heads");
  std::map<std::string, AttentionSpec> specs;
  for (const Block& b : model->blocks)
    if (auto lin = std::dynamic_pointer_cast<nn::MultiheadLinearAttentionImpl>(b->attn))
      specs.emplace(canonical_json(lin->linear()->spec()), lin->linear()->spec());
  json out = json::array();
  TuneAttentionOptions opt;
  opt.top_k = static_cast<size_t>(geti(c, "tune_top_k"));
  for (const auto& [text, spec] : specs) {
    const ProblemShape train{int(geti(c, "batch")), int(H), int(N)}, eval{int(geti(c, "eval_batch")), int(H), int(N)};
    std::vector<TunedConfig> got;
    for (const auto& [pass, shapes] : {std::pair{Pass::forward, std::vector<ProblemShape>{train, eval}},
                                       {Pass::backward, std::vector<ProblemShape>{train}}}) {
      opt.passes = {pass};
      for (TunedConfig& t : tune_attention(spec, shapes, path, g_device, opt)) got.push_back(std::move(t));
    }
    for (const TunedConfig& t : got) {
      std::fprintf(stderr, "lunajit-experiment: %s %s batch %d heads %d seq %d -> %s (%s%s)\n",
                   spec_hash(spec).substr(0, 8).c_str(), std::string(to_string(t.pass)).c_str(), t.shape.batch,
                   t.shape.heads, t.shape.seq, t.config.to_string().c_str(), t.method.c_str(),
                   t.from_db ? ", from the database" : t.saved ? ", tuned and saved" : ", tuned, not saved");
      out.push_back({{"spec", json::parse(text)}, {"pass", to_string(t.pass)},
                     {"shape", {t.shape.batch, t.shape.heads, t.shape.seq}}, {"config", t.config.to_json()},
                     {"method", t.method}, {"from_db", t.from_db}, {"saved", t.saved}});
    }
  }
  return {{"path", gets(c, "path")}, {"tuned", out}};
}

json train_run(const json& c, const fs::path& dir, bool resume) {
  RunDir run;
  run.dir = dir;
  run.open(resume);
  const TaskData data = load_task(c);
  const uint64_t seed = c.at("seed").get<uint64_t>();
  torch::manual_seed(seed);
  const std::string att = gets(c, "attention");
  json kernel_check;
  if (c.at("check_kernels").get<bool>()) kernel_check = check_kernels(c, data.train, att, seed);
  torch::manual_seed(seed);
  const AttentionPath path = path_of(c);
  g_device = path == AttentionPath::cuda_kernels ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  Model model(c, data.train, att, seed, path);
  model->to(g_device);
  const json kernel_configs = tune_model(c, model, path);
  const int64_t eb = geti(c, "eval_batch");
  Phase p;
  p.name = "train";
  p.model = model;
  p.params = model->parameters();
  p.lr = getd(c, "lr");
  p.weight_decay = getd(c, "weight_decay");
  p.warmup = getd(c, "warmup");
  p.epochs = geti(c, "epochs");
  p.batch = geti(c, "batch");
  p.loss = [&](const Batch& b) { return task_loss(model, b); };
  p.evaluate = [&] { return json{{"val_accuracy", accuracy(model, data.val, eb)}}; };
  const PhaseResult r = run_phase(run, p, data.train, seed, geti(c, "checkpoint_every"), geti(c, "log_every"));
  nn::save_safetensors(*model, run.ck("model.safetensors").string());
  const double val = accuracy(model, data.val, eb), test = accuracy(model, data.test, eb);
  int64_t nparams = 0;
  for (const auto& t : model->parameters()) nparams += t.numel();
  json res = {{"task", gets(c, "task")}, {"attention", att}, {"seed", seed},
              {"val_accuracy", val}, {"test_accuracy", test}, {"first_loss", r.first_loss},
              {"final_loss", r.last_loss}, {"steps", r.steps}, {"parameters", nparams},
              {"train_seconds", r.seconds}, {"tokens_per_second", r.seconds > 0 ? r.tokens / r.seconds : 0.0},
              {"data", data.description}};
  if (!kernel_check.is_null()) res["check_kernels"] = kernel_check;
  res["kernel_configs"] = kernel_configs;
  write_text(dir / "results.json", res.dump(2) + "\n");
  plot_curves(dir, fmt::format("{} / {}", gets(c, "task"), att));
  plot_bars(dir / "results.svg", fmt::format("{} / {} (seed {})", gets(c, "task"), att, seed),
            {"val accuracy", "test accuracy"}, {{att, {val, test}}});
  write_text(dir / "summary.md",
             fmt::format("# train: {} on {}\n\nseed {}, {} steps, {} parameters, {:.1f} s training, {:.0f} tokens/s\n\n"
                         "| attention | val accuracy | test accuracy | first loss | final loss |\n|---|---|---|---|---|\n"
                         "| {} | {} | {} | {} | {} |\n",
                         att, gets(c, "task"), seed, r.steps, nparams, r.seconds,
                         res["tokens_per_second"].get<double>(), att, fmt_fig(val), fmt_fig(test),
                         fmt_fig(r.first_loss), fmt_fig(r.last_loss)));
  return res;
}

// ---------------------------------------------------------------- convert

json convert_run(const json& c, const fs::path& dir, bool resume) {
  RunDir run;
  run.dir = dir;
  run.open(resume);
  const TaskData data = load_task(c);
  const uint64_t seed = c.at("seed").get<uint64_t>();
  const int64_t eb = geti(c, "eval_batch"), cke = geti(c, "checkpoint_every"), le = geti(c, "log_every");
  const std::string target = gets(c, "to");
  if (target == "softmax") throw Usage("to = \"softmax\": the target must differ from the softmax teacher");
  torch::manual_seed(seed);
  Model teacher(c, data.train, "softmax", seed);
  PhaseResult tr;
  const std::string tdir = gets(c, "teacher_dir");
  if (!tdir.empty()) {
    const json tc = read_json(fs::path(tdir) / "config.json");
    for (const char* k : {"task", "embed", "heads", "layers", "mlp_ratio", "pooling", "patch", "seq_len", "dwc",
                          "train_size", "data_seed"})
      if (tc.at(k) != c.at(k))
        throw Usage(fmt::format("teacher_dir = {}: its {} = {} differs from this run's {}", tdir, k, tc.at(k).dump(),
                                c.at(k).dump()));
    if (tc.at("attention") != "softmax")
      throw Usage(fmt::format("teacher_dir = {}: attention = {}, a teacher must be softmax", tdir, tc.at("attention").dump()));
    nn::load_safetensors(*teacher, (fs::path(tdir) / "checkpoint" / "model.safetensors").string());
  } else {
    Phase p;
    p.name = "teacher";
    p.model = teacher;
    p.params = teacher->parameters();
    p.lr = getd(c, "lr");
    p.weight_decay = getd(c, "weight_decay");
    p.warmup = getd(c, "warmup");
    p.epochs = geti(c, "teacher_epochs");
    p.batch = geti(c, "batch");
    p.loss = [&](const Batch& b) { return task_loss(teacher, b); };
    p.evaluate = [&] { return json{{"val_accuracy", accuracy(teacher, data.val, eb)}}; };
    tr = run_phase(run, p, data.train, seed, cke, le);
  }
  teacher->eval();
  for (auto& t : teacher->parameters()) t.requires_grad_(false);
  const double teacher_acc = accuracy(teacher, data.test, eb);

  // The student: the teacher's weights, each attention core swapped for the target's.
  Model student(c, data.train, "softmax", seed);
  {
    torch::NoGradGuard g;
    auto dst = student->named_parameters();
    for (const auto& item : teacher->named_parameters()) dst[item.key()].copy_(item.value());
  }
  for (size_t i = 0; i < student->blocks.size(); ++i)
    student->blocks[i]->swap_attention(make_attention(target, c, seed + 104729 + 7919 * i));
  student->eval();
  const double swap_acc = accuracy(student, data.test, eb);

  // Stage 1: only the feature maps' parameters; loss = CE(teacher rows, student rows) + w * MSE(outputs).
  std::vector<Tensor> fm;
  for (const auto& item : student->named_parameters())
    if (item.key().find("feature_map") != std::string::npos) fm.push_back(item.value());
  const double w_mse = getd(c, "distill_output_mse");
  std::string stage1 = "distilled";
  PhaseResult s1;
  if (fm.empty() || geti(c, "distill_epochs") == 0) {
    stage1 = fm.empty() ? "skipped: the target has no feature-map parameters" : "skipped: distill_epochs = 0";
  } else {
    for (auto& t : student->parameters()) t.requires_grad_(false);
    for (auto& t : fm) t.requires_grad_(true);
    Phase p;
    p.name = "distill";
    p.model = student;
    p.params = fm;
    p.lr = getd(c, "distill_lr");
    p.weight_decay = 0;
    p.warmup = getd(c, "warmup");
    p.epochs = geti(c, "distill_epochs");
    p.batch = geti(c, "batch");
    p.loss = [&](const Batch& b) {
      std::vector<Tensor> hs;
      {
        torch::NoGradGuard g;
        teacher->forward(b.input, b.pad, &hs);
      }
      Tensor pad = b.pad;
      if (pad.defined() && teacher->use_cls)
        pad = torch::cat({torch::zeros({pad.size(0), 1}, pad.options()), pad}, 1);
      Tensor loss = torch::zeros({});
      for (size_t i = 0; i < hs.size(); ++i) {
        Tensor to, tw;
        {
          torch::NoGradGuard g;
          std::tie(to, tw) = teacher->blocks[i]->attn->forward(hs[i], hs[i], hs[i], pad, true, {}, false);
        }
        auto [so, sw] = student->blocks[i]->attn->forward(hs[i], hs[i], hs[i], pad, true, {}, false);
        loss = loss - (tw * sw.clamp_min(1e-12).log()).sum(-1).mean() +
               w_mse * torch::mse_loss(so, to);
      }
      return loss / static_cast<double>(hs.size());
    };
    p.evaluate = [&] { return json{{"val_accuracy", accuracy(student, data.val, eb)}}; };
    s1 = run_phase(run, p, data.train, seed, cke, le);
  }
  student->eval();
  const double before_ft = accuracy(student, data.test, eb);

  // Stage 2: everything, task loss, briefly.
  for (auto& t : student->parameters()) t.requires_grad_(true);
  PhaseResult s2;
  if (geti(c, "finetune_epochs") > 0) {
    Phase p;
    p.name = "finetune";
    p.model = student;
    p.params = student->parameters();
    p.lr = getd(c, "finetune_lr");
    p.weight_decay = getd(c, "weight_decay");
    p.warmup = getd(c, "warmup");
    p.epochs = geti(c, "finetune_epochs");
    p.batch = geti(c, "batch");
    p.loss = [&](const Batch& b) { return task_loss(student, b); };
    p.evaluate = [&] { return json{{"val_accuracy", accuracy(student, data.val, eb)}}; };
    s2 = run_phase(run, p, data.train, seed, cke, le);
  }
  student->eval();
  nn::save_safetensors(*student, run.ck("model.safetensors").string());
  const double conv = accuracy(student, data.test, eb);
  json res = {{"task", gets(c, "task")}, {"teacher", "softmax"}, {"to", target}, {"seed", seed},
              {"teacher_accuracy", teacher_acc}, {"swapped_accuracy", swap_acc},
              {"converted_accuracy_before_finetune", before_ft}, {"converted_accuracy", conv},
              {"recovery", teacher_acc > 0 ? conv / teacher_acc : 0.0},
              {"recovery_before_finetune", teacher_acc > 0 ? before_ft / teacher_acc : 0.0},
              {"stage1", stage1},
              {"teacher_seconds", tr.seconds}, {"distill_seconds", s1.seconds}, {"finetune_seconds", s2.seconds},
              {"teacher_tokens_per_second", tr.seconds > 0 ? tr.tokens / tr.seconds : 0.0},
              {"finetune_tokens_per_second", s2.seconds > 0 ? s2.tokens / s2.seconds : 0.0},
              {"data", data.description}};
  // CLS attention maps (fmnist-vit): last layer, mean over heads.
  if (data.test.patch_pixels && teacher->use_cls && geti(c, "attention_maps") > 0) {
    const int64_t n = std::min<int64_t>(geti(c, "attention_maps"), data.test.size());
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const Batch b = make_batch(data.test, idx);
    const int64_t g = 28 / static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(data.test.patch_pixels))));
    auto cls_map = [&](Model& m) {
      torch::NoGradGuard ng;
      std::vector<Tensor> hs;
      m->forward(b.input, b.pad, &hs);
      auto [o, w] = m->blocks.back()->attn->forward(hs.back(), hs.back(), hs.back(), {}, true, {}, true);
      const Tensor row = w.select(1, 0).narrow(1, 1, g * g).contiguous().to(torch::kFloat);  // CLS row over patches
      std::vector<std::vector<float>> out;
      for (int64_t i = 0; i < n; ++i)
        out.emplace_back(row[i].data_ptr<float>(), row[i].data_ptr<float>() + g * g);
      return out;
    };
    std::vector<std::vector<uint8_t>> images;
    for (int64_t i = 0; i < n; ++i) {  // back to row-major pixels
      std::vector<uint8_t> im(784);
      const int64_t ps = 28 / g;
      const uint8_t* t = data.test.tokens.data() + i * 784;
      int64_t o = 0;
      for (int64_t pr = 0; pr < g; ++pr)
        for (int64_t pc = 0; pc < g; ++pc)
          for (int64_t r = 0; r < ps; ++r)
            for (int64_t cc = 0; cc < ps; ++cc) im[(pr * ps + r) * 28 + pc * ps + cc] = t[o++];
      images.push_back(im);
    }
    write_svg(dir / "attention_maps.svg",
              attention_maps_svg(images, {{"softmax teacher", cls_map(teacher)}, {target + " converted", cls_map(student)}}, g));
  }
  write_text(dir / "results.json", res.dump(2) + "\n");
  plot_curves(dir, fmt::format("convert {} -> {}", gets(c, "task"), target));
  plot_bars(dir / "results.svg", fmt::format("convert softmax -> {} on {} (seed {})", target, gets(c, "task"), seed),
            {"test accuracy"},
            {{"teacher", {teacher_acc}}, {"swapped", {swap_acc}}, {"after stage 1", {before_ft}}, {"converted", {conv}}});
  write_text(dir / "summary.md",
             fmt::format("# convert: softmax -> {} on {}\n\nseed {}; stage 1 {}\n\n"
                         "| teacher | swapped | after stage 1 | converted | recovery |\n|---|---|---|---|---|\n"
                         "| {} | {} | {} | {} | {} |\n",
                         target, gets(c, "task"), seed, stage1, fmt_fig(teacher_acc), fmt_fig(swap_acc),
                         fmt_fig(before_ft), fmt_fig(conv), fmt_fig(res["recovery"].get<double>())));
  return res;
}

// ---------------------------------------------------------------- ablate

std::pair<double, double> mean_std(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m += x;
  m /= static_cast<double>(v.size());
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return {m, v.size() > 1 ? std::sqrt(s / static_cast<double>(v.size() - 1)) : 0.0};
}

json ablate_run(const json& c, const fs::path& dir, bool resume) {
  fs::create_directories(dir / "runs");
  const std::string grid = gets(c, "grid");
  struct Cell { std::string name; json overrides; };
  std::vector<Cell> cells;
  if (grid == "ml") {
    for (const auto& m : c.at("grid_values"))
      for (const auto& l : c.at("grid_values"))
        cells.push_back({fmt::format("luna-M{}-L{}", m.get<int64_t>(), l.get<int64_t>()),
                         {{"attention", "luna"}, {"luna_projections", m}, {"luna_channels", l}}});
  } else if (grid == "variants") {
    const int64_t D = geti(c, "budget");
    const int64_t side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(D))));
    if (side * side != D || D % 2) throw Usage(fmt::format("budget = {}: must be an even square (D = M * L, M = L)", D));
    cells = {{"neural", {{"attention", "luna"}, {"luna_projections", side}, {"luna_channels", side}}},
             {"envelope", {{"attention", "luna-envelope"}, {"luna_projections", side}, {"luna_channels", side}}},
             {"bank_coef", {{"attention", "luna-bank_coef"}, {"luna_projections", side}, {"luna_channels", side}}},
             {"rff", {{"attention", "luna-rff"}, {"luna_projections", D / 2}}}};
  } else {
    json tasks = c.at("tasks");
    if (tasks.empty()) tasks.push_back(c.at("task"));
    const bool many = tasks.size() > 1;
    for (const auto& t : tasks)
      for (const auto& a : c.at(grid == "attention" ? "attentions" : "targets"))
        cells.push_back({(many ? t.get<std::string>() + "/" : "") + a.get<std::string>(),
                         {{"task", t}, {grid == "attention" ? "attention" : "to", a}}});
  }
  json rows = json::array();
  std::vector<std::pair<std::string, std::vector<double>>> bars;
  std::string md = fmt::format("# ablate: grid {} on {}\n\nseeds {}; mean ± std over seeds\n\n", grid, gets(c, "task"),
                               c.at("seeds").dump());
  const bool conv = grid == "convert";
  md += conv ? "| target | teacher | after stage 1 | converted | recovery |\n|---|---|---|---|---|\n"
             : "| attention | test accuracy | val accuracy | tokens/s | train s |\n|---|---|---|---|---|\n";
  for (const auto& cell : cells) {
    std::map<std::string, std::vector<double>> figs;
    for (const auto& s : c.at("seeds")) {
      json sc = c;
      sc.update(cell.overrides);
      sc["seed"] = s;
      std::string sub_name = cell.name;
      std::replace(sub_name.begin(), sub_name.end(), '/', '_');
      const fs::path sub = dir / "runs" / fmt::format("{}-s{}", sub_name, s.get<uint64_t>());
      if (conv && gets(c, "teacher_dir").empty()) {
        // One softmax teacher per (task, seed), shared by the targets: a train run.
        json tc = sc;
        tc["attention"] = "softmax";
        tc["epochs"] = sc.at("teacher_epochs");
        tc["command"] = "train";
        const fs::path td = dir / "runs" / fmt::format("teacher-{}-s{}", gets(sc, "task"), s.get<uint64_t>());
        if (!fs::exists(td / "results.json")) {
          const bool partial = fs::exists(td / "config.json");
          fs::create_directories(td);
          if (!partial) write_text(td / "config.json", tc.dump(2) + "\n");
          std::fprintf(stderr, "ablate: softmax teacher for %s seed %llu\n", gets(sc, "task").c_str(),
                       (unsigned long long)s.get<uint64_t>());
          train_run(partial ? read_json(td / "config.json") : tc, td, partial);
        }
        sc["teacher_dir"] = td.string();
      }
      json res;
      if (resume && fs::exists(sub / "results.json")) {
        res = read_json(sub / "results.json");
      } else if (resume && fs::exists(sub / "config.json")) {
        res = conv ? convert_run(read_json(sub / "config.json"), sub, true) : train_run(read_json(sub / "config.json"), sub, true);
      } else {
        fs::create_directories(sub);
        sc["command"] = conv ? "convert" : "train";
        write_text(sub / "config.json", sc.dump(2) + "\n");
        std::fprintf(stderr, "ablate: %s seed %llu\n", cell.name.c_str(), (unsigned long long)s.get<uint64_t>());
        res = conv ? convert_run(sc, sub, resume) : train_run(sc, sub, resume);
      }
      for (const char* k : {"test_accuracy", "val_accuracy", "tokens_per_second", "train_seconds", "teacher_accuracy",
                            "converted_accuracy_before_finetune", "converted_accuracy", "recovery"})
        if (res.contains(k)) figs[k].push_back(res[k].get<double>());
    }
    json row = {{"name", cell.name}, {"settings", cell.overrides}};
    for (const auto& [k, v] : figs) {
      const auto [m, sd] = mean_std(v);
      row[k] = {{"mean", m}, {"std", sd}, {"values", v}};
    }
    rows.push_back(row);
    auto ms = [&](const char* k) {
      const auto [m, sd] = mean_std(figs.at(k));
      return fmt::format("{:.4f} ± {:.4f}", m, sd);
    };
    if (conv) {
      md += fmt::format("| {} | {} | {} | {} | {} |\n", cell.name, ms("teacher_accuracy"),
                        ms("converted_accuracy_before_finetune"), ms("converted_accuracy"), ms("recovery"));
      bars.push_back({cell.name, {mean_std(figs["teacher_accuracy"]).first,
                                  mean_std(figs["converted_accuracy_before_finetune"]).first,
                                  mean_std(figs["converted_accuracy"]).first}});
    } else {
      md += fmt::format("| {} | {} | {} | {:.0f} | {:.1f} |\n", cell.name, ms("test_accuracy"), ms("val_accuracy"),
                        mean_std(figs["tokens_per_second"]).first, mean_std(figs["train_seconds"]).first);
      bars.push_back({cell.name, {mean_std(figs["test_accuracy"]).first}});
    }
  }
  json res = {{"grid", grid}, {"task", gets(c, "task")}, {"seeds", c.at("seeds")}, {"rows", rows}};
  write_text(dir / "results.json", res.dump(2) + "\n");
  plot_bars(dir / "results.svg", fmt::format("ablate {} on {} (mean over seeds)", grid, gets(c, "task")),
            conv ? std::vector<std::string>{"teacher", "after stage 1", "converted"}
                 : std::vector<std::string>{"test accuracy"},
            bars);
  write_text(dir / "summary.md", md);
  // metrics.jsonl: one line per cell (the per-step metrics are in runs/*/metrics.jsonl).
  std::string lines;
  for (const auto& r : rows) lines += json{{"phase", "ablate"}, {"cell", r["name"]}, {"row", r}}.dump() + "\n";
  write_text(dir / "metrics.jsonl", lines);
  fs::create_directories(dir / "checkpoint");
  write_text(dir / "checkpoint" / "cells.json", rows.dump(2) + "\n");
  return res;
}

// ---------------------------------------------------------------- kernel-fit (SLAY's protocol)

struct Fit {
  double rel_l2, cosine, mse;
};
Fit compare(const Tensor& a, const Tensor& ref) {
  const Tensor d = (a - ref).to(torch::kDouble), r = ref.to(torch::kDouble), x = a.to(torch::kDouble);
  return {(d.norm() / r.norm()).item<double>(),
          ((x * r).sum() / (x.norm() * r.norm()).clamp_min(1e-300)).item<double>(), d.pow(2).mean().item<double>()};
}

json kernel_fit_run(const json& c, const fs::path& dir, bool resume) {
  fs::create_directories(dir / "checkpoint");
  (void)resume;  // each cell takes seconds: a resumed run recomputes them (same figures, same seeds)
  const int64_t N = geti(c, "kf_seq"), d = geti(c, "kf_head_dim"), H = geti(c, "kf_heads"), B = geti(c, "kf_batch"),
                steps = geti(c, "kf_fit_steps");
  const double scale = getd(c, "kf_input_scale");
  aten::QuadraticOptions soft, syat;
  soft.kind = aten::QuadraticKind::softmax;
  syat.kind = aten::QuadraticKind::spherical_yat;
  json rows = json::array();
  std::string lines;
  std::map<std::string, std::map<std::string, std::vector<double>>> agg;  // "family/stage/ref/metric" -> values
  std::vector<std::string> order;
  for (const auto& s : c.at("seeds")) {
    const uint64_t seed = s.get<uint64_t>();
    torch::manual_seed(seed);
    auto draw = [&] {
      return std::make_pair(torch::randn({B, N, H, d}) * scale, torch::randn({B, N, H, d}) * scale);
    };
    const auto [qf, kf] = draw();  // fitting inputs
    const auto [q, k] = draw();    // held-out inputs: the figures
    const Tensor ref_soft = aten::quadratic_weights(q, k, soft), ref_syat = aten::quadratic_weights(q, k, syat);
    const Tensor fit_soft = aten::quadratic_weights(qf, kf, soft), fit_syat = aten::quadratic_weights(qf, kf, syat);
    for (const auto& fam : c.at("families")) {
      const std::string name = fam.get<std::string>();
      auto spec = spec_from_string(attention_kind(name, json{{"embed", d * H}, {"heads", H},
                                                             {"luna_mlp_width", geti(c, "luna_mlp_width")},
                                                             {"luna_projections", geti(c, "luna_projections")},
                                                             {"luna_channels", geti(c, "luna_channels")}}));
      if (!spec) throw Usage(fmt::format("families: \"{}\": {}", name, spec.error().message));
      if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
      for (const auto& [ref_name, ref, fit_ref] :
           {std::tuple{std::string("softmax"), ref_soft, fit_soft}, {std::string("spherical_yat"), ref_syat, fit_syat}}) {
        nn::LinearAttention la(*spec, H, LinearAttentionOptions{}, seed);
        auto record = [&, ref_name = ref_name, ref = ref](const std::string& stage) {
          torch::NoGradGuard g;
          const Fit f = compare(la->weights(q, k), ref);
          json row = {{"family", name}, {"reference", ref_name}, {"stage", stage}, {"seed", seed},
                      {"rel_l2", f.rel_l2}, {"cosine", f.cosine}, {"mse", f.mse}};
          lines += row.dump() + "\n";
          const std::string key = name + "/" + stage + "/" + ref_name;
          agg[key]["rel_l2"].push_back(f.rel_l2);
          agg[key]["cosine"].push_back(f.cosine);
          agg[key]["mse"].push_back(f.mse);
        };
        record("init");
        if (la->feature_map->learned() && steps > 0) {
          // Fit the learned feature map to the reference's rows on the fitting inputs (CE of the rows).
          torch::optim::Adam opt({la->feature_map->params}, torch::optim::AdamOptions(getd(c, "kf_lr")));
          for (int64_t i = 0; i < steps; ++i) {
            opt.zero_grad();
            const Tensor loss = -(fit_ref * la->weights(qf, kf).clamp_min(1e-12).log()).sum(-1).mean();
            loss.backward();
            opt.step();
          }
          record("fitted");
        }
      }
    }
  }
  std::string md = fmt::format("# kernel-fit: attention matrices vs exact softmax and spherical Yat\n\n"
                               "q, k ~ N(0, {}^2), batch {}, seq {}, {} heads, head_dim {}; held-out inputs; seeds {};"
                               " fitted = {} Adam steps on separate inputs (learned families)\n\n"
                               "| family | stage | reference | rel L2 | cosine | MSE |\n|---|---|---|---|---|---|\n",
                               scale, B, N, H, d, c.at("seeds").dump(), steps);
  std::vector<std::pair<std::string, std::vector<double>>> bars;
  for (const auto& name : order)
    for (const char* stage : {"init", "fitted"})
      for (const char* ref : {"softmax", "spherical_yat"}) {
        const std::string key = name + "/" + stage + "/" + ref;
        if (!agg.count(key)) continue;
        json row = {{"family", name}, {"stage", stage}, {"reference", ref}};
        std::string cells;
        for (const char* m : {"rel_l2", "cosine", "mse"}) {
          const auto [mu, sd] = mean_std(agg[key][m]);
          row[m] = {{"mean", mu}, {"std", sd}};
          cells += fmt::format(" {:.4g} ± {:.2g} |", mu, sd);
        }
        rows.push_back(row);
        md += fmt::format("| {} | {} | {} |{}\n", name, stage, ref, cells);
        if (std::string(ref) == "spherical_yat")
          bars.push_back({name + " " + stage, {mean_std(agg[key]["cosine"]).first,
                                               mean_std(agg[name + "/" + stage + "/softmax"]["cosine"]).first}});
      }
  json res = {{"protocol", "SLAY kernel approximation: rel L2, cosine, MSE of attention matrices"},
              {"seq", N}, {"head_dim", d}, {"heads", H}, {"batch", B}, {"input_scale", scale},
              {"fit_steps", steps}, {"seeds", c.at("seeds")}, {"rows", rows}};
  write_text(dir / "metrics.jsonl", lines);
  write_text(dir / "results.json", res.dump(2) + "\n");
  write_text(dir / "checkpoint" / "rows.json", rows.dump(2) + "\n");
  plot_bars(dir / "results.svg", "kernel-fit: cosine of attention matrices", {"vs spherical yat", "vs softmax"}, bars);
  write_text(dir / "summary.md", md);
  return res;
}

// ---------------------------------------------------------------- main

int run_command(const std::string& command, json cfg, const std::string& out, bool resume) {
  const fs::path dir = out;
  if (resume) {
    if (!fs::exists(dir / "config.json")) throw Usage(fmt::format("--resume {}: no config.json there", out));
    cfg = read_json(dir / "config.json");
    if (cfg.value("command", "") != command)
      throw Usage(fmt::format("--resume {}: a {} run, not {}", out, cfg.value("command", "?"), command));
    if (cfg.at("threads") != cfg.at("threads_used")) {}
  } else {
    fs::create_directories(dir);
    cfg["command"] = command;
    cfg["git_revision"] = git_revision();
    cfg["threads_used"] = cfg.at("threads");
    cfg["torch_version"] = TORCH_VERSION;
    if (command != "train" && gets(cfg, "path") != "aten")
      throw Usage(fmt::format("path = \"{}\": {} runs on the ATen path only (path is a train setting)",
                              gets(cfg, "path"), command));
    write_text(dir / "config.json", cfg.dump(2) + "\n");
  }
  torch::set_num_threads(static_cast<int>(geti(cfg, "threads")));
  std::fprintf(stderr, "lunajit-experiment %s: %s, %d threads, out %s%s\n", command.c_str(), gets(cfg, "task").c_str(),
               torch::get_num_threads(), out.c_str(), resume ? " (resumed)" : "");
  json res;
  if (command == "train") res = train_run(cfg, dir, resume);
  else if (command == "convert") res = convert_run(cfg, dir, resume);
  else if (command == "ablate") res = ablate_run(cfg, dir, resume);
  else res = kernel_fit_run(cfg, dir, resume);
  std::printf("%s", read_text(dir / "summary.md").c_str());
  return 0;
}

}  // namespace
}  // namespace lunajit::experiment

int main(int argc, char** argv) {
  using namespace lunajit::experiment;
  CLI::App app{"lunajit-experiment: train, convert, ablate and kernel-fit runs on lunajit's LibTorch binding "
               "(docs/EXPERIMENTS.md)", "lunajit-experiment"};
  app.require_subcommand(1);
  struct Opts {
    std::string config, task, attention, to, out, resume;
    std::vector<std::string> set;
    uint64_t seed = 0;
    bool quick = false, check_kernels = false, print_config = false;
    int64_t stop_after = -1;
    int64_t threads = 0;
  } o;
  std::map<std::string, CLI::App*> subs;
  for (const auto& [name, help] : {std::pair{"train", "train a classifier with one attention"},
                                   {"convert", "convert a softmax model to a linear family (MATH.md §4)"},
                                   {"ablate", "a grid of train or convert runs over seeds"},
                                   {"kernel-fit", "attention-matrix fidelity vs softmax and spherical Yat"}}) {
    CLI::App* s = app.add_subcommand(name, help);
    s->add_option("--config", o.config, "JSON file of settings (docs/EXPERIMENTS.md)");
    s->add_option("--task", o.task, "fmnist-seq | fmnist-vit | listops | kv_recall | first_token | counting | "
                                    "majority | histogram | sort | reverse");
    if (std::string(name) != "convert" && std::string(name) != "kernel-fit")
      s->add_option("--attention", o.attention, "softmax | yat | spherical_yat | a family | luna-<variant> | spec JSON");
    if (std::string(name) == "convert") s->add_option("--to", o.to, "target attention of the conversion");
    s->add_option("--seed", o.seed, "model seed (data splits use data_seed)")->check(lunajit::uint64_value("--seed"));
    s->add_option("--out", o.out, "run directory");
    s->add_flag("--quick", o.quick, "toy sizes (about a minute on one core)");
    s->add_option("--resume", o.resume, "continue the interrupted run in this directory");
    s->add_flag("--print-config", o.print_config, "check the settings, print the resolved configuration, run nothing");
    s->add_option("--threads", o.threads, "torch threads (recorded; resume uses the recorded count)")
        ->check(lunajit::int_in("--threads", {1, 256}));
    s->add_option("--set", o.set, "KEY=VALUE (VALUE as JSON, else a string); repeatable");
    if (std::string(name) == "train")
      s->add_flag("--check-kernels", o.check_kernels, "first check_steps steps also on the host-emulated kernels; "
                                                      "assert equal losses");
    s->add_option("--stop-after", o.stop_after, "interrupt after this many steps, checkpointed (for resume tests)")
        ->check(lunajit::int_in("--stop-after", {1, 1000000000}));
    subs[name] = s;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const int rc = lunajit::parse_command_line(app, args); rc >= 0) return rc;
  std::string command;
  for (const auto& [n, s] : subs)
    if (s->parsed()) command = n;
  try {
    g_stop_after = o.stop_after;
    json cfg = default_config();
    if (o.resume.empty()) {
      json file = json::object();
      if (!o.config.empty()) file = read_json(o.config);
      const std::string task = !o.task.empty() ? o.task : file.value("task", gets(cfg, "task"));
      if (o.quick) merge_checked(cfg, quick_overrides(command, task), "--quick");
      if (!o.config.empty()) merge_checked(cfg, file, o.config);
      json flags = json::object();
      if (!o.task.empty()) flags["task"] = o.task;
      if (!o.attention.empty()) flags["attention"] = o.attention;
      if (!o.to.empty()) flags["to"] = o.to;
      if (app.get_subcommand(command)->count("--seed")) flags["seed"] = o.seed;
      if (o.threads) flags["threads"] = o.threads;
      if (o.check_kernels) flags["check_kernels"] = true;
      for (const auto& kv : o.set) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) throw Usage(fmt::format("--set {}: must be KEY=VALUE", kv));
        const std::string v = kv.substr(eq + 1);
        json jv = json::parse(v, nullptr, false);
        flags[kv.substr(0, eq)] = jv.is_discarded() ? json(v) : jv;
      }
      merge_checked(cfg, flags, "flags");
      cfg["quick"] = o.quick;
      validate(cfg);
      if (o.out.empty() && !o.print_config) throw Usage("--out DIR is required (or --resume DIR)");
      // Names are checked before the run directory is made.
      const auto& tn = task_names();
      if (command != "kernel-fit" && std::find(tn.begin(), tn.end(), gets(cfg, "task")) == tn.end())
        throw Usage(make_task(task_options(cfg)).error().message);
      json tasks = cfg.at("tasks");
      if (tasks.empty() || command == "train" || command == "convert") tasks = json::array({cfg.at("task")});
      for (const auto& t : tasks) {
        if (command == "train") check_mask_support(t, gets(cfg, "attention"), cfg);
        if (command == "convert") check_mask_support(t, gets(cfg, "to"), cfg);
        if (command == "ablate") {
          if (gets(cfg, "grid") == "attention")
            for (const auto& a : cfg.at("attentions")) check_mask_support(t, a, cfg);
          if (gets(cfg, "grid") == "convert")
            for (const auto& a : cfg.at("targets")) check_mask_support(t, a, cfg);
        }
      }
      if (command == "train") attention_kind(gets(cfg, "attention"), cfg);
      if (command == "convert") attention_kind(gets(cfg, "to"), cfg);
      if (command == "convert" && gets(cfg, "to") == "softmax")
        throw Usage("to = \"softmax\": the target must differ from the softmax teacher");
      for (const auto& t : cfg.at("tasks"))
        if (std::find(tn.begin(), tn.end(), t.get<std::string>()) == tn.end())
          throw Usage(fmt::format("tasks: \"{}\" is not a task", t.get<std::string>()));
      if (command == "ablate")
        for (const char* k : {"attentions", "targets"})
          for (const auto& a : cfg.at(k)) attention_kind(a.get<std::string>(), cfg);
      if (command == "kernel-fit")
        for (const auto& a : cfg.at("families")) attention_kind(a.get<std::string>(), cfg);
      if (o.print_config) {
        cfg["command"] = command;
        std::printf("%s\n", cfg.dump(2).c_str());
        return 0;
      }
      if (fs::exists(fs::path(o.out) / "config.json"))
        throw Usage(fmt::format("--out {}: already a run directory; use --resume {} or another --out", o.out, o.out));
      return run_command(command, cfg, o.out, false);
    }
    if (!o.out.empty() && o.out != o.resume) throw Usage("--resume DIR writes into DIR; drop --out");
    if (o.print_config) throw Usage("--print-config: not with --resume (the run's settings are in DIR/config.json)");
    return run_command(command, cfg, o.resume, true);
  } catch (const Usage& e) {
    std::fprintf(stderr, "lunajit-experiment: %s\n", e.what());
    return 2;
  } catch (const Interrupted& e) {
    std::fprintf(stderr, "\nlunajit-experiment: %s\n", e.what());
    return 3;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "lunajit-experiment: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lunajit-experiment: %s\n", e.what());
    return 1;
  }
}
