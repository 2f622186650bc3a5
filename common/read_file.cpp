#include "common/read_file.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace lunajit {

Result<std::string> read_file_bounded(const std::filesystem::path& path, std::size_t max_bytes,
                                      std::string_view what) {
  // O_NONBLOCK: opening a FIFO with no writer must not wait; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Error::invalid(fmt::format("{} '{}': cannot be opened: {}", what, path.string(), std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return Error::invalid(fmt::format("{} '{}': cannot be read: {}", what, path.string(), std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) return Error::invalid(fmt::format("{} '{}': is a directory, not a file", what, path.string()));
  if (!S_ISREG(st.st_mode))
    return Error::invalid(fmt::format("{} '{}': is not a regular file (a device, FIFO or socket)", what, path.string()));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return Error::invalid(fmt::format("{} '{}': {} bytes; at most {} are read", what, path.string(),
                                      static_cast<long long>(st.st_size), max_bytes));
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (true) {
    if (got == out.size()) {
      // The file may have grown since fstat: read on, still bounded.
      if (out.size() >= max_bytes + 1) break;
      out.resize(std::min<size_t>(max_bytes + 1, std::max<size_t>(out.size() * 2, 4096)));
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::invalid(fmt::format("{} '{}': read failed: {}", what, path.string(), std::strerror(errno)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes)
    return Error::invalid(fmt::format("{} '{}': larger than the {} bytes that are read", what, path.string(), max_bytes));
  out.resize(got);
  return out;
}

}  // namespace lunajit
