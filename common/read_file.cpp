#include "common/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include <fmt/format.h>

namespace lunajit {

std::string errno_message(int err) { return std::error_code(err, std::generic_category()).message(); }

Result<std::string> read_file_bounded(const std::filesystem::path& path, std::size_t max_bytes,
                                      std::string_view what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return Error::invalid(fmt::format("{} '{}': cannot be opened: {}", what, path.string(), errno_message(err)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return Error::failure(fmt::format("{} '{}': cannot be read: {}", what, path.string(), errno_message(err)));
  }
  if (S_ISDIR(st.st_mode)) return Error::invalid(fmt::format("{} '{}': is a directory", what, path.string()));
  const bool regular = S_ISREG(st.st_mode);
  if (regular && static_cast<std::uint64_t>(st.st_size) > max_bytes)
    return Error::invalid(fmt::format("{} '{}': {} bytes, more than the limit of {} bytes", what, path.string(),
                                      static_cast<std::uint64_t>(st.st_size), max_bytes));
  // Regular files read normally from here on (the flag only matters for FIFOs
  // and devices; a FIFO then blocks until its writer closes, as a pipe should).
  if (!regular) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string data;
  const std::size_t cap = max_bytes == SIZE_MAX ? max_bytes : max_bytes + 1;
  data.resize(regular ? static_cast<std::size_t>(st.st_size) : std::min<std::size_t>(cap, 1 << 16));
  std::size_t got = 0;
  for (;;) {
    if (got == data.size()) {
      if (data.size() >= cap) break;
      data.resize(std::min<std::size_t>(cap, data.size() * 2));
    }
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      return Error::failure(fmt::format("{} '{}': read failed: {}", what, path.string(), errno_message(err)));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
    if (got > max_bytes) break;
  }
  if (got > max_bytes)
    return Error::invalid(fmt::format("{} '{}': more than the limit of {} bytes (not a regular file: {})", what,
                                      path.string(), max_bytes, S_ISCHR(st.st_mode) ? "a device" : "a pipe or FIFO"));
  data.resize(got);
  return data;
}

}  // namespace lunajit
