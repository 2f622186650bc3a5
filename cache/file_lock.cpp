#include "cache/file_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <string>

namespace lunajit {
namespace {

// One mutex per lock file for the life of the process (a handful of files).
std::mutex& mutex_for(const std::filesystem::path& lock_file) {
  static std::mutex table_mu;
  static std::map<std::string, std::unique_ptr<std::mutex>> table;
  std::lock_guard lock(table_mu);
  auto& m = table[std::filesystem::absolute(lock_file).lexically_normal().string()];
  if (!m) m = std::make_unique<std::mutex>();
  return *m;
}

}  // namespace

FileLock::FileLock(const std::filesystem::path& lock_file) : guard_(mutex_for(lock_file)) {
  fd_ = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    error_ = errno;
    return;
  }
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  while (::fcntl(fd_, F_SETLKW, &fl) != 0) {
    if (errno != EINTR) {
      error_ = errno;
      return;
    }
  }
  locked_ = true;
}

FileLock::~FileLock() {
  if (locked_) {
    struct flock fl {};
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    ::fcntl(fd_, F_SETLK, &fl);
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace lunajit
