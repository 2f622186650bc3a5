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
  int running_max = 0;  // 1: causal performer's per-row key stabiliser (kstab, kmax, qsum, vsum tiles)
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
  int kstab;     // causal performer: each key's own max s_j (tokens)
  int kmax;      // causal performer: running max M_i of s_j over j <= i (tokens)
  int qsum;      // causal performer: sum_f phi(q_i)_f (tokens)
  int vsum;      // causal performer: sum of the values of earlier chunks (dv_block)
  int reduce;    // one float per thread for block reductions
  int total;     // floats

  LUNAJIT_HOST_DEVICE constexpr long long bytes() const { return 4LL * total; }
};

// Rounds a tile's start up to 4 floats (16 bytes) so vector loads stay aligned.
LUNAJIT_HOST_DEVICE constexpr int align4(int n) { return (n + 3) / 4 * 4; }

enum class KernelKind { feature_map, key_stab, state, output, causal_chunk };

LUNAJIT_HOST_DEVICE constexpr SmemLayout smem_layout(KernelKind kind, LayoutDims p) {
  SmemLayout l{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
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
  if (kind == KernelKind::causal_chunk && p.running_max) {
    l.kstab = off; off = align4(off + p.tokens);
    l.kmax = off;  off = align4(off + p.tokens);
    l.qsum = off;  off = align4(off + p.tokens);
    l.vsum = off;  off = align4(off + p.dv_block);
  }
  l.reduce = off;  off = align4(off + p.threads);
  l.total = off;
  return l;
}

// Blocks per SM that `bytes` of dynamic shared memory per block allow: the
// occupancy rule of codegen/occupancy.h (rounded up to 128 bytes, plus the
// per-block reservation), at least 1.
LUNAJIT_HOST_DEVICE constexpr int blocks_by_smem(long long bytes, long long smem_per_sm, long long reserved) {
  const long long per_block = (bytes + 127) / 128 * 128 + reserved;
  return smem_per_sm / per_block < 1 ? 1 : (int)(smem_per_sm / per_block);
}

// Shared memory per SM and reserved per block of an arch by its __CUDA_ARCH__
// value (sm * 10): codegen/arch.cpp's table, which the device code cannot
// include (tests/codegen/tile_config_test.cpp checks that they agree).
LUNAJIT_HOST_DEVICE constexpr long long arch_smem_per_sm(int cuda_arch) {
  return cuda_arch == 750                                                        ? 65536
         : cuda_arch == 800 || cuda_arch == 870                                  ? 167936
         : cuda_arch == 860 || cuda_arch == 880 || cuda_arch == 890 || cuda_arch >= 1200 ? 102400
                                                                                  : 233472;
}
LUNAJIT_HOST_DEVICE constexpr long long arch_smem_reserved_per_block(int cuda_arch) {
  return cuda_arch >= 800 ? 1024 : 0;
}

// The minBlocksPerMultiprocessor of a kernel's __launch_bounds__: 1 when its
// shared memory already keeps it to one resident block per SM of the arch
// being compiled, else 0 (not given). Without it ptxas picks a register count
// for an occupancy it guesses and spills to reach it (the sm_90 causal_dkv
// kernel of the default config: 80 registers and 144 spilled bytes at 190 KB a
// block, where no second block can fit); with it ptxas may use up to 255. Not
// given otherwise, since a minimum above 1 is a register cap that can itself
// force spills. Host code (no __CUDA_ARCH__; the host emulation ignores launch
// bounds) gets 0.
LUNAJIT_HOST_DEVICE constexpr int sole_block_min_blocks(long long bytes) {
#if defined(__CUDA_ARCH__)
  return blocks_by_smem(bytes, arch_smem_per_sm(__CUDA_ARCH__), arch_smem_reserved_per_block(__CUDA_ARCH__)) == 1
             ? 1
             : 0;
#else
  (void)bytes;
  return 0;
#endif
}

// The minBlocksPerMultiprocessor of the tensor-core causal backward's walks
// (mma_causal_dq_kernel, mma_causal_dkv_kernel): 2 when their shared memory
// lets two blocks share an SM (the default C16 tiles on sm_90), else 1. Left
// to itself, ptxas gives the walks 255 registers (one block of 8 warps per SM,
// half of what hides the mma and ldmatrix latencies by the cost model); at 2
// it fits them in 128 without spilling (tests/runtime_nvrtc check spills).
LUNAJIT_HOST_DEVICE constexpr int walk_min_blocks(long long bytes) {
#if defined(__CUDA_ARCH__)
  return blocks_by_smem(bytes, arch_smem_per_sm(__CUDA_ARCH__), arch_smem_reserved_per_block(__CUDA_ARCH__)) >= 2 ? 2
                                                                                                                 : 1;
#else
  (void)bytes;
  return 0;
#endif
}

// Registers of the state pass's per-thread S accumulators: each thread owns
// ceil(D * dv_block / threads) entries of the block's (D, dv_block) partial.
LUNAJIT_HOST_DEVICE constexpr int state_entries_per_thread(int D, int dv_block, int threads) {
  return (D * dv_block + threads - 1) / threads;
}
inline constexpr int kMaxStateEntriesPerThread = 128;

// ------------------------------------------------ tensor-core forward (mma)
// The non-causal state and output passes on mma.sync m16n8k16
// (templates/lunajit/linear_attention_mma.cuh). The fp32 tiles the feature map
// works in (x, phi, scratch) are followed by 16-bit operand tiles in the I/O
// dtype (bf16 or fp16), each row padded by 8 elements (16 bytes): a row stride
// of D/2 + 4 words with D a multiple of 16 is 4 (mod 8) words, so the 8 rows
// of every ldmatrix 8x8 matrix (16 bytes each) fall into 8 disjoint groups of
// 4 banks: one wavefront per matrix, no conflicts.
//   state:  phi_h (tokens, D + 8), v_h (tokens, dv_block + 8)
//   output: state S (D, dv_block) and z (D) fp32, phi_h (tokens, D + 8),
//           s_h (D, dv_block + 8), z_h (D), scale (2 floats per warp, reduced)
//   causal_chunk (mma_causal_chunk_kernel, chunk tokens): x, phi, scratch as
//           above, phi_h = phi(q) (chunk, D + 8), phi_k_h (chunk, D + 8),
//           v_h (chunk, dv_block + 8), s_h (D, dv_block + 8), z_h (D), reduce;
//           the fp32 master state lives in the warps' registers; with the
//           cp.async prefetch (mma_causal_pipelined) the next chunk's raw
//           16-bit rows: q_raw (chunk, d) and v_raw (chunk, dv_block) over
//           phi and scratch where they fit (free while the chunk's products
//           run), else after them, and k_raw (chunk, d) of its own (it must
//           outlive phi(q)'s map, which works in x, phi and scratch)
struct MmaSmemLayout {
  int state, z, x, phi, scratch, phi_h, v_h, s_h, z_h, reduce, total;  // floats
  int phi_k_h = 0;                                                     // causal_chunk only
  int phi_lo = 0;  // state with split_phi (the backward's state pass): phi's bf16 low halves (tokens, D + 8)
  int v_lo = 0;    // state with split_v (the fp16 backward's state pass): V's bf16 low halves (tokens, dv_block + 8)
  // state with pipelined (mma_state_pipelined): the cp.async buffers, a
  // second V tile (tokens, dv_block + 8) and the raw 16-bit K tile (tokens, d).
  int v_h2 = 0, k_raw = 0;
  int q_raw = 0, v_raw = 0;  // causal_chunk with mma_causal_pipelined: the next chunk's raw Q (chunk, d) and V (chunk, dv_block)
  LUNAJIT_HOST_DEVICE constexpr long long bytes() const { return 4LL * total; }
};

// Whether the tensor-core causal walk (mma_causal_chunk_kernel) prefetches
// the next chunk's Q, K and V rows with cp.async while the chunk's products
// run: rows of whole 16-byte chunks (d a multiple of 8; dv_block is a
// multiple of 16 on every mma config). The kernel also checks at run time
// that the rows are 16-byte aligned, and loads them synchronously otherwise.
LUNAJIT_HOST_DEVICE constexpr bool mma_causal_pipelined(int d) { return d % 8 == 0; }

LUNAJIT_HOST_DEVICE constexpr int mma_row_halves(int cols) { return cols + 8; }

// split_phi: the backward's state pass (phi split into bf16 hi + lo);
// split_v: with fp16 I/O also V, which bf16 holds exactly only as hi + lo;
// pipelined: the state pass's cp.async double buffer (mma_state_pipelined).
LUNAJIT_HOST_DEVICE constexpr MmaSmemLayout mma_smem_layout(KernelKind kind, LayoutDims p, bool split_phi = false,
                                                           bool split_v = false, bool pipelined = false) {
  MmaSmemLayout l{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  int off = 0;
  if (kind == KernelKind::causal_chunk) {
    l.x = off;       off = align4(off + p.tokens * p.d);
    l.phi = off;     off = align4(off + p.tokens * p.D);
    l.scratch = off; off = align4(off + p.tokens * p.scratch);
    l.phi_h = off;   off = align4(off + (p.tokens * mma_row_halves(p.D) + 1) / 2);
    l.phi_k_h = off; off = align4(off + (p.tokens * mma_row_halves(p.D) + 1) / 2);
    l.v_h = off;     off = align4(off + (p.tokens * mma_row_halves(p.dv_block) + 1) / 2);
    l.s_h = off;     off = align4(off + (p.D * mma_row_halves(p.dv_block) + 1) / 2);
    l.z_h = off;     off = align4(off + (p.D + 1) / 2);
    l.reduce = off;  off = align4(off + 2 * (p.threads / 32));
    if (mma_causal_pipelined(p.d)) {
      const int q_raw = align4((p.tokens * p.d + 1) / 2), v_raw = align4((p.tokens * p.dv_block + 1) / 2);
      if (q_raw + v_raw <= l.phi_h - l.phi) {  // over phi and scratch
        l.q_raw = l.phi;
        l.v_raw = l.phi + q_raw;
      } else {
        l.q_raw = off; off += q_raw;
        l.v_raw = off; off += v_raw;
      }
      l.k_raw = off; off += align4((p.tokens * p.d + 1) / 2);
    }
    l.total = off;
    return l;
  }
  const bool output = kind == KernelKind::output;
  if (output) {
    l.state = off; off = align4(off + p.D * p.dv_block);
    l.z = off;     off = align4(off + p.D);
  }
  l.x = off;       off = align4(off + p.tokens * p.d);
  l.phi = off;     off = align4(off + p.tokens * p.D);
  l.scratch = off; off = align4(off + p.tokens * p.scratch);
  l.phi_h = off;   off = align4(off + (p.tokens * mma_row_halves(p.D) + 1) / 2);
  if (!output) {
    l.v_h = off;   off = align4(off + (p.tokens * mma_row_halves(p.dv_block) + 1) / 2);
    if (split_phi) {
      l.phi_lo = off; off = align4(off + (p.tokens * mma_row_halves(p.D) + 1) / 2);
    }
    if (split_phi && split_v) {
      l.v_lo = off; off = align4(off + (p.tokens * mma_row_halves(p.dv_block) + 1) / 2);
    }
    if (pipelined) {
      l.v_h2 = off;  off = align4(off + (p.tokens * mma_row_halves(p.dv_block) + 1) / 2);
      l.k_raw = off; off = align4(off + (p.tokens * p.d + 1) / 2);  // (tokens, d) 16-bit
    }
  } else {
    l.s_h = off;   off = align4(off + (p.D * mma_row_halves(p.dv_block) + 1) / 2);
    l.z_h = off;   off = align4(off + (p.D + 1) / 2);
    l.reduce = off; off = align4(off + 2 * (p.threads / 32));
  }
  l.total = off;
  return l;
}

// Whether the tensor-core state pass (mma_state_block) streams its K and V
// tiles with a two-stage cp.async pipeline: the forward's (its block walks a
// range of tiles), with rows of whole 16-byte chunks (d a multiple of 8;
// dv_block is a multiple of 16 on every mma config). The kernel also checks
// at run time that the rows are 16-byte aligned, and loads them synchronously
// otherwise. Not the backward's state pass (split_phi): the buffers' registers
// on top of the split map's made ptxas spill 8-20 bytes on sm_80 (LUNA with
// the envelope, gelu and softplus, every top-ranked config), and its causal
// form maps one chunk per block (nothing to overlap).
LUNAJIT_HOST_DEVICE constexpr bool mma_state_pipelined(int d, bool split_phi) { return !split_phi && d % 8 == 0; }

// Warp tiling of the mma passes. A block's warps form a grid of warps_m x
// warps_n over the product's 16-row m-tiles and 8-column n-tiles:
//   state  (S_aug = Phi_k^T [V | 1]): m-tiles over the D features, n-tiles
//          over the dv_block value columns; each warp keeps its tiles of S
//          and of z (the ones column, one n-tile per m-tile) in registers
//          for the whole sequence range.
//   output (O = Phi_q S, den = Phi_q z): m-tiles over the tokens, walked one
//          at a time; a warp holds its n-tiles of one m-tile plus the
//          denominator tile.
struct MmaWarpTiling {
  int warps_m, warps_n, m_tiles_per_warp, n_tiles_per_warp;
  int accumulators;  // fp32 accumulator registers per thread
  bool fits;         // warps_n divides the n-tiles
};

LUNAJIT_HOST_DEVICE constexpr MmaWarpTiling mma_warp_tiling(KernelKind kind, int D, int dv_block, int tokens,
                                                           int warps) {
  const int m_tiles = (kind == KernelKind::state ? D : tokens) / 16;
  const int n_tiles = dv_block / 8;
  const int wm = m_tiles < 1 ? 1 : (warps < m_tiles ? warps : m_tiles);
  const int wn = warps / wm;
  const bool fits = m_tiles >= 1 && m_tiles % wm == 0 && warps % wm == 0 && wn >= 1 && n_tiles % wn == 0;
  const int mpw = fits ? m_tiles / wm : 1, npw = fits ? n_tiles / wn : 1;
  // State: every owned tile of S plus one z tile per m-tile, all live; output:
  // one m-tile's n-tiles plus its denominator tile.
  const int acc = kind == KernelKind::state ? 4 * mpw * (npw + 1) : 4 * (npw + 1);
  return MmaWarpTiling{wm, wn, mpw, npw, acc, fits};
}
inline constexpr int kMaxMmaAccumulatorsPerThread = 96;

// The causal mma kernel (mma_causal_chunk_kernel) runs both tilings in one
// block: the state tiling over (D, dv_block) holds the fp32 master state
// (S, z) in registers for the whole sequence, and the output tiling over
// (chunk, dv_block) walks the chunk's 16-row query tiles, each holding its
// output and denominator accumulators (the inter-chunk term, computed first)
// while it computes its 16 x chunk strip of A = Phi_q Phi_k^T (fp32, 4 chunk/8
// registers) and packs it to 16-bit A fragments (2 chunk/8). Peak fp32 (and
// packed) registers per thread, bounded by kMaxMmaCausalAccumulatorsPerThread
// (more than the non-causal 96: ptxas keeps the default causal config, 104,
// spill-free on sm_80 and sm_90, tests/runtime_nvrtc/mma_forward_compile_test.cpp):
LUNAJIT_HOST_DEVICE constexpr int mma_causal_accumulators(int D, int dv_block, int chunk, int warps) {
  const MmaWarpTiling s = mma_warp_tiling(KernelKind::state, D, dv_block, chunk, warps);
  const MmaWarpTiling o = mma_warp_tiling(KernelKind::output, D, dv_block, chunk, warps);
  return s.accumulators + o.accumulators + 4 * (chunk / 8);
}
inline constexpr int kMaxMmaCausalAccumulatorsPerThread = 128;

// ---------------------------------------------------------------- backward

enum class BackwardKind { dstate, dq, dkv, causal_dq, causal_dkv };

struct BackwardDims {
  int d, D, dv;
  int scratch;      // forward feature-map scratch per row
  int bscratch;     // backward feature-map scratch per row
  int tokens;       // T (non-causal) or C (causal)
  int threads;
  int param_floats; // per-head parameter floats when the family learns parameters, else 0
  int running_max = 0;  // 1: causal performer (kstab, kmax, qsum, vsum tiles)
  int jt_stage = 0;     // floats of the tensor-core J^T's staging (luna_jt_stage_floats), 0: none
  int split_v = 0;      // 1: fp16 I/O on tensor cores: V staged as bf16 hi + lo (a_lo in dkv)
  int score_pad = 0;    // causal scores' rows allocated t + score_pad floats (8: the tensor-core causal kernels)
  int staged_state = 0; // 1: the non-causal tensor-core dq / dkv copy the state's pre-split hi + lo words
                        // from the workspace (backward_staged_floats): no fp32 state tile
  int phi_stride = 0;   // row stride (floats) of the fp32 phi and dphi tiles; 0: D. The tensor-core
                        // backward pads it to D + 8 where it makes phi on tensor cores
                        // (backward_phi_stride, feature_map_mma.cuh): conflict-free fragment stores
  int value_stride = 0; // row stride (floats) of the fp32 V and dO (g) tiles; 0: dv. The tensor-core
                        // causal walks pad it to dv + 8 (BackwardMmaTraits::VS, backward_value_stride):
                        // conflict-free fragment loads of the scores' B = G V^T
};

// Offsets (floats) of the backward kernels' tiles; unused tiles have size 0.
struct BackwardSmem {
  int state, z, x, phi_q, phi_k, dphi, v, dout, o, scores, den, r, scratch, bscratch, dx, dparams;
  int kstab, kmax, qsum, vsum;  // causal performer: s_j, M_i, sum_f phi(q_i)_f (t each); value/g sums (dv)
  int total;
  LUNAJIT_HOST_DEVICE constexpr long long bytes() const { return 4LL * total; }
};

LUNAJIT_HOST_DEVICE constexpr BackwardSmem backward_smem_layout(BackwardKind kind, BackwardDims p) {
  const bool causal = kind == BackwardKind::causal_dq || kind == BackwardKind::causal_dkv;
  const bool grads = kind != BackwardKind::dstate;  // maps dphi back through the feature map
  const bool needs_state = kind != BackwardKind::dstate;
  const bool queries = kind != BackwardKind::dkv;    // reads dout, denominators and r
  const bool keys = kind != BackwardKind::dstate && kind != BackwardKind::dq;
  const int t = p.tokens;
  BackwardSmem l{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const bool running = causal && p.running_max;
  const int ps = p.phi_stride > 0 ? p.phi_stride : p.D;  // phi and dphi rows
  const int vs = p.value_stride > 0 ? p.value_stride : p.dv;  // V and dO rows
  int off = 0;
  l.state = off;    off = align4(off + (needs_state && !p.staged_state ? p.D * p.dv : 0));  // S or dS (D, dv)
  l.z = off;        off = align4(off + p.D);                                  // z or dz (D)
  l.x = off;        off = align4(off + t * p.d);                              // (t, d)
  l.phi_q = off;    off = align4(off + t * ps);                               // (t, D), rows ps apart
  l.phi_k = off;    off = align4(off + (causal ? t * ps : 0));                // (t, D), rows ps apart
  l.dphi = off;     off = align4(off + (grads ? t * ps : 0));                 // (t, D), rows ps apart
  l.v = off;        off = align4(off + (keys || causal ? t * vs : 0));        // (t, dv), rows vs apart
  l.dout = off;     off = align4(off + (queries ? t * vs : 0));               // (t, dv), rows vs apart; becomes g
  // o: only the causal performer's scans still read the forward's output (r from
  // dO . o); every other kernel takes r from its fp32 products (MATH.md §1).
  l.o = off;        off = align4(off + (queries && running ? t * p.dv : 0));  // (t, dv)
  l.scores = off;   off = align4(off + (causal ? 2 * t * (t + p.score_pad) : 0));  // A, B (t, t + score_pad) each
  l.den = off;      off = align4(off + (queries ? t : 0));
  l.r = off;        off = align4(off + (queries ? t : 0));
  l.scratch = off;  off = align4(off + t * p.scratch);
  l.bscratch = off; off = align4(off + (grads ? t * p.bscratch : 0));
  l.dx = off;       off = align4(off + (grads ? t * p.d : 0));                // (t, d)
  l.dparams = off;  off = align4(off + (grads ? p.param_floats : 0));
  l.kstab = off;    off = align4(off + (running ? t : 0));
  l.kmax = off;     off = align4(off + (running ? t : 0));
  l.qsum = off;     off = align4(off + (running ? t : 0));
  l.vsum = off;     off = align4(off + (running ? p.dv : 0));
  l.total = off;
  return l;
}

// The tensor-core backward (templates/lunajit/linear_attention_backward_mma.cuh,
// non-causal, bf16): the scalar kernel's tiles (which keep the fp32 feature map
// and its backward) followed by 16-bit operand tiles, rows padded by 8 elements
// as the forward's (conflict-free ldmatrix):
// Every operand but V is staged as a bf16 pair hi + lo (_h, _lo tiles):
//   dstate: phi_h, phi_lo (t, D + 8) = phi(q), a_h, a_lo (t, dv + 8) = g,
//           r_h, r_lo (t) = r
//   dq:     a_h, a_lo = g, s_h, s_lo (D, dv + 8) = 2^-a S, reduce (one float per warp)
//   dkv:    phi_h, phi_lo = phi(k), a_h = v (exact), s_h, s_lo = 2^-a dS, reduce
//   causal_dq:  as dq, plus phi_h, phi_lo = phi(q) and r_h, r_lo = r (the
//               chunk's [dS | dz] += Phi_q^T [G | r], fused into it) and dsum
//               (D * dv + D fp32: the range's [dS | dz], summed chunk by chunk);
//               the walk's state update S += Phi_k^T [V | 1] reuses phi_h,
//               phi_lo (phi(k)) and a_h, a_lo (V)
//   causal_dkv: as dkv (over the causal kernels' tiles: phi(q), phi(k), the
//               C x C scores), plus a_lo and r_h, r_lo: the walk's update
//               dS += Phi_q^T [G | r] reuses phi_h, phi_lo (phi(q)), a_h, a_lo (g)
struct BackwardMmaSmem {
  BackwardSmem base;
  int dsum;  // causal_dq: the range's [dS | dz] (fp32), outside the J^T's staging
  int walk;  // causal_dq, causal_dkv: the walk's next chunk (int) and unscale (float), 4 floats
  int phi_h, phi_lo, a_h, a_lo, s_h, s_lo, r_h, r_lo, reduce;  // floats
  int jt;     // the tensor-core J^T's staging (dq, dkv), over the 16-bit tiles, dead by then
  int total;
  LUNAJIT_HOST_DEVICE constexpr long long bytes() const { return 4LL * total; }
};

LUNAJIT_HOST_DEVICE constexpr BackwardMmaSmem backward_mma_smem_layout(BackwardKind kind, BackwardDims p) {
  BackwardMmaSmem l{backward_smem_layout(kind, p), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const int t = p.tokens;
  const bool causal = kind == BackwardKind::causal_dq || kind == BackwardKind::causal_dkv;
  const bool keys = kind == BackwardKind::dkv || kind == BackwardKind::causal_dkv;
  const bool queries = kind == BackwardKind::dq || kind == BackwardKind::causal_dq;
  const bool phi = kind == BackwardKind::dstate || keys || kind == BackwardKind::causal_dq;
  const bool state = queries || keys;
  const bool g = kind == BackwardKind::dstate || queries || causal;
  const bool r = kind == BackwardKind::dstate || causal;
  int off = l.base.total;
  l.dsum = off;   off = align4(off + (kind == BackwardKind::causal_dq ? p.D * p.dv + p.D : 0));
  l.walk = off;   off = align4(off + (causal ? 4 : 0));
  l.phi_h = off;  off = align4(off + (phi ? (t * mma_row_halves(p.D) + 1) / 2 : 0));
  l.phi_lo = off; off = align4(off + (phi ? (t * mma_row_halves(p.D) + 1) / 2 : 0));
  l.a_h = off;    off = align4(off + (t * mma_row_halves(p.dv) + 1) / 2);
  l.a_lo = off;   off = align4(off + (g || (keys && p.split_v) ? (t * mma_row_halves(p.dv) + 1) / 2 : 0));
  l.s_h = off;    off = align4(off + (state ? (p.D * mma_row_halves(p.dv) + 1) / 2 : 0));
  l.s_lo = off;   off = align4(off + (state ? (p.D * mma_row_halves(p.dv) + 1) / 2 : 0));
  l.r_h = off;    off = align4(off + (r ? (t + 1) / 2 : 0));
  l.r_lo = off;   off = align4(off + (r ? (t + 1) / 2 : 0));
  l.reduce = off; off = align4(off + (state ? p.threads / 32 : 0));
  l.total = off;
  // The J^T runs after the products (and a barrier): its staging reuses their tiles.
  l.jt = l.phi_h;
  if (state && l.jt + p.jt_stage > l.total) l.total = l.jt + p.jt_stage;
  return l;
}

// Staging of LUNA's tensor-core Jacobian-transpose (feature_map_backward_mma.cuh),
// floats: dpre as bf16 hi and lo tiles (tokens, D + 8), then per warp the
// larger of its hidden-layer tiles (hi and lo, 16 x (Hm + 8)) and its
// parameter partial (dW1, db1, dW2: 2 Hm + L (Hm + 4), dW2's rows padded so
// that its fragment-order stores are conflict-free: luna_jt_w2_stride); the
// x tile (tokens, d + 8) of the u = X W^T product overlays the warps' region
// before the walk.
LUNAJIT_HOST_DEVICE constexpr int luna_jt_w2_stride(int Hm) { return Hm + 4; }
LUNAJIT_HOST_DEVICE constexpr int luna_jt_stage_floats(int tokens, int d, int D, int Hm, int L, int warps) {
  const int dpre = align4((tokens * mma_row_halves(D) + 1) / 2);
  const int hidden = 16 * mma_row_halves(Hm), part = 2 * Hm + L * luna_jt_w2_stride(Hm);
  const int per_warp = warps * align4(hidden > part ? hidden : part), x = align4((tokens * mma_row_halves(d) + 1) / 2);
  return 2 * dpre + (per_warp > x ? per_warp : x);
}

// Blocks that write a partial parameter gradient: per (batch, head), one per
// query tile and one per key tile (non-causal), one query and one key block
// per super-chunk range (causal_tiles: the tensor-core causal backward's
// walks, `splits` ranges), or one query and one key block (the causal scans).
LUNAJIT_HOST_DEVICE constexpr long long backward_slots(int batch_heads, int seq, bool causal, int tokens,
                                                      bool causal_tiles = false, int splits = 1) {
  if (causal_tiles) return 2LL * batch_heads * splits;
  return causal ? 2LL * batch_heads : 2LL * batch_heads * ((seq + tokens - 1) / tokens);
}

// Groups of the parameter-gradient reduction (param_reduce_kernel): a head
// block's `slots` slot list cut into consecutive groups of about 256 slots a
// warp (8 loads in flight per lane, 32 rounds), at most the grid's 65535 in y
// and at most `slots` (no group is empty).
LUNAJIT_HOST_DEVICE constexpr long long param_reduce_groups(long long slots, int warps) {
  const long long per_group = 256LL * warps;
  const long long g = (slots + per_group - 1) / per_group;
  return g < 1 ? 1 : g > 65535 ? 65535 : g;
}

// Workspace of the backward pass (floats): key stabiliser, state partials and
// their gradients (non-causal: one per split; the tensor-core causal backward,
// causal_tiles: one per super-chunk range, turned into the exclusive prefix
// S_<r and, in the same array, the suffix dS_>r in place), the non-causal
// tensor-core backward's staged state and state gradient (staged: bf16 hi +
// lo words, written by its reduce kernels), per-token denominators (causal), per-token
// r_i = -(dO_i . o_i) / den_i (written by the dq kernel from its fp32 products, read by
// the dstate or dkv kernel: docs/MATH.md §1 "r from the backward's own state"), per-token
// running key maxima M_i (causal performer), and one partial parameter
// gradient per block that maps dphi back (slots).
struct BackwardWorkspace {
  long long stab, state, dstate, staged, den, r, kmax, slots, total;
};

// The non-causal tensor-core backward's staged state (and its gradient) per
// (batch, head), floats: 2^-a S split into bf16 hi and lo words, D dv / 2
// words each, row-major (dv / 2 words a row), then the unscale 2^a and 3
// floats of padding (16-byte blocks: D dv is a multiple of 4).
LUNAJIT_HOST_DEVICE constexpr long long backward_staged_floats(int D, int dv) { return (long long)D * dv + 4; }

LUNAJIT_HOST_DEVICE constexpr BackwardWorkspace backward_workspace(int batch_heads, int seq, int splits, int D,
                                                                  int dv, bool causal, int tokens,
                                                                  int param_floats, bool running_max = false,
                                                                  bool causal_tiles = false, bool staged = false) {
  BackwardWorkspace w{0, 0, 0, 0, 0, 0, 0, 0, 0};
  const int parts = splits;
  const bool states = !causal || causal_tiles;
  const long long part = (long long)batch_heads * parts * ((long long)D * dv + D);
  w.stab = 0;
  w.state = (batch_heads + 3) / 4 * 4;
  // The tensor-core causal backward keeps one array: its dq kernel's block
  // r reads the prefix S_<r of slot r, then writes its range's (dS_r, dz_r)
  // over it (no other block touches slot r), and the suffix scan and the dkv
  // kernel work on that.
  w.dstate = w.state + (states && !causal_tiles ? part : 0);
  // staged (non-causal, tensor cores): [state | dstate] x batch_heads x backward_staged_floats.
  w.staged = w.dstate + (states ? part : 0);
  w.den = w.staged + (staged && !causal ? 2LL * batch_heads * backward_staged_floats(D, dv) : 0);
  w.r = w.den + (causal ? (long long)batch_heads * seq : 0);
  w.kmax = w.r + (long long)batch_heads * seq;
  w.slots = w.kmax + (causal && running_max ? (long long)batch_heads * seq : 0);
  w.total = w.slots + backward_slots(batch_heads, seq, causal, tokens, causal_tiles, splits) * (long long)param_floats;
  return w;
}

}  // namespace lunajit
