// common/read_file.h: the bounded reader every user-named input goes through.
#include "common/read_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

namespace lunajit {
namespace {
namespace fs = std::filesystem;

class ReadFileDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lunajit-read-file-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  fs::path root_;
};

TEST_F(ReadFileDir, RegularFileWithinTheBoundIsRead) {
  std::ofstream(root_ / "a") << "hello";
  auto r = read_file_bounded(root_ / "a", 5, "spec file");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "hello");
}

TEST_F(ReadFileDir, RegularFileOverTheBoundIsRefusedFromItsSize) {
  std::ofstream(root_ / "a") << "hello!";
  auto r = read_file_bounded(root_ / "a", 5, "spec file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(r.error().message.find("spec file '" + (root_ / "a").string() + "': 6 bytes, more than the limit of 5"),
            std::string::npos)
      << r.error().message;
}

TEST_F(ReadFileDir, DevZeroAsImportFileFailsFast) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = read_file_bounded("/dev/zero", 1 << 20, "import file");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(r.error().message.find("import file '/dev/zero': more than the limit of 1048576 bytes (not a regular "
                                   "file: a device)"),
            std::string::npos)
      << r.error().message;
}

TEST_F(ReadFileDir, FifoWithoutAWriterDoesNotHang) {
  ASSERT_EQ(::mkfifo((root_ / "f").c_str(), 0600), 0);
  auto r = read_file_bounded(root_ / "f", 100, "spec file");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "");
}

TEST_F(ReadFileDir, MissingFileAndDirectoryNameTheReason) {
  auto r = read_file_bounded(root_ / "none", 100, "spec file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cannot be opened: No such file or directory"), std::string::npos)
      << r.error().message;
  r = read_file_bounded(root_, 100, "spec file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("is a directory"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace lunajit
