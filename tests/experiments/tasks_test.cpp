// The data of lunajit-experiment: the IDX loader's checks, the ListOps grammar
// and evaluator, the synthetic tasks' labels and the fixed, seeded splits.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "experiments/tasks.h"

namespace fs = std::filesystem;
using namespace lunajit::experiment;

namespace {

fs::path temp_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const fs::path p = fs::temp_directory_path() / ("lunajit_exp_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return p;
}

std::vector<uint8_t> idx_header(uint8_t rank, const std::vector<uint32_t>& dims) {
  std::vector<uint8_t> b{0, 0, 8, rank};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  return b;
}

TEST(Idx, ReadsAPlainAndAGzippedFile) {
  auto b = idx_header(3, {2, 2, 3});
  for (int i = 0; i < 12; ++i) b.push_back(static_cast<uint8_t>(i));
  const fs::path plain = temp_file("ok.idx", b);
  auto a = read_idx(plain.string(), 3);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->dims, (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(a->data[11], 11);
  const fs::path gz = plain.string() + ".gz";
  gzFile f = gzopen(gz.c_str(), "wb");
  gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
  auto g = read_idx(gz.string(), 3);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->data, a->data);
  fs::remove(plain);
  fs::remove(gz);
}

TEST(Idx, RejectsBadMagicRankAndPayload) {
  auto check = [](const std::string& name, const std::vector<uint8_t>& bytes, int rank, const std::string& want) {
    const fs::path p = temp_file(name, bytes);
    auto a = read_idx(p.string(), rank);
    ASSERT_FALSE(a.ok()) << name;
    EXPECT_NE(a.error().message.find(want), std::string::npos) << a.error().message;
    EXPECT_NE(a.error().message.find(p.string()), std::string::npos) << "names the file: " << a.error().message;
    fs::remove(p);
  };
  check("magic", {0, 0, 9, 1, 0, 0, 0, 1, 5}, 1, "magic");
  check("rank", idx_header(1, {1}), 3, "rank 1");
  auto truncated = idx_header(1, {4});
  truncated.push_back(1);
  check("payload", truncated, 1, "payload 1 bytes, dims imply 4");
  check("zero", idx_header(1, {0}), 1, "out of [1, 2^24]");
  auto missing = read_idx("/nonexistent/lunajit.idx", 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind, lunajit::ErrorKind::unavailable);
}

// Debian's dataset-fashion-mnist (scripts/install_deps.sh installs it).
TEST(Fmnist, LoadsTheDebianFilesWithFixedSplits) {
  TaskOptions o;
  o.name = "fmnist-vit";
  o.train_size = 100;
  o.val_size = 10;
  o.test_size = 20;
  o.patch = 7;
  auto t = make_task(o);
  ASSERT_TRUE(t.ok()) << t.error().message << " (apt-get install dataset-fashion-mnist)";
  EXPECT_EQ(t->train.size(), 100);
  EXPECT_EQ(t->val.size(), 10);
  EXPECT_EQ(t->test.size(), 20);
  EXPECT_EQ(t->train.patch_pixels, 49);
  for (auto l : t->train.labels) EXPECT_TRUE(l >= 0 && l <= 9);
  // Patch-major order is a permutation of the row-major pixels of fmnist-seq.
  o.name = "fmnist-seq";
  auto s = make_task(o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->train.labels, t->train.labels);
  std::vector<uint8_t> a(s->train.tokens.begin(), s->train.tokens.begin() + 784),
      b(t->train.tokens.begin(), t->train.tokens.begin() + 784);
  EXPECT_NE(a, b);
  // Pixel (r, c) = (9, 15): patch (1, 2) of 7x7, offset (2, 1) in it.
  EXPECT_EQ(a[9 * 28 + 15], b[(1 * 4 + 2) * 49 + 2 * 7 + 1]);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  o.patch = 5;
  o.name = "fmnist-vit";
  auto bad = make_task(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("patch = 5"), std::string::npos);
  o.patch = 7;
  o.train_size = 55001;
  bad = make_task(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("train_size = 55001"), std::string::npos);
}

std::vector<uint8_t> tok(std::initializer_list<int> v) {
  std::vector<uint8_t> t;
  for (int x : v) t.push_back(static_cast<uint8_t>(x));
  return t;
}

TEST(Listops, EvaluatesTheGrammar) {
  // [MAX 2 9 [MIN 4 7 ] 0 ] = 9
  EXPECT_EQ(*evaluate_listops(tok({11, 2, 9, 10, 4, 7, 14, 0, 14})), 9);
  // [MED 1 2 3 4 ] = int(2.5) = 2 (LRA's int(np.median))
  EXPECT_EQ(*evaluate_listops(tok({12, 1, 2, 3, 4, 14})), 2);
  // [SM 5 7 [MAX 8 1 ] ] = 20 % 10 = 0
  EXPECT_EQ(*evaluate_listops(tok({13, 5, 7, 11, 8, 1, 14, 14})), 0);
  EXPECT_EQ(*evaluate_listops(tok({3, 15, 15})), 3);
  EXPECT_FALSE(evaluate_listops(tok({11, 2, 9})).ok());
  EXPECT_FALSE(evaluate_listops(tok({14})).ok());
  EXPECT_FALSE(evaluate_listops(tok({11, 14})).ok());
  EXPECT_FALSE(evaluate_listops(tok({2, 3})).ok());
}

TEST(Listops, GeneratedExamplesStayInBoundsAndAreLabelledByTheirValue) {
  TaskOptions o;
  o.name = "listops";
  o.train_size = 200;
  o.val_size = 20;
  o.test_size = 20;
  o.listops_max_depth = 4;
  o.listops_max_args = 4;
  o.listops_min_length = 10;
  o.listops_max_length = 40;
  auto t = make_task(o);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const Dataset& d = t->train;
  std::array<int, 10> seen{};
  for (int64_t e = 0; e < d.size(); ++e) {
    std::vector<uint8_t> x(d.tokens.begin() + e * d.seq, d.tokens.begin() + (e + 1) * d.seq);
    const auto len = std::find(x.begin(), x.end(), 15) - x.begin();
    EXPECT_GE(len, 10);
    EXPECT_LE(len, 40);
    int depth = 0, max_depth = 0, args = 0;
    for (auto v : x) {
      if (v >= 10 && v <= 13) max_depth = std::max(max_depth, ++depth);
      if (v == 14) --depth;
    }
    (void)args;
    EXPECT_LT(max_depth, 4) << "operators nest below max_depth (values sit at the deepest level)";
    EXPECT_EQ(*evaluate_listops(x), d.labels[e]);
    ++seen[d.labels[e]];
  }
  EXPECT_GE(std::count_if(seen.begin(), seen.end(), [](int n) { return n > 0; }), 5) << "labels vary";
}

const Dataset& train_of(const TaskData& t) { return t.train; }

TEST(Synthetic, LabelsFollowTheirDefinitions) {
  for (const auto& name : synthetic_task_names()) {
    TaskOptions o;
    o.name = name;
    o.train_size = 50;
    o.val_size = 5;
    o.test_size = 5;
    o.seq_len = 12;
    auto t = make_task(o);
    ASSERT_TRUE(t.ok()) << name << ": " << t.error().message;
    const Dataset& d = train_of(*t);
    ASSERT_EQ(d.size(), 50) << name;
    for (int64_t e = 0; e < d.size(); ++e) {
      std::vector<int> x(d.tokens.begin() + e * 12, d.tokens.begin() + (e + 1) * 12);
      for (int v : x) ASSERT_LT(v, d.vocab) << name;
      auto y = [&](int64_t i) { return d.labels[d.per_token ? e * 12 + i : e]; };
      if (name == "first_token") {
        EXPECT_EQ(y(0), x[0]);
      }
      if (name == "counting") {
        EXPECT_EQ(y(0), std::count(x.begin(), x.end(), 0));
      }
      if (name == "reverse") {
        for (int i = 0; i < 12; ++i) EXPECT_EQ(y(i), x[11 - i]);
      }
      if (name == "sort") {
        auto s = x;
        std::sort(s.begin(), s.end());
        for (int i = 0; i < 12; ++i) EXPECT_EQ(y(i), s[i]);
      }
      if (name == "histogram") {
        for (int i = 0; i < 12; ++i) EXPECT_EQ(y(i), std::count(x.begin(), x.end(), x[i]));
      }
      if (name == "majority") {
        std::array<int, 8> c{};
        for (int v : x) ++c[v];
        for (int k = 0; k < 8; ++k) {
          if (k != y(0)) EXPECT_LT(c[k], c[y(0)]);
        }
      }
      if (name == "kv_recall") {
        const int q = x[11];
        int found = -1;
        for (int p = 0; p + 1 < 10; p += 2) {
          if (x[p] == q) found = x[p + 1] - 16;
        }
        EXPECT_EQ(y(0), found);
      }
    }
  }
}

TEST(Synthetic, SplitsAreFixedBySeedAndDisjointStreams) {
  TaskOptions o;
  o.name = "sort";
  o.train_size = 20;
  o.val_size = 20;
  o.test_size = 20;
  auto a = make_task(o), b = make_task(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->train.tokens, b->train.tokens);
  EXPECT_NE(a->train.tokens, a->val.tokens);
  EXPECT_NE(a->val.tokens, a->test.tokens);
  o.data_seed = 99;
  auto c = make_task(o);
  EXPECT_NE(c->train.tokens, a->train.tokens);
}

TEST(Tasks, UnknownTaskAndBadSizesAreErrorsNamingThem) {
  TaskOptions o;
  o.name = "sortt";
  auto t = make_task(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("task = \"sortt\""), std::string::npos);
  EXPECT_NE(t.error().message.find("listops"), std::string::npos) << "lists the tasks";
  o.name = "sort";
  o.seq_len = 2;
  t = make_task(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("seq_len = 2"), std::string::npos);
  o.seq_len = 0;
  o.train_size = -1;
  t = make_task(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("train_size = -1"), std::string::npos);
}

TEST(Rng, BelowStaysInRangeAndCoversIt) {
  Rng r(7);
  std::array<int, 5> c{};
  for (int i = 0; i < 5000; ++i) ++c[r.below(5)];
  for (int n : c) EXPECT_NEAR(n, 1000, 150);  // binomial sd ~28; 150 is > 5 sd
  for (int i = 0; i < 1000; ++i) { const double u = r.uniform(); EXPECT_TRUE(u >= 0 && u < 1); }
}

}  // namespace
