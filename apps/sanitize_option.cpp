#include "apps/sanitize_option.h"

#include <cstdio>
#include <cstdlib>

#include "runtime/host/sanitizer.h"

namespace lunajit {

int run_with_sanitize(const std::string& list, std::string& backend, const std::function<int()>& run) {
  if (list.empty()) return run();
  Result<host::SanitizeOptions> options = host::parse_sanitize(list);
  if (!options) {
    std::fprintf(stderr, "lunajit: --sanitize: %s\n", options.error().message.c_str());
    return 2;
  }
  if (backend == "cuda") {
    std::fprintf(stderr, "lunajit: --sanitize '%s': the sanitizers are the host backend's; allowed with --backend "
                         "host (or auto), not cuda\n",
                 list.c_str());
    return 2;
  }
  backend = "host";
  ::setenv("LUNAJIT_HOST_SANITIZE", list.c_str(), 1);
  const host::SanitizerTotals before = host::sanitizer_totals();
  const int code = run();
  const host::SanitizerTotals after = host::sanitizer_totals();
  const unsigned long long launches = after.launches - before.launches, findings = after.findings - before.findings;
  if (findings > 0) {
    std::fprintf(stderr, "lunajit: sanitizers (%s): %llu finding(s) in %llu sanitized launches\n",
                 options->describe().c_str(), findings, launches);
    return 1;
  }
  std::fprintf(stderr, "lunajit: sanitizers: %s: %s (%llu sanitized launches)\n", options->describe().c_str(),
               code == 0 ? "clean" : "no finding", launches);
  if (options->banks) {
    std::printf("shared-memory bank conflicts (block (0,0,0) of each launch; worst sites first):\n%s",
                host::bank_table(host::bank_sites_so_far(), 25).c_str());
  }
  return code;
}

}  // namespace lunajit
