// The report reader of `lunajit report compare` (report/report_reader.h
// parse_report) on arbitrary text, then the comparison's renderings of what it
// accepts. Properties: a rejection is an invalid_argument error with a
// message; an accepted report renders (Markdown and HTML, alone and beside
// itself) without an exception.
#include <cstddef>
#include <cstdint>

#include "report/render.h"
#include "report/report_reader.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lunajit;
  auto report = report::parse_report(fuzz::as_text(data, size), "fuzz.json");
  if (!report) {
    FUZZ_CHECK(report.error().kind == ErrorKind::invalid_argument);
    FUZZ_CHECK(!report.error().message.empty());
    return 0;
  }
  const std::vector<nlohmann::json> one = {*report}, two = {*report, *report};
  FUZZ_CHECK(!report::render_compare_markdown(one, {"a"}).empty());
  FUZZ_CHECK(!report::render_compare_html(one, {"a"}).empty());
  FUZZ_CHECK(!report::render_compare_markdown(two, {"a", "b"}).empty());
  FUZZ_CHECK(!report::render_compare_html(two, {"a", "b"}).empty());
  return 0;
}
