// The tuning-database file parser (cache/tuning_db.h parse_tuning_db, what
// TuningDb applies to <dir>/tuning/<fingerprint>.json) on arbitrary text.
// Properties: a rejection says why; an accepted file's entries serialize and
// parse back to the same entries (the form TuningDb::store writes).
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "cache/tuning_db.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lunajit;
  auto db = parse_tuning_db(fuzz::as_text(data, size));
  if (!db) {
    FUZZ_CHECK(!db.error().message.empty());
    return 0;
  }
  nlohmann::json entries = nlohmann::json::array();
  for (const TuningEntry& e : db->entries) {
    FUZZ_CHECK(!e.key.to_string().empty());
    entries.push_back(e.to_json());
  }
  nlohmann::json doc = {{"schema", kTuningDbSchema}, {"entries", entries}};
  if (db->device) {
    doc["device"] = db->device->to_json();
    FUZZ_CHECK(!db->device->id().empty());
  }
  auto again = parse_tuning_db(doc.dump());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->entries.size() == db->entries.size());
  for (size_t i = 0; i < db->entries.size(); ++i)
    FUZZ_CHECK(again->entries[i].to_json() == db->entries[i].to_json());
  FUZZ_CHECK(again->device == db->device);
  return 0;
}
