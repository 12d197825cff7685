// CUDA kernels of the Mamba-2 decode ops (torch-free: params in, stream in). One template per kernel,
// instantiated per storage dtype in the small step_*.cu / replay_*.cu files so that builds parallelise.
//
// Both step kernels stream state rows (one row = dstate values of one (head, p)) with the same layout:
// each lane owns kColsPerLane columns of a row as 16-byte vectors, kLanesPerRow lanes share a row, and
// each thread keeps kUnroll rows' loads in flight before it uses any of them, so that a full SM has
// ~64-128 KiB of reads outstanding: the state is read at the HBM rate, not at the latency rate.
//
// Launch-configuration knobs (REPLAYSSM_TUNE="key=value,...", common/cuda_utils.cuh; read at every launch; for
// benchmarking alternatives, bench/bench_mamba2.py --tune and bench_speculative.py --tune):
//   step_unroll      rows in flight per thread in mamba2_step: 1, 2, 4, 8 (default 4, or 2 with >= 64 heads per SM
//                    or at most one; for the unstaged benchmark shape 8 where mamba2_step_prefers_unroll8 says so,
//                    since session 38)
//   step_bps         blocks per SM mamba2_step's row split aims at (default 8)
//   step_ahead       1-3: mamba2_step with the next 1-3 row iterations' state in flight (cp.async stages; fp32 state,
//                    bf16 activations, dstate 128, unroll 2 or 4: with 4 (the default below 64 heads an SM, e.g.
//                    batch 32) 3 runs as 2; ignored with step_unroll 1 or 8); unset: 3 past 8 heads an SM (batch 16
//                    and up on the benchmark shape; since session 36), else 0; 0: off (the kernel before)
//   m2_replay_stage0_first 1 or unset (since session 36): the replay step's prologue waits for its first row
//                    iteration and the ring only (the later first stages issued after the ring's group); 0: for every
//                    copy it issued (the kernel before). Set either way it forces the general kernel (not the small one)
//   replay_rows      rows of a group per replay-step block (forced; replay_step.cuh)
//   replay_min_rows  0: the replay step's blocks as the rows rule gives them (default: 128 rows where the rule gives
//                    fewer than 256 and its grid is past two blocks an SM; replay_step.cuh)
//   replay_prefetch  1: fetch the whole ring with the cursor (default when the grid is within one wave), 0: not
//   stream_lean      0: 64-bit row and output addresses in the replay step and verify (default: 32-bit offsets)
//   replay_fold_first 0: the replay steps (Mamba-2 and GDN) take the grid's row order; 1: folding rows first (the
//                    default: first with an output view when the grid is not resident at once; common/fold_order.cuh)
//   order_cursor     0: with the fold-first order, the replay steps' blocks (Mamba-2 and GDN) read their slot id and
//                    cursor themselves (default 1: from the order's record, filled by the order kernel; fold_order.cuh)
//   view_fold_lean   0: a view's folding rows stream the view for their outputs too (default 1: the master alone,
//                    rounded as the view holds it; replay_step.cuh)
//   fold_pair        an fp32 checkpoint's folding steps: 1 two row iterations per trip (each B_j, or GDN's k_j,
//                    read once for both rows), 0 one; default: two when the grid is past one resident wave
//                    (replay_step.cuh), the GDN replay step always (gdn/kernels.cuh, since session 37)
//   view_bps         a bf16 view's replay step (bf16 activations, N = 128): 4 or 3 blocks per SM (default 4 for rings
//                    up to 16, the length measured; 3 past it; kernels.cuh below)
//   verify_rows      rows of a group per verify block (forced; verify.cuh)
//   replay_small     0: never the small replay-step kernel (replay_small.cuh; default: grids of at most two
//                    blocks per SM, fp32 checkpoint, no view, and no replay_rows / replay_prefetch / replay_sm_rows /
//                    fold_pair / stream_lean / m2_replay_stage0_first forced), 1: whenever the shape allows, at any batch
//   small_arrive     where the small replay kernel's block announces it has read the cursor: 0 (default) after
//                    the block's barrier, 1 once warp 0 has it, 2 after warp 0's dots (replay_small.cuh)
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "../common/cuda_utils.cuh"
#include "../common/fold_order.cuh"
#include "../common/math.h"
#include "../common/rounding.h"
#include "params.h"

namespace replayssm {

template <typename state_t, int kN, int kThreads, int kUnroll, int kMaxLanes = 32>
struct RowLayout {
  static constexpr int kVec = 16 / sizeof(state_t);  // elements per 16-byte access
  static_assert(kN % kVec == 0, "dstate must be a multiple of the 16-byte vector");
  static constexpr int kVecsPerRow = kN / kVec;
  static constexpr int kLanesPerRow = kVecsPerRow < kMaxLanes ? kVecsPerRow : kMaxLanes;
  static constexpr int kVecsPerLane = kVecsPerRow / kLanesPerRow;
  static constexpr int kColsPerLane = kVecsPerLane * kVec;
  static constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowsPerIter = kWarps * kRowsPerWarp * kUnroll;

  // Column of element e of this lane's v-th vector: vectors of a row are interleaved across its lanes,
  // so one load instruction of a warp reads whole contiguous rows.
  __device__ static int col(int lane_in_row, int v, int e) { return (v * kLanesPerRow + lane_in_row) * kVec + e; }
  // Row of unroll slot u of the iteration starting at row base, for the thread at (warp, row_in_warp): an iteration's
  // kUnroll slots are whole blocks of rows, warps interleaved within each.
  __device__ static int row(int base, int u, int warp, int row_in_warp) { return base + (u * kWarps + warp) * kRowsPerWarp + row_in_warp; }

  // This lane's columns of a row (16-byte streaming loads; zeros when !valid), and their store back.
  __device__ static void load_row(const state_t* row, int lane_in_row, bool valid, float (&s)[kColsPerLane]) {
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v) {
      float part[kVec];
      if (valid) load16_stream(row + col(lane_in_row, v, 0), part);
#pragma unroll
      for (int e = 0; e < kVec; ++e) s[v * kVec + e] = valid ? part[e] : 0.f;
    }
  }
  __device__ static void store_row(state_t* row, int lane_in_row, const float (&s)[kColsPerLane]) {
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v)
      store16_stream(row + col(lane_in_row, v, 0), *reinterpret_cast<const float(*)[kVec]>(&s[v * kVec]));
  }
  // A fold's row of an fp32 master (16-byte streaming stores) and of its 16-bit view (this layout's state_t), the
  // same values; the view rounded to nearest.
  __device__ static void store_master_and_view(float* master, state_t* view, int lane_in_row, const float (&s)[kColsPerLane]) {
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v) {
#pragma unroll
      for (int e = 0; e < kVec; e += 4)
        __stcs(reinterpret_cast<float4*>(master + col(lane_in_row, v, e)),
               make_float4(s[v * kVec + e], s[v * kVec + e + 1], s[v * kVec + e + 2], s[v * kVec + e + 3]));
      store16_stream(view + col(lane_in_row, v, 0), *reinterpret_cast<const float(*)[kVec]>(&s[v * kVec]));
    }
  }
  // s[c] += a * x[column of c] over this lane's columns (x: a full row, any element type).
  template <typename T>
  __device__ static void axpy(float a, const T* x, int lane_in_row, float (&s)[kColsPerLane]) {
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v)
#pragma unroll
      for (int e = 0; e < kVec; ++e) s[v * kVec + e] = fmaf(a, to_float(x[col(lane_in_row, v, e)]), s[v * kVec + e]);
  }

  // axpy for a 16-bit x whose vectors are aligned (x + col(lane, v, 0) at a multiple of kVec * sizeof(T) bytes, as a
  // row of a 16-byte-aligned shared tile with kN a multiple of 8 is): one load per vector (LDS.64 for an fp32 layout,
  // LDS.128 for a 16-bit one) where axpy's element loads take kVec LDS.U16, and the pairs unpacked by unpack_words.
  template <typename T>
  __device__ static void axpy_vec(float a, const T* x, int lane_in_row, float (&s)[kColsPerLane]) {
    static_assert(sizeof(T) == 2 && (kVec == 4 || kVec == 8), "16-bit x, vectors of 4 or 8 elements");
    constexpr int kWords = kVec / 2;
    using Raw = std::conditional_t<kWords == 4, uint4, uint2>;
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v) {
      const Raw raw = *reinterpret_cast<const Raw*>(x + col(lane_in_row, v, 0));
      float f[kVec];
      if constexpr (kWords == 4) {
        unpack16<T>(raw, f);
      } else {
        const uint32_t w[2] = {raw.x, raw.y};
        unpack_words<T, 2>(w, f);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) s[v * kVec + e] = fmaf(a, f[e], s[v * kVec + e]);
    }
  }

  // An fp32 row of kN columns in shared memory that every row's lanes read whole (a ring entry's k in a GDN fold):
  // column n sits at tile_pos(n), so that each float4 a lane reads lies next to the same float4 of the row's next
  // lane. With a 4-byte state_t that is the identity. With a 16-bit one a lane's vector spans 8 columns, 32 bytes of
  // fp32: in column order lanes l and l + 4 hit the same banks, a 2-way conflict on every LDS.128 (ncu, GDN view
  // fold at batch 256: 45% of the launch's shared wavefronts excessive, L1 95% busy; bench/NOTES.md, session 11).
  static constexpr int kSub = kVec / 4;  // float4s per vector
  __host__ __device__ static int tile_pos(int n) {  // (unsigned: shifts and masks, no sign fix-ups)
    const unsigned g = unsigned(n) / 4, v = g / (kLanesPerRow * kSub), rem = g % (kLanesPerRow * kSub);
    return int(((v * kSub + rem % kSub) * kLanesPerRow + rem / kSub) * 4 + unsigned(n) % 4);
  }
  // axpy from such a tile (16-byte aligned).
  __device__ static void axpy_tile(float a, const float* tile, int lane_in_row, float (&s)[kColsPerLane]) {
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v)
#pragma unroll
      for (int e4 = 0; e4 < kSub; ++e4) {
        const float4 x = *reinterpret_cast<const float4*>(tile + ((v * kSub + e4) * kLanesPerRow + lane_in_row) * 4);
        float* d = &s[v * kVec + e4 * 4];
        d[0] = fmaf(a, x.x, d[0]), d[1] = fmaf(a, x.y, d[1]), d[2] = fmaf(a, x.z, d[2]), d[3] = fmaf(a, x.w, d[3]);
      }
  }
  // axpy_tile for two rows (s += a x, t += b x), each float4 of the tile read once for both.
  __device__ static void axpy_tile2(float a, float b, const float* tile, int lane_in_row, float (&s)[kColsPerLane],
                                    float (&t)[kColsPerLane]) {
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v)
#pragma unroll
      for (int e4 = 0; e4 < kSub; ++e4) {
        const float4 x = *reinterpret_cast<const float4*>(tile + ((v * kSub + e4) * kLanesPerRow + lane_in_row) * 4);
        float* d = &s[v * kVec + e4 * 4];
        float* f = &t[v * kVec + e4 * 4];
        d[0] = fmaf(a, x.x, d[0]), d[1] = fmaf(a, x.y, d[1]), d[2] = fmaf(a, x.z, d[2]), d[3] = fmaf(a, x.w, d[3]);
        f[0] = fmaf(b, x.x, f[0]), f[1] = fmaf(b, x.y, f[1]), f[2] = fmaf(b, x.z, f[2]), f[3] = fmaf(b, x.w, f[3]);
      }
  }
};

// cp.async (16 bytes: .cg, L2 only; 4 bytes: .ca) and its groups.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src) {  // (both 4-byte aligned)
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
// An fp32 row into one stage of a staging buffer by 16-byte cp.async chunks: the row's kLanes lanes copy consecutive
// chunks (lane l the chunks l + kLanes vv, whole sectors per instruction), chunk k to stage[slot(k)] (the caller's
// bank swizzle). The staged master rows of the Mamba-2 and GDN views' folding rows (their replay steps).
template <int kVecs, int kLanes, typename Slot>
__device__ __forceinline__ void copy_row_chunks_async(uint4* stage, const float* row, int lane_in_row, const Slot& slot) {
#pragma unroll
  for (int vv = 0; vv < kVecs; ++vv) {
    const int k = vv * kLanes + lane_in_row;
    cp_async16(&stage[slot(k)], row + 4 * k);
  }
}
// This lane's columns of a row that copy_row_chunks_async staged (Layout::col(lane_in_row, v, e): two 16-byte chunks a
// vector of 8), read from stage[slot(k)] into s as fp32. The staged master rows of the two views' folding rows.
template <typename Layout, int kVecs, typename Slot>
__device__ __forceinline__ void read_row_chunks(const uint4* stage, int lane_in_row, const Slot& slot, float* s) {
  static_assert(Layout::kVec == 8, "two 16-byte chunks a vector");
#pragma unroll
  for (int vv = 0; vv < kVecs; ++vv) {
    const int k = Layout::col(lane_in_row, vv / 2, (vv % 2) * 4) / 4;
    const uint4 m = stage[slot(k)];
    float* sv = &s[(vv / 2) * Layout::kVec + (vv % 2) * 4];
    sv[0] = __uint_as_float(m.x), sv[1] = __uint_as_float(m.y), sv[2] = __uint_as_float(m.z), sv[3] = __uint_as_float(m.w);
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); }

// The standard steps' state rows kAhead row iterations ahead (mamba2_step_kernel, gdn_step_kernel): cp.async into
// kAhead shared-memory stages, stage a holding iterations a, a + kAhead, ...; [stage][u][v][thread] 16-byte vectors.
// Each thread copies and later reads only its own vectors, so no barrier.
template <typename Layout, int kThreads, int kUnroll, int kAhead>
struct StepStages {
  uint4* smem;  // the kernel's dynamic shared memory (kAhead * kUnroll * kVecsPerLane * kThreads vectors)
  __device__ __forceinline__ uint4& vec(int it, int u, int v) const {
    return smem[((it % (kAhead > 0 ? kAhead : 1) * kUnroll + u) * Layout::kVecsPerLane + v) * kThreads + threadIdx.x];
  }
  // Iteration it's rows (row_of(its first row, u) for each u, those below row_end) of S into its stage: one commit
  // group, empty past the end.
  template <typename state_t, typename RowOf>
  __device__ __forceinline__ void issue(int it, int row_begin, int row_end, const state_t* S, int64_t row_stride, int lane_in_row,
                                        const RowOf& row_of) const {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(row_begin + it * Layout::kRowsPerIter, u);
      if (r < row_end)
#pragma unroll
        for (int v = 0; v < Layout::kVecsPerLane; ++v)
          cp_async16(&vec(it, u, v), S + int64_t(r) * row_stride + Layout::col(lane_in_row, v, 0));
    }
    cp_async_commit();
  }
};

// ---------------------------------------------------------------------------------------------------
// Standard step: S <- exp(dt A) S + dt x (x) B ; y = S C + D x (* silu z). Reads and writes |S| per step.
// Grid (row chunks of P, H, batch); a block streams rows_per_block rows of one head.
// kAhead > 0: the state rows of the next kAhead row iterations are in flight (cp.async into kAhead shared-memory
// stages of the thread's own vectors: each thread copies and later reads only its own, so no barrier) while an
// iteration computes, and its x and z one iteration ahead; 0: each iteration loads its rows, then computes.
template <typename state_t, typename act_t, int kN, int kThreads, int kUnroll, int kAhead = 0>
__global__ void __launch_bounds__(kThreads) mamba2_step_kernel(const Mamba2StepParams p, const int rows_per_block,
                                                               const bool split_loads) {
  static_assert(kAhead == 0 || std::is_same_v<state_t, float>, "the staged step is for an fp32 state (the dispatch's)");
  using Layout = RowLayout<state_t, kN, kThreads, kUnroll>;
  const int b = blockIdx.z, h = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) {  // (waits first with PDL: no block of a step triggers before the launch ahead is done)
    pdl_wait();
    return;
  }
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_in_row = lane % Layout::kLanesPerRow, row_in_warp = lane / Layout::kLanesPerRow;
  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(p.headdim, row_begin + rows_per_block);
  state_t* S = static_cast<state_t*>(p.state) + slot * p.state_slot_stride + h * p.state_head_stride;
  const int64_t dst = p.dst_slot_ids ? slot_at(p.dst_slot_ids, p.slot_ids_int64, b) : slot;
  RSSM_DEVICE_CHECK(dst >= 0 && dst < p.num_slots, "mamba2_step: dst_slot_ids[%d] = %lld is out of range", b, (long long)dst);
  state_t* S_out = S + (dst - slot) * p.state_slot_stride;  // the new state's row (S itself in place)
  const act_t* x = static_cast<const act_t*>(p.x) + b * p.x_batch_stride + h * p.x_head_stride;
  auto row_of = [&](int base, int u) { return Layout::row(base, u, warp, row_in_warp); };
  float s[kUnroll][Layout::kColsPerLane];
  float xv[kUnroll], zv[kUnroll];
  const act_t* z = static_cast<const act_t*>(p.z) + b * p.z_batch_stride + h * p.z_head_stride;
  auto load_rows = [&](int base, bool state, bool inputs) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(base, u);
      if (r < row_end) {
        if (inputs && p.z && lane_in_row == 0) zv[u] = to_float(z[r]);  // fetched with the row: the output never waits
        if (state) {
#pragma unroll
          for (int v = 0; v < Layout::kVecsPerLane; ++v)
            load16_stream(S + r * p.state_row_stride + Layout::col(lane_in_row, v, 0),
                          *reinterpret_cast<float(*)[Layout::kVec]>(&s[u][v * Layout::kVec]));
        }
        if (inputs) xv[u] = to_float(x[r]);
      }
    }
  };
  extern __shared__ uint4 m2_step_stage[];
  const StepStages<Layout, kThreads, kUnroll, kAhead> stages{m2_step_stage};
  auto issue_stage = [&](int it) { stages.issue(it, row_begin, row_end, S, p.state_row_stride, lane_in_row, row_of); };
  float xn[kUnroll] = {}, zn[kUnroll] = {};  // kAhead: the next iteration's x and z (masked rows: 0)
  auto load_inputs = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(base, u);
      if (r < row_end) {
        if (p.z && lane_in_row == 0) zn[u] = to_float(z[r]);
        xn[u] = to_float(x[r]);
      }
    }
  };
  // The state needs only the slot: in flight while dt, B and C arrive. With PDL (split_loads; common/cuda_utils.cuh)
  // it is requested before the kernel ahead on the stream has finished, the token's inputs only after. Without it
  // each row's input loads go with its state loads, and no wait (a compiler barrier even where it is a no-op) orders
  // the code: at batch 1 the split order measured 5.93 us against 5.45 without it in one run (REPLAYSSM_TUNE
  // step_split_loads=1; bench/results/session19/mamba2_tune_x_call1.json).
  if constexpr (kAhead > 0) {
#pragma unroll
    for (int a = 0; a < kAhead; ++a) issue_stage(a);
    if (split_loads) {
      pdl_wait();
      pdl_trigger();
    }
    load_inputs(row_begin);
  } else if (split_loads) {
    load_rows(row_begin, true, false);
    pdl_wait();
    pdl_trigger();
    load_rows(row_begin, false, true);
  } else {
    load_rows(row_begin, true, true);
  }

  const int g = h / (p.nheads / p.ngroups);
  const float dt = process_dt(to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + h * p.dt_head_stride]),
                              p.dt_bias ? p.dt_bias[h] : 0.f, p.dt_softplus, p.dt_min, p.dt_max);
  const float decay = expf(dt * p.A[h]);
  float Bv[Layout::kColsPerLane], Cv[Layout::kColsPerLane];
  {
    const act_t* Bp = static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride;
    const act_t* Cp = static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride;
#pragma unroll
    for (int v = 0; v < Layout::kVecsPerLane; ++v)
#pragma unroll
      for (int e = 0; e < Layout::kVec; ++e) {
        Bv[v * Layout::kVec + e] = to_float(Bp[Layout::col(lane_in_row, v, e)]) * dt;  // dt folded into B
        Cv[v * Layout::kVec + e] = to_float(Cp[Layout::col(lane_in_row, v, e)]);
      }
  }

  // Every block has rows (the launcher's chunks), so the loop runs at least once: written as do-while, with no
  // guard ahead of the first iteration. With the guard, nvcc placed the C_t loads after it (their only use is in
  // the loop), behind dt's softplus, which waits for dt: a second round trip after the state's (SASS, sm_90a,
  // session 21); now they leave with B_t's.
  int base = row_begin, it = 0;
  do {
    if constexpr (kAhead > 0) {
      cp_async_wait<(kAhead > 0 ? kAhead - 1 : 0)>();  // this iteration's group (kAhead - 1 issued after it)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        xv[u] = xn[u], zv[u] = zn[u];
#pragma unroll
        for (int v = 0; v < Layout::kVecsPerLane; ++v)
          unpack16<state_t>(stages.vec(it, u, v), *reinterpret_cast<float(*)[Layout::kVec]>(&s[u][v * Layout::kVec]));
      }
      // Into the stage just read: this thread's own vectors, whose shared loads precede the copy in program order
      // (PTX: cp.async is ordered after the thread's prior instructions; the asm's memory clobber keeps them first).
      issue_stage(it + kAhead);
      if (base + Layout::kRowsPerIter < row_end) load_inputs(base + Layout::kRowsPerIter);
    } else if (base != row_begin) {
      load_rows(base, true, true);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(base, u);
      float y = 0.f;
      if (r < row_end) {
#pragma unroll
        for (int c = 0; c < Layout::kColsPerLane; ++c) {
          s[u][c] = fmaf(decay, s[u][c], xv[u] * Bv[c]);
          y = fmaf(s[u][c], Cv[c], y);
        }
#pragma unroll
        for (int v = 0; v < Layout::kVecsPerLane; ++v)
          store16_stream(S_out + r * p.state_row_stride + Layout::col(lane_in_row, v, 0),
                         *reinterpret_cast<float(*)[Layout::kVec]>(&s[u][v * Layout::kVec]));
      }
      y = group_sum<Layout::kLanesPerRow>(y);
      if (r < row_end && lane_in_row == 0) {
        if (p.D) y = fmaf(p.D[h], xv[u], y);
        if (p.z) y *= silu(zv[u]);
        static_cast<act_t*>(p.out)[b * p.out_batch_stride + h * p.out_head_stride + r] = from_float<act_t>(y);
      }
    }
    base += Layout::kRowsPerIter, ++it;
  } while (base < row_end);
}

// mamba2_step's rows per block for row iterations of rows_per_iter rows: a head's rows split over blocks only as far
// as needed to keep every SM busy with several blocks (step_bps an SM, default 8), in whole iterations.
inline int mamba2_step_rows_per_block(const Mamba2StepParams& p, int rows_per_iter) {
  const int64_t heads_total = int64_t(p.batch) * p.nheads;
  const int max_chunks = (p.headdim + rows_per_iter - 1) / rows_per_iter;
  const int bps = tune_knob("step_bps") > 0 ? tune_knob("step_bps") : 8;
  int chunks = static_cast<int>((int64_t(num_sms()) * bps + heads_total - 1) / heads_total);
  chunks = max(1, min(chunks, max_chunks));
  const int rows_per_block = (p.headdim + chunks - 1) / chunks;
  return (rows_per_block + rows_per_iter - 1) / rows_per_iter * rows_per_iter;
}

template <typename state_t, typename act_t, int kN, int kUnroll, int kAhead = 0>
void launch_mamba2_step(const Mamba2StepParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128;
  using Layout = RowLayout<state_t, kN, kThreads, kUnroll>;
  const int rows_per_block = mamba2_step_rows_per_block(p, Layout::kRowsPerIter);
  const int chunks = (p.headdim + rows_per_block - 1) / rows_per_block;
  const dim3 grid(chunks, p.nheads, p.batch);
  // (REPLAYSSM_TUNE step_split_loads=1: the PDL order without PDL, the A/B of the order alone)
  const bool pdl = pdl_requested(), split_loads = pdl || tune_knob("step_split_loads") > 0;
  constexpr int kStageBytes = kAhead * kUnroll * Layout::kVecsPerLane * kThreads * 16;  // kAhead's stages
  launch_maybe_pdl(mamba2_step_kernel<state_t, act_t, kN, kThreads, kUnroll, kAhead>, grid, kThreads, kStageBytes, stream, pdl,
                   "mamba2_step kernel launch", p, rows_per_block, split_loads);
}

// The unstaged step with 8 rows in flight a thread instead of 4 (one row iteration of 32 rows a block where 4 gives
// two of 16): worth it where the blocks of unroll 4 would run more than one row iteration, unless the unroll-4 grid
// is resident at once and the unroll-8 one (more registers: fewer blocks an SM) is not. H100, the benchmark's shape
// (fp32 state, bf16, N = 128: 55 / 79 registers, 9 / 6 blocks an SM), us, unroll 4 against 8
// (bench/results/session38/mamba2_step_b1_32_call4_h100.json; batches 3-8 the same in call 3 and session 36):
// batch 2 (one iteration) 8.49 / 8.64; 3 (768 blocks: both resident) 12.13 / 10.99; 4 (1024: 4 resident, 8 not)
// 15.17 / 16.08; 5 (1280: neither) 19.62 / 17.72; 6 (1536) 21.86 / 20.04; 8 (2048) 26.98 / 26.72 (mamba_ssm 8.85 /
// 11.87 / 14.82 / 17.74 / 20.67 / 26.90).
template <typename state_t, typename act_t, int kN>
bool mamba2_step_prefers_unroll8(const Mamba2StepParams& p) {
  constexpr int kThreads = 128, kMaxDevices = 64;
  // Blocks an SM, per device (0: not yet asked). Atomics (relaxed): host threads may launch on one device at once;
  // each writes the same values, and a reader that sees 0 asks again.
  static std::atomic<int> cached4[kMaxDevices], cached8[kMaxDevices];
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device >= kMaxDevices) return false;
  int r4 = cached4[device].load(std::memory_order_relaxed), r8 = cached8[device].load(std::memory_order_relaxed);
  if (r4 == 0 || r8 == 0) {
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r4, mamba2_step_kernel<state_t, act_t, kN, kThreads, 4, 0>, kThreads, 0),
               "mamba2_step occupancy");
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r8, mamba2_step_kernel<state_t, act_t, kN, kThreads, 8, 0>, kThreads, 0),
               "mamba2_step occupancy");
    cached4[device].store(r4, std::memory_order_relaxed), cached8[device].store(r8, std::memory_order_relaxed);
  }
  constexpr int kRows4 = RowLayout<state_t, kN, kThreads, 4>::kRowsPerIter, kRows8 = RowLayout<state_t, kN, kThreads, 8>::kRowsPerIter;
  const int rows4 = mamba2_step_rows_per_block(p, kRows4), rows8 = mamba2_step_rows_per_block(p, kRows8);
  auto blocks = [&](int rows) { return int64_t((p.headdim + rows - 1) / rows) * p.nheads * p.batch; };
  const int64_t wave4 = int64_t(r4) * num_sms(), wave8 = int64_t(r8) * num_sms();
  return rows4 > kRows4 && !(blocks(rows4) <= wave4 && blocks(rows8) > wave8);
}

template <DType kState>
void mamba2_step_cuda_for_state(const Mamba2StepParams& p, cudaStream_t stream) {
  using state_t = typename CudaType<kState>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] {
      using act_t = typename CudaType<kAct>::type;
      // kUnroll rows in flight per thread: 4, or 2 once every SM has 64 heads or more (measured on the benchmark
      // shape in four tune runs, 2026-11-29, one of them bench/results/mamba2_decode_tune_cdcd8b1.json: 2 is
      // 0.7-1% faster at batch 128 and 256, 4 is 5% faster at 32; as the default, in two runs of session 4: 91.0 /
      // 90.0% of copy bandwidth at 128, 92.2 / 91.5% at 256, the second in bench/results/mamba2_decode.json at 6b2b7e4;
      // 90.2 / 91.5% at aef8ba1); others when REPLAYSSM_TUNE asks.
      // Also 2 when the grid has at most a head per SM (batch 1 here): 5.55-5.63 against 5.58-5.68 us in each of
      // eight runs of sessions 15-16, and 5.60 against 5.67 in session 17 (tune entry step_unroll=4;
      // bench/results/session17/mamba2_tune_p_call1.json). At batch 1 the
      // split gives each head's 64 rows (a warp per fp32 row of 128) to 8 blocks of 8 rows with 2 rows in flight per
      // thread (1024 blocks), against 4 blocks of 16 with 4 (512 blocks).
      const int forced = tune_knob("step_unroll");
      const int64_t heads_total = int64_t(p.batch) * p.nheads;
      const bool two = heads_total >= int64_t(64) * num_sms() || heads_total <= int64_t(num_sms());
      const int unroll = forced > 0 ? forced : (two ? 2 : 4);
      // REPLAYSSM_TUNE step_ahead=1..3 (the benchmark's configuration: fp32 state, bf16 activations, dstate 128;
      // unroll 2 or 4): the next 1-3 row iterations' state in flight while one computes (cp.async stages). Default
      // since session 35: 3 (2 with unroll 4) past 8 heads per SM (session 36), none below (H100, one run,
      // bench/results/session35/mamba2_ms_call2_h100.json: 98.2 / 379.2 / 751.8 -> 96.4 / 373.1 / 739.7 us at batch
      // 32 / 128 / 256; batch 1 5.8 -> 6.7-7.0, so not there). step_ahead=0: the unstaged kernel everywhere.
      if constexpr (std::is_same_v<state_t, float> && std::is_same_v<act_t, __nv_bfloat16> && kN == 128) {
        const int knob = tune_knob("step_ahead");
        // (Session 36, H100, same run: unstaged faster at batch 2 (8.45 against 9.69 us) and 8 (26.8 against 28.6), so
        // staged only past 8 heads an SM: batch 16 and up here.)
        const int ahead = knob >= 0 ? knob : (heads_total <= int64_t(8) * num_sms() ? 0 : 3);
        // Unstaged with unroll 4 by the rules above: 8 rows in flight where that pays (mamba2_step_prefers_unroll8; since
        // session 38).
        // (Not where step_ahead or step_unroll is forced: "step_ahead=0,step_unroll=4" is the former default at batch 2-8.)
        if (knob < 0 && ahead == 0 && forced <= 0 && unroll == 4 && mamba2_step_prefers_unroll8<state_t, act_t, kN>(p))
          return launch_mamba2_step<state_t, act_t, kN, 8>(p, stream);
        if (ahead >= 1 && ahead <= 3 && (unroll == 2 || unroll == 4)) {
          if (unroll == 2) {
            if (ahead == 1) return launch_mamba2_step<state_t, act_t, kN, 2, 1>(p, stream);
            if (ahead == 2) return launch_mamba2_step<state_t, act_t, kN, 2, 2>(p, stream);
            return launch_mamba2_step<state_t, act_t, kN, 2, 3>(p, stream);
          }
          if (ahead == 1) return launch_mamba2_step<state_t, act_t, kN, 4, 1>(p, stream);
          return launch_mamba2_step<state_t, act_t, kN, 4, 2>(p, stream);  // (3 stages of 4 rows: 24 KB a block)
        }
      }
      switch (unroll) {
        case 1: return launch_mamba2_step<state_t, act_t, kN, 1>(p, stream);
        case 2: return launch_mamba2_step<state_t, act_t, kN, 2>(p, stream);
        case 8: return launch_mamba2_step<state_t, act_t, kN, 8>(p, stream);
        default: return launch_mamba2_step<state_t, act_t, kN, 4>(p, stream);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// Replay step (MATH.md, "Replay (output-only) form"). With w = cursor tokens in the ring and this token
// at ring position w:
//   y_t = exp(c_t) (S_c C_t) + sum_{j<=w} exp(c_t - c_j) dt_j (B_j . C_t) x_j + D x_t
// Reads S_c (|S|) once; writes it only when the ring is full (fold: S_c <- S_t, cursor <- 0). Otherwise
// the token is appended to the ring (x, B, dt) and the cursor advances.
//
// Grid (row chunks of a group, G, batch): a group's rows are its heads' (head, p) rows, so (B_j . C_t) is
// computed once per block for all the heads it covers, not per head.
// * The checkpoint streams through shared memory with cp.async, kStages deep; each thread copies and later
//   reads only its own vectors (no block barrier). The first stages are issued as soon as the slot is known.
// * Everything else a row needs (its ring values x_j, this token's x and z) is copied into shared memory
//   tiles in the prologue, with 16-byte cp.async where the layout allows. The row loop then issues no global
//   load but the checkpoint's: with per-row global loads in it (v1-v7), the warps stalled on them and DRAM
//   stayed at ~45% (bench/NOTES.md).
// * A row belongs to kLanes lanes (4, or 8 for long rows), each holding up to 8 16-byte vectors of it, so
//   index math and the group sum are paid per 64-128 bytes.
// * At small batch the grid is a fraction of one wave and the step is a chain of dependent memory trips
//   (slot -> cursor -> ring). There the whole ring is fetched with the cursor (prefetch_ring), one trip
//   fewer; entries past the cursor are read and ignored. At larger batch only the cursor's entries are read.
// The cursor is advanced by the slot's last block to count itself in on a per-slot arrival counter, which
// each block does as soon as all its threads have read the cursor: one launch suffices, with no host sync;
// graph-capturable. The kernel and its launcher: replay_step.cuh, included below.
template <typename ckpt_t, int kN>
struct ReplayLanes {  // lanes per row: 4 (fewer when a row has fewer 16-byte vectors), more when a lane would hold
                     // over 32 columns (registers spill)
  static constexpr int kVecsPerRow = kN * int(sizeof(ckpt_t)) / 16;
  static constexpr int kWant = kN / 32 > 4 ? kN / 32 : 4;
  static constexpr int value = kVecsPerRow < kWant ? kVecsPerRow : kWant;
};

// The verify kernel's row layout (verify.cuh): four 16-byte vectors (64 bytes) of a row per lane, at least 4
// lanes per row (fewer only when a row has fewer vectors), streamed through kStreamStages stages: five stages
// in flight, 320 bytes per thread, ~120 KiB per SM with three blocks of 128 threads. The replay step streams
// the bf16 view through kStreamStages stages too. (Measured in the replay step's former general kernel, fp32
// N = 128, against 128 bytes per lane in three stages, bench/results/mamba2_decode_tune_cdcd8b1.json: 64.8 vs
// 65.2 us at batch 32, 196.0 vs 206.3 at 128, 396.8 vs 419.8 at 256; 11.6 vs 7.2 at batch 1, worse.)
template <typename src_t, int kN>
struct StreamLanes {
  static constexpr int kVecsPerRow = kN * int(sizeof(src_t)) / 16;
  static constexpr int kWant = kVecsPerRow / 4 > 4 ? kVecsPerRow / 4 : 4;
  static constexpr int value = kVecsPerRow < kWant ? kVecsPerRow : kWant;
};
constexpr int kStreamStages = 6;

// Shared memory of one block (byte offsets, each section 16-byte aligned).
struct ReplaySmem {
  int tile_stride;  // elements per tile row: the block's rows plus 8 (keeps ring rows on different banks)
  int staging, xs, xt, zs, Bring, Bt, C, dts, dtt, wdt, wb, decay, Ds, As, bc, total;
  __host__ __device__ ReplaySmem(int staging_bytes, int act_bytes, int rows, int dstate, int ring_len, int max_heads) {
    auto up = [](int v) { return (v + 15) / 16 * 16; };
    tile_stride = (rows + 7) / 8 * 8 + 8;
    int o = 0;
    staging = o, o += up(staging_bytes);                        // [stage][vec][thread] checkpoint vectors
    xs = o, o += up((ring_len - 1) * tile_stride * act_bytes);  // [j][row] ring x_j (raw)
    xt = o, o += up(tile_stride * act_bytes);                   // [row] this token's x
    zs = o, o += up(tile_stride * act_bytes);                   // [row] this token's z
    Bring = o, o += up((ring_len - 1) * dstate * act_bytes);    // [j][n] ring B_j (raw)
    Bt = o, o += up(dstate * 4);                                // [n] this token's B
    C = o, o += up(dstate * 4);                                 // [n] C_t
    dts = o, o += up(max_heads * ring_len * 4);                 // [head][j] ring dt_j
    dtt = o, o += up(max_heads * 4);                            // [head] this token's dt
    wdt = o, o += up(max_heads * ring_len * 4);                 // [head][j] exp(c_t - c_j) dt_j, j <= w
    wb = o, o += up(max_heads * ring_len * 4);                  // [head][j] wdt (B_j . C_t): the outputs' ring weights
    decay = o, o += up(max_heads * 4);                          // [head] exp(c_t)
    Ds = o, o += up(max_heads * 4);                             // [head] D
    As = o, o += up(max_heads * 4);                             // [head] A
    bc = o, o += up(ring_len * 4);                              // [j] B_j . C_t, j <= w
    total = o;
  }
};

// A replay step's cursor w of this slot, 0 <= w < ring_len, checked before the kernel depends on it (a message
// naming the kernel, the slot and w, and a trap otherwise).
__device__ __forceinline__ void check_replay_cursor(int w, int ring_len, int64_t slot, const char* kernel) {
  RSSM_DEVICE_CHECK(w >= 0 && w < ring_len, "%s: cursor[%lld] = %d is outside [0, ring_len)", kernel, (long long)slot, w);
}
// The replay steps' ring copies after the PDL wait (none with ring_ahead: they went before it), load_ring(nj) copying
// positions 0..nj-1: the whole ring when prefetched, before the cursor is known (one dependent trip fewer), else the
// cursor's w entries once w is checked. (The ring_ahead site stays at each caller: a helper holding both sites
// inlined a fourth copy of the loads, ~1000 more SASS instructions per replay kernel; bench/NOTES.md, session 23.)
template <typename LoadRing>
__device__ __forceinline__ void load_ring_after_wait(bool ring_ahead, bool prefetch_ring, int w, int ring_len, int64_t slot,
                                                     const char* kernel, const LoadRing& load_ring) {
  if (ring_ahead) return;
  if (prefetch_ring) {
    load_ring(ring_len - 1);
  } else {
    check_replay_cursor(w, ring_len, slot, kernel);
    load_ring(w);
  }
}

// A streaming thread's row (replay step, verify): the row within the block's group of heads, the head within
// the block, and p; advanced kStep rows at a time without divisions.
struct RowPos {
  int r, hl, i;
  template <int kStep>
  __device__ __forceinline__ void advance(int headdim) {
    r += kStep;
    i += kStep;
    while (i >= headdim) {
      i -= headdim;
      ++hl;
    }
  }
};

// Starts the cp.async copies of this thread's vectors of the streamed row at `pos` into stage `stage` (an
// iteration's index modulo kStages) of the staging ring ([stage][vec][thread] 16-byte vectors; the caller commits the group). kLean: from lane_base (this
// lane's first column in the block's first head) at 32-bit offsets (head_stride, row_stride: elements; the
// launcher checks they fit); else from src_row(pos), 64-bit addresses.
template <typename Layout, int kThreads, bool kLean, typename src_t, typename SrcRow>
__device__ __forceinline__ void copy_row_async(uint4* staging, int stage, const RowPos& pos, const src_t* lane_base, int head_stride,
                                               int row_stride, int lane_in_row, const SrcRow& src_row) {
  constexpr int kVecs = Layout::kVecsPerLane;
  if constexpr (kLean) {
    const src_t* src = lane_base + (pos.hl * head_stride + pos.i * row_stride);
#pragma unroll
    for (int v = 0; v < kVecs; ++v)
      cp_async16(&staging[(stage * kVecs + v) * kThreads + threadIdx.x], src + v * Layout::kLanesPerRow * Layout::kVec);
  } else {
    const src_t* src = src_row(pos);
#pragma unroll
    for (int v = 0; v < kVecs; ++v)
      cp_async16(&staging[(stage * kVecs + v) * kThreads + threadIdx.x], src + Layout::col(lane_in_row, v, 0));
  }
}

// dst[j * dst_stride + k] = src[j * src_pos_stride + row(r0 + k)] for j < nj, k < n, where row(r) is element
// (r / headdim, r % headdim) of a (heads, headdim) plane with the given head stride. vec: the rows are
// contiguous (head_stride == headdim) and everything is 16-byte aligned: cp.async by 16 bytes.
// `at` places element i of a tile row at at(i) (RowLayout::tile_pos; it keeps 16-byte groups whole).
struct IdentityPos {
  __device__ int operator()(int i) const { return i; }
};
template <typename T, int kThreads, typename Pos = IdentityPos>
__device__ __forceinline__ void copy_head_rows(T* dst, int dst_stride, const T* src, int64_t src_pos_stride,
                                               int64_t head_stride, int headdim, int r0, int n, int nj, bool vec, Pos at = {}) {
  if (vec) {
    constexpr int kV = 16 / sizeof(T);
    const int nv = n / kV;
    for (int idx = threadIdx.x; idx < nj * nv; idx += kThreads) {
      const int j = idx / nv, k = (idx % nv) * kV;
      cp_async16(dst + j * dst_stride + at(k), src + j * src_pos_stride + r0 + k);
    }
  } else {
#pragma unroll 4
    for (int idx = threadIdx.x; idx < nj * n; idx += kThreads) {
      const int j = idx / n, r = r0 + idx % n;
      dst[j * dst_stride + at(r - r0)] = src[j * src_pos_stride + (r / headdim) * head_stride + r % headdim];
    }
  }
}

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

#include "replay_step.cuh"  // the replay-step kernel
#include "replay_small.cuh"  // and its small form for grids of at most two blocks per SM

// The replay step with the bf16 output view of an fp32 checkpoint: defined in replay_view_f32.cu (its own translation
// unit, so that the build's longest one stays short).
void mamba2_replay_step_cuda_view(const Mamba2ReplayStepParams& p, cudaStream_t stream);

template <DType kCkpt>
void mamba2_replay_step_cuda_for_ckpt(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  if (p.cache.view != nullptr) {
    if constexpr (kCkpt == DType::kFloat32) return mamba2_replay_step_cuda_view(p, stream);
    throw std::invalid_argument("replayssm: on CUDA the output view must be of an fp32 checkpoint");
  }
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] {
      using act_t = typename CudaType<kAct>::type;
      // One kernel for every cache (replay_step.cuh). Plain caches, and 16-bit checkpoints with stochastic
      // rounding at folds: three stages.
      if constexpr (kCkpt == DType::kFloat32)  // (batch 1: replay_small.cuh)
        if (launch_mamba2_replay_step_small<act_t, kN>(p, stream)) return;
      return launch_mamba2_replay_step_v10<ckpt_t, act_t, kN>(p, stream);
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// State at the cursor: exp(c_w) S_c + sum_{j<w} exp(c_w - c_j) dt_j x_j (x) B_j, written to out (fp32).
// Not a hot path (reading a slot back, tests, handing a sequence over): one block per (head, row).
template <typename ckpt_t, typename act_t>
__global__ void mamba2_replay_state_kernel(const Mamba2ReplayStateParams p) {
  const Mamba2ReplayCacheParams& c = p.cache;
  const int b = blockIdx.y, h = blockIdx.x;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_replay_state: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  extern __shared__ float wdt[];  // [j] = exp(c_w - c_j) dt_j
  __shared__ float decay;
  const int cursor = c.cursor[slot];
  const int w = p.positions ? p.positions[b] : cursor;
  RSSM_DEVICE_CHECK(w >= 0 && w <= cursor && cursor <= c.ring_len,
                    "mamba2_replay_state: position %d of slot %lld is outside [0, cursor = %d] (ring_len %d)", w, (long long)slot,
                    cursor, c.ring_len);
  const float* ring_dt = c.ring_dt + slot * c.ring_dt_slot_stride + h;
  if (threadIdx.x == 0) {
    auto dt_at = [&](int j) { return ring_dt[j * c.ring_dt_pos_stride]; };
    decay = replay_decays(dt_at, w - 1, p.A[h], wdt);
    for (int j = 0; j < w; ++j) wdt[j] *= dt_at(j);
  }
  __syncthreads();
  const int g = h / (p.nheads / p.ngroups);
  const ckpt_t* ckpt = static_cast<const ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + h * c.ckpt_head_stride;
  const act_t* ring_x = static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + h * c.ring_x_head_stride;
  const act_t* ring_B = static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride;
  float* out = p.out + (int64_t(b) * p.nheads + h) * p.headdim * p.dstate;
  for (int idx = threadIdx.x; idx < p.headdim * p.dstate; idx += blockDim.x) {
    const int i = idx / p.dstate, n = idx % p.dstate;
    float s = decay * to_float(ckpt[i * c.ckpt_row_stride + n]);
    for (int j = 0; j < w; ++j)
      s = fmaf(wdt[j] * to_float(ring_x[j * c.ring_x_pos_stride + i]), to_float(ring_B[j * c.ring_B_pos_stride + n]), s);
    out[idx] = s;
  }
}

template <DType kCkpt>
void mamba2_replay_state_cuda_for_ckpt(const Mamba2ReplayStateParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    const dim3 grid(p.nheads, p.batch);
    mamba2_replay_state_kernel<typename CudaType<kCkpt>::type, typename CudaType<kAct>::type>
        <<<grid, 256, (p.cache.ring_len + 4) / 4 * 4 * sizeof(float) + 16, stream>>>(p);  // padded: the compiler's
    // vector reads of wdt may run past the last weight (compute-sanitizer, cursor == ring_len)
    check_cuda(cudaGetLastError(), "mamba2_replay_state kernel launch");
  });
}

}  // namespace replayssm
