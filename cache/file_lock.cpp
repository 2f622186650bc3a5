#include "cache/file_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "common/read_file.h"

namespace lunajit {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<long long> g_timeout_ms{kDefaultLockTimeout.count()};

// One mutex per lock file for the life of the process (a handful of files).
std::timed_mutex& mutex_for(const std::filesystem::path& lock_file) {
  static std::mutex table_mu;
  static std::map<std::string, std::unique_ptr<std::timed_mutex>> table;
  std::lock_guard lock(table_mu);
  auto& m = table[std::filesystem::absolute(lock_file).lexically_normal().string()];
  if (!m) m = std::make_unique<std::timed_mutex>();
  return *m;
}

// The pid holding a conflicting lock on `fd`, or 0 (none now, or unknown).
pid_t holder_of(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_GETLK, &fl) != 0 || fl.l_type == F_UNLCK) return 0;
  return fl.l_pid;
}

std::string seconds_text(std::chrono::milliseconds ms) { return fmt::format("{:g} s", ms.count() / 1000.0); }

}  // namespace

void set_file_lock_timeout(std::chrono::milliseconds timeout) { g_timeout_ms = timeout.count(); }
std::chrono::milliseconds file_lock_timeout() { return std::chrono::milliseconds(g_timeout_ms.load()); }

FileLock::FileLock(const std::filesystem::path& lock_file) : guard_(mutex_for(lock_file), std::defer_lock) {
  const auto timeout = file_lock_timeout();
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  // Another thread of this process holds it: the same bound applies.
  if (!guard_.try_lock_until(deadline)) {
    error_ = ETIMEDOUT;
    message_ = fmt::format("timed out after {} waiting for lock {} (held by another thread of this process)",
                           seconds_text(timeout), lock_file.string());
    return;
  }
  fd_ = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) {
    error_ = errno;
    message_ = fmt::format("cannot open lock {}: {}", lock_file.string(), errno_message(error_));
    return;
  }
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  bool noticed = false;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::fcntl(fd_, F_SETLK, &fl) == 0) break;
    if (errno == EINTR) continue;
    if (errno != EACCES && errno != EAGAIN) {
      error_ = errno;
      message_ = fmt::format("cannot lock {}: {}", lock_file.string(), errno_message(error_));
      return;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      const pid_t pid = holder_of(fd_);
      error_ = ETIMEDOUT;
      message_ = fmt::format("timed out after {} waiting for lock {} held by {}", seconds_text(timeout),
                             lock_file.string(), pid > 0 ? fmt::format("pid {}", pid) : "another process");
      return;
    }
    if (!noticed && now - start >= kLockNoticeAfter) {
      noticed = true;
      if (const pid_t pid = holder_of(fd_); pid > 0)
        std::fprintf(stderr, "lunajit: waiting for lock %s held by pid %d (giving up after %s)\n",
                     lock_file.c_str(), static_cast<int>(pid), seconds_text(timeout).c_str());
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
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
