// Content hashing for cache keys and spec identity: XXH3-128 (libxxhash), printed
// as 32 lowercase hex digits. Not cryptographic; collisions at 128 bits are not a
// practical concern for a local kernel cache.
#pragma once

#include <string>
#include <string_view>

namespace lunajit {

// 32 hex digits of XXH3-128 over the bytes of `data`.
std::string content_hash(std::string_view data);

// Incremental hashing of several parts; each part is length-prefixed so that
// ("ab","c") and ("a","bc") hash differently.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  Hasher& add(std::string_view part);
  std::string hex() const;

 private:
  void* state_;
};

}  // namespace lunajit
