// fp32 <-> bf16 / fp16 bit conversions on the host, for preparing kernel inputs
// and reading outputs. fp16 uses the compiler's _Float16 (IEEE binary16, round
// to nearest even); bf16 is the top half of an fp32 with round-to-nearest-even,
// written out here because g++ 12 has no __bf16 arithmetic type.
#pragma once

#include <cstdint>
#include <cstring>

namespace lunajit {

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_fp16_bits(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

inline float fp16_bits_to_float(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

}  // namespace lunajit
