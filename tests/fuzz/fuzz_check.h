// Shared by the libFuzzer targets: FUZZ_CHECK aborts (a crash libFuzzer
// records, with the input saved as an artifact) when a property of an accepted
// or rejected input does not hold. Uncaught exceptions, ASan and UBSan reports
// are crashes too: library parsers return errors as values (docs/STYLE.md).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include <unistd.h>

#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace lunajit::fuzz {

inline std::string_view as_text(const unsigned char* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A scratch directory of this process (on tmpfs where there is one, so the
// targets that write files do not wear a disk), emptied by clear().
class ScratchDir {
 public:
  ScratchDir() {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::is_directory("/dev/shm", ec)
                                     ? std::filesystem::path("/dev/shm")
                                     : std::filesystem::temp_directory_path(ec);
    path_ = base / ("lunajit-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_, ec);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  void clear() const {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(path_, ec), end; !ec && it != end; it.increment(ec))
      std::filesystem::remove_all(it->path(), ec);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace lunajit::fuzz
