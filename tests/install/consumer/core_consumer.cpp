// lunajit::lunajit from an installed tree: generate the default LUNA forward
// kernel source and round-trip a safetensors file.
#include <cstdio>

#include "codegen/generator.h"
#include "common/version.h"
#include "io/safetensors.h"

int main() {
  using namespace lunajit;
  const AttentionSpec spec = default_spec(Family::luna);
  auto src = generate(spec, default_config(spec, arch_from_sm(90).value_or_throw()), Pass::forward);
  if (!src) return std::fprintf(stderr, "generate: %s\n", src.error().message.c_str()), 1;
  Safetensors st;
  const float values[3] = {1, 2, 3};
  st.tensors.push_back(StTensor::from_floats("x", {3}, values));
  const std::vector<std::byte> bytes = serialize_safetensors(st).value_or_throw();
  auto back = parse_safetensors(bytes);
  if (!back || back->find("x")->to_floats()[2] != 3.0f) return std::fprintf(stderr, "safetensors round trip\n"), 1;
  std::printf("core consumer ok: lunajit %s, %s (%zu bytes of CUDA)\n", version(), src->name.c_str(),
              src->code.size());
  return 0;
}
