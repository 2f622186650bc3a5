// TuningDb: keys and buckets, deterministic lookup, concurrent writers from
// four processes, damaged and read-only files, export/import/merge.
#include "cache/tuning_db.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <string>
#include <vector>

namespace lunajit {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

DeviceFingerprint device(std::string name = "NVIDIA H200", std::string driver = "12.4") {
  return {std::move(name), 90, 132, 150ull << 30, std::move(driver), "13.0 build abc", "0.1.0"};
}

TuningEntry entry(int seq, int bh, std::string config_name, std::string method = "measured",
                  std::string spec_hash = "spec1", std::string pass = "forward") {
  TuningEntry e;
  e.key = {std::move(spec_hash), std::move(pass), shape_bucket(1, bh, seq, "bf16")};
  e.config = {{"block_tokens", 64}, {"name", config_name}};
  e.config_name = std::move(config_name);
  e.method = std::move(method);
  e.timings.push_back({e.config, e.config_name, 0.5, "ok"});
  e.timings.push_back({{{"block_tokens", 16}}, "T16", 0.9, "ok"});
  return e;
}

class TuningDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lunajit-tuning-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    ::chmod(root_.c_str(), 0755);
    ::chmod((root_ / "tuning").c_str(), 0755);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  fs::path root_;
};

TEST(ShapeBucketTest, RoundsUpToPowersOfTwo) {
  EXPECT_EQ(shape_bucket(2, 4, 1000, "bf16"), (ShapeBucket{1024, 8, "bf16"}));
  EXPECT_EQ(shape_bucket(3, 5, 1024, "fp16"), (ShapeBucket{1024, 16, "fp16"}));
  EXPECT_EQ(shape_bucket(1, 1, 1, "fp32"), (ShapeBucket{1, 1, "fp32"}));
  EXPECT_EQ(round_up_pow2(1025), 2048);
}

TEST(DeviceFingerprintTest, IdChangesWithEveryField) {
  const DeviceFingerprint base = device();
  EXPECT_EQ(base.id().rfind("nvidia-h200-sm90-", 0), 0u) << base.id();
  std::vector<DeviceFingerprint> variants(7, base);
  variants[0].name = "NVIDIA H100";
  variants[1].sm = 89;
  variants[2].sm_count = 114;
  variants[3].memory_bytes = 80ull << 30;
  variants[4].driver = "12.5";
  variants[5].nvrtc = "13.0 build def";
  variants[6].lunajit = "0.2.0";
  for (const auto& v : variants) EXPECT_NE(v.id(), base.id()) << v.to_json().dump();
  EXPECT_EQ(DeviceFingerprint::from_json(base.to_json()).value(), base);
}

TEST_F(TuningDir, StoreReloadAndLookup) {
  {
    TuningDb db(root_, device());
    ASSERT_TRUE(db.store(entry(1024, 8, "A")).ok());
    ASSERT_TRUE(db.store(entry(4096, 64, "B")).ok());
    EXPECT_TRUE(fs::exists(db.file()));
  }
  TuningDb db(root_, device());
  ASSERT_EQ(db.entries().size(), 2u);
  const TuningKey exact{"spec1", "forward", {1024, 8, "bf16"}};
  auto hit = db.lookup(exact);
  EXPECT_EQ(hit.kind, LookupKind::exact);
  EXPECT_EQ(hit.entry->config_name, "A");
  EXPECT_EQ(hit.entry->timings.size(), 2u);
  // Nearest: seq 2048/bh 8 is 1 step from A, 1 + 3 from B.
  auto near = db.lookup({"spec1", "forward", {2048, 8, "bf16"}});
  EXPECT_EQ(near.kind, LookupKind::nearest);
  EXPECT_EQ(near.entry->config_name, "A");
  near = db.lookup({"spec1", "forward", {8192, 64, "bf16"}});
  EXPECT_EQ(near.entry->config_name, "B");
  // Other spec, pass or dtype: nothing (the caller takes the default config).
  EXPECT_EQ(db.lookup({"spec2", "forward", {1024, 8, "bf16"}}).kind, LookupKind::none);
  EXPECT_EQ(db.lookup({"spec1", "backward", {1024, 8, "bf16"}}).kind, LookupKind::none);
  EXPECT_EQ(db.lookup({"spec1", "forward", {1024, 8, "fp16"}}).kind, LookupKind::none);
  // A different device is a different file.
  TuningDb other(root_, device("NVIDIA H200", "12.5"));
  EXPECT_TRUE(other.entries().empty());
  EXPECT_NE(other.file(), db.file());
}

TEST_F(TuningDir, NearestTiesAreDeterministic) {
  TuningDb db(root_, device());
  // Both one log2 step from seq 2048: the smaller seq wins, in any store order.
  ASSERT_TRUE(db.store(entry(4096, 8, "big")).ok());
  ASSERT_TRUE(db.store(entry(1024, 8, "small")).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(db.lookup({"spec1", "forward", {2048, 8, "bf16"}}).entry->config_name, "small");
  TuningDb db2(root_, device());
  EXPECT_EQ(db2.lookup({"spec1", "forward", {2048, 8, "bf16"}}).entry->config_name, "small");
}

TEST_F(TuningDir, RetuneReplacesTheEntryWhateverTheCandidates) {
  TuningDb db(root_, device());
  ASSERT_TRUE(db.store(entry(1024, 8, "A")).ok());
  TuningEntry again = entry(1024, 8, "C");
  again.timings.push_back({{{"block_tokens", 128}}, "T128", 0.1, "ok"});  // a longer candidate list
  ASSERT_TRUE(db.store(again).ok());
  ASSERT_EQ(db.entries().size(), 1u);
  EXPECT_EQ(db.entries()[0].config_name, "C");
}

TEST_F(TuningDir, FourProcessesLeaveOneConsistentFile) {
  const int kProcs = 4, kPerProc = 20;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      TuningDb db(root_, device());
      bool ok = true;
      for (int i = 0; i < kPerProc; ++i) {
        // Every process stores its own keys and one shared key.
        ok &= db.store(entry(1 << (i % 12), 1 << p, "p" + std::to_string(p) + "i" + std::to_string(i), "measured",
                             "spec" + std::to_string(i / 12)))
                  .ok();
        ok &= db.store(entry(64, 1, "shared", "measured", "shared-spec")).ok();
      }
      ::_exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  TuningDb db(root_, device());
  EXPECT_EQ(db.entries().size(), size_t(kProcs * kPerProc + 1));
  // The file parses and no temp file or set-aside file is left.
  for (const auto& e : fs::directory_iterator(root_ / "tuning")) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == ".lock" || e.path() == db.file()) << name;
  }
}

TEST_F(TuningDir, DamagedFileIsSetAsideWithAWarning) {
  {
    TuningDb db(root_, device());
    ASSERT_TRUE(db.store(entry(1024, 8, "A")).ok());
  }
  TuningDb probe(root_, device());
  const fs::path file = probe.file();
  const auto size = fs::file_size(file);
  fs::resize_file(file, size / 2);  // a torn write, as a crash without rename would leave
  ::testing::internal::CaptureStderr();
  TuningDb db(root_, device());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("is damaged"), std::string::npos) << err;
  EXPECT_TRUE(db.entries().empty());
  ASSERT_TRUE(db.store(entry(1024, 8, "B")).ok());
  TuningDb again(root_, device());
  EXPECT_EQ(again.lookup({"spec1", "forward", {1024, 8, "bf16"}}).entry->config_name, "B");
}

// Root ignores mode bits, so there "tuning" is made a regular file instead,
// which no user can create files in.
TEST_F(TuningDir, ReadOnlyDirectoryKeepsResultsInMemory) {
  if (::geteuid() == 0) {
    std::ofstream(root_ / "tuning") << "x";
  } else {
    fs::create_directories(root_ / "tuning");
    ASSERT_EQ(::chmod((root_ / "tuning").c_str(), 0555), 0);
  }
  TuningDb db(root_, device());
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(db.store(entry(1024, 8, "A")).ok());
  EXPECT_TRUE(db.store(entry(2048, 8, "B")).ok());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("kept in memory"), std::string::npos) << err;
  EXPECT_EQ(err.find("kept in memory"), err.rfind("kept in memory")) << "one warning, not one per store";
  EXPECT_FALSE(db.persistent());
  EXPECT_EQ(db.lookup({"spec1", "forward", {1024, 8, "bf16"}}).entry->config_name, "A");
}

TEST_F(TuningDir, ExportImportMerge) {
  const fs::path a = root_ / "a", b = root_ / "b";
  {
    TuningDb db(a, device());
    ASSERT_TRUE(db.store(entry(1024, 8, "A-measured")).ok());
    ASSERT_TRUE(db.store(entry(2048, 8, "A-model", "model-ranked")).ok());
    TuningDb other(a, device("NVIDIA A100", "12.4"));
    ASSERT_TRUE(other.store(entry(1024, 8, "A100")).ok());
  }
  {
    TuningDb db(b, device());
    ASSERT_TRUE(db.store(entry(1024, 8, "B-model", "model-ranked")).ok());  // loses to A's measured
    ASSERT_TRUE(db.store(entry(2048, 8, "B-measured")).ok());               // beats A's model-ranked
    ASSERT_TRUE(db.store(entry(4096, 8, "B-only")).ok());
  }
  const json doc = export_tuning(a);
  ASSERT_EQ(doc["databases"].size(), 2u);
  auto n = import_tuning(b, doc);
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(*n, 2);  // the measured 1024 entry and the A100 database
  TuningDb merged(b, device());
  EXPECT_EQ(merged.find({"spec1", "forward", {1024, 8, "bf16"}})->config_name, "A-measured");
  EXPECT_EQ(merged.find({"spec1", "forward", {2048, 8, "bf16"}})->config_name, "B-measured");
  EXPECT_EQ(merged.find({"spec1", "forward", {4096, 8, "bf16"}})->config_name, "B-only");
  EXPECT_EQ(TuningDb(b, device("NVIDIA A100", "12.4")).entries().size(), 1u);
  // Importing again changes nothing.
  EXPECT_EQ(import_tuning(b, doc).value(), 0);
  EXPECT_FALSE(import_tuning(b, json{{"x", 1}}).ok());
  EXPECT_EQ(clear_tuning(b).removed, 2);
  EXPECT_TRUE(list_tuning_files(b).empty());
}

// ---------------------------------------------------------------- issue 15

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::vector<fs::path> set_aside_files(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root / "tuning", ec))
    if (e.path().filename().string().find(".corrupt-") != std::string::npos) out.push_back(e.path());
  return out;
}

TEST(ShapeBucketTest, TuneShapesSeq2147483647BucketDoesNotOverflow) {
  const ShapeBucket b = shape_bucket(1, 1, INT_MAX, "bf16");
  EXPECT_EQ(b.seq, int64_t{1} << 31);
  EXPECT_EQ(shape_bucket(65535, 65535, 1, "bf16").batch_heads, int64_t{1} << 32);
  EXPECT_TRUE(valid_bucket(b.seq));
  EXPECT_TRUE(valid_bucket(kMaxShapeBucket));
  EXPECT_FALSE(valid_bucket(kMaxShapeBucket * 2));
  EXPECT_FALSE(valid_bucket(0));
  EXPECT_FALSE(valid_bucket(-2147483648LL));
  EXPECT_FALSE(valid_bucket(48));
  EXPECT_EQ(round_up_pow2(INT64_MAX), int64_t{1} << 62) << "no wrap to a negative";
}

TEST_F(TuningDir, TuneShapesSeq2147483647BucketIsStoredPositiveAndNeverWinsNearest) {
  {
    TuningDb db(root_, device());
    ASSERT_TRUE(db.store(entry(INT_MAX, 8, "huge")).ok());
    ASSERT_TRUE(db.store(entry(1024, 8, "normal")).ok());
  }
  TuningDb db(root_, device());
  const auto huge = db.find({"spec1", "forward", shape_bucket(1, 8, INT_MAX, "bf16")});
  ASSERT_TRUE(huge.has_value());
  EXPECT_EQ(huge->key.bucket.seq, int64_t{1} << 31);
  EXPECT_NE(slurp(db.file()).find("\"seq_bucket\": 2147483648"), std::string::npos);
  // A lookup near 1024 gets the 1024 entry, not the huge one.
  EXPECT_EQ(db.lookup({"spec1", "forward", shape_bucket(1, 8, 2000, "bf16")}).entry->config_name, "normal");
  // A file that holds the old overflowed bucket is damaged, not a winner.
  std::string text = slurp(db.file());
  const std::string stored = "\"seq_bucket\": 2147483648";
  const auto at = text.find(stored);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, stored.size(), "\"seq_bucket\": -2147483648");
  spit(db.file(), text);
  ::testing::internal::CaptureStderr();
  TuningDb again(root_, device());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("\"seq_bucket\" is -2147483648; must be a power of two"), std::string::npos) << err;
  EXPECT_EQ(again.lookup({"spec1", "forward", shape_bucket(1, 8, 2000, "bf16")}).kind, LookupKind::none);
}

TEST_F(TuningDir, SchemaStringOrNullOrSpecFamilyNumberIsReportedAndSetAside) {
  const std::string good = [&] {
    TuningDb db(root_ / "model", device());
    EXPECT_TRUE(db.store(entry(1024, 8, "A")).ok());
    return slurp(db.file());
  }();
  const json good_doc = json::parse(good);
  std::vector<std::pair<std::string, json>> bad;
  for (json schema : {json("1"), json(nullptr), json(2.5), json::array()}) {
    json d = good_doc;
    d["schema"] = schema;
    bad.emplace_back("schema " + schema.dump(), d);
  }
  {
    json d = good_doc;
    d["entries"][0]["spec"] = {{"family", 7}};
    bad.emplace_back("spec.family 7", d);
  }
  {
    json d = good_doc;
    d["entries"][0]["timings"] = 5;
    bad.emplace_back("timings 5", d);
  }
  for (const auto& [what, doc] : bad) {
    fs::remove_all(root_ / "tuning");
    TuningDb probe(root_, device());
    spit(probe.file(), doc.dump());
    ::testing::internal::CaptureStderr();
    TuningDb db(root_, device());  // what tune, report and run open
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("tuning database " + db.file().string() + " is damaged"), std::string::npos) << what << err;
    EXPECT_TRUE(db.entries().empty()) << what;
    ASSERT_EQ(set_aside_files(root_).size(), 1u) << what;
    EXPECT_FALSE(fs::exists(db.file())) << what;
    EXPECT_TRUE(db.store(entry(1024, 8, "B")).ok()) << what;  // and the database works again
    // cache ls / stats / export: reported and set aside, the others listed.
    spit(db.file().parent_path() / "other.json", doc.dump());
    ::testing::internal::CaptureStderr();
    const auto files = list_tuning_files(root_);
    err = ::testing::internal::GetCapturedStderr();
    ASSERT_EQ(files.size(), 2u) << what;
    size_t damaged = 0;
    for (const auto& f : files) {
      if (f.problem.empty()) continue;
      ++damaged;
      EXPECT_EQ(f.file.filename(), "other.json");
      EXPECT_NE(f.moved_to.string().find("other.json.corrupt-"), std::string::npos) << f.moved_to;
    }
    EXPECT_EQ(damaged, 1u) << what;
    std::vector<TuningFile> left_out;
    const json exported = export_tuning(root_, &left_out);
    EXPECT_EQ(exported["databases"].size(), 1u) << what;
  }
}

TEST_F(TuningDir, CorruptFileIsRenamedWithTheTime) {
  TuningDb probe(root_, device());
  spit(probe.file(), "{");
  ::testing::internal::CaptureStderr();
  TuningDb db(root_, device());
  (void)::testing::internal::GetCapturedStderr();
  const auto aside = set_aside_files(root_);
  ASSERT_EQ(aside.size(), 1u);
  // <file>.corrupt-YYYYMMDDTHHMMSSZ-<pid>
  const std::string name = aside[0].filename().string();
  const auto at = name.find(".corrupt-");
  ASSERT_NE(at, std::string::npos);
  const std::string stamp = name.substr(at + 9);
  ASSERT_GE(stamp.size(), 17u) << name;
  EXPECT_EQ(stamp[8], 'T') << name;
  EXPECT_EQ(stamp[15], 'Z') << name;
  EXPECT_EQ(slurp(aside[0]), "{");
}

TEST_F(TuningDir, TuningDirectoryThatIsALinkOrAnotherUsersIsNotUsed) {
  const fs::path real = root_ / "elsewhere";
  {
    TuningDb db(real, device());
    ASSERT_TRUE(db.store(entry(1024, 8, "planted")).ok());
  }
  fs::create_directories(root_ / "c");
  fs::create_directory_symlink(real / "tuning", root_ / "c" / "tuning");
  ::testing::internal::CaptureStderr();
  TuningDb linked(root_ / "c", device());
  EXPECT_TRUE(linked.entries().empty()) << "read through a link";
  EXPECT_TRUE(linked.store(entry(2048, 8, "mine")).ok());
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("is a symbolic link"), std::string::npos) << err;
  EXPECT_FALSE(linked.persistent());
  EXPECT_EQ(TuningDb(real, device()).entries().size(), 1u) << "written through a link";
  const auto files = list_tuning_files(root_ / "c");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].problem.find("symbolic link"), std::string::npos);
  EXPECT_FALSE(import_tuning(root_ / "c", export_tuning(real)).ok());
  // Writable by others: the same.
  ASSERT_EQ(::chmod((real / "tuning").c_str(), 0777), 0);
  ::testing::internal::CaptureStderr();
  TuningDb open_dir(real, device());
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(open_dir.entries().empty());
  EXPECT_NE(err.find("writable by others"), std::string::npos) << err;
  ::chmod((real / "tuning").c_str(), 0700);
}

TEST_F(TuningDir, ImportOfMalformedExportsIsRejectedNamingWhatIsWrong) {
  const std::vector<std::pair<json, std::string>> cases = {
      {json::parse(R"({"lunajit_tuning_export":"1"})"), "\"lunajit_tuning_export\" is \"1\""},
      {json::parse(R"({"lunajit_tuning_export":1,"databases":5})"), "\"databases\" is 5, not an array"},
      {json::parse(R"([5])"), "is array, not an object"},
      {json::parse(R"({"lunajit_tuning_export":1,"databases":[5]})"), "databases[0] is 5"},
      {json::parse(R"({"lunajit_tuning_export":1,"databases":[{"device":5}]})"), "no \"device\" object"},
      {json::parse(R"({"lunajit_tuning_export":1,"databases":[{"device":{},"entries":[]}]})"), "device fingerprint"},
  };
  for (const auto& [doc, expected] : cases) {
    auto r = import_tuning(root_, doc);
    ASSERT_FALSE(r.ok()) << doc.dump();
    EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument) << doc.dump();
    EXPECT_NE(r.error().message.find(expected), std::string::npos) << r.error().message;
  }
}

TEST_F(TuningDir, ImportOfGoodThenBadDatabaseIsAllOrNothing) {
  const fs::path a = root_ / "a";
  {
    TuningDb db(a, device());
    ASSERT_TRUE(db.store(entry(1024, 8, "A")).ok());
  }
  json doc = export_tuning(a);
  json bad_db = doc["databases"][0];
  bad_db["device"]["name"] = "NVIDIA A100";
  bad_db["entries"][0]["seq_bucket"] = -1;
  doc["databases"].push_back(bad_db);
  auto r = import_tuning(root_ / "b", doc);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("databases[1].entries[0]"), std::string::npos) << r.error().message;
  EXPECT_TRUE(list_tuning_files(root_ / "b").empty()) << "the good first database was imported";
  EXPECT_TRUE(TuningDb(root_ / "b", device()).entries().empty());
}

TEST_F(TuningDir, ImportedEntriesKeepProvenanceAndLoseToALocalMeasurement) {
  {
    TuningDb db(root_, device());
    TuningEntry local = entry(1024, 8, "local-measured");
    local.tuned_at = "2026-01-01T00:00:00Z";
    ASSERT_TRUE(db.store(local).ok());
  }
  TuningEntry forged = entry(1024, 8, "forged", "measured");
  forged.tuned_at = "9999-12-31T23:59:59Z";
  forged.origin = "local";  // a claim the import does not believe
  TuningEntry fresh = entry(2048, 8, "imported-new");
  const json doc = {{"lunajit_tuning_export", 1},
                    {"databases", json::array({{{"device", device().to_json()},
                                                {"entries", json::array({forged.to_json(), fresh.to_json()})}}})}};
  auto n = import_tuning(root_, doc, "fleet.json");
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(*n, 1);
  TuningDb db(root_, device());
  const auto kept = db.find({"spec1", "forward", {1024, 8, "bf16"}});
  EXPECT_EQ(kept->config_name, "local-measured");
  EXPECT_EQ(kept->origin, "local");
  const auto added = db.find({"spec1", "forward", {2048, 8, "bf16"}});
  EXPECT_EQ(added->origin, "imported");
  EXPECT_EQ(added->imported_from, "fleet.json");
  EXPECT_FALSE(added->imported_at.empty());
  // The provenance survives the file and an export.
  EXPECT_NE(slurp(db.file()).find("\"imported_from\": \"fleet.json\""), std::string::npos);
  // A local measurement replaces an imported one, even an older-looking one.
  TuningEntry local2 = entry(2048, 8, "local-2048");
  local2.tuned_at = "2000-01-01T00:00:00Z";
  EXPECT_EQ(&preferred_entry(*added, local2), &local2);
  // An imported measurement beats a local model ranking, and loses to local measured.
  TuningEntry model = entry(2048, 8, "local-model", "model-ranked");
  EXPECT_EQ(&preferred_entry(model, *added), &*added);
}

// Found by tests/fuzz/tuning_db_fuzzer and tuning_import_fuzzer: a float where
// an integer belongs (1e82 as seq_bucket or sm) was converted with undefined
// behaviour by get<int>(); a value past the type's range was wrapped. Both are
// errors naming the field now (corpus: crash_float_*_ub.json).
TEST(TuningDbParse, FloatOrOutOfRangeIntegerFieldIsAnErrorNamingTheField) {
  const std::string dev = R"({"name": "x", "sm": SM, "sm_count": 1, "memory_bytes": 1, "driver": "", "nvrtc": "", "lunajit": ""})";
  auto with_sm = [&](const std::string& sm) {
    std::string d = dev;
    d.replace(d.find("SM"), 2, sm);
    return R"({"schema": 1, "device": )" + d + R"(, "entries": []})";
  };
  ASSERT_TRUE(parse_tuning_db(with_sm("90")).ok());
  for (const char* bad : {"1e82", "90.0", "4294967386", "-1e300"}) {
    auto r = parse_tuning_db(with_sm(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("sm"), std::string::npos) << r.error().message;
  }
  auto entry_with_seq = [](const std::string& seq) {
    return R"({"schema": 1, "entries": [{"spec_hash": "x", "pass": "forward", "seq_bucket": )" + seq +
           R"(, "bh_bucket": 1, "dtype": "bf16", "config": {}, "config_name": "", "method": "measured", "timings": []}]})";
  };
  auto ok = parse_tuning_db(entry_with_seq("1024"));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->entries.at(0).key.bucket.seq, 1024);
  for (const char* bad : {"-2.8888e46", "1e82", "8589934592", "1000", "-2147483648"}) {  // powers of two 1..2^32 only
    auto r = parse_tuning_db(entry_with_seq(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("seq_bucket"), std::string::npos) << r.error().message;
  }
  auto big = parse_tuning_db(with_sm("90").replace(with_sm("90").find("\"memory_bytes\": 1"), 17,
                                                    "\"memory_bytes\": 18446744073709551615"));
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(big->device->memory_bytes, UINT64_MAX);
}

// Found by tests/fuzz/tuning_db_fuzzer (corpus: bad_schema_*.json): "schema"
// of another type threw out of the reader; such a file is damaged, set aside.
TEST_F(TuningDir, SchemaOfAnotherTypeIsADamagedFileNotAnException) {
  for (const char* schema : {R"("1")", "null", "1.5", "[1]"}) {
    auto r = parse_tuning_db(std::string(R"({"schema": )") + schema + R"(, "entries": []})");
    ASSERT_FALSE(r.ok()) << schema;
    EXPECT_NE(r.error().message.find("schema"), std::string::npos) << r.error().message;
  }
  TuningDb probe(root_, device());
  fs::create_directories(probe.file().parent_path());
  std::ofstream(probe.file()) << R"({"schema": "1", "entries": []})";
  ::testing::internal::CaptureStderr();
  TuningDb db(root_, device());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("is damaged"), std::string::npos) << err;
  EXPECT_TRUE(db.entries().empty());
  EXPECT_TRUE(db.store(entry(1024, 8, "A")).ok());
}

}  // namespace
}  // namespace lunajit
