// The host backend's sanitizers (README "Host sanitizers"): what a launch asks
// for, and what it found.
//
//   init    shared memory (dynamic and static) is filled with 0xFF (NaN in
//           every float type) when each block starts; a read of a word that no
//           thread of the block has written, or of a pending cp.async
//           destination, is a finding.
//   bounds  every global load and store must fall inside one of the launch's
//           buffers (the HostBackend's live allocations), shared accesses
//           inside the block's shared memory; accesses misaligned for their
//           type (e.g. a float4 load from an address not 16-byte aligned) are
//           findings. Checked before the access: never a segfault.
//   sync    the divergent-barrier and divergent-warp-operation errors (always
//           on), plus a warp operation whose mask excludes the calling lane or
//           names lanes past the end of a partial warp.
//   race    shadow state per shared-memory word (last writer, two readers, the
//           barrier interval and the warps' __syncwarp epochs of each):
//           read-after-write, write-after-read and write-after-write between
//           two threads with no barrier (or, within a warp, no warp-level
//           synchronisation) between them.
//   banks   shared-memory bank conflicts: per access site, the wavefronts each
//           warp-wide access needs (see BankSite).
//   schedule=forward|reverse|random:SEED  the order in which a block's threads
//           run between synchronisation points; with an instrumented check on,
//           random also preempts threads at shared-memory accesses, so the
//           interleaving inside barrier intervals varies too.
// A launch with any of them runs the instrumented variant of the kernel object
// (sanitizer_pass.h): every access is checked first, and the pass lowers the
// IR alignment of each access to 1 once checked, so a misaligned vector access
// is a finding under bounds and harmless otherwise (never a fault). The
// variant is also compiled without the vectorizers, so its floating-point
// results can differ from the plain object's (not between schedules).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace lunajit::host {

enum class ScheduleOrder { forward, reverse, random };

struct SanitizeOptions {
  bool init = false, bounds = false, sync = false, race = false, banks = false;
  ScheduleOrder order = ScheduleOrder::forward;
  std::uint64_t seed = 0;

  bool any() const { return init || bounds || sync || race || banks || order != ScheduleOrder::forward; }
  // "init,bounds,sync,race; schedule reverse" (what ran), or "none".
  std::string describe() const;
  bool operator==(const SanitizeOptions&) const = default;
};

// "init,bounds,sync,race,banks", "all" (the four checks), "none", and
// "schedule=forward|reverse|random:SEED", comma-separated, in any order. An
// unknown word is an invalid_argument error naming it and what is allowed.
Result<SanitizeOptions> parse_sanitize(std::string_view text);

// LUNAJIT_HOST_SANITIZE, parsed; unset or empty means no checks.
Result<SanitizeOptions> sanitize_from_env();

// One finding: the launch stops at the first one (per block) and returns it
// as an error; HostBackend::last_findings() keeps the structured form.
struct SanitizerFinding {
  std::string check;    // "init", "bounds", "sync", "race"
  std::string kernel;
  std::string block;    // "(1,0,0)"
  std::string threads;  // "(5,0,0)" or "(5,0,0) and (4,0,0)"
  std::string address;  // "dynamic shared memory +0x40", "global 0x... (buffer #2 of 4096 bytes, byte 4096)"
  std::string file;
  unsigned line = 0;
  std::string message;  // the whole sentence, as printed
};

// Bank conflicts of one shared-memory access site, summed over every
// warp-wide execution: `wavefronts` is what the hardware needs (32 banks of 4
// bytes; 32-bit accesses are served per warp, 64-bit per half-warp, 128-bit
// per quarter-warp; lanes reading the same word share it), `ideal` what a
// conflict-free access of the same width would need.
struct BankSite {
  std::string file;
  unsigned line = 0;
  unsigned column = 0;
  unsigned bytes = 0;          // access width
  bool write = false;
  std::uint64_t executions = 0;  // warp-wide executions
  std::uint64_t wavefronts = 0;
  std::uint64_t ideal = 0;
};

// What a sanitized launch leaves behind; filled by the blocks (thread-safe).
struct SanitizerReport {
  std::mutex mu;
  std::vector<SanitizerFinding> findings;
  std::vector<BankSite> banks;  // merged per (file, line, column, bytes, write)
  std::uint64_t async_copies = 0;  // cp.async copies the launch's threads issued (every block)
};

// Process-wide counts over every HostBackend: sanitized launches and findings
// (what `lunajit run --sanitize` reports after the run).
struct SanitizerTotals {
  std::uint64_t launches = 0;
  std::uint64_t findings = 0;
};
SanitizerTotals sanitizer_totals();
void count_sanitized_launch(std::size_t findings);

// Bank statistics of every launch with `banks` in this process, per kernel
// (name expression) and site, summed over launches.
struct KernelBankSite {
  std::string kernel;
  BankSite site;
};
void record_bank_sites(std::string_view kernel, const std::vector<BankSite>& sites);
std::vector<KernelBankSite> bank_sites_so_far();
// A table of the `limit` sites with the most wavefronts above ideal, as text.
std::string bank_table(const std::vector<KernelBankSite>& sites, std::size_t limit);

}  // namespace lunajit::host
