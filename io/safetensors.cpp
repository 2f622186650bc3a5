// safetensors reader and writer (io/safetensors.h).
#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace lunajit {
namespace {

using nlohmann::json;

constexpr StDType kAllDTypes[] = {StDType::F64, StDType::F32, StDType::F16, StDType::BF16, StDType::I64,
                                  StDType::I32, StDType::I16, StDType::I8,  StDType::U8,   StDType::BOOL};

Error bad(std::string msg) { return Error::invalid("safetensors: " + std::move(msg)); }

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);  // zero or subnormal
    return sign ? -f : f;
  }
  const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  std::memcpy(&f, &bits, 4);
  return f;
}

// Reads a non-negative integer that fits int64 from a JSON value, else nullopt.
std::optional<uint64_t> as_index(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

}  // namespace

std::string_view to_string(StDType t) {
  switch (t) {
    case StDType::F64: return "F64";
    case StDType::F32: return "F32";
    case StDType::F16: return "F16";
    case StDType::BF16: return "BF16";
    case StDType::I64: return "I64";
    case StDType::I32: return "I32";
    case StDType::I16: return "I16";
    case StDType::I8: return "I8";
    case StDType::U8: return "U8";
    case StDType::BOOL: return "BOOL";
  }
  return "?";
}

Result<StDType> parse_st_dtype(std::string_view s) {
  for (StDType t : kAllDTypes)
    if (to_string(t) == s) return t;
  return bad(fmt::format("dtype \"{}\" is not supported (allowed: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)", s));
}

int st_dtype_bytes(StDType t) {
  switch (t) {
    case StDType::F64:
    case StDType::I64: return 8;
    case StDType::F32:
    case StDType::I32: return 4;
    case StDType::F16:
    case StDType::BF16:
    case StDType::I16: return 2;
    case StDType::I8:
    case StDType::U8:
    case StDType::BOOL: return 1;
  }
  return 1;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<float> StTensor::to_floats() const {
  const int64_t n = int64_t(data.size()) / st_dtype_bytes(dtype);
  std::vector<float> out(size_t(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* p = data.data() + i * st_dtype_bytes(dtype);
    switch (dtype) {
      case StDType::F32: std::memcpy(&out[i], p, 4); break;
      case StDType::F64: {
        double d;
        std::memcpy(&d, p, 8);
        out[i] = float(d);
        break;
      }
      case StDType::F16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = half_to_float(h);
        break;
      }
      case StDType::BF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        const uint32_t bits = uint32_t(h) << 16;
        std::memcpy(&out[i], &bits, 4);
        break;
      }
      default: break;  // integer dtypes: callers check the dtype first
    }
  }
  return out;
}

StTensor StTensor::from_floats(std::string name, std::vector<int64_t> shape, std::span<const float> values) {
  StTensor t{std::move(name), StDType::F32, std::move(shape), {}};
  t.data.resize(values.size_bytes());
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), values.size_bytes());
  return t;
}

const StTensor* Safetensors::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Result<Safetensors> parse_safetensors(std::span<const std::byte> bytes) {
  if (bytes.size() < 8)
    return bad(fmt::format("file is {} bytes, shorter than the 8-byte header length", bytes.size()));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxSafetensorsHeader)
    return bad(fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxSafetensorsHeader));
  if (n > bytes.size() - 8)
    return bad(fmt::format("header length {} runs past the end of the file ({} bytes after the length)", n,
                           bytes.size() - 8));
  if (n < 2) return bad(fmt::format("header length {} is too short for a JSON object", n));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), size_t(n));
  if (text.front() != '{') return bad("header does not start with '{' (not a JSON object)");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error& e) {
    return bad(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) return bad("header is not a JSON object");

  const std::span<const std::byte> buffer = bytes.subspan(8 + size_t(n));
  Safetensors out;
  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return bad("__metadata__ must be an object of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) return bad(fmt::format("__metadata__[\"{}\"] is not a string", key));
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return bad(fmt::format("tensor \"{}\": entry is not an object", name));
    for (const auto& [key, _] : entry.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        return bad(fmt::format("tensor \"{}\": unknown field \"{}\" (allowed: dtype, shape, data_offsets)", name, key));
    StTensor t;
    t.name = name;
    if (!entry.contains("dtype") || !entry["dtype"].is_string())
      return bad(fmt::format("tensor \"{}\": dtype is missing or not a string", name));
    auto dt = parse_st_dtype(entry["dtype"].get<std::string>());
    if (!dt) return bad(fmt::format("tensor \"{}\": dtype \"{}\" is not supported (allowed: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)", name, entry["dtype"].get<std::string>()));
    t.dtype = *dt;
    if (!entry.contains("shape") || !entry["shape"].is_array())
      return bad(fmt::format("tensor \"{}\": shape is missing or not an array", name));
    uint64_t numel = 1;
    bool zero = false, overflow = false;
    for (const auto& s : entry["shape"]) {
      const auto dim = as_index(s);
      if (!dim || *dim > uint64_t(std::numeric_limits<int64_t>::max()))
        return bad(fmt::format("tensor \"{}\": shape {} has an entry that is not a non-negative integer", name,
                               entry["shape"].dump()));
      if (*dim == 0) zero = true;
      else if (numel > std::numeric_limits<uint64_t>::max() / 8 / *dim) overflow = true;
      else numel *= *dim;
      t.shape.push_back(int64_t(*dim));
    }
    if (zero) numel = 0;
    else if (overflow) return bad(fmt::format("tensor \"{}\": shape {} has too many elements", name, entry["shape"].dump()));
    const json& off = entry.contains("data_offsets") ? entry["data_offsets"] : json();
    if (!off.is_array() || off.size() != 2)
      return bad(fmt::format("tensor \"{}\": data_offsets must be [begin, end], got {}", name, off.dump()));
    const auto begin = as_index(off[0]), end = as_index(off[1]);
    if (!begin || !end) return bad(fmt::format("tensor \"{}\": data_offsets {} are not non-negative integers", name, off.dump()));
    if (*begin > *end) return bad(fmt::format("tensor \"{}\": data_offsets {}: begin > end", name, off.dump()));
    if (*end > buffer.size())
      return bad(fmt::format("tensor \"{}\": data_offsets {} run past the data buffer ({} bytes)", name, off.dump(),
                             buffer.size()));
    const uint64_t want = numel * uint64_t(st_dtype_bytes(t.dtype));
    if (*end - *begin != want)
      return bad(fmt::format("tensor \"{}\": data_offsets {} hold {} bytes but {} {} x {} needs {}", name, off.dump(),
                             *end - *begin, to_string(t.dtype), entry["shape"].dump(), st_dtype_bytes(t.dtype), want));
    const std::byte* p = buffer.data() + *begin;
    t.data.assign(p, p + (*end - *begin));
    ranges.push_back({*begin, *end, out.tensors.size()});
    out.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t at = 0;
  for (const Range& r : ranges) {
    if (r.begin < at)
      return bad(fmt::format("tensor \"{}\": data_offsets [{}, {}] overlap the previous tensor (which ends at {})",
                             out.tensors[r.index].name, r.begin, r.end, at));
    if (r.begin > at)
      return bad(fmt::format("tensor \"{}\": data_offsets [{}, {}] leave a hole at bytes [{}, {}) of the buffer",
                             out.tensors[r.index].name, r.begin, r.end, at, r.begin));
    at = r.end;
  }
  if (at != buffer.size())
    return bad(fmt::format("the tensors cover {} bytes but the data buffer has {} (trailing bytes)", at,
                           buffer.size()));
  std::vector<StTensor> ordered;
  ordered.reserve(ranges.size());
  for (const Range& r : ranges) ordered.push_back(std::move(out.tensors[r.index]));
  out.tensors = std::move(ordered);
  return out;
}

Result<std::vector<std::byte>> serialize_safetensors(const Safetensors& st) {
  json header = json::object();
  if (!st.metadata.empty()) header["__metadata__"] = st.metadata;
  std::set<std::string> names;
  uint64_t at = 0;
  for (const auto& t : st.tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return bad(fmt::format("tensor name \"{}\" is not allowed", t.name));
    if (!names.insert(t.name).second) return bad(fmt::format("tensor \"{}\" appears twice", t.name));
    for (int64_t s : t.shape)
      if (s < 0) return bad(fmt::format("tensor \"{}\": negative dimension {}", t.name, s));
    const uint64_t want = uint64_t(t.numel()) * st_dtype_bytes(t.dtype);
    if (t.data.size() != want)
      return bad(fmt::format("tensor \"{}\": has {} bytes of data, its dtype and shape need {}", t.name,
                             t.data.size(), want));
    header[t.name] = {{"dtype", std::string(to_string(t.dtype))}, {"shape", t.shape}, {"data_offsets", {at, at + want}}};
    at += want;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size() + at);
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::byte* p = out.data() + 8 + text.size();
  for (const auto& t : st.tensors) {
    if (!t.data.empty()) std::memcpy(p, t.data.data(), t.data.size());
    p += t.data.size();
  }
  return out;
}

Result<Safetensors> read_safetensors(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Error::unavailable(fmt::format("safetensors: cannot open {}", file.string()));
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Error::unavailable(fmt::format("safetensors: error reading {}", file.string()));
  auto st = parse_safetensors(std::as_bytes(std::span(raw)));
  if (!st) return Error{st.error().kind, fmt::format("{}: {}", file.string(), st.error().message)};
  return st;
}

Status write_safetensors(const std::filesystem::path& file, const Safetensors& st) {
  auto bytes = serialize_safetensors(st);
  if (!bytes) return bytes.error();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return Error::unavailable(fmt::format("safetensors: cannot create {}", file.string()));
  out.write(reinterpret_cast<const char*>(bytes->data()), std::streamsize(bytes->size()));
  if (!out) return Error::failure(fmt::format("safetensors: error writing {}", file.string()));
  return ok_status();
}

}  // namespace lunajit
