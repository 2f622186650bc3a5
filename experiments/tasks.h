// The data of lunajit-experiment (docs/EXPERIMENTS.md): seeded generators and
// the Fashion-MNIST IDX loader, without LibTorch so they are cheap to test.
//
// Every example is a row of `seq` byte tokens (vocab <= 256) and either one label
// (classification) or one label per position (per_token; -1 = not scored).
// Splits are fixed: generated tasks draw train, val and test from three
// disjoint seed streams of `data_seed` (never the model seed), Fashion-MNIST
// uses train-file images [0, 55000) for train, [55000, 60000) for val and the
// t10k file for test, each cut to its first N when a size is set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace lunajit::experiment {

struct Dataset {
  int64_t seq = 0;
  int64_t vocab = 0;    // token ids in [0, vocab)
  int64_t classes = 0;
  bool per_token = false;
  // fmnist-vit: tokens are pixels, patch-major (patch p's pixels at
  // [p * patch_pixels, (p + 1) * patch_pixels)); the model reads them as
  // seq / patch_pixels patches of patch_pixels values in [0, 1].
  int64_t patch_pixels = 0;
  int pad_token = -1;   // >= 0: positions holding it are padding (key mask)
  std::vector<uint8_t> tokens;   // [n, seq]
  std::vector<int16_t> labels;   // [n] or [n, seq] when per_token
  int64_t size() const { return seq == 0 ? 0 : static_cast<int64_t>(tokens.size()) / seq; }
};

struct TaskOptions {
  std::string name;               // fmnist-seq, fmnist-vit, listops, or a synthetic task (synthetic_task_names)
  int64_t train_size = 0;         // 0: the task's default
  int64_t val_size = 0;
  int64_t test_size = 0;
  uint64_t data_seed = 1234;
  int64_t seq_len = 0;            // synthetic tasks: 0 = default 32
  int64_t patch = 4;              // fmnist-vit: 4 or 7 (49 or 16 patches)
  std::string fmnist_dir = "/usr/share/datasets/fashion-mnist";
  // listops (LRA's grammar scaled down; LRA: depth 10, 10 args, length 500..2000)
  int64_t listops_max_depth = 6;
  int64_t listops_max_args = 5;
  int64_t listops_min_length = 32;
  int64_t listops_max_length = 128;
};

struct TaskData {
  Dataset train, val, test;
  nlohmann::json description;  // what was generated/loaded, with its bounds
};

// The synthetic tasks (names after SLAY's Table 7; our generators, docs/EXPERIMENTS.md).
const std::vector<std::string>& synthetic_task_names();
const std::vector<std::string>& task_names();

Result<TaskData> make_task(const TaskOptions& options);

// IDX (LeCun's format), gzip-compressed or not: magic 0x00000803 (3-D uint8
// images) or 0x00000801 (1-D uint8 labels), big-endian dims, exactly the
// payload the dims imply. Errors name the file and what is wrong.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};
Result<IdxArray> read_idx(const std::string& path, int expected_rank);

// LRA ListOps: one expression (tokens, see listops_token_names) and its value.
struct ListopsExample {
  std::vector<uint8_t> tokens;
  int value = 0;
};
const std::vector<std::string>& listops_token_names();  // index = token id
// Evaluates a token sequence of the grammar; an error for a malformed one.
Result<int> evaluate_listops(const std::vector<uint8_t>& tokens);

// splitmix64: the generators' only source of randomness (portable, unlike
// std:: distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), n >= 1
  double uniform();            // [0, 1)
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace lunajit::experiment
