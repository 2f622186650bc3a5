// Parsing of the host sanitizer options (see sanitizer.h).
#include "runtime/host/sanitizer.h"

#include <algorithm>
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

std::mutex g_bank_mu;
std::vector<KernelBankSite> g_bank_sites;

SanitizerTotals sanitizer_totals() { return {g_launches.load(), g_findings.load()}; }
void count_sanitized_launch(std::size_t findings) {
  g_launches.fetch_add(1, std::memory_order_relaxed);
  g_findings.fetch_add(findings, std::memory_order_relaxed);
}

void record_bank_sites(std::string_view kernel, const std::vector<BankSite>& sites) {
  std::lock_guard lock(g_bank_mu);
  for (const BankSite& b : sites) {
    auto it = std::find_if(g_bank_sites.begin(), g_bank_sites.end(), [&](const KernelBankSite& k) {
      return k.kernel == kernel && k.site.file == b.file && k.site.line == b.line && k.site.column == b.column &&
             k.site.bytes == b.bytes && k.site.write == b.write;
    });
    if (it == g_bank_sites.end()) {
      g_bank_sites.push_back({std::string(kernel), b});
    } else {
      it->site.executions += b.executions;
      it->site.wavefronts += b.wavefronts;
      it->site.ideal += b.ideal;
    }
  }
}

std::vector<KernelBankSite> bank_sites_so_far() {
  std::lock_guard lock(g_bank_mu);
  return g_bank_sites;
}

std::string bank_table(const std::vector<KernelBankSite>& sites_in, std::size_t limit) {
  std::vector<KernelBankSite> sites = sites_in;
  std::stable_sort(sites.begin(), sites.end(), [](const KernelBankSite& a, const KernelBankSite& b) {
    return a.site.wavefronts - a.site.ideal > b.site.wavefronts - b.site.ideal;
  });
  std::string out = fmt::format("{:<44} {:<34} {:>5} {:>9} {:>10} {:>8} {:>10}\n", "kernel", "site", "bytes",
                                "warp ops", "wavefronts", "ideal", "per op");
  std::uint64_t total = 0, ideal = 0;
  for (const KernelBankSite& k : sites) {
    total += k.site.wavefronts;
    ideal += k.site.ideal;
  }
  for (std::size_t i = 0; i < sites.size() && i < limit; ++i) {
    const BankSite& b = sites[i].site;
    std::string file = b.file;
    if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
    std::string kernel = sites[i].kernel;
    if (kernel.size() > 44) kernel = kernel.substr(0, 41) + "...";
    out += fmt::format("{:<44} {:<34} {:>5} {:>9} {:>10} {:>8} {:>10.2f}\n", kernel,
                       fmt::format("{}:{}:{} {}", file, b.line, b.column, b.write ? "st" : "ld"), b.bytes,
                       b.executions, b.wavefronts, b.ideal,
                       b.executions > 0 ? static_cast<double>(b.wavefronts) / b.executions : 0.0);
  }
  out += fmt::format("all {} sites: {} wavefronts, {} conflict-free ({:.2f}x)\n", sites.size(), total, ideal,
                     ideal > 0 ? static_cast<double>(total) / ideal : 1.0);
  return out;
}

}  // namespace lunajit::host
