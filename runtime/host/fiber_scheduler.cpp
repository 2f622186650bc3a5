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
#include <thread>
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

// Fiber stacks of one OS thread, grown to the largest block seen and reused.
class StackPool {
 public:
  StackPool() : bytes_(fiber_stack_bytes()), page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {}
  ~StackPool() {
    for (void* base : mappings_) munmap(base, bytes_ + page_);
  }
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  // Lowest usable address of stack `i` (the guard page lies below it), or null.
  void* stack(std::size_t i) {
    while (mappings_.size() <= i) {
      void* base = mmap(nullptr, bytes_ + page_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) return nullptr;
      mprotect(base, page_, PROT_NONE);  // guard page: an overflow faults
      mappings_.push_back(base);
    }
    return static_cast<char*>(mappings_[i]) + page_;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::size_t page_;
  std::vector<void*> mappings_;
};

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
  std::vector<unsigned char> dynamic_smem_;
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
  first.collective(payloads, mask);  // may trap (fails the block and never returns)
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
  me.open_copies.push_back(
      {static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes, src_bytes, line});
}

void BlockRunner::cp_async_commit() {
  Fiber& me = fibers_[current_];
  me.pending_groups.push_back(std::move(me.open_copies));  // an empty group is allowed
  me.open_copies.clear();
}

void BlockRunner::cp_async_wait(int pending, int line) {
  Fiber& me = fibers_[current_];
  while (me.pending_groups.size() > static_cast<std::size_t>(std::max(pending, 0))) {
    std::vector<Fiber::AsyncCopy> g = std::move(me.pending_groups.front());
    me.pending_groups.pop_front();
    complete_copies(me, g, line);
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

  if (dynamic_smem_.size() < launch.config.dynamic_smem + 128) dynamic_smem_.resize(launch.config.dynamic_smem + 128);
  auto smem_addr = reinterpret_cast<std::uintptr_t>(dynamic_smem_.data());
  t_context.dynamic_smem = reinterpret_cast<unsigned char*>((smem_addr + 127) & ~std::uintptr_t{127});
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
  while (live > 0 && !failure_) {
    bool resumed = false;
    for (unsigned i = 0; i < n_ && !failure_; ++i) {
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
  };
  return symbols;
}
}  // namespace lunajit::host
