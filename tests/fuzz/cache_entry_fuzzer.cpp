// The binary-cache entry reader (cache/binary_cache.h decode_cache_entry, what
// BinaryCache::get applies to an entry file's bytes) on arbitrary bytes.
// Properties: bytes it accepts are exactly the encoding of the payload it
// returns; a rejection says why; and any bytes, taken as a payload, survive
// encode then decode unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cache/binary_cache.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lunajit;
  const std::string_view bytes = fuzz::as_text(data, size);
  auto payload = decode_cache_entry(bytes);
  if (payload) FUZZ_CHECK(encode_cache_entry(*payload) == bytes);
  else FUZZ_CHECK(!payload.error().message.empty());

  const std::string encoded = encode_cache_entry(bytes);
  auto back = decode_cache_entry(encoded);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == bytes);
  return 0;
}
