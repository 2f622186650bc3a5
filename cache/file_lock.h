// FileLock: an exclusive lock on a lock file that holds across threads and
// processes, for the short "check, then rename" steps of the caches.
//
// fcntl locks belong to a process, not to a thread (a second fcntl lock by the
// same process succeeds at once), so a process-wide mutex per lock file is
// taken first to serialize the threads of one process, then the fcntl write
// lock on the file (created if missing) serializes processes. The lock is
// released when the object is destroyed or the process dies, so a crashed
// writer never leaves a stale lock behind.
#pragma once

#include <filesystem>
#include <mutex>

namespace lunajit {

class FileLock {
 public:
  // Blocks until the lock is held, or fails (locked() false, error() the errno)
  // when the lock file cannot be opened, e.g. in a read-only directory.
  explicit FileLock(const std::filesystem::path& lock_file);
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  bool locked() const { return locked_; }
  int error() const { return error_; }

 private:
  std::unique_lock<std::mutex> guard_;
  int fd_ = -1;
  int error_ = 0;
  bool locked_ = false;
};

}  // namespace lunajit
