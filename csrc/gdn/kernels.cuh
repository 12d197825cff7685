// CUDA kernels of the Gated DeltaNet decode ops (MATH.md, "Gated DeltaNet decode"; the CPU loops in cpu.cpp
// are the semantics). GDN state rows are independent given the token's normalised q and k: row i of S (K
// columns) needs (S k)_i, then u_i = beta (v_i - alpha (S k)_i), S_i' = alpha S_i + u_i k, o_i = S_i' . q: the
// same one-pass row streaming as the Mamba-2 kernels (../mamba2/kernels.cuh), with two dot products per row.
//
// * gdn_step_kernel: grid (row chunks of V, HV, batch). Each thread loads kUnroll rows (kLanes lanes per row,
//   16 columns per lane as 16-byte streaming loads) before it uses any, so many bytes are in flight per SM; the
//   first rows are issued as soon as the slot is known, and every warp normalises q and k itself (no shared
//   memory, no barrier). A head's V rows are split over blocks only as far as needed to fill the GPU.
// * gdn_replay_step_kernel: grid (row chunks of a key head's value heads, H, batch). The checkpoint rows stream
//   through a cp.async staging ring of kStages stages in shared memory; the ring u/k/g, v_t and the normalised
//   q/k are staged into shared memory in the prologue, the block scalars (k_j . k_t, k_j . q_t, the decays)
//   computed once per block. A slot's blocks count in on the cache's arrival counter once all their threads have
//   read the cursor; the slot's last block advances it (as the Mamba-2 replay step (mamba2_replay_step_kernel_v10) does). The numerical split:
//   an fp32 checkpoint's bf16 view streamed instead of the checkpoint (folds read the
//   master and write master and view), stochastic rounding of a 16-bit checkpoint at folds.
// * gdn_replay_verify_rowpass_kernel: the replay step's grid and staging for the T-token window, the row loop cut
//   to the 2 T dots per row (reduce-scattered into a shared table), everything else a row needs in a pass a thread
//   per row after the loop, the block scalars formed in parallel, and a key head's 256 rows in one block. It also
//   takes the numerical split: an fp32 checkpoint's bf16 view streamed, an early fold from the master writing
//   master and view; stochastic rounding of a 16-bit checkpoint at early folds.
// * gdn_replay_state_kernel: a block per (value head, row), not a hot path.
//
// Launch-configuration knobs (REPLAYSSM_TUNE="key=value,...", common/cuda_utils.cuh; read at every launch; the
// variants exist for fp32 state/checkpoint, bf16 activations, K = 128 only, the benchmark's configuration):
//   The step's default there (no gdn_step_* knob but bps/rows): one-warp blocks, 8 lanes per row, 2 rows a thread per
//   row iteration, the next 3 iterations' rows in flight (gdn_step_ahead), at most 32 rows per block. Setting
//   gdn_step_unroll or gdn_step_lanes alone selects 128-thread blocks:
//   gdn_step_unroll    rows in flight per thread: 1, 2, 4 (128 threads' default), 8 (not with 4 lanes: it spills)
//   gdn_step_lanes     lanes per state row: 4, 8 (default: 16 columns per lane), 16, 32
//   gdn_step_bps       blocks per SM the row split aims at when batch * HV is small (default 8)
//   gdn_step_rows      rows of a head per block (forced; any value >= 1)
//   gdn_step_threads   128: the 128-thread kernel (4 rows in flight per thread, 4 blocks/SM; the default before
//                      session 9); 32: one-warp blocks (8 lanes per row, gdn_step_unroll 1 or 2 (default), 16
//                      blocks/SM, rows per block not capped; with gdn_step_lanes=32: a row across the warp,
//                      gdn_step_unroll 8 (default, 24 blocks/SM) or 4 (32))
//   gdn_step_ahead     the one-warp, 2-row default's state of the next 1, 2 or 3 (default) row iterations in flight
//                      (cp.async into 4 KB shared-memory stages each) while one computes; 4: 2 of them, at most 102
//                      registers (ptxas: 96, 20 blocks/SM; 1-3: 118, 16 blocks/SM, as the former kernel's 104);
//                      0: none (each iteration loads its rows, then computes; before s34)
//   gdn_step_hints     1: the one-warp, 2-row kernel (the default, unstaged: gdn_step_ahead does not apply) with
//                      streaming (.cs) state loads and stores; its
//                      default has plain ones since session 10 (0.3-0.7% faster at batch 1, 128 and 256 in each of
//                      four runs, sessions 9 and 10)
//   replay_stage0_first 1 (default): the GDN replay step's prologue waits for its first row iteration and the ring
//                      only (the next kStages - 2 iterations' copies issued after the ring's, left in flight); 0: for
//                      every copy it issued (before session 35)
//   gdn_replay_variant default: 4 stages, 8 lanes per row, 4 blocks/SM; 0: 3 stages, 4 lanes, 3 blocks/SM (the
//                      default before 2026-12-01); 1: 4 stages, 4 lanes, 2 blocks/SM; 2: 6 stages, 8 lanes, 3 blocks/SM
//                      (plain caches; a cache with a view has its own configuration, any activation dtype and K)
//   gdn_view_variant   a cache with a bf16 view, bf16 activations, K = 128: default 4 stages, 8 lanes, 4 blocks/SM
//                      (4% faster at batch 256 and 32, level at 128, 3% slower at 1; 12 bytes spilled outside the
//                      row loop); 0: 6 stages, 8 lanes, 3 blocks/SM (the layout of every other view configuration).
//                      (Session 12 timed 6 stages at 4 blocks/SM: 3-4% slower at batch 32, level at 128 and 256; dropped.)
//   gdn_replay_bps     blocks per SM the row split aims at (default 12, ~4 waves of 3 blocks per SM; a plain cache's
//                      was 16 in sessions 35-48)
//   gdn_replay_rows    rows of a key head's value heads per block (forced; any value >= 1)
//   gdn_replay_min_rows the replay step's fewest rows per block where the bps split gives fewer (default 64; 0: none,
//                      the split's rows as before session 37)
//   gdn_replay_split   0: the replay step's rows per block as the bps split gives them (default: rounded up to split a
//                      key head's rows evenly)
//   replay_fold_first  0 / 1: as for the Mamba-2 replay step (mamba2/kernels.cuh; common/fold_order.cuh)
//   order_cursor       0: as for the Mamba-2 replay step (the blocks read their slot id and cursor themselves)
//   fold_phase_code    1: the replay step's four-blocks-an-SM kernels with the aligned folds' code for caches without
//                      a phase too (default: without it there; launch_gdn_replay_step)
//   fold_pair          an fp32 checkpoint's folding steps: 1 two row iterations per trip (each float4 of the ring-k
//                      tile read once for both rows), 0 one; default: two (since session 37; before, only past one
//                      resident wave, as for the Mamba-2 replay step); 16-bit activations only
//   view_fold_lean     0: a view's folding rows that the fold-first order marks stream the view and load the master
//                      where used, as unmarked ones do (default: they stream the master alone, staged; since session 50)
//   stream_lean        0: the replay step's row copies from 64-bit addresses, 1: from 32-bit offsets (default: those
//                      for a plain checkpoint wherever the offsets fit, since session 39 (before, only past one resident
//                      wave); a view's from 64-bit addresses, since session 51)
//   gdn_replay_prefetch 1: fetch the whole ring with the cursor (default: a view's grids within one wave; a plain
//                    cache's never, since session 38), 0: not
//   gdn_verify_rows    rows of a key head's value heads (HV/H * V) per gdn_replay_verify block (forced; any value >= 1)
//   gdn_verify_mma     0: gdn_replay_verify's row loop on the CUDA cores (default: its dots on tensor cores, 3xTF32,
//                      for an fp32 checkpoint streamed as it is)
//   gdn_verify_4bps    0: the tensor-core loop at three blocks an SM with three 32-column stages (default: four blocks
//                      an SM, two stages, where they keep the rows three get; session 31; 16-column stages lost in
//                      session 32, bench/patches/gdn-verify-16col.patch)
//   gdn_replay_small   the replay step's small kernel (replay_small.cuh): 2 (default) for grids of at most two
//                      blocks per SM, 1 whenever the shape allows, 0 never
#pragma once

#include <algorithm>
#include <string>

#include "../common/cuda_utils.cuh"
#include "../common/fast_div.h"
#include "../common/math.h"
#include "../common/rounding.h"
#include "../mamba2/kernels.cuh"  // RowLayout, ReplayLanes, cp_async16, copy_head_rows, aligned16
#include "params.h"

namespace replayssm {

// Sum of squares of one key head's vector (K elements, act_t) by one warp, in a fixed order: every kernel that
// normalises the same vector gets the same bits (verify writes the ring's k with it, as the step does).
template <typename act_t, int kK>
__device__ __forceinline__ float warp_sum_squares(const act_t* x) {
  float acc = 0.f;
  for (int n = threadIdx.x & 31; n < kK; n += 32) {
    const float v = to_float(x[n]);
    acc = fmaf(v, v, acc);
  }
  return group_sum<32>(acc);
}

// The token t of row b for value head hv: qn, kn (normalised; q scaled) of its key head into shared memory;
// returns g and beta through the references. All threads of the block call it (two barriers).
template <typename act_t, int kK, int kThreads>
__device__ void gdn_prepare_token(const GdnTokenParams& p, int b, int t, int hv, float* qn, float* kn, float* red, float& g,
                                  float& beta) {
  const int h = hv / (p.nheads / p.nkheads);
  const act_t* q = static_cast<const act_t*>(p.q) + b * p.q_batch_stride + t * p.q_token_stride + h * p.q_head_stride;
  const act_t* k = static_cast<const act_t*>(p.k) + b * p.k_batch_stride + t * p.k_token_stride + h * p.k_head_stride;
  for (int n = threadIdx.x; n < kK; n += kThreads) qn[n] = to_float(q[n]), kn[n] = to_float(k[n]);
  const int warp = threadIdx.x >> 5;
  if (warp == 0) red[0] = warp_sum_squares<act_t, kK>(q);
  if (warp == 1 % (kThreads / 32)) red[1] = warp_sum_squares<act_t, kK>(k);
  __syncthreads();
  const float qs = (p.l2norm ? 1.f / sqrtf(red[0] + kL2NormEps) : 1.f) * p.scale;
  const float ks = p.l2norm ? 1.f / sqrtf(red[1] + kL2NormEps) : 1.f;
  for (int n = threadIdx.x; n < kK; n += kThreads) qn[n] *= qs, kn[n] *= ks;
  g = gdn_log_decay(to_float(static_cast<const act_t*>(p.a)[b * p.a_batch_stride + t * p.a_token_stride + hv * p.a_head_stride]),
                    p.dt_bias ? p.dt_bias[hv] : 0.f, p.A_log[hv]);
  beta = sigmoid(to_float(static_cast<const act_t*>(p.b)[b * p.b_batch_stride + t * p.b_token_stride + hv * p.b_head_stride]));
  __syncthreads();
}


// Lanes per state row of the step kernel: 16 columns per lane (fewer lanes when a row has fewer 16-byte vectors),
// so that kUnroll rows, k and q fit in registers.
template <typename state_t, int kK>
struct GdnStepLanes {
  static constexpr int kVecsPerRow = kK * int(sizeof(state_t)) / 16;
  static constexpr int kWant = kK / 16 > 1 ? kK / 16 : 1;
  static constexpr int value = kVecsPerRow < kWant ? kVecsPerRow : kWant;
};

// This lane's columns of the token's key head q and k, normalised (q scaled), g and beta of value head hv. Every
// warp forms them itself from global memory (cached): warp_sum_squares' fixed order gives every warp, and every
// kernel, the same bits.
template <typename act_t, int kK, typename Layout>
__device__ __forceinline__ void gdn_token_columns(const GdnTokenParams& p, int b, int hv, int lane_in_row,
                                                  float (&kv)[Layout::kColsPerLane], float (&qv)[Layout::kColsPerLane],
                                                  float& g, float& beta) {
  const int h = hv / (p.nheads / p.nkheads);
  const act_t* q = static_cast<const act_t*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const act_t* k = static_cast<const act_t*>(p.k) + b * p.k_batch_stride + h * p.k_head_stride;
  const float a_raw = to_float(static_cast<const act_t*>(p.a)[b * p.a_batch_stride + hv * p.a_head_stride]);
  const float b_raw = to_float(static_cast<const act_t*>(p.b)[b * p.b_batch_stride + hv * p.b_head_stride]);
#pragma unroll
  for (int v = 0; v < Layout::kVecsPerLane; ++v)
#pragma unroll
    for (int e = 0; e < Layout::kVec; ++e) {
      kv[v * Layout::kVec + e] = to_float(k[Layout::col(lane_in_row, v, e)]);
      qv[v * Layout::kVec + e] = to_float(q[Layout::col(lane_in_row, v, e)]);
    }
  const float qq = warp_sum_squares<act_t, kK>(q), kk = warp_sum_squares<act_t, kK>(k);
  const float qs = (p.l2norm ? 1.f / sqrtf(qq + kL2NormEps) : 1.f) * p.scale;
  const float ks = p.l2norm ? 1.f / sqrtf(kk + kL2NormEps) : 1.f;
#pragma unroll
  for (int col = 0; col < Layout::kColsPerLane; ++col) kv[col] *= ks, qv[col] *= qs;
  g = gdn_log_decay(a_raw, p.dt_bias ? p.dt_bias[hv] : 0.f, p.A_log[hv]);
  beta = sigmoid(b_raw);
}

// Standard step: S <- alpha S + u k^T with u = beta (v - alpha S k); o = S q. Reads and writes |S|.
// Grid (row chunks of V, HV, batch); a block streams rows_per_block rows of one value head.
// kStreamHints: the state's loads and stores with the streaming hint (.cs, evict first), else plain.
// kAhead > 0 (fp32 state only): the state rows of the next kAhead row iterations are in flight (cp.async into
// shared memory, kAhead stages of the block's own vectors; each thread copies and later reads only its own, so no
// barrier) while a row iteration computes, and the v of the next iteration is loaded one iteration ahead; 0: each
// iteration loads its rows, then computes (the loads of one iteration in flight at a time per warp).
template <typename state_t, typename act_t, int kK, int kThreads, int kUnroll, int kLanesPerRow, int kMinBlocks,
          bool kStreamHints = true, int kAhead = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gdn_step_kernel(const GdnStepParams p, const int rows_per_block) {
  static_assert(kAhead == 0 || std::is_same_v<state_t, float>, "the staged step is for an fp32 state");
  using Layout = RowLayout<state_t, kK, kThreads, kUnroll, kLanesPerRow>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane, kVec = Layout::kVec;
  const int hv = blockIdx.y, b = blockIdx.z;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) {  // (waits first with PDL: no block of a step triggers before the launch ahead is done)
    pdl_wait();
    return;
  }
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(p.vdim, row_begin + rows_per_block);
  state_t* S = static_cast<state_t*>(p.state) + slot * p.state_slot_stride + int64_t(hv) * p.state_head_stride;
  const act_t* vin = static_cast<const act_t*>(p.v) + b * p.v_batch_stride + hv * p.v_head_stride;
  act_t* out = static_cast<act_t*>(p.out) + b * p.out_batch_stride + hv * p.out_head_stride;
  auto row_of = [&](int base, int u) { return Layout::row(base, u, warp, row_in_warp); };
  float s[kUnroll][kCols], vr[kUnroll];
  auto load_rows = [&](int base, bool state, bool inputs) {  // every load of the kUnroll rows issued before any is used
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(base, u);
      if (r < row_end) {
        if (state) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
            const state_t* ptr = S + int64_t(r) * p.state_row_stride + Layout::col(lane_in_row, v, 0);
            if constexpr (kStreamHints) load16_stream(ptr, *reinterpret_cast<float(*)[kVec]>(&s[u][v * kVec]));
            else unpack16<state_t>(*reinterpret_cast<const uint4*>(ptr), *reinterpret_cast<float(*)[kVec]>(&s[u][v * kVec]));
          }
        }
        if (inputs) vr[u] = to_float(vin[r]);
      }
    }
  };
  extern __shared__ uint4 step_stage[];
  const StepStages<Layout, kThreads, kUnroll, kAhead> stages{step_stage};
  auto issue_stage = [&](int it) { stages.issue(it, row_begin, row_end, S, p.state_row_stride, lane_in_row, row_of); };
  float vn[kUnroll];  // kAhead: the next iteration's v
  auto load_v = [&](int base, float (&dst)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(base, u);
      if (r < row_end) dst[u] = to_float(vin[r]);
    }
  };
  // The state needs only the slot: in flight while q, k, a and b arrive. With PDL (common/cuda_utils.cuh) it is
  // requested before the kernel ahead on the stream has finished; the token's inputs only after.
  if constexpr (kAhead > 0) {
#pragma unroll
    for (int a = 0; a < kAhead; ++a) issue_stage(a);
  } else {
    load_rows(row_begin, true, false);
  }
  pdl_wait();
  pdl_trigger();
  if constexpr (kAhead > 0) load_v(row_begin, vn);
  else load_rows(row_begin, false, true);

  float kv[kCols], qv[kCols], g, beta;
  gdn_token_columns<act_t, kK, Layout>(p, b, hv, lane_in_row, kv, qv, g, beta);
  const float alpha = expf(g);

  for (int base = row_begin, it = 0; base < row_end; base += Layout::kRowsPerIter, ++it) {
    if constexpr (kAhead > 0) {
      cp_async_wait<(kAhead > 0 ? kAhead - 1 : 0)>();  // this iteration's group (kAhead - 1 issued after it)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        vr[u] = vn[u];
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
          unpack16<state_t>(stages.vec(it, u, v), *reinterpret_cast<float(*)[kVec]>(&s[u][v * kVec]));
      }
      issue_stage(it + kAhead);  // into the stage just read (this thread's own vectors)
      if (base + Layout::kRowsPerIter < row_end) load_v(base + Layout::kRowsPerIter, vn);
    } else if (base != row_begin) {
      load_rows(base, true, true);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(base, u);
      const bool valid = r < row_end;
      float Sk = 0.f;
#pragma unroll
      for (int col = 0; col < kCols; ++col) Sk = fmaf(s[u][col], kv[col], Sk);
      Sk = group_sum<kLanes>(Sk);
      const float uu = beta * (vr[u] - alpha * Sk);
      float o = 0.f;
#pragma unroll
      for (int col = 0; col < kCols; ++col) {
        s[u][col] = alpha * s[u][col] + uu * kv[col];
        o = fmaf(s[u][col], qv[col], o);
      }
      o = group_sum<kLanes>(o);
      if (valid) {
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          state_t* ptr = S + int64_t(r) * p.state_row_stride + Layout::col(lane_in_row, v, 0);
          const float(&vec)[kVec] = *reinterpret_cast<const float(*)[kVec]>(&s[u][v * kVec]);
          if constexpr (kStreamHints) store16_stream(ptr, vec);
          else *reinterpret_cast<uint4*>(ptr) = pack16<state_t>(vec);
        }
        if (lane_in_row == 0) out[r] = from_float<act_t>(o);
      }
    }
  }
}

// Shared memory of one replay-step block (byte offsets, each section 16-byte aligned).
struct GdnReplaySmem {
  int tile_stride;  // floats per ring-u tile row: the block's rows rounded up to 8, plus 8 (conflict-free reads)
  int staging, ru, rk, vt, qn, kn, gs, gt, bt, al, weight, decay, kk, kq, total;
  __host__ __device__ GdnReplaySmem(int staging_bytes, int act_bytes, int rows, int K, int L, int max_heads) {
    auto up = [](int v) { return (v + 15) / 16 * 16; };
    tile_stride = (rows + 7) / 8 * 8 + 8;
    int o = 0;
    staging = o, o += up(staging_bytes);                 // [stage][vec][thread] checkpoint vectors
    ru = o, o += up((L - 1) * tile_stride * 4);          // [j][row] ring u_j of the block's rows
    rk = o, o += up((L - 1) * K * 4);                    // [j][tile_pos(n)] ring k_j of the key head
    vt = o, o += up(tile_stride * act_bytes);            // [row] v_t (raw)
    qn = o, o += up(K * 4);                              // [n] q_t, normalised and scaled
    kn = o, o += up(K * 4);                              // [n] k_t, normalised
    gs = o, o += up(max_heads * L * 4);                  // [head][j] ring g_j
    gt = o, o += up(max_heads * 4);                      // [head] g_t
    bt = o, o += up(max_heads * 4);                      // [head] beta_t
    al = o, o += up(max_heads * 4);                      // [head] alpha_t = exp(g_t)
    weight = o, o += up(max_heads * L * 4);              // [head][j] exp(g_{j+1} + ... + g_{w-1}), j < w
    decay = o, o += up(max_heads * 4);                   // [head] exp(G_w) = exp(g_0 + ... + g_{w-1})
    kk = o, o += up(L * 4);                              // [j] k_j . k_t, j < w
    kq = o, o += up(L * 4);                              // [j] k_j . q_t, j < w; [w] k_t . q_t
    total = o;
  }
};

// Replay step (MATH.md, "Replay form") at ring position w: S_{t-1} k_t and S_{t-1} q_t from the checkpoint (one
// pass) and the ring; u_t = beta (v_t - alpha S_{t-1} k_t); o_t = alpha S_{t-1} q_t + u_t (k_t . q_t). Appends
// (u_t, k_t, g_t) to the ring, or at a fold writes S_t = alpha S_{t-1} + u_t k_t^T to the checkpoint.
//
// Grid (row chunks, H, batch): a block's rows are rows of the value heads of one key head (row R = value head
// R / V of the key head, state row R % V), so the ring k tile and k_j . k_t, k_j . q_t are formed once for all
// the value heads the block covers.
// * The checkpoint streams through shared memory with cp.async, kStages deep; each thread copies and later reads
//   only its own vectors (no block barrier). The first stages are issued as soon as the slot is known.
// * The ring u of the block's rows, the ring k of the key head, the ring g and v_t are staged into shared memory
//   in the prologue (16-byte cp.async where the layout allows); the row loop issues no global load but the
//   checkpoint's. Within one wave (small batch) the whole ring is fetched with the cursor (prefetch_ring), one
//   dependent memory trip fewer; entries past the cursor are read and ignored.
// * Ring writes: each block its rows' u_t; the block holding a value head's first row its g_t; the key head's
//   first block (blockIdx.x == 0) k_t; at a fold each block its checkpoint rows. Nothing a block writes is read by
//   another block of the launch (they read ring positions < w; prefetched positions >= w are ignored).
// * The cursor: each block counts itself in on the slot's arrival counter once all its threads have read the
//   cursor; the slot's last block to arrive returns the counter to zero and advances the cursor.
// * The numerical split (MATH.md; replay_token in cpu.cpp is the semantics; written as mamba2_replay_step_kernel_v10
//   does it): src_t is what the row loop streams, the checkpoint itself (src_t == ckpt_t) or its
//   bf16 view (an fp32 checkpoint's), which then serves S_c k as well as S_c q; a fold reads the fp32 master row
//   (streaming loads) and writes the master and the view (rounded to nearest) of the same values. A 16-bit
//   checkpoint with sr_seed is rounded stochastically at folds: Philox keyed by the slot's seed, counter (element
//   (hv, r, n) of the slot's state, the slot's fold count), as the CPU. The fold count is read, and the load
//   consumed, before the block counts in; the slot's last block to arrive increments it. The fp32 plain
//   instantiation (src_t == ckpt_t == float) compiles none of this (ops.cpp: on CUDA a fold counter comes only
//   with a view or a 16-bit checkpoint).
template <typename ckpt_t, typename src_t, typename act_t, int kK, int kThreads, int kStages, int kLanesPerRow, int kMinBlocks,
          bool kFoldPair = false, bool kLean = false, bool kPhase = true>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gdn_replay_step_kernel(const GdnReplayParams p, const int rows_per_block, const int max_heads, const bool vec_u,
                           const bool vec_k, const bool vec_v, const bool prefetch_ring, const bool ring_ahead) {
  constexpr bool kView = !std::is_same_v<src_t, ckpt_t>;
  static_assert(!kView || std::is_same_v<ckpt_t, float>, "the output view is of an fp32 checkpoint");
  constexpr bool kNarrow = !std::is_same_v<ckpt_t, float>;  // a 16-bit checkpoint (stochastic rounding possible)
  constexpr bool kCountsFolds = kView || kNarrow;            // the caches that may carry a fold counter on CUDA
  constexpr DType kCkptDType = std::is_same_v<ckpt_t, __half> ? DType::kFloat16 : DType::kBFloat16;  // when kNarrow
  using Layout = RowLayout<src_t, kK, kThreads, 1, kLanesPerRow>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane;
  const GdnReplayCacheParams& c = p.cache;
  // The aligned folds' phase (common/fold_order.cuh): !kPhase compiles none of its code (the launcher's choice for a
  // cache without one where registers are tight).
  int* const fold_phase = kPhase ? c.fold_phase : nullptr;
  // b: the batch row (the fold-first order's), h: the key head; the slot and its cursor from the order's record when
  // it carries them (common/fold_order.cuh)
  const BlockRow row = block_row(p.row_order, p.order_carries, p.slot_ids, p.slot_ids_int64, c.cursor, p.num_slots);
  const int b = row.b, h = blockIdx.y;
  const int64_t slot = row.slot;
  if (slot == kPadSlot) {  // (waits first with PDL: no block of a step triggers before the launch ahead is done)
    pdl_wait();
    fold_phase_pad_block(fold_phase, gridDim.z, blockIdx.x == 0 && blockIdx.y == 0, c.ring_len);
    return;
  }
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_replay_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int w = row.w;  // (read in block_row: in flight while the first loads are issued; L2, before pdl_wait)
  const int phase = read_fold_phase(fold_phase);  // (aligned folds; -1 without)

  const int ratio = p.nheads / p.nkheads, V = p.vdim, L = c.ring_len;
  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(ratio * V, row_begin + rows_per_block);
  const int nrows = row_end - row_begin;
  const int head_begin = row_begin / V;                    // first value head of the block, within the key head's
  const int nheads_block = (row_end - 1) / V - head_begin + 1;
  const int hv0 = h * ratio + head_begin;                  // its global index
  const int n_iter = (nrows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  const int row0 = row_begin + warp * Layout::kRowsPerWarp + row_in_warp;  // this thread's row in iteration 0
  ckpt_t* ckpt = static_cast<ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(hv0) * c.ckpt_head_stride;
  const RowPos pos0{row0, row0 / V - head_begin, row0 % V};  // (row of the block, value head within the block, state row)
  auto ckpt_row = [&](const RowPos& q) { return ckpt + q.hl * c.ckpt_head_stride + int64_t(q.i) * c.ckpt_row_stride; };
  // The master row at a fold of a viewed checkpoint (formed where used, like the view's: registers are tight).
  auto master_row = [&](const RowPos& q) {
    return static_cast<ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(hv0 + q.hl) * c.ckpt_head_stride +
           int64_t(q.i) * c.ckpt_row_stride;
  };
  // The rows streamed for the products: the checkpoint's, or its view's.
  auto src_row = [&](const RowPos& q) {
    if constexpr (kView)
      return static_cast<src_t*>(c.view) + slot * c.view_slot_stride + int64_t(hv0 + q.hl) * c.view_head_stride +
             int64_t(q.i) * c.view_row_stride;
    else
      return ckpt_row(q);
  };

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const GdnReplaySmem off(kStages * kVecs * kThreads * 16, sizeof(act_t), rows_per_block, kK, L, max_heads);
  uint4* staging = reinterpret_cast<uint4*>(smem_raw + off.staging);
  float* ru = reinterpret_cast<float*>(smem_raw + off.ru);
  float* rk = reinterpret_cast<float*>(smem_raw + off.rk);
  act_t* vt = reinterpret_cast<act_t*>(smem_raw + off.vt);
  float* qn = reinterpret_cast<float*>(smem_raw + off.qn);
  float* kn = reinterpret_cast<float*>(smem_raw + off.kn);
  float* gs = reinterpret_cast<float*>(smem_raw + off.gs);
  float* gt = reinterpret_cast<float*>(smem_raw + off.gt);
  float* bt = reinterpret_cast<float*>(smem_raw + off.bt);
  float* al = reinterpret_cast<float*>(smem_raw + off.al);
  float* weight = reinterpret_cast<float*>(smem_raw + off.weight);
  float* decay = reinterpret_cast<float*>(smem_raw + off.decay);
  float* kk = reinterpret_cast<float*>(smem_raw + off.kk);
  float* kq = reinterpret_cast<float*>(smem_raw + off.kq);
  const int ts = off.tile_stride;

  RowPos copy_pos = pos0;
  // kLean (the launcher: a key head's value heads within 32-bit offsets; REPLAYSSM_TUNE stream_lean=0: not): this
  // lane's first column in the block's first value head and 32-bit strides, as the Mamba-2 replay step's. Without it
  // every copy formed its row's 64-bit address from the slot, head and row (~47 of ~160 SASS instructions of a GDN
  // view iteration that does not fold, nvcc 13.0; the Mamba-2 view gained 6% from the same change, 3114e59).
  const src_t* src_lane = kLean ? src_row(RowPos{0, 0, 0}) + Layout::col(lane_in_row, 0, 0) : nullptr;
  const int src_head_stride = int(kView ? c.view_head_stride : c.ckpt_head_stride);
  const int src_row_stride = int(kView ? c.view_row_stride : c.ckpt_row_stride);
  // Start copying this thread's vectors of iteration `it` into staging stage `stage` (= it % kStages; an empty
  // group past the end).
  auto issue = [&](int it, int stage) {
    if (it < n_iter && copy_pos.r < row_end)
      copy_row_async<Layout, kThreads, kLean>(staging, stage, copy_pos, src_lane, src_head_stride, src_row_stride, lane_in_row,
                                              src_row);
    cp_async_commit();
    copy_pos.advance<Layout::kRowsPerIter>(V);
  };
  // A view's folding rows that the fold-first order marks (grids past one resident wave; p.view_fold_stage, the
  // launcher's, REPLAYSSM_TUNE view_fold_lean=0: not) read no view. The view is always the master rounded to nearest
  // (allocation, reset_slots and every fold write them so), so the fp32 master the fold reads serves S k and S q too,
  // rounded to bf16: the view's values bit for bit, and 1/6 fewer bytes at a fold (read 4, write 4 + 2 an element,
  // where the view's 2 were read too). The marked blocks stream the master rows through the staging buffer,
  // kStages / 2 iterations ahead, in a row loop of their own (below), as the Mamba-2 view's since session 14
  // (mamba2/replay_step.cuh: its folding launch 866 -> 789 us at batch 256, H200). Unmarked folding rows (no order)
  // stream the view and load the master one iteration ahead, as before. H100, session 50, batch 256: 146.3 us against
  // the view_fold_lean=0 entry's 150.8 (-3.0%; predicted -2 to -4%; bench/results/session50/gdn_view_fs_call4_h100.json).
  constexpr int kMasterStages = kStages / 2, kMasterVecs = 2 * kVecs;  // (the staging buffer, in fp32 vectors)
  // (Not in the four-blocks-an-SM kernel with the phase's code, an aligned view's: there the loop pushed the non-lean
  // form from no spill to 28 bytes, with loads of it inside the row loops, ptxas and SASS; an aligned view's folds all
  // come in one step, where the order does nothing for them anyway.)
  constexpr bool kCanStage = kView && sizeof(src_t) == 2 && Layout::kVec == 8 && kLanes % 8 == 0 && kStages >= 4 &&
                             kStages % 2 == 0 && Layout::kRowsPerIter * (kK / 4) == kMasterVecs * kThreads &&
                             (kMinBlocks != 4 || !kPhase);
  const bool marked = kCanStage && p.view_fold_stage != 0 && p.row_order != nullptr && order_folds(row.entry);
  // A stage holds the iteration's rows whole, [row of the iteration][16-byte chunk], a row's lanes copying consecutive
  // chunks (whole sectors). Lane l's columns are chunks 2 (v kLanes + l) and + 1: read in place, the 8 lanes of a
  // quarter-warp would meet 2-way in the banks, so chunk k sits at k ^ bit 3 of k (a flip of bit 0): the copies (8
  // consecutive chunks from a multiple of 8) and the reads (lanes 0-3 even 16-byte slots, 4-7 odd) then meet in none.
  // The row's lanes read each other's copies: __syncwarp around the stage (the marked loop).
  auto master_chunk = [&](int k) { return (warp * Layout::kRowsPerWarp + row_in_warp) * (kK / 4) + (k ^ ((k >> 3) & 1)); };
  auto issue_master = [&](int it, int stage) {
    if constexpr (kCanStage) {
      if (it < n_iter && copy_pos.r < row_end)
        copy_row_chunks_async<kMasterVecs, kLanes>(staging + stage * kMasterVecs * kThreads, master_row(copy_pos), lane_in_row,
                                                   master_chunk);
    }
    cp_async_commit();
    copy_pos.advance<Layout::kRowsPerIter>(V);
  };
  // stage0_first (params.h, the default since session 35): only iteration 0 now, iterations 1..kStages-2 after the
  // ring's group (below), so that the prologue waits for iteration 0 and the ring alone (a thread's groups complete
  // in order; the row loop's waits count as before, the ring's group being older than iteration 1's). A marked block
  // the same with its master stages (1..kMasterStages-2 after the ring's group).
  const bool stage0_first = p.stage0_first != 0 && kStages > 2;
  auto issue_rest = [&] {  // the first stages after iteration 0's
    if (kCanStage && marked) {
#pragma unroll
      for (int it = 1; it < kMasterStages - 1; ++it) issue_master(it, it);
    } else {
#pragma unroll
      for (int it = 1; it < kStages - 1; ++it) issue(it, it);
    }
  };
  if (kCanStage && marked) issue_master(0, 0);
  else issue(0, 0);
  if (!stage0_first) issue_rest();

  // ---- Prologue: v_t and the ring into shared memory (one cp.async group), the token's q, k, g, beta.
  const float* ring_u = c.ring_u + slot * c.ring_u_slot_stride + int64_t(h) * ratio * c.ring_u_head_stride;
  const float* ring_k = c.ring_k + slot * c.ring_k_slot_stride + h * c.ring_k_head_stride;
  const float* ring_g = c.ring_g + slot * c.ring_g_slot_stride + hv0;
  // The ring's positions 0..nj-1, every entry by cp.async (the g entries too: a plain load whose value is stored to
  // shared memory holds its thread until it arrives, and the norms' loads after it wait behind it; .ca, through L1:
  // the ring was written by an earlier launch, complete before this one began).
  auto load_ring = [&](int nj) {
    copy_head_rows<float, kThreads>(ru, ts, ring_u, c.ring_u_pos_stride, c.ring_u_head_stride, V, row_begin, nrows, nj, vec_u);
    copy_head_rows<float, kThreads>(rk, kK, ring_k, c.ring_k_pos_stride, 0, kK, 0, kK, nj, vec_k,
                                    [](int n) { return Layout::tile_pos(n); });  // (the fold's axpy_tile reads it)
    for (int idx = threadIdx.x; idx < nheads_block * nj; idx += kThreads) {
      const int hl = idx / nj, j = idx % nj;
      cp_async4(&gs[hl * L + j], &ring_g[j * c.ring_g_pos_stride + hl]);
    }
  };
  // ring_ahead (with PDL): the ring is this cache's, written by this layer's previous step, so it is requested
  // before the wait too, behind the row stages.
  if (ring_ahead) {
    check_replay_cursor(w, L, slot, "gdn_replay_step");
    load_ring(prefetch_ring ? L - 1 : w);
  }

  // With PDL (common/cuda_utils.cuh) the rows above (the slot's checkpoint or view, and with ring_ahead the ring) were
  // requested before the kernel ahead on the stream had finished; this token's inputs are read, and anything
  // written, only after it has.
  pdl_wait();
  pdl_trigger();

  const act_t* v_t = static_cast<const act_t*>(p.v) + b * p.v_batch_stride + int64_t(h) * ratio * p.v_head_stride;
  copy_head_rows<act_t, kThreads>(vt, 0, v_t, 0, p.v_head_stride, V, row_begin, nrows, 1, vec_v);
  // (the ring's copies before the loads below, whose stores wait for them)
  load_ring_after_wait(ring_ahead, prefetch_ring, w, L, slot, "gdn_replay_step", load_ring);
  {  // warp 0 normalises q, warp 1 k (warp_sum_squares: the bits every GDN kernel forms); a thread per value head g, beta
    const act_t* q = static_cast<const act_t*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
    const act_t* k = static_cast<const act_t*>(p.k) + b * p.k_batch_stride + h * p.k_head_stride;
    if (warp == 0) {
      const float qs = (p.l2norm ? 1.f / sqrtf(warp_sum_squares<act_t, kK>(q) + kL2NormEps) : 1.f) * p.scale;
      for (int n = lane; n < kK; n += 32) qn[n] = to_float(q[n]) * qs;
    } else if (warp == 1 % Layout::kWarps) {
      const float ks = p.l2norm ? 1.f / sqrtf(warp_sum_squares<act_t, kK>(k) + kL2NormEps) : 1.f;
      for (int n = lane; n < kK; n += 32) kn[n] = to_float(k[n]) * ks;
    }
    constexpr int kFirst = kThreads >= 128 ? 64 : 0;  // warps 2 and 3 first: no wait behind the norms
    for (int hl = int(threadIdx.x) - kFirst; hl < nheads_block; hl += kThreads) {
      if (hl < 0) continue;
      const int hv = hv0 + hl;
      const float g = gdn_log_decay(to_float(static_cast<const act_t*>(p.a)[b * p.a_batch_stride + hv * p.a_head_stride]),
                                    p.dt_bias ? p.dt_bias[hv] : 0.f, p.A_log[hv]);
      gt[hl] = g;
      al[hl] = expf(g);
      bt[hl] = sigmoid(to_float(static_cast<const act_t*>(p.b)[b * p.b_batch_stride + hv * p.b_head_stride]));
    }
  }
  check_replay_cursor(w, L, slot, "gdn_replay_step");
  check_fold_phase(fold_phase, phase, L, "gdn_replay_step");
  cp_async_commit();
  if (stage0_first) issue_rest();
  // The fold count (stochastic rounding's Philox counter): read, and the load consumed, before the block counts in,
  // since the slot's last block increments it. (Only stochastic rounding uses it in the row loop; the increment
  // re-reads it, so that no register holds it across the loop: at 168 registers the view kernels spilled.)
  uint32_t fold_no = 0;
  if constexpr (kNarrow) {
    if (c.sr_seed != nullptr) {  // (fold_count is then present: ops.cpp)
      fold_no = uint32_t(c.fold_count[slot]);
      if (fold_no == 0xffffffffu) __trap();  // (consumes the load before the barrier; 2^32 folds do not happen)
    }
  }
  // The ring's group and every group before it (stage0_first: iterations 1..kStages-2 may stay in flight).
  if (!stage0_first) cp_async_wait<0>();
  else if (kCanStage && marked) cp_async_wait<(kMasterStages > 2 ? kMasterStages - 2 : 0)>();
  else cp_async_wait<(kStages > 2 ? kStages - 2 : 0)>();
  __syncthreads();  // tiles and token written; every thread of the block has read the cursor (and the fold count)

  // Count this block in: all its threads have read the cursor, so the slot's last block to arrive may advance it
  // (the slot's other blocks read it before they arrived). The answer is used at the end.
  const int blocks_per_slot = gridDim.x * gridDim.y;
  int arrived = 0, counted = 0;
  if (threadIdx.x == 0) {
    arrived = atomicAdd(&c.arrivals[slot], 1);
    counted = fold_phase_count_in(fold_phase, gridDim.z);
  }

  // ---- Block scalars: k_j . k_t, k_j . q_t (j == w: k_t . q_t) and the decays, as the Mamba-2 replay step's lean
  // prologue forms its own: 8 lanes per ring position j (every position at once for w < kThreads / 8), each lane over
  // kK / 8 columns in 16-byte groups (lane l8 the groups l8 + 8 e: a position's 8 lanes read 128 consecutive bytes
  // of k_t and q_t, and of ring k for an fp32 checkpoint; a 16-bit view's tile order pairs them 2-way, as before),
  // and then, on the same 8 lanes, position j's decays, a lane per value head (each suffix sum in replay_decays'
  // order, as before: the same bits). Before, a warp formed one position's dots at a time (4 positions per warp in
  // sequence at w = 15) and the decays waited behind them on a thread per (value head, j).
  const bool fold = folds_at(w, phase, L);
  // (the order's mark and the cursor agree: the marked loop reads master stages, the other the view's)
  RSSM_DEVICE_CHECK(!kCanStage || p.view_fold_stage == 0 || p.row_order == nullptr || marked == fold,
                    "gdn_replay_step: the order's fold mark (%d) disagrees with slot %lld's cursor %d", int(marked), (long long)slot, w);
  {
    const int lane8 = lane & 7;
    for (int first = warp * 4; first <= w; first += kThreads / 8) {  // (every lane of a warp: the same trip count)
      const int j = first + (lane >> 3);
      float a = 0.f, q = 0.f;
      if (j <= w) {
        const float* kj = j < w ? rk + j * kK : kn;
        const bool tiled = j < w;  // (rk: the tile layout, which keeps 16-byte groups whole)
#pragma unroll
        for (int e4 = 0; e4 < (kK / 4 + 7) / 8; ++e4) {
          const int n = (e4 * 8 + lane8) * 4;
          if (kK % 32 != 0 && n >= kK) break;  // (kK = 16: lanes 4-7 idle)
          const float4 kj4 = *reinterpret_cast<const float4*>(kj + (tiled ? Layout::tile_pos(n) : n));
          const float4 kn4 = *reinterpret_cast<const float4*>(kn + n), qn4 = *reinterpret_cast<const float4*>(qn + n);
          a = fmaf(kj4.x, kn4.x, a), q = fmaf(kj4.x, qn4.x, q);
          a = fmaf(kj4.y, kn4.y, a), q = fmaf(kj4.y, qn4.y, q);
          a = fmaf(kj4.z, kn4.z, a), q = fmaf(kj4.z, qn4.z, q);
          a = fmaf(kj4.w, kn4.w, a), q = fmaf(kj4.w, qn4.w, q);
        }
      }
      a = group_sum<8>(a), q = group_sum<8>(q);  // (a butterfly: every lane of the 8 holds the sums)
      if (j <= w && lane8 == 0) kk[j] = a, kq[j] = q;
      if (j < w) {
        for (int hl = lane8; hl < nheads_block; hl += 8) {
          float suffix = 0.f;
          for (int m = w - 1; m > j; --m) suffix += gs[hl * L + m];
          weight[hl * L + j] = expf(suffix);
          if (j == 0) decay[hl] = expf(suffix + gs[hl * L]);
        }
      } else if (j == 0) {  // (w == 0: nothing in the ring)
        for (int hl = lane8; hl < nheads_block; hl += 8) decay[hl] = 1.f;
      }
    }
  }
  __syncthreads();
  float kv[kCols], qv[kCols];  // this lane's columns of k_t and q_t
#pragma unroll
  for (int v = 0; v < kVecs; ++v)
#pragma unroll
    for (int e = 0; e < Layout::kVec; ++e) {
      kv[v * Layout::kVec + e] = kn[Layout::col(lane_in_row, v, e)];
      qv[v * Layout::kVec + e] = qn[Layout::col(lane_in_row, v, e)];
    }
  const float kq_t = kq[w];
  if (!fold) {  // append k_t (the key head's first block) and g_t (the block holding the value head's first row)
    if (blockIdx.x == 0) {
      float* ring_k_w = c.ring_k + slot * c.ring_k_slot_stride + w * c.ring_k_pos_stride + h * c.ring_k_head_stride;
      for (int n = threadIdx.x; n < kK; n += kThreads) ring_k_w[n] = kn[n];
    }
    for (int hl = threadIdx.x; hl < nheads_block; hl += kThreads)
      if ((head_begin + hl) * V >= row_begin) c.ring_g[slot * c.ring_g_slot_stride + w * c.ring_g_pos_stride + hv0 + hl] = gt[hl];
  }
  act_t* out = static_cast<act_t*>(p.out) + b * p.out_batch_stride + int64_t(hv0) * p.out_head_stride;
  float* ring_u_w = c.ring_u + slot * c.ring_u_slot_stride + w * c.ring_u_pos_stride + int64_t(hv0) * c.ring_u_head_stride;

  // ---- Stream the block's rows.
  // Steps that do not fold defer everything after the row's dot products to an epilogue that runs for kLanes
  // consecutive iterations at once, a row per lane (lane k of a row's lanes keeps iteration k's S k and S q, its
  // head and p packed in `pend`): the ring's part of both products, u, the output and the ring append, by one
  // lane per row where every lane of the row ran them (as in the Mamba-2 replay step, bench/NOTES.md "Session 6").
  // A fold needs u in every lane of the row in the same iteration, so folding steps keep the per-iteration form.
  float sk_pend = 0.f, sq_pend = 0.f;
  int pend = -1;
  int stage = 0;  // it % kStages
  RowPos pos = pos0;
  // A fold of a viewed checkpoint reads the fp32 master row of each iteration: loaded one iteration ahead (the
  // first before the loop), so that the loads' latency overlaps an iteration's work instead of stalling it.
  float mnext[kView ? kCols : 1];
  auto load_master = [&](const RowPos& r) {
    if constexpr (kView) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
#pragma unroll
        for (int e = 0; e < Layout::kVec; e += 4) {
          const float4 m = r.r < row_end ? __ldcs(reinterpret_cast<const float4*>(master_row(r) + Layout::col(lane_in_row, v, e)))
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
          mnext[v * Layout::kVec + e] = m.x, mnext[v * Layout::kVec + e + 1] = m.y, mnext[v * Layout::kVec + e + 2] = m.z,
                                    mnext[v * Layout::kVec + e + 3] = m.w;
        }
    }
  };
  // A folding row (the staged loop and the general one below): its output and u from this lane's partial products
  // (two chains each, decayed), the ring's part added across the row's lanes; then the row's new state in s,
  // S_t = alpha (exp(G_w) S_c + sum_j weight_j u_j k_j^T) + u_t k_t^T (the pair loop's arithmetic: the same bits).
  auto fold_output = [&](const float (&pk)[2], const float (&pq)[2], float dcy, const float* wh, int hl, int rl, const RowPos& q,
                         bool valid) {
    float Sk = (pk[0] + pk[1]) * dcy, Sq = (pq[0] + pq[1]) * dcy;
    for (int j = lane_in_row; j < w; j += kLanes) {
      const float wu = wh[j] * ru[j * ts + rl];
      Sk = fmaf(wu, kk[j], Sk), Sq = fmaf(wu, kq[j], Sq);
    }
    Sk = group_sum<kLanes>(Sk), Sq = group_sum<kLanes>(Sq);
    const float alpha = al[hl];
    const float u = bt[hl] * (to_float(vt[rl]) - alpha * Sk);
    if (valid && lane_in_row == 0) out[q.hl * p.out_head_stride + q.i] = from_float<act_t>(alpha * Sq + u * kq_t);
    return u;
  };
  auto fold_row = [&](float (&s)[kCols], float dcy, const float* wh, int rl, float alpha, float u) {
#pragma unroll
    for (int col = 0; col < kCols; ++col) s[col] *= dcy;
#pragma unroll 1
    for (int j = 0; j < w; ++j) Layout::axpy_tile(wh[j] * ru[j * ts + rl], rk + j * kK, lane_in_row, s);
#pragma unroll
    for (int col = 0; col < kCols; ++col) s[col] = fmaf(alpha, s[col], u * kv[col]);
  };
  // A folding step of an fp32 checkpoint in a kFoldPair kernel (REPLAYSSM_TUNE fold_pair, the launcher): two row
  // iterations per trip, so that each float4 of the ring-k tile the rank-w update reads serves two rows (4 shared
  // wavefronts per row and entry before). ncu, H200, batch 256, every row folding (bench/NOTES.md, session 15): 351
  // us and 62.9M shared wavefronts against 428 us and 89.6M one row per trip. k_t and q_t come from shared memory here (kv, qv are the loop below's: live across this loop as
  // well, they would not fit). Per row the same arithmetic in the same order as the loop below: the same bits.
  static_assert(!kFoldPair || (!kView && !kNarrow), "row pairs are an fp32 checkpoint's fold");
  const bool pair_fold = kFoldPair && fold;
  if (pair_fold) {
    if constexpr (kFoldPair) {
      for (int it = 0; it < n_iter; it += 2) {
        issue(it + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);  // (that stage was read last trip)
        cp_async_wait<kStages - 2>();  // this thread's vectors of iterations it and it + 1 have landed
        const int stage_b = stage == kStages - 1 ? 0 : stage + 1;
        float sa[kCols], sb[kCols];
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          unpack16<src_t>(staging[(stage * kVecs + v) * kThreads + threadIdx.x], *reinterpret_cast<float(*)[Layout::kVec]>(&sa[v * Layout::kVec]));
          unpack16<src_t>(staging[(stage_b * kVecs + v) * kThreads + threadIdx.x], *reinterpret_cast<float(*)[Layout::kVec]>(&sb[v * Layout::kVec]));
        }
        const RowPos qa = pos;
        pos.advance<Layout::kRowsPerIter>(V);
        const RowPos qb = pos;
        pos.advance<Layout::kRowsPerIter>(V);
        const bool va = qa.r < row_end, vb = qb.r < row_end;  // (vb false past the last iteration)
        const int hla = va ? qa.hl : 0, rla = va ? qa.r - row_begin : 0, hlb = vb ? qb.hl : 0, rlb = vb ? qb.r - row_begin : 0;
        float pka[2] = {0.f, 0.f}, pqa[2] = {0.f, 0.f}, pkb[2] = {0.f, 0.f}, pqb[2] = {0.f, 0.f};
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < Layout::kVec; ++e) {
            const int col = v * Layout::kVec + e, n = Layout::col(lane_in_row, v, e);
            const float kc = kn[n], qc = qn[n];
            pka[col % 2] = fmaf(sa[col], kc, pka[col % 2]), pqa[col % 2] = fmaf(sa[col], qc, pqa[col % 2]);
            pkb[col % 2] = fmaf(sb[col], kc, pkb[col % 2]), pqb[col % 2] = fmaf(sb[col], qc, pqb[col % 2]);
          }
        // Iteration it + kStages into iteration it's stage, whose vectors are in sa (the shared loads are consumed).
        issue(it + kStages, stage);
        stage = stage_b == kStages - 1 ? 0 : stage_b + 1;
        const float da = decay[hla], db = decay[hlb];
        float Ska = (pka[0] + pka[1]) * da, Sqa = (pqa[0] + pqa[1]) * da;
        float Skb = (pkb[0] + pkb[1]) * db, Sqb = (pqb[0] + pqb[1]) * db;
        const float* wa = weight + hla * L;
        const float* wb = weight + hlb * L;
        for (int j = lane_in_row; j < w; j += kLanes) {
          const float wua = wa[j] * ru[j * ts + rla], wub = wb[j] * ru[j * ts + rlb];
          Ska = fmaf(wua, kk[j], Ska), Sqa = fmaf(wua, kq[j], Sqa);
          Skb = fmaf(wub, kk[j], Skb), Sqb = fmaf(wub, kq[j], Sqb);
        }
        Ska = group_sum<kLanes>(Ska), Sqa = group_sum<kLanes>(Sqa);
        Skb = group_sum<kLanes>(Skb), Sqb = group_sum<kLanes>(Sqb);
        const float alpha_a = al[hla], alpha_b = al[hlb];
        const float ua = bt[hla] * (to_float(vt[rla]) - alpha_a * Ska), ub = bt[hlb] * (to_float(vt[rlb]) - alpha_b * Skb);
        if (lane_in_row == 0) {
          if (va) out[qa.hl * p.out_head_stride + qa.i] = from_float<act_t>(alpha_a * Sqa + ua * kq_t);
          if (vb) out[qb.hl * p.out_head_stride + qb.i] = from_float<act_t>(alpha_b * Sqb + ub * kq_t);
        }
        // S_t = alpha (exp(G_w) S_c + sum_j weight_j u_j k_j^T) + u_t k_t^T, for both rows.
#pragma unroll
        for (int col = 0; col < kCols; ++col) sa[col] *= da, sb[col] *= db;
#pragma unroll 1
        for (int j = 0; j < w; ++j) Layout::axpy_tile2(wa[j] * ru[j * ts + rla], wb[j] * ru[j * ts + rlb], rk + j * kK, lane_in_row, sa, sb);
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < Layout::kVec; ++e) {
            const int col = v * Layout::kVec + e;
            const float kc = kn[Layout::col(lane_in_row, v, e)];
            sa[col] = fmaf(alpha_a, sa[col], ua * kc), sb[col] = fmaf(alpha_b, sb[col], ub * kc);
          }
        if (va) Layout::store_row(ckpt_row(qa), lane_in_row, sa);
        if (vb) Layout::store_row(ckpt_row(qb), lane_in_row, sb);
      }
    }
  } else if (kCanStage && marked) {
    if constexpr (kCanStage) {
      // A marked folding row of a view (above): its master row from the staging buffer, S k and S q from its bf16
      // rounding (the view's values), then the fold as the loop below forms it (the same arithmetic in the same order:
      // the same bits).
      for (int it = 0; it < n_iter; ++it) {
        __syncwarp();  // the row's lanes have read the stage that this issue refills
        issue_master(it + kMasterStages - 1, stage == 0 ? kMasterStages - 1 : stage - 1);
        cp_async_wait<kMasterStages - 1>();
        __syncwarp();  // and its lanes' copies of iteration `it` have landed
        const RowPos q = pos;
        pos.advance<Layout::kRowsPerIter>(V);
        const bool valid = q.r < row_end;
        const int hl = valid ? q.hl : 0, rl = valid ? q.r - row_begin : 0;
        float s[kCols];
        read_row_chunks<Layout, kMasterVecs>(staging + stage * kMasterVecs * kThreads, lane_in_row, master_chunk, s);
        stage = stage == kMasterStages - 1 ? 0 : stage + 1;
        float pk[2] = {0.f, 0.f}, pq[2] = {0.f, 0.f};  // (the loop below's chains, on the view's values)
#pragma unroll
        for (int col = 0; col < kCols; ++col) {
          const float sv = round_to<src_t>(s[col]);
          pk[col % 2] = fmaf(sv, kv[col], pk[col % 2]), pq[col % 2] = fmaf(sv, qv[col], pq[col % 2]);
        }
        const float dcy = decay[hl];
        const float* wh = weight + hl * L;
        const float u = fold_output(pk, pq, dcy, wh, hl, rl, q, valid);
        fold_row(s, dcy, wh, rl, al[hl], u);
        if (valid) Layout::store_master_and_view(master_row(q), src_row(q), lane_in_row, s);
      }
    }
  } else {
    if (kView && fold) load_master(pos0);
    for (int it = 0; it < n_iter; ++it) {
      issue(it + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
      cp_async_wait<kStages - 1>();  // this thread's vectors of iteration `it` have landed
      const RowPos q = pos;
      pos.advance<Layout::kRowsPerIter>(V);
      const bool valid = q.r < row_end;
      const int hl = valid ? q.hl : 0, rl = valid ? q.r - row_begin : 0;
      float s[kCols];
  #pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        unpack16<src_t>(staging[(stage * kVecs + v) * kThreads + threadIdx.x],
                        *reinterpret_cast<float(*)[Layout::kVec]>(&s[v * Layout::kVec]));
      }
      stage = stage == kStages - 1 ? 0 : stage + 1;
      float pk[2] = {0.f, 0.f}, pq[2] = {0.f, 0.f};  // two independent chains per product
  #pragma unroll
      for (int col = 0; col < kCols; ++col) pk[col % 2] = fmaf(s[col], kv[col], pk[col % 2]), pq[col % 2] = fmaf(s[col], qv[col], pq[col % 2]);
      const float dcy = decay[hl];
      const float* wh = weight + hl * L;
      if (!fold) {
        const float Sk = group_sum<kLanes>((pk[0] + pk[1]) * dcy), Sq = group_sum<kLanes>((pq[0] + pq[1]) * dcy);
        const int k = it % kLanes;
        if (k == lane_in_row) sk_pend = Sk, sq_pend = Sq, pend = valid ? q.hl << 16 | q.i : -1;
        if (k == kLanes - 1 || it == n_iter - 1) {  // lanes past the last iteration hold nothing (pend -1)
          if (pend >= 0) {
            const int hp = pend >> 16, ip = pend & 0xffff, rp = (head_begin + hp) * V + ip - row_begin;
            const float* whp = weight + hp * L;
            float sk = sk_pend, sq = sq_pend;
  #pragma unroll 4
            for (int j = 0; j < w; ++j) {
              const float wu = whp[j] * ru[j * ts + rp];
              sk = fmaf(wu, kk[j], sk), sq = fmaf(wu, kq[j], sq);
            }
            const float alpha = al[hp];
            const float u = bt[hp] * (to_float(vt[rp]) - alpha * sk);
            out[hp * p.out_head_stride + ip] = from_float<act_t>(alpha * sq + u * kq_t);
            ring_u_w[hp * c.ring_u_head_stride + ip] = u;
          }
          pend = -1;
        }
        continue;
      }
      const float u = fold_output(pk, pq, dcy, wh, hl, rl, q, valid);
      if constexpr (kView) {  // this lane's columns of the fp32 master row (the view served S k and S q), then the next
  #pragma unroll
        for (int col = 0; col < kCols; ++col) s[col] = mnext[col];
        if (it + 1 < n_iter) load_master(pos);
      }
      fold_row(s, dcy, wh, rl, al[hl], u);
      if (valid) {
        if constexpr (kView) {  // the fp32 master and its bf16 view (rounded to nearest) of the same values
          Layout::store_master_and_view(master_row(q), src_row(q), lane_in_row, s);
        } else {
          bool rounded = false;
          if constexpr (kNarrow) {
            if (c.sr_seed != nullptr) {  // stochastic rounding: Philox keyed by the slot's seed, its fold count, the element
              const uint64_t seed = uint64_t(c.sr_seed[slot]);
              // Element (hv, r, n) is counter (hv V + r) K + n, as on the CPU. The row's first column of this lane is made
              // opaque so that the compiler forms each column's counter here rather than keeping 32 of them live
              // across the row loop (it spilled them); a vector is rounded and stored before the next one.
              int64_t index0 = (int64_t(hv0 + q.hl) * V + q.i) * kK + Layout::col(lane_in_row, 0, 0);
              asm volatile("" : "+l"(index0));
              ckpt_t* row = ckpt_row(q);
  #pragma unroll
              for (int v = 0; v < kVecs; ++v) {
                float r[Layout::kVec];
  #pragma unroll
                for (int e = 0; e < Layout::kVec; ++e)
                  r[e] = stochastic_round_to(kCkptDType, s[v * Layout::kVec + e],
                                             fold_random(seed, fold_no, uint64_t(index0 + (Layout::col(0, v, e) - Layout::col(0, 0, 0)))));
                store16_stream(row + Layout::col(lane_in_row, v, 0), r);
              }
              rounded = true;
            }
          }
          if (!rounded) Layout::store_row(ckpt_row(q), lane_in_row, s);
        }
      }
    }
  }
  cp_async_wait<0>();

  if (threadIdx.x == 0) {
    const bool row_last = arrived == blocks_per_slot - 1;
    if (row_last) {
      atomicSub(&c.arrivals[slot], blocks_per_slot);  // zero again for the next launch
      c.cursor[slot] = fold ? 0 : w + 1;
      if constexpr (kCountsFolds) {  // every block of the slot read the count before it counted in: only this one writes it
        if (fold && c.fold_count != nullptr) c.fold_count[slot] += 1;
      }
    }
    fold_phase_count_out(fold_phase, gridDim.z, counted, row_last, L);
  }
}
// Speculative verification (MATH.md, "Verifying T tokens at once"; replay_cpu(verify=true) in cpu.cpp): early
// fold when cursor + T > ring_len; the T corrections of the window depend on each other through the
// lower-triangular system, solved by forward substitution row by row: each state row's u_t[r] needs only the same
// row's earlier u. One kernel, gdn_replay_verify_rowpass_kernel below.
constexpr int kGdnMaxT = 16;

// The verify kernel's window prologue (it needs no cursor): v of the block's rows for every window
// token into the tile vt ([t][row], cp.async when vec_v; the caller commits), q and k of every window token
// normalised into qn and kn ([t][n]; a warp per vector, warp_sum_squares' bits), and g, alpha = exp(g), beta per
// (value head of the block, token) into gt, al, bt ([head * head_stride + t]). All Tmax tokens: nothing waits for
// num_tokens. `between()` runs once in every thread after the first of its loads are issued and before their values
// are used (the caller's cursor-dependent copies: their round trip overlaps the window's).
template <typename act_t, int kK, int kThreads, typename Between>
__device__ __forceinline__ void gdn_verify_stage_window(const GdnReplayParams& p, int b, int h, int hv0, int nheads_block, int row_begin,
                                                        int nrows, act_t* vt, int vts, bool vec_v, float* qn, float* kn, float* gt,
                                                        float* al, float* bt, int head_stride, const Between& between) {
  const int ratio = p.nheads / p.nkheads, Tmax = p.ntokens, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kThreads / 32, kPerLane = (kK + 31) / 32;
  const act_t* v_win = static_cast<const act_t*>(p.v) + b * p.v_batch_stride + int64_t(h) * ratio * p.v_head_stride;
  copy_head_rows<act_t, kThreads>(vt, vts, v_win, p.v_token_stride, p.v_head_stride, p.vdim, row_begin, nrows, Tmax, vec_v);
  // The loads of the window's scalars and vectors are issued before their values are used: at T <= 4 (2 T <= 8
  // vectors, 2 a warp; nheads_block T <= 128 pairs) one round trip, where before each warp's vectors came one after
  // another and the scalars after them; at T = 16 four rounds a warp. A (value head, token) pair per thread: the
  // first here, any others after the vectors.
  const int nitems = nheads_block * Tmax;
  auto item_at = [&](int idx, float& a, float& bias, float& alog, float& beta_raw) {
    const int hv = hv0 + idx / Tmax, t = idx % Tmax;
    a = to_float(static_cast<const act_t*>(p.a)[b * p.a_batch_stride + t * p.a_token_stride + hv * p.a_head_stride]);
    bias = p.dt_bias ? p.dt_bias[hv] : 0.f;
    alog = p.A_log[hv];
    beta_raw = to_float(static_cast<const act_t*>(p.b)[b * p.b_batch_stride + t * p.b_token_stride + hv * p.b_head_stride]);
  };
  auto item_store = [&](int idx, float a, float bias, float alog, float beta_raw) {  // g_t as gdn_prepare_token forms it
    const int e = idx / Tmax * head_stride + idx % Tmax;
    const float g = gdn_log_decay(a, bias, alog);
    gt[e] = g;
    al[e] = expf(g);
    bt[e] = sigmoid(beta_raw);
  };
  float a0 = 0.f, bias0 = 0.f, alog0 = 0.f, beta0 = 0.f;
  if (threadIdx.x < nitems) item_at(threadIdx.x, a0, bias0, alog0, beta0);
  // Two vectors a warp at a time (vector idx: token idx / 2, q (even) or k (odd)), both loaded before either is
  // reduced; each sum of squares in warp_sum_squares' order (its bits).
  auto vec_at = [&](int idx) {
    const int t = idx >> 1;
    return idx & 1 ? static_cast<const act_t*>(p.k) + b * p.k_batch_stride + t * p.k_token_stride + h * p.k_head_stride
                   : static_cast<const act_t*>(p.q) + b * p.q_batch_stride + t * p.q_token_stride + h * p.q_head_stride;
  };
  bool between_done = false;
  for (int idx = warp; idx < 2 * Tmax; idx += 2 * kWarps) {
    const int idx2 = idx + kWarps < 2 * Tmax ? idx + kWarps : idx;
    const act_t* x1 = vec_at(idx);
    const act_t* x2 = vec_at(idx2);
    act_t r1[kPerLane]{}, r2[kPerLane]{};  // raw: the conversions are the values' first use
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int n = lane + 32 * i;
      if (n < kK) r1[i] = x1[n], r2[i] = x2[n];
    }
    if (!between_done) between(), between_done = true;
    float v1[kPerLane], v2[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int n = lane + 32 * i;
      v1[i] = n < kK ? to_float(r1[i]) : 0.f;
      v2[i] = n < kK ? to_float(r2[i]) : 0.f;
    }
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i < kK) s1 = fmaf(v1[i], v1[i], s1), s2 = fmaf(v2[i], v2[i], s2);
    s1 = group_sum<32>(s1), s2 = group_sum<32>(s2);
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int id = pass ? idx2 : idx;
      if (pass && idx2 == idx) break;
      const float ss = pass ? s2 : s1;
      const float scale = (p.l2norm ? 1.f / sqrtf(ss + kL2NormEps) : 1.f) * (id & 1 ? 1.f : p.scale);
      float* dst = (id & 1 ? kn : qn) + (id >> 1) * kK;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < kK) dst[lane + 32 * i] = (pass ? v2[i] : v1[i]) * scale;
    }
  }
  if (!between_done) between();
  if (threadIdx.x < nitems) item_store(threadIdx.x, a0, bias0, alog0, beta0);
  for (int idx = threadIdx.x + kThreads; idx < nitems; idx += kThreads) {
    float a, bias, alog, beta_raw;
    item_at(idx, a, bias, alog, beta_raw);
    item_store(idx, a, bias, alog, beta_raw);
  }
}

// The window's normalised k of every key head and g of every value head into the ring at positions base.. (k: warp_sum_squares'
// bits, as the window prologue forms them; g as gdn_prepare_token does). All threads of the block call it.
template <typename act_t, int kK, int kThreads>
__device__ __forceinline__ void gdn_verify_append_kg(const GdnReplayParams& p, int64_t slot, int b, int base, int T) {
  const GdnReplayCacheParams& c = p.cache;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int idx = threadIdx.x; idx < T * p.nheads; idx += kThreads) {  // g_t as gdn_prepare_token forms it
    const int t = idx / p.nheads, hw = idx % p.nheads;
    const float g = gdn_log_decay(
        to_float(static_cast<const act_t*>(p.a)[b * p.a_batch_stride + t * p.a_token_stride + hw * p.a_head_stride]),
        p.dt_bias ? p.dt_bias[hw] : 0.f, p.A_log[hw]);
    c.ring_g[slot * c.ring_g_slot_stride + (base + t) * c.ring_g_pos_stride + hw] = g;
  }
  // A warp per (token, key head) vector, kChunk vectors loaded before any is reduced (one round trip a chunk, where a
  // vector at a time made 16 trips at T = 4 and 32 at T = 8 a warp); each sum of squares in warp_sum_squares' order.
  constexpr int kPerLane = (kK + 31) / 32, kChunk = 4;
  const int nvec = T * p.nkheads;
  auto k_at = [&](int idx) {
    const int t = idx / p.nkheads, hk = idx % p.nkheads;
    return static_cast<const act_t*>(p.k) + b * p.k_batch_stride + t * p.k_token_stride + hk * p.k_head_stride;
  };
  for (int first = warp * kChunk; first < nvec; first += kThreads / 32 * kChunk) {
    act_t r[kChunk][kPerLane]{};
#pragma unroll
    for (int v = 0; v < kChunk; ++v) {
      const act_t* k = k_at(min(first + v, nvec - 1));  // (past the end: a repeat, loaded and not stored)
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < kK) r[v][i] = k[lane + 32 * i];
    }
#pragma unroll
    for (int v = 0; v < kChunk; ++v) {
      const int idx = first + v;
      if (idx >= nvec) break;  // (warp-uniform)
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < kK) acc = fmaf(to_float(r[v][i]), to_float(r[v][i]), acc);
      const float ks = p.l2norm ? 1.f / sqrtf(group_sum<32>(acc) + kL2NormEps) : 1.f;
      const int t = idx / p.nkheads, hk = idx % p.nkheads;
      float* dst = c.ring_k + slot * c.ring_k_slot_stride + (base + t) * c.ring_k_pos_stride + hk * c.ring_k_head_stride;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < kK) dst[lane + 32 * i] = to_float(r[v][i]) * ks;
    }
  }
}
// What the slot's last block to arrive on the arrival counter writes (every block of the slot has read the
// committed ring by then, and nobody reads the new entries in this launch): the window's normalised k of every
// key head and g of every value head into the ring at positions base.. (unless `window` is false: each block wrote
// its own key head's, see the verify kernel's self-append), the counter back to zero, the cursor after an early
// fold, the pending count. All threads of the block call it.
template <typename act_t, int kK, int kThreads>
__device__ __forceinline__ void gdn_verify_append_window(const GdnReplayParams& p, int64_t slot, int b, int base, int T, bool early,
                                                         bool window) {
  const GdnReplayCacheParams& c = p.cache;
  if (window) gdn_verify_append_kg<act_t, kK, kThreads>(p, slot, b, base, T);
  if (threadIdx.x == 0) {
    atomicSub(&c.arrivals[slot], int(gridDim.x * gridDim.y));  // zero again for the next launch
    if (early) c.cursor[slot] = 0;
    if (c.pending) c.pending[slot] = T;
  }
}

// gdn_replay_verify_rowpass_kernel: grid (row chunks of a key head's value heads, H, batch), as the replay step's:
// a block's rows are rows of the value heads of one key head (row R = value head R / V of the key head, state row
// R % V), so the window's normalised q/k and the block scalars are formed once for every value head it covers; a
// key head's 256 rows fit one block at three blocks per SM (T = 4, ring 32), so every (slot, key head) forms them
// once. (It replaced two earlier kernels on 2026-12-01: 440-485 us against 757-784 and 587-632 at batch 256, T = 4;
// 3114e59, bench/results/gdn_speculative_tune_3114e59.json.)
// * The checkpoint rows (or an fp32 checkpoint's bf16 view) stream through a cp.async staging ring of kStages
//   stages (each thread copies and later reads only its own vectors); the first stages are issued as soon as the
//   slot is known. Prologue, while they are in flight: the window's v of the block's rows (a tile), q and k of every
//   window token normalised into shared memory (warp_sum_squares' bits), g, alpha and beta per (value head, token),
//   all Tmax tokens (nothing waits for num_tokens); with the cursor, u of the block's rows, k of its key head and g
//   of its value heads from the committed ring (one cp.async group), issued between the window's first loads and
//   their use.
// * The row loop only dots the streamed row with the window's k_t and q_t: 2 T sums per row, tokens in chunks of
//   4 (then 2, 1: no work for tokens past T), each chunk's 2 kC sums reduce-scattered over the row's lanes in one
//   pass (reduce_scatter, common/cuda_utils.cuh) and stored by the lane that ends with each, into the table `sums`
//   ([2 t + (k: 0, q: 1)][row]).
// * Everything a row needs besides those dots runs after the loop, a thread per row: exp(G) times the dots, the
//   committed ring terms sum_j u_j[row] (w_j k_j . k_t) (one LDS and two 16-byte LDS per position for four
//   tokens), the forward substitution, and coalesced stores of the outputs and the row's corrections.
// * Block scalars: k_j . k_t and k_j . q_t with 8 lanes per pair, the decay weights a thread per (value head, j, t)
//   in replay_decays' order (the CPU's values), folded with the dots into WK, WQ ([head][j][t], t padded to 4: one
//   16-byte load per four tokens). The committed ring k (positions < cursor) is staged in shared memory with the
//   ring's u and g (the dots and an early fold's row update read it there: before, from global memory, one more
//   round trip in the prologue and L1 loads in the fold).
// * Protocol: a block counts in on the slot's arrival counter once its committed-ring reads are done (all of them
//   end with the prologue; a block that folds early counts in only after its row loop, a conservative leftover from
//   when it read the ring's k there: the slot's last block overwrites positions 0..T-1 of it). The slot's last block
//   to arrive writes the pending count and, after an early fold, the cursor (gdn_verify_append_window); the window's
//   k and g are written right after the prologue by the blocks themselves (k by a key head's first block, g by the
//   block holding a value head's row 0) whenever the window fits; only a slot whose key heads span several blocks and
//   that folds early leaves them to its last block, which loads four k vectors a warp before reducing them. (Session
//   33's timeline had the last block's serial append, 16 round trips at 16 key heads, T = 4, as ~25 us of its
//   epilogue; session 54 measured blocks appending for row chunks too 3-8% faster at batch 32 and 2-6% at T = 8.)
//   Rows' u and the outputs go straight to global memory.
//   flat: the checkpoint's rows are contiguous over value heads (head stride V rows), so a row's address is one
//   multiply.
struct GdnVerifyPassSmem {  // byte offsets, each section 16-byte aligned
  int ts;   // floats per [row] table row: rows rounded up to 32, plus the rows of a warp (conflict-free sums stores)
  int vts;  // elements per v tile row: rows rounded up to 8
  int tp;   // tokens rounded up to 4 (the [t] dimension of WK, WQ, the dots and the per-token tables)
  int staging, ru, rk, sums, qn, kn, vt, gs, gt, bt, al, dec, WK, WQ, KK, KQ, kqt, wf, decf, bfrag, flag, total;
  __host__ __device__ GdnVerifyPassSmem(int staging_bytes, int act_bytes, int rows, int rows_per_warp, int K, int L, int T,
                                        int max_heads, bool mma = false) {
    auto up = [](int v) { return (v + 15) / 16 * 16; };
    ts = (rows + 31) / 32 * 32 + (rows_per_warp >= 4 ? rows_per_warp % 32 : 4);
    vts = (rows + 7) / 8 * 8;
    tp = (T + 3) / 4 * 4;
    int o = 0;
    staging = o, o += up(staging_bytes);      // [stage][vec][thread] checkpoint vectors
    ru = o, o += up(L * ts * 4);              // [j][row] committed ring u_j of the block's rows
    rk = o, o += up(L * K * 4);               // [j][n] committed ring k_j of the key head
    if (mma) {  // the row loop reads q_t, k_t from bfrag: qn and kn die at the barrier before it, and sums overlays them
      qn = o, kn = o + up(T * K * 4), sums = o;
      o += up(2 * tp * ts * 4) > 2 * up(T * K * 4) ? up(2 * tp * ts * 4) : 2 * up(T * K * 4);
    } else {
      sums = o, o += up(2 * tp * ts * 4);     // [2 t + (0: k, 1: q)][row] S_c,row . k_t and S_c,row . q_t
      qn = o, o += up(T * K * 4);             // [t][n] window q_t, normalised and scaled
      kn = o, o += up(T * K * 4);             // [t][n] window k_t, normalised
    }
    vt = o, o += up(T * vts * act_bytes);     // [t][row] window v_t (raw)
    gs = o, o += up(max_heads * L * 4);       // [head][j] committed ring g_j
    gt = o, o += up(max_heads * tp * 4);      // [head][t] g_t
    bt = o, o += up(max_heads * tp * 4);      // [head][t] beta_t
    al = o, o += up(max_heads * tp * 4);      // [head][t] alpha_t = exp(g_t)
    dec = o, o += up(max_heads * tp * 4);     // [head][t] exp(g_0 + ... + g_{p_t - 1}) (p_t = base + t)
    WK = o, o += up(max_heads * L * tp * 4);  // [head][j][t] exp(g_{j+1} + ... + g_{p_t - 1}) (k_j . k_t), j < p_t; else 0
    WQ = o, o += up(max_heads * L * tp * 4);  // [head][j][t] the same with (k_j . q_t)
    KK = o, o += up(L * tp * 4);              // [j][t] k_j . k_t
    KQ = o, o += up(L * tp * 4);              // [j][t] k_j . q_t
    kqt = o, o += up(tp * 4);                 // [t] k_t . q_t
    wf = o, o += up(max_heads * L * 4);       // [head][j] early fold: exp(g_{j+1} + ... + g_{w-1})
    decf = o, o += up(max_heads * 4);         // [head] early fold: exp(G_w)
    bfrag = o, o += mma ? tp / 4 * (K / 32) * 2 * 2 * 32 * 16 : 0;  // kMma: [n tile][k quarter][m][hi, lo][lane] float4 of k_t, q_t
    flag = o, o += 16;                        // [0] this block arrived last
    total = o;
  }
};

// The row loop of gdn_replay_verify_rowpass_kernel, kC window tokens from t0: this lane's columns s of a state row
// against k_t and q_t (kn, qn: [t][n] in shared memory), the 2 kC sums reduce-scattered over the row's lanes kTok at
// a time (all at once when the row has 2 kC lanes or more; each sum ends on kSpan lanes, the first of which stores
// it) into sums_row[(2 t + (0: k, 1: q)) * ts] (null: an invalid row, nothing stored).
template <typename Layout, int kC>
__device__ __forceinline__ void gdn_verify_dots_chunk(const float (&s)[Layout::kColsPerLane], const float* kn, const float* qn, int t0,
                                                      int lane_in_row, float* sums_row, int ts) {
  constexpr int kLanes = Layout::kLanesPerRow, kVec = Layout::kVec, kN = Layout::kVecsPerRow * kVec;
  constexpr int kTok = kLanes < 2 * kC ? kLanes : 2 * kC, kSpan = kLanes / kTok;
  float acc[2 * kC];  // [cc]: . k_{t0 + cc}; [kC + cc]: . q_{t0 + cc}
#pragma unroll
  for (int i = 0; i < 2 * kC; ++i) acc[i] = 0.f;
#pragma unroll
  for (int v = 0; v < Layout::kVecsPerLane; ++v)
#pragma unroll
    for (int e = 0; e < kVec; e += 4) {
      const float* sv = s + v * kVec + e;
      const int col = Layout::col(lane_in_row, v, e);
#pragma unroll
      for (int cc = 0; cc < kC; ++cc) {
        const float4 k4 = *reinterpret_cast<const float4*>(kn + (t0 + cc) * kN + col);
        const float4 q4 = *reinterpret_cast<const float4*>(qn + (t0 + cc) * kN + col);
        acc[cc] = fmaf(sv[0], k4.x, acc[cc]), acc[kC + cc] = fmaf(sv[0], q4.x, acc[kC + cc]);
        acc[cc] = fmaf(sv[1], k4.y, acc[cc]), acc[kC + cc] = fmaf(sv[1], q4.y, acc[kC + cc]);
        acc[cc] = fmaf(sv[2], k4.z, acc[cc]), acc[kC + cc] = fmaf(sv[2], q4.z, acc[kC + cc]);
        acc[cc] = fmaf(sv[3], k4.w, acc[cc]), acc[kC + cc] = fmaf(sv[3], q4.w, acc[kC + cc]);
      }
    }
#pragma unroll
  for (int r = 0; r < 2 * kC / kTok; ++r) {
    float part[kTok];
#pragma unroll
    for (int i = 0; i < kTok; ++i) part[i] = acc[r * kTok + i];
    const float sum = reduce_scatter<kLanes, kTok>(part, lane_in_row);
    const int i = r * kTok + lane_in_row / kSpan;
    if (sums_row != nullptr && lane_in_row % kSpan == 0) sums_row[(2 * (t0 + i % kC) + i / kC) * ts] = sum;
  }
}

// kMma (gdn_replay_verify_rowpass_kernel, an fp32 checkpoint streamed as it is): the row loop's dots on tensor
// cores. d += A B for one m16n8k8 tf32 tile (PTX fragments: a0 (row g, k t), a1 (g + 8, t), a2 (g, t + 4), a3
// (g + 8, t + 4); b0 (k t, column g), b1 (t + 4, g); d0, d1 (row g, columns 2 t, 2 t + 1), d2, d3 (row g + 8);
// g = lane / 4, t = lane % 4), and the split of an fp32 value into two tf32 values whose sum it is up to 2^-21 of
// it (hi: its top 19 bits, exactly a tf32; lo: the rest, truncated to tf32): a . b as hi hi + hi lo + lo hi (3xTF32;
// lo lo, ~2^-20 of the product, dropped) keeps the sums near fp32's accuracy. (An infinite value splits into inf
// and NaN: a state that has overflowed gives NaN dots where the CUDA-core loop gives inf.)
__device__ __forceinline__ void mma_tf32_16808(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void split_tf32(float v, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(v) & 0xffffe000u;
  lo = __float_as_uint(v - __uint_as_float(hi)) & 0xffffe000u;
}
// The kMma row loop's geometry: a tile of 64 rows (16 a warp: the A tile's m) streamed 32 columns an iteration
// (four k steps of 8), kK / 32 iterations a tile; a thread stages and reads only its own vectors: rows g and g + 8
// of its warp's 16, columns 16 m + 4 t .. + 3 (m = 0, 1) of the iteration's 32. Element e of that float4 is, in k
// step 2 m + e / 2, the A fragment's column t (e even) or t + 4 (e odd): any pairing of A's and B's columns gives
// the same dot as long as both use it, and this one needs no exchange between lanes.
template <int kK>
struct GdnVerifyMma {
  static constexpr int kQuarters = kK / 32;  // iterations a tile
  static constexpr int kRows = 64;           // rows a tile (a block's four warps)
  static constexpr int kVecs = 4;            // 16-byte vectors a thread stages an iteration: [row g, g + 8][m]
  static constexpr int kRowsPerWarp = 4;     // (GdnVerifyPassSmem's padding: ts % 32 == 4, conflict-free fragment stores)
  __device__ static int row(int it, int warp, int lane) { return it / kQuarters * kRows + warp * 16 + (lane >> 2); }
  __device__ static int col(int it, int lane) { return it % kQuarters * 32 + 4 * (lane & 3); }
};

// The numerical split (MATH.md; replay_cpu(verify=true) in cpu.cpp is the semantics; written as the replay step
// kernel does it): src_t is what the staging ring streams, the checkpoint (src_t == ckpt_t) or
// an fp32 checkpoint's bf16 view; an early fold forms the state from the fp32 master row (streaming loads), writes
// the master and the view (rounded to nearest) of the same values, and the window's dots then use the view's values
// (what served() reads on the CPU). A 16-bit checkpoint with sr_seed is rounded stochastically at an early fold
// (Philox keyed by the slot's seed, counter (element (hv, r, n), the slot's fold count), as the CPU), and the dots use
// the stored values. Every thread reads the fold count in the prologue; early-folding blocks count in only after
// their row loop, so the slot's last block may increment it. The plain fp32 instantiation compiles none of this
// (ops.cpp: on CUDA a fold counter comes only with a view or a 16-bit checkpoint). `flat`: the streamed rows' head
// stride is vdim rows.
template <typename ckpt_t, typename act_t, int kK, int kThreads, int kStages, int kLanesPerRow, int kMinBlocks,
          typename src_t = ckpt_t, bool kMma = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gdn_replay_verify_rowpass_kernel(const GdnReplayParams p, const int rows_per_block, const int max_heads, const bool vec_u,
                                     const bool vec_k, const bool vec_v, const bool flat) {
  constexpr bool kView = !std::is_same_v<src_t, ckpt_t>;
  static_assert(!kView || std::is_same_v<ckpt_t, float>, "the output view is of an fp32 checkpoint");
  constexpr bool kNarrow = !std::is_same_v<ckpt_t, float>;  // a 16-bit checkpoint (stochastic rounding possible)
  constexpr bool kCountsFolds = kView || kNarrow;            // the caches that may carry a fold counter on CUDA
  constexpr DType kCkptDType = std::is_same_v<ckpt_t, __half> ? DType::kFloat16 : DType::kBFloat16;  // when kNarrow
  using Layout = RowLayout<src_t, kK, kThreads, 1, kLanesPerRow>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane, kVec = Layout::kVec;
  static_assert(kVec % 4 == 0, "a lane's columns come in groups of four (16-byte loads of k and q)");
  constexpr int kPer = kK / 8;  // the dots: elements of a pair per lane (8 lanes per pair)
  static_assert(!kMma || (std::is_same_v<src_t, float> && !kView && !kNarrow && kK % 32 == 0 && kThreads == 128),
                "the tensor-core row loop streams an fp32 checkpoint as it is, 32 columns of 64 rows an iteration");
  using MmaGeom = GdnVerifyMma<kK>;
  const GdnReplayCacheParams& c = p.cache;
  const int b = blockIdx.z, h = blockIdx.y;  // h: the key head
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_replay_verify: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int w0 = c.cursor[slot];  // in flight while the first loads are issued
  const int T = p.num_tokens ? p.num_tokens[b] : p.ntokens;

  const int ratio = p.nheads / p.nkheads, V = p.vdim, L = c.ring_len, Tmax = p.ntokens;
  const int row_begin = blockIdx.x * rows_per_block;
  const int nrows = min(ratio * V, row_begin + rows_per_block) - row_begin;
  const int head_begin = row_begin / V;  // first value head of the block, within the key head's
  const int nheads_block = (row_begin + nrows - 1) / V - head_begin + 1;
  const int hv0 = h * ratio + head_begin;  // its global index
  const int n_iter = kMma ? (nrows + MmaGeom::kRows - 1) / MmaGeom::kRows * MmaGeom::kQuarters
                          : (nrows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_in_row = lane % kLanes;
  const int rl0 = warp * Layout::kRowsPerWarp + lane / kLanes;  // this thread's row of the block in iteration 0
  ckpt_t* ckpt = static_cast<ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(hv0) * c.ckpt_head_stride;
  // The streamed rows: the checkpoint's, or its view's.
  src_t* src_base;
  int64_t src_head_stride, src_row_stride;
  if constexpr (kView) {
    src_base = static_cast<src_t*>(c.view) + slot * c.view_slot_stride + int64_t(hv0) * c.view_head_stride;
    src_head_stride = c.view_head_stride, src_row_stride = c.view_row_stride;
  } else {
    src_base = ckpt, src_head_stride = c.ckpt_head_stride, src_row_stride = c.ckpt_row_stride;
  }
  auto src_row = [&](int rl) {  // block row rl: value head (row_begin + rl) / V of the key head, state row (row_begin + rl) % V
    if (flat) return src_base + int64_t(row_begin - head_begin * V + rl) * src_row_stride;
    const int r = row_begin + rl;
    return src_base + int64_t(r / V - head_begin) * src_head_stride + int64_t(r % V) * src_row_stride;
  };
  auto ckpt_row = [&](int rl) {  // the checkpoint's (the fp32 master's with a view: formed where used, at folds)
    if constexpr (kView) {
      const int r = row_begin + rl;
      return ckpt + int64_t(r / V - head_begin) * c.ckpt_head_stride + int64_t(r % V) * c.ckpt_row_stride;
    } else {
      return src_row(rl);
    }
  };

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const GdnVerifyPassSmem off(kStages * (kMma ? MmaGeom::kVecs : kVecs) * kThreads * 16, sizeof(act_t), rows_per_block,
                              kMma ? MmaGeom::kRowsPerWarp : Layout::kRowsPerWarp, kK, L, Tmax, max_heads, kMma);
  uint4* staging = reinterpret_cast<uint4*>(smem_raw + off.staging);
  float* ru = reinterpret_cast<float*>(smem_raw + off.ru);
  float* rk = reinterpret_cast<float*>(smem_raw + off.rk);
  float* sums = reinterpret_cast<float*>(smem_raw + off.sums);
  float* qn = reinterpret_cast<float*>(smem_raw + off.qn);
  float* kn = reinterpret_cast<float*>(smem_raw + off.kn);
  act_t* vt = reinterpret_cast<act_t*>(smem_raw + off.vt);
  float* gs = reinterpret_cast<float*>(smem_raw + off.gs);
  float* gt = reinterpret_cast<float*>(smem_raw + off.gt);
  float* bt = reinterpret_cast<float*>(smem_raw + off.bt);
  float* al = reinterpret_cast<float*>(smem_raw + off.al);
  float* dec = reinterpret_cast<float*>(smem_raw + off.dec);
  float* WK = reinterpret_cast<float*>(smem_raw + off.WK);
  float* WQ = reinterpret_cast<float*>(smem_raw + off.WQ);
  float* KK = reinterpret_cast<float*>(smem_raw + off.KK);
  float* KQ = reinterpret_cast<float*>(smem_raw + off.KQ);
  float* kqt = reinterpret_cast<float*>(smem_raw + off.kqt);
  float* wf = reinterpret_cast<float*>(smem_raw + off.wf);
  float* decf = reinterpret_cast<float*>(smem_raw + off.decf);
  int* last_flag = reinterpret_cast<int*>(smem_raw + off.flag);
  uint4* bfrag = reinterpret_cast<uint4*>(smem_raw + off.bfrag);
  const int ts = off.ts, vts = off.vts, tp = off.tp;

  auto issue = [&](int it) {  // start copying this thread's vectors of iteration `it` (an empty group past the end)
    if constexpr (kMma) {
      if (it < n_iter) {
        const int rg = MmaGeom::row(it, warp, lane), col = MmaGeom::col(it, lane);
#pragma unroll
        for (int rs = 0; rs < 2; ++rs)
          if (rg + 8 * rs < nrows) {
            const src_t* src = src_row(rg + 8 * rs) + col;
#pragma unroll
            for (int m = 0; m < 2; ++m)
              cp_async16(&staging[((it % kStages) * MmaGeom::kVecs + 2 * rs + m) * kThreads + threadIdx.x], src + 16 * m);
          }
      }
      cp_async_commit();
      return;
    }
    const int rl = rl0 + it * Layout::kRowsPerIter;
    if (it < n_iter && rl < nrows) {
      const src_t* src = src_row(rl);
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
        cp_async16(&staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x], src + Layout::col(lane_in_row, v, 0));
    }
    cp_async_commit();
  };
  // Stages issued before the prologue: kStages - 1, or all kStages in the tensor-core loop, which issues an
  // iteration's replacement only after its own reads of the stage (a thread reads only the vectors it copied, so the
  // stage is free once the thread's values are in registers): kStages stages in flight instead of kStages - 1.
  constexpr int kAhead = kMma ? kStages : kStages - 1;
#pragma unroll
  for (int it = 0; it < kAhead; ++it) issue(it);

  // ---- Prologue: the window (no cursor needed) and, once its first loads are out, the committed ring u of the block's
  // rows, k of its key head and g of its value heads (positions < cursor; one cp.async group with the v tile).
  bool early = false;  // fold the committed history first
  int base = 0;        // ring position of window token 0
  auto copy_committed_ring = [&] {
    RSSM_DEVICE_CHECK(T >= 1 && T <= Tmax, "gdn_replay_verify: num_tokens[%d] = %d is outside [1, T = %d]", b, T, Tmax);
    RSSM_DEVICE_CHECK(w0 >= 0 && w0 <= L, "gdn_replay_verify: cursor[%lld] = %d is outside [0, ring_len]", (long long)slot, w0);
    early = w0 + T > L;
    base = early ? 0 : w0;
    const float* ring_u = c.ring_u + slot * c.ring_u_slot_stride + int64_t(h) * ratio * c.ring_u_head_stride;
    const float* ring_k = c.ring_k + slot * c.ring_k_slot_stride + h * c.ring_k_head_stride;  // [j * pos_stride + n]
    const float* ring_g = c.ring_g + slot * c.ring_g_slot_stride + hv0;
    copy_head_rows<float, kThreads>(ru, ts, ring_u, c.ring_u_pos_stride, c.ring_u_head_stride, V, row_begin, nrows, w0, vec_u);
    copy_head_rows<float, kThreads>(rk, kK, ring_k, c.ring_k_pos_stride, 0, kK, 0, kK, w0, vec_k);
    for (int idx = threadIdx.x; idx < nheads_block * w0; idx += kThreads) {  // (by cp.async: a plain load would hold the thread)
      const int hl = idx / w0, j = idx % w0;
      cp_async4(&gs[hl * L + j], &ring_g[j * c.ring_g_pos_stride + hl]);
    }
  };
  gdn_verify_stage_window<act_t, kK, kThreads>(p, b, h, hv0, nheads_block, row_begin, nrows, vt, vts, vec_v, qn, kn, gt, al, bt, tp,
                                               copy_committed_ring);
  cp_async_commit();
  // The fold count (stochastic rounding's Philox counter): read, and the load consumed, before the block counts in,
  // since the slot's last block increments it (an early-folding block counts in after its row loop).
  uint32_t fold_no = 0;
  if constexpr (kNarrow) {
    if (early && c.sr_seed != nullptr) {  // (fold_count is then present: ops.cpp)
      fold_no = uint32_t(c.fold_count[slot]);
      if (fold_no == 0xffffffffu) __trap();  // (consumes the load before the barrier; 2^32 folds do not happen)
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // tiles and window written; every thread of the block has read the cursor and the committed ring
  // Self-append: the blocks write the window's k and g into the ring at positions base.. now, from their normalised kn
  // and gt (the bits gdn_verify_append_kg forms), wherever no block of the slot can still read those positions:
  //  - with one block per (slot, key head) (gridDim.x == 1) the block is the only reader of its key head's ring k and
  //    its value heads' ring g, and it has read them (into shared memory): even an early fold's positions 0.. are free;
  //  - a window that fits (no early fold) goes to positions w0.., past every committed entry a block reads.
  // Each entry has one writer: k the key head's first block, g of a value head the block holding the head's row 0. The
  // slot's last block then writes only the counter, cursor and pending count. Else (row chunks and an early fold: a
  // block of another row chunk of the key head may not have read the committed ring k yet) the last block appends
  // every head's. (Until session 53 only gridDim.x == 1 appended itself: at batch 32, and at T = 8, where a key head's
  // rows take two blocks, every slot's last block loaded and normalised all the key heads' k one after another.)
  const bool self_append = gridDim.x == 1 || !early;  // (the same for every block of the slot: w0 and T are the row's)
  if (self_append) {
    if (row_begin == 0) {
      float* ring_k_w = c.ring_k + slot * c.ring_k_slot_stride + h * c.ring_k_head_stride;
      for (int idx = threadIdx.x; idx < T * kK; idx += kThreads)
        ring_k_w[int64_t(base + idx / kK) * c.ring_k_pos_stride + idx % kK] = kn[idx];
    }
    float* ring_g_w = c.ring_g + slot * c.ring_g_slot_stride + hv0;
    for (int idx = threadIdx.x; idx < nheads_block * T; idx += kThreads)
      if ((head_begin + idx / T) * V >= row_begin)  // the block holds the value head's row 0
        ring_g_w[int64_t(base + idx % T) * c.ring_g_pos_stride + idx / T] = gt[idx / T * tp + idx % T];
  }
  // Count in (the answer is used at the end): now when the block does not fold, after the row loop when it does
  // (every committed-ring read is done by now either way; see the protocol above).
  const int blocks_per_slot = gridDim.x * gridDim.y;
  int arrived = 0;
  if (threadIdx.x == 0 && !early) arrived = atomicAdd(&c.arrivals[slot], 1);

  // ---- Block scalars. Positions after the (early) fold: j < base committed, j >= base the window.
  const int P = base + T;
  {  // k_j . k_t and k_j . q_t for j <= p_t (j == p_t: k_t . q_t), 8 lanes per pair, kPer contiguous elements each
     // (every lane of a warp runs the same trip count: the shuffles take the whole warp)
    const int npairs = T * P, lane8 = lane & 7;
    for (int first = warp * 4; first < npairs; first += kThreads / 8) {
      const int idx = first + (lane >> 3), t = idx / P, j = idx % P;
      const bool live = idx < npairs && j <= base + t;
      float a = 0.f, q = 0.f;
      if (live) {
        const float* kt = kn + t * kK + lane8 * kPer;
        const float* qt = qn + t * kK + lane8 * kPer;
        const float* kj = (j < base ? rk + j * kK : kn + (j - base) * kK) + lane8 * kPer;
        bool done = false;
        if constexpr (kPer % 4 == 0) {
          {  // 16-byte loads
#pragma unroll
            for (int e = 0; e < kPer; e += 4) {
              const float4 x = *reinterpret_cast<const float4*>(kj + e), y = *reinterpret_cast<const float4*>(kt + e),
                           z = *reinterpret_cast<const float4*>(qt + e);
              a = fmaf(x.x, y.x, a), q = fmaf(x.x, z.x, q);
              a = fmaf(x.y, y.y, a), q = fmaf(x.y, z.y, q);
              a = fmaf(x.z, y.z, a), q = fmaf(x.z, z.z, q);
              a = fmaf(x.w, y.w, a), q = fmaf(x.w, z.w, q);
            }
            done = true;
          }
        }
        if (!done)
#pragma unroll
          for (int e = 0; e < kPer; ++e) a = fmaf(kj[e], kt[e], a), q = fmaf(kj[e], qt[e], q);
      }
      a = group_sum<8>(a), q = group_sum<8>(q);
      if (live && lane8 == 0) {
        if (j < base + t) KK[j * tp + t] = a, KQ[j * tp + t] = q;
        else kqt[t] = q;
      }
    }
  }
  if (early)  // the fold's weights, a thread per (value head, j), in replay_decays' order
    for (int idx = threadIdx.x; idx < nheads_block * w0; idx += kThreads) {
      const int hl = idx / w0, j = idx % w0;
      float suffix = 0.f;
      for (int m = w0 - 1; m > j; --m) suffix += gs[hl * L + m];
      wf[hl * L + j] = expf(suffix);
      if (j == 0) decf[hl] = expf(suffix + gs[hl * L]);
    }
  if constexpr (kMma) {  // the B fragments of k_t and q_t, split (column n = 2 (t % 4) + (0: k, 1: q) of n tile t / 4)
    const int ntiles = (T + 3) / 4;
    for (int idx = threadIdx.x; idx < ntiles * MmaGeom::kQuarters * 2 * 32; idx += kThreads) {
      const int l = idx % 32, m = idx / 32 % 2, kq = idx / 64 % MmaGeom::kQuarters, nt = idx / (64 * MmaGeom::kQuarters);
      const int t = nt * 4 + (l >> 2) / 2;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < T) v = *reinterpret_cast<const float4*>(((l >> 2) & 1 ? qn : kn) + t * kK + kq * 32 + 16 * m + 4 * (l & 3));
      uint4 hi, lo;
      split_tf32(v.x, hi.x, lo.x), split_tf32(v.y, hi.y, lo.y), split_tf32(v.z, hi.z, lo.z), split_tf32(v.w, hi.w, lo.w);
      bfrag[(idx / 32 * 2) * 32 + l] = hi;  // [((nt * kQuarters + kq) * 2 + m) * 2 + (0: hi, 1: lo)][lane]
      bfrag[(idx / 32 * 2 + 1) * 32 + l] = lo;
    }
  }
  __syncthreads();
  // The decay weights, a thread per (value head, j < P, t < tp), each suffix sum in replay_decays' order (the CPU's
  // values), times the dots: WK, WQ (zero where j >= p_t or t >= T); dec[t] = exp(G_{p_t}).
  auto g_at = [&](int hl, int m) { return m < base ? gs[hl * L + m] : gt[hl * tp + m - base]; };
  for (int idx = threadIdx.x; idx < nheads_block * P * tp; idx += kThreads) {
    const int hl = idx / (P * tp), rem = idx % (P * tp), j = rem / tp, t = rem % tp, pt = base + t;
    float wk = 0.f, wq = 0.f;
    if (t < T && j < pt) {
      float suffix = 0.f;
      for (int m = pt - 1; m > j; --m) suffix += g_at(hl, m);
      const float weight = expf(suffix);
      wk = weight * KK[j * tp + t], wq = weight * KQ[j * tp + t];
      if (j == 0) dec[hl * tp + t] = expf(suffix + g_at(hl, 0));
    } else if (t < T && j == 0) {
      dec[hl * tp + t] = 1.f;  // p_t == 0: no token before this one since the checkpoint
    }
    WK[(hl * L + j) * tp + t] = wk;
    WQ[(hl * L + j) * tp + t] = wq;
  }
  __syncthreads();

  // ---- Stream the block's rows: the early fold, then the 2 T dots into `sums`.
  if constexpr (kMma) {
    const int ntiles = (T + 3) / 4, tq = lane & 3;
    static_assert(kGdnMaxT <= 16, "four n tiles of 4 tokens");
    float acc[4][4];  // [n tile][fragment]: rows g, g + 8 of the warp's 16, columns 2 tq (. k_t), 2 tq + 1 (. q_t), t = 4 nt + tq
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
    for (int it = 0; it < n_iter; ++it) {
      cp_async_wait<kStages - 1>();  // this thread's vectors of iteration `it` have landed (iterations it + 1 .. it +
                                     // kStages - 1 may be pending; the prologue waited for all of its groups)
      const int rg = MmaGeom::row(it, warp, lane), kq = it % MmaGeom::kQuarters, col = MmaGeom::col(it, lane);
      float a[16];  // [rs * 8 + m * 4 + e]: row rg + 8 rs, column col + 16 m + e (stale past nrows: nothing of it is stored)
#pragma unroll
      for (int v = 0; v < 4; ++v)
        unpack16<src_t>(staging[((it % kStages) * MmaGeom::kVecs + v) * kThreads + threadIdx.x], *reinterpret_cast<float(*)[4]>(&a[4 * v]));
      // Refill the stage just read (this thread's reads of it come first in program order) before an early fold's
      // work: a folding block then has kStages later iterations in flight during its fold (the FMAs over its w0
      // committed ring entries and the checkpoint's store), not kStages - 1 (at the benchmark's two stages: two, not one).
      issue(it + kStages);
      if (early) {  // checkpoint <- state at the cursor, the same operations per element as the other row loop; both rows
                    // in one pass over the committed ring (a ring k vector serves both)
        int rr[2], hl[2];
#pragma unroll
        for (int rs = 0; rs < 2; ++rs) {
          rr[rs] = rg + 8 * rs < nrows ? rg + 8 * rs : 0;
          hl[rs] = (row_begin + rr[rs]) / V - head_begin;
          const float dcy = decf[hl[rs]];
#pragma unroll
          for (int e = 0; e < 8; ++e) a[8 * rs + e] *= dcy;
        }
#pragma unroll 2
        for (int j = 0; j < w0; ++j) {
          const float* kj = rk + j * kK + col;
          float4 k4[2];
#pragma unroll
          for (int m = 0; m < 2; ++m) k4[m] = *reinterpret_cast<const float4*>(kj + 16 * m);
#pragma unroll
          for (int rs = 0; rs < 2; ++rs) {
            const float wu = wf[hl[rs] * L + j] * ru[j * ts + rr[rs]];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              float* xv = a + 8 * rs + 4 * m;
              xv[0] = fmaf(wu, k4[m].x, xv[0]), xv[1] = fmaf(wu, k4[m].y, xv[1]), xv[2] = fmaf(wu, k4[m].z, xv[2]), xv[3] = fmaf(wu, k4[m].w, xv[3]);
            }
          }
        }
#pragma unroll
        for (int rs = 0; rs < 2; ++rs)
          if (rg + 8 * rs < nrows)
#pragma unroll
            for (int m = 0; m < 2; ++m)
              __stcs(reinterpret_cast<float4*>(ckpt_row(rg + 8 * rs) + col + 16 * m),
                     make_float4(a[8 * rs + 4 * m], a[8 * rs + 4 * m + 1], a[8 * rs + 4 * m + 2], a[8 * rs + 4 * m + 3]));
      }
      uint32_t hi[16], lo[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) split_tf32(a[e], hi[e], lo[e]);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        if (nt < ntiles) {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const uint4* bp = bfrag + (((nt * MmaGeom::kQuarters + kq) * 2 + m) * 2) * 32 + lane;
            const uint4 bh = bp[0], bl = bp[32];
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {  // k step 2 m + ks: A columns t, t + 4 are elements 2 ks, 2 ks + 1
              const int i = 4 * m + 2 * ks;
              const uint32_t bh0 = ks ? bh.z : bh.x, bh1 = ks ? bh.w : bh.y, bl0 = ks ? bl.z : bl.x, bl1 = ks ? bl.w : bl.y;
              mma_tf32_16808(acc[nt], lo[i], lo[8 + i], lo[i + 1], lo[8 + i + 1], bh0, bh1);
              mma_tf32_16808(acc[nt], hi[i], hi[8 + i], hi[i + 1], hi[8 + i + 1], bl0, bl1);
              mma_tf32_16808(acc[nt], hi[i], hi[8 + i], hi[i + 1], hi[8 + i + 1], bh0, bh1);
            }
          }
        }
      }
      if (kq == MmaGeom::kQuarters - 1) {  // the tile's dots are whole: into `sums`, and the accumulators cleared
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int t = 4 * nt + tq;
          if (nt < ntiles && t < T)
#pragma unroll
            for (int rs = 0; rs < 2; ++rs)
              if (rg + 8 * rs < nrows) {
                sums[2 * t * ts + rg + 8 * rs] = acc[nt][2 * rs];
                sums[(2 * t + 1) * ts + rg + 8 * rs] = acc[nt][2 * rs + 1];
              }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
        }
      }
    }
  } else {
  for (int it = 0; it < n_iter; ++it) {
    issue(it + kStages - 1);
    cp_async_wait<kStages - 1>();  // this thread's vectors of iteration `it` have landed
    const int rl = rl0 + it * Layout::kRowsPerIter;
    const bool valid = rl < nrows;  // (an invalid row's staging is stale: nothing of it is stored)
    float s[kCols];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      unpack16<src_t>(staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x],
                      *reinterpret_cast<float(*)[kVec]>(&s[v * kVec]));
    }
    if (early) {  // checkpoint <- state at the cursor, stored as the checkpoint stores it; ring k from `rk`
      const int rr = valid ? rl : 0, hl = (row_begin + rr) / V - head_begin;
      const float dcy = decf[hl];
      if constexpr (kView) {  // from this lane's columns of the fp32 master row (the view was streamed)
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < kVec; e += 4) {
            const float4 m = valid ? __ldcs(reinterpret_cast<const float4*>(ckpt_row(rl) + Layout::col(lane_in_row, v, e)))
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
            s[v * kVec + e] = m.x, s[v * kVec + e + 1] = m.y, s[v * kVec + e + 2] = m.z, s[v * kVec + e + 3] = m.w;
          }
      }
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] *= dcy;
#pragma unroll 2
      for (int j = 0; j < w0; ++j) {
        const float wu = wf[hl * L + j] * ru[j * ts + rr];
        const float* kj = rk + j * kK;
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < kVec; e += 4) {
            const float4 k4 = *reinterpret_cast<const float4*>(kj + Layout::col(lane_in_row, v, e));
            float* sv = s + v * kVec + e;
            sv[0] = fmaf(wu, k4.x, sv[0]), sv[1] = fmaf(wu, k4.y, sv[1]), sv[2] = fmaf(wu, k4.z, sv[2]), sv[3] = fmaf(wu, k4.w, sv[3]);
          }
      }
      if constexpr (kView) {  // the fp32 master and its bf16 view (rounded to nearest); the dots use the view's values
        if (valid) {
          Layout::store_master_and_view(ckpt_row(rl), src_row(rl), lane_in_row, s);
        }
#pragma unroll
        for (int col = 0; col < kCols; ++col) s[col] = to_float(from_float<src_t>(s[col]));
      } else {
        if constexpr (kNarrow) {
          if (c.sr_seed != nullptr) {  // stochastic rounding: element (hv, r, n) is counter (hv V + r) K + n, as on the CPU
            const uint64_t seed = uint64_t(c.sr_seed[slot]);
            // (hv V + r = h ratio V + row_begin + rl; the lane's first column made opaque so that the compiler forms
            // each column's counter here rather than keeping them live across the loop, as in the replay step)
            int64_t index0 = (int64_t(h) * ratio * V + row_begin + rr) * kK + Layout::col(lane_in_row, 0, 0);
            asm volatile("" : "+l"(index0));
#pragma unroll
            for (int v = 0; v < kVecs; ++v)
#pragma unroll
              for (int e = 0; e < kVec; ++e)
                s[v * kVec + e] = stochastic_round_to(kCkptDType, s[v * kVec + e],
                                                      fold_random(seed, fold_no, uint64_t(index0 + (Layout::col(0, v, e) - Layout::col(0, 0, 0)))));
          }
        }
        // (the stored values, which the dots use: stochastic rounding's are exact but at the format's largest finite
        // magnitude, which the conversion rounds to nearest as the CPU's store does)
#pragma unroll
        for (int col = 0; col < kCols; ++col) s[col] = to_float(from_float<ckpt_t>(s[col]));
        if (valid) Layout::store_row(ckpt_row(rl), lane_in_row, s);
      }
    }
    int t0 = 0;
    // Tokens in chunks of 4, then 2, then 1: no work for tokens past T.
    float* sums_row = valid ? sums + rl : nullptr;
    for (; t0 + 4 <= T; t0 += 4) gdn_verify_dots_chunk<Layout, 4>(s, kn, qn, t0, lane_in_row, sums_row, ts);
    if (T - t0 >= 2) gdn_verify_dots_chunk<Layout, 2>(s, kn, qn, t0, lane_in_row, sums_row, ts), t0 += 2;
    if (T - t0 >= 1) gdn_verify_dots_chunk<Layout, 1>(s, kn, qn, t0, lane_in_row, sums_row, ts);
  }
  }
  cp_async_wait<0>();  // (only empty groups remain)
  __syncthreads();     // sums written; every read of the committed ring done
  if (threadIdx.x == 0 && early) arrived = atomicAdd(&c.arrivals[slot], 1);

  // ---- A thread per row: the rest of S_h k_t and S_h q_t, the forward substitution, the outputs and corrections.
  // Tokens four at a time (the committed ring terms of four tokens share a pass); the row's correction u_t replaces
  // its used sum S_c k_t in `sums`, where the later tokens' substitution reads it (no register array, no unrolling
  // over T).
  act_t* out = static_cast<act_t*>(p.out) + b * p.out_batch_stride + int64_t(hv0) * p.out_head_stride;
  float* ring_u_w = c.ring_u + slot * c.ring_u_slot_stride + int64_t(hv0) * c.ring_u_head_stride;
#pragma unroll 1
  for (int rl = threadIdx.x; rl < nrows; rl += kThreads) {
    const int r = row_begin + rl, hl = r / V - head_begin, i = r % V;
    const float* WKh = WK + hl * L * tp;
    const float* WQh = WQ + hl * L * tp;
    float* row_sums = sums + rl;  // [(2 t + (0: k, 1: q)) * ts]; [2 t * ts] = u_t once formed
#pragma unroll 1
    for (int t0 = 0; t0 < T; t0 += 4) {  // (tokens t0..t0+3 < tp: their table entries exist; those past T are not used)
      float sk[4], sq[4];
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const float d = dec[hl * tp + t0 + cc];
        sk[cc] = d * row_sums[2 * (t0 + cc) * ts];
        sq[cc] = d * row_sums[(2 * (t0 + cc) + 1) * ts];
      }
      for (int j = 0; j < base; ++j) {  // committed ring positions
        const float uj = ru[j * ts + rl];
        const float4 wk = *reinterpret_cast<const float4*>(WKh + j * tp + t0);
        const float4 wq = *reinterpret_cast<const float4*>(WQh + j * tp + t0);
        sk[0] = fmaf(uj, wk.x, sk[0]), sk[1] = fmaf(uj, wk.y, sk[1]), sk[2] = fmaf(uj, wk.z, sk[2]), sk[3] = fmaf(uj, wk.w, sk[3]);
        sq[0] = fmaf(uj, wq.x, sq[0]), sq[1] = fmaf(uj, wq.y, sq[1]), sq[2] = fmaf(uj, wq.z, sq[2]), sq[3] = fmaf(uj, wq.w, sq[3]);
      }
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {  // forward substitution through the window's earlier corrections
        const int t = t0 + cc;
        if (t < T) {
          float Sk = sk[cc], Sq = sq[cc];
          for (int t2 = 0; t2 < t; ++t2) {
            const float u2 = row_sums[2 * t2 * ts];
            Sk = fmaf(u2, WKh[(base + t2) * tp + t], Sk), Sq = fmaf(u2, WQh[(base + t2) * tp + t], Sq);
          }
          const float alpha = al[hl * tp + t];
          const float u = bt[hl * tp + t] * (to_float(vt[t * vts + rl]) - alpha * Sk);
          row_sums[2 * t * ts] = u;
          out[int64_t(t) * p.out_token_stride + hl * p.out_head_stride + i] = from_float<act_t>(alpha * Sq + u * kqt[t]);
          ring_u_w[int64_t(base + t) * c.ring_u_pos_stride + hl * c.ring_u_head_stride + i] = u;
        }
      }
    }
  }
  if (threadIdx.x == 0) *last_flag = arrived == blocks_per_slot - 1;
  __syncthreads();
  if (*last_flag) {
    gdn_verify_append_window<act_t, kK, kThreads>(p, slot, b, base, T, early, !self_append);
    if constexpr (kCountsFolds) {  // every block of the slot read the count before it counted in: only this one writes it
      if (threadIdx.x == 0 && early && c.fold_count != nullptr) c.fold_count[slot] += 1;
    }
  }
}

// The device's opt-in shared-memory limit per block; a clear error when a shape needs more.
inline void gdn_check_smem(int bytes, const GdnTokenParams& p, int ring_len, const char* op) {
  const int limit = max_smem_per_block();
  if (bytes > limit)
    throw std::invalid_argument(std::string("replayssm: ") + op + " needs " + std::to_string(bytes) +
                                " bytes of shared memory for kdim " + std::to_string(p.kdim) + ", vdim " + std::to_string(p.vdim) +
                                ", ring_len " + std::to_string(ring_len) + " and " + std::to_string(p.ntokens) +
                                " tokens; the device has " + std::to_string(limit));
}

// 16-byte copies of the streaming kernels' tiles (copy_head_rows) where the planes are contiguous over (value
// head, row) and 16-byte aligned: the ring's u and k, the token's or window's v (window: its token stride too).
struct GdnTileVec {
  bool u, k, v;
};
template <typename act_t>
GdnTileVec gdn_tile_vec(const GdnReplayParams& p, int rows_per_block, bool window) {
  constexpr int kV = 16 / sizeof(act_t);
  const GdnReplayCacheParams& c = p.cache;
  const int V = p.vdim;
  return {V % 4 == 0 && rows_per_block % 4 == 0 && aligned16(c.ring_u) && c.ring_u_head_stride == V && c.ring_u_slot_stride % 4 == 0 &&
              c.ring_u_pos_stride % 4 == 0,
          aligned16(c.ring_k) && c.ring_k_slot_stride % 4 == 0 && c.ring_k_pos_stride % 4 == 0 && c.ring_k_head_stride % 4 == 0,
          V % kV == 0 && rows_per_block % kV == 0 && aligned16(p.v) && p.v_head_stride == V && p.v_batch_stride % kV == 0 &&
              (!window || p.v_token_stride % kV == 0)};
}

// Rows of a key head's value heads per block for the streaming kernels (replay step, verify), in whole row
// iterations: `forced` when set (> 0; at most the key head's rows), else enough blocks for target_blocks, at most
// the key head's rows, halved until min_blocks blocks fit an SM's shared memory; then halved until one block fits
// the device (gdn_check_smem reports a shape that still does not). smem_for(rows): a block's bytes.
// even: the key head's rows split evenly over its blocks instead (each block repeats the prologue, so a ragged last
// block costs a whole one), and to fit min_blocks per SM the blocks per key head grow one at a time (256 rows:
// 176 -> 128 -> 88 -> 64, where halving went 176 -> 88).
template <typename SmemFor>
int gdn_rows_per_block(int forced, const GdnTokenParams& p, int64_t target_blocks, int rows_per_iter, int min_blocks,
                       const SmemFor& smem_for, bool even = false) {
  const int group_rows = (p.nheads / p.nkheads) * p.vdim;
  int rows_per_block;
  if (forced > 0) {
    rows_per_block = std::min(forced, group_rows);
  } else {
    int64_t rows = (int64_t(p.batch) * p.nkheads * group_rows + target_blocks - 1) / target_blocks;
    rows = std::max<int64_t>(rows_per_iter, (rows + rows_per_iter - 1) / rows_per_iter * rows_per_iter);
    rows_per_block = static_cast<int>(std::min<int64_t>(rows, group_rows));
  }
  auto halve = [&](int limit) {
    while (smem_for(rows_per_block) > limit && rows_per_block > rows_per_iter)
      rows_per_block = std::max(rows_per_iter, rows_per_block / 2 / rows_per_iter * rows_per_iter);
  };
  if (forced <= 0 && even) {
    auto even_rows = [&](int n) { return std::min(group_rows, ((group_rows + n - 1) / n + rows_per_iter - 1) / rows_per_iter * rows_per_iter); };
    int n = (group_rows + rows_per_block - 1) / rows_per_block;
    rows_per_block = even_rows(n);
    while (smem_for(rows_per_block) > smem_per_sm() / min_blocks - 1024 && rows_per_block > rows_per_iter)
      rows_per_block = even_rows(++n);
  } else if (forced <= 0) {
    halve(smem_per_sm() / min_blocks - 1024);  // 1 KiB per block is the driver's
  }
  halve(max_smem_per_block());
  return rows_per_block;
}

// The verify's launch: 128 threads; rows of a key head's value heads per block enough for ~2 waves of
// kMinBlocks blocks per SM, split evenly (each block repeats the window's prologue), at most the key head's rows, and few
// enough that kMinBlocks blocks fit an SM's shared memory; gdn_verify_rows forces a value (any value >= 1).
// src_t: what the row loop streams (the checkpoint, or an fp32 checkpoint's bf16 view).
template <typename ckpt_t, typename act_t, int kK, int kStages, int kLanes, int kMinBlocks, typename src_t = ckpt_t, bool kMma = false>
void launch_gdn_replay_verify(const GdnReplayParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128;
  using Layout = RowLayout<src_t, kK, kThreads, 1, kLanes>;
  using MmaGeom = GdnVerifyMma<kK>;
  const GdnReplayCacheParams& c = p.cache;
  const int ratio = p.nheads / p.nkheads, V = p.vdim, group_rows = ratio * V;
  auto heads_for = [&](int r) { return std::min((r + V - 1) / V + 1, ratio); };
  auto smem_at = [&](int r, int stages) {
    const int staging = stages * (kMma ? MmaGeom::kVecs : Layout::kVecsPerLane) * kThreads * 16;
    return GdnVerifyPassSmem(staging, sizeof(act_t), r, kMma ? MmaGeom::kRowsPerWarp : Layout::kRowsPerWarp, kK, c.ring_len, p.ntokens,
                             heads_for(r), kMma)
        .total;
  };
  auto smem_for = [&](int r) { return smem_at(r, kStages); };
  // ~2 waves, the key head's rows split evenly over its blocks: at batch 32 two blocks of 128 rows where ~4 waves
  // gave three of 96, 96 and 64, 4-8% slower at every T and rate in two runs (bench/NOTES.md "Session 6"); at T = 8
  // halving for shared memory gave 88 rows (evened to 64) where 128 fit, 1.17-1.27x the time of 128 rows (session 7,
  // a66ec43's bench/results/gdn_speculative.json). At the benchmark's ring of 32, the same rows as before at batch 1,
  // 128 and 256 (longer rings at T = 8 get 96 rows where halving gave 64).
  const int rows_per_block = gdn_rows_per_block(tune_knob("gdn_verify_rows"), p, int64_t(num_sms()) * 2 * kMinBlocks,
                                                kMma ? MmaGeom::kRows : Layout::kRowsPerIter, kMinBlocks, smem_for, /*even=*/true);
  if constexpr (kMma && kMinBlocks == 4) {  // four blocks an SM only where they keep the rows three blocks get (the
    // window's prologue is per block: 128-row blocks were 20% slower than 256-row ones, bench/NOTES.md session 27)
    const int rows_at_three = gdn_rows_per_block(tune_knob("gdn_verify_rows"), p, int64_t(num_sms()) * 2 * 3, MmaGeom::kRows, 3,
                                                 [&](int r) { return smem_at(r, 3); }, /*even=*/true);
    if (rows_per_block < rows_at_three) return launch_gdn_replay_verify<ckpt_t, act_t, kK, 3, kLanes, 3, src_t, true>(p, stream);
  }
  const int smem = smem_for(rows_per_block);
  if constexpr (kMma) {  // its B fragments and 64-row tiles need more shared memory: a device with less runs the other loop
    if (smem > max_smem_per_block())
      return launch_gdn_replay_verify<ckpt_t, act_t, kK, 3, kLanes, 3, src_t, false>(p, stream);
  }
  gdn_check_smem(smem, p, c.ring_len, "gdn_replay_verify");
  const int chunks = (group_rows + rows_per_block - 1) / rows_per_block;
  const GdnTileVec vec = gdn_tile_vec<act_t>(p, rows_per_block, true);
  const dim3 grid(chunks, p.nkheads, p.batch);
  // a block's streamed rows one stride apart
  const bool flat = std::is_same_v<src_t, ckpt_t> ? c.ckpt_head_stride == int64_t(V) * c.ckpt_row_stride
                                                  : c.view_head_stride == int64_t(V) * c.view_row_stride;
  auto kernel = gdn_replay_verify_rowpass_kernel<ckpt_t, act_t, kK, kThreads, kStages, Layout::kLanesPerRow, kMinBlocks, src_t, kMma>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "gdn_replay_verify shared memory");
  kernel<<<grid, kThreads, smem, stream>>>(p, rows_per_block, heads_for(rows_per_block), vec.u, vec.k, vec.v, flat);
  check_cuda(cudaGetLastError(), "gdn_replay_verify kernel launch");
}

template <DType kCkpt>
void gdn_replay_verify_cuda_for_ckpt(const GdnReplayParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  if (p.ntokens > kGdnMaxT) throw std::invalid_argument("replayssm: the CUDA gdn_replay_verify takes at most 16 tokens per row");
  const GdnReplayCacheParams& c = p.cache;
  // 3 stages, 16 columns per lane (fewer lanes when a row has fewer vectors), 3 blocks per SM. The numerical split:
  // the view only of an fp32 checkpoint (its bf16 view streamed), stochastic rounding only of a 16-bit one (ops.cpp).
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.kdim, kK, [&] {
      using act_t = typename CudaType<kAct>::type;
      if (c.view != nullptr) {
        if constexpr (kCkpt == DType::kFloat32) {
          using view_t = __nv_bfloat16;
          return launch_gdn_replay_verify<float, act_t, kK, 3, GdnStepLanes<view_t, kK>::value, 3, view_t>(p, stream);
        } else {
          throw std::invalid_argument("replayssm: on CUDA the GDN output view must be of an fp32 checkpoint");
        }
      }
      if (kCkpt == DType::kFloat32 && (c.sr_seed != nullptr || c.fold_count != nullptr))
        throw std::invalid_argument("replayssm: on CUDA a GDN fold counter (fold_count) comes with an output view or a bf16/fp16 checkpoint");
      // An fp32 checkpoint streamed as it is: the dots on tensor cores (3xTF32) unless gdn_verify_mma=0; two stages and
      // four blocks an SM (128 registers; at K = V = 128, T = 4 and a 12-token ring a block's 256 rows then take 55 KB:
      // four fit) where that keeps the rows a block gets at three blocks an SM; else three stages and three blocks.
      if constexpr (kCkpt == DType::kFloat32 && kK % 32 == 0)
        if (tune_knob("gdn_verify_mma") != 0) {
          if (tune_knob("gdn_verify_4bps") == 0)  // (REPLAYSSM_TUNE: three stages and three blocks an SM, as before)
            return launch_gdn_replay_verify<ckpt_t, act_t, kK, 3, GdnStepLanes<ckpt_t, kK>::value, 3, ckpt_t, true>(p, stream);
          return launch_gdn_replay_verify<ckpt_t, act_t, kK, 2, GdnStepLanes<ckpt_t, kK>::value, 4, ckpt_t, true>(p, stream);
        }
      return launch_gdn_replay_verify<ckpt_t, act_t, kK, 3, GdnStepLanes<ckpt_t, kK>::value, 3>(p, stream);
    });
  });
}

// State at each slot's cursor (or a committed position): exp(G_w) S_c + sum_{j<w} weight_j u_j k_j^T, fp32.
// Not a hot path: a block per (value head, row).
template <typename ckpt_t>
__global__ void gdn_replay_state_kernel(const GdnReplayStateParams p) {
  const GdnReplayCacheParams& c = p.cache;
  const int hv = blockIdx.x, b = blockIdx.y, K = p.kdim, V = p.vdim, h = hv / (p.nheads / p.nkheads);
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_replay_state: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int cursor = c.cursor[slot];
  const int w = p.positions ? p.positions[b] : cursor;
  RSSM_DEVICE_CHECK(w >= 0 && w <= cursor && cursor <= c.ring_len,
                    "gdn_replay_state: position %d of slot %lld is outside [0, cursor = %d] (ring_len %d)", w, (long long)slot, cursor,
                    c.ring_len);
  extern __shared__ float weight[];  // [j], then [ring_len] = exp(G_w)
  const float* ring_g = c.ring_g + slot * c.ring_g_slot_stride + hv;
  if (threadIdx.x == 0)
    weight[c.ring_len] = replay_decays([&](int j) { return ring_g[j * c.ring_g_pos_stride]; }, w - 1, 1.f, weight);
  __syncthreads();
  const ckpt_t* S = static_cast<const ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(hv) * c.ckpt_head_stride;
  const float* ring_u = c.ring_u + slot * c.ring_u_slot_stride + hv * c.ring_u_head_stride;
  const float* ring_k = c.ring_k + slot * c.ring_k_slot_stride + h * c.ring_k_head_stride;
  float* out = p.out + (int64_t(b) * p.nheads + hv) * V * K;
  for (int idx = threadIdx.x; idx < V * K; idx += blockDim.x) {
    const int r = idx / K, n = idx % K;
    float s = weight[c.ring_len] * to_float(S[int64_t(r) * c.ckpt_row_stride + n]);
    for (int j = 0; j < w; ++j) s += weight[j] * ring_u[j * c.ring_u_pos_stride + r] * ring_k[j * c.ring_k_pos_stride + n];
    out[idx] = s;
  }
}

template <DType kCkpt>
void gdn_replay_state_cuda_for_ckpt(const GdnReplayStateParams& p, cudaStream_t stream) {
  gdn_replay_state_kernel<typename CudaType<kCkpt>::type>
      <<<dim3(p.nheads, p.batch), 256, (p.cache.ring_len + 4) / 4 * 4 * sizeof(float) + 16, stream>>>(p);
  check_cuda(cudaGetLastError(), "gdn_replay_state kernel launch");
}



// kMinBlocks: blocks per SM the compiler is asked to fit (__launch_bounds__), chosen per variant from ptxas -v so
// that nothing spills (16 for the benchmark configuration's one-warp default, 4 for the 128-thread kernel: 128
// registers).
// max_rows (0: none) caps the rows per block that the split chooses (not a forced gdn_step_rows).
template <typename state_t, typename act_t, int kK, int kUnroll, int kLanes, int kMinBlocks, int kThreads = 128,
          bool kStreamHints = true, int kAhead = 0>
void launch_gdn_step(const GdnStepParams& p, cudaStream_t stream, const int max_rows = 0) {
  using Layout = RowLayout<state_t, kK, kThreads, kUnroll, kLanes>;
  constexpr int kRowGroup = Layout::kWarps * Layout::kRowsPerWarp;  // rows of one unrolled load
  // Split a head's rows over blocks only as far as needed to keep every SM busy with several blocks.
  int rows = tune_knob("gdn_step_rows");
  if (rows <= 0) {
    const int64_t heads_total = int64_t(p.batch) * p.nheads;
    const int bps = tune_knob("gdn_step_bps") > 0 ? tune_knob("gdn_step_bps") : 8;
    const int max_chunks = (p.vdim + kRowGroup - 1) / kRowGroup;
    int chunks = static_cast<int>((int64_t(num_sms()) * bps + heads_total - 1) / heads_total);
    chunks = std::max(1, std::min(chunks, max_chunks));
    rows = (p.vdim + chunks - 1) / chunks;
    rows = (rows + kRowGroup - 1) / kRowGroup * kRowGroup;
    if (max_rows > 0) rows = std::min(rows, std::max(kRowGroup, max_rows / kRowGroup * kRowGroup));
  }
  rows = std::min(rows, p.vdim);
  const int chunks = (p.vdim + rows - 1) / rows;
  const dim3 grid(chunks, p.nheads, p.batch);
  constexpr int kStageBytes = kAhead * kUnroll * Layout::kVecsPerLane * kThreads * 16;  // kAhead's stages
  launch_maybe_pdl(gdn_step_kernel<state_t, act_t, kK, kThreads, kUnroll, kLanes, kMinBlocks, kStreamHints, kAhead>, grid, kThreads,
                   kStageBytes, stream, pdl_requested(), "gdn_step kernel launch", p, rows);
}

template <DType kState>
void gdn_step_cuda_for_state(const GdnStepParams& p, cudaStream_t stream) {
  using state_t = typename CudaType<kState>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.kdim, kK, [&] {
      using act_t = typename CudaType<kAct>::type;
      if constexpr (kState == DType::kFloat32 && kAct == DType::kBFloat16 && kK == 128) {
        // The benchmark's configuration: alternatives chosen by REPLAYSSM_TUNE (gdn_step_threads, gdn_step_lanes,
        // gdn_step_unroll).
        const int lanes = tune_knob("gdn_step_lanes"), unroll = tune_knob("gdn_step_unroll");
        const int threads = tune_knob("gdn_step_threads");
        if (threads == 32 || (threads <= 0 && lanes <= 0 && unroll <= 0)) {  // (tune_knob: -1 when not set)
          // One-warp blocks (fla's fused recurrent kernel's shape). The default since session 9: 8 lanes per row,
          // 2 rows in flight per thread, 16 blocks per SM, at most 32 rows per block (the split alone would give
          // a head's 128 rows to one block at batch >= 128). H200, d777fc9, one interleaved run
          // (bench/results/gdn_decode.json): 4.8 / 39.9 / 144.4 / 283.0 us at batch 1 / 32 / 128 / 256, against
          // 5.3 / 41.2 / 146.7 / 286.0 for the 128-thread kernel below (gdn_step_threads=128). The cap was 64 rows
          // until session 16: 32 (the tune entry gdn_step_rows=32, which gives the same grids at batch 32-256) was
          // as fast or faster at 32 / 128 / 256 in each of seven runs of sessions 15-16, by 0-2.5% / 0.2-0.8% /
          // 0.5-1.0% (e.g. 143.2 against 144.1 us at 128, 279.8 against 282.5 at 256: bench/results/session16/
          // gdn_tune_n_call3.json); as the default, 143.3 / 280.7 against gdn_step_rows=64's 143.9 / 282.1 (session 17,
          // bench/results/session17/gdn_tune_p_call1.json).
          if (lanes == 32) {  // a row across the warp, 4 columns per lane: few registers, many blocks per SM
            if (unroll == 4) return launch_gdn_step<float, act_t, kK, 4, 32, 32, 32>(p, stream);  // 60 registers
            return launch_gdn_step<float, act_t, kK, 8, 32, 24, 32>(p, stream);                   // 80 registers
          }
          if (unroll == 1) return launch_gdn_step<float, act_t, kK, 1, 8, 16, 32>(p, stream);
          if (tune_knob("gdn_step_hints") == 1)  // streaming (.cs) loads and stores of the state (the default before session 10)
            return launch_gdn_step<float, act_t, kK, 2, 8, 16, 32>(p, stream, threads <= 0 ? 32 : 0);
          // The state of the next 1-3 row iterations in flight (cp.async stages) while one computes; the default
          // since session 34: 3 (H100, one run, bench/results/session34/gdn_step_ahead_call4_h100.json: 53.7 / 195.0
          // / 383.8 -> 50.8 / 189.1 / 373.7 us at batch 32 / 128 / 256, 91.9% -> 94.7% of copy at 128; batch 1 level,
          // 5.17 against 5.19 in gdn_step_ahead_b1_call5_h100.json). gdn_step_ahead=0: each row iteration loads, then
          // computes (the default before).
          const int ahead = tune_knob("gdn_step_ahead");
          switch (ahead < 0 ? 3 : ahead) {
            case 1: return launch_gdn_step<float, act_t, kK, 2, 8, 16, 32, false, 1>(p, stream, threads <= 0 ? 32 : 0);
            case 2: return launch_gdn_step<float, act_t, kK, 2, 8, 16, 32, false, 2>(p, stream, threads <= 0 ? 32 : 0);
            case 3: return launch_gdn_step<float, act_t, kK, 2, 8, 16, 32, false, 3>(p, stream, threads <= 0 ? 32 : 0);
            case 4: return launch_gdn_step<float, act_t, kK, 2, 8, 20, 32, false, 2>(p, stream, threads <= 0 ? 32 : 0);
            default: break;
          }
          return launch_gdn_step<float, act_t, kK, 2, 8, 16, 32, false>(p, stream, threads <= 0 ? 32 : 0);  // plain
        }
        if (lanes == 4) switch (unroll) {  // 32 columns per lane
            case 1: return launch_gdn_step<float, act_t, kK, 1, 4, 3>(p, stream);
            case 2: return launch_gdn_step<float, act_t, kK, 2, 4, 3>(p, stream);
            default: return launch_gdn_step<float, act_t, kK, 4, 4, 2>(p, stream);  // 8 would spill
          }
        if (lanes == 16) switch (unroll) {  // 8 columns per lane
            case 1: return launch_gdn_step<float, act_t, kK, 1, 16, 8>(p, stream);
            case 2: return launch_gdn_step<float, act_t, kK, 2, 16, 7>(p, stream);
            case 8: return launch_gdn_step<float, act_t, kK, 8, 16, 4>(p, stream);
            default: return launch_gdn_step<float, act_t, kK, 4, 16, 5>(p, stream);
          }
        if (lanes == 32) switch (unroll) {  // 4 columns per lane (Mamba-2's step layout)
            case 1: return launch_gdn_step<float, act_t, kK, 1, 32, 8>(p, stream);
            case 2: return launch_gdn_step<float, act_t, kK, 2, 32, 8>(p, stream);
            case 8: return launch_gdn_step<float, act_t, kK, 8, 32, 6>(p, stream);
            default: return launch_gdn_step<float, act_t, kK, 4, 32, 8>(p, stream);
          }
        switch (unroll) {  // 16 columns per lane
          case 1: return launch_gdn_step<float, act_t, kK, 1, 8, 5>(p, stream);
          case 2: return launch_gdn_step<float, act_t, kK, 2, 8, 5>(p, stream);
          case 8: return launch_gdn_step<float, act_t, kK, 8, 8, 2>(p, stream);
          default: break;
        }
      }
      // The other configurations (and gdn_step_threads=128 in the benchmark's): kUnroll 4 rows in flight per
      // thread, 16 columns per lane, 4 blocks per SM (128 registers).
      return launch_gdn_step<state_t, act_t, kK, 4, GdnStepLanes<state_t, kK>::value, 4>(p, stream);
    });
  });
}

// The replay step's small form for grids of at most two blocks per SM (REPLAYSSM_TUNE gdn_replay_small).
#include "replay_small.cuh"

// Default configuration (kStages 3, ReplayLanes (4 lanes of 32 columns for K = 128 fp32), 3 blocks per SM): two
// stages in flight while a third is read, 128 bytes of a row per thread per stage: ~96 KiB of checkpoint reads
// outstanding per SM. src_t: what the row loop streams (the checkpoint, or an fp32 checkpoint's bf16 view).
template <typename ckpt_t, typename act_t, int kK, int kStages = 3, int kLanes = ReplayLanes<ckpt_t, kK>::value, int kMinBlocks = 3,
          typename src_t = ckpt_t>
void launch_gdn_replay_step(const GdnReplayParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128;
  using Layout = RowLayout<src_t, kK, kThreads, 1, kLanes>;
  const GdnReplayCacheParams& c = p.cache;
  const int ratio = p.nheads / p.nkheads, V = p.vdim, group_rows = ratio * V;
  auto heads_for = [&](int r) { return std::min((r + V - 1) / V + 1, ratio); };
  auto smem_for = [&](int r) {
    return GdnReplaySmem(kStages * Layout::kVecsPerLane * kThreads * 16, sizeof(act_t), r, kK, c.ring_len, heads_for(r)).total;
  };
  // ~4 waves of 3 blocks per SM (prologues overlap other blocks' streaming); at batch 32 it gives blocks of 128 rows.
  // A plain cache aimed at 16 in sessions 35-48 (64-row blocks at batch 32: 32.9 against 34.5 us in session 35). In
  // sessions 48-49 12 was the faster for a plain cache at 32 and level elsewhere (H100): 31.18 against the
  // gdn_replay_bps=16 entry's 32.29 us at 32, within 0.1% at 4-24 and 48-256
  // (bench/results/session49/gdn_replay_bps12_call3_h100.json; gdn_replay_b5_call2_h100.json: 31.11 against 32.17;
  // session 48's run: 31.25 against 32.37). A view's 64-row blocks were 17% slower at batch 32 (session 35).
  const int bps = tune_knob("gdn_replay_bps") > 0 ? tune_knob("gdn_replay_bps") : 12;
  int rows_per_block = gdn_rows_per_block(tune_knob("gdn_replay_rows"), p, int64_t(num_sms()) * bps, Layout::kRowsPerIter,
                                          kMinBlocks, smem_for);
  // Blocks hold at least 64 rows (four iterations of the default layouts), while kMinBlocks of them fit an SM: below
  // that every block repeats the prologue (slot, ring, scalars) for one or two row iterations. The split gives 16 / 32
  // rows at batch 4-8 / 16 here; H100, one run each in sessions 36 and 37, us (bench/results/session37/): plain 64-row
  // blocks 8.68 / 12.35 / 21.28 at batch 4 / 8 / 16 against the split's 15.3 / 21.7 / 24.2 (and the small kernel's
  // 10.4 / 17.4 at 4 / 8); 128 rows 10.2 / 13.8 / 21.3. The view (session 37, gdn_replay_rows=64 against the split):
  // 6.57 / 7.43 / 8.35 / 9.01 / 10.70 / 12.56 at batch 1 / 2 / 3 / 4 / 6 / 8 against 6.85 / 9.08 / 15.25 / 16.69 / 21.74
  // / 18.18, level at 16. Batch 32 and up: the split gives 64 rows or more already.
  // REPLAYSSM_TUNE gdn_replay_min_rows=N: N rows instead (0: none).
  // (r rows a block: kMinBlocks such blocks still fit an SM's shared memory, with the driver's 1 KiB each)
  auto fits = [&](int r) { return smem_for(r) <= smem_per_sm() / kMinBlocks - 1024 && smem_for(r) <= max_smem_per_block(); };
  if (tune_knob("gdn_replay_rows") <= 0) {
    const int knob = tune_knob("gdn_replay_min_rows");
    const int min_rows = (knob >= 0 ? knob : 64) / Layout::kRowsPerIter * Layout::kRowsPerIter;
    const int r = std::min(min_rows, group_rows);
    if (r > rows_per_block && fits(r))
      rows_per_block = r;
  }
  // Blocks of equal rows: a key head's rows split evenly into whole row iterations, in as many blocks as the rule
  // above gives or the fewest fewer, while kMinBlocks blocks still fit an SM (REPLAYSSM_TUNE gdn_replay_split=0: the
  // rows as computed; it applies under forced gdn_replay_bps too).
  // At batch 32 the rule above gives 96 rows: blocks of 96, 96 and 64 per key head; 128 rows (two blocks) measured
  // 29.5 against 30.7 us (H200, session 15, gdn_replay_rows=128 against the default; 30.1 against 31.4 in another run).
  if (tune_knob("gdn_replay_rows") <= 0 && tune_knob("gdn_replay_split") != 0) {
    for (int n = (group_rows + rows_per_block - 1) / rows_per_block; n >= 1; --n) {
      const int r = group_rows / n;
      if (group_rows % n != 0 || r % Layout::kRowsPerIter != 0) continue;
      if (r != rows_per_block && fits(r))
        rows_per_block = r;
      break;
    }
  }
  const int smem = smem_for(rows_per_block);
  gdn_check_smem(smem, p, c.ring_len, "gdn_replay_step");
  if (p.vdim > 0xffff)  // (the kernel packs a row's index within its value head into 16 bits)
    throw std::invalid_argument("replayssm: gdn_replay_step on CUDA supports vdim up to 65535, got " + std::to_string(p.vdim));
  const int chunks = (group_rows + rows_per_block - 1) / rows_per_block;
  const GdnTileVec vec = gdn_tile_vec<act_t>(p, rows_per_block, false);
  const int64_t blocks = int64_t(chunks) * p.nkheads * p.batch;
  const int64_t resident = int64_t(num_sms()) * kMinBlocks;  // blocks of one resident wave
  const bool view = !std::is_same_v<src_t, ckpt_t>;
  // The whole ring fetched with the cursor (the committed part is all a row uses): a view's grids within one resident
  // wave; a plain cache's never unless forced since session 38. With the 64-row blocks (session 37) a plain cache's
  // resident grids are batches 3-8 here, where the prefetch's extra bytes cost more than the trip it saves: without it
  // 9.24 / 10.75 against 9.48 / 11.27 us at batch 6 / 8, level at 3 / 4 (7.28 / 7.76 against 7.17 / 7.80) (H100, one
  // run, the gdn_replay_prefetch=0 entries of bench/results/session38/gdn_main_call2_h100.json; at 6 / 8 the same in
  // session 37's run and in session 38's call 1: -3.8 / -5.1% and -4.5 / -4.3%).
  const int forced_prefetch = tune_knob("gdn_replay_prefetch");
  const bool prefetch_ring = forced_prefetch >= 0 ? forced_prefetch > 0 : view && blocks <= resident;
  // An fp32 checkpoint's folding steps (the kernel's kFoldPair): two row iterations per trip, for every grid since
  // session 37 (REPLAYSSM_TUNE fold_pair=0 never). Until then only past one resident wave, after the Mamba-2 replay
  // step at batch 1 (7.78 us with pairs, 7.59 without, H200, session 15); with the 64-row blocks the GDN grids of
  // batch 3-8 here are resident, where a launch lasts as long as its folding blocks, and pairs made them faster: 7.25
  // / 7.83 / 9.45 / 11.29 against 7.98 / 8.64 / 10.40 / 12.25 us at batch 3 / 4 / 6 / 8, and the general kernel at
  // batch 1 / 2 6.26 / 6.85 against 6.67 / 7.26 (H100, session 37, the fold_pair=1 entries, bench/results/session37/).
  // 16-bit activations only: with fp32 ones (K = 128, 3 stages, 4 lanes) the pair loop spilled 36 bytes (ptxas).
  constexpr bool kCanPair = std::is_same_v<src_t, ckpt_t> && std::is_same_v<ckpt_t, float> && sizeof(act_t) == 2;
  const bool pair = kCanPair && tune_knob("fold_pair") != 0;
  // A plain checkpoint's rows from 32-bit offsets of a key head's value-head rows from the block's first (the kernel's
  // kLean) wherever they fit (REPLAYSSM_TUNE stream_lean=0: never; a view's: below). H200, session 16 (bench/results/session16/), us at batch 1 / 32 / 128 / 256:
  // plain 6.46 / 29.6 / 87.7 / 163.1 against 64-bit addresses' 6.20 / 29.6 / 88.3 / 165.2; view 7.51 / 28.9 / 69.4 /
  // 127.1 against 7.62 / 28.8 / 70.8 / 129.4. Batch 1's loss kept one-wave grids on 64-bit addresses until session 39;
  // batches 1-2 have since gone to the small kernel. At 3-16 (the general kernel's one-wave grids; H100, the
  // stream_lean=1 entries against the default) the lean form was 0.3-1.1% slower in session 37 (before the fold pairs
  // of bd11db2), 0-1.1% faster in session 38 and 1.3-3.6% faster in session 39: 7.06 / 7.48 / 8.92 / 10.55 / 18.49
  // against 7.33 / 7.74 / 9.14 / 10.69 / 18.50 us at batch 3 / 4 / 6 / 8 / 16
  // (bench/results/session3{7,8,9}/gdn_*.json; session 39's gdn_new_call1_h100.json).
  // A cache without a fold phase gets, at four blocks an SM (128 registers), the kernel without the phase's code: with
  // it the GDN view's lean kernel spills (ptxas: 56 bytes, 44 with the phase read again at the end); without it the view
  // is 5.0% faster at batch 128 and 256, 14.4% at 32 (H100, one run: bench/results/session46/). At three blocks an SM
  // there are registers to spare.
  // REPLAYSSM_TUNE fold_phase_code=1: the kernel with the phase's code regardless (the form before).
  const bool phase = kMinBlocks != 4 || c.fold_phase != nullptr || tune_knob("fold_phase_code") > 0;
  // A view streams from 64-bit addresses (REPLAYSSM_TUNE stream_lean=1: from 32-bit offsets too). H100, session 51, one
  // run (bench/results/session51/), us, the 64-bit form against the 32-bit one:
  // - without a fold phase (the default view): 28.51 / 78.55 / 146.34 against 29.33 / 80.10 / 148.30 at batch 32 / 128 /
  //   256, and 4.1-5.3% faster at every batch 4-24 (9.27 / 15.55 / 20.70 / 27.78 against 9.71 / 16.26 / 21.80 / 29.32 at
  //   4 / 10 / 16 / 24);
  // - aligned (the four-blocks-an-SM kernel with the phase's code, whose 32-bit form spills 44 bytes, ptxas): 8.40 /
  //   17.57 / 28.49 / 82.71 / 155.59 against 9.26 / 19.49 / 30.47 / 88.49 / 163.62 at 4 / 16 / 32 / 128 / 256.
  // Why the plain view's 32-bit form (8 bytes spilled, outside the row loops) is slower is not known; a plain
  // checkpoint's is faster (above). Session 16's H200 run (above, an older kernel) had the view's 32-bit form faster:
  // this rule is not yet checked on an H200 (the benchmark's stream_lean=1 view entry).
  const int64_t head_stride = view ? c.view_head_stride : c.ckpt_head_stride, row_stride = view ? c.view_row_stride : c.ckpt_row_stride;
  const int lean_knob = tune_knob("stream_lean");
  const bool lean = lean_knob != 0 && (lean_knob > 0 || !view) &&
                    int64_t(ratio) * head_stride + int64_t(V) * row_stride < (int64_t(1) << 31) && head_stride < (int64_t(1) << 31);
  auto pick = [&](auto pair_c, auto lean_c) {
    constexpr bool kP = decltype(pair_c)::value, kL = decltype(lean_c)::value;
    if constexpr (kMinBlocks == 4)
      if (!phase) return gdn_replay_step_kernel<ckpt_t, src_t, act_t, kK, kThreads, kStages, Layout::kLanesPerRow, kMinBlocks, kP, kL, false>;
    return gdn_replay_step_kernel<ckpt_t, src_t, act_t, kK, kThreads, kStages, Layout::kLanesPerRow, kMinBlocks, kP, kL, true>;
  };
  using No = std::false_type;
  using Yes = std::true_type;
  auto kernel = lean ? pick(No{}, Yes{}) : pick(No{}, No{});
  if constexpr (kCanPair)
    if (pair) kernel = lean ? pick(Yes{}, Yes{}) : pick(Yes{}, No{});
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "gdn_replay_step shared memory");
  GdnReplayParams q = p;
  // The prologue waits for the first row iteration and the ring only, the next iterations' copies issued after the
  // ring's (default since session 35: H100, one run, bench/results/session35/gdn_fp_call2_h100.json: replay 34.8 /
  // 111.5 / 213.0 -> 34.3 / 110.3 / 211.7 us at batch 32 / 128 / 256, the view 30.8 / 80.7 / 148.9 -> 29.5 / 79.8 /
  // 148.2). REPLAYSSM_TUNE replay_stage0_first=0: every first stage waited for (the former prologue).
  q.stage0_first = tune_knob("replay_stage0_first") != 0 ? 1 : 0;
  // A view's folding rows marked by the order stream the master alone (the kernel's kCanStage; REPLAYSSM_TUNE
  // view_fold_lean=0: they stream the view too and load the master where used, the form before session 50).
  q.view_fold_stage = tune_knob("view_fold_lean") != 0 ? 1 : 0;
  // Folding rows first (common/fold_order.cuh): with a view. A plain checkpoint's grid of at most two resident waves
  // took it too from session 17 (batch 32 with 96-128-row blocks: 28.7-29.7 against 29.7-30.1 us in each of eight H200
  // runs, sessions 17-32); since the 64-row blocks (session 35 at batch 32: ~4 waves, and the floor of session 37) only
  // batches ~9-16 here had such a grid, and there it lost: 20.92 against 18.56 us at batch 16 (H100, session 37, the
  // replay_fold_first=0 entry, bench/results/session37/). So plain checkpoints take the grid's order unless forced.
  // A view's blocks of the 64-row floor (batches 9-24 here) take the grid's order too: the order's launch cost more
  // than it saved there. H100, us at batch 16 / 24, default (fold-first) against the replay_fold_first=0 entry: 21.39 /
  // 28.11 against 20.38 / 27.13 (session 50, bench/results/session50/gdn_view_mw_call1_h100.json; call 3: 21.45 against
  // 20.42 at 16; session 49: 21.49 against 19.86 at 16). With 128-row blocks (batch 25 and up) it gains: 29.94 against
  // 33.57 at 32, 37.70 against 43.52 at 48 (session 50).
  const bool pdl_asked = pdl_requested();
  const bool fold_first = view && rows_per_block > 64;
  q.row_order = fold_first_order(p.row_order, p.slot_ids, p.slot_ids_int64, c.cursor, c.fold_phase, p.num_slots, c.ring_len,
                                 p.batch, blocks, resident, fold_first, stream);
  const dim3 grid(chunks, p.nkheads, p.batch);
  // PDL only without the order kernel just ahead (fold_first_order returns null when it launched none): the kernel
  // reads its entry of the order before pdl_wait().
  // With PDL the ring is requested before the wait too (REPLAYSSM_TUNE pdl_ring_ahead=0: after it, as without PDL).
  q.order_carries = q.row_order != nullptr && order_carries() ? 1 : 0;
  const bool pdl = pdl_asked && q.row_order == nullptr, ring_ahead = pdl && tune_knob("pdl_ring_ahead") != 0;
  launch_maybe_pdl(kernel, grid, kThreads, smem, stream, pdl, "gdn_replay_step kernel launch", q, rows_per_block,
                   heads_for(rows_per_block), vec.u, vec.k, vec.v, prefetch_ring, ring_ahead);
}

// The replay step with the bf16 output view of an fp32 checkpoint: defined in replay_view_f32.cu (its own translation
// unit, so that the build's longest one stays short).
void gdn_replay_step_cuda_view(const GdnReplayParams& p, cudaStream_t stream);

template <DType kCkpt>
void gdn_replay_step_cuda_for_ckpt(const GdnReplayParams& p, cudaStream_t stream) {
  if (p.cache.view != nullptr) {  // the numerical split: the bf16 view of an fp32 checkpoint streamed for S k and S q
    if constexpr (kCkpt == DType::kFloat32) return gdn_replay_step_cuda_view(p, stream);
    throw std::invalid_argument("replayssm: on CUDA the GDN output view must be of an fp32 checkpoint");
  }
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.kdim, kK, [&] {
      using act_t = typename CudaType<kAct>::type;
      if constexpr (kCkpt == DType::kFloat32 && kAct == DType::kBFloat16 && kK == 128) {
        if (launch_gdn_replay_step_small<act_t>(p, stream)) return;  // (replay_small.cuh: REPLAYSSM_TUNE gdn_replay_small)
        // The benchmark's configuration: 16 columns per lane in four stages, 4 blocks per SM (faster than the
        // generic 3/4/3 by 6-13% at batch 32-128 and level at 256 once the row loop deferred its epilogue,
        // bench/results/gdn_decode.json); alternatives chosen by REPLAYSSM_TUNE (gdn_replay_variant).
        switch (tune_knob("gdn_replay_variant")) {
          case 0: break;
          case 1: return launch_gdn_replay_step<float, act_t, kK, 4, 4, 2>(p, stream);
          case 2: return launch_gdn_replay_step<float, act_t, kK, 6, 8, 3>(p, stream);
          default: return launch_gdn_replay_step<float, act_t, kK, 4, 8, 4>(p, stream);
        }
      }
      return launch_gdn_replay_step<ckpt_t, act_t, kK>(p, stream);
    });
  });
}

}  // namespace replayssm
