// Parsing of the host sanitizer options (see sanitizer.h).
#include "runtime/host/sanitizer.h"

#include <atomic>
#include <cstdlib>

#include <fmt/format.h>

namespace lunajit::host {

std::string SanitizeOptions::describe() const {
  std::string checks;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!checks.empty()) checks += ',';
    checks += name;
  };
  add(init, "init");
  add(bounds, "bounds");
  add(sync, "sync");
  add(race, "race");
  add(banks, "banks");
  if (checks.empty()) checks = "none";
  switch (order) {
    case ScheduleOrder::forward: return checks + "; schedule forward";
    case ScheduleOrder::reverse: return checks + "; schedule reverse";
    case ScheduleOrder::random: return fmt::format("{}; schedule random:{}", checks, seed);
  }
  return checks;
}

Result<SanitizeOptions> parse_sanitize(std::string_view text) {
  SanitizeOptions o;
  const char* allowed = "init, bounds, sync, race, banks, all, none, schedule=forward|reverse|random:SEED";
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view word = text.substr(pos, end - pos);
    while (!word.empty() && word.front() == ' ') word.remove_prefix(1);
    while (!word.empty() && word.back() == ' ') word.remove_suffix(1);
    pos = end + 1;
    if (word.empty() || word == "none") continue;
    if (word == "init") o.init = true;
    else if (word == "bounds") o.bounds = true;
    else if (word == "sync") o.sync = true;
    else if (word == "race") o.race = true;
    else if (word == "banks") o.banks = true;
    else if (word == "all") o.init = o.bounds = o.sync = o.race = true;
    else if (word == "schedule=forward") o.order = ScheduleOrder::forward;
    else if (word == "schedule=reverse") o.order = ScheduleOrder::reverse;
    else if (word.starts_with("schedule=random:")) {
      std::string digits(word.substr(16));
      char* stop = nullptr;
      unsigned long long seed = digits.empty() ? 0 : std::strtoull(digits.c_str(), &stop, 10);
      if (digits.empty() || stop == nullptr || *stop != '\0') {
        return Error::invalid(fmt::format("sanitize: '{}': the seed of schedule=random:SEED must be a decimal "
                                          "number",
                                          word));
      }
      o.order = ScheduleOrder::random;
      o.seed = seed;
    } else {
      return Error::invalid(fmt::format("sanitize: unknown check '{}'; allowed: {}", word, allowed));
    }
  }
  return o;
}

Result<SanitizeOptions> sanitize_from_env() {
  const char* v = std::getenv("LUNAJIT_HOST_SANITIZE");
  if (v == nullptr || *v == '\0') return SanitizeOptions{};
  Result<SanitizeOptions> o = parse_sanitize(v);
  if (!o) return Error::invalid("LUNAJIT_HOST_SANITIZE: " + o.error().message);
  return o;
}

namespace {
std::atomic<std::uint64_t> g_launches{0}, g_findings{0};
}  // namespace

SanitizerTotals sanitizer_totals() { return {g_launches.load(), g_findings.load()}; }
void count_sanitized_launch(std::size_t findings) {
  g_launches.fetch_add(1, std::memory_order_relaxed);
  g_findings.fetch_add(findings, std::memory_order_relaxed);
}

}  // namespace lunajit::host
