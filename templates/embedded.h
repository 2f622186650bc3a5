// The embedded files: kernel templates (templates/lunajit/...) and the CUDA
// fp16/bf16 headers, by virtual include path.
#pragma once

#include <span>

#include "common/embedded_file.h"

namespace lunajit::templates {
std::span<const EmbeddedFile> files();
}
namespace lunajit::cuda_headers {
std::span<const EmbeddedFile> files();
}
