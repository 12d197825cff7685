// CUDA kernels of the Gated DeltaNet decode ops (MATH.md, "Gated DeltaNet decode"; the CPU loops in cpu.cpp
// are the semantics). A block per (value head, batch row): it prepares the token (L2-normalised q and k of the
// key head, g, beta), then streams the value head's V state rows of K elements, kLanes lanes per row, each
// holding up to 32 of its columns as 16-byte vectors.
// First versions: correct, graph-safe, memory-bound by design (one pass over the state), not yet tuned
// (no load pipeline: each thread has one row in flight).
#pragma once

#include <string>

#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "../mamba2/kernels.cuh"  // RowLayout, ReplayLanes
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

// Standard step: S <- alpha S + u k^T with u = beta (v - alpha S k); o = S q. Reads and writes |S|.
template <typename state_t, typename act_t, int kK, int kThreads>
__global__ void __launch_bounds__(kThreads) gdn_step_kernel(const GdnStepParams p) {
  using Layout = RowLayout<state_t, kK, kThreads, 1, ReplayLanes<state_t, kK>::value>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane;
  const int hv = blockIdx.x, b = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  __shared__ float qn[kK], kn[kK], red[2 * kThreads / 32];
  float g, beta;
  gdn_prepare_token<act_t, kK, kThreads>(p, b, 0, hv, qn, kn, red, g, beta);
  const float alpha = expf(g);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  float kv[kCols], qv[kCols];
#pragma unroll
  for (int v = 0; v < kVecs; ++v)
#pragma unroll
    for (int e = 0; e < Layout::kVec; ++e) {
      kv[v * Layout::kVec + e] = kn[Layout::col(lane_in_row, v, e)];
      qv[v * Layout::kVec + e] = qn[Layout::col(lane_in_row, v, e)];
    }
  state_t* S = static_cast<state_t*>(p.state) + slot * p.state_slot_stride + int64_t(hv) * p.state_head_stride;
  const act_t* vin = static_cast<const act_t*>(p.v) + b * p.v_batch_stride + hv * p.v_head_stride;
  act_t* out = static_cast<act_t*>(p.out) + b * p.out_batch_stride + hv * p.out_head_stride;
  for (int r0 = 0; r0 < p.vdim; r0 += Layout::kRowsPerIter) {
    const int r = r0 + warp * Layout::kRowsPerWarp + row_in_warp;
    const bool valid = r < p.vdim;
    state_t* row = S + int64_t(valid ? r : 0) * p.state_row_stride;
    float s[kCols];
    Layout::load_row(row, lane_in_row, valid, s);
    const float vr = valid ? to_float(vin[r]) : 0.f;
    float Sk = 0.f;
#pragma unroll
    for (int col = 0; col < kCols; ++col) Sk = fmaf(s[col], kv[col], Sk);
    Sk = group_sum<kLanes>(Sk);
    const float u = beta * (vr - alpha * Sk);
    float o = 0.f;
#pragma unroll
    for (int col = 0; col < kCols; ++col) {
      s[col] = alpha * s[col] + u * kv[col];
      o = fmaf(s[col], qv[col], o);
    }
    o = group_sum<kLanes>(o);
    if (valid) {
      Layout::store_row(row, lane_in_row, s);
      if (lane_in_row == 0) out[r] = from_float<act_t>(o);
    }
  }
}

struct GdnReplaySmem {  // floats
  int qn, kn, red, rk, ru, weight, kk, kq, total;
  __host__ __device__ GdnReplaySmem(int K, int V, int L, int threads) {
    int o = 0;
    qn = o, o += K;
    kn = o, o += K;
    red = o, o += 2 * threads / 32;
    rk = o, o += L * K;  // [j][n] ring k_j of the key head
    ru = o, o += L * V;  // [j][r] ring u_j of the value head
    weight = o, o += L;  // [j] exp(g_{j+1} + ... + g_{w-1})
    kk = o, o += L;      // [j] k_j . k_t
    kq = o, o += L;      // [j] k_j . q_t
    total = o + 4;       // + ckpt decay, k_t . q_t
  }
};

// Replay step (MATH.md, "Replay form") at ring position w: S_{t-1} k_t and S_{t-1} q_t from the checkpoint (one
// pass) and the ring; u_t = beta (v_t - alpha S_{t-1} k_t); o_t = alpha S_{t-1} q_t + u_t (k_t . q_t). Appends
// (u_t, k_t, g_t) to the ring, or at a fold writes S_t = alpha S_{t-1} + u_t k_t^T to the checkpoint.
template <typename ckpt_t, typename act_t, int kK, int kThreads>
__global__ void __launch_bounds__(kThreads) gdn_replay_step_kernel(const GdnReplayParams p) {
  using Layout = RowLayout<ckpt_t, kK, kThreads, 1, ReplayLanes<ckpt_t, kK>::value>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane;
  const GdnReplayCacheParams& c = p.cache;
  const int hv = blockIdx.x, b = blockIdx.y, L = c.ring_len, V = p.vdim;
  const int h = hv / (p.nheads / p.nkheads);
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_replay_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int w = c.cursor[slot];
  RSSM_DEVICE_CHECK(w >= 0 && w < L, "gdn_replay_step: cursor[%lld] = %d is outside [0, ring_len)", (long long)slot, w);
  const bool fold = is_fold_step(w, L);
  extern __shared__ float sm[];
  const GdnReplaySmem off(kK, V, L, kThreads);
  float *qn = sm + off.qn, *kn = sm + off.kn, *rk = sm + off.rk, *ru = sm + off.ru, *weight = sm + off.weight, *kk = sm + off.kk,
        *kq = sm + off.kq, *misc = sm + off.kq + L;
  const float* ring_k = c.ring_k + slot * c.ring_k_slot_stride + h * c.ring_k_head_stride;
  const float* ring_u = c.ring_u + slot * c.ring_u_slot_stride + hv * c.ring_u_head_stride;
  const float* ring_g = c.ring_g + slot * c.ring_g_slot_stride + hv;
  for (int idx = threadIdx.x; idx < w * kK; idx += kThreads) rk[idx] = ring_k[(idx / kK) * c.ring_k_pos_stride + idx % kK];
  for (int idx = threadIdx.x; idx < w * V; idx += kThreads) ru[idx] = ring_u[(idx / V) * c.ring_u_pos_stride + idx % V];
  for (int j = threadIdx.x; j < w; j += kThreads) {  // a thread per j: the sums replay_decays forms, in its order
    float suffix = 0.f;
    for (int m = w - 1; m > j; --m) suffix += ring_g[m * c.ring_g_pos_stride];
    weight[j] = expf(suffix);
    if (j == 0) misc[0] = expf(suffix + ring_g[0]);
  }
  if (threadIdx.x == 0 && w == 0) misc[0] = 1.f;
  float g, beta;
  gdn_prepare_token<act_t, kK, kThreads>(p, b, 0, hv, qn, kn, sm + off.red, g, beta);  // ends with a barrier

  // Count this block in: all its threads have read the cursor; the slot's last block advances it at the end.
  int arrived = 0;
  if (threadIdx.x == 0) arrived = atomicAdd(&c.arrivals[slot], 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  for (int j = warp; j <= w; j += kThreads / 32) {  // k_j . k_t, k_j . q_t (j < w), and k_t . q_t (j == w)
    const float* kj = j < w ? rk + j * kK : kn;
    float a = 0.f, q = 0.f;
    for (int n = lane; n < kK; n += 32) a = fmaf(kj[n], kn[n], a), q = fmaf(kj[n], qn[n], q);
    a = group_sum<32>(a), q = group_sum<32>(q);
    if (lane == 0) {
      if (j < w) kk[j] = a, kq[j] = q;
      else misc[1] = q;
    }
  }
  __syncthreads();
  const float alpha = expf(g), ckpt_decay = misc[0], kq_t = misc[1];
  float kv[kCols], qv[kCols];
#pragma unroll
  for (int v = 0; v < kVecs; ++v)
#pragma unroll
    for (int e = 0; e < Layout::kVec; ++e) {
      kv[v * Layout::kVec + e] = kn[Layout::col(lane_in_row, v, e)];
      qv[v * Layout::kVec + e] = qn[Layout::col(lane_in_row, v, e)];
    }
  ckpt_t* S = static_cast<ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(hv) * c.ckpt_head_stride;
  const act_t* vin = static_cast<const act_t*>(p.v) + b * p.v_batch_stride + hv * p.v_head_stride;
  act_t* out = static_cast<act_t*>(p.out) + b * p.out_batch_stride + hv * p.out_head_stride;
  float* ring_u_w = c.ring_u + slot * c.ring_u_slot_stride + w * c.ring_u_pos_stride + hv * c.ring_u_head_stride;
  for (int r0 = 0; r0 < V; r0 += Layout::kRowsPerIter) {
    const int r = r0 + warp * Layout::kRowsPerWarp + row_in_warp;
    const bool valid = r < V;
    const int rr = valid ? r : 0;
    ckpt_t* row = S + int64_t(rr) * c.ckpt_row_stride;
    float s[kCols];
    Layout::load_row(row, lane_in_row, valid, s);
    float Sk = 0.f, Sq = 0.f;
#pragma unroll
    for (int col = 0; col < kCols; ++col) Sk = fmaf(s[col], kv[col], Sk), Sq = fmaf(s[col], qv[col], Sq);
    Sk *= ckpt_decay, Sq *= ckpt_decay;
    for (int j = lane_in_row; j < w; j += kLanes) {
      const float wu = weight[j] * ru[j * V + rr];
      Sk = fmaf(wu, kk[j], Sk), Sq = fmaf(wu, kq[j], Sq);
    }
    Sk = group_sum<kLanes>(Sk), Sq = group_sum<kLanes>(Sq);
    const float u = beta * ((valid ? to_float(vin[rr]) : 0.f) - alpha * Sk);
    if (valid && lane_in_row == 0) {
      out[r] = from_float<act_t>(alpha * Sq + u * kq_t);
      if (!fold) ring_u_w[r] = u;
    }
    if (fold) {  // S_t = alpha (exp(G) S_c + sum_j weight_j u_j k_j^T) + u_t k_t^T
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] *= ckpt_decay;
      for (int j = 0; j < w; ++j) {
        const float wu = weight[j] * ru[j * V + rr];
        Layout::axpy(wu, rk + j * kK, lane_in_row, s);
      }
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] = alpha * s[col] + u * kv[col];
      if (valid) Layout::store_row(row, lane_in_row, s);
    }
  }
  if (!fold) {
    if (threadIdx.x == 0) c.ring_g[slot * c.ring_g_slot_stride + w * c.ring_g_pos_stride + hv] = g;
    if (hv % (p.nheads / p.nkheads) == 0) {  // the key head's first value head appends k_t
      float* ring_k_w = c.ring_k + slot * c.ring_k_slot_stride + w * c.ring_k_pos_stride + h * c.ring_k_head_stride;
      for (int n = threadIdx.x; n < kK; n += kThreads) ring_k_w[n] = kn[n];
    }
  }
  if (threadIdx.x == 0 && arrived == int(gridDim.x) - 1) {
    atomicSub(&c.arrivals[slot], int(gridDim.x));  // zero again for the next launch
    c.cursor[slot] = next_cursor(w, L);
  }
}

// Speculative verification (MATH.md, "Verifying T tokens at once"; replay_cpu(verify=true) in cpu.cpp): early
// fold when cursor + T > ring_len; the T corrections of the window depend on each other through the
// lower-triangular system, solved here by forward substitution row by row: each state row's u_t[r] needs only
// the same row's earlier u. A block per (value head, row): it reads the committed ring (k of its key head, u and
// g of its value head), counts in on the arrival counter, and streams the checkpoint once (folding it first
// when early). It appends its own u and g; the slot's last block to arrive appends the window's normalised k of
// every key head (value heads of a key head share those entries, which an early fold overwrites) and writes
// the cursor and the pending count.
constexpr int kGdnMaxT = 16;

struct GdnVerifySmem {  // floats
  int qn, kn, red, rk, ru, rg, gt, bt, W, dec, KK, KQ, kqt, wf, misc, total;
  __host__ __device__ GdnVerifySmem(int K, int V, int L, int T, int threads) {
    int o = 0;
    qn = o, o += T * K;   // [t][n] window q_t (normalised, scaled)
    kn = o, o += T * K;   // [t][n] window k_t (normalised)
    red = o, o += 2 * threads / 32;
    rk = o, o += L * K;   // [j][n] committed ring k_j
    ru = o, o += L * V;   // [j][r] committed ring u_j
    rg = o, o += L;       // [j] committed ring g_j
    gt = o, o += T;       // [t] g_t
    bt = o, o += T;       // [t] beta_t
    W = o, o += T * L;    // [t][j] exp(g_{j+1} + ... + g_{p_t - 1}), j < p_t (p_t = base + t)
    dec = o, o += T;      // [t] exp(g_0 + ... + g_{p_t - 1})
    KK = o, o += T * L;   // [t][j] k_j . k_t
    KQ = o, o += T * L;   // [t][j] k_j . q_t
    kqt = o, o += T;      // [t] k_t . q_t
    wf = o, o += L;       // [j] early fold: exp(g_{j+1} + ... + g_{w-1})
    misc = o, o += 4;     // [0] early fold: exp(G_w)
    total = o;
  }
};

template <typename ckpt_t, typename act_t, int kK, int kThreads>
__global__ void __launch_bounds__(kThreads) gdn_replay_verify_kernel(const GdnReplayParams p) {
  using Layout = RowLayout<ckpt_t, kK, kThreads, 1, ReplayLanes<ckpt_t, kK>::value>;
  constexpr int kLanes = Layout::kLanesPerRow, kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane;
  const GdnReplayCacheParams& c = p.cache;
  const int hv = blockIdx.x, b = blockIdx.y, L = c.ring_len, V = p.vdim, Tmax = p.ntokens, ratio = p.nheads / p.nkheads;
  const int h = hv / ratio;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) return;
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_replay_verify: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int T = p.num_tokens ? p.num_tokens[b] : Tmax;
  RSSM_DEVICE_CHECK(T >= 1 && T <= Tmax, "gdn_replay_verify: num_tokens[%d] = %d is outside [1, T = %d]", b, T, Tmax);
  const int w0 = c.cursor[slot];
  RSSM_DEVICE_CHECK(w0 >= 0 && w0 <= L, "gdn_replay_verify: cursor[%lld] = %d is outside [0, ring_len]", (long long)slot, w0);
  const bool early = w0 + T > L;
  const int base = early ? 0 : w0;  // ring position of window token 0
  extern __shared__ float sm[];
  const GdnVerifySmem off(kK, V, L, Tmax, kThreads);
  float *qn = sm + off.qn, *kn = sm + off.kn, *rk = sm + off.rk, *ru = sm + off.ru, *rg = sm + off.rg, *gt = sm + off.gt,
        *bt = sm + off.bt, *W = sm + off.W, *dec = sm + off.dec, *KK = sm + off.KK, *KQ = sm + off.KQ, *kqt = sm + off.kqt,
        *wf = sm + off.wf, *misc = sm + off.misc;
  const float* ring_k = c.ring_k + slot * c.ring_k_slot_stride + h * c.ring_k_head_stride;
  const float* ring_u = c.ring_u + slot * c.ring_u_slot_stride + hv * c.ring_u_head_stride;
  const float* ring_g = c.ring_g + slot * c.ring_g_slot_stride + hv;
  for (int idx = threadIdx.x; idx < w0 * kK; idx += kThreads) rk[idx] = ring_k[(idx / kK) * c.ring_k_pos_stride + idx % kK];
  for (int idx = threadIdx.x; idx < w0 * V; idx += kThreads) ru[idx] = ring_u[(idx / V) * c.ring_u_pos_stride + idx % V];
  for (int j = threadIdx.x; j < w0; j += kThreads) rg[j] = ring_g[j * c.ring_g_pos_stride];
  for (int t = 0; t < T; ++t) {  // two barriers each
    float g, beta;
    gdn_prepare_token<act_t, kK, kThreads>(p, b, t, hv, qn + t * kK, kn + t * kK, sm + off.red, g, beta);
    if (threadIdx.x == 0) gt[t] = g, bt[t] = beta;
  }
  __syncthreads();  // every thread has read the cursor and the committed ring
  int arrived = 0;
  if (threadIdx.x == 0) arrived = atomicAdd(&c.arrivals[slot], 1);

  // ---- Scalars. Positions after the (early) fold: j < base committed, j >= base the window.
  auto g_at = [&](int j) { return j < base ? rg[j] : gt[j - base]; };
  auto k_at = [&](int j) { return j < base ? rk + j * kK : kn + (j - base) * kK; };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int idx = warp; idx < T * (base + T); idx += kThreads / 32) {  // a warp per (t, j <= p_t)
    const int t = idx / (base + T), j = idx % (base + T);
    if (j > base + t) continue;
    const float* kj = k_at(j);
    float a = 0.f, q = 0.f;
    for (int n = lane; n < kK; n += 32) a = fmaf(kj[n], kn[t * kK + n], a), q = fmaf(kj[n], qn[t * kK + n], q);
    a = group_sum<32>(a), q = group_sum<32>(q);
    if (lane == 0) {
      if (j < base + t) KK[t * L + j] = a, KQ[t * L + j] = q;
      else kqt[t] = q;
    }
  }
  for (int idx = threadIdx.x; idx < T * (base + T); idx += kThreads) {  // a thread per (t, j < p_t): replay_decays' sums
    const int t = idx / (base + T), j = idx % (base + T), pt = base + t;
    if (j >= pt && !(j == 0 && pt == 0)) continue;
    float suffix = 0.f;
    for (int m = pt - 1; m > j; --m) suffix += g_at(m);
    if (j < pt) W[t * L + j] = expf(suffix);
    if (j == 0) dec[t] = pt == 0 ? 1.f : expf(suffix + g_at(0));
  }
  if (early) {
    for (int j = threadIdx.x; j < w0; j += kThreads) {
      float suffix = 0.f;
      for (int m = w0 - 1; m > j; --m) suffix += rg[m];
      wf[j] = expf(suffix);
      if (j == 0) misc[0] = expf(suffix + rg[0]);
    }
  }
  __syncthreads();

  // ---- Rows: fold (early), then the window's corrections in order and the outputs.
  const int lane_in_row = lane % kLanes, row_in_warp = lane / kLanes;
  ckpt_t* S = static_cast<ckpt_t*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(hv) * c.ckpt_head_stride;
  const act_t* vin = static_cast<const act_t*>(p.v) + b * p.v_batch_stride + hv * p.v_head_stride;
  act_t* out = static_cast<act_t*>(p.out) + b * p.out_batch_stride + hv * p.out_head_stride;
  float* ring_u_w = c.ring_u + slot * c.ring_u_slot_stride + hv * c.ring_u_head_stride;
  for (int r0 = 0; r0 < V; r0 += Layout::kRowsPerIter) {
    const int r = r0 + warp * Layout::kRowsPerWarp + row_in_warp;
    const bool valid = r < V;
    const int rr = valid ? r : 0;
    ckpt_t* row = S + int64_t(rr) * c.ckpt_row_stride;
    float s[kCols];
    Layout::load_row(row, lane_in_row, valid, s);
    if (early) {  // checkpoint <- state at the cursor, stored as the checkpoint stores it
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] *= misc[0];
      for (int j = 0; j < w0; ++j) {
        const float wu = wf[j] * ru[j * V + rr];
        Layout::axpy(wu, rk + j * kK, lane_in_row, s);
      }
#pragma unroll
      for (int col = 0; col < kCols; ++col) s[col] = to_float(from_float<ckpt_t>(s[col]));
      if (valid) Layout::store_row(row, lane_in_row, s);
    }
    float u[kGdnMaxT];
#pragma unroll
    for (int t = 0; t < kGdnMaxT; ++t) {
      if (t >= T) break;
      const float* kt = kn + t * kK;
      const float* qt = qn + t * kK;
      float Sk = 0.f, Sq = 0.f;  // this lane's part of S_c k_t, S_c q_t and of the committed ring terms
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
#pragma unroll
        for (int e = 0; e < Layout::kVec; ++e) {
          const int col = Layout::col(lane_in_row, v, e);
          Sk = fmaf(s[v * Layout::kVec + e], kt[col], Sk);
          Sq = fmaf(s[v * Layout::kVec + e], qt[col], Sq);
        }
      Sk *= dec[t], Sq *= dec[t];
      for (int j = lane_in_row; j < base; j += kLanes) {
        const float wu = W[t * L + j] * ru[j * V + rr];
        Sk = fmaf(wu, KK[t * L + j], Sk), Sq = fmaf(wu, KQ[t * L + j], Sq);
      }
      Sk = group_sum<kLanes>(Sk), Sq = group_sum<kLanes>(Sq);
#pragma unroll
      for (int t2 = 0; t2 < t; ++t2) {  // the window's earlier corrections of this row (forward substitution)
        const float wu = W[t * L + base + t2] * u[t2];
        Sk = fmaf(wu, KK[t * L + base + t2], Sk), Sq = fmaf(wu, KQ[t * L + base + t2], Sq);
      }
      const float alpha = expf(gt[t]);
      const float vt = valid ? to_float(vin[int64_t(t) * p.v_token_stride + rr]) : 0.f;
      u[t] = bt[t] * (vt - alpha * Sk);
      if (valid && lane_in_row == 0) {
        out[int64_t(t) * p.out_token_stride + r] = from_float<act_t>(alpha * Sq + u[t] * kqt[t]);
        ring_u_w[(base + t) * c.ring_u_pos_stride + r] = u[t];
      }
    }
  }
  for (int t = threadIdx.x; t < T; t += kThreads) c.ring_g[slot * c.ring_g_slot_stride + (base + t) * c.ring_g_pos_stride + hv] = gt[t];
  __shared__ int last_block;
  if (threadIdx.x == 0) last_block = arrived == int(gridDim.x) - 1;
  __syncthreads();
  if (last_block) {  // every block of the slot has read the committed ring: the window's k of every key head
    for (int idx = warp; idx < T * p.nkheads; idx += kThreads / 32) {
      const int t = idx / p.nkheads, hk = idx % p.nkheads;
      const act_t* k = static_cast<const act_t*>(p.k) + b * p.k_batch_stride + t * p.k_token_stride + hk * p.k_head_stride;
      const float kk = warp_sum_squares<act_t, kK>(k);
      const float ks = p.l2norm ? 1.f / sqrtf(kk + kL2NormEps) : 1.f;
      float* dst = c.ring_k + slot * c.ring_k_slot_stride + (base + t) * c.ring_k_pos_stride + hk * c.ring_k_head_stride;
      for (int n = lane; n < kK; n += 32) dst[n] = to_float(k[n]) * ks;
    }
    if (threadIdx.x == 0) {
      atomicSub(&c.arrivals[slot], int(gridDim.x));  // zero again for the next launch
      if (early) c.cursor[slot] = 0;
      if (c.pending) c.pending[slot] = T;
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

template <DType kCkpt>
void gdn_replay_verify_cuda_for_ckpt(const GdnReplayParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  if (p.ntokens > kGdnMaxT) throw std::invalid_argument("replayssm: the CUDA gdn_replay_verify takes at most 16 tokens per row");
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.kdim, kK, [&] {
      auto kernel = gdn_replay_verify_kernel<ckpt_t, typename CudaType<kAct>::type, kK, 128>;
      const int smem = GdnVerifySmem(kK, p.vdim, p.cache.ring_len, p.ntokens, 128).total * int(sizeof(float));
      gdn_check_smem(smem, p, p.cache.ring_len, "gdn_replay_verify");
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "gdn_replay_verify shared memory");
      kernel<<<dim3(p.nheads, p.batch), 128, smem, stream>>>(p);
      check_cuda(cudaGetLastError(), "gdn_replay_verify kernel launch");
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

template <DType kState>
void gdn_step_cuda_for_state(const GdnStepParams& p, cudaStream_t stream) {
  using state_t = typename CudaType<kState>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.kdim, kK, [&] {
      gdn_step_kernel<state_t, typename CudaType<kAct>::type, kK, 128><<<dim3(p.nheads, p.batch), 128, 0, stream>>>(p);
      check_cuda(cudaGetLastError(), "gdn_step kernel launch");
    });
  });
}

template <DType kCkpt>
void gdn_replay_step_cuda_for_ckpt(const GdnReplayParams& p, cudaStream_t stream) {
  using ckpt_t = typename CudaType<kCkpt>::type;
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.kdim, kK, [&] {
      auto kernel = gdn_replay_step_kernel<ckpt_t, typename CudaType<kAct>::type, kK, 128>;
      const int smem = GdnReplaySmem(kK, p.vdim, p.cache.ring_len, 128).total * int(sizeof(float));
      gdn_check_smem(smem, p, p.cache.ring_len, "gdn_replay_step");
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "gdn_replay_step shared memory");
      kernel<<<dim3(p.nheads, p.batch), 128, smem, stream>>>(p);
      check_cuda(cudaGetLastError(), "gdn_replay_step kernel launch");
    });
  });
}

}  // namespace replayssm
