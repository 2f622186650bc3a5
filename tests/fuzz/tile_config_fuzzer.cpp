// The tile-config parser (codegen/tile_config.h tile_config_from_string) on
// arbitrary text. Properties: a rejected config is an invalid_argument error
// with a message; an accepted config's JSON parses back to an equal config
// whatever the base, and can_implement answers (accepts or says why) for every
// pass on a small and a large arch without crashing.
#include <cstddef>
#include <cstdint>

#include "codegen/arch.h"
#include <nlohmann/json.hpp>

#include "codegen/tile_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lunajit;
  const TileConfig base;
  auto config = tile_config_from_string(fuzz::as_text(data, size), base);
  if (!config) {
    FUZZ_CHECK(config.error().kind == ErrorKind::invalid_argument);
    FUZZ_CHECK(!config.error().message.empty());
    return 0;
  }
  const TileConfig other_base(8, 1, 8, 8, 1, PhiInBackward::save);
  auto again = tile_config_from_json(config->to_json(), other_base);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *config);
  FUZZ_CHECK(again->hash() == config->hash());
  FUZZ_CHECK(!config->to_string().empty());
  static const Arch archs[] = {arch_from_sm(75).value(), arch_from_sm(90).value()};
  static const AttentionSpec specs[] = {default_spec(Family::luna), default_spec(Family::performer)};
  for (const Arch& arch : archs)
    for (const AttentionSpec& spec : specs)
      for (Pass pass : {Pass::feature_map, Pass::forward, Pass::backward}) {
        Status st = can_implement(spec, *config, arch, pass);
        if (!st) FUZZ_CHECK(!st.error().message.empty());
      }
  return 0;
}
