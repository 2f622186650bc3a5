// Shared-memory layouts of the forward kernels, as constexpr functions of the
// problem dimensions: the kernels size their tiles with them at compile time,
// and the host (TileConfig::can_implement, launch plans, the tuner) calls the
// very same functions at run time, so both sides agree by construction
// (FlashAttention 3's tile_size.h idea). All sizes are in floats (fp32).
#pragma once

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define LUNAJIT_HOST_DEVICE __host__ __device__
#else
#define LUNAJIT_HOST_DEVICE
#endif

namespace lunajit {

// Problem dimensions a layout depends on.
struct LayoutDims {
  int d;          // head_dim
  int D;          // feature dim
  int scratch;    // feature-map scratch floats per row (FeatureMap::kScratchPerRow)
  int dv_block;   // value columns owned by a block
  int tokens;     // T (state/output/feature-map passes) or C (causal chunk)
  int threads;
};

// Offsets (in floats) of the tiles of one kernel's dynamic shared memory.
struct SmemLayout {
  int state;     // S tile   (D, dv_block)
  int z;         // z        (D)
  int x;         // input rows (tokens, d), reused for q and k
  int phi_q;     // phi(q)   (tokens, D); the feature-map and state passes use it for phi(k)
  int phi_k;     // phi(k)   (tokens, D), causal only
  int scratch;   // feature-map scratch (tokens, scratch)
  int v;         // V tile   (tokens, dv_block)
  int scores;    // A = phi(q) phi(k)^T masked (tokens, tokens), causal only
  int den;       // denominators (tokens)
  int reduce;    // one float per thread for block reductions
  int total;     // floats

  LUNAJIT_HOST_DEVICE constexpr long long bytes() const { return 4LL * total; }
};

// Rounds a tile's start up to 4 floats (16 bytes) so vector loads stay aligned.
LUNAJIT_HOST_DEVICE constexpr int align4(int n) { return (n + 3) / 4 * 4; }

enum class KernelKind { feature_map, key_stab, state, output, causal_chunk };

LUNAJIT_HOST_DEVICE constexpr SmemLayout smem_layout(KernelKind kind, LayoutDims p) {
  SmemLayout l{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  int off = 0;
  const bool has_state = kind == KernelKind::output || kind == KernelKind::causal_chunk;
  if (has_state) {
    l.state = off; off = align4(off + p.D * p.dv_block);   // (D, dv_block)
    l.z = off;     off = align4(off + p.D);                // (D)
  }
  l.x = off;       off = align4(off + p.tokens * p.d);     // (tokens, d)
  l.phi_q = off;   off = align4(off + p.tokens * p.D);     // (tokens, D)
  if (kind == KernelKind::causal_chunk) {
    l.phi_k = off; off = align4(off + p.tokens * p.D);     // (tokens, D)
  }
  l.scratch = off; off = align4(off + p.tokens * p.scratch);
  if (kind == KernelKind::state || kind == KernelKind::causal_chunk) {
    l.v = off;     off = align4(off + p.tokens * p.dv_block);  // (tokens, dv_block)
  }
  if (kind == KernelKind::causal_chunk) {
    l.scores = off; off = align4(off + p.tokens * p.tokens);   // (C, C)
  }
  if (kind == KernelKind::output || kind == KernelKind::causal_chunk) {
    l.den = off;   off = align4(off + p.tokens);
  }
  l.reduce = off;  off = align4(off + p.threads);
  l.total = off;
  return l;
}

// Registers of the state pass's per-thread S accumulators: each thread owns
// ceil(D * dv_block / threads) entries of the block's (D, dv_block) partial.
LUNAJIT_HOST_DEVICE constexpr int state_entries_per_thread(int D, int dv_block, int threads) {
  return (D * dv_block + threads - 1) / threads;
}
inline constexpr int kMaxStateEntriesPerThread = 128;

}  // namespace lunajit
