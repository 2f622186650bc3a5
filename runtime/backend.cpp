// Backend selection and Buffer ownership (see backend.h).
#include "runtime/backend.h"

#include <cstdlib>
#include <string>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/host/host_backend.h"

namespace lunajit {

std::string_view to_string(BackendKind k) {
  switch (k) {
    case BackendKind::host: return "host";
    case BackendKind::cuda: return "cuda";
  }
  return "unknown";
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (owner_ != nullptr && ptr_ != 0) owner_->release(ptr_);
    owner_ = o.owner_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.owner_ = nullptr;
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}

Buffer::~Buffer() {
  if (owner_ != nullptr && ptr_ != 0) owner_->release(ptr_);
}

Result<std::unique_ptr<Backend>> make_backend(std::string_view kind) {
  std::string requested(kind);
  if (requested.empty() || requested == "auto") {
    const char* env = std::getenv("LUNAJIT_BACKEND");
    requested = (env != nullptr && *env != '\0') ? env : "auto";
  }
  if (requested == "host") return make_host_backend();
  if (requested == "cuda") return make_cuda_backend();
  if (requested == "auto") {
    Result<std::unique_ptr<Backend>> cuda = make_cuda_backend();
    if (cuda) return cuda;
    return make_host_backend();
  }
  return Error::invalid("unknown backend '" + requested + "' (LUNAJIT_BACKEND / --backend): use auto, cuda or host");
}

}  // namespace lunajit
