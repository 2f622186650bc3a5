// Reading a whole file with a bound on its size, for every input lunajit reads
// from a path the user names (spec files, tuning databases, cache exports).
//
// /dev/zero, a FIFO or a 100 GB file must not be read until memory runs out:
// a regular file larger than `max_bytes` is refused from its size before
// anything is read; anything else (a device, a FIFO, a pipe) is read up to
// max_bytes + 1 bytes and refused if there is more. A FIFO is opened
// non-blocking, so one without a writer reads as empty instead of hanging.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/result.h"

namespace lunajit {

// The bytes of `path`, or an error that names `what` ("spec file", "import
// file"), the path and the reason (errno text, or the size and the bound):
//   invalid_argument  the file is missing, unreadable, a directory, or too big
//   runtime_failure   a read error after opening
Result<std::string> read_file_bounded(const std::filesystem::path& path, std::size_t max_bytes,
                                      std::string_view what);

// "Permission denied" for EACCES: std::generic_category's message of errno `err`.
std::string errno_message(int err);

}  // namespace lunajit
