// The tuning import (cache/tuning_db.h import_tuning, what `lunajit cache
// import` applies to an export document) on arbitrary JSON text, into a
// scratch cache directory emptied before each input.
// Properties: a rejection is an error with a message; an accepted import
// leaves databases that export_tuning reads back, holding at least one entry
// when the import reported changes.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "cache/tuning_db.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lunajit;
  static const fuzz::ScratchDir scratch;
  nlohmann::json doc = nlohmann::json::parse(fuzz::as_text(data, size), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  scratch.clear();
  auto changed = import_tuning(scratch.path(), doc);
  if (!changed) {
    FUZZ_CHECK(!changed.error().message.empty());
    return 0;
  }
  FUZZ_CHECK(*changed >= 0);
  const nlohmann::json exported = export_tuning(scratch.path());
  size_t total = 0;
  for (const auto& db : exported.at("databases")) total += db.at("entries").size();
  if (*changed > 0) FUZZ_CHECK(total >= 1);
  FUZZ_CHECK(total <= static_cast<size_t>(*changed));
  return 0;
}
