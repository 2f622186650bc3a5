// FileLock: an exclusive lock on a lock file that holds across threads and
// processes, for the short "check, then rename" steps of the caches.
//
// fcntl locks belong to a process, not to a thread (a second fcntl lock by the
// same process succeeds at once), so a process-wide mutex per lock file is
// taken first to serialize the threads of one process, then the fcntl write
// lock on the file (created 0600 if missing, never through a symbolic link)
// serializes processes. The lock is released when the object is destroyed or
// the process dies, so a crashed writer never leaves a stale lock behind.
//
// A live holder that never lets go (a process stopped with ^Z or SIGSTOP while
// it held the lock) must not hang everyone else: the wait is bounded. After
// kLockNoticeAfter a line "lunajit: waiting for lock <file> held by pid N"
// goes to stderr (the holder from F_GETLK), and after the timeout (default
// kDefaultLockTimeout) the constructor gives up: locked() is false, error() is
// ETIMEDOUT and message() names the lock and the holder. The caches then
// carry on without the locked step (the entry is kept in memory, see
// binary_cache.h and tuning_db.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>

namespace lunajit {

inline constexpr std::chrono::milliseconds kLockNoticeAfter{1000};
inline constexpr std::chrono::milliseconds kDefaultLockTimeout{10000};

// The timeout every FileLock uses from now on (tests shorten it).
void set_file_lock_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds file_lock_timeout();

class FileLock {
 public:
  // Waits (at most file_lock_timeout()) until the lock is held, or fails
  // (locked() false, error() the errno) when the lock file cannot be opened,
  // e.g. in a read-only directory, or the wait times out.
  explicit FileLock(const std::filesystem::path& lock_file);
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  bool locked() const { return locked_; }
  int error() const { return error_; }
  // Why the lock is not held, for a message: "cannot open <file>: <reason>" or
  // "timed out after 10 s waiting for lock <file> held by pid 1234". Empty when locked.
  const std::string& message() const { return message_; }

 private:
  std::unique_lock<std::timed_mutex> guard_;
  int fd_ = -1;
  int error_ = 0;
  bool locked_ = false;
  std::string message_;
};

}  // namespace lunajit
