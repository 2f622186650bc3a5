#include "experiments/tasks.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>

#include <fmt/format.h>

namespace lunajit::experiment {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t Rng::below(uint64_t n) {
  // Lemire's multiply-shift with rejection: unbiased.
  for (;;) {
    const unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    const uint64_t low = static_cast<uint64_t>(m);
    if (low >= n || low >= (-n) % n) return static_cast<uint64_t>(m >> 64);
  }
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

const std::vector<std::string>& synthetic_task_names() {
  static const std::vector<std::string> names{"kv_recall", "first_token", "counting", "majority",
                                              "histogram", "sort",        "reverse"};
  return names;
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n{"fmnist-seq", "fmnist-vit", "listops"};
    for (const auto& s : synthetic_task_names()) n.push_back(s);
    return n;
  }();
  return names;
}

// ---------------------------------------------------------------- IDX

Result<IdxArray> read_idx(const std::string& path, int expected_rank) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) return Error::unavailable(fmt::format("{}: cannot open (install Debian's dataset-fashion-mnist, "
                                                          "or pass --fmnist-dir)", path));
  std::vector<uint8_t> bytes;
  std::array<uint8_t, 1 << 16> buf{};
  for (;;) {
    const int n = gzread(f, buf.data(), buf.size());
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      return Error::failure(fmt::format("{}: read error: {}", path, msg));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buf.begin(), buf.begin() + n);
  }
  gzclose(f);
  if (bytes.size() < 4) return Error::invalid(fmt::format("{}: {} bytes, shorter than the IDX magic", path, bytes.size()));
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08)
    return Error::invalid(fmt::format("{}: magic {:02x}{:02x}{:02x}{:02x} is not IDX uint8 (00 00 08 rank)", path,
                                      bytes[0], bytes[1], bytes[2], bytes[3]));
  const int rank = bytes[3];
  if (rank != expected_rank)
    return Error::invalid(fmt::format("{}: rank {} but {} expected", path, rank, expected_rank));
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) return Error::invalid(fmt::format("{}: truncated header", path));
  IdxArray a;
  uint64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    const uint8_t* p = bytes.data() + 4 + 4 * i;
    const uint64_t d = (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) | p[3];
    if (d == 0 || d > (1u << 24)) return Error::invalid(fmt::format("{}: dim {} = {} out of [1, 2^24]", path, i, d));
    a.dims.push_back(static_cast<int64_t>(d));
    total *= d;
  }
  if (bytes.size() - header != total)
    return Error::invalid(fmt::format("{}: payload {} bytes, dims imply {}", path, bytes.size() - header, total));
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

namespace {

Result<std::pair<IdxArray, IdxArray>> load_fmnist_file(const std::string& dir, const std::string& stem) {
  auto find = [&](const std::string& name) {
    const std::string gz = dir + "/" + name + ".gz";
    if (FILE* f = std::fopen(gz.c_str(), "rb")) { std::fclose(f); return gz; }
    return dir + "/" + name;
  };
  auto images = read_idx(find(stem + "-images-idx3-ubyte"), 3);
  if (!images) return images.error();
  auto labels = read_idx(find(stem + "-labels-idx1-ubyte"), 1);
  if (!labels) return labels.error();
  if (images->dims[1] != 28 || images->dims[2] != 28)
    return Error::invalid(fmt::format("{}/{}: images are {}x{}, Fashion-MNIST's are 28x28", dir, stem,
                                      images->dims[1], images->dims[2]));
  if (images->dims[0] != labels->dims[0])
    return Error::invalid(fmt::format("{}/{}: {} images but {} labels", dir, stem, images->dims[0], labels->dims[0]));
  for (size_t i = 0; i < labels->data.size(); ++i)
    if (labels->data[i] > 9)
      return Error::invalid(fmt::format("{}/{}: label {} of example {} is outside 0..9", dir, stem,
                                        int{labels->data[i]}, i));
  return std::make_pair(std::move(*images), std::move(*labels));
}

// Images [first, first + n) as a Dataset; patch > 0 reorders the pixels patch-major.
Dataset fmnist_split(const IdxArray& images, const IdxArray& labels, int64_t first, int64_t n, int64_t patch) {
  Dataset d;
  d.seq = 784;
  d.vocab = 256;
  d.classes = 10;
  d.patch_pixels = patch > 0 ? patch * patch : 0;
  d.tokens.resize(static_cast<size_t>(n * 784));
  d.labels.resize(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    const uint8_t* img = images.data.data() + (first + e) * 784;
    uint8_t* out = d.tokens.data() + e * 784;
    if (patch == 0) {
      std::copy(img, img + 784, out);
    } else {
      const int64_t g = 28 / patch;
      int64_t o = 0;
      for (int64_t pr = 0; pr < g; ++pr)
        for (int64_t pc = 0; pc < g; ++pc)
          for (int64_t r = 0; r < patch; ++r)
            for (int64_t c = 0; c < patch; ++c) out[o++] = img[(pr * patch + r) * 28 + pc * patch + c];
    }
    d.labels[static_cast<size_t>(e)] = labels.data[static_cast<size_t>(first + e)];
  }
  return d;
}

Result<TaskData> make_fmnist(const TaskOptions& o, bool vit) {
  if (vit && o.patch != 4 && o.patch != 7)
    return Error::invalid(fmt::format("patch = {}: must be 4 or 7 (28 = 7 x 4 = 4 x 7)", o.patch));
  auto train = load_fmnist_file(o.fmnist_dir, "train");
  if (!train) return train.error();
  auto test = load_fmnist_file(o.fmnist_dir, "t10k");
  if (!test) return test.error();
  const int64_t n_train_file = train->first.dims[0];
  if (n_train_file != 60000 || test->first.dims[0] != 10000)
    return Error::invalid(fmt::format("{}: {} train and {} test images; Fashion-MNIST has 60000 and 10000",
                                      o.fmnist_dir, n_train_file, test->first.dims[0]));
  const int64_t tr = o.train_size ? o.train_size : 55000, va = o.val_size ? o.val_size : 5000,
                te = o.test_size ? o.test_size : 10000;
  if (tr > 55000) return Error::invalid(fmt::format("train_size = {}: must be in [1, 55000]", tr));
  if (va > 5000) return Error::invalid(fmt::format("val_size = {}: must be in [1, 5000]", va));
  if (te > 10000) return Error::invalid(fmt::format("test_size = {}: must be in [1, 10000]", te));
  const int64_t patch = vit ? o.patch : 0;
  TaskData t;
  t.train = fmnist_split(train->first, train->second, 0, tr, patch);
  t.val = fmnist_split(train->first, train->second, 55000, va, patch);
  t.test = fmnist_split(test->first, test->second, 0, te, patch);
  t.description = {{"source", "Debian dataset-fashion-mnist, " + o.fmnist_dir},
                   {"splits", "train: train file [0, 55000), val: train file [55000, 60000), test: t10k; each its first N"},
                   {"train", tr}, {"val", va}, {"test", te},
                   {"input", vit ? fmt::format("{} patches of {}x{} pixels (/255) + CLS", (28 / patch) * (28 / patch),
                                               patch, patch)
                                 : std::string("784 pixel tokens (vocab 256, row-major) + CLS")}};
  return t;
}

// ---------------------------------------------------------------- ListOps

enum : uint8_t { kMin = 10, kMax = 11, kMed = 12, kSumMod = 13, kClose = 14, kPad = 15 };

struct ListopsGen {
  Rng& rng;
  int64_t max_depth, max_args;
  // LRA's generate_tree: a value with probability 0.75 (VALUE_P = 0.25 picks an
  // operator), always a value at max_depth; an operator takes 2..max_args arguments.
  void tree(int64_t depth, std::vector<uint8_t>& out, size_t limit) {
    if (out.size() > limit) return;  // the caller rejects it anyway
    const double r = depth < max_depth ? rng.uniform() : 1.0;
    if (r > 0.25) {
      out.push_back(static_cast<uint8_t>(rng.below(10)));
      return;
    }
    out.push_back(static_cast<uint8_t>(kMin + rng.below(4)));
    const int64_t args = 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_args - 1)));
    for (int64_t a = 0; a < args; ++a) tree(depth + 1, out, limit);
    out.push_back(kClose);
  }
};

}  // namespace

const std::vector<std::string>& listops_token_names() {
  static const std::vector<std::string> names{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
                                              "[MIN", "[MAX", "[MED", "[SM", "]", "<pad>"};
  return names;
}

Result<int> evaluate_listops(const std::vector<uint8_t>& tokens) {
  std::vector<std::pair<uint8_t, std::vector<int>>> stack;
  std::optional<int> result;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint8_t t = tokens[i];
    if (t == kPad) break;
    if (result) return Error::invalid(fmt::format("listops: token {} after the complete expression", i));
    if (t <= 9) {
      if (stack.empty()) result = t;
      else stack.back().second.push_back(t);
    } else if (t >= kMin && t <= kSumMod) {
      stack.push_back({t, {}});
    } else if (t == kClose) {
      if (stack.empty()) return Error::invalid(fmt::format("listops: ']' at {} closes nothing", i));
      auto [op, args] = std::move(stack.back());
      stack.pop_back();
      if (args.empty()) return Error::invalid(fmt::format("listops: operator without arguments closed at {}", i));
      int v = 0;
      if (op == kMin) v = *std::min_element(args.begin(), args.end());
      else if (op == kMax) v = *std::max_element(args.begin(), args.end());
      else if (op == kSumMod) { for (int a : args) v += a; v %= 10; }
      else {  // LRA: int(np.median(args)), the mean of the middle two for an even count, truncated
        std::sort(args.begin(), args.end());
        const size_t n = args.size();
        v = n % 2 ? args[n / 2] : (args[n / 2 - 1] + args[n / 2]) / 2;
      }
      if (stack.empty()) result = v;
      else stack.back().second.push_back(v);
    } else {
      return Error::invalid(fmt::format("listops: token {} = {} is not in the vocabulary", i, int{t}));
    }
  }
  if (!result) return Error::invalid("listops: incomplete expression");
  return *result;
}

namespace {

Result<TaskData> make_listops(const TaskOptions& o) {
  if (o.listops_max_depth < 1 || o.listops_max_depth > 20)
    return Error::invalid(fmt::format("listops_max_depth = {}: must be in [1, 20]", o.listops_max_depth));
  if (o.listops_max_args < 2 || o.listops_max_args > 10)
    return Error::invalid(fmt::format("listops_max_args = {}: must be in [2, 10]", o.listops_max_args));
  if (o.listops_min_length < 1 || o.listops_min_length > o.listops_max_length || o.listops_max_length > 4096)
    return Error::invalid(fmt::format("listops lengths [{}, {}]: need 1 <= min <= max <= 4096", o.listops_min_length,
                                      o.listops_max_length));
  auto split = [&](int64_t n, uint64_t stream) -> Result<Dataset> {
    Rng rng(o.data_seed * 1000003ULL + stream);
    ListopsGen gen{rng, o.listops_max_depth, o.listops_max_args};
    Dataset d;
    d.seq = o.listops_max_length;
    d.vocab = 16;
    d.classes = 10;
    d.pad_token = kPad;
    int64_t tries = 0;
    for (int64_t e = 0; e < n;) {
      if (++tries > n * 100000)
        return Error::invalid(fmt::format("listops: cannot generate lengths in [{}, {}] at depth {}, {} args",
                                          o.listops_min_length, o.listops_max_length, o.listops_max_depth,
                                          o.listops_max_args));
      std::vector<uint8_t> t;
      gen.tree(1, t, static_cast<size_t>(o.listops_max_length));
      const auto len = static_cast<int64_t>(t.size());
      if (len < o.listops_min_length || len > o.listops_max_length) continue;
      auto v = evaluate_listops(t);
      if (!v) return v.error();
      t.resize(static_cast<size_t>(d.seq), kPad);
      d.tokens.insert(d.tokens.end(), t.begin(), t.end());
      d.labels.push_back(static_cast<int16_t>(*v));
      ++e;
    }
    return d;
  };
  TaskData t;
  auto tr = split(o.train_size ? o.train_size : 20000, 1);
  if (!tr) return tr.error();
  auto va = split(o.val_size ? o.val_size : 2000, 2);
  if (!va) return va.error();
  auto te = split(o.test_size ? o.test_size : 2000, 3);
  if (!te) return te.error();
  t.train = std::move(*tr);
  t.val = std::move(*va);
  t.test = std::move(*te);
  t.description = {{"source", "LRA ListOps grammar (MIN, MAX, MED, SUM_MOD; values 0-9; VALUE_P 0.25), generated"},
                   {"max_depth", o.listops_max_depth}, {"max_args", o.listops_max_args},
                   {"length", {o.listops_min_length, o.listops_max_length}},
                   {"lra_bounds", "depth 10, 10 args, length 500..2000"},
                   {"train", t.train.size()}, {"val", t.val.size()}, {"test", t.test.size()}};
  return t;
}

// ---------------------------------------------------------------- synthetic (SLAY's suite, our generators)

struct SynthSpec {
  int64_t vocab, classes;
  bool per_token;
  std::string what;
  // Fills tokens [seq] and labels ([1] or [seq]).
  std::function<void(Rng&, int64_t, std::vector<uint8_t>&, std::vector<int16_t>&)> gen;
};

SynthSpec synth_spec(const std::string& name, int64_t L) {
  if (name == "kv_recall") {
    // pairs k v (keys distinct, from 0..15; values 16..31), then the marker 32 and a query key; label: its value.
    return {33, 16, false, "associative recall: (L-2)/2 key-value pairs, marker, query key -> its value (16 classes)",
            [](Rng& r, int64_t n, std::vector<uint8_t>& t, std::vector<int16_t>& y) {
              const int64_t pairs = std::min<int64_t>((n - 2) / 2, 16);
              std::vector<uint8_t> keys(16);
              for (int i = 0; i < 16; ++i) keys[i] = static_cast<uint8_t>(i);
              for (int i = 15; i > 0; --i) std::swap(keys[i], keys[r.below(i + 1)]);
              t.assign(static_cast<size_t>(n), 32);
              std::vector<uint8_t> vals(static_cast<size_t>(pairs));
              for (int64_t p = 0; p < pairs; ++p) {
                vals[p] = static_cast<uint8_t>(r.below(16));
                t[2 * p] = keys[p];
                t[2 * p + 1] = static_cast<uint8_t>(16 + vals[p]);
              }
              const int64_t q = static_cast<int64_t>(r.below(static_cast<uint64_t>(pairs)));
              t[n - 1] = keys[q];
              y = {static_cast<int16_t>(vals[q])};
            }};
  }
  if (name == "first_token")
    return {16, 16, false, "first token: L tokens of 16 -> the first (16 classes)",
            [](Rng& r, int64_t n, std::vector<uint8_t>& t, std::vector<int16_t>& y) {
              t.resize(n);
              for (auto& x : t) x = static_cast<uint8_t>(r.below(16));
              y = {t[0]};
            }};
  if (name == "counting")
    return {4, L + 1, false, "counting: L tokens of 4 -> how many are token 0 (L + 1 classes)",
            [](Rng& r, int64_t n, std::vector<uint8_t>& t, std::vector<int16_t>& y) {
              t.resize(n);
              int c = 0;
              for (auto& x : t) { x = static_cast<uint8_t>(r.below(4)); c += x == 0; }
              y = {static_cast<int16_t>(c)};
            }};
  if (name == "majority")
    return {8, 8, false, "majority: L tokens of 8 -> the most frequent (a unique maximum; 8 classes)",
            [](Rng& r, int64_t n, std::vector<uint8_t>& t, std::vector<int16_t>& y) {
              for (;;) {
                t.resize(n);
                std::array<int, 8> c{};
                for (auto& x : t) { x = static_cast<uint8_t>(r.below(8)); ++c[x]; }
                const int m = *std::max_element(c.begin(), c.end());
                if (std::count(c.begin(), c.end(), m) == 1) {
                  y = {static_cast<int16_t>(std::max_element(c.begin(), c.end()) - c.begin())};
                  return;
                }
              }
            }};
  if (name == "histogram")
    return {8, 16, true, "histogram: L tokens of 8 -> at each position, how often its token occurs (capped at 15)",
            [](Rng& r, int64_t n, std::vector<uint8_t>& t, std::vector<int16_t>& y) {
              t.resize(n);
              std::array<int, 8> c{};
              for (auto& x : t) { x = static_cast<uint8_t>(r.below(8)); ++c[x]; }
              y.resize(n);
              for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int16_t>(std::min(c[t[i]], 15));
            }};
  if (name == "sort")
    return {16, 16, true, "sort: L tokens of 16 -> at position i the i-th smallest",
            [](Rng& r, int64_t n, std::vector<uint8_t>& t, std::vector<int16_t>& y) {
              t.resize(n);
              for (auto& x : t) x = static_cast<uint8_t>(r.below(16));
              std::vector<uint8_t> s = t;
              std::sort(s.begin(), s.end());
              y.assign(s.begin(), s.end());
            }};
  if (name == "reverse")
    return {16, 16, true, "reverse: L tokens of 16 -> at position i the token at L-1-i",
            [](Rng& r, int64_t n, std::vector<uint8_t>& t, std::vector<int16_t>& y) {
              t.resize(n);
              for (auto& x : t) x = static_cast<uint8_t>(r.below(16));
              y.assign(t.rbegin(), t.rend());
            }};
  return {};
}

Result<TaskData> make_synthetic(const TaskOptions& o) {
  const int64_t L = o.seq_len ? o.seq_len : 32;
  if (L < 4 || L > 4096) return Error::invalid(fmt::format("seq_len = {}: must be in [4, 4096]", L));
  const SynthSpec s = synth_spec(o.name, L);
  auto split = [&](int64_t n, uint64_t stream) {
    Rng rng(o.data_seed * 1000003ULL + stream);
    Dataset d;
    d.seq = L;
    d.vocab = s.vocab;
    d.classes = s.classes;
    d.per_token = s.per_token;
    std::vector<uint8_t> t;
    std::vector<int16_t> y;
    for (int64_t e = 0; e < n; ++e) {
      s.gen(rng, L, t, y);
      d.tokens.insert(d.tokens.end(), t.begin(), t.end());
      d.labels.insert(d.labels.end(), y.begin(), y.end());
    }
    return d;
  };
  TaskData t;
  t.train = split(o.train_size ? o.train_size : 8000, 1);
  t.val = split(o.val_size ? o.val_size : 1000, 2);
  t.test = split(o.test_size ? o.test_size : 1000, 3);
  t.description = {{"source", "generated (SLAY Table 7 task name; our generator)"}, {"task", s.what},
                   {"seq_len", L}, {"train", t.train.size()}, {"val", t.val.size()}, {"test", t.test.size()}};
  return t;
}

}  // namespace

Result<TaskData> make_task(const TaskOptions& o) {
  for (auto [n, name] : {std::pair{o.train_size, "train_size"}, {o.val_size, "val_size"}, {o.test_size, "test_size"}})
    if (n < 0 || n > 10000000) return Error::invalid(fmt::format("{} = {}: must be in [1, 10000000] (0: default)", name, n));
  if (o.name == "fmnist-seq") return make_fmnist(o, false);
  if (o.name == "fmnist-vit") return make_fmnist(o, true);
  if (o.name == "listops") return make_listops(o);
  const auto& syn = synthetic_task_names();
  if (std::find(syn.begin(), syn.end(), o.name) != syn.end()) return make_synthetic(o);
  std::string all;
  for (const auto& n : task_names()) all += (all.empty() ? "" : ", ") + n;
  return Error::invalid(fmt::format("task = \"{}\": not a task; one of {}", o.name, all));
}

}  // namespace lunajit::experiment
