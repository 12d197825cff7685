// CUDA kernel of speculative verification (MATH.md, "Verifying T tokens at once"), the same semantics as
// replay_verify_cpu in cpu.cpp: when cursor + T > ring_len the committed history is folded first
// (checkpoint <- state at the cursor, cursor <- 0); the T tentative tokens go into the ring after the cursor;
// token k (ring position t = base + k) gets
//   y_k = exp(c_t) (S_c C_k) + sum_{j<=t} exp(c_t - c_j) dt_j (B_j . C_k) x_j + D x_k   (* silu(z_k))
// No intermediate state is formed. Non-fold rows never write the checkpoint.
//
// Grid (row chunks of a group, G, batch), like the replay step. A block reads what it needs of the ring
// (the committed entries; the window's entries come from the inputs) into shared memory, then counts in on the
// slot's arrival counter. The slot's last block to arrive writes the window's B and dt into the ring and the
// new cursor and pending count (every block of the slot has read the old entries by then, and nobody reads
// the new ones in this launch); each block writes its own rows' x into the ring.
#pragma once

#include <algorithm>

#include "kernels.cuh"

namespace replayssm {

struct VerifySmem {  // byte offsets, each section 16-byte aligned
  int ts;             // elements per row tile (rows of the block, padded)
  int Cs, Bnew, Bold, dtold, dtnew, xold, xnew, znew, wf, decf, bc, W, deck, Ds, flag, total;
  __host__ __device__ VerifySmem(int act_bytes, int rows, int dstate, int ring_len, int T, int heads) {
    auto up = [](int v) { return (v + 15) / 16 * 16; };
    ts = rows + 1;
    int o = 0;
    Cs = o, o += up(T * dstate * 4);              // [k][n] C_k
    Bnew = o, o += up(T * dstate * 4);            // [k][n] B_k of the window
    Bold = o, o += up(ring_len * dstate * 4);     // [j][n] committed ring B_j
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
    flag = o, o += 16;                            // [0] this block arrived last
    total = o;
  }
};

template <typename ckpt_t, typename act_t, int kN, int kThreads>
__global__ void __launch_bounds__(kThreads)
    mamba2_replay_verify_kernel(const Mamba2ReplayVerifyParams p, const int rows_per_block, const int max_heads) {
  using Layout = RowLayout<ckpt_t, kN, kThreads, 1, ReplayLanes<ckpt_t, kN>::value>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane;
  const Mamba2ReplayCacheParams& c = p.cache;
  const int b = blockIdx.z, g = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_replay_verify: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int L = c.ring_len, Tmax = p.ntokens;
  const int T = p.num_tokens ? p.num_tokens[b] : Tmax;
  RSSM_DEVICE_CHECK(T >= 1 && T <= Tmax, "mamba2_replay_verify: num_tokens[%d] = %d is outside [1, T = %d]", b, T, Tmax);
  const int w0 = c.cursor[slot];
  RSSM_DEVICE_CHECK(w0 >= 0 && w0 <= L, "mamba2_replay_verify: cursor[%lld] = %d is outside [0, ring_len]", (long long)slot, w0);
  const bool early = w0 + T > L;  // fold the committed history first
  const int base = early ? 0 : w0;  // ring position of token 0

  const int heads_per_group = p.nheads / p.ngroups;
  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(heads_per_group * p.headdim, row_begin + rows_per_block);
  const int nrows = row_end - row_begin;
  const int head_begin = row_begin / p.headdim;
  const int nheads_block = (row_end - 1) / p.headdim - head_begin + 1;
  const int h0 = g * heads_per_group + head_begin;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const VerifySmem off(sizeof(act_t), rows_per_block, kN, L, Tmax, max_heads);
  float* Cs = reinterpret_cast<float*>(smem_raw + off.Cs);
  float* Bnew = reinterpret_cast<float*>(smem_raw + off.Bnew);
  float* Bold = reinterpret_cast<float*>(smem_raw + off.Bold);
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
  int* last_flag = reinterpret_cast<int*>(smem_raw + off.flag);
  const int ts = off.ts;

  // ---- Inputs of the window and the committed ring into shared memory.
  auto row_off = [&](int r, int64_t head_stride) { return int64_t(g * heads_per_group + r / p.headdim) * head_stride + r % p.headdim; };
  const act_t* Bin = static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride;
  const act_t* Cin = static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride;
  for (int idx = threadIdx.x; idx < T * kN; idx += kThreads) {
    const int k = idx / kN, n = idx % kN;
    Cs[idx] = to_float(Cin[k * p.C_token_stride + n]);
    Bnew[idx] = to_float(Bin[k * p.B_token_stride + n]);
  }
  const act_t* ring_B = static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride;
  for (int idx = threadIdx.x; idx < w0 * kN; idx += kThreads)
    Bold[idx] = to_float(ring_B[(idx / kN) * c.ring_B_pos_stride + idx % kN]);
  for (int idx = threadIdx.x; idx < nheads_block * w0; idx += kThreads) {
    const int hl = idx / w0, j = idx % w0;
    dtold[hl * L + j] = c.ring_dt[slot * c.ring_dt_slot_stride + j * c.ring_dt_pos_stride + h0 + hl];
  }
  for (int idx = threadIdx.x; idx < nheads_block * T; idx += kThreads) {
    const int hl = idx / T, k = idx % T, h = h0 + hl;
    dtnew[hl * Tmax + k] = process_dt(to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + k * p.dt_token_stride + h * p.dt_head_stride]),
                                      p.dt_bias ? p.dt_bias[h] : 0.f, p.dt_softplus, p.dt_min, p.dt_max);
  }
  const act_t* ring_x = static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride;
  for (int idx = threadIdx.x; idx < w0 * nrows; idx += kThreads) {
    const int j = idx / nrows, rl = idx % nrows;
    xold[j * ts + rl] = ring_x[j * c.ring_x_pos_stride + row_off(row_begin + rl, c.ring_x_head_stride)];
  }
  const act_t* xin = static_cast<const act_t*>(p.x) + b * p.x_batch_stride;
  const act_t* zin = static_cast<const act_t*>(p.z) + b * p.z_batch_stride;
  for (int idx = threadIdx.x; idx < T * nrows; idx += kThreads) {
    const int k = idx / nrows, rl = idx % nrows;
    xnew[k * ts + rl] = xin[k * p.x_token_stride + row_off(row_begin + rl, p.x_head_stride)];
    if (p.z) znew[k * ts + rl] = zin[k * p.z_token_stride + row_off(row_begin + rl, p.z_head_stride)];
  }
  for (int hl = threadIdx.x; hl < nheads_block; hl += kThreads) Ds[hl] = p.D ? p.D[h0 + hl] : 0.f;
  __syncthreads();  // every thread has read the cursor and its ring entries
  if (threadIdx.x == 0) {
    const int blocks_per_row = gridDim.x * gridDim.y;
    *last_flag = atomicAdd(&c.arrivals[slot], 1) == blocks_per_row - 1;
  }

  // ---- Block scalars. Positions after the (early) fold: j < base are committed entries, j >= base the window.
  auto dt_at = [&](int hl, int j) { return j < base ? dtold[hl * L + j] : dtnew[hl * Tmax + j - base]; };
  for (int idx = warp; idx < T * (base + T); idx += Layout::kWarps) {  // a warp per (k, j)
    const int k = idx / (base + T), j = idx % (base + T);
    if (j > base + k) continue;
    const float* Bj = j < base ? Bold + j * kN : Bnew + (j - base) * kN;
    float acc = 0.f;
    for (int n = lane; n < kN; n += 32) acc = fmaf(Bj[n], Cs[k * kN + n], acc);
    acc = group_sum<32>(acc);
    if (lane == 0) bc[k * L + j] = acc;
  }
  if (early) {  // a thread per (head, j): the fold's decays, summed as replay_decays sums them
    for (int idx = threadIdx.x; idx < nheads_block * w0; idx += kThreads) {
      const int hl = idx / w0, j = idx % w0;
      const float A = p.A[h0 + hl];
      float suffix = 0.f;
      for (int m = w0 - 1; m > j; --m) suffix += dtold[hl * L + m];
      wf[hl * L + j] = expf(A * suffix) * dtold[hl * L + j];
      if (j == 0) decf[hl] = expf(A * (suffix + dtold[hl * L]));
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nheads_block * T * (base + T); idx += kThreads) {  // a thread per (head, k, j)
    const int hl = idx / (T * (base + T)), rem = idx % (T * (base + T)), k = rem / (base + T), j = rem % (base + T);
    const int t = base + k;
    if (j > t) continue;
    const float A = p.A[h0 + hl];
    float suffix = 0.f;
    for (int m = t; m > j; --m) suffix += dt_at(hl, m);
    W[(hl * Tmax + k) * L + j] = expf(A * suffix) * dt_at(hl, j) * bc[k * L + j];
    if (j == 0) deck[hl * Tmax + k] = expf(A * (suffix + dt_at(hl, 0)));
  }
  __syncthreads();

  // ---- Rows: fold (early), then the T outputs.
  ckpt_t* ckpt = static_cast<ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride;
  for (int r0 = row_begin; r0 < row_end; r0 += Layout::kRowsPerIter) {
    const int r = r0 + warp * Layout::kRowsPerWarp + row_in_warp;
    const bool valid = r < row_end;
    const int rl = valid ? r - row_begin : 0;
    const int hl = valid ? r / p.headdim - head_begin : 0, i = r % p.headdim, h = h0 + hl;
    ckpt_t* row = ckpt + int64_t(h) * c.ckpt_head_stride + int64_t(i) * c.ckpt_row_stride;
    float s[kCols];
    Layout::load_row(row, lane_in_row, valid, s);
    if (early) {  // S_c <- exp(c_w) S_c + sum_{j<w} exp(c_w - c_j) dt_j x_j B_j, stored as the checkpoint stores it
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] *= decf[hl];
      for (int j = 0; j < w0; ++j) {
        const float coef = wf[hl * L + j] * to_float(xold[j * ts + rl]);
        Layout::axpy(coef, Bold + j * kN, lane_in_row, s);
      }
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] = to_float(from_float<ckpt_t>(s[col]));
      if (valid) Layout::store_row(row, lane_in_row, s);
    }
    for (int k = 0; k < T; ++k) {
      const int t = base + k;
      float sc = 0.f;
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
#pragma unroll
        for (int e = 0; e < Layout::kVec; ++e) sc = fmaf(s[v * Layout::kVec + e], Cs[k * kN + Layout::col(lane_in_row, v, e)], sc);
      const float* Wk = W + (hl * Tmax + k) * L;
      float y = deck[hl * Tmax + k] * sc;
      for (int j = lane_in_row; j <= t; j += kLanes)
        y = fmaf(Wk[j], to_float(j < base ? xold[j * ts + rl] : xnew[(j - base) * ts + rl]), y);
      y = group_sum<kLanes>(y);
      if (valid && lane_in_row == 0) {
        y = fmaf(Ds[hl], to_float(xnew[k * ts + rl]), y);
        if (p.z) y *= silu(to_float(znew[k * ts + rl]));
        static_cast<act_t*>(p.out)[b * p.out_batch_stride + k * p.out_token_stride + h * p.out_head_stride + i] = from_float<act_t>(y);
      }
    }
  }
  // This block's rows of the window's x into the ring (its reads of the committed entries are done).
  act_t* ring_x_w = static_cast<act_t*>(c.ring_x) + slot * c.ring_x_slot_stride;
  for (int idx = threadIdx.x; idx < T * nrows; idx += kThreads) {
    const int k = idx / nrows, rl = idx % nrows;
    ring_x_w[(base + k) * c.ring_x_pos_stride + row_off(row_begin + rl, c.ring_x_head_stride)] = xnew[k * ts + rl];
  }
  __syncthreads();
  if (*last_flag) {  // every block of the slot has read the committed entries: write the window's B and dt
    act_t* ring_B_w = static_cast<act_t*>(c.ring_B) + slot * c.ring_B_slot_stride;
    const act_t* Ball = static_cast<const act_t*>(p.B) + b * p.B_batch_stride;
    for (int idx = threadIdx.x; idx < T * p.ngroups * kN; idx += kThreads) {
      const int k = idx / (p.ngroups * kN), gg = (idx / kN) % p.ngroups, n = idx % kN;
      ring_B_w[(base + k) * c.ring_B_pos_stride + gg * c.ring_B_group_stride + n] = Ball[k * p.B_token_stride + gg * p.B_group_stride + n];
    }
    for (int idx = threadIdx.x; idx < T * p.nheads; idx += kThreads) {
      const int k = idx / p.nheads, h = idx % p.nheads;
      c.ring_dt[slot * c.ring_dt_slot_stride + (base + k) * c.ring_dt_pos_stride + h] =
          process_dt(to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + k * p.dt_token_stride + h * p.dt_head_stride]),
                     p.dt_bias ? p.dt_bias[h] : 0.f, p.dt_softplus, p.dt_min, p.dt_max);
    }
    if (threadIdx.x == 0) {
      atomicSub(&c.arrivals[slot], gridDim.x * gridDim.y);  // zero again for the next launch
      if (early) c.cursor[slot] = 0;
      if (c.pending) c.pending[slot] = T;
    }
  }
}

template <typename ckpt_t, typename act_t, int kN>
void launch_mamba2_replay_verify(const Mamba2ReplayVerifyParams& p, cudaStream_t stream) {
  constexpr int kThreads = 128;
  using Layout = RowLayout<ckpt_t, kN, kThreads, 1, ReplayLanes<ckpt_t, kN>::value>;
  const int group_rows = (p.nheads / p.ngroups) * p.headdim;
  // Rows per block: a few hundred (shared-memory tiles of T + ring_len rows), enough blocks for every SM.
  const int64_t groups_total = int64_t(p.batch) * p.ngroups;
  int64_t rows = (groups_total * group_rows + int64_t(num_sms()) * 8 - 1) / (int64_t(num_sms()) * 8);
  rows = std::min<int64_t>(std::max<int64_t>(rows, Layout::kRowsPerIter), 256);
  rows = (rows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter * Layout::kRowsPerIter;
  int rows_per_block = static_cast<int>(std::min<int64_t>(rows, group_rows));
  auto heads_for = [&](int r) { return std::min((r + p.headdim - 1) / p.headdim + 1, p.nheads / p.ngroups); };
  auto smem_for = [&](int r) { return VerifySmem(sizeof(act_t), r, kN, p.cache.ring_len, p.ntokens, heads_for(r)).total; };
  const int device_smem = max_smem_per_block();
  while (smem_for(rows_per_block) > device_smem && rows_per_block > Layout::kRowsPerIter)
    rows_per_block = std::max(Layout::kRowsPerIter, rows_per_block / 2 / Layout::kRowsPerIter * Layout::kRowsPerIter);
  if (smem_for(rows_per_block) > device_smem)
    throw std::invalid_argument("replayssm: mamba2_replay_verify needs more shared memory than the device has for this shape");
  auto kernel = mamba2_replay_verify_kernel<ckpt_t, act_t, kN, kThreads>;
  const int smem_bytes = smem_for(rows_per_block);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes), "mamba2_replay_verify shared memory");
  const dim3 grid((group_rows + rows_per_block - 1) / rows_per_block, p.ngroups, p.batch);
  kernel<<<grid, kThreads, smem_bytes, stream>>>(p, rows_per_block, heads_for(rows_per_block));
  check_cuda(cudaGetLastError(), "mamba2_replay_verify kernel launch");
}

template <DType kCkpt>
void mamba2_replay_verify_cuda_for_ckpt(const Mamba2ReplayVerifyParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] { launch_mamba2_replay_verify<ckpt_t, typename CudaType<kAct>::type, kN>(p, stream); });
  });
}

}  // namespace replayssm
