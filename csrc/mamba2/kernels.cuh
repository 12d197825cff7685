// CUDA kernels of the Mamba-2 decode ops (torch-free: params in, stream in). One template per kernel,
// instantiated per storage dtype in the small step_*.cu / replay_*.cu files so that builds parallelise.
//
// Both step kernels stream state rows (one row = dstate values of one (head, p)) with the same layout:
// each lane owns kColsPerLane columns of a row as 16-byte vectors, kLanesPerRow lanes share a row, and
// each thread keeps kUnroll rows' loads in flight before it uses any of them, so that a full SM has
// ~64-128 KiB of reads outstanding: the state is read at the HBM rate, not at the latency rate.
#pragma once

#include <algorithm>

#include "../common/cuda_utils.cuh"
#include "../common/math.h"
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
          store16_stream(S + r * p.state_row_stride + Layout::col(lane_in_row, v, 0),
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

template <typename state_t, typename act_t, int kN>
void launch_mamba2_step(const Mamba2StepParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128, kUnroll = 4;
  using Layout = RowLayout<state_t, kN, kThreads, kUnroll>;
  // Split a head's rows over blocks only as far as needed to keep every SM busy with several blocks.
  const int64_t heads_total = int64_t(p.batch) * p.nheads;
  const int max_chunks = (p.headdim + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter;
  int chunks = static_cast<int>((int64_t(num_sms()) * 8 + heads_total - 1) / heads_total);
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
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] { launch_mamba2_step<state_t, typename CudaType<kAct>::type, kN>(p, stream); });
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
// computed once per block for all the heads it covers (a whole group at serving batch sizes), not per head.
// Each row belongs to a group of at most 4 or 8 lanes (ReplayMaxLanes): each lane holds several 16-byte
// vectors of the row, so index math, ring values and the group sum are paid per 64+ bytes (with a warp per
// row the kernel ran at ~1 TB/s). The checkpoint streams through shared memory with cp.async, kStages deep,
// each thread copying and later reading only its own vectors (no block barrier): loads stay in flight while
// warps compute or wait on the ring, whose values a register prefetch fetches kAhead rows ahead.
// The first stages are issued before anything else (they need only the slot); the block scalars are
// computed while they fly. Lane l of a row holds the row's ring values x_j[p] for j = l, l + kLanes, ...;
// one group sum gives y; at a fold the lanes exchange x_j by shuffles.
// The cursor is advanced by the last block of the slot to finish (a per-slot arrival counter): every block
// read it at its start, so one launch suffices, with no host sync; graph-capturable.
template <int kStages, int kVecsPerThread>
struct ReplaySmem {
  int C, Bs, dts, wdt, wbc, decay, Ds, bc, total;  // offsets in floats, after the staging buffer
  static constexpr int kStagingFloats(int threads) { return kStages * kVecsPerThread * threads * 4; }
  __host__ __device__ ReplaySmem(int threads, int dstate, int ring_len, int max_heads) {
    C = kStagingFloats(threads);
    Bs = C + dstate;                    // [j][n] B_j
    dts = Bs + ring_len * dstate;       // [head][j] dt_j
    wdt = dts + max_heads * ring_len;   // [head][j] exp(c_t - c_j) dt_j
    wbc = wdt + max_heads * ring_len;   // [head][j] exp(c_t - c_j) dt_j (B_j . C_t)
    decay = wbc + max_heads * ring_len; // [head] exp(c_t)
    Ds = decay + max_heads;             // [head] D
    bc = Ds + max_heads;                // [j] B_j . C_t
    total = bc + ring_len;
  }
};

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); }

// Lanes per row: 4 for rings of up to 16 tokens (each lane then holds 4 ring values and, for an fp32 row of
// 128, 128 bytes of it: index math and bookkeeping are paid per 128 bytes); 8 for longer rings.
template <int kRingMax> struct ReplayMaxLanes { static constexpr int value = kRingMax <= 16 ? 4 : 8; };

template <typename ckpt_t, typename act_t, int kN, int kThreads, int kStages, int kRingMax>
__global__ void __launch_bounds__(kThreads, 2)
    mamba2_replay_step_kernel(const Mamba2ReplayStepParams p, const int rows_per_block, const int max_heads) {
  constexpr int kAhead = 3;
  using Layout = RowLayout<ckpt_t, kN, kThreads, 1, ReplayMaxLanes<kRingMax>::value>;
  constexpr int kLanes = Layout::kLanesPerRow;
  constexpr int kVecs = Layout::kVecsPerLane;
  constexpr int kRingPerLane = (kRingMax + kLanes - 1) / kLanes;  // ring positions a lane may hold
  const Mamba2ReplayCacheParams& c = p.cache;
  const int b = blockIdx.z, g = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_replay_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);

  const int heads_per_group = p.nheads / p.ngroups;
  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(heads_per_group * p.headdim, row_begin + rows_per_block);
  const int head_begin = row_begin / p.headdim;  // local head index within the group
  const int nheads_block = (row_end - 1) / p.headdim - head_begin + 1;
  const int h0 = g * heads_per_group + head_begin;  // first global head of the block
  const int n_iter = (row_end - row_begin + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter;
  const int L = c.ring_len;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  const int row0 = row_begin + warp * Layout::kRowsPerWarp + row_in_warp;  // this thread's row in iteration 0
  const ckpt_t* ckpt_group =
      static_cast<const ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(g) * heads_per_group * c.ckpt_head_stride;
  // This thread's row in the k-th iteration, as (row, head in block, p), advanced without divisions: the
  // copies, the ring prefetch and the compute each walk the rows with their own tracker.
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

  extern __shared__ __align__(16) float smem[];
  uint4* staging = reinterpret_cast<uint4*>(smem);  // [stage][vec][thread]
  RowPos copy_pos = pos0;
  auto issue = [&](int it) {  // start copying this thread's vectors of iteration `it` (an empty group past the end)
    if (it < n_iter && copy_pos.r < row_end) {
      const ckpt_t* src = ckpt_row(copy_pos);
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
        cp_async16(&staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x], src + Layout::col(lane_in_row, v, 0));
    }
    cp_async_commit();
    advance(copy_pos);
  };
#pragma unroll
  for (int it = 0; it < kStages - 1; ++it) issue(it);

  const int w = c.cursor[slot];
  RSSM_DEVICE_CHECK(w >= 0 && w < L, "mamba2_replay_step: cursor[%lld] = %d is outside [0, ring_len)", (long long)slot, w);
  const bool fold = is_fold_step(w, L);

  // This thread's ring values of its row (lane l: x_j[p] for j = l, l + kLanes, ...; j == w is x_t), and for
  // the row's lane 0 x_t[p] and z[p]; fetched kAhead iterations ahead.
  const act_t* ring_x = static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride;
  const act_t* x_t = static_cast<const act_t*>(p.x) + b * p.x_batch_stride;
  const act_t* z_t = static_cast<const act_t*>(p.z) + b * p.z_batch_stride;
  struct RowIn {
    float xr[kRingPerLane];
    act_t xt;
    float zt;
  };
  RowPos ring_pos = pos0;
  auto load_row_inputs = [&](int it, RowIn& in) {
    const bool valid = it < n_iter && ring_pos.r < row_end;
    const int h = h0 + ring_pos.hl, i = ring_pos.i;
    advance(ring_pos);
#pragma unroll
    for (int k = 0; k < kRingPerLane; ++k) {
      const int j = k * kLanes + lane_in_row;
      in.xr[k] = 0.f;
      if (valid && j <= w)
        in.xr[k] = to_float(j < w ? ring_x[j * c.ring_x_pos_stride + h * c.ring_x_head_stride + i] : x_t[h * p.x_head_stride + i]);
    }
    if (valid && lane_in_row == 0) {
      in.xt = x_t[h * p.x_head_stride + i];
      in.zt = p.z ? to_float(z_t[h * p.z_head_stride + i]) : 0.f;
    }
  };
  // Ring values are 2-byte reads from DRAM, fetched kAhead iterations early. Measured: no gain over one
  // iteration (536 vs 524 us at batch 256), because load_row_inputs converts them to fp32 at load time and
  // the warp waits there (ncu; bench/NOTES.md, "Next step").
  RowIn ahead[kAhead];
#pragma unroll
  for (int a = 0; a < kAhead; ++a) load_row_inputs(a, ahead[a]);

  // ---- Block scalars.
  const ReplaySmem<kStages, kVecs> off(kThreads, kN, L, max_heads);
  float* C_s = smem + off.C;
  float* Bs = smem + off.Bs;
  float* dts = smem + off.dts;
  float* wdt = smem + off.wdt;
  float* wbc = smem + off.wbc;
  float* decay = smem + off.decay;
  float* Ds = smem + off.Ds;
  float* bc = smem + off.bc;
  const act_t* Bt = static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride;
  const act_t* Ct = static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride;
  const act_t* ring_B = static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride;
  for (int n = threadIdx.x; n < kN; n += kThreads) C_s[n] = to_float(Ct[n]);
  for (int idx = threadIdx.x; idx < (w + 1) * kN; idx += kThreads) {  // B_j, for B.C and the fold
    const int j = idx / kN, n = idx % kN;
    Bs[idx] = to_float(j < w ? ring_B[j * c.ring_B_pos_stride + n] : Bt[n]);
  }
  for (int idx = threadIdx.x; idx < nheads_block * (w + 1); idx += kThreads) {
    const int hl = idx / (w + 1), j = idx % (w + 1), h = h0 + hl;
    dts[hl * L + j] = j < w ? c.ring_dt[slot * c.ring_dt_slot_stride + j * c.ring_dt_pos_stride + h]
                            : process_dt(to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + h * p.dt_head_stride]),
                                         p.dt_bias ? p.dt_bias[h] : 0.f, p.dt_softplus, p.dt_min, p.dt_max);
  }
  for (int hl = threadIdx.x; hl < nheads_block; hl += kThreads) Ds[hl] = p.D ? p.D[h0 + hl] : 0.f;
  __syncthreads();
  for (int j = warp; j <= w; j += Layout::kWarps) {
    float acc = 0.f;
    for (int n = lane; n < kN; n += 32) acc = fmaf(Bs[j * kN + n], C_s[n], acc);
    acc = group_sum<32>(acc);
    if (lane == 0) bc[j] = acc;
  }
  if (threadIdx.x < nheads_block) {
    const int hl = threadIdx.x;
    const float* dt_row = dts + hl * L;
    float* w_row = wdt + hl * L;
    decay[hl] = replay_decays([&](int j) { return dt_row[j]; }, w, p.A[h0 + hl], w_row);
    for (int j = 0; j <= w; ++j) w_row[j] *= dt_row[j];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nheads_block * (w + 1); idx += kThreads) {
    const int hl = idx / (w + 1), j = idx % (w + 1);
    wbc[hl * L + j] = wdt[hl * L + j] * bc[j];
  }
  __syncthreads();

  // ---- Stream the block's rows.
  act_t* ring_x_w = static_cast<act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + w * c.ring_x_pos_stride;
  RowPos pos = pos0;
  for (int it = 0; it < n_iter; ++it) {
    issue(it + kStages - 1);
    const RowIn in = ahead[0];
#pragma unroll
    for (int a = 0; a + 1 < kAhead; ++a) ahead[a] = ahead[a + 1];
    load_row_inputs(it + kAhead, ahead[kAhead - 1]);
    cp_async_wait<kStages - 1>();  // this thread's vectors of iteration `it` have landed
    const RowPos q = pos;
    advance(pos);
    const bool valid = q.r < row_end;
    const int hl = valid ? q.hl : 0, i = q.i, h = h0 + hl;
    float s[Layout::kColsPerLane];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const uint4 raw = staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x];
      const ckpt_t* elems = reinterpret_cast<const ckpt_t*>(&raw);
#pragma unroll
      for (int e = 0; e < Layout::kVec; ++e) s[v * Layout::kVec + e] = to_float(elems[e]);
    }
    float sc = 0.f;  // C_t read from shared memory (fewer registers)
#pragma unroll
    for (int v = 0; v < kVecs; ++v)
#pragma unroll
      for (int e = 0; e < Layout::kVec; ++e) sc = fmaf(s[v * Layout::kVec + e], C_s[Layout::col(lane_in_row, v, e)], sc);
    float y = decay[hl] * sc;
#pragma unroll
    for (int k = 0; k < kRingPerLane; ++k) {
      const int j = k * kLanes + lane_in_row;
      if (j <= w) y = fmaf(wbc[hl * L + j], in.xr[k], y);
    }
    y = group_sum<kLanes>(y);
    if (valid && lane_in_row == 0) {
      y = fmaf(Ds[hl], to_float(in.xt), y);
      if (p.z) y *= silu(in.zt);
      static_cast<act_t*>(p.out)[b * p.out_batch_stride + h * p.out_head_stride + i] = from_float<act_t>(y);
      if (!fold) ring_x_w[h * c.ring_x_head_stride + i] = in.xt;
    }
    if (fold) {
      // New checkpoint row: exp(c_t) S_c + sum_j exp(c_t - c_j) dt_j x_j[p] B_j; x_j comes from the lane
      // of this row that holds it.
      const float dcy = decay[hl];
#pragma unroll
      for (int col = 0; col < Layout::kColsPerLane; ++col) s[col] *= dcy;
#pragma unroll
      for (int k = 0; k < kRingPerLane; ++k) {
        for (int l = 0; l < kLanes; ++l) {
          const int j = k * kLanes + l;
          if (j > w) break;  // uniform across the warp: w is the slot's
          const float xj = __shfl_sync(0xffffffffu, in.xr[k], row_in_warp * kLanes + l);
          const float coef = wdt[hl * L + j] * xj;
          const float* Bj = Bs + j * kN;
#pragma unroll
          for (int v = 0; v < kVecs; ++v)
#pragma unroll
            for (int e = 0; e < Layout::kVec; ++e)
              s[v * Layout::kVec + e] = fmaf(coef, Bj[Layout::col(lane_in_row, v, e)], s[v * Layout::kVec + e]);
        }
      }
      if (valid) {
        ckpt_t* row = static_cast<ckpt_t*>(c.checkpoint) + (ckpt_row(q) - static_cast<const ckpt_t*>(c.checkpoint));
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
          store16_stream(row + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[Layout::kVec]>(&s[v * Layout::kVec]));
      }
    }
  }
  cp_async_wait<0>();

  if (!fold) {
    if (blockIdx.x == 0) {
      act_t* ring_B_w = static_cast<act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + w * c.ring_B_pos_stride + g * c.ring_B_group_stride;
      for (int n = threadIdx.x; n < kN; n += kThreads) ring_B_w[n] = Bt[n];
    }
    for (int hl = threadIdx.x; hl < nheads_block; hl += kThreads)
      if ((head_begin + hl) * p.headdim >= row_begin)  // the block holding the head's first row writes its dt
        c.ring_dt[slot * c.ring_dt_slot_stride + w * c.ring_dt_pos_stride + h0 + hl] = dts[hl * L + w];
  }
  // Count this block in; the slot's last block advances the cursor (all blocks read it at their start).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const int blocks_per_row = gridDim.x * gridDim.y;
    if (atomicAdd(&c.arrivals[slot], 1) == blocks_per_row - 1) {
      atomicSub(&c.arrivals[slot], blocks_per_row);  // not a plain store: it must not erase a concurrent arrival
      c.cursor[slot] = next_cursor(w, L);
    }
  }
}

template <typename ckpt_t, typename act_t, int kN, int kRingMax>
void launch_mamba2_replay_step(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  // Three stages per thread (two in flight while the third is read): with 128 bytes of a row per thread
  // and two blocks per SM, ~128 KiB of checkpoint reads outstanding per SM.
  constexpr int kThreads = 256, kStages = 3;
  using Layout = RowLayout<ckpt_t, kN, kThreads, 1, ReplayMaxLanes<kRingMax>::value>;
  // Rows of a group per block: whole groups (B.C once per group) unless that leaves SMs idle; then
  // smaller chunks, down to one iteration of the row loop.
  const int group_rows = (p.nheads / p.ngroups) * p.headdim;
  const int64_t groups_total = int64_t(p.batch) * p.ngroups;
  const int64_t target_blocks = int64_t(num_sms()) * 4;
  int64_t rows = (groups_total * group_rows + target_blocks - 1) / target_blocks;
  rows = (rows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter * Layout::kRowsPerIter;
  // Capped so that shared memory stays small and one thread per head can set up the decays.
  const int64_t cap = std::min<int64_t>({group_rows, 2048, int64_t(kThreads - 1) * p.headdim});
  int rows_per_block = static_cast<int>(std::min<int64_t>(rows, cap));
  auto heads_for = [&](int r) { return std::min((r + p.headdim - 1) / p.headdim + 1, p.nheads / p.ngroups); };
  auto smem_for = [&](int r) {
    return size_t(ReplaySmem<kStages, Layout::kVecsPerLane>(kThreads, kN, p.cache.ring_len, heads_for(r)).total) * sizeof(float);
  };
  // Per-head scalars grow with the rows of a block: halve it until its shared memory fits the device.
  static const size_t smem_limit = [] {
    int device = 0, bytes = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    return size_t(bytes);
  }();
  while (smem_for(rows_per_block) > smem_limit && rows_per_block > Layout::kRowsPerIter)
    rows_per_block = std::max(Layout::kRowsPerIter, rows_per_block / 2 / Layout::kRowsPerIter * Layout::kRowsPerIter);
  if (smem_for(rows_per_block) > smem_limit)
    throw std::invalid_argument("replayssm: mamba2_replay_step needs more shared memory than the device has for this "
                                "dstate and ring_len");
  const int chunks = (group_rows + rows_per_block - 1) / rows_per_block;
  const int max_heads = heads_for(rows_per_block);
  const size_t smem_bytes = smem_for(rows_per_block);
  auto kernel = mamba2_replay_step_kernel<ckpt_t, act_t, kN, kThreads, kStages, kRingMax>;
  if (smem_bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)),
               "mamba2_replay_step shared memory");
  const dim3 grid(chunks, p.ngroups, p.batch);
  kernel<<<grid, kThreads, smem_bytes, stream>>>(p, rows_per_block, max_heads);
  check_cuda(cudaGetLastError(), "mamba2_replay_step kernel launch");
}

template <DType kCkpt>
void mamba2_replay_step_cuda_for_ckpt(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] {
      using act_t = typename CudaType<kAct>::type;
      if (p.cache.ring_len <= 16) launch_mamba2_replay_step<ckpt_t, act_t, kN, 16>(p, stream);
      else launch_mamba2_replay_step<ckpt_t, act_t, kN, kMaxRing>(p, stream);
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
        <<<grid, 256, p.cache.ring_len * sizeof(float), stream>>>(p);
    check_cuda(cudaGetLastError(), "mamba2_replay_state kernel launch");
  });
}

}  // namespace replayssm
