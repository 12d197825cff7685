// CUDA kernel of speculative verification (MATH.md, "Verifying T tokens at once"), the same semantics as
// replay_verify_cpu in cpu.cpp: when cursor + T > ring_len the committed history is folded first
// (checkpoint <- state at the cursor, cursor <- 0); the T tentative tokens go into the ring after the cursor;
// token k (ring position t = base + k) gets
//   y_k = exp(c_t) (S_c C_k) + sum_{j<=t} exp(c_t - c_j) dt_j (B_j . C_k) x_j + D x_k   (* silu(z_k))
// No intermediate state is formed. Non-fold rows never write the checkpoint.
//
// Grid (row chunks of a group, G, batch), like the replay step, and the same streaming: the checkpoint rows
// pass through a cp.async staging ring of kStages stages, the window's inputs and the committed ring entries
// are staged into shared-memory tiles (one cp.async group) while the first stages are in flight, the block's
// scalars (B_j . C_k, 8 lanes per pair, and the decay weights, a thread per (head, k) running j down, folded into one table
// W) are formed once, the ring's part of every output once per row (a thread per row, into yr), and the row
// loop then only dots each streamed row with the C_k (kTok tokens at a time, one reduce-scatter). A block counts in on the slot's arrival counter once every
// thread has read the cursor. The slot's last block to arrive writes the window's B and dt into the ring and the
// new cursor and pending count (every block of the slot has read the old entries by then, and nobody reads
// the new ones in this launch); each block writes its own rows' x into the ring.
//
// The numerical split (MATH.md), as replay_verify_cpu: src_t is what the row loop streams, the checkpoint
// itself (src_t == ckpt_t) or its bf16 output view (an fp32 checkpoint), which then serves every output while
// an early fold reads the fp32 master row (__ldcs) and writes the master and the view (rounded to nearest;
// the outputs after it use the view's values). A narrow checkpoint with sr_seed is rounded stochastically at
// an early fold: Philox keyed by the slot's seed, its fold count and the element index (h * P + p) * N + n,
// the count read by every thread before the block counts in, and written (+1) by the slot's last block.
#pragma once

#include <algorithm>

#include "kernels.cuh"

namespace replayssm {

struct VerifySmem {  // byte offsets, each section 16-byte aligned
  int ts;             // elements per row tile (rows of the block, padded to 8, plus 8: ring rows on other banks)
  int staging, Craw, Bnew, Bold, Cf, dtold, dtnew, xold, xnew, znew, wf, decf, bc, W, deck, Ds, As, yr, flag, total;
  __host__ __device__ VerifySmem(int staging_bytes, int act_bytes, int rows, int dstate, int ring_len, int T, int heads) {
    auto up = [](int v) { return (v + 15) / 16 * 16; };
    ts = (rows + 7) / 8 * 8 + 8;
    int o = 0;
    staging = o, o += up(staging_bytes);          // [stage][vec][thread] checkpoint vectors
    Craw = o, o += up(T * dstate * act_bytes);    // [k][n] C_k (raw)
    Bnew = o, o += up(T * dstate * act_bytes);    // [k][n] B_k of the window (raw)
    Bold = o, o += up(ring_len * dstate * act_bytes);  // [j][n] committed ring B_j (raw)
    Cf = o, o += up(T * dstate * 4);              // [k][n] C_k
    dtold = o, o += up(heads * ring_len * 4);     // [head][j] committed ring dt_j
    dtnew = o, o += up(heads * T * 4);            // [head][k] dt_k of the window (processed)
    xold = o, o += up(ring_len * ts * act_bytes);  // [j][row] committed ring x_j
    xnew = o, o += up(T * ts * act_bytes);        // [k][row] x_k
    znew = o, o += up(T * ts * act_bytes);        // [k][row] z_k
    wf = o, o += up(heads * ring_len * 4);        // [head][j] early fold: exp(c_w - c_j) dt_j
    decf = o, o += up(heads * 4);                 // [head] early fold: exp(c_w)
    bc = o, o += up(T * ring_len * 4);            // [k][j] B_j . C_k, j <= t_k
    W = o, o += up(heads * T * ring_len * 4);     // [head][k][j] exp(c_t - c_j) dt_j (B_j . C_k)
    deck = o, o += up(heads * T * 4);             // [head][k] exp(c_t)
    Ds = o, o += up(heads * 4);
    As = o, o += up(heads * 4);                   // [head] A
    yr = o, o += up(T * ts * 4);                  // [k][row] sum_{j<=t_k} W[k][j] x_j: the ring's part of y_k
    flag = o, o += 16;                            // [0] this block arrived last
    total = o;
  }
};

// Instruction count is what limits this kernel (ncu at batch 256, T = 4, 2026-11-29: 4.4e8 warp instructions,
// ~840 per warp per row iteration where the arithmetic needs ~120 by my count, DRAM 1/4 busy), so the row loop does only what needs the row: the ring's
// part of the outputs is formed once per row before it (a thread per row, no reductions), and the T dots
// with C run kTok at a time, reduced with one reduce-scatter over the row's lanes (kTok sums in log2(kLanes)
// + kTok - 1 shuffles instead of kTok * log2(kLanes)).
// kLean (the default since 2026-12-01; REPLAYSSM_TUNE stream_lean=0, or offsets past 32 bits, take the 64-bit
// path), as in the replay step: the streamed
// row's and the outputs' addresses as 32-bit offsets from per-lane/per-block bases (ncu at batch 256, T = 4,
// 2026-11-29: the cp.async issue ~10% of the instructions, the outputs' addresses ~6%), and no zeroing select
// per element for the past-the-end rows of the last iteration (~7%: their sums stay within their own lanes'
// reduce-scatter, are never written, and their folds are not stored).
template <typename ckpt_t, typename src_t, typename act_t, int kN, int kThreads, int kStages, int kLanesPerRow, int kMinBlocks,
          bool kLean = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    mamba2_replay_verify_kernel(const Mamba2ReplayVerifyParams p, const int rows_per_block, const int max_heads, const bool io_vec) {
  constexpr bool kView = !std::is_same_v<src_t, ckpt_t>;
  static_assert(!kView || std::is_same_v<ckpt_t, float>, "the output view is of an fp32 checkpoint");
  constexpr bool kNarrow = !std::is_same_v<ckpt_t, float>;  // may round stochastically at folds
  using Layout = RowLayout<src_t, kN, kThreads, 1, kLanesPerRow>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane, kVec = Layout::kVec;
  const Mamba2ReplayCacheParams& c = p.cache;
  const int b = blockIdx.z, g = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_replay_verify: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int w0 = c.cursor[slot];  // in flight while the first loads are issued
  const int L = c.ring_len, Tmax = p.ntokens;
  const int T = p.num_tokens ? p.num_tokens[b] : Tmax;

  const int heads_per_group = p.nheads / p.ngroups;
  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(heads_per_group * p.headdim, row_begin + rows_per_block);
  const int nrows = row_end - row_begin;
  const int head_begin = row_begin / p.headdim;
  const int nheads_block = (row_end - 1) / p.headdim - head_begin + 1;
  const int h0 = g * heads_per_group + head_begin;
  const int n_iter = (nrows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  const int row0 = row_begin + warp * Layout::kRowsPerWarp + row_in_warp;
  ckpt_t* ckpt_group = static_cast<ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(g) * heads_per_group * c.ckpt_head_stride;
  const RowPos pos0{row0, row0 / p.headdim - head_begin, row0 % p.headdim};
  auto ckpt_row = [&](const RowPos& q) { return ckpt_group + (head_begin + q.hl) * c.ckpt_head_stride + q.i * c.ckpt_row_stride; };
  // The rows streamed for the outputs: the checkpoint's, or its view's.
  auto src_row = [&](const RowPos& q) {
    if constexpr (kView)
      return static_cast<src_t*>(c.view) + slot * c.view_slot_stride +
             (int64_t(g) * heads_per_group + head_begin + q.hl) * c.view_head_stride + q.i * c.view_row_stride;
    else
      return ckpt_row(q);
  };

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const VerifySmem off(kStages * kVecs * kThreads * 16, sizeof(act_t), rows_per_block, kN, L, Tmax, max_heads);
  uint4* staging = reinterpret_cast<uint4*>(smem_raw + off.staging);
  act_t* Craw = reinterpret_cast<act_t*>(smem_raw + off.Craw);
  act_t* Bnew = reinterpret_cast<act_t*>(smem_raw + off.Bnew);
  act_t* Bold = reinterpret_cast<act_t*>(smem_raw + off.Bold);
  float* Cf = reinterpret_cast<float*>(smem_raw + off.Cf);
  float* dtold = reinterpret_cast<float*>(smem_raw + off.dtold);
  float* dtnew = reinterpret_cast<float*>(smem_raw + off.dtnew);
  act_t* xold = reinterpret_cast<act_t*>(smem_raw + off.xold);
  act_t* xnew = reinterpret_cast<act_t*>(smem_raw + off.xnew);
  act_t* znew = reinterpret_cast<act_t*>(smem_raw + off.znew);
  float* wf = reinterpret_cast<float*>(smem_raw + off.wf);
  float* decf = reinterpret_cast<float*>(smem_raw + off.decf);
  float* bc = reinterpret_cast<float*>(smem_raw + off.bc);
  float* W = reinterpret_cast<float*>(smem_raw + off.W);
  float* deck = reinterpret_cast<float*>(smem_raw + off.deck);
  float* Ds = reinterpret_cast<float*>(smem_raw + off.Ds);
  float* As = reinterpret_cast<float*>(smem_raw + off.As);
  float* yr = reinterpret_cast<float*>(smem_raw + off.yr);
  int* last_flag = reinterpret_cast<int*>(smem_raw + off.flag);
  const int ts = off.ts;

  RowPos copy_pos = pos0;
  // kLean: this lane's first column in the block's first head, and 32-bit strides (src_row's values).
  const src_t* src_lane = kLean ? src_row(RowPos{0, 0, 0}) + Layout::col(lane_in_row, 0, 0) : nullptr;
  const int src_head_stride = int(kView ? c.view_head_stride : c.ckpt_head_stride);
  const int src_row_stride = int(kView ? c.view_row_stride : c.ckpt_row_stride);
  auto issue = [&](int it) {  // start copying this thread's vectors of iteration `it` (an empty group past the end)
    if (it < n_iter && copy_pos.r < row_end)
      copy_row_async<Layout, kThreads, kLean>(staging, it % kStages, copy_pos, src_lane, src_head_stride, src_row_stride, lane_in_row,
                                                      src_row);
    cp_async_commit();
    copy_pos.advance<Layout::kRowsPerIter>(p.headdim);
  };
  // All kStages stages issued before the prologue; the row loop refills a stage right after this thread's reads of it
  // (a thread reads only the vectors it copied): kStages stages in flight instead of kStages - 1.
#pragma unroll
  for (int it = 0; it < kStages; ++it) issue(it);

  // ---- The window's inputs (known before the cursor) and then the committed ring, into shared memory.
  const int64_t gx = int64_t(g) * heads_per_group;
  copy_head_rows<act_t, kThreads>(xnew, ts, static_cast<const act_t*>(p.x) + b * p.x_batch_stride + gx * p.x_head_stride,
                                  p.x_token_stride, p.x_head_stride, p.headdim, row_begin, nrows, T, io_vec);
  if (p.z)
    copy_head_rows<act_t, kThreads>(znew, ts, static_cast<const act_t*>(p.z) + b * p.z_batch_stride + gx * p.z_head_stride,
                                    p.z_token_stride, p.z_head_stride, p.headdim, row_begin, nrows, T, io_vec);
  copy_head_rows<act_t, kThreads>(Craw, kN, static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride,
                                  p.C_token_stride, 0, kN, 0, kN, T, io_vec);
  copy_head_rows<act_t, kThreads>(Bnew, kN, static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride,
                                  p.B_token_stride, 0, kN, 0, kN, T, io_vec);
  // Every load of the prologue is issued before any value is stored (one round trip): the heads' D and A into
  // registers, the committed ring by cp.async, then the dt loop, whose stores wait for their loads (a load whose
  // value is stored to shared memory holds its thread). Before, D and A came after the dt loop and the committed
  // ring after both: up to three trips in sequence. (nheads_block <= kThreads; A here, beside the inputs, not a
  // round trip after the barrier.)
  float Dh = 0.f, Ah = 0.f;
  if (threadIdx.x < nheads_block) {
    if (p.D) Dh = p.D[h0 + threadIdx.x];
    Ah = p.A[h0 + threadIdx.x];
  }
  RSSM_DEVICE_CHECK(T >= 1 && T <= Tmax, "mamba2_replay_verify: num_tokens[%d] = %d is outside [1, T = %d]", b, T, Tmax);
  RSSM_DEVICE_CHECK(w0 >= 0 && w0 <= L, "mamba2_replay_verify: cursor[%lld] = %d is outside [0, ring_len]", (long long)slot, w0);
  const bool early = w0 + T > L;    // fold the committed history first
  const int base = early ? 0 : w0;  // ring position of token 0
  copy_head_rows<act_t, kThreads>(xold, ts, static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + gx * c.ring_x_head_stride,
                                  c.ring_x_pos_stride, c.ring_x_head_stride, p.headdim, row_begin, nrows, w0, io_vec);
  copy_head_rows<act_t, kThreads>(Bold, kN, static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride,
                                  c.ring_B_pos_stride, 0, kN, 0, kN, w0, io_vec);
  for (int idx = threadIdx.x; idx < nheads_block * w0; idx += kThreads) {
    const int hl = idx / w0, j = idx % w0;
    cp_async4(&dtold[hl * L + j], &c.ring_dt[slot * c.ring_dt_slot_stride + j * c.ring_dt_pos_stride + h0 + hl]);
  }
  for (int idx = threadIdx.x; idx < nheads_block * T; idx += kThreads) {
    const int hl = idx / T, k = idx % T, h = h0 + hl;
    dtnew[hl * Tmax + k] = process_dt(to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + k * p.dt_token_stride + h * p.dt_head_stride]),
                                      p.dt_bias ? p.dt_bias[h] : 0.f, p.dt_softplus, p.dt_min, p.dt_max);
  }
  if (threadIdx.x < nheads_block) Ds[threadIdx.x] = Dh, As[threadIdx.x] = Ah;
  cp_async_commit();
  // The fold count (stochastic rounding's Philox counter; narrow checkpoints): read by every thread, and the
  // load consumed, before the block counts in, since the slot's last block increments it.
  uint32_t fold_no = 0;
  if constexpr (kNarrow) {
    if (c.fold_count != nullptr) {
      fold_no = uint32_t(c.fold_count[slot]);
      if (fold_no == 0xffffffffu) __trap();  // (consumes the load before the barrier; 2^32 folds do not happen)
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // tiles written; every thread of the block has read the cursor (and the fold count)
  if (threadIdx.x == 0) {
    const int blocks_per_row = gridDim.x * gridDim.y;
    *last_flag = atomicAdd(&c.arrivals[slot], 1) == blocks_per_row - 1;
  }

  // ---- Block scalars. Positions after the (early) fold: j < base are committed entries, j >= base the window.
  for (int idx = threadIdx.x; idx < T * kN; idx += kThreads) Cf[idx] = to_float(Craw[idx]);
  auto dt_at = [&](int hl, int j) { return j < base ? dtold[hl * L + j] : dtnew[hl * Tmax + j - base]; };
  {  // B_j . C_k for j <= t_k: 8 lanes per pair, kPer contiguous elements each (every lane of a warp runs the
     // same trip count: the shuffles take the whole warp)
    constexpr int kPer = kN / 8;
    const int npairs = T * (base + T), lane8 = lane & 7;
    for (int first = warp * 4; first < npairs; first += kThreads / 8) {
      const int idx = first + (lane >> 3), k = idx / (base + T), j = idx % (base + T);
      const bool live = idx < npairs && j <= base + k;
      float acc = 0.f;
      if (live) {
        const act_t* Bj = (j < base ? Bold + j * kN : Bnew + (j - base) * kN) + lane8 * kPer;
        const act_t* Ck = Craw + k * kN + lane8 * kPer;
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc = fmaf(to_float(Bj[e]), to_float(Ck[e]), acc);
      }
      acc = group_sum<8>(acc);
      if (live && lane8 == 0) bc[k * L + j] = acc;
    }
  }
  __syncthreads();
  // The decay weights: W[k][j] = exp(c_t - c_j) dt_j (B_j . C_k) for j <= t, zero past the token (the ring sums below
  // run to base + T); deck[k] = exp(c_t). A thread per (head, k) runs j from t down to 0, so each suffix sum
  // dt_t + ... + dt_{j+1} is the previous one plus one term: replay_decays' order (the CPU's values), the same bits as
  // a thread per (head, k, j) summing its suffix from scratch (the form before this change: four such serial chains
  // a thread at the benchmark's 8 heads, T = 4, ring 16), and the exponentials independent of each other. The pairs
  // are spread over the warps (lane-major). An early fold's weights below stay a thread per (head, j < w0).
  {
    static_assert(kThreads % 32 == 0, "whole warps: lane * kWarps + warp covers [0, kThreads)");
    constexpr int kWarps = kThreads / 32;
    const int P = base + T;
    for (int idx = lane * kWarps + warp; idx < nheads_block * T; idx += kThreads) {
      const int hl = idx / T, k = idx % T, t = base + k;
      const float A = As[hl];
      float* Wk = W + (hl * Tmax + k) * L;
      for (int j = t + 1; j < P; ++j) Wk[j] = 0.f;
      float suffix = 0.f;
#pragma unroll 4
      for (int j = t; j >= 0; --j) {
        const float dtj = dt_at(hl, j);
        Wk[j] = expf(A * suffix) * dtj * bc[k * L + j];
        suffix += dtj;
      }
      deck[hl * Tmax + k] = expf(A * suffix);  // (suffix = dt_t + ... + dt_0: the bits of the j == 0 term's sum)
    }
  }
  if (early) {
    for (int idx = threadIdx.x; idx < nheads_block * w0; idx += kThreads) {
      const int hl = idx / w0, j = idx % w0;
      const float A = As[hl];
      float suffix = 0.f;
      for (int i = w0 - 1; i > j; --i) suffix += dtold[hl * L + i];
      wf[hl * L + j] = expf(A * suffix) * dtold[hl * L + j];
      if (j == 0) decf[hl] = expf(A * (suffix + dtold[hl * L]));
    }
    if (w0 == 0 && threadIdx.x < nheads_block) decf[threadIdx.x] = 1.f;  // (an empty committed ring)
  }
  __syncthreads();

  // The ring's part of every output, a thread per row: yr[k][row] = sum_j W[k][j] x_j[row] (W is zero past
  // the token). The row loop then only forms exp(c_t) (S_c C_k), in chunks of kTok tokens.
  for (int rl = threadIdx.x; rl < nrows; rl += kThreads) {
    const int hl = (row_begin + rl) / p.headdim - head_begin;
    for (int k0 = 0; k0 < T; k0 += 4) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      const float* Wk = W + (hl * Tmax + k0) * L;
      const int j_end = base + min(k0 + 4, T);
      for (int j = 0; j < j_end; ++j) {
        const float xj = to_float(j < base ? xold[j * ts + rl] : xnew[(j - base) * ts + rl]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          if (k0 + kk < T) acc[kk] = fmaf(Wk[kk * L + j], xj, acc[kk]);
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        if (k0 + kk < T) yr[(k0 + kk) * ts + rl] = acc[kk];
    }
  }
  // Tokens per chunk: one per group of kLanes / kTok lanes after the reduce-scatter. C of the first chunk stays
  // in registers when it fits in 64 (else, and for later chunks, it is read from shared memory per row).
  constexpr int kTok = kLanes < 4 ? kLanes : 4;
  constexpr bool kCRegs = kTok * kCols <= 64;
  float Creg[kCRegs ? kTok : 1][kCols];
  if constexpr (kCRegs) {
#pragma unroll
    for (int k = 0; k < kTok; ++k)
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
#pragma unroll
        for (int e = 0; e < kVec; ++e) Creg[k][v * kVec + e] = k < T ? Cf[k * kN + Layout::col(lane_in_row, v, e)] : 0.f;
  }
  const int my_tok = lane_in_row / (kLanes / kTok);         // the chunk's token whose sum this lane ends with
  const bool writer = lane_in_row % (kLanes / kTok) == 0;  // one lane of those writes it
  __syncthreads();  // yr written

  // ---- Stream the block's rows: fold (early), then the T outputs.
  act_t* const out_block = static_cast<act_t*>(p.out) + b * p.out_batch_stride + int64_t(h0) * p.out_head_stride;  // (kLean)
  RowPos pos = pos0;
  for (int it = 0; it < n_iter; ++it) {
    cp_async_wait<kStages - 1>();  // this thread's vectors of iteration `it` have landed (it + 1 .. it + kStages - 1 may be
                                   // pending; the prologue waited for all of its groups)
    const RowPos q = pos;
    pos.advance<Layout::kRowsPerIter>(p.headdim);
    const bool valid = q.r < row_end;
    const int hl = valid ? q.hl : 0, rl = valid ? q.r - row_begin : 0;
    float s[kCols];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      float part[kVec];
      unpack16<src_t>(staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x], part);
#pragma unroll
      for (int e = 0; e < kVec; ++e) s[v * kVec + e] = (kLean || valid) ? part[e] : 0.f;
    }
    issue(it + kStages);  // into the stage just read (this thread's reads of it come first in program order)
    if (early) {  // S_c <- exp(c_w) S_c + sum_{j<w} exp(c_w - c_j) dt_j x_j B_j, stored as the checkpoint stores it
      if constexpr (kView) {  // from this lane's columns of the fp32 master row (the view served the staging)
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < kVec; e += 4) {
            const float4 m = valid ? __ldcs(reinterpret_cast<const float4*>(ckpt_row(q) + Layout::col(lane_in_row, v, e)))
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
            s[v * kVec + e] = m.x, s[v * kVec + e + 1] = m.y, s[v * kVec + e + 2] = m.z, s[v * kVec + e + 3] = m.w;
          }
      }
      const float dcy = decf[hl];
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] *= dcy;
      for (int j = 0; j < w0; ++j) {  // (Bold: a 16-byte-aligned tile, rows of kN, a multiple of 8: axpy_vec's alignment)
        const float a = wf[hl * L + j] * to_float(xold[j * ts + rl]);
        if constexpr (sizeof(act_t) == 2)
          Layout::axpy_vec(a, Bold + j * kN, lane_in_row, s);
        else
          Layout::axpy(a, Bold + j * kN, lane_in_row, s);
      }
      if constexpr (kView) {  // the fp32 master and its bf16 view (rounded to nearest); the outputs use the view's
        if (valid) {
          Layout::store_master_and_view(ckpt_row(q), src_row(q), lane_in_row, s);
        }
#pragma unroll
        for (int col = 0; col < kCols; ++col) s[col] = to_float(from_float<src_t>(s[col]));
      } else {
        if constexpr (kNarrow) {
          if (c.sr_seed != nullptr) {  // stochastic rounding: Philox keyed by the slot's seed, its fold count, the element
            const uint64_t seed = uint64_t(c.sr_seed[slot]);
            const int64_t row_index = (int64_t(h0 + hl) * p.headdim + q.i) * kN;
#pragma unroll
            for (int v = 0; v < kVecs; ++v)
#pragma unroll
              for (int e = 0; e < kVec; ++e)
                s[v * kVec + e] = stochastic_round_to(c.ckpt_dtype, s[v * kVec + e],
                                                      fold_random(seed, fold_no, uint64_t(row_index + Layout::col(lane_in_row, v, e))));
          }
        }
#pragma unroll
        for (int col = 0; col < kCols; ++col) s[col] = to_float(from_float<ckpt_t>(s[col]));
        if (valid) Layout::store_row(ckpt_row(q), lane_in_row, s);
      }
    }
    // The outputs, kTok tokens at a time: this lane's columns of the row against C_k, reduce-scattered over
    // the row's lanes (each lane group ends with one token's sum), and its writer lane adds the rest.
    auto chunk = [&](const int k0, auto from_regs) {
      float sc[kTok];
#pragma unroll
      for (int kk = 0; kk < kTok; ++kk) {
        sc[kk] = 0.f;
        if constexpr (decltype(from_regs)::value) {
#pragma unroll
          for (int col = 0; col < kCols; ++col) sc[kk] = fmaf(s[col], Creg[kk][col], sc[kk]);
        } else {
          const float* Ck = Cf + min(k0 + kk, T - 1) * kN;  // (a token past T: any finite C; its sum is not written)
#pragma unroll
          for (int v = 0; v < kVecs; ++v)
#pragma unroll
            for (int e = 0; e < kVec; e += 4) {
              const float4 cv = *reinterpret_cast<const float4*>(Ck + Layout::col(lane_in_row, v, e));
              sc[kk] = fmaf(s[v * kVec + e], cv.x, sc[kk]);
              sc[kk] = fmaf(s[v * kVec + e + 1], cv.y, sc[kk]);
              sc[kk] = fmaf(s[v * kVec + e + 2], cv.z, sc[kk]);
              sc[kk] = fmaf(s[v * kVec + e + 3], cv.w, sc[kk]);
            }
        }
      }
      const float sum = reduce_scatter<kLanes, kTok>(sc, lane_in_row);
      const int k = k0 + my_tok;
      if (valid && writer && k < T) {
        float y = fmaf(deck[hl * Tmax + k], sum, yr[k * ts + rl]);
        y = fmaf(Ds[hl], to_float(xnew[k * ts + rl]), y);
        if (p.z) y *= silu_fast(to_float(znew[k * ts + rl]));  // (the row loop's instructions: see silu_fast)
        if constexpr (kLean)
          out_block[k * int(p.out_token_stride) + hl * int(p.out_head_stride) + q.i] = from_float<act_t>(y);
        else
          static_cast<act_t*>(p.out)[b * p.out_batch_stride + k * p.out_token_stride + (h0 + hl) * p.out_head_stride + q.i] =
              from_float<act_t>(y);
      }
    };
    if constexpr (kCRegs) {
      chunk(0, std::true_type{});
      for (int k0 = kTok; k0 < T; k0 += kTok) chunk(k0, std::false_type{});
    } else {
      for (int k0 = 0; k0 < T; k0 += kTok) chunk(k0, std::false_type{});
    }
  }
  cp_async_wait<0>();  // (only empty groups remain)
  // This block's rows of the window's x into the ring (its reads of the committed entries are done).
  act_t* ring_x_w = static_cast<act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + gx * c.ring_x_head_stride;
  if (io_vec) {
    constexpr int kV = 16 / sizeof(act_t);
    const int nv = nrows / kV;
    for (int idx = threadIdx.x; idx < T * nv; idx += kThreads) {
      const int k = idx / nv, r = (idx % nv) * kV;
      *reinterpret_cast<uint4*>(ring_x_w + (base + k) * c.ring_x_pos_stride + row_begin + r) =
          *reinterpret_cast<const uint4*>(xnew + k * ts + r);
    }
  } else {
    for (int idx = threadIdx.x; idx < T * nrows; idx += kThreads) {
      const int k = idx / nrows, r = row_begin + idx % nrows;
      ring_x_w[(base + k) * c.ring_x_pos_stride + (r / p.headdim) * c.ring_x_head_stride + r % p.headdim] = xnew[k * ts + r - row_begin];
    }
  }
  __syncthreads();
  if (*last_flag) {  // every block of the slot has read the committed entries: write the window's B and dt
    // (copy_batched: a thread's loads issued together, not one round trip per element)
    act_t* ring_B_w = static_cast<act_t*>(c.ring_B) + slot * c.ring_B_slot_stride;
    const act_t* Ball = static_cast<const act_t*>(p.B) + b * p.B_batch_stride;
    // Element (per_idx 1) or vector (per_idx elements) idx of the window's B, rows (k, group) of kN: its offsets.
    auto B_at = [&](int idx, int per_idx, int64_t& src, int64_t& dst) {
      const int row = idx / (kN / per_idx), n = idx % (kN / per_idx) * per_idx, k = row / p.ngroups, gg = row - k * p.ngroups;
      src = k * p.B_token_stride + gg * p.B_group_stride + n;
      dst = (base + k) * c.ring_B_pos_stride + gg * c.ring_B_group_stride + n;
    };
    if (io_vec) {  // 16-byte vectors (io_vec: B's and the ring's bases and strides are multiples of 16 bytes)
      constexpr int kV = 16 / sizeof(act_t);
      copy_batched<kThreads, 4>(T * p.ngroups * (kN / kV),
          [&](int idx) { int64_t src, dst; B_at(idx, kV, src, dst); return *reinterpret_cast<const uint4*>(Ball + src); },
          [&](int idx, const uint4& v) { int64_t src, dst; B_at(idx, kV, src, dst); *reinterpret_cast<uint4*>(ring_B_w + dst) = v; });
    } else {
      copy_batched<kThreads, 8>(T * p.ngroups * kN,
          [&](int idx) { int64_t src, dst; B_at(idx, 1, src, dst); return Ball[src]; },
          [&](int idx, const act_t& v) { int64_t src, dst; B_at(idx, 1, src, dst); ring_B_w[dst] = v; });
    }
    copy_batched<kThreads, 4>(T * p.nheads,
        [&](int idx) {  // (dt as the token carries it, and its bias)
          const int k = idx / p.nheads, h = idx - k * p.nheads;
          return make_float2(to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + k * p.dt_token_stride + h * p.dt_head_stride]),
                             p.dt_bias ? p.dt_bias[h] : 0.f);
        },
        [&](int idx, const float2& v) {
          const int k = idx / p.nheads, h = idx - k * p.nheads;
          c.ring_dt[slot * c.ring_dt_slot_stride + (base + k) * c.ring_dt_pos_stride + h] = process_dt(v.x, v.y, p.dt_softplus, p.dt_min, p.dt_max);
        });
    if (threadIdx.x == 0) {
      atomicSub(&c.arrivals[slot], gridDim.x * gridDim.y);  // zero again for the next launch
      if (early) c.cursor[slot] = 0;
      // (an fp32 checkpoint's kernel reads the count nowhere else: no block of the slot reads it in this launch)
      if (early && c.fold_count) c.fold_count[slot] = (kNarrow ? int(fold_no) : c.fold_count[slot]) + 1;
      if (c.pending) c.pending[slot] = T;
    }
  }
}

// Launch: 128 threads, the replay step's row layout (StreamLanes) with 3 stages (the v10 replay step's depth:
// 3 blocks x 128 threads x 3 x 64 B = 72 KiB in flight per SM; the 6 of kStreamStages took 48 KiB of a block's
// shared memory, which cut blocks to 64 rows at T = 4, L = 32, and every block repeats the block scalars: ncu
// at batch 256, 2026-11-29, had 32768 blocks and the prologue as half the samples), 512 rows per block at most,
// fewer when that keeps three blocks on an SM within its shared memory, or when the grid would not fill the
// GPU. (The cap was 256 until session 23: at the benchmark's 12-token ring, T = 4, 512 rows fit three blocks per
// SM (62.6 KiB) and halve the blocks' prologues: 463 -> 433 us at batch 256, 258 -> 252 at 128; at a 32-token ring
// the shared-memory rule below brings them back to 256, where session 4 had 512 rows 8-10% slower.)
// REPLAYSSM_TUNE: verify_rows (rows per block). src_t: what the row loop streams (the checkpoint, or its
// bf16 output view).
template <typename ckpt_t, typename src_t, typename act_t, int kN>
void launch_mamba2_replay_verify(const Mamba2ReplayVerifyParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128, kStages = 3, kMinBlocks = 3;
  constexpr int kLanes = StreamLanes<src_t, kN>::value;
  using Layout = RowLayout<src_t, kN, kThreads, 1, kLanes>;
  const Mamba2ReplayCacheParams& c = p.cache;
  const int group_rows = (p.nheads / p.ngroups) * p.headdim;
  const int64_t groups_total = int64_t(p.batch) * p.ngroups;
  auto round_rows = [&](int64_t r) {
    return int((std::max<int64_t>(r, Layout::kRowsPerIter) + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter * Layout::kRowsPerIter);
  };
  // Enough blocks for ~2 waves of three blocks per SM, at most 512 rows, at most kThreads - 1 heads, the group's rows
  // then split evenly over its blocks. (~4 waves until session 23: at batch 32 that gave blocks of 176 rows, six per
  // group with a ragged last one, where blocks of 256 ran 0.5-5% faster in the same run; fewer, longer blocks repeat
  // the per-block prologue less.)
  int rows_per_block = round_rows((groups_total * group_rows + int64_t(num_sms()) * 6 - 1) / (int64_t(num_sms()) * 6));
  rows_per_block = std::min({rows_per_block, 512, group_rows, (kThreads - 1) * p.headdim});
  {
    const int blocks_per_group = (group_rows + rows_per_block - 1) / rows_per_block;
    rows_per_block = std::min(rows_per_block, round_rows((group_rows + blocks_per_group - 1) / blocks_per_group));
  }
  const int forced_rows = tune_knob("verify_rows");
  if (forced_rows > 0)  // (at most kThreads - 1 heads here too: the prologue takes a thread per head)
    rows_per_block = std::min({round_rows(forced_rows), std::max(group_rows, Layout::kRowsPerIter), (kThreads - 1) * p.headdim});
  auto heads_for = [&](int r) { return std::min((r + p.headdim - 1) / p.headdim + 1, p.nheads / p.ngroups); };
  auto smem_for = [&](int r) {
    return VerifySmem(kStages * Layout::kVecsPerLane * kThreads * 16, sizeof(act_t), r, kN, c.ring_len, p.ntokens, heads_for(r)).total;
  };
  const int device_smem = max_smem_per_block();
  const int per_block_target = smem_per_sm() / kMinBlocks - 1024;  // the driver reserves 1 KiB per block
  while (forced_rows <= 0 && smem_for(rows_per_block) > per_block_target && rows_per_block > 64)
    rows_per_block = round_rows(rows_per_block / 2);
  while (smem_for(rows_per_block) > device_smem && rows_per_block > Layout::kRowsPerIter)
    rows_per_block = round_rows(rows_per_block / 2);
  if (smem_for(rows_per_block) > device_smem)
    throw std::invalid_argument("replayssm: mamba2_replay_verify needs more shared memory than the device has for this shape");
  constexpr int kV = 16 / sizeof(act_t);
  const bool io_vec = p.headdim % kV == 0 && rows_per_block % kV == 0 && kN % kV == 0 && aligned16(p.x) && aligned16(p.B) &&
                      aligned16(p.C) && aligned16(c.ring_x) && aligned16(c.ring_B) && p.x_head_stride == p.headdim &&
                      p.x_batch_stride % kV == 0 && p.x_token_stride % kV == 0 && p.B_batch_stride % kV == 0 &&
                      p.B_token_stride % kV == 0 && p.B_group_stride % kV == 0 && p.C_batch_stride % kV == 0 &&
                      p.C_token_stride % kV == 0 && p.C_group_stride % kV == 0 && c.ring_x_head_stride == p.headdim &&
                      c.ring_x_slot_stride % kV == 0 && c.ring_x_pos_stride % kV == 0 && c.ring_B_slot_stride % kV == 0 &&
                      c.ring_B_pos_stride % kV == 0 && c.ring_B_group_stride % kV == 0 &&
                      (!p.z || (aligned16(p.z) && p.z_head_stride == p.headdim && p.z_batch_stride % kV == 0 && p.z_token_stride % kV == 0));
  // kLean's 32-bit offsets: a block's rows within a group of heads, and the outputs of a batch row.
  const bool view = !std::is_same_v<src_t, ckpt_t>;
  const int64_t head_stride = view ? c.view_head_stride : c.ckpt_head_stride, row_stride = view ? c.view_row_stride : c.ckpt_row_stride;
  const bool offsets_fit = int64_t(p.nheads / p.ngroups) * head_stride + int64_t(p.headdim) * row_stride < (int64_t(1) << 31) &&
                           int64_t(p.ntokens) * p.out_token_stride + int64_t(p.nheads) * p.out_head_stride < (int64_t(1) << 31);
  auto kernel = tune_knob("stream_lean") != 0 && offsets_fit
                    ? mamba2_replay_verify_kernel<ckpt_t, src_t, act_t, kN, kThreads, kStages, kLanes, kMinBlocks, true>
                    : mamba2_replay_verify_kernel<ckpt_t, src_t, act_t, kN, kThreads, kStages, kLanes, kMinBlocks, false>;
  const int smem_bytes = smem_for(rows_per_block);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes), "mamba2_replay_verify shared memory");
  const dim3 grid((group_rows + rows_per_block - 1) / rows_per_block, p.ngroups, p.batch);
  kernel<<<grid, kThreads, smem_bytes, stream>>>(p, rows_per_block, heads_for(rows_per_block), io_vec);
  check_cuda(cudaGetLastError(), "mamba2_replay_verify kernel launch");
}

template <DType kCkpt>
void mamba2_replay_verify_cuda_for_ckpt(const Mamba2ReplayVerifyParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] {
      using act_t = typename CudaType<kAct>::type;
      if (p.cache.view == nullptr) return launch_mamba2_replay_verify<ckpt_t, ckpt_t, act_t, kN>(p, stream);
      // The numerical split's output view (bf16, of an fp32 checkpoint) streamed for the outputs.
      if constexpr (kCkpt == DType::kFloat32) return launch_mamba2_replay_verify<float, __nv_bfloat16, act_t, kN>(p, stream);
      throw std::invalid_argument("replayssm: on CUDA the output view must be of an fp32 checkpoint");
    });
  });
}

}  // namespace replayssm
