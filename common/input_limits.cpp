#include "common/input_limits.h"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace lunajit::limits {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Status check(std::string_view field, int64_t v, IntRange r) {
  if (v < r.lo || v > r.hi) return Error::invalid(fmt::format("{} = {}: must be in [{}, {}]", field, v, r.lo, r.hi));
  return ok_status();
}

Status check(std::string_view field, double v, RealRange r) {
  const bool lo_ok = r.lo_inclusive ? v >= r.lo : v > r.lo;
  if (!std::isfinite(v) || !lo_ok || v > r.hi)
    return Error::invalid(fmt::format("{} = {:g}: must be a finite number in {}{:g}, {:g}]", field, v,
                                      r.lo_inclusive ? "[" : "(", r.lo, r.hi));
  return ok_status();
}

Result<int64_t> parse_int(std::string_view field, std::string_view text, IntRange r) {
  const std::string_view t = trim(text);
  int64_t v = 0;
  const char* first = t.data();
  if (!t.empty() && t.front() == '+') ++first;
  auto [p, ec] = std::from_chars(first, t.data() + t.size(), v);
  if (t.empty() || p != t.data() + t.size() || (ec != std::errc() && ec != std::errc::result_out_of_range))
    return Error::invalid(fmt::format("{} = \"{}\": expected an integer in [{}, {}]", field, quote(text), r.lo, r.hi));
  if (ec == std::errc::result_out_of_range)
    return Error::invalid(fmt::format("{} = {}: must be in [{}, {}]", field, quote(t), r.lo, r.hi));
  if (auto st = check(field, v, r); !st) return st.error();
  return v;
}

Result<uint64_t> parse_uint64(std::string_view field, std::string_view text) {
  const std::string_view t = trim(text);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || p != t.data() + t.size() || ec != std::errc())
    return Error::invalid(fmt::format("{} = \"{}\": expected an integer in [0, {}]", field, quote(text), kMaxSeed));
  return v;
}

std::string quote(std::string_view text) {
  if (text.size() <= kMaxQuotedChars) return std::string(text);
  return fmt::format("{}... ({} bytes)", text.substr(0, kMaxQuotedChars), text.size());
}

}  // namespace lunajit::limits
