// Reading a whole file into memory, bounded: a FIFO, a device such as
// /dev/zero or a file larger than the caller allows is an error that names the
// file and what it is (never a hang and never an out-of-memory).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/result.h"

namespace lunajit {

// The contents of `path` if it is a regular file of at most `max_bytes` bytes
// (symlinks to one are followed). `what` names the file in errors ("spec
// file", "tuning export"); a missing or unreadable file is invalid_argument
// with the errno reason.
Result<std::string> read_file_bounded(const std::filesystem::path& path, std::size_t max_bytes,
                                      std::string_view what);

}  // namespace lunajit
