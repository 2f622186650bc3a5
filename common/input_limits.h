// Every limit on what a user hands lunajit, in one place: spec fields, tile
// config knobs, problem shapes, environment variables and the size of files
// read. The parsers check against these (64-bit-safe: a value out of range is
// an error naming the field, the value and the range, never wrapped or
// clamped), and README's spec table documents the same numbers.
#pragma once

#include <cfloat>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

namespace lunajit::limits {

struct IntRange {
  int64_t lo, hi;
};
struct RealRange {
  double lo, hi;
  bool lo_inclusive = true;
};

// ---- spec (docs/MATH.md §2). The templates are instantiated for head and
// value dims up to 256; D is bounded by the shared-memory tiles of phi.
inline constexpr IntRange kHeadDim{1, 256};
inline constexpr IntRange kValueDim{1, 256};
inline constexpr int64_t kMaxFeatureDim = 2048;
inline constexpr IntRange kLunaProjections{1, 64};
inline constexpr IntRange kLunaChannels{1, 64};
inline constexpr IntRange kLunaMlpWidth{1, 256};
inline constexpr IntRange kPerformerFeatures{1, kMaxFeatureDim};
inline constexpr IntRange kRffFeatures{1, kMaxFeatureDim / 2};
inline constexpr IntRange kT2rFeatures{1, kMaxFeatureDim};
inline constexpr IntRange kHedgehogFeatures{1, kMaxFeatureDim / 2};
inline constexpr IntRange kSlayNodes{1, 16};
inline constexpr IntRange kSlayAnchors{1, 64};
inline constexpr IntRange kSlayPrfFeatures{1, 256};
// Seeds are unsigned 64-bit; negative values are errors, not wrapped.
inline constexpr uint64_t kMaxSeed = UINT64_MAX;
// eps guards the division by phi(q).z in fp32: it must be a normal fp32
// number (smaller ones flush to 0 in the kernels) and at most 1 (the
// denominator is a sum of non-negative O(1) terms; an eps above 1 no longer
// guards a division, it rescales every output).
inline constexpr RealRange kEps{FLT_MIN, 1.0};
// Performer's kernel_eps is added to every feature exp(.) <= 1 (after the
// stabiliser): 0 disables it, above 1 it swamps the features.
inline constexpr RealRange kPerformerKernelEps{0.0, 1.0};
// SLAY's C = 2 + eps_yat; a normal fp32, and at most 1e3 (beyond that the
// kernel 1/(C - 2x) is constant to fp32 precision).
inline constexpr RealRange kSlayEpsYat{FLT_MIN, 1e3};

// ---- problem shapes. The grid puts batch * heads on two dimensions of at most
// 65535 each; token indices are int32 and element offsets int64.
inline constexpr IntRange kBatch{1, 65535};
inline constexpr IntRange kHeads{1, 65535};
inline constexpr IntRange kSeq{1, INT32_MAX};

// ---- file sizes read whole into memory (a spec, a tile config, a tuning
// database or export, a report): bounded so /dev/zero or a huge file is a
// clear error, not an out-of-memory.
inline constexpr uint64_t kMaxSpecFileBytes = 1u << 20;        // 1 MiB
inline constexpr uint64_t kMaxJsonFileBytes = 256ull << 20;     // 256 MiB (tuning DBs, exports, reports)
// Longest excerpt of user text quoted back in an error message.
inline constexpr size_t kMaxQuotedChars = 80;

// "field = value: must be in [lo, hi]" unless lo <= v <= hi.
Status check(std::string_view field, int64_t v, IntRange r);
Status check(std::string_view field, double v, RealRange r);

// Parses a whole decimal integer (optional sign, surrounding spaces allowed)
// without wrapping: out-of-range and trailing garbage are errors naming `field`.
Result<int64_t> parse_int(std::string_view field, std::string_view text, IntRange r);
Result<uint64_t> parse_uint64(std::string_view field, std::string_view text);

// At most kMaxQuotedChars of `text`, with "... (N bytes)" when cut.
std::string quote(std::string_view text);

}  // namespace lunajit::limits
