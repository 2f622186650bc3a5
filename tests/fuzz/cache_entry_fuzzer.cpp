// The binary-cache entry reader (cache/binary_cache.h decode_cache_entry, what
// BinaryCache::get applies to an entry file's bytes) on arbitrary bytes.
// Input: one byte n (mod 64), n bytes of key, then the entry's bytes.
// Properties: bytes it accepts are exactly the encoding of the key and the
// payload it returns; a rejection says why; any payload survives encode then
// decode under its key; and an entry is never accepted under another key.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cache/binary_cache.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lunajit;
  const std::string_view all = fuzz::as_text(data, size);
  if (all.empty()) return 0;
  const size_t n = std::min<size_t>(static_cast<unsigned char>(all[0]) % 64, all.size() - 1);
  const std::string key(all.substr(1, n));
  const std::string_view bytes = all.substr(1 + n);
  auto payload = decode_cache_entry(bytes, key);
  if (payload) FUZZ_CHECK(encode_cache_entry(key, *payload) == bytes);
  else FUZZ_CHECK(!payload.error().message.empty());

  const std::string encoded = encode_cache_entry(key, bytes);
  auto back = decode_cache_entry(encoded, key);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == bytes);
  FUZZ_CHECK(!decode_cache_entry(encoded, key + "x").ok());  // bound to its key
  return 0;
}
