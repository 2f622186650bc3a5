#include "codegen/kernel_source.h"

#include "common/hash.h"
#include "templates/embedded.h"

namespace lunajit {

const std::string& embedded_headers_hash() {
  static const std::string hash = [] {
    Hasher h;
    for (const auto& f : templates::files()) h.add(f.path).add(f.contents);
    for (const auto& f : cuda_headers::files()) h.add(f.path).add(f.contents);
    return h.hex();
  }();
  return hash;
}

std::string KernelSource::content_hash() const {
  Hasher h;
  h.add(code);
  for (const auto& e : entries) h.add(e.name_expression);
  h.add(embedded_headers_hash());
  return h.hex();
}

const KernelEntry* KernelSource::entry(std::string_view role) const {
  for (const auto& e : entries)
    if (e.role == role) return &e;
  return nullptr;
}

}  // namespace lunajit
