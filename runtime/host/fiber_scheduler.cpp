// Fiber scheduler of the host emulator (see fiber_scheduler.h).
//
// Fibers are Boost.Context's raw fcontext (make_fcontext / jump_fcontext) on
// stacks this file owns, rather than boost::context::fiber: a block that cannot
// make progress is abandoned mid-kernel, and a `fiber` would unwind its stack
// with an exception through JIT'd frames that have no unwind tables
// (-fno-exceptions). An abandoned fcontext is simply forgotten; its stack is
// reused by the next block.
//
// One BlockRunner per OS thread runs one block at a time: a scheduler loop
// resumes every runnable fiber in thread order; a fiber runs until it finishes
// or waits (barrier, warp operation). The last thread to arrive at a barrier or
// warp rendezvous releases the others and continues without switching; a warp
// rendezvous computes every lane's result at release (shuffle sources, ballots,
// reductions), so no buffer is overwritten before a slow lane reads it. A pass
// over the block that resumes nothing while threads are alive is a deadlock and
// is reported, not waited for.
#include "runtime/host/fiber_scheduler.h"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/context/detail/fcontext.hpp>
#include <fmt/format.h>

#include "templates/lunajit/emulation/host_abi.h"

#if defined(__SANITIZE_ADDRESS__)
#define LUNAJIT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LUNAJIT_ASAN 1
#endif
#endif
#if defined(LUNAJIT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
// ThreadSanitizer: every fiber is a TSan fiber, switched to before each jump
// (the sanitizer's fiber API; without it TSan sees one thread jumping stacks).
#if defined(__SANITIZE_THREAD__)
#define LUNAJIT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LUNAJIT_TSAN 1
#endif
#endif
#if defined(LUNAJIT_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace lunajit::host {
namespace {

namespace fctx = boost::context::detail;

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxBlockThreads = 1024;

unsigned env_unsigned(const char* name, unsigned fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  unsigned long n = std::strtoul(v, &end, 10);
  return (end != nullptr && *end == '\0' && n > 0) ? static_cast<unsigned>(n) : fallback;
}

// ---- stacks -------------------------------------------------------------------

// Fiber stacks of one OS thread: one reservation for the largest block CUDA
// allows (so "is this address on a fiber stack" is one comparison), guard pages
// set up as stacks are first used.
class StackPool {
 public:
  StackPool() : bytes_(fiber_stack_bytes()), page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {
    total_ = (bytes_ + page_) * kMaxBlockThreads;
    void* base = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = base == MAP_FAILED ? nullptr : static_cast<char*>(base);
  }
  ~StackPool() {
    if (base_ != nullptr) munmap(base_, total_);
  }
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  // Lowest usable address of stack `i` (the guard page lies below it), or null.
  void* stack(std::size_t i) {
    if (base_ == nullptr || i >= kMaxBlockThreads) return nullptr;
    for (; guarded_ <= i; ++guarded_) mprotect(base_ + guarded_ * (bytes_ + page_), page_, PROT_NONE);
    return base_ + i * (bytes_ + page_) + page_;
  }
  std::size_t bytes() const { return bytes_; }
  bool contains(std::uintptr_t a) const {
    return a - reinterpret_cast<std::uintptr_t>(base_) < total_;
  }

 private:
  std::size_t bytes_;
  std::size_t page_;
  std::size_t total_ = 0;
  std::size_t guarded_ = 0;
  char* base_ = nullptr;
};

// ---- shared memory -------------------------------------------------------------

// Layout of LLVM's emulated-TLS control variable (`__emutls_v.<name>`), which
// -femulated-tls emits for every `__shared__` (static thread_local) variable.
struct EmutlsControl {
  std::size_t size;
  std::size_t align;
  std::uintptr_t index;  // 0 until first use; then ours (see emutls_get_address)
  const void* value;     // initializer template, or null
};

constexpr std::size_t kDynamicSmemMax = std::size_t{4} << 20;  // far above any GPU's 228 KiB
constexpr std::size_t kStaticSmemMax = std::size_t{1} << 20;
constexpr std::size_t kArenaBytes = kDynamicSmemMax + kStaticSmemMax;

// Shadow state of one 4-byte word of shared memory (race, init, cp.async).
struct Shadow {
  const LunajitEmuSite* w_site;
  const LunajitEmuSite* r_site;
  std::uint32_t w_epoch, r_epoch;   // barrier interval of the last write / reads (0: never)
  std::uint16_t writer, r1, r2;     // linear thread ids
  std::uint16_t w_we, r1_we, r2_we; // the thread's warp epoch at the access
  std::uint8_t flags;
};
constexpr std::uint8_t kWritten = 1, kPending = 2, kTwoReaders = 4;

// All shared memory of the blocks an OS thread runs: dynamic shared memory at
// the start, `__shared__` variables (placed by our __emutls_get_address) after
// kDynamicSmemMax, and, for the sanitizers, one Shadow per word. Reserved, not
// committed: pages appear as they are touched.
class SharedArena {
 public:
  SharedArena() {
    void* base = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = base == MAP_FAILED ? nullptr : static_cast<unsigned char*>(base);
  }
  ~SharedArena() {
    if (base_ != nullptr) munmap(base_, kArenaBytes);
    if (shadow_ != nullptr) munmap(shadow_, shadow_bytes());
  }
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  bool ok() const { return base_ != nullptr; }
  unsigned char* dynamic() const { return base_; }
  unsigned char* statics() const { return base_ + kDynamicSmemMax; }
  bool contains(std::uintptr_t a) const { return a - reinterpret_cast<std::uintptr_t>(base_) < kArenaBytes; }
  std::size_t offset(std::uintptr_t a) const { return a - reinterpret_cast<std::uintptr_t>(base_); }
  std::size_t static_used() const { return bump_; }
  std::size_t static_high_water() const { return high_water_; }

  Shadow* shadow() {
    if (shadow_ == nullptr) {
      void* p = mmap(nullptr, shadow_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      shadow_ = p == MAP_FAILED ? nullptr : static_cast<Shadow*>(p);
    }
    return shadow_;
  }

  // A new block: `__shared__` variables are placed afresh (their contents are
  // undefined at block start, like on the device).
  void reset_statics() {
    for (std::uintptr_t i : used_) slots_[i] = nullptr;
    used_.clear();
    bump_ = 0;
  }
  // The block's copy of the variable with emutls index `index`; null when the
  // static region is full.
  void* static_slot(std::uintptr_t index, const EmutlsControl* c, bool poison) {
    if (index < slots_.size() && slots_[index] != nullptr) return slots_[index];
    const std::size_t align = std::max<std::size_t>(c->align, 16);
    const std::size_t at = (bump_ + align - 1) / align * align;
    if (at + c->size > kStaticSmemMax) return nullptr;
    bump_ = at + c->size;
    high_water_ = std::max(high_water_, bump_);
    unsigned char* p = statics() + at;
    if (c->value != nullptr) {
      std::memcpy(p, c->value, c->size);
    } else {
      std::memset(p, poison ? 0xFF : 0, c->size);
    }
    if (index >= slots_.size()) slots_.resize(index + 1, nullptr);
    slots_[index] = p;
    used_.push_back(index);
    return p;
  }
  // "dynamic shared memory +0x40" / "static __shared__ +0x10" for an arena address.
  std::string describe(std::uintptr_t a) const {
    const std::size_t off = offset(a);
    if (off < kDynamicSmemMax) return fmt::format("dynamic shared memory +{:#x}", off);
    return fmt::format("static __shared__ memory +{:#x}", off - kDynamicSmemMax);
  }

 private:
  static constexpr std::size_t shadow_bytes() { return kArenaBytes / 4 * sizeof(Shadow); }
  unsigned char* base_ = nullptr;
  Shadow* shadow_ = nullptr;
  std::vector<void*> slots_;
  std::vector<std::uintptr_t> used_;
  std::size_t bump_ = 0;
  std::size_t high_water_ = 0;  // the most any block has used
};

std::atomic<std::uintptr_t> g_emutls_next_index{1};

// ---- one block ------------------------------------------------------------------

enum class FiberState : unsigned char { runnable, at_block_barrier, at_warp_op, finished };

struct Fiber {
  fctx::fcontext_t context = nullptr;
  FiberState state = FiberState::runnable;
  LunajitEmuDim3 idx{};
  // The warp operation this thread waits at, and its result once released.
  int op = 0;
  unsigned mask = 0;
  unsigned long long value = 0;
  int param = 0;
  int width = 32;
  unsigned long long result = 0;
  // lunajit_emu_warp_collective: what the lane waits at.
  LunajitEmuCollectiveFn collective = nullptr;
  const char* collective_what = nullptr;
  const char* file = nullptr;
  int line = 0;
  // cp.async: the open group and the committed, pending ones (oldest first).
  struct AsyncCopy {
    unsigned char* dst;
    const unsigned char* src;
    unsigned bytes, src_bytes;
    int line;
  };
  std::vector<AsyncCopy> open_copies;
  std::deque<std::vector<AsyncCopy>> pending_groups;
#if defined(LUNAJIT_ASAN)
  void* fake_stack = nullptr;
#endif
#if defined(LUNAJIT_TSAN)
  void* tsan_fiber = nullptr;
#endif
};

const char* warp_op_name(int op) {
  switch (op) {
    case LUNAJIT_EMU_SYNCWARP: return "__syncwarp";
    case LUNAJIT_EMU_SHFL_IDX: return "__shfl_sync";
    case LUNAJIT_EMU_SHFL_UP: return "__shfl_up_sync";
    case LUNAJIT_EMU_SHFL_DOWN: return "__shfl_down_sync";
    case LUNAJIT_EMU_SHFL_XOR: return "__shfl_xor_sync";
    case LUNAJIT_EMU_BALLOT: return "__ballot_sync";
    case LUNAJIT_EMU_ANY: return "__any_sync";
    case LUNAJIT_EMU_ALL: return "__all_sync";
    case LUNAJIT_EMU_REDUCE_ADD: return "__reduce_add_sync";
    case LUNAJIT_EMU_REDUCE_MIN: return "__reduce_min_sync";
    case LUNAJIT_EMU_REDUCE_MAX: return "__reduce_max_sync";
    case LUNAJIT_EMU_COLLECTIVE: return "a warp collective (mma/ldmatrix)";
    default: return "a warp operation";
  }
}

std::string dim_text(const LunajitEmuDim3& d) { return fmt::format("({},{},{})", d.x, d.y, d.z); }

// Runs blocks on the OS thread that owns it.
class BlockRunner {
 public:
  // Runs block `block_idx` of `launch` to completion; the error names the thread.
  Status run(const GridLaunch& launch, LunajitEmuDim3 block_idx);

  // Called by the kernel through host_abi.h, on the current fiber.
  int syncthreads(int predicate);
  unsigned long long warp_op(int op, unsigned mask, unsigned long long value, int param, int width);
  void warp_collective(LunajitEmuCollectiveFn fn, const char* what, unsigned mask, void* payload, const char* file,
                       int line);
  void cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes, int line);
  void cp_async_commit();
  void cp_async_wait(int pending, int line);
  void access(const void* address, unsigned long long bytes, unsigned flags, const LunajitEmuSite* site);
  void* emutls_address(EmutlsControl* c);
  [[noreturn]] void trap(const char* what);

 private:
  static void fiber_main(fctx::transfer_t t);
  void resume(unsigned i);
  void yield();
  [[noreturn]] void yield_forever();
  void fail(std::string message);
  void complete_warp_op(unsigned warp, unsigned mask);
  void complete_collective(unsigned warp, unsigned mask);
  void complete_copies(Fiber& f, std::vector<Fiber::AsyncCopy>& group, int wait_line);
  std::string site_text(const Fiber& f) const;
  void shared_access(std::uintptr_t a, unsigned long long bytes, bool write, const LunajitEmuSite* site);
  void record_bank_access(std::uintptr_t a, unsigned long long bytes, bool write, const LunajitEmuSite* site);
  void flush_bank_stats();
  // A sanitizer finding: recorded, the block aborted, the access never made.
  // Records a sanitizer finding and fails the block; the caller then calls
  // yield_forever() in a statement of its own. A fiber that yields forever is
  // abandoned with its stack: anything a live frame owns on the heap (the
  // arguments' string temporaries, a local vector) would leak, so nothing may
  // own memory at that point (LeakSanitizer checks it in the ASan build).
  void record_finding(const char* check, std::string threads, std::string address, const LunajitEmuSite* site,
                      std::string message);
  void mark_copies(const std::vector<Fiber::AsyncCopy>& group, bool pending);
  std::vector<unsigned> schedule_order(const LunajitEmuDim3& block);
  unsigned warp_lanes(unsigned warp) const {
    unsigned n = std::min(kWarpSize, n_ - warp * kWarpSize);
    return n == kWarpSize ? 0xffffffffu : ((1u << n) - 1);
  }
  std::string deadlock_message() const;
  std::string thread_text(unsigned i) const { return dim_text(fibers_[i].idx); }

  StackPool stacks_;
  std::vector<Fiber> fibers_;
  std::vector<unsigned> warp_arrived_;   // lanes waiting at a warp operation, per warp
  std::vector<unsigned> warp_finished_;  // lanes that returned from the kernel, per warp
  SharedArena arena_;
  const SanitizeOptions* san_ = nullptr;  // null: plain run
  bool shadowing_ = false;                // init or race: keep the Shadow up to date
  std::uint32_t barrier_epoch_ = 1;
  std::vector<std::uint16_t> warp_epoch_;
  std::size_t dynamic_bytes_ = 0;
  std::mt19937_64 preempt_rng_;
  bool in_collective_ = false;
  std::optional<SanitizerFinding> finding_;
  // banks: per (warp, site, barrier epoch, occurrence since the epoch began)
  // the lanes' addresses, for block (0,0,0). The occurrence is a lane's count
  // of its own executions of the site, so lanes that executed it a different
  // number of times (a divergent branch: e.g. 8 lanes of a warp through an
  // inlined helper whose stores other code also reaches) would pair one
  // call's accesses with another's and report conflicts no instruction has;
  // the block barrier realigns them (every thread passes each one).
  bool count_banks_ = false;
  std::uint64_t async_copies_ = 0;  // cp.async copies this block issued
  struct BankKey {
    const LunajitEmuSite* site;
    unsigned warp;
    std::uint32_t epoch;
    unsigned occurrence;
    bool operator==(const BankKey&) const = default;
  };
  struct BankKeyHash {
    std::size_t operator()(const BankKey& k) const {
      return std::hash<const void*>()(k.site) ^ (std::size_t{k.warp} << 40) ^
             (std::size_t{k.occurrence} * 0x9E3779B97F4A7C15ull) ^ (std::size_t{k.epoch} * 0xC2B2AE3D27D4EB4Full);
    }
  };
  struct BankGroup {
    unsigned bytes = 0;
    bool write = false;
    unsigned lanes = 0;
    std::uintptr_t address[32] = {};
  };
  std::unordered_map<BankKey, BankGroup, BankKeyHash> bank_groups_;
  std::vector<std::unordered_map<const LunajitEmuSite*, unsigned>> bank_occurrence_;  // per thread
  const GridLaunch* launch_ = nullptr;
  unsigned n_ = 0;
  unsigned current_ = 0;
  unsigned barrier_arrived_ = 0;
  int barrier_count_ = 0;
  int barrier_result_ = 0;
  std::optional<std::string> failure_;
  fctx::fcontext_t scheduler_ = nullptr;
#if defined(LUNAJIT_ASAN)
  void* scheduler_fake_stack_ = nullptr;
  const void* scheduler_stack_bottom_ = nullptr;
  std::size_t scheduler_stack_size_ = 0;
#endif
#if defined(LUNAJIT_TSAN)
  void* scheduler_tsan_fiber_ = nullptr;
#endif
};

thread_local LunajitEmuContext t_context{};
thread_local BlockRunner* t_runner = nullptr;

BlockRunner& this_thread_runner() {
  thread_local BlockRunner runner;
  return runner;
}

void BlockRunner::fiber_main(fctx::transfer_t t) {
  BlockRunner* self = static_cast<BlockRunner*>(t.data);
  self->scheduler_ = t.fctx;
#if defined(LUNAJIT_ASAN)
  Fiber& me = self->fibers_[self->current_];
  __sanitizer_finish_switch_fiber(me.fake_stack, &self->scheduler_stack_bottom_, &self->scheduler_stack_size_);
#endif
  self->launch_->entry(self->launch_->args);
  Fiber& f = self->fibers_[self->current_];
  // A thread that exits with copies in flight: they still land (the block's
  // other threads may wait on them through a barrier).
  if (!f.open_copies.empty()) f.pending_groups.push_back(std::move(f.open_copies));
  while (!f.pending_groups.empty() && !self->failure_) {
    std::vector<Fiber::AsyncCopy> g = std::move(f.pending_groups.front());
    f.pending_groups.pop_front();
    self->complete_copies(f, g, 0);
  }
  f.state = FiberState::finished;
  self->yield_forever();
}

void BlockRunner::resume(unsigned i) {
  Fiber& f = fibers_[i];
  current_ = i;
  t_context.thread_idx = f.idx;
#if defined(LUNAJIT_ASAN)
  __sanitizer_start_switch_fiber(&scheduler_fake_stack_, stacks_.stack(i), stacks_.bytes());
#endif
#if defined(LUNAJIT_TSAN)
  __tsan_switch_to_fiber(f.tsan_fiber, 0);
#endif
  fctx::transfer_t t = fctx::jump_fcontext(f.context, this);
#if defined(LUNAJIT_ASAN)
  __sanitizer_finish_switch_fiber(scheduler_fake_stack_, nullptr, nullptr);
#endif
  f.context = t.fctx;
}

void BlockRunner::yield() {
#if defined(LUNAJIT_ASAN)
  Fiber& me = fibers_[current_];
  __sanitizer_start_switch_fiber(&me.fake_stack, scheduler_stack_bottom_, scheduler_stack_size_);
#endif
#if defined(LUNAJIT_TSAN)
  __tsan_switch_to_fiber(scheduler_tsan_fiber_, 0);
#endif
  fctx::transfer_t t = fctx::jump_fcontext(scheduler_, nullptr);
  scheduler_ = t.fctx;
#if defined(LUNAJIT_ASAN)
  __sanitizer_finish_switch_fiber(me.fake_stack, &scheduler_stack_bottom_, &scheduler_stack_size_);
#endif
}

void BlockRunner::yield_forever() {
#if defined(LUNAJIT_ASAN)
  __sanitizer_start_switch_fiber(nullptr, scheduler_stack_bottom_, scheduler_stack_size_);
#endif
#if defined(LUNAJIT_TSAN)
  __tsan_switch_to_fiber(scheduler_tsan_fiber_, 0);
#endif
  fctx::jump_fcontext(scheduler_, nullptr);
  std::abort();  // never resumed: the scheduler forgets finished and abandoned fibers
}

void BlockRunner::fail(std::string message) {
  if (!failure_) failure_ = std::move(message);
}

void BlockRunner::trap(const char* what) {
  fail(fmt::format("thread {} called {}", thread_text(current_), what));
  yield_forever();
}

int BlockRunner::syncthreads(int predicate) {
  barrier_count_ += predicate != 0;
  if (++barrier_arrived_ == n_) {
    // Last to arrive: release everyone. `barrier_result_` is not overwritten
    // before the released threads read it, since that needs all of them here again.
    barrier_result_ = barrier_count_;
    barrier_count_ = 0;
    barrier_arrived_ = 0;
    ++barrier_epoch_;
    if (count_banks_)
      for (auto& occurrences : bank_occurrence_) occurrences.clear();  // counted afresh in the new epoch
    for (Fiber& f : fibers_) {
      if (f.state == FiberState::at_block_barrier) f.state = FiberState::runnable;
    }
    return barrier_result_;
  }
  fibers_[current_].state = FiberState::at_block_barrier;
  yield();
  return barrier_result_;
}

unsigned long long BlockRunner::warp_op(int op, unsigned mask, unsigned long long value, int param,
                                        int width) {
  const unsigned warp = current_ / kWarpSize;
  const unsigned lane = current_ % kWarpSize;
  if (op == LUNAJIT_EMU_ACTIVEMASK) return warp_lanes(warp) & ~warp_finished_[warp];
  if (san_ != nullptr && san_->sync && ((mask >> lane & 1u) == 0 || (mask & ~warp_lanes(warp)) != 0)) {
    record_finding("sync", thread_text(current_), "", nullptr,
           fmt::format("warp {}: thread {} (lane {}) calls {} with mask {:#010x}, which {}: every calling lane must be "
                       "in the mask, and the mask may name only lanes that exist",
                       warp, thread_text(current_), lane, warp_op_name(op), mask,
                       (mask >> lane & 1u) == 0 ? "excludes the calling lane"
                                               : fmt::format("names lanes past the end of this {}-lane warp",
                                                             __builtin_popcount(warp_lanes(warp)))));
    yield_forever();
  }
  // Lanes beyond a partial last warp do not exist; a lane always takes part in its own operation.
  mask = (mask & warp_lanes(warp)) | (1u << lane);
  Fiber& me = fibers_[current_];
  me.op = op;
  me.mask = mask;
  me.value = value;
  me.param = param;
  me.width = (width >= 1 && width <= 32 && (width & (width - 1)) == 0) ? width : 32;
  warp_arrived_[warp] |= 1u << lane;
  if ((warp_arrived_[warp] & mask) == mask) {
    complete_warp_op(warp, mask);
    if (failure_) yield_forever();
    return me.result;
  }
  me.state = FiberState::at_warp_op;
  yield();
  return me.result;
}

// Every lane of `mask` has arrived: compute each one's result, as CUDA defines it
// (shfl: a source lane outside the width segment or outside the mask yields the
// lane's own value), and release them.
void BlockRunner::complete_warp_op(unsigned warp, unsigned mask) {
  Fiber* lanes = &fibers_[warp * kWarpSize];
  const Fiber& first = lanes[__builtin_ctz(mask)];
  for (unsigned m = mask; m != 0; m &= m - 1) {
    if (lanes[__builtin_ctz(m)].op == LUNAJIT_EMU_COLLECTIVE) return complete_collective(warp, mask);
  }
  for (unsigned m = mask; m != 0; m &= m - 1) {
    const Fiber& f = lanes[__builtin_ctz(m)];
    bool both_syncwarp = f.op == LUNAJIT_EMU_SYNCWARP && first.op == LUNAJIT_EMU_SYNCWARP;
    if (f.mask != first.mask || (f.op != first.op && !both_syncwarp)) {
      fail(fmt::format("warp {}: thread {} is at {} with mask {:#010x} while thread {} is at {} with mask {:#010x}; "
                       "all lanes named in a mask must execute the same warp operation with the same mask",
                       warp, dim_text(first.idx), warp_op_name(first.op), first.mask, dim_text(f.idx),
                       warp_op_name(f.op), f.mask));
      return;
    }
  }
  unsigned long long ballot = 0, sum = 0;
  long long smin = 0, smax = 0;
  unsigned long long umin = ~0ull, umax = 0;
  bool is_first = true;
  for (unsigned m = mask; m != 0; m &= m - 1) {
    unsigned l = __builtin_ctz(m);
    const Fiber& f = lanes[l];
    ballot |= static_cast<unsigned long long>(f.value != 0) << l;
    unsigned u = static_cast<unsigned>(f.value);
    int s = static_cast<int>(u);
    sum += u;
    smin = is_first ? s : std::min<long long>(smin, s);
    smax = is_first ? s : std::max<long long>(smax, s);
    umin = std::min<unsigned long long>(umin, u);
    umax = std::max<unsigned long long>(umax, u);
    is_first = false;
  }
  for (unsigned m = mask; m != 0; m &= m - 1) {
    const unsigned l = __builtin_ctz(m);
    Fiber& f = lanes[l];
    const unsigned w = static_cast<unsigned>(f.width);
    const unsigned segment = l & ~(w - 1);
    const unsigned p = static_cast<unsigned>(f.param);
    unsigned src = l;
    switch (f.op) {
      case LUNAJIT_EMU_SHFL_IDX: src = segment | (p & (w - 1)); break;
      case LUNAJIT_EMU_SHFL_UP: src = (l - segment) >= p ? l - p : l; break;
      case LUNAJIT_EMU_SHFL_DOWN: src = (l - segment) + p < w ? l + p : l; break;
      case LUNAJIT_EMU_SHFL_XOR: src = (l ^ p) < segment + w ? (l ^ p) : l; break;
      default: break;
    }
    switch (f.op) {
      case LUNAJIT_EMU_SHFL_IDX:
      case LUNAJIT_EMU_SHFL_UP:
      case LUNAJIT_EMU_SHFL_DOWN:
      case LUNAJIT_EMU_SHFL_XOR:
        f.result = (src < kWarpSize && (mask >> src & 1u)) ? lanes[src].value : f.value;
        break;
      case LUNAJIT_EMU_BALLOT: f.result = ballot; break;
      case LUNAJIT_EMU_ANY: f.result = ballot != 0; break;
      case LUNAJIT_EMU_ALL: f.result = ballot == mask; break;
      case LUNAJIT_EMU_REDUCE_ADD: f.result = static_cast<unsigned>(sum); break;
      case LUNAJIT_EMU_REDUCE_MIN:
        f.result = f.param ? static_cast<unsigned>(static_cast<int>(smin)) : umin;
        break;
      case LUNAJIT_EMU_REDUCE_MAX:
        f.result = f.param ? static_cast<unsigned>(static_cast<int>(smax)) : umax;
        break;
      default: f.result = 0; break;
    }
    if (f.state == FiberState::at_warp_op) f.state = FiberState::runnable;
  }
  warp_arrived_[warp] &= ~mask;
  ++warp_epoch_[warp];
}

std::string BlockRunner::site_text(const Fiber& f) const {
  if (f.op != LUNAJIT_EMU_COLLECTIVE) return warp_op_name(f.op);
  const char* file = f.file != nullptr ? f.file : "?";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  return fmt::format("{} at {}:{}", f.collective_what, file, f.line);
}

void BlockRunner::warp_collective(LunajitEmuCollectiveFn fn, const char* what, unsigned mask, void* payload,
                                  const char* file, int line) {
  const unsigned warp = current_ / kWarpSize;
  const unsigned lane = current_ % kWarpSize;
  Fiber& me = fibers_[current_];
  me.op = LUNAJIT_EMU_COLLECTIVE;
  me.mask = mask;
  me.value = reinterpret_cast<unsigned long long>(payload);
  me.collective = fn;
  me.collective_what = what;
  me.file = file;
  me.line = line;
  if (mask != 0xffffffffu || warp_lanes(warp) != 0xffffffffu) {
    fail(fmt::format("warp {}: thread {} is at {} with mask {:#010x} in a warp of {} lanes: the instruction needs "
                     "all 32 lanes of a full warp",
                     warp, thread_text(current_), site_text(me), mask, __builtin_popcount(warp_lanes(warp))));
    yield_forever();
  }
  warp_arrived_[warp] |= 1u << lane;
  if ((warp_arrived_[warp] & mask) == mask) {
    complete_warp_op(warp, mask);
    if (failure_) yield_forever();
    return;
  }
  me.state = FiberState::at_warp_op;
  yield();
}

// Every lane of `mask` is at a collective: the same one everywhere, or an error.
void BlockRunner::complete_collective(unsigned warp, unsigned mask) {
  Fiber* lanes = &fibers_[warp * kWarpSize];
  const Fiber& first = lanes[__builtin_ctz(mask)];
  for (unsigned m = mask; m != 0; m &= m - 1) {
    const Fiber& f = lanes[__builtin_ctz(m)];
    const bool same = f.op == LUNAJIT_EMU_COLLECTIVE && first.op == LUNAJIT_EMU_COLLECTIVE &&
                      f.collective == first.collective && f.mask == first.mask && f.line == first.line &&
                      std::strcmp(f.collective_what, first.collective_what) == 0 &&
                      (f.file == first.file || std::strcmp(f.file, first.file) == 0);
    if (!same) {
      fail(fmt::format("warp {}: thread {} is at {} (mask {:#010x}) while thread {} is at {} (mask {:#010x}); "
                       "every lane of the warp must execute the same warp-level matrix instruction",
                       warp, dim_text(first.idx), site_text(first), first.mask, dim_text(f.idx), site_text(f),
                       f.mask));
      return;
    }
  }
  void* payloads[kWarpSize] = {};
  for (unsigned m = mask; m != 0; m &= m - 1) {
    const unsigned l = __builtin_ctz(m);
    payloads[l] = reinterpret_cast<void*>(lanes[l].value);
  }
  ++warp_epoch_[warp];  // the lanes' earlier accesses are ordered before the collective's
  in_collective_ = true;
  first.collective(payloads, mask);  // may trap (fails the block and never returns)
  in_collective_ = false;
  for (unsigned m = mask; m != 0; m &= m - 1) {
    Fiber& f = lanes[__builtin_ctz(m)];
    if (f.state == FiberState::at_warp_op) f.state = FiberState::runnable;
  }
  warp_arrived_[warp] &= ~mask;
}

void BlockRunner::cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes, int line) {
  Fiber& me = fibers_[current_];
  const auto d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
  if (d % bytes != 0 || s % bytes != 0) {
    fail(fmt::format("thread {}: cp.async of {} bytes at line {} with a misaligned address (dst {:#x}, src {:#x}; "
                     "both must be {}-byte aligned)",
                     thread_text(current_), bytes, line, d, s, bytes));
    yield_forever();
  }
  std::memset(dst, 0xFF, bytes);  // poison: NaN in every float type until the wait
  ++async_copies_;
  me.open_copies.push_back(
      {static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes, src_bytes, line});
  mark_copies({me.open_copies.back()}, true);
}

void BlockRunner::cp_async_commit() {
  Fiber& me = fibers_[current_];
  me.pending_groups.push_back(std::move(me.open_copies));  // an empty group is allowed
  me.open_copies.clear();
}

void BlockRunner::cp_async_wait(int pending, int line) {
  Fiber& me = fibers_[current_];
  while (me.pending_groups.size() > static_cast<std::size_t>(std::max(pending, 0))) {
    {  // g is freed before a failed block's fiber is abandoned (see record_finding)
      std::vector<Fiber::AsyncCopy> g = std::move(me.pending_groups.front());
      me.pending_groups.pop_front();
      complete_copies(me, g, line);
    }
    if (failure_) yield_forever();
  }
}

// Lands a group of copies; the destinations must still hold the poison.
void BlockRunner::complete_copies(Fiber& f, std::vector<Fiber::AsyncCopy>& group, int wait_line) {
  for (const Fiber::AsyncCopy& c : group) {
    for (unsigned i = 0; i < c.bytes; ++i) {
      if (c.dst[i] != 0xFF) {
        fail(fmt::format("thread {}: the destination of the cp.async issued at line {} was written while the copy was "
                         "pending (byte {} of {}; found at the wait_group {}): a cp.async destination may be touched "
                         "only after the wait_group that covers it",
                         dim_text(f.idx), c.line, i, c.bytes,
                         wait_line > 0 ? fmt::format("at line {}", wait_line) : std::string("at thread exit")));
        return;
      }
    }
    std::memcpy(c.dst, c.src, c.src_bytes);
    if (c.src_bytes < c.bytes) std::memset(c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
  }
  mark_copies(group, false);
}

// ---- sanitizers -------------------------------------------------------------------

std::string site_location(const LunajitEmuSite* site) {
  if (site == nullptr) return "?";
  const char* file = site->file != nullptr ? site->file : "?";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  return fmt::format("{}:{}:{}", file, site->line, site->column);
}

void BlockRunner::record_finding(const char* check, std::string threads, std::string address,
                                 const LunajitEmuSite* site, std::string message) {
  if (!finding_) {
    SanitizerFinding f;
    f.check = check;
    f.kernel = std::string(launch_->kernel_name);
    f.block = dim_text(t_context.block_idx);
    f.threads = std::move(threads);
    f.address = std::move(address);
    if (site != nullptr) {
      f.file = site->file != nullptr ? site->file : "";
      f.line = site->line;
    }
    f.message = fmt::format("sanitizer [{}]: kernel '{}': block {}: {}", check, f.kernel, f.block, message);
    finding_ = std::move(f);
  }
  fail(fmt::format("sanitizer [{}]: {}", check, message));
}

void BlockRunner::access(const void* address, unsigned long long bytes, unsigned flags, const LunajitEmuSite* site) {
  if (san_ == nullptr || failure_) return;
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  const bool write = (flags & LUNAJIT_EMU_ACCESS_WRITE) != 0;
  const std::uintptr_t align = std::uintptr_t{1} << ((flags >> LUNAJIT_EMU_ACCESS_ALIGN_SHIFT) & 0x3f);
  const char* verb = write ? "store" : "load";
  if (san_->bounds && align > 1 && a % align != 0) {
    record_finding("bounds", thread_text(current_), fmt::format("{:#x}", a), site,
           fmt::format("thread {}: misaligned {}-byte {} at {:#x} ({}; the type needs {}-byte alignment) at {}",
                       thread_text(current_), bytes, verb, a,
                       arena_.contains(a) ? arena_.describe(a) : std::string("global memory"), align,
                       site_location(site)));
    yield_forever();
  }
  if (arena_.contains(a)) {
    const std::size_t off = arena_.offset(a);
    if (san_->bounds) {
      const bool in_dynamic = off < kDynamicSmemMax;
      const std::size_t limit = in_dynamic ? dynamic_bytes_ : kDynamicSmemMax + arena_.static_used();
      if (off + bytes > limit) {
        record_finding("bounds", thread_text(current_), arena_.describe(a), site,
               fmt::format("thread {}: {}-byte {} at {} is outside the block's {} ({} bytes) at {}",
                           thread_text(current_), bytes, verb, arena_.describe(a),
                           in_dynamic ? "dynamic shared memory" : "static __shared__ variables",
                           in_dynamic ? dynamic_bytes_ : arena_.static_used(), site_location(site)));
        yield_forever();
      }
    }
    if (shadowing_) shared_access(a, bytes, write, site);
    if (count_banks_) record_bank_access(a, bytes, write, site);
    // random schedule: preempt now and then, so barrier intervals interleave.
    if (san_->order == ScheduleOrder::random && !in_collective_ && (preempt_rng_() & 15) == 0) yield();
    return;
  }
  if (!san_->bounds || stacks_.contains(a)) return;
  if (a - reinterpret_cast<std::uintptr_t>(&t_context) < sizeof(t_context)) return;
  const std::span<const MemoryRange> bufs = launch_->buffers;
  auto it = std::upper_bound(bufs.begin(), bufs.end(), a, [](std::uintptr_t x, const MemoryRange& r) { return x < r.begin; });
  if (it != bufs.begin()) {
    const MemoryRange& r = *(it - 1);
    if (a + bytes <= r.begin + r.bytes) return;
    if (a < r.begin + r.bytes || a - (r.begin + r.bytes) < 4096) {
      record_finding("bounds", thread_text(current_), fmt::format("{:#x}", a), site,
             fmt::format("thread {}: out-of-bounds {}-byte {} at {} of buffer #{} ({} bytes at {:#x}): byte offset {} "
                         "(element {} of {} bytes), {} bytes past the end",
                         thread_text(current_), bytes, verb, site_location(site), r.id, r.bytes, r.begin,
                         a - r.begin, (a - r.begin) / std::max<unsigned long long>(bytes, 1), bytes,
                         a + bytes - (r.begin + r.bytes)));
      yield_forever();
    }
  }
  if (it != bufs.end() && it->begin - a < 4096) {
    record_finding("bounds", thread_text(current_), fmt::format("{:#x}", a), site,
           fmt::format("thread {}: out-of-bounds {}-byte {} at {}: {} bytes before buffer #{} ({} bytes at {:#x})",
                       thread_text(current_), bytes, verb, site_location(site), it->begin - a, it->id, it->bytes,
                       it->begin));
    yield_forever();
  }
  record_finding("bounds", thread_text(current_), fmt::format("{:#x}", a), site,
         fmt::format("thread {}: {}-byte {} at {:#x} at {} is in none of the launch's {} buffers", thread_text(current_),
                     bytes, verb, a, site_location(site), bufs.size()));
  yield_forever();
}

// init, race and cp.async checks on the words [a, a + bytes) of shared memory.
void BlockRunner::shared_access(std::uintptr_t a, unsigned long long bytes, bool write, const LunajitEmuSite* site) {
  Shadow* shadow = arena_.shadow();
  if (shadow == nullptr || bytes == 0) return;
  const std::size_t first = arena_.offset(a) / 4, last = (arena_.offset(a) + bytes - 1) / 4;
  const auto me = static_cast<std::uint16_t>(current_);
  const unsigned warp = current_ / kWarpSize;
  const std::uint16_t we = warp_epoch_[warp];
  // Two accesses of one barrier interval are ordered when made by one thread,
  // or by two lanes of one warp with a warp synchronisation between them.
  auto unordered = [&](std::uint16_t other, std::uint16_t other_we) {
    return other != me && (other / kWarpSize != warp || other_we == we);
  };
  for (std::size_t w = first; w <= last && w < kArenaBytes / 4; ++w) {
    Shadow& sh = shadow[w];
    const std::uintptr_t word = reinterpret_cast<std::uintptr_t>(arena_.dynamic()) + w * 4;
    if (san_->init && (sh.flags & kPending) != 0) {
      record_finding("init", thread_text(current_), arena_.describe(word), site,
             fmt::format("thread {}: {} of {} at {}, the destination of a cp.async that has not completed (issue a "
                         "cp.async.wait_group covering it first)",
                         thread_text(current_), write ? "store" : "load", arena_.describe(word), site_location(site)));
      yield_forever();
    }
    if (san_->init && !write && (sh.flags & kWritten) == 0) {
      record_finding("init", thread_text(current_), arena_.describe(word), site,
             fmt::format("thread {}: load of uninitialised {} at {}: no thread of the block has written it",
                         thread_text(current_), arena_.describe(word), site_location(site)));
      yield_forever();
    }
    if (san_->race) {
      auto race = [&](const char* kind, std::uint16_t other, const LunajitEmuSite* other_site, const char* what) {
        record_finding("race", fmt::format("{} and {}", thread_text(current_), thread_text(other)), arena_.describe(word), site,
               fmt::format("{} race on {}: thread {} {} it at {}; thread {} {} it at {} in the same barrier interval "
                           "(no __syncthreads{} between them)",
                           kind, arena_.describe(word), thread_text(current_), write ? "writes" : "reads",
                           site_location(site), thread_text(other), what, site_location(other_site),
                           other / kWarpSize == warp ? " or __syncwarp" : ""));
        yield_forever();
      };
      if (sh.w_epoch == barrier_epoch_ && unordered(sh.writer, sh.w_we)) {
        race(write ? "write-after-write" : "read-after-write", sh.writer, sh.w_site, "wrote");
      }
      if (write && sh.r_epoch == barrier_epoch_) {
        if (unordered(sh.r1, sh.r1_we)) race("write-after-read", sh.r1, sh.r_site, "read");
        if ((sh.flags & kTwoReaders) != 0 && unordered(sh.r2, sh.r2_we)) race("write-after-read", sh.r2, sh.r_site, "read");
      }
    }
    if (write) {
      sh.flags |= kWritten;
      sh.w_epoch = barrier_epoch_;
      sh.writer = me;
      sh.w_we = we;
      sh.w_site = site;
    } else if (sh.r_epoch != barrier_epoch_) {
      sh.r_epoch = barrier_epoch_;
      sh.r1 = me;
      sh.r1_we = we;
      sh.r_site = site;
      sh.flags &= static_cast<std::uint8_t>(~kTwoReaders);
    } else if (sh.r1 == me) {
      sh.r1_we = we;
    } else {
      sh.r2 = me;
      sh.r2_we = we;
      sh.flags |= kTwoReaders;
    }
  }
}

// cp.async destinations: pending at issue; written by the thread when landed.
void BlockRunner::mark_copies(const std::vector<Fiber::AsyncCopy>& group, bool pending) {
  if (!shadowing_) return;
  Shadow* shadow = arena_.shadow();
  if (shadow == nullptr) return;
  for (const Fiber::AsyncCopy& c : group) {
    const auto a = reinterpret_cast<std::uintptr_t>(c.dst);
    if (!arena_.contains(a)) continue;
    for (std::size_t w = arena_.offset(a) / 4; w <= (arena_.offset(a) + c.bytes - 1) / 4; ++w) {
      Shadow& sh = shadow[w];
      if (pending) {
        sh.flags |= kPending;
      } else {
        sh.flags = static_cast<std::uint8_t>((sh.flags & ~kPending) | kWritten);
        sh.w_epoch = barrier_epoch_;
        sh.writer = static_cast<std::uint16_t>(current_);
        sh.w_we = warp_epoch_[current_ / kWarpSize];
        sh.w_site = nullptr;
      }
    }
  }
}

void BlockRunner::record_bank_access(std::uintptr_t a, unsigned long long bytes, bool write,
                                     const LunajitEmuSite* site) {
  if (bytes == 0 || bytes > 16 || in_collective_) return;
  unsigned& occurrence = bank_occurrence_[current_][site];
  BankGroup& g = bank_groups_[BankKey{site, current_ / kWarpSize, barrier_epoch_, occurrence++}];
  g.bytes = static_cast<unsigned>(bytes);
  g.write = write;
  g.lanes |= 1u << (current_ % kWarpSize);
  g.address[current_ % kWarpSize] = a;
}

// Wavefronts of every recorded warp-wide access, summed per site into the report.
void BlockRunner::flush_bank_stats() {
  if (bank_groups_.empty()) return;
  struct Sum {
    BankSite site;
  };
  std::unordered_map<const LunajitEmuSite*, BankSite> sums;
  for (const auto& [key, g] : bank_groups_) {
    const unsigned width = g.bytes <= 4 ? 4 : (g.bytes <= 8 ? 8 : 16);
    const unsigned lanes_per_phase = 128 / width;  // 32, 16 or 8
    std::uint64_t wavefronts = 0, ideal = 0;
    for (unsigned phase = 0; phase < 32 / lanes_per_phase; ++phase) {
      // distinct 4-byte words per bank among this phase's lanes
      std::uint64_t words[32][8];
      unsigned count[32] = {};
      bool any = false;
      for (unsigned l = phase * lanes_per_phase; l < (phase + 1) * lanes_per_phase; ++l) {
        if ((g.lanes >> l & 1u) == 0) continue;
        any = true;
        for (std::uintptr_t w = g.address[l] / 4; w <= (g.address[l] + g.bytes - 1) / 4; ++w) {
          const unsigned bank = w % 32;
          bool seen = false;
          for (unsigned i = 0; i < count[bank] && i < 8; ++i) seen |= words[bank][i] == w;
          if (!seen) {
            if (count[bank] < 8) words[bank][count[bank]] = w;
            ++count[bank];
          }
        }
      }
      if (!any) continue;
      ++ideal;
      wavefronts += *std::max_element(count, count + 32);
    }
    BankSite& b = sums[key.site];
    if (b.executions == 0) {
      b.file = key.site != nullptr && key.site->file != nullptr ? key.site->file : "?";
      b.line = key.site != nullptr ? key.site->line : 0;
      b.column = key.site != nullptr ? key.site->column : 0;
      b.bytes = g.bytes;
      b.write = g.write;
    }
    ++b.executions;
    b.wavefronts += wavefronts;
    b.ideal += ideal;
  }
  bank_groups_.clear();
  if (launch_->report == nullptr) return;
  std::lock_guard lock(launch_->report->mu);
  for (auto& [site, b] : sums) {
    auto it = std::find_if(launch_->report->banks.begin(), launch_->report->banks.end(), [&](const BankSite& o) {
      return o.file == b.file && o.line == b.line && o.column == b.column && o.bytes == b.bytes && o.write == b.write;
    });
    if (it == launch_->report->banks.end()) {
      launch_->report->banks.push_back(b);
    } else {
      it->executions += b.executions;
      it->wavefronts += b.wavefronts;
      it->ideal += b.ideal;
    }
  }
}

void* BlockRunner::emutls_address(EmutlsControl* c) {
  std::atomic_ref<std::uintptr_t> index(c->index);
  std::uintptr_t i = index.load(std::memory_order_acquire);
  if (i == 0) {
    const std::uintptr_t fresh = g_emutls_next_index.fetch_add(1, std::memory_order_relaxed);
    i = index.compare_exchange_strong(i, fresh, std::memory_order_acq_rel) ? fresh : i;
  }
  void* p = arena_.static_slot(i, c, san_ != nullptr && san_->init);
  if (p == nullptr) {
    fail(fmt::format("the block's __shared__ variables exceed the host emulator's {} KiB", kStaticSmemMax / 1024));
    yield_forever();
  }
  return p;
}

// The order the scheduler resumes threads in, per pass over the block.
std::vector<unsigned> BlockRunner::schedule_order(const LunajitEmuDim3& block) {
  std::vector<unsigned> order(n_);
  for (unsigned i = 0; i < n_; ++i) order[i] = i;
  if (san_ == nullptr || san_->order == ScheduleOrder::forward) return order;
  if (san_->order == ScheduleOrder::reverse) {
    std::reverse(order.begin(), order.end());
    return order;
  }
  // random: one permutation per block, from the seed and the block index (the
  // same whichever OS thread runs it)
  std::mt19937_64 rng(san_->seed * 0x9E3779B97F4A7C15ull ^ (block.x + 65536ull * (block.y + 65536ull * block.z)));
  std::shuffle(order.begin(), order.end(), rng);
  preempt_rng_.seed(rng());
  return order;
}

// No fiber is runnable but some are alive: say why, naming threads.
std::string BlockRunner::deadlock_message() const {
  std::optional<unsigned> finished, at_barrier, at_warp;
  for (unsigned i = 0; i < n_; ++i) {
    const Fiber& f = fibers_[i];
    if (f.state == FiberState::finished && !finished) finished = i;
    if (f.state == FiberState::at_block_barrier && !at_barrier) at_barrier = i;
    if (f.state == FiberState::at_warp_op && !at_warp) at_warp = i;
  }
  if (at_barrier && finished) {
    return fmt::format("thread {} exited while thread {} waits at __syncthreads(): divergent barrier "
                       "(every thread of a block must reach each __syncthreads)",
                       thread_text(*finished), thread_text(*at_barrier));
  }
  if (at_barrier && at_warp) {
    const Fiber& w = fibers_[*at_warp];
    return fmt::format("thread {} waits at __syncthreads() while thread {} waits at {} (mask {:#010x}): "
                       "divergent barrier",
                       thread_text(*at_barrier), thread_text(*at_warp), site_text(w), w.mask);
  }
  if (at_warp) {
    const Fiber& w = fibers_[*at_warp];
    const unsigned warp = *at_warp / kWarpSize;
    for (unsigned m = w.mask & ~warp_arrived_[warp]; m != 0; m &= m - 1) {
      const unsigned other = warp * kWarpSize + __builtin_ctz(m);
      const char* where = fibers_[other].state == FiberState::finished ? "has exited" : "never arrives";
      return fmt::format("warp {}: thread {} waits at {} with mask {:#010x} but lane {} (thread {}) {}: divergent "
                         "warp operation",
                         warp, thread_text(*at_warp), site_text(w), w.mask, other % kWarpSize,
                         thread_text(other), where);
    }
    return fmt::format("thread {} waits at {} with mask {:#010x}, which no other lane completes",
                       thread_text(*at_warp), site_text(w), w.mask);
  }
  return "no thread can make progress";
}

Status BlockRunner::run(const GridLaunch& launch, LunajitEmuDim3 block_idx) {
  const Dim3& bd = launch.config.block;
  n_ = bd.x * bd.y * bd.z;
  launch_ = &launch;
  failure_.reset();
  barrier_arrived_ = 0;
  barrier_count_ = 0;
  const unsigned warps = (n_ + kWarpSize - 1) / kWarpSize;
  warp_arrived_.assign(warps, 0);
  warp_finished_.assign(warps, 0);
  fibers_.resize(n_);

  const SanitizeOptions* san = launch.sanitize != nullptr && launch.sanitize->any() ? launch.sanitize : nullptr;
  san_ = san;
  shadowing_ = san != nullptr && (san->init || san->race);
  count_banks_ = san != nullptr && san->banks && block_idx.x == 0 && block_idx.y == 0 && block_idx.z == 0;
  finding_.reset();
  async_copies_ = 0;
  barrier_epoch_ = 1;
  warp_epoch_.assign(warps, 0);
  in_collective_ = false;
  if (count_banks_) bank_occurrence_.assign(n_, {});
  if (!arena_.ok()) return Error::failure("cannot reserve the host emulator's shared-memory arena");
  if (launch.config.dynamic_smem > kDynamicSmemMax) {
    return Error::invalid(fmt::format("kernel '{}': {} bytes of dynamic shared memory exceed the host emulator's {} "
                                      "MiB",
                                      launch.kernel_name, launch.config.dynamic_smem, kDynamicSmemMax >> 20));
  }
  // A new block: `__shared__` variables are placed afresh; with init, all shared
  // memory is poisoned and the shadow forgets the previous block.
  dynamic_bytes_ = launch.config.dynamic_smem;
  arena_.reset_statics();
  if (san != nullptr && san->init) {
    std::memset(arena_.dynamic(), 0xFF, dynamic_bytes_);
  }
  if (shadowing_) {
    Shadow* shadow = arena_.shadow();
    if (shadow == nullptr) return Error::failure("cannot reserve the host sanitizers' shadow memory");
    std::memset(shadow, 0, (dynamic_bytes_ + 3) / 4 * sizeof(Shadow));
    std::memset(shadow + kDynamicSmemMax / 4, 0, (arena_.static_high_water() + 3) / 4 * sizeof(Shadow));
  }
  t_context.dynamic_smem = arena_.dynamic();
  t_context.dynamic_smem_bytes = launch.config.dynamic_smem;
  t_context.block_idx = block_idx;
  t_context.block_dim = {bd.x, bd.y, bd.z};
  t_context.grid_dim = {launch.config.grid.x, launch.config.grid.y, launch.config.grid.z};

  for (unsigned i = 0; i < n_; ++i) {
    void* stack = stacks_.stack(i);
    if (stack == nullptr) {
      return Error::failure(fmt::format("kernel '{}': cannot map {} fiber stacks of {} KiB", launch.kernel_name, n_,
                                        stacks_.bytes() / 1024));
    }
#if defined(LUNAJIT_ASAN)
    __asan_unpoison_memory_region(stack, stacks_.bytes());  // an abandoned fiber may have left it poisoned
#endif
    Fiber& f = fibers_[i];
#if defined(LUNAJIT_TSAN)
    if (f.tsan_fiber != nullptr) __tsan_destroy_fiber(f.tsan_fiber);
#endif
    f = Fiber{};
#if defined(LUNAJIT_TSAN)
    f.tsan_fiber = __tsan_create_fiber(0);
#endif
    f.idx = {i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y)};
    f.context = fctx::make_fcontext(static_cast<char*>(stack) + stacks_.bytes(), stacks_.bytes(), &fiber_main);
  }

  t_runner = this;
#if defined(LUNAJIT_TSAN)
  scheduler_tsan_fiber_ = __tsan_get_current_fiber();
#endif
  unsigned live = n_;
  const std::vector<unsigned> order = schedule_order(block_idx);
  while (live > 0 && !failure_) {
    bool resumed = false;
    for (unsigned k = 0; k < n_ && !failure_; ++k) {
      const unsigned i = order[k];
      if (fibers_[i].state != FiberState::runnable) continue;
      resumed = true;
      resume(i);
      if (fibers_[i].state == FiberState::finished) {
        --live;
        warp_finished_[i / kWarpSize] |= 1u << (i % kWarpSize);
      }
    }
    if (!resumed && live > 0) fail(deadlock_message());
  }
  t_runner = nullptr;
  if (count_banks_ && !failure_) flush_bank_stats();
  bank_groups_.clear();
  if (launch.report != nullptr) {
    std::lock_guard lock(launch.report->mu);
    if (finding_) launch.report->findings.push_back(*finding_);
    launch.report->async_copies += async_copies_;
  }
  if (failure_) {
    return Error::failure(fmt::format("kernel '{}': block {}: {}", launch.kernel_name, dim_text(block_idx), *failure_));
  }
  return ok_status();
}

// ---- the pool of OS threads -------------------------------------------------------

// Worker threads that run a job together with the launching thread. One job at a
// time; created on first use and never destroyed (idle workers cost nothing, and
// no shutdown order with other static objects has to be right).
class WorkerPool {
 public:
  static WorkerPool& instance() {
    static WorkerPool* pool = new WorkerPool(host_thread_count());
    return *pool;
  }

  // Runs `job` on `participants` threads (the caller and participants - 1
  // workers) and returns when all have returned.
  void run(unsigned participants, const std::function<void()>& job) {
    std::lock_guard one_job(run_mu_);
    participants = std::clamp(participants, 1u, static_cast<unsigned>(workers_.size()) + 1);
    {
      std::lock_guard lock(mu_);
      job_ = &job;
      wanted_ = participants - 1;
      pending_ = participants - 1;
      ++generation_;
    }
    cv_.notify_all();
    job();
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  explicit WorkerPool(unsigned threads) {
    for (unsigned i = 0; i + 1 < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  void work(unsigned index) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job = nullptr;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= wanted_) continue;
        job = job_;
      }
      (*job)();
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void()>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  unsigned wanted_ = 0;
  unsigned pending_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace

unsigned host_thread_count() {
  unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  return env_unsigned("LUNAJIT_HOST_THREADS", cpus);
}

std::size_t fiber_stack_bytes() {
  std::size_t kib = env_unsigned("LUNAJIT_HOST_STACK_KB", 256);
  std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (std::max<std::size_t>(kib, 64) * 1024 + page - 1) / page * page;
}

Status run_grid(const GridLaunch& launch) {
  const LaunchConfig& c = launch.config;
  const std::uint64_t threads = std::uint64_t{c.block.x} * c.block.y * c.block.z;
  if (launch.entry == nullptr) return Error::invalid(fmt::format("kernel '{}': no entry point", launch.kernel_name));
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0) {
    return Error::invalid(fmt::format("kernel '{}': empty launch (grid {}x{}x{}, block {}x{}x{})", launch.kernel_name,
                                      c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z));
  }
  if (threads > kMaxBlockThreads || c.block.z > 64 || c.grid.y > 65535 || c.grid.z > 65535) {
    return Error::invalid(fmt::format("kernel '{}': block {}x{}x{} / grid {}x{}x{} exceeds CUDA's limits "
                                      "(1024 threads a block, block.z <= 64, grid.y and grid.z <= 65535)",
                                      launch.kernel_name, c.block.x, c.block.y, c.block.z, c.grid.x, c.grid.y,
                                      c.grid.z));
  }
  const std::uint64_t blocks = std::uint64_t{c.grid.x} * c.grid.y * c.grid.z;
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::optional<Error> first_error;
  std::function<void()> job = [&] {
    BlockRunner& runner = this_thread_runner();
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const std::uint64_t b = next.fetch_add(1, std::memory_order_relaxed);
      if (b >= blocks) return;
      LunajitEmuDim3 idx{static_cast<unsigned>(b % c.grid.x), static_cast<unsigned>((b / c.grid.x) % c.grid.y),
                         static_cast<unsigned>(b / (std::uint64_t{c.grid.x} * c.grid.y))};
      Status s = runner.run(launch, idx);
      if (!s.ok()) {
        std::lock_guard lock(error_mu);
        if (!first_error) first_error = s.error();
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };
  WorkerPool::instance().run(static_cast<unsigned>(std::min<std::uint64_t>(blocks, host_thread_count())), job);
  if (first_error) return *first_error;
  return ok_status();
}

}  // namespace lunajit::host

// ---- host_abi.h: what JIT'd kernels call ----------------------------------------------

extern "C" {
LunajitEmuContext* lunajit_emu_context(void) noexcept { return &lunajit::host::t_context; }
int lunajit_emu_syncthreads(int predicate) noexcept { return lunajit::host::t_runner->syncthreads(predicate); }
unsigned long long lunajit_emu_warp(int op, unsigned mask, unsigned long long value, int param, int width) noexcept {
  return lunajit::host::t_runner->warp_op(op, mask, value, param, width);
}
void lunajit_emu_trap(const char* what) noexcept { lunajit::host::t_runner->trap(what); }
void lunajit_emu_warp_collective(LunajitEmuCollectiveFn fn, const char* what, unsigned mask, void* payload,
                                 const char* file, int line) noexcept {
  lunajit::host::t_runner->warp_collective(fn, what, mask, payload, file, line);
}
void lunajit_emu_cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes, int line) noexcept {
  lunajit::host::t_runner->cp_async(dst, src, bytes, src_bytes, line);
}
void lunajit_emu_cp_async_commit(void) noexcept { lunajit::host::t_runner->cp_async_commit(); }
void lunajit_emu_cp_async_wait(int pending, int line) noexcept { lunajit::host::t_runner->cp_async_wait(pending, line); }
void lunajit_emu_access(const void* address, unsigned long long bytes, unsigned flags,
                        const LunajitEmuSite* site) noexcept {
  if (lunajit::host::t_runner != nullptr) lunajit::host::t_runner->access(address, bytes, flags, site);
}
// The JIT's __emutls_get_address: `__shared__` variables live in the block's
// shared-memory arena (so the sanitizers see them, and each block starts afresh).
static void* lunajit_emutls_get_address(void* control) noexcept {
  return lunajit::host::this_thread_runner().emutls_address(static_cast<lunajit::host::EmutlsControl*>(control));
}
}

namespace lunajit::host {
std::span<const HostSymbol> emulation_symbols() {
  static const HostSymbol symbols[] = {
      {"lunajit_emu_context", reinterpret_cast<void*>(&lunajit_emu_context)},
      {"lunajit_emu_syncthreads", reinterpret_cast<void*>(&lunajit_emu_syncthreads)},
      {"lunajit_emu_warp", reinterpret_cast<void*>(&lunajit_emu_warp)},
      {"lunajit_emu_trap", reinterpret_cast<void*>(&lunajit_emu_trap)},
      {"lunajit_emu_warp_collective", reinterpret_cast<void*>(&lunajit_emu_warp_collective)},
      {"lunajit_emu_cp_async", reinterpret_cast<void*>(&lunajit_emu_cp_async)},
      {"lunajit_emu_cp_async_commit", reinterpret_cast<void*>(&lunajit_emu_cp_async_commit)},
      {"lunajit_emu_cp_async_wait", reinterpret_cast<void*>(&lunajit_emu_cp_async_wait)},
      {"lunajit_emu_access", reinterpret_cast<void*>(&lunajit_emu_access)},
      {"__emutls_get_address", reinterpret_cast<void*>(&lunajit_emutls_get_address)},
  };
  return symbols;
}
}  // namespace lunajit::host
