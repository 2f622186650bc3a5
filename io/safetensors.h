// safetensors (https://huggingface.co/docs/safetensors): the tensor file format
// lunajit reads and writes (`lunajit run --inputs/--save`, module checkpoints).
//
//   bytes 0..8     N, the header length, unsigned 64-bit little-endian
//   bytes 8..8+N   a JSON object (UTF-8, may be padded with trailing spaces):
//                    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//                    "__metadata__": {"key": "value", ...}   (optional, strings only)
//   the rest       the data buffer; offsets are relative to its start
//
// parse_safetensors validates everything a malformed or hostile file can get
// wrong and names what it rejects: the header length against the file size (and
// a 100 MB cap), the JSON (an object of objects), each dtype (F64 F32 F16 BF16
// I64 I32 I16 I8 U8 BOOL), each shape (non-negative integers, element count
// without overflow), each data_offsets pair (two integers, begin <= end, inside
// the buffer, end - begin = elements x dtype size), overlaps between tensors,
// and that the tensors cover the buffer exactly (no holes, no trailing bytes,
// as the reference implementation requires). Errors are
// ErrorKind::invalid_argument; I/O failures ErrorKind::unavailable.
//
// Data is raw little-endian, row-major (this file assumes a little-endian host,
// as every platform lunajit builds on is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace lunajit {

enum class StDType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };
std::string_view to_string(StDType t);
Result<StDType> parse_st_dtype(std::string_view s);
int st_dtype_bytes(StDType t);

struct StTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // numel() * st_dtype_bytes(dtype) bytes

  int64_t numel() const;
  // fp32 / fp64 copies and constructors (the dtypes the CLI works in).
  std::vector<float> to_floats() const;   // F32, F64, F16, BF16 -> float; Error otherwise via caller's check
  static StTensor from_floats(std::string name, std::vector<int64_t> shape, std::span<const float> values);
};

struct Safetensors {
  std::vector<StTensor> tensors;  // in data-offset order
  std::map<std::string, std::string> metadata;

  const StTensor* find(std::string_view name) const;
};

// The largest header parse_safetensors accepts (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Parses a whole file's bytes (see the file comment for what is validated).
Result<Safetensors> parse_safetensors(std::span<const std::byte> bytes);

// Serializes tensors (in the given order, contiguous) and metadata; the header is
// padded with spaces to a multiple of 8 bytes. Error for duplicate or empty
// names, "__metadata__" as a tensor name, or data of the wrong size.
Result<std::vector<std::byte>> serialize_safetensors(const Safetensors& st);

Result<Safetensors> read_safetensors(const std::filesystem::path& file);
Status write_safetensors(const std::filesystem::path& file, const Safetensors& st);

}  // namespace lunajit
