// A file compiled into the binary (kernel templates, CUDA fp16/bf16 headers).
// Produced by cmake/embed_files.cmake; handed to NVRTC and to the host JIT as
// in-memory headers so nothing is read from disk at run time.
#pragma once

#include <span>
#include <string_view>

namespace lunajit {

struct EmbeddedFile {
  std::string_view path;      // virtual include path, e.g. "lunajit/linear_attention.cuh"
  std::string_view contents;
};

}  // namespace lunajit
