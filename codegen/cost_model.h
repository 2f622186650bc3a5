// The cost model (issue 11): one model, used by the tuner to rank candidates
// (autotune/tuner.h) and by the kernel reports to predict (report/). Two
// halves, both pure functions (no compilation, no device):
//
//   1. KernelCounts: what one launch of a generated kernel does, counted from
//      the spec, the tile config and the problem shape (kernel_counts below):
//      DRAM bytes, FLOPs split into tensor-core and CUDA-core, shared-memory
//      (L1 datapath) wavefronts, special-function ops, grid and serial steps.
//   2. predict_kernel: the time those counts take on a GPU product
//      (codegen/gpu_specs.h) with the arch's limits (codegen/arch.h) and, when
//      the kernel was compiled, its ptxas resources (occupancy).
//
// ---------------------------------------------------------------- the model
//
//   Throughput limbs, each the time at the whole GPU's peak rate:
//     t_dram   = dram_bytes / BW                              (memory_gbps)
//     t_tensor = tc_flops / tensor_peak(tc_dtype)              (bf16/fp16; fp32 -> TF32)
//     t_fp32   = cuda_flops / fp32_peak
//     t_shared = smem_wavefronts / (SMs * 1 wavefront/clk * clock)
//     t_sfu    = sfu_ops / (SMs * 16 /clk * clock)
//   How much of the GPU the launch keeps busy (the old autotune model's terms):
//     blocks per SM   occupancy calculator rules (codegen/occupancy.h) from the
//                     threads, ptxas registers (64 assumed when not compiled)
//                     and static + dynamic shared memory
//     sm_fill         = min(1, blocks / SMs)
//     latency_hiding  = min(1, resident warps per SM * stages / 16): 16 warps keep
//                     the pipes and DRAM busy in practice; stages = pipeline_stages,
//                     the tiles whose loads a warp keeps in flight (2 for the
//                     tensor-core forward state pass's cp.async double buffer,
//                     mma_state_pipelined, and for the tensor-core causal
//                     forward walk's next-chunk prefetch, mma_causal_pipelined;
//                     else 1). An assumption that a GPU
//                     run has not calibrated yet.
//     wave_eff        = blocks / (waves * SMs * blocks per SM) for more than one wave
//     efficiency      = sm_fill * latency_hiding * wave_eff
//   Serial chain (the causal chunk walk: each block walks serial_steps chunks
//   one after another, each step waiting for its loads):
//     t_serial = waves * serial_steps * 600 cycles / clock / (stages * resident blocks per SM)
//     600 cycles: the order of a DRAM round trip that microbenchmarks report on
//     A100/H100 (~450-700 cycles; an assumption, not a measurement); a
//     pipeline of `stages` loads in flight or other resident blocks hide it;
//     waves = ceil(blocks / (SMs * blocks per SM)): a block of a later wave
//     starts its chain when one of the wave before ends (before 2026-12-07
//     the term left the waves out, so a super-chunk split into more blocks
//     than one wave holds looked shorter than it is).
//   t_kernel = max(limbs) / efficiency + t_serial + 3 us (launch)
//   The limiter is the largest limb, or "latency" when t_serial exceeds
//   max(limbs) / efficiency.
//
// ---------------------------------------------------------------- the counts
//
//   DRAM bytes and FLOPs: the conventions below (unchanged from the report's
//   former model). FLOPs are executed on CUDA cores (cuda_flops) unless the
//   kernel computes its GEMM-shaped products on tensor cores
//   (uses_tensor_cores: TileConfig::mma, the non-causal forward's state and
//   output kernels, the causal chunk kernel, and the non-causal bf16/fp16
//   backward's state, dstate (Phi_q^T [G | r]), dq (G S^T) and dkv (V dS^T,
//   Phi_k dS) kernels): those products move to tc_flops, phi, its J^T, the
//   denominators and the rest stay. The backward splits its operands into
//   bf16 hi + lo (docs/MATH.md "Tensor-core backward"): tc_flops count every
//   executed mma, 2 per product in the state pass, 3 in dstate and dq, 2 (V
//   dS^T) and 3 (Phi_k dS) in dkv, the extra ones added to flops, and the
//   operand wavefronts below scale the same way. fp16 I/O: V too is split
//   (bf16 holds fp16 exactly only as hi + lo), 3 per product in the state
//   pass and in V dS^T; its operands are bf16 (tc_dtype).
//
//   Shared-memory (L1 datapath) wavefronts, layout formulas for the kernels as
//   written (the PTX review of issue 11; the emulator's banks sanitizer, `lunajit
//   report --bank-profile`, measures the same quantity per site):
//     GEMM-shaped products on CUDA cores: every FMA reads both operands from
//       shared memory, one conflict-free wavefront per warp-wide load:
//       wavefronts = product FLOPs / 2 (FMAs) * 2 (operands) / 32 (lanes);
//       the causal masked tiles (A = phi(q) phi(k)^T, and dphi = ... A in the
//       backward) use 256-byte-stride fp32 rows: 8 wavefronts per load (32
//       where 4 would do), so their FLOPs count 8x.
//     GEMM-shaped products on tensor cores: operand bytes from shared
//       memory per FLOP of a 32 x 32 warp tile, e (32 + 32) / (2 * 32 * 32),
//       in 128-byte wavefronts (ldmatrix is conflict-free on swizzled tiles).
//     Feature map: one parameter load per FMA through L1; the lanes of a warp
//       read the parameters of `lines` distinct rows (wavefronts per warp load):
//       luna projections W x: min(M, 32) (lanes span the M projections), its
//       shared MLP: 1 (broadcast); the projection families (performer, rff,
//       t2r, hedgehog, slay): min(features, 32); element-wise (elu, relu,
//       cosformer): one operand per element, 1.
//       wavefronts = F / 2 * lines / 32 per token.
//     LUNA's feature map on tensor cores (feature_map_on_tensor_cores: the
//       mma kernels of a bf16 spec, templates/lunajit/feature_map_mma.cuh), per
//       row: tc_flops 2 * 2 d M8 (W split into two bf16 halves, M8 = M rounded
//       up to 8) + 2 M Hm L (psi = H W2^T); on CUDA cores F - 2 d M - 2 M Hm L
//       (the hidden layer's fmaf and activations, the gate, the output
//       activation); wavefronts M Hm / 32 (W1, b1: 8 loads per lane per 16
//       rows, projection and k16 step, one wavefront each) + d / 64 (the bf16
//       copy of x, stored) + d / 64 (its ldmatrix) + D / 64 (phi's stores).
//       The backward's kernels (state, dstate, dq, dkv, causal_dq, causal_dkv)
//       map phi to fp32 level (mma_phi_split_tile): psi in three split terms,
//       tc_flops 2 * 2 d M8 + 3 * 2 M Hm L, and phi stored as an fp32 tile by
//       conflict-free 64-bit fragment stores (rows padded to D + 8 words,
//       backward_phi_stride in codegen/launch_plan.h): D / 32 per row in
//       place of D / 64 (at a row stride of D words, D a multiple of 32, a
//       fragment's 8 rows shared banks: D / 8, the count until 2026-12-06).
//   SFU ops per token of phi: luna activations gelu 1 (erf), silu 2 (ex2, rcp),
//   tanh 1, relu 0; softplus 2 (ex2, lg2); performer D (exp); rff 2m (sin,
//   cos); hedgehog f (exp); slay R M + P; cosformer 2d; elu d; normalized
//   outputs one division per value element. The backward's J^T counts 2x.
//   Serial steps: causal_chunk and the scalar causal_dq, causal_dkv walk ceil(N / chunk)
//   chunks (causal_chunk with the super-chunk split, causal_super_chunks:
//   ceil(ceil(N / chunk) / R), R = state_splits, and block r reads the r
//   earlier ranges' partial states: + dv blocks B H R (R - 1) / 2 * 4 (D
//   dv_block + D) bytes); the causal backward's state scans ceil(nt / 8)
//   (below); every other kernel 0.
//
//   Byte and FLOP conventions (docs/MATH.md, docs/ARCHITECTURE.md "Cost model"
//   and "Kernel plan"; the kernels are templates/lunajit/linear_attention.cuh):
//
//   Notation: B batch, H heads, N seq, BH = B*H, d head_dim, dv value_dim,
//   D feature dim, e = dtype bytes (fp32 4, fp16/bf16 2), nd = ceil(dv / dv_block)
//   (blocks along dv), s = state_splits, T = block_tokens, nt = ceil(N / T),
//   P = parameter floats of one head's block (codegen/feature_params.h),
//   Hp = H when params_per_head else 1.
//
//   Bytes are compulsory DRAM traffic: every input tensor read once, every
//   output written once, workspace written once and read once, parameters read
//   once (4 * P * Hp). Re-reads of the same bytes by other blocks (K re-read
//   by each of the nd dv blocks, S re-read by every query tile) are assumed to
//   hit in L2 and are not counted, which is what "minimum traffic" in the
//   kernel plan means.
//
//   FLOPs are the arithmetic the kernels as written execute: an FMA counts 2,
//   every other add, multiply, compare, max or special-function evaluation
//   (exp, sin, erf, rsqrt, ...) counts 1; index arithmetic is not counted.
//   Work a kernel repeats (phi recomputed in each of the nd dv blocks) is
//   counted as often as it is done.
//
//   Feature map per token, F(x) (the cost of phi for one row; see
//   feature_map_flops_per_token for every family). LUNA neural, shared channels:
//       F = 2dM (projections u = W x) + M(2Hm + Hm + 2 Hm L + L) (1 -> Hm -> L MLP:
//           W1 u + b1 by FMA, activation, W2 by FMA, output activation) + ML (gate)
//     = 2dM + M(2Hm + 2Hm L) + M Hm + 2ML; the first two terms are the
//     ARCHITECTURE.md estimate, the rest are the element-wise ops it leaves out.
//     At d = 64, M = L = Hm/8 = 8: 1024 + 9216 + 512 + 128 = 10880.
//
//   Other families (per token): performer keys 2d + 3 + D(2d + 2) + 4D, queries
//   D more (their own max); rff m(2d + 4); elu 2d; relu d; t2r D(2d + 2);
//   hedgehog f(2d + 11) + 2; cosformer 7d; slay 2d + 2 + P(2d + 3) + RM(2d + 7)
//   + 3D. LUNA per-channel MLPs: 2dM + ML(Hm(4 + a) + o) + ML; bank_coef and
//   the rff variant, and the envelope (+ 2d + 5), in feature_map_flops_per_token.
//   Activations a: relu 1, gelu 5, silu 4, tanh 1; output o: relu 1, softplus 3.
//
//   Per kernel (Fq = F for queries, Fk = F for keys; they differ only for performer):
//   feature_map   bytes = BH N d e (x) + 4 BH N D (phi, fp32) + 4 P Hp [+ 4 BH key_stab read]
//                 flops = BH N Fk
//   key_stab      bytes = BH N d e + 4 BH + 4 P Hp
//                 flops = BH N (2d + 3 + D(2d + 2)) + BH N D (max)   (performer only)
//   state         bytes = BH N (d + dv) e + 4 BH s (D dv + D) + 4 P Hp
//                 flops = nd BH N Fk + 2 BH N D dv (S) + BH N D (z)
//   state_reduce  (s > 1) bytes = 4 BH s (D dv + D) (partials read) + 4 BH (D dv + D) (sum written)
//                 flops = BH s (D dv + D)
//                 The non-causal backward on tensor cores runs it (and dstate_reduce) with
//                 s = 1 too (4 BH (D dv + D) bytes read, no sum written) and stages S as
//                 bf16 hi + lo words: + 4 BH D dv bytes written, + 4 BH D dv flops
//   output        bytes = BH N d e + BH N dv e + 4 BH (D dv + D) (the state: partial 0) + 4 P Hp
//                 flops = nd BH N Fq + 2 BH N D dv (numerator)
//                         + normalize: nd BH N (2D + 1) (den) + BH N dv (divide)
//                 (every query tile reads the one reduced state; before state_reduce
//                 each tile summed the s partials itself: + nt BH s (D dv + nd D) flops)
//   causal_chunk  bytes = BH N (2d + 2dv) e + 4 P Hp   (q, k, v read, o written)
//                 flops = nd BH N (Fq + Fk)
//                         + per chunk of c tokens and dv block of w columns:
//                           c(c+1)/2 * 2D (masked A) + w (c(c+1) + 2Dc) (A V + phi_q S)
//                           + 2 D w c (S update) + D c (z update)
//                           + normalize: c(2D + 1) + c(c+1)/2 (den) + w c (divide)
//   (performer adds 4 BH bytes of key stabiliser read to state, causal_chunk and
//   feature_map, and its key_stab kernel runs first in the forward pass.)
//
//   Backward (templates/lunajit/linear_attention_backward.cuh, feature_map_backward.cuh;
//   grids in codegen/launch_plan.cpp). Further notation: nt (above) is also the
//   number of query or key tiles (non-causal), Pl = P when the family learns parameters
//   (has_learned_params) else 0, nrm = 1 when normalize else 0, J = the Jacobian-
//   transpose product dx = J_phi^T dphi of one row plus its parameter partial,
//   Jq for a query row, Jk for a key row. A dot product of length n counts 2n.
//   The backward works on whole value rows (no dv blocks) except its state pass.
//   Per token of the queries' side, when normalized:
//     den row  nrm (2D + 1)      phi(q) . z + eps
//     grad row nrm (dv + 2D + 2) g = dO / den, r = -(phi(q) . p) / den (dot, negate, divide) from
//                                the dq kernels' fp32 product p (query_r), not from the stored o
//   Workspace traffic: the (S, z) partials are written by state and summed into
//   partial 0 by state_reduce (s > 1), whose z part dstate reads and whose
//   whole dq reads; the (dS, dz) partials written by dstate, summed by
//   dstate_reduce, read by dkv; den (causal, normalized: 4 BH N) written by causal_dq, read by
//   causal_dkv; r (normalized: 4 BH N) written by dq / causal_dq, read by dstate /
//   causal_dkv (o itself is read only by the causal performer: o row = dv for it,
//   else 0); one parameter slot of 4 P bytes per block that maps dphi back
//   (dq, dkv: BH nt each; causal_dq, causal_dkv: BH each), written there and read
//   by param_reduce. Every kernel reads each of its inputs once (q, k, v, dout);
//   dq, dk, dv are written once.
//   key_stab      as the forward (performer only)
//   state         as the forward (the backward's state pass is the forward's, grid with nd)
//   state_reduce, dstate_reduce (s > 1) as the forward's state_reduce
//   dstate        bytes = BH N ((d + dv) e + 4 nrm) (q, dout, r) + 4 BH D (z) + 4 BH s (D dv + D)
//                         (dS, dz partials written) + 4 P Hp
//                 flops = BH N (Fq + den row + grad row) + 2 BH N D dv (dS) + 2 BH N D (dz)
//   dq            bytes = BH N ((2d + dv) e + 4 nrm) (q, dout read, dq, r written) + 4 BH (D dv + D)
//                         (the state) + 4 P Hp + 4 Pl BH nt (slots)
//                 flops = BH N (Fq + den row + grad row + D (2dv + nrm) (dphi = S g + z r) + Jq)
//   dkv           bytes = BH N (2d + 2dv) e (k, v read, dk, dv written) + 4 BH (D dv + D)
//                         + 4 P Hp + 4 Pl BH nt [+ 4 BH key_stab read]
//                 flops = BH N (Fk + 2 D dv (dphi = dS v + dz) + 2 D dv (dv = dS^T phi(k)) + Jk)
//   causal_dq     bytes = BH N (3d + 2dv + o row) e (q, k, v, dout read, dq written) + nrm 8 BH N
//                         (den, r written) + 4 P Hp + 4 Pl BH [+ 4 BH key_stab read]
//                 flops = BH * sum over chunks of c tokens (tri = c(c+1)/2, full dv):
//                           c (Fq + Fk) + tri 2D (A) + tri (2dv + 1) (B = v . g + r) + c (grad row)
//                           + c (den row) + nrm tri (den: sum of A) + c D (2dv + nrm) + 2D tri (dphi)
//                           + 2 D dv c (S update) + D c (z update) + c Jq
//   causal_dkv    bytes = BH N (3d + 3dv + o row) e (q, k, v, dout read, dk, dv written) + nrm 8 BH N
//                         (den, r read) + 4 P Hp + 4 Pl BH [+ 4 BH key_stab read]
//                 flops = BH * sum over chunks:
//                           c (Fq + Fk) + tri 2D (A) + tri (2dv + 1) (B) + c (grad row)
//                           + c D 2dv + 2D tri (dphi) + c dv 2D + 2 dv tri (dv)
//                           + 2 D dv c (dS update) + 2 D c (dz update) + c Jk
//   The causal backward on tensor cores (causal_backward_tiles; nt =
//   ceil(N / chunk) chunks in R = state_splits ranges of pr = ceil(nt / R)
//   (split_range: lr = ceil(nt / pr) ranges hold chunks), part = D dv + D,
//   tri_all = nt c (c + 1) / 2 with c = min(chunk, N) (the kept (row, column)
//   pairs, partial last chunk counted full), upd = nt - lr state updates
//   (after every chunk but each range's last), U = 2 N D (dv + 1) upd / nt):
//   state         as the forward's, one partial per range: 4 BH R part bytes written
//   state_scan    bytes = 2 * 4 BH R part (read and written in place) + 4 BH part (seed)
//   dstate_scan   the same + 4 BH part (dS_>=0 written); flops BH R part;
//                 serial steps ceil(R / 8) (8 ranges' loads in flight)
//   causal_dq     bytes = BH N (3d + 2dv) e + nrm 8 BH N + 4 P Hp + 2 * 4 BH R part
//                         (prefix read, the range's (dS, dz) written) + 4 Pl BH R
//                 mma:  2 N D dv (G S^T) + 2 N D (dv + 1) (Phi_q^T [G | r]), three split
//                       terms each, + U (S += Phi_k^T [V | 1]; two terms bf16, three fp16)
//                       + the scores A = Phi_q Phi_k^T, B = G V^T (masked_scores): it
//                       = nt mt (mt + 1) (m-tile, n-tile) items with kept entries, mt =
//                       ceil(c / 16), each (D + dv) / 16 k16 steps of three split terms:
//                       it (D + dv) / 16 * 3 * 4096 executed FLOPs
//                       + the intra-chunk products (IntraChunkTerms): ks = mt (mt + 1) / 2
//                       (m-tile, k16 step) pairs per chunk, each D / 8 n-tiles of three
//                       split terms: nt ks D / 8 * 3 * 4096 executed FLOPs
//                 fp32 tiles (1 wavefront per 32 FLOP-equivalents, as issued):
//                       32 it (D / 16 * (4 wq + 2 wk) + dv / 16 * 6 wv + 8) (the scores'
//                       fragment loads from the fp32 tiles, and their pair stores at
//                       2 wavefronts, rows c + 8 floats apart; wk = 2
//                       where phi's rows are padded, backward_phi_stride, wq too in
//                       causal_dq (causal_dkv keeps phi(q)'s rows D apart), else 8: a
//                       fragment's rows at the D-float stride share banks; wv = 2,
//                       G's and V's rows dv + 8 apart, backward_value_stride; 8 at dv)
//                       + 32 nt ks (wn 4 * 2 + D / 8 * 4 yq) (the intra-chunk fragments:
//                       per (m-tile, k-step) each of the wn warps of the output tiling
//                       loads A from the scores as 4 pairs, each n-tile B as 4 k-pair
//                       scalars, yq = 2 for phi(k)'s padded rows, 4 at D)
//                       + 4 tri_all nrm (den's row sums, 4-way at c + 8)
//                       + 6 D dv upd (the update's adds 2, the restaged hi + lo 2: S read
//                       once, the block max from the update's values; dS summed 2)
//                       (the emulator's count of block (0,0,0), default LUNA bf16, C 16:
//                       the scores' fragment loads 768 wavefronts, as this says; the
//                       fp32 dot products the scores were before issued 2,048; the
//                       fp32 dphi epilogue the intra-chunk products replaced, 768)
//                 flops = the above + BH N (Fq + Fk + grad row + den row + nrm D + Jq)
//                 serial steps pr (the walk)
//   causal_dkv    bytes = BH N (3d + 3dv) e + nrm 8 BH N + 4 P Hp + 4 BH R part + 4 Pl BH R
//                 mma:  4 N D dv (V dS^T two terms bf16, three fp16; Phi_k dS three)
//                       + U (dS += Phi_q^T [G | r], three)
//                       + the scores (B = G V^T + r), as causal_dq
//                       + the intra-chunk products as causal_dq over (D + dv) / 8 n-tiles
//                 fp32 tiles: the scores as causal_dq (stores 4 wavefronts: rows c + 4
//                       apart) + 32 nt ks (wn_D 8 + D / 8 * 4 * 4 + wn_dv 8 + dv / 8 * 4 yv)
//                       (A: 8 transposed scalar loads, conflict-free at c + 4; B: phi(q)'s
//                       rows D apart 4-way, G's yv = 2 at dv + 8, 4 at dv)
//                       + 4 D dv upd (as issued: no dS sum)
//                 flops = the above + BH N (Fq + Fk + grad row + D + Jk); serial steps pr
//   param_reduce  (learned families only) with slots = 2 BH nt (non-causal), 2 BH R
//                 (causal on tensor cores, R ranges) or 2 BH (the causal scans):
//                 and G = param_reduce_groups(slots / Hp, warps) groups per head block
//                 (templates/lunajit/layout.cuh: ~256 slots a warp):
//                 bytes = 4 P slots (read) + 4 P Hp G (group sums written)
//                 flops = P slots (one add per slot entry)
//                 serial steps ceil(slots / (Hp G warps) / 8) (8 loads in flight a lane)
//   param_sum     bytes = 4 P Hp G (read) + 4 P Hp (dparams written); flops = P Hp G
//                 serial steps ceil(G / warps / 8)
//   J, the Jacobian-transpose of one row (jacobian_per_row in cost_model.cpp):
//   - LUNA's neural map with shared channels: counted. With a = act activation
//     FLOPs, a' its derivative's (relu 1, gelu 9, silu 6, tanh 3), o the output
//     activation's, per row:
//       fp32 (feature_map_backward.cuh), per item (row, projection): u 2d; the MLP
//         again Hm (2 + a) + 2 Hm L; dpre L (2 + o); dh and du Hm (2L + 5 + a');
//         dW1, db1 (recomputing dh) Hm (2L + 6 + a'); dW2 (recomputing h per
//         channel) L Hm (4 + a); db2 L; then per row dx and dW 4dM:
//         J = M * item + 4dM (+ the envelope's 2D + 4d + 3). The feature map's
//         wavefront rule applies to these FLOPs. At the default: 56,576 (2F
//         would be 21,760).
//       tensor cores (feature_map_backward_mma.cuh; jacobian_on_tensor_cores):
//         dpre and db2 D (3 + o); per item and hidden unit a, act, act', da, du,
//         dW1, db1: M Hm (8 + a + a'); on mma u = X W^T with W split (2 * 2 d
//         M8, M8 = M rounded up to 8), dh = dpre W2, dW2^T += H^T dpre (2 M L Hm
//         each, three split terms), dx = dU W (2 d M8, three split terms) and
//         dW^T += X^T dU (2 d M8, two: x exact): tc 14 d M8 + 12 M L Hm. At the
//         default: 5,376 on CUDA cores + 56,320 on mma.
//         Wavefronts per row: M/16 per 16 items (8 L/8 ldmatrix of dpre, 4 Hm/8
//         hidden-tile stores, 8 Hm/16 ldmatrix.trans of them, 4 Hm/8 W1, b1
//         loads, 4 u and du) + 20 D / 128 (dpre's fp32 passes, hi + lo tiles)
//         + 2 d / 64 (x's bf16 copy and its ldmatrix) + M8 / 8 (u's stores,
//         4-way: bs's rows 2M + 1 floats apart)
//         + d/8 (8 KM + 16) / 16 (dx per 8 columns and 16 rows: 8 W wavefronts
//         per k-step of KM = M8 / 8, 16 for its two 64-bit stores, whose
//         fragment rows share banks; its dU loads are per tile, below)
//         + d/16 KM 20 / 16 (dW: an ldmatrix.x4 and 4 dU loads of 4 wavefronts,
//         since bs's rows are 2M + 1 floats apart and a fragment's lanes meet 4
//         to a bank, per 16 columns, 16 rows). At the default: 84 (the fp32
//         map: 282; 130.25 with dx, dW in fp32, 4 d M / 32).
//         Wavefronts per call (jacobian_per_tile; one call per token tile of
//         T rows, T = block_tokens or the chunk, on NW warps, W = min(NW,
//         ceil(T / 16) M) of which hold items): each of the W warps stores its
//         partials, 4 ceil(Hm / 64) (dW1, db1 as 64-bit pairs) + 4 Hm/16 L/8
//         (dW2^T's fragments); the block sums them, ceil((2 Hm + L Hm) / 32)
//         (W + 2) (the W partials read, dparams read and written); dW's
//         read-modify-write of dparams, 16 d/16 KM (W's rows are d floats
//         apart, so only c picks the bank; the odd t lanes take the other
//         row half: 2 wavefronts an access); dx's dU A fragments, 4 loads of 4
//         wavefronts per k-step once per (m-tile, slot) unit, ceil(T / 16)
//         min(NW, d/8) KM 16. At the default: 552 a causal 16-token chunk on 8
//         warps, 328 a 16-token tile on 4 (the emulator's counts of those
//         sites).
//         SFU: M Hm (act + act') (+ 2D for softplus's 1 - exp(-phi/gate)).
//   - every other map: ESTIMATE, not a count, J = 2F of the same row (the usual
//     "backward of a layer costs twice its forward" rule; relu's true J^T is d
//     compares per row). Every other backward term above counts the code.
//
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/arch.h"
#include "codegen/attention_spec.h"
#include "codegen/gpu_specs.h"
#include "codegen/launch_plan.h"
#include "codegen/tile_config.h"

namespace lunajit {

// What one launch of a kernel does. Every count is a total over the launch.
struct KernelCounts {
  std::string role;
  double bytes = 0;            // compulsory DRAM traffic
  double flops = 0;            // all FLOPs = tc_flops + cuda_flops
  double tc_flops = 0;         // on tensor cores (0 for the scalar kernels)
  DType tc_dtype = DType::bf16;  // operand type of the tensor-core products
  double cuda_flops = 0;       // on CUDA cores (FMA = 2)
  double smem_wavefronts = 0;  // shared-memory / L1 datapath wavefronts (128 B each)
  double sfu_ops = 0;          // special-function results
  double serial_steps = 0;     // chunks a block walks in series (0: none)
  int pipeline_stages = 1;     // loads in flight per serial step
  // The launch (from codegen/launch_plan.h; filled by pass_counts).
  double blocks = 1;
  int threads = 128;
  int64_t dynamic_smem = 0;
  double arithmetic_intensity() const { return bytes > 0 ? flops / bytes : 0; }
};

// Whether the config's kernels compute their GEMM-shaped products on tensor
// cores: TileConfig::mma on the forward of a bf16/fp16 spec (the non-causal
// state and output kernels, the causal chunk kernel; never the causal
// performer) and on the non-causal backward of a bf16/fp16 spec (state, dstate,
// dq, dkv; the feature map's J^T too where jacobian_on_tensor_cores says so);
// false for the causal backward.
bool uses_tensor_cores(const AttentionSpec& spec, const TileConfig& config, Pass pass);

// Whether those kernels also compute phi on tensor cores: LUNA's neural map
// with shared channels on a bf16 spec, d and Hm multiples of 16, L a multiple
// of 8, d + 8 <= 2 D (MmaPhiSupport in templates/lunajit/feature_map_mma.cuh;
// tests/runtime_nvrtc/mma_forward_compile_test.cpp checks that the two agree).
// Only the forward's state, output and causal_chunk kernels; never the
// standalone feature-map pass or the backward (whose kernels need phi in fp32
// for the Jacobian-transpose and the hi + lo split).
bool feature_map_on_tensor_cores(const AttentionSpec& spec, const TileConfig& config, Pass pass);

// FLOPs of phi for one token of one head (the conventions above), for a query
// row (is_query) or a key row; the two differ only for performer, whose
// queries take a max over their own features.
double feature_map_flops_per_token(const AttentionSpec& spec, bool is_query);

// The counts of the kernel with `role` of `pass` (feature_map: "feature_map",
// "key_stab"; forward: "key_stab", "state", "state_reduce", "output",
// "causal_chunk"; backward: "key_stab", "state", "state_reduce", "dstate",
// "dstate_reduce", "dq", "dkv", "causal_dq", "causal_dkv", "state_scan",
// "dstate_scan", "param_reduce", "param_sum") for one launch at `shape`; the launch fields
// keep their defaults. Error for a role the pass has no such kernel for
// (key_stab off performer, param_reduce for a family without learned
// parameters, an unknown role). The backward FLOPs include one estimated
// term, the feature map's J^T (above).
Result<KernelCounts> kernel_counts(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                   std::string_view role, const ProblemShape& shape);

// The counts of every kernel of the pass's launch plan at the runtime split
// count `splits` (plan_launches; 0: the config's compiled count), each kernel
// counted as run with it, launch fields filled.
Result<std::vector<KernelCounts>> pass_counts(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                              const ProblemShape& shape, int splits = 0);

// What ptxas reported for a kernel; absent when not compiled.
struct KernelUsage {
  int registers = 0;
  int static_smem = 0;
};

struct KernelPrediction {
  std::string role;
  double dram_ms = 0, tensor_ms = 0, fp32_ms = 0, shared_ms = 0, sfu_ms = 0;  // the limbs at peak
  double serial_ms = 0;
  int blocks_per_sm = 0;      // occupancy (ptxas registers, or 64 assumed)
  bool registers_known = false;
  double efficiency = 1;      // sm_fill * latency_hiding * wave_eff
  double ms = 0;              // the prediction
  std::string limiter;        // "dram", "tensor", "fp32", "shared", "sfu" or "latency"
  double limb_ms() const;     // the largest limb
};

// Constants of the model (above), exposed for the tests and the docs.
inline constexpr double kLaunchOverheadMs = 0.003;
inline constexpr int kWarpsToHideLatency = 16;
inline constexpr int kAssumedRegisters = 64;
inline constexpr double kSerialStepLatencyCycles = 600;

KernelPrediction predict_kernel(const KernelCounts& counts, const GpuSpec& gpu, const Arch& arch,
                                const std::optional<KernelUsage>& usage = std::nullopt);

struct PassPrediction {
  double ms = 0;  // sum over the pass's kernels
  int splits = 0;  // the runtime split count predicted at (best_splits)
  std::vector<KernelCounts> counts;
  std::vector<KernelPrediction> kernels;
};

// The predicted time of the pass at `shape` on `gpu` (whose limits are
// `arch`), at the runtime split count best_splits picks; `usage` maps roles to ptxas resources (missing: 64 registers).
Result<PassPrediction> predict_pass(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                    const ProblemShape& shape, const GpuSpec& gpu, const Arch& arch,
                                    const std::map<std::string, KernelUsage>& usage = {});

// The runtime split count (plan_launches) the pass runs at `shape` on `gpu`:
// the s in 1 .. config.state_splits() of the least predicted time, the fewest
// ranges on a tie (docs/ARCHITECTURE.md "Runtime split count"); the compiled
// count where no kernel of the pass reads it (reads_runtime_splits). The
// launch plans of the runner (CudaBackend::plan_splits), the tuner's ranking
// and the kernel reports all take it from here.
int best_splits(const AttentionSpec& spec, const TileConfig& config, Pass pass, const ProblemShape& shape,
                const GpuSpec& gpu, const Arch& arch, const std::map<std::string, KernelUsage>& usage = {});

}  // namespace lunajit
