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
      // kUnroll rows in flight per thread: 4 (measured best), others when REPLAYSSM_TUNE asks.
      switch (tune_knob("step_unroll")) {
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
// Work items are chunks of a group's rows (its heads' (head, p) rows) of one batch row, so (B_j . C_t) is
// computed once per item for all the heads it covers, not per head. Blocks are persistent: each takes the
// items blockIdx.x, blockIdx.x + gridDim.x, ... in turn.
// * A producer warp streams the checkpoint rows of the block's items into a ring of kBufs shared-memory
//   buffers with the copy engine (cp.async.bulk, one row per copy, completing on the buffer's mbarrier);
//   it runs ahead of the four consumer warps across items, so the copy engine keeps loading while the
//   consumers run an item's prologue. (v8 issued the copies from the consumer threads themselves and
//   reached ~79% of the DRAM peak; a persistent variant of it, whose prologue waited on its loads one
//   after another, did worse: bench/NOTES.md.)
// * Everything else a row needs (its ring values x_j, this token's x and z, the ring's B and dt) is copied
//   into shared-memory tiles in the item's prologue with cp.async, all in flight at once. The row loop
//   then issues no global load at all.
// * A row belongs to kLanes lanes (8 for long rows), each holding up to 8 16-byte vectors of it; lane l
//   reads the row's vectors l, l + kLanes, ..., so each quarter-warp reads 128 contiguous bytes (no bank
//   conflicts) and index math and the group sum are paid per 64+ bytes.
// * When each block has a single item (small batch) the step is a chain of dependent memory trips
//   (slot -> cursor -> ring). There the whole ring is fetched with the cursor (prefetch_ring), one trip
//   fewer; entries past the cursor are read and ignored. Otherwise only the cursor's entries are read.
// The cursor is advanced by the slot's last work item to count itself in on a per-slot arrival counter,
// which each item does as soon as all its threads have read the cursor: one launch suffices, with no host
// sync and no fence on the tail; graph-capturable.
template <typename ckpt_t, int kN>
struct ReplayGeometry {
  static constexpr int kConsumerWarps = 4, kThreads = (kConsumerWarps + 1) * 32, kBufs = 5;
  using Layout = RowLayout<ckpt_t, kN, kConsumerWarps * 32, 1, 8>;
  static constexpr int kRowBytes = kN * int(sizeof(ckpt_t));
  static constexpr int kRowsPerPass = kConsumerWarps * Layout::kRowsPerWarp;  // rows the consumers take at once
  // Rows per buffer: ~16 KiB, a whole number of passes.
  static constexpr int kChunkRows = 16384 / kRowBytes > kRowsPerPass ? 16384 / kRowBytes : kRowsPerPass;
  static constexpr int kPasses = kChunkRows / kRowsPerPass;
  static constexpr int kBufBytes = kChunkRows * kRowBytes;
};

// Shared memory of one block (byte offsets, each section 16-byte aligned).
struct ReplaySmem {
  int tile_stride;  // elements per tile row: the item's rows plus 8 (keeps ring rows on different banks)
  int bars, bufs, xs, xt, zs, Bring, Bt, C, dts, dtt, wdt, decay, Ds, bc, total;
  __host__ __device__ ReplaySmem(int nbufs, int buf_bytes, int act_bytes, int rows, int dstate, int ring_len, int max_heads) {
    auto up = [](int v) { return (v + 127) / 128 * 128; };
    tile_stride = (rows + 7) / 8 * 8 + 8;
    int o = 0;
    bars = o, o += up(2 * nbufs * 8);                           // full[kBufs], empty[kBufs] mbarriers
    bufs = o, o += up(nbufs * buf_bytes);                       // [buf][row] checkpoint rows
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

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra WAIT;\n}\n" ::"r"(
          smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// One contiguous run of bytes (a multiple of 16, both ends 16-byte aligned) from global to shared memory by the
// copy engine; its completion counts towards the mbarrier's expected bytes.
__device__ __forceinline__ void bulk_copy(void* smem_dst, const void* gmem_src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem_dst)),
               "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void consumer_sync(int threads) { asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory"); }

// dst[j * dst_stride + k] = src[j * src_pos_stride + row(r0 + k)] for j < nj, k < n, where row(r) is element
// (r / headdim, r % headdim) of a (heads, headdim) plane with the given head stride. vec: the rows are
// contiguous (head_stride == headdim) and everything is 16-byte aligned: cp.async by 16 bytes (complete at
// the caller's cp_async_wait_all); otherwise element by element.
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

template <typename ckpt_t, typename act_t, int kN>
__global__ void __launch_bounds__(ReplayGeometry<ckpt_t, kN>::kThreads, 2)
    mamba2_replay_step_kernel(const Mamba2ReplayStepParams p, const int rows_per_item, const int chunks, const int max_heads,
                              const bool io_vec, const bool prefetch_ring) {
  using Geo = ReplayGeometry<ckpt_t, kN>;
  using Layout = typename Geo::Layout;
  constexpr int kConsumers = Geo::kConsumerWarps * 32;
  constexpr int kLanes = Layout::kLanesPerRow;
  constexpr int kVecs = Layout::kVecsPerLane;
  constexpr int kCols = Layout::kColsPerLane;
  constexpr int kBufs = Geo::kBufs, kChunkRows = Geo::kChunkRows;
  const Mamba2ReplayCacheParams& c = p.cache;
  const int heads_per_group = p.nheads / p.ngroups;
  const int group_rows = heads_per_group * p.headdim;
  const int items_per_row = chunks * p.ngroups;  // work items of one batch row (one slot)
  const int num_items = p.batch * items_per_row;
  const int L = c.ring_len;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const ReplaySmem off(kBufs, Geo::kBufBytes, sizeof(act_t), rows_per_item, kN, L, max_heads);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_raw + off.bars);
  uint64_t* empty = full + kBufs;
  unsigned char* bufs = smem_raw + off.bufs;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kBufs; ++s) {
      mbar_init(&full[s], 1);                      // the producer's arrive, plus the bytes of the copies
      mbar_init(&empty[s], Geo::kConsumerWarps);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // ---- Work items: (batch row b, group g, chunk), this block's in order; padding rows are skipped.
  auto slot_of = [&](int id) { return slot_at(p.slot_ids, p.slot_ids_int64, id / items_per_row); };
  auto first_live = [&](int id) {  // this block's first item from id on whose row is not padding
    for (; id < num_items; id += gridDim.x)
      if (slot_of(id) != kPadSlot) break;
    return id;
  };
  struct Item {
    int b, g, row_begin, row_end, head_begin, h0;
    int64_t slot;
  };
  auto make_item = [&](int id) {
    Item t;
    t.b = id / items_per_row;
    const int rem = id % items_per_row;
    t.g = rem / chunks;
    t.slot = slot_of(id);
    RSSM_DEVICE_CHECK(t.slot >= 0 && t.slot < p.num_slots, "mamba2_replay_step: slot_ids[%d] = %lld is out of range", t.b,
                      (long long)t.slot);
    t.row_begin = (rem % chunks) * rows_per_item;
    t.row_end = min(group_rows, t.row_begin + rows_per_item);
    t.head_begin = t.row_begin / p.headdim;
    t.h0 = t.g * heads_per_group + t.head_begin;
    return t;
  };
  auto ckpt_row = [&](const Item& t, int r) {  // group-local row r of the item's slot
    return static_cast<const ckpt_t*>(c.checkpoint) + t.slot * c.ckpt_slot_stride +
           int64_t(t.g * heads_per_group + r / p.headdim) * c.ckpt_head_stride + (r % p.headdim) * c.ckpt_row_stride;
  };

  if (warp == Geo::kConsumerWarps) {
    // ---- Producer: every chunk of every item, in the consumers' order, into the next free buffer.
    const bool rows_contiguous = c.ckpt_row_stride == kN;
    int seq = 0;
    for (int id = first_live(blockIdx.x); id < num_items; id = first_live(id + gridDim.x)) {
      const Item t = make_item(id);
      for (int r0 = t.row_begin; r0 < t.row_end; r0 += kChunkRows, ++seq) {
        const int s = seq % kBufs;
        if (seq >= kBufs) mbar_wait(&empty[s], (seq / kBufs - 1) & 1);
        const int nr = min(kChunkRows, t.row_end - r0);
        if (lane == 0) {
          mbar_arrive_expect_tx(&full[s], nr * Geo::kRowBytes);
          // One copy per run of rows that are contiguous in memory (a head's rows of a dense pool): the copy
          // engine's rate is per copy, and with one 512-byte copy per row the kernel ran at ~50% of DRAM.
          for (int k = 0; rows_contiguous && k < nr;) {
            const int r = r0 + k, run = min(nr - k, p.headdim - r % p.headdim);
            bulk_copy(bufs + (s * kChunkRows + k) * Geo::kRowBytes, ckpt_row(t, r), run * Geo::kRowBytes, &full[s]);
            k += run;
          }
        }
        __syncwarp();
        for (int k = lane; !rows_contiguous && k < nr; k += 32)
          bulk_copy(bufs + (s * kChunkRows + k) * Geo::kRowBytes, ckpt_row(t, r0 + k), Geo::kRowBytes, &full[s]);
      }
    }
    return;
  }

  // ---- Consumers (threads 0..127).
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
  const int lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;

  int seq = 0;
  for (int id = first_live(blockIdx.x); id < num_items; id = first_live(id + gridDim.x)) {
    const Item t = make_item(id);
    const int64_t slot = t.slot;
    const int b = t.b, g = t.g, row_begin = t.row_begin, row_end = t.row_end, h0 = t.h0;
    const int nrows = row_end - row_begin;
    const int nheads_item = (row_end - 1) / p.headdim - t.head_begin + 1;
    const int w = c.cursor[slot];

    // ---- Prologue: this token's inputs and the ring into shared memory, every copy in flight at once.
    const act_t* Bt = static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride;
    const act_t* Ct = static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride;
    constexpr int kNPer = (kN + kConsumers - 1) / kConsumers;
    act_t Bv[kNPer], Cv_raw[kNPer];
#pragma unroll
    for (int u = 0; u < kNPer; ++u) {
      const int n = threadIdx.x + u * kConsumers;
      if (n < kN) Bv[u] = Bt[n], Cv_raw[u] = Ct[n];
    }
    float dt_raw = 0.f, D_h = 0.f;
    if (threadIdx.x < nheads_item) {  // nheads_item <= max_heads <= kConsumers (launcher)
      const int h = h0 + threadIdx.x;
      dt_raw = to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + h * p.dt_head_stride]) + (p.dt_bias ? p.dt_bias[h] : 0.f);
      D_h = p.D ? p.D[h] : 0.f;
    }
    const act_t* x_t = static_cast<const act_t*>(p.x) + b * p.x_batch_stride + int64_t(g) * heads_per_group * p.x_head_stride;
    copy_head_rows<act_t, kConsumers>(xt_s, 0, x_t, 0, p.x_head_stride, p.headdim, row_begin, nrows, 1, io_vec);
    if (p.z) {
      const act_t* z_t = static_cast<const act_t*>(p.z) + b * p.z_batch_stride + int64_t(g) * heads_per_group * p.z_head_stride;
      copy_head_rows<act_t, kConsumers>(zs, 0, z_t, 0, p.z_head_stride, p.headdim, row_begin, nrows, 1, io_vec);
    }
    const act_t* ring_x =
        static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + int64_t(g) * heads_per_group * c.ring_x_head_stride;
    const act_t* ring_B = static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride;
    const float* ring_dt = c.ring_dt + slot * c.ring_dt_slot_stride + h0;
    auto load_ring = [&](int nj) {  // ring positions 0..nj-1
      copy_head_rows<act_t, kConsumers>(xs, ts, ring_x, c.ring_x_pos_stride, c.ring_x_head_stride, p.headdim, row_begin, nrows,
                                        nj, io_vec);
      copy_head_rows<act_t, kConsumers>(Bring, kN, ring_B, c.ring_B_pos_stride, 0, kN, 0, kN, nj, io_vec);
      for (int idx = threadIdx.x; idx < nheads_item * nj; idx += kConsumers) {
        const int hl = idx / nj, j = idx % nj;
        cp_async4(&dts[hl * L + j], &ring_dt[j * c.ring_dt_pos_stride + hl]);
      }
    };
    if (prefetch_ring) load_ring(L - 1);  // before the cursor is known: one dependent trip fewer
    RSSM_DEVICE_CHECK(w >= 0 && w < L, "mamba2_replay_step: cursor[%lld] = %d is outside [0, ring_len)", (long long)slot, w);
    if (!prefetch_ring) load_ring(w);
#pragma unroll
    for (int u = 0; u < kNPer; ++u) {
      const int n = threadIdx.x + u * kConsumers;
      if (n < kN) Bt_s[n] = to_float(Bv[u]), C_s[n] = to_float(Cv_raw[u]);
    }
    if (threadIdx.x < nheads_item) {
      float dt = p.dt_softplus ? softplus(dt_raw) : dt_raw;  // process_dt, with the bias added at the load
      dtt[threadIdx.x] = fminf(fmaxf(dt, p.dt_min), p.dt_max);
      Ds[threadIdx.x] = D_h;
    }
    cp_async_wait_all();
    consumer_sync(kConsumers);  // tiles written; every consumer has read the cursor

    // Count this item in: all its threads have read the cursor, so the slot's last item to arrive may advance
    // it now (the other items of the slot read it before they arrived). The answer is used at the end.
    int arrived = 0;
    if (threadIdx.x == 0) arrived = atomicAdd(&c.arrivals[slot], 1);

    // ---- Item scalars: B_j . C_t (a warp per j) and the decays (a thread per (head, j); the same sums in
    // the same order as replay_decays in math.h, which the CPU runs).
    const bool fold = is_fold_step(w, L);
    for (int j = warp; j <= w; j += Geo::kConsumerWarps) {
      float acc = 0.f;
      for (int n = lane; n < kN; n += 32) acc = fmaf(j < w ? to_float(Bring[j * kN + n]) : Bt_s[n], C_s[n], acc);
      acc = group_sum<32>(acc);
      if (lane == 0) bc[j] = acc;
    }
    for (int idx = threadIdx.x; idx < nheads_item * (w + 1); idx += kConsumers) {
      const int hl = idx / (w + 1), j = idx % (w + 1);
      auto dt_at = [&](int k) { return k < w ? dts[hl * L + k] : dtt[hl]; };
      const float A = p.A[h0 + hl];
      float suffix = 0.f;
      for (int k = w; k > j; --k) suffix += dt_at(k);
      wdt[hl * L + j] = expf(A * suffix) * dt_at(j);
      if (j == 0) decay[hl] = expf(A * (suffix + dt_at(0)));
    }
    float Cv[kCols];  // this lane's columns of C_t
#pragma unroll
    for (int v = 0; v < kVecs; ++v)
#pragma unroll
      for (int e = 0; e < Layout::kVec; ++e) Cv[v * Layout::kVec + e] = C_s[Layout::col(lane_in_row, v, e)];
    if (!fold) {  // append this token's x to the ring (its B and dt at the end)
      act_t* dst = static_cast<act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + w * c.ring_x_pos_stride +
                   int64_t(g) * heads_per_group * c.ring_x_head_stride;
      if (io_vec) {
        constexpr int kV = 16 / sizeof(act_t);
        for (int k = threadIdx.x * kV; k < nrows; k += kConsumers * kV)
          *reinterpret_cast<uint4*>(dst + row_begin + k) = *reinterpret_cast<const uint4*>(xt_s + k);
      } else {
        for (int k = threadIdx.x; k < nrows; k += kConsumers) {
          const int r = row_begin + k;
          dst[(r / p.headdim) * c.ring_x_head_stride + r % p.headdim] = xt_s[k];
        }
      }
    }
    consumer_sync(kConsumers);

    // ---- Stream the item's rows, a buffer at a time.
    for (int r0 = row_begin; r0 < row_end; r0 += kChunkRows, ++seq) {
      const int s = seq % kBufs;
      mbar_wait(&full[s], (seq / kBufs) & 1);
      const unsigned char* buf = bufs + s * Geo::kBufBytes;
#pragma unroll
      for (int pass = 0; pass < Geo::kPasses; ++pass) {
        const int k = (pass * Geo::kConsumerWarps + warp) * Layout::kRowsPerWarp + row_in_warp;  // row in the buffer
        const int r = r0 + k;
        const bool valid = r < row_end;
        const int rl = valid ? r - row_begin : 0;
        const int hl = valid ? r / p.headdim - t.head_begin : 0, i = r % p.headdim;
        float s_row[kCols];
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          const uint4 raw = *reinterpret_cast<const uint4*>(buf + k * Geo::kRowBytes + Layout::col(lane_in_row, v, 0) * sizeof(ckpt_t));
          const ckpt_t* elems = reinterpret_cast<const ckpt_t*>(&raw);
#pragma unroll
          for (int e = 0; e < Layout::kVec; ++e) s_row[v * Layout::kVec + e] = to_float(elems[e]);
        }
        float sc = 0.f;
#pragma unroll
        for (int col = 0; col < kCols; ++col) sc = fmaf(s_row[col], Cv[col], sc);
        const float* wdt_h = wdt + hl * L;
        float y = decay[hl] * sc;
        for (int j = lane_in_row; j < w; j += kLanes) y = fmaf(wdt_h[j] * bc[j], to_float(xs[j * ts + rl]), y);
        y = group_sum<kLanes>(y);
        const float xt = to_float(xt_s[rl]);
        if (valid && lane_in_row == 0) {
          y = fmaf(wdt_h[w] * bc[w] + Ds[hl], xt, y);
          if (p.z) y *= silu(to_float(zs[rl]));
          static_cast<act_t*>(p.out)[b * p.out_batch_stride + (h0 + hl) * p.out_head_stride + i] = from_float<act_t>(y);
        }
        if (fold) {
          // New checkpoint row: exp(c_t) S_c + sum_{j<=w} exp(c_t - c_j) dt_j x_j[p] B_j.
          const float dcy = decay[hl];
#pragma unroll
          for (int col = 0; col < kCols; ++col) s_row[col] *= dcy;
          for (int j = 0; j < w; ++j) {
            const float coef = wdt_h[j] * to_float(xs[j * ts + rl]);
            const act_t* Bj = Bring + j * kN;
#pragma unroll
            for (int v = 0; v < kVecs; ++v)
#pragma unroll
              for (int e = 0; e < Layout::kVec; ++e)
                s_row[v * Layout::kVec + e] = fmaf(coef, to_float(Bj[Layout::col(lane_in_row, v, e)]), s_row[v * Layout::kVec + e]);
          }
          const float coef = wdt_h[w] * xt;
#pragma unroll
          for (int v = 0; v < kVecs; ++v)
#pragma unroll
            for (int e = 0; e < Layout::kVec; ++e)
              s_row[v * Layout::kVec + e] = fmaf(coef, Bt_s[Layout::col(lane_in_row, v, e)], s_row[v * Layout::kVec + e]);
          if (valid) {
            ckpt_t* row = const_cast<ckpt_t*>(ckpt_row(t, r));
#pragma unroll
            for (int v = 0; v < kVecs; ++v)
              store16_stream(row + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[Layout::kVec]>(&s_row[v * Layout::kVec]));
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done with the buffer
    }

    if (!fold) {
      if (row_begin == 0) {
        act_t* ring_B_w = static_cast<act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + w * c.ring_B_pos_stride + g * c.ring_B_group_stride;
        for (int n = threadIdx.x; n < kN; n += kConsumers) ring_B_w[n] = from_float<act_t>(Bt_s[n]);  // exact: B_t came as act_t
      }
      for (int hl = threadIdx.x; hl < nheads_item; hl += kConsumers)
        if ((t.head_begin + hl) * p.headdim >= row_begin)  // the item holding the head's first row writes its dt
          c.ring_dt[slot * c.ring_dt_slot_stride + w * c.ring_dt_pos_stride + h0 + hl] = dtt[hl];
    }
    if (threadIdx.x == 0 && arrived == items_per_row - 1) {
      atomicSub(&c.arrivals[slot], items_per_row);  // zero again for the next launch
      c.cursor[slot] = next_cursor(w, L);
    }
    consumer_sync(kConsumers);  // the next item's prologue overwrites the tiles
  }
}

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename ckpt_t, typename act_t, int kN>
void launch_mamba2_replay_step(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  using Geo = ReplayGeometry<ckpt_t, kN>;
  const Mamba2ReplayCacheParams& c = p.cache;
  auto kernel = mamba2_replay_step_kernel<ckpt_t, act_t, kN>;
  static const int device_smem = [] {
    int device = 0, bytes = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    return bytes;
  }();
  // Rows per work item: about 4 items per block, at most 512 rows (shared memory for 2 blocks per SM), a
  // whole number of buffers.
  const int group_rows = (p.nheads / p.ngroups) * p.headdim;
  const int64_t total_rows = int64_t(p.batch) * p.ngroups * group_rows;
  const int forced_rows = tune_knob("replay_rows");
  int64_t rows = forced_rows > 0 ? forced_rows : std::min<int64_t>(512, total_rows / (int64_t(num_sms()) * 2 * 4));
  rows = std::max<int64_t>(Geo::kChunkRows, (rows + Geo::kChunkRows - 1) / Geo::kChunkRows * Geo::kChunkRows);
  // At most kConsumers - 1 heads per item (a consumer thread per head in the prologue).
  int rows_per_item = static_cast<int>(std::min<int64_t>({rows, int64_t(group_rows), int64_t(Geo::kConsumerWarps * 32 - 1) * p.headdim}));
  auto heads_for = [&](int r) { return std::min((r + p.headdim - 1) / p.headdim + 1, p.nheads / p.ngroups); };
  auto smem_for = [&](int r) {
    return ReplaySmem(Geo::kBufs, Geo::kBufBytes, sizeof(act_t), r, kN, c.ring_len, heads_for(r)).total;
  };
  while (smem_for(rows_per_item) > device_smem && rows_per_item > Geo::kChunkRows)
    rows_per_item = std::max(Geo::kChunkRows, rows_per_item / 2 / Geo::kChunkRows * Geo::kChunkRows);
  if (smem_for(rows_per_item) > device_smem)
    throw std::invalid_argument("replayssm: mamba2_replay_step needs more shared memory than the device has for this "
                                "dstate and ring_len");
  const int smem_bytes = smem_for(rows_per_item);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes), "mamba2_replay_step shared memory");
  const int chunks = (group_rows + rows_per_item - 1) / rows_per_item;
  const int64_t items = int64_t(p.batch) * p.ngroups * chunks;
  // As many blocks as fit on the device at once, each with the same number of items (+-1).
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Geo::kThreads, smem_bytes), "occupancy");
  if (tune_knob("replay_per_sm") > 0) per_sm = tune_knob("replay_per_sm");
  const int64_t max_grid = int64_t(std::max(per_sm, 1)) * num_sms();
  const int64_t items_per_block = (items + max_grid - 1) / max_grid;
  int64_t grid = (items + items_per_block - 1) / items_per_block;
  if (tune_knob("replay_grid") > 0) grid = std::min<int64_t>(items, tune_knob("replay_grid"));  // tests: many items per block
  // 16-byte copies of the row tiles when every plane is contiguous over (head, p) and 16-byte aligned.
  constexpr int kV = 16 / sizeof(act_t);
  const bool io_vec = p.headdim % kV == 0 && rows_per_item % kV == 0 && kN % kV == 0 && aligned16(p.x) && aligned16(c.ring_x) &&
                      aligned16(c.ring_B) && p.x_head_stride == p.headdim && p.x_batch_stride % kV == 0 &&
                      c.ring_x_head_stride == p.headdim && c.ring_x_slot_stride % kV == 0 && c.ring_x_pos_stride % kV == 0 &&
                      c.ring_B_slot_stride % kV == 0 && c.ring_B_pos_stride % kV == 0 && c.ring_B_group_stride % kV == 0 &&
                      (!p.z || (aligned16(p.z) && p.z_head_stride == p.headdim && p.z_batch_stride % kV == 0));
  // Fetch the whole ring with the cursor when each block has one item (latency-bound: small batch).
  const int forced_prefetch = tune_knob("replay_prefetch");
  const bool prefetch_ring = forced_prefetch >= 0 ? forced_prefetch > 0 : grid == items;
  kernel<<<static_cast<unsigned>(grid), Geo::kThreads, smem_bytes, stream>>>(p, rows_per_item, chunks, heads_for(rows_per_item),
                                                                             io_vec, prefetch_ring);
  check_cuda(cudaGetLastError(), "mamba2_replay_step kernel launch");
}

template <DType kCkpt>
void mamba2_replay_step_cuda_for_ckpt(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] { launch_mamba2_replay_step<ckpt_t, typename CudaType<kAct>::type, kN>(p, stream); });
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
