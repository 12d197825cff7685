// CUDA kernels of the Mamba-2 decode ops (torch-free: params in, stream in). One template per kernel,
// instantiated per storage dtype in the small step_*.cu / replay_*.cu files so that builds parallelise.
//
// Both step kernels stream state rows (one row = dstate values of one (head, p)) with the same layout:
// each lane owns kColsPerLane columns of a row as 16-byte vectors, kLanesPerRow lanes share a row, and
// each thread keeps kUnroll rows' loads in flight before it uses any of them, so that a full SM has
// ~64-128 KiB of reads outstanding: the state is read at the HBM rate, not at the latency rate.
#pragma once

#include <algorithm>
#include <type_traits>

#include "../common/cuda_utils.cuh"
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
  // s[c] += a * x[column of c] over this lane's columns (x: a full row, any element type).
  template <typename T>
  __device__ static void axpy(float a, const T* x, int lane_in_row, float (&s)[kColsPerLane]) {
#pragma unroll
    for (int v = 0; v < kVecsPerLane; ++v)
#pragma unroll
      for (int e = 0; e < kVec; ++e) s[v * kVec + e] = fmaf(a, to_float(x[col(lane_in_row, v, e)]), s[v * kVec + e]);
  }
};

// ---------------------------------------------------------------------------------------------------
// Standard step: S <- exp(dt A) S + dt x (x) B ; y = S C + D x (* silu z). Reads and writes |S| per step.
// Grid (row chunks of P, H, batch); a block streams rows_per_block rows of one head.
template <typename state_t, typename act_t, int kN, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) mamba2_step_kernel(const Mamba2StepParams p, const int rows_per_block) {
  using Layout = RowLayout<state_t, kN, kThreads, kUnroll>;
  const int b = blockIdx.z, h = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
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
  auto row_of = [&](int base, int u) { return base + (u * Layout::kWarps + warp) * Layout::kRowsPerWarp + row_in_warp; };
  float s[kUnroll][Layout::kColsPerLane];
  float xv[kUnroll], zv[kUnroll];
  const act_t* z = static_cast<const act_t*>(p.z) + b * p.z_batch_stride + h * p.z_head_stride;
  auto load_rows = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row_of(base, u);
      if (r < row_end) {
        if (p.z && lane_in_row == 0) zv[u] = to_float(z[r]);  // fetched with the row: the output never waits
#pragma unroll
        for (int v = 0; v < Layout::kVecsPerLane; ++v)
          load16_stream(S + r * p.state_row_stride + Layout::col(lane_in_row, v, 0),
                        *reinterpret_cast<float(*)[Layout::kVec]>(&s[u][v * Layout::kVec]));
        xv[u] = to_float(x[r]);
      }
    }
  };
  load_rows(row_begin);  // the state needs only the slot: in flight while dt, B and C arrive

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

  for (int base = row_begin; base < row_end; base += Layout::kRowsPerIter) {
    if (base != row_begin) load_rows(base);
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
  }
}

template <typename state_t, typename act_t, int kN, int kUnroll>
void launch_mamba2_step(const Mamba2StepParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128;
  using Layout = RowLayout<state_t, kN, kThreads, kUnroll>;
  // Split a head's rows over blocks only as far as needed to keep every SM busy with several blocks.
  const int64_t heads_total = int64_t(p.batch) * p.nheads;
  const int max_chunks = (p.headdim + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter;
  const int bps = tune_knob("step_bps") > 0 ? tune_knob("step_bps") : 8;
  int chunks = static_cast<int>((int64_t(num_sms()) * bps + heads_total - 1) / heads_total);
  chunks = max(1, min(chunks, max_chunks));
  int rows_per_block = (p.headdim + chunks - 1) / chunks;
  rows_per_block = (rows_per_block + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter * Layout::kRowsPerIter;
  chunks = (p.headdim + rows_per_block - 1) / rows_per_block;
  const dim3 grid(chunks, p.nheads, p.batch);
  mamba2_step_kernel<state_t, act_t, kN, kThreads, kUnroll><<<grid, kThreads, 0, stream>>>(p, rows_per_block);
  check_cuda(cudaGetLastError(), "mamba2_step kernel launch");
}

template <DType kState>
void mamba2_step_cuda_for_state(const Mamba2StepParams& p, cudaStream_t stream) {
  using state_t = typename CudaType<kState>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] {
      using act_t = typename CudaType<kAct>::type;
      // kUnroll rows in flight per thread: 4, or 2 once every SM has 64 heads or more (measured on the benchmark
      // shape in four tune runs, 2026-11-29, one of them bench/results/mamba2_decode_tune_cdcd8b1.json: 2 is
      // 0.7-1% faster at batch 128 and 256, 4 is 5% faster at 32; not yet run as the default); others when REPLAYSSM_TUNE asks.
      const int forced = tune_knob("step_unroll");
      const bool many_heads = int64_t(p.batch) * p.nheads >= int64_t(64) * num_sms();
      switch (forced > 0 ? forced : (many_heads ? 2 : 4)) {
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
// graph-capturable.
template <typename ckpt_t, int kN>
struct ReplayLanes {  // lanes per row: 4 (fewer when a row has fewer 16-byte vectors), more when a lane would hold
                     // over 32 columns (registers spill)
  static constexpr int kVecsPerRow = kN * int(sizeof(ckpt_t)) / 16;
  static constexpr int kWant = kN / 32 > 4 ? kN / 32 : 4;
  static constexpr int value = kVecsPerRow < kWant ? kVecsPerRow : kWant;
};

// The replay and verify kernels' row layout: four 16-byte vectors (64 bytes) of a row per lane, at least 4
// lanes per row (fewer only when a row has fewer vectors), streamed through kStreamStages stages: five stages
// in flight, 320 bytes per thread, ~120 KiB per SM with three blocks of 128 threads. (In the general kernel,
// fp32 N = 128, against 128 bytes per lane in three stages, bench/results/mamba2_decode_tune_cdcd8b1.json:
// 64.8 vs 65.2 us at batch 32, 196.0 vs 206.3 at 128, 396.8 vs 419.8 at 256; 11.6 vs 7.2 at batch 1, worse.)
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
  int staging, xs, xt, zs, Bring, Bt, C, dts, dtt, wdt, decay, Ds, bc, total;
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
    decay = o, o += up(max_heads * 4);                          // [head] exp(c_t)
    Ds = o, o += up(max_heads * 4);                             // [head] D
    bc = o, o += up(ring_len * 4);                              // [j] B_j . C_t, j <= w
    total = o;
  }
};

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); }

// dst[j * dst_stride + k] = src[j * src_pos_stride + row(r0 + k)] for j < nj, k < n, where row(r) is element
// (r / headdim, r % headdim) of a (heads, headdim) plane with the given head stride. vec: the rows are
// contiguous (head_stride == headdim) and everything is 16-byte aligned: cp.async by 16 bytes.
template <typename T, int kThreads>
__device__ __forceinline__ void copy_head_rows(T* dst, int dst_stride, const T* src, int64_t src_pos_stride,
                                               int64_t head_stride, int headdim, int r0, int n, int nj, bool vec) {
  if (vec) {
    constexpr int kV = 16 / sizeof(T);
    const int nv = n / kV;
    for (int idx = threadIdx.x; idx < nj * nv; idx += kThreads) {
      const int j = idx / nv, k = (idx % nv) * kV;
      cp_async16(dst + j * dst_stride + k, src + j * src_pos_stride + r0 + k);
    }
  } else {
#pragma unroll 4
    for (int idx = threadIdx.x; idx < nj * n; idx += kThreads) {
      const int j = idx / n, r = r0 + idx % n;
      dst[j * dst_stride + r - r0] = src[j * src_pos_stride + (r / headdim) * head_stride + r % headdim];
    }
  }
}

// src_t is what the row loop streams: the checkpoint itself (src_t == ckpt_t), or its bf16 output view (the
// numerical split, MATH.md; an fp32 checkpoint), which then serves every output while the master is read and
// written only by folds. A fold rounds a narrow checkpoint to nearest, or stochastically with sr_seed.
template <typename ckpt_t, typename src_t, typename act_t, int kN, int kThreads, int kStages, int kLanesPerRow, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    mamba2_replay_step_kernel(const Mamba2ReplayStepParams p, const int rows_per_block, const int max_heads,
                              const bool io_vec, const bool prefetch_ring, const int prologue_flags) {
  constexpr bool kView = !std::is_same_v<src_t, ckpt_t>;
  static_assert(!kView || std::is_same_v<ckpt_t, float>, "the output view is of an fp32 checkpoint");
  using Layout = RowLayout<src_t, kN, kThreads, 1, kLanesPerRow>;
  constexpr int kLanes = Layout::kLanesPerRow;
  constexpr int kVecs = Layout::kVecsPerLane;
  constexpr int kCols = Layout::kColsPerLane;
  const Mamba2ReplayCacheParams& c = p.cache;
  const int b = blockIdx.z, g = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_replay_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int w = c.cursor[slot];  // in flight while the first loads are issued

  const int heads_per_group = p.nheads / p.ngroups;
  const int L = c.ring_len;
  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(heads_per_group * p.headdim, row_begin + rows_per_block);
  const int nrows = row_end - row_begin;
  const int head_begin = row_begin / p.headdim;  // local head index within the group
  const int nheads_block = (row_end - 1) / p.headdim - head_begin + 1;
  const int h0 = g * heads_per_group + head_begin;  // first global head of the block
  const int n_iter = (nrows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  const int row0 = row_begin + warp * Layout::kRowsPerWarp + row_in_warp;  // this thread's row in iteration 0
  const ckpt_t* ckpt_group =
      static_cast<const ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(g) * heads_per_group * c.ckpt_head_stride;
  const int64_t src_head_stride = kView ? c.view_head_stride : c.ckpt_head_stride;
  const int64_t src_row_stride = kView ? c.view_row_stride : c.ckpt_row_stride;
  const src_t* src_group = kView ? static_cast<const src_t*>(c.view) + slot * c.view_slot_stride +
                                       int64_t(g) * heads_per_group * c.view_head_stride
                                 : reinterpret_cast<const src_t*>(ckpt_group);
  // This thread's row in the k-th iteration, as (row, head in block, p), advanced without divisions.
  struct RowPos {
    int r, hl, i;
  };
  const RowPos pos0{row0, row0 / p.headdim - head_begin, row0 % p.headdim};
  auto advance = [&](RowPos& q) {
    q.r += Layout::kRowsPerIter;
    q.i += Layout::kRowsPerIter;
    while (q.i >= p.headdim) {
      q.i -= p.headdim;
      ++q.hl;
    }
  };
  auto ckpt_row = [&](const RowPos& q) { return ckpt_group + (head_begin + q.hl) * c.ckpt_head_stride + q.i * c.ckpt_row_stride; };
  auto src_row = [&](const RowPos& q) { return src_group + (head_begin + q.hl) * src_head_stride + q.i * src_row_stride; };

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const ReplaySmem off(kStages * kVecs * kThreads * 16, sizeof(act_t), rows_per_block, kN, L, max_heads);
  uint4* staging = reinterpret_cast<uint4*>(smem_raw + off.staging);
  act_t* xs = reinterpret_cast<act_t*>(smem_raw + off.xs);
  act_t* xt_s = reinterpret_cast<act_t*>(smem_raw + off.xt);
  act_t* zs = reinterpret_cast<act_t*>(smem_raw + off.zs);
  act_t* Bring = reinterpret_cast<act_t*>(smem_raw + off.Bring);
  float* Bt_s = reinterpret_cast<float*>(smem_raw + off.Bt);
  float* C_s = reinterpret_cast<float*>(smem_raw + off.C);
  float* dts = reinterpret_cast<float*>(smem_raw + off.dts);
  float* dtt = reinterpret_cast<float*>(smem_raw + off.dtt);
  float* wdt = reinterpret_cast<float*>(smem_raw + off.wdt);
  float* decay = reinterpret_cast<float*>(smem_raw + off.decay);
  float* Ds = reinterpret_cast<float*>(smem_raw + off.Ds);
  float* bc = reinterpret_cast<float*>(smem_raw + off.bc);
  const int ts = off.tile_stride;

  RowPos copy_pos = pos0;
  auto issue = [&](int it) {  // start copying this thread's vectors of iteration `it` (an empty group past the end)
    if (it < n_iter && copy_pos.r < row_end) {
      const src_t* src = src_row(copy_pos);
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
        cp_async16(&staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x], src + Layout::col(lane_in_row, v, 0));
    }
    cp_async_commit();
    advance(copy_pos);
  };
#pragma unroll
  for (int it = 0; it < kStages - 1; ++it) issue(it);

  // ---- Prologue: this token's inputs and the ring into shared memory (one cp.async group).
  const act_t* x_t = static_cast<const act_t*>(p.x) + b * p.x_batch_stride + int64_t(g) * heads_per_group * p.x_head_stride;
  copy_head_rows<act_t, kThreads>(xt_s, 0, x_t, 0, p.x_head_stride, p.headdim, row_begin, nrows, 1, io_vec);
  if (p.z) {
    const act_t* z_t = static_cast<const act_t*>(p.z) + b * p.z_batch_stride + int64_t(g) * heads_per_group * p.z_head_stride;
    copy_head_rows<act_t, kThreads>(zs, 0, z_t, 0, p.z_head_stride, p.headdim, row_begin, nrows, 1, io_vec);
  }
  const act_t* ring_x =
      static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + int64_t(g) * heads_per_group * c.ring_x_head_stride;
  const act_t* ring_B = static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride;
  const float* ring_dt = c.ring_dt + slot * c.ring_dt_slot_stride + h0;
  auto load_ring = [&](int nj) {  // ring positions 0..nj-1
    copy_head_rows<act_t, kThreads>(xs, ts, ring_x, c.ring_x_pos_stride, c.ring_x_head_stride, p.headdim, row_begin, nrows, nj,
                                    io_vec);
    copy_head_rows<act_t, kThreads>(Bring, kN, ring_B, c.ring_B_pos_stride, 0, kN, 0, kN, nj, io_vec);
    for (int idx = threadIdx.x; idx < nheads_block * nj; idx += kThreads) {
      const int hl = idx / nj, j = idx % nj;
      dts[hl * L + j] = ring_dt[j * c.ring_dt_pos_stride + hl];
    }
  };
  if (prefetch_ring) load_ring(L - 1);  // before the cursor is known: one dependent trip fewer
  // This token's B, C, dt and D. Default: every load issued before any is used (one memory trip, not one per
  // kind). prologue_flags & 2 (REPLAYSSM_TUNE replay_prologue): the earlier form, each stored as it arrives.
  constexpr int kNPer = (kN + kThreads - 1) / kThreads;
  act_t Bv[kNPer], Cv_raw[kNPer];
  const act_t* Bt = static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride;
  const act_t* Ct = static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride;
  const bool serial_loads = prologue_flags & 2;
  if (serial_loads) {
    for (int n = threadIdx.x; n < kN; n += kThreads) Bt_s[n] = to_float(Bt[n]), C_s[n] = to_float(Ct[n]);
    for (int hl = threadIdx.x; hl < nheads_block; hl += kThreads) {
      const int h = h0 + hl;
      dtt[hl] = process_dt(to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + h * p.dt_head_stride]),
                           p.dt_bias ? p.dt_bias[h] : 0.f, p.dt_softplus, p.dt_min, p.dt_max);
      Ds[hl] = p.D ? p.D[h] : 0.f;
    }
  } else {
#pragma unroll
    for (int u = 0; u < kNPer; ++u) {
      const int n = threadIdx.x + u * kThreads;
      if (n < kN) Bv[u] = Bt[n], Cv_raw[u] = Ct[n];
    }
  }
  float dt_raw = 0.f, dt_b = 0.f, D_h = 0.f;
  if (!serial_loads && threadIdx.x < nheads_block) {  // nheads_block <= kThreads (launcher)
    const int h = h0 + threadIdx.x;
    dt_raw = to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + h * p.dt_head_stride]);
    dt_b = p.dt_bias ? p.dt_bias[h] : 0.f;
    D_h = p.D ? p.D[h] : 0.f;
  }
  RSSM_DEVICE_CHECK(w >= 0 && w < L, "mamba2_replay_step: cursor[%lld] = %d is outside [0, ring_len)", (long long)slot, w);
  if (!prefetch_ring) load_ring(w);
  if (!serial_loads) {
#pragma unroll
    for (int u = 0; u < kNPer; ++u) {
      const int n = threadIdx.x + u * kThreads;
      if (n < kN) Bt_s[n] = to_float(Bv[u]), C_s[n] = to_float(Cv_raw[u]);
    }
    if (threadIdx.x < nheads_block) {
      dtt[threadIdx.x] = process_dt(dt_raw, dt_b, p.dt_softplus, p.dt_min, p.dt_max);
      Ds[threadIdx.x] = D_h;
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  // The fold count (stochastic rounding's Philox counter) through shared memory, so that it has been read
  // before this block counts in: the slot's last block increments it.
  __shared__ uint32_t fold_count_s;
  if (threadIdx.x == 0) fold_count_s = c.fold_count ? uint32_t(c.fold_count[slot]) : 0u;
  __syncthreads();  // tiles written; every thread of the block has read the cursor (and thread 0 the fold count)
  const uint32_t fold_no = fold_count_s;

  // Count this block in: all its threads have read the cursor, so the slot's last block to arrive may advance
  // it now (the slot's other blocks read it before they arrived). No fence, and off the tail: the answer is
  // used at the end. (Counting in at the end behind a fence cost ~1 us per step at batch 1.)
  const int blocks_per_row = gridDim.x * gridDim.y;
  int arrived = 0;
  if (threadIdx.x == 0) arrived = atomicAdd(&c.arrivals[slot], 1);

  // ---- Block scalars: B_j . C_t (a warp per j) and the decays (a thread per (head, j), each forming the sums
  // replay_decays forms, in its order: the same values as the CPU's, without a serial chain of w exponentials).
  const bool fold = is_fold_step(w, L);
  for (int j = warp; j <= w; j += Layout::kWarps) {
    float acc = 0.f;
    for (int n = lane; n < kN; n += 32) acc = fmaf(j < w ? to_float(Bring[j * kN + n]) : Bt_s[n], C_s[n], acc);
    acc = group_sum<32>(acc);
    if (lane == 0) bc[j] = acc;
  }
  if (prologue_flags & 1) {  // the earlier form: a thread per head, replay_decays' serial loop (same values)
    if (threadIdx.x < nheads_block) {
      const int hl = threadIdx.x;
      auto dt_at = [&](int j) { return j < w ? dts[hl * L + j] : dtt[hl]; };
      float* w_row = wdt + hl * L;
      decay[hl] = replay_decays(dt_at, w, p.A[h0 + hl], w_row);
      for (int j = 0; j <= w; ++j) w_row[j] *= dt_at(j);
    }
  } else {
    for (int idx = threadIdx.x; idx < nheads_block * (w + 1); idx += kThreads) {
      const int hl = idx / (w + 1), j = idx % (w + 1);
      auto dt_at = [&](int k) { return k < w ? dts[hl * L + k] : dtt[hl]; };
      const float A = p.A[h0 + hl];
      float suffix = 0.f;
      for (int k = w; k > j; --k) suffix += dt_at(k);
      wdt[hl * L + j] = expf(A * suffix) * dt_at(j);
      if (j == 0) decay[hl] = expf(A * (suffix + dt_at(0)));
    }
  }
  float Cv[kCols];  // this lane's columns of C_t
#pragma unroll
  for (int v = 0; v < kVecs; ++v)
#pragma unroll
    for (int e = 0; e < Layout::kVec; ++e) Cv[v * Layout::kVec + e] = C_s[Layout::col(lane_in_row, v, e)];
  if (!fold) {  // append this token's x to the ring (its B and dt after the loop)
    act_t* dst = static_cast<act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + w * c.ring_x_pos_stride +
                 int64_t(g) * heads_per_group * c.ring_x_head_stride;
    if (io_vec) {
      constexpr int kV = 16 / sizeof(act_t);
      for (int k = threadIdx.x * kV; k < nrows; k += kThreads * kV)
        *reinterpret_cast<uint4*>(dst + row_begin + k) = *reinterpret_cast<const uint4*>(xt_s + k);
    } else {
      for (int k = threadIdx.x; k < nrows; k += kThreads) {
        const int r = row_begin + k;
        dst[(r / p.headdim) * c.ring_x_head_stride + r % p.headdim] = xt_s[k];
      }
    }
  }
  __syncthreads();

  // ---- Stream the block's rows.
  RowPos pos = pos0;
  for (int it = 0; it < n_iter; ++it) {
    issue(it + kStages - 1);
    cp_async_wait<kStages - 1>();  // this thread's vectors of iteration `it` have landed
    const RowPos q = pos;
    advance(pos);
    const bool valid = q.r < row_end;
    const int hl = valid ? q.hl : 0, rl = valid ? q.r - row_begin : 0;
    float s[kCols];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const uint4 raw = staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x];
      const src_t* elems = reinterpret_cast<const src_t*>(&raw);
#pragma unroll
      for (int e = 0; e < Layout::kVec; ++e) s[v * Layout::kVec + e] = to_float(elems[e]);
    }
    float sc = 0.f;
#pragma unroll
    for (int col = 0; col < kCols; ++col) sc = fmaf(s[col], Cv[col], sc);
    const float* wdt_h = wdt + hl * L;
    float y = decay[hl] * sc;
    for (int j = lane_in_row; j < w; j += kLanes) y = fmaf(wdt_h[j] * bc[j], to_float(xs[j * ts + rl]), y);
    y = group_sum<kLanes>(y);
    const float xt = to_float(xt_s[rl]);
    if (valid && lane_in_row == 0) {
      y = fmaf(wdt_h[w] * bc[w] + Ds[hl], xt, y);
      if (p.z) y *= silu(to_float(zs[rl]));
      static_cast<act_t*>(p.out)[b * p.out_batch_stride + (h0 + hl) * p.out_head_stride + q.i] = from_float<act_t>(y);
    }
    if (fold) {
      // New checkpoint row: exp(c_t) S_c + sum_{j<=w} exp(c_t - c_j) dt_j x_j[p] B_j, from the master.
      if constexpr (kView) {  // this lane's columns of the fp32 master row (the view served the output)
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < Layout::kVec; e += 4) {
            const float4 m = valid ? __ldcs(reinterpret_cast<const float4*>(ckpt_row(q) + Layout::col(lane_in_row, v, e)))
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
            s[v * Layout::kVec + e] = m.x, s[v * Layout::kVec + e + 1] = m.y, s[v * Layout::kVec + e + 2] = m.z,
                                 s[v * Layout::kVec + e + 3] = m.w;
          }
      }
      const float dcy = decay[hl];
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] *= dcy;
      for (int j = 0; j < w; ++j) {
        Layout::axpy(wdt_h[j] * to_float(xs[j * ts + rl]), Bring + j * kN, lane_in_row, s);
      }
      Layout::axpy(wdt_h[w] * xt, Bt_s, lane_in_row, s);
      if (valid) {
        ckpt_t* row = const_cast<ckpt_t*>(ckpt_row(q));
        if constexpr (kView) {  // the fp32 master and its bf16 view (rounded to nearest) of the same values
          src_t* vrow = const_cast<src_t*>(src_row(q));
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
#pragma unroll
            for (int e = 0; e < Layout::kVec; e += 4)
              __stcs(reinterpret_cast<float4*>(row + Layout::col(lane_in_row, v, e)),
                     make_float4(s[v * Layout::kVec + e], s[v * Layout::kVec + e + 1], s[v * Layout::kVec + e + 2],
                                 s[v * Layout::kVec + e + 3]));
            store16_stream(vrow + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[Layout::kVec]>(&s[v * Layout::kVec]));
          }
        } else {
          // Stochastic rounding (Philox keyed by the slot's seed, its fold count and the element): narrow
          // checkpoints only, so an fp32 kernel carries none of its code.
          if (!std::is_same_v<ckpt_t, float> && c.sr_seed) {
            const uint64_t seed = uint64_t(c.sr_seed[slot]);
            const int64_t row_index = (int64_t(h0 + hl) * p.headdim + q.i) * kN;
#pragma unroll
            for (int v = 0; v < kVecs; ++v)
#pragma unroll
              for (int e = 0; e < Layout::kVec; ++e) {
                const int col = Layout::col(lane_in_row, v, e);
                s[v * Layout::kVec + e] = stochastic_round_to(c.ckpt_dtype, s[v * Layout::kVec + e],
                                                              fold_random(seed, fold_no, uint64_t(row_index + col)));
              }
          }
#pragma unroll
          for (int v = 0; v < kVecs; ++v)
            store16_stream(row + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[Layout::kVec]>(&s[v * Layout::kVec]));
        }
      }
    }
  }
  cp_async_wait<0>();

  if (!fold) {
    if (blockIdx.x == 0) {
      act_t* ring_B_w = static_cast<act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + w * c.ring_B_pos_stride + g * c.ring_B_group_stride;
      for (int n = threadIdx.x; n < kN; n += kThreads) ring_B_w[n] = from_float<act_t>(Bt_s[n]);  // exact: B_t came as act_t
    }
    for (int hl = threadIdx.x; hl < nheads_block; hl += kThreads)
      if ((head_begin + hl) * p.headdim >= row_begin)  // the block holding the head's first row writes its dt
        c.ring_dt[slot * c.ring_dt_slot_stride + w * c.ring_dt_pos_stride + h0 + hl] = dtt[hl];
  }
  if (threadIdx.x == 0 && arrived == blocks_per_row - 1) {
    atomicSub(&c.arrivals[slot], blocks_per_row);  // zero again for the next launch
    c.cursor[slot] = next_cursor(w, L);
    if (fold && c.fold_count) c.fold_count[slot] = int(fold_no) + 1;
  }
}

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Default configuration: StreamLanes, kStreamStages, 3 blocks per SM.
template <typename ckpt_t, typename src_t, typename act_t, int kN, int kStages = kStreamStages,
          int kLanes = StreamLanes<src_t, kN>::value, int kMinBlocks = 3>
void launch_mamba2_replay_step(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128;
  using Layout = RowLayout<src_t, kN, kThreads, 1, kLanes>;
  const Mamba2ReplayCacheParams& c = p.cache;
  // Rows of a group per block: enough blocks for ~4 waves of 3 blocks per SM (prologues overlap other
  // blocks' streaming; the last wave is short), at most 256 rows (measured: 512 rows 5% slower at batch 128,
  // the same at 256).
  const int group_rows = (p.nheads / p.ngroups) * p.headdim;
  const int64_t groups_total = int64_t(p.batch) * p.ngroups;
  const int64_t target_blocks = int64_t(num_sms()) * 12;
  int64_t rows = (groups_total * group_rows + target_blocks - 1) / target_blocks;
  const int forced_rows = tune_knob("replay_rows");
  if (forced_rows > 0) rows = forced_rows;
  rows = std::max<int64_t>(Layout::kRowsPerIter, (rows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter * Layout::kRowsPerIter);
  int rows_per_block = static_cast<int>(std::min<int64_t>({rows, group_rows, forced_rows > 0 ? int64_t(1) << 20 : 256,
                                                          int64_t(kThreads - 1) * p.headdim}));  // <= kThreads heads
  auto heads_for = [&](int r) { return std::min((r + p.headdim - 1) / p.headdim + 1, p.nheads / p.ngroups); };
  auto smem_for = [&](int r) {
    return size_t(ReplaySmem(kStages * Layout::kVecsPerLane * kThreads * 16, sizeof(act_t), r, kN, c.ring_len, heads_for(r)).total);
  };
  const size_t smem_limit = size_t(max_smem_per_block());
  while (smem_for(rows_per_block) > smem_limit && rows_per_block > Layout::kRowsPerIter)
    rows_per_block = std::max(Layout::kRowsPerIter, rows_per_block / 2 / Layout::kRowsPerIter * Layout::kRowsPerIter);
  if (smem_for(rows_per_block) > smem_limit)
    throw std::invalid_argument("replayssm: mamba2_replay_step needs more shared memory than the device has for this "
                                "dstate and ring_len");
  const int chunks = (group_rows + rows_per_block - 1) / rows_per_block;
  // 16-byte copies of the row tiles when every plane is contiguous over (head, p) and 16-byte aligned.
  constexpr int kV = 16 / sizeof(act_t);
  const bool io_vec = p.headdim % kV == 0 && rows_per_block % kV == 0 && kN % kV == 0 && aligned16(p.x) && aligned16(c.ring_x) &&
                      aligned16(c.ring_B) && p.x_head_stride == p.headdim && p.x_batch_stride % kV == 0 &&
                      c.ring_x_head_stride == p.headdim && c.ring_x_slot_stride % kV == 0 && c.ring_x_pos_stride % kV == 0 &&
                      c.ring_B_slot_stride % kV == 0 && c.ring_B_pos_stride % kV == 0 && c.ring_B_group_stride % kV == 0 &&
                      (!p.z || (aligned16(p.z) && p.z_head_stride == p.headdim && p.z_batch_stride % kV == 0));
  // Fetch the whole ring with the cursor when the grid is within one wave (latency-bound).
  const int64_t blocks = int64_t(chunks) * groups_total;
  const int forced_prefetch = tune_knob("replay_prefetch");
  const bool prefetch_ring = forced_prefetch >= 0 ? forced_prefetch > 0 : blocks <= int64_t(num_sms()) * 3;
  const size_t smem_bytes = smem_for(rows_per_block);
  auto kernel = mamba2_replay_step_kernel<ckpt_t, src_t, act_t, kN, kThreads, kStages, Layout::kLanesPerRow, kMinBlocks>;
  if (smem_bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)),
               "mamba2_replay_step shared memory");
  const dim3 grid(chunks, p.ngroups, p.batch);
  const int prologue_flags = std::max(0, tune_knob("replay_prologue"));  // A/B of the prologue's forms (kernel)
  kernel<<<grid, kThreads, smem_bytes, stream>>>(p, rows_per_block, heads_for(rows_per_block), io_vec, prefetch_ring,
                                                 prologue_flags);
  check_cuda(cudaGetLastError(), "mamba2_replay_step kernel launch");
}

#include "replay_plain.cuh"  // the replay kernel of plain caches

template <DType kCkpt>
void mamba2_replay_step_cuda_for_ckpt(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] {
      using act_t = typename CudaType<kAct>::type;
      const int variant = tune_knob("replay_variant");
      if constexpr (kCkpt == DType::kFloat32 && kAct == DType::kBFloat16 && kN == 128) {
        // Alternatives for the benchmark's configuration, chosen by REPLAYSSM_TUNE (plain caches): 0: the
        // general kernel in its default layout; 1: the general kernel in v10's layout (128 bytes per lane, three
        // stages); 2: a deeper pipeline (eight stages).
        if (p.cache.view == nullptr && variant == 1) return launch_mamba2_replay_step<float, float, act_t, kN, 3, 4, 3>(p, stream);
        if (p.cache.view == nullptr && variant == 2) return launch_mamba2_replay_step<float, float, act_t, kN, 8, 8, 3>(p, stream);
      }
      // 3: the numerical split through the v10 kernel (to be measured): the view with six stages.
      if constexpr (kCkpt == DType::kFloat32) {
        if (p.cache.view != nullptr && variant == 3)
          return launch_mamba2_replay_step_v10<float, act_t, kN, __nv_bfloat16, kStreamStages>(p, stream);
      }
      // Plain caches (no view, rounding to nearest): the "v10" kernel (replay_plain.cuh), measured 1.2x faster
      // than this file's general kernel (bench/results/mamba2_decode_tune_cdcd8b1.json, batch 256: 321.1 us against
      // 396.8 in its default layout and 419.8 in v10's; cause not yet found, bench/NOTES.md). The general kernel serves the numerical split (stochastic rounding through
      // v10 with replay_variant=3), and replay_variant=0.
      if (p.cache.view == nullptr && (p.cache.sr_seed == nullptr ? variant != 0 : variant == 3))
        return launch_mamba2_replay_step_v10<ckpt_t, act_t, kN>(p, stream);
      if (p.cache.view == nullptr) return launch_mamba2_replay_step<ckpt_t, ckpt_t, act_t, kN>(p, stream);
      if constexpr (kCkpt == DType::kFloat32) return launch_mamba2_replay_step<float, __nv_bfloat16, act_t, kN>(p, stream);
      throw std::invalid_argument("replayssm: on CUDA the output view must be of an fp32 checkpoint");
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
