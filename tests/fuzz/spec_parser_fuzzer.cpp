// The spec parser (codegen/attention_spec.h spec_from_string) on arbitrary text.
// Properties: a rejected spec is an invalid_argument error with a message; an
// accepted spec validates, and its canonical JSON parses back to an equal spec
// with the same canonical text and hash.
#include <cstddef>
#include <cstdint>

#include "codegen/attention_spec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lunajit;
  auto spec = spec_from_string(fuzz::as_text(data, size));
  if (!spec) {
    FUZZ_CHECK(spec.error().kind == ErrorKind::invalid_argument);
    FUZZ_CHECK(!spec.error().message.empty());
    return 0;
  }
  FUZZ_CHECK(validate(*spec).ok());
  FUZZ_CHECK(spec->feature_dim() >= 1 && spec->feature_dim() <= kMaxFeatureDim);
  const std::string canonical = canonical_json(*spec);
  auto again = spec_from_string(canonical);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *spec);
  FUZZ_CHECK(canonical_json(*again) == canonical);
  FUZZ_CHECK(spec_hash(*again) == spec_hash(*spec));
  return 0;
}
