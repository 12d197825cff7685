// The GDN replay step for grids of at most two blocks per SM (batches 1-2 on the benchmark shape): a small kernel, as
// csrc/mamba2/replay_small.cuh is for Mamba-2. Included by kernels.cuh inside namespace replayssm, after
// gdn_replay_step_kernel.
//
// Why: at batch 1 the step is one dependent chain (slot -> checkpoint, ring and cursor -> block scalars -> rows ->
// output). The general kernel (gdn_replay_step_kernel, 256 blocks of 16 rows at batch 1 on HV=32, K=V=128) stages its
// rows through a cp.async ring, its ring k and the token's q and k through shared memory, and has two block barriers
// between its inputs and its first row; it ran batch 1 in 5.7 us against the standard step's 4.8 (H200, session 22).
// This kernel does the same work in a straight line: a block per 32 rows of one value head (256 threads, 8 lanes a
// row, the general kernel's row layout), the thread's 16 checkpoint columns loaded straight into registers, the
// token's q and k normalised by every warp for itself (warp_sum_squares' bits, as gdn_step_kernel does), ring k_j
// loaded by the 8 lanes that form k_j . k_t and k_j . q_t (row j's lanes: ring position j, k_t itself in group 31,
// so no lane waits for the cursor before its dots), the decays formed by warp 0 alone, and one block barrier. Without
// PDL the token's inputs are requested first, before the slot's load returns.
//
// Per row and column the same fp32 operations in the same order as the general kernel with its default layout for
// the benchmark's configuration (8 lanes a row, 16 columns a lane; its deferred non-folding epilogue: the ring's part
// of S k and S q summed over j in order by the row's first lane; at folds the lanes' strided ring sums, then the
// rank-w update from the ring-k tile): the same bits (tests/test_gdn.py, test_cuda_small_replay_gives_the_general_bits).
//
// It serves an fp32 checkpoint without an output view or stochastic rounding, bf16 activations (the general kernel's
// 8-lane layout is its default there only), K = 128, V a multiple of 32, ring_len <= 32, 16-byte aligned checkpoint
// and rings, 8-byte aligned q and k, and no forced general-kernel knob. REPLAYSSM_TUNE gdn_replay_small: 2 (the
// default) where the grid has at most two blocks per SM (one until session 36, eight in session 36); 1 whenever the shape allows, at any
// batch (tests); 0 never.

template <typename act_t>
struct GdnSmallReplay {
  static constexpr int kK = 128, kThreads = 256, kRows = 32, kMaxRing = 32, kTj = kMaxRing - 1;
  using Layout = RowLayout<float, kK, kThreads, 1, 8>;  // the general kernel's default rows: 8 lanes of 16 columns
  static_assert(Layout::kLanesPerRow == 8 && Layout::kColsPerLane == 16 && Layout::kRowsPerIter == kRows, "layout");
  static_assert(sizeof(act_t) == 2, "16-bit activations");
};

// Grid (V / 32, HV, batch): block (x, hv, b) streams rows 32 x .. 32 x + 31 of value head hv.
template <typename act_t>
__global__ void __launch_bounds__(256, 1) gdn_replay_step_small_kernel(const GdnReplayParams p, const bool pdl,
                                                                       const uint64_t ratio_magic) {
  using K = GdnSmallReplay<act_t>;
  using Layout = typename K::Layout;
  constexpr int kK = K::kK, kCols = Layout::kColsPerLane, kVecs = Layout::kVecsPerLane, kTj = K::kTj;
  const GdnReplayCacheParams& c = p.cache;
  const int hv = blockIdx.y, b = blockIdx.z, L = c.ring_len;
  const int h = fast_div(hv, ratio_magic);  // the key head: hv / (HV / H)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lane8 = tid & 7, j = tid >> 3;  // this lane of its row (and of its dot group); the row = the dot group
  const int i = blockIdx.x * K::kRows + j;  // the row's index in the value head (< V: V % 32 == 0)

  // ---- This token's inputs need neither the slot nor the cache: without PDL they are requested first (a pad row's
  // are read and dropped); with PDL after the wait (the kernel ahead writes them).
  const act_t* q = static_cast<const act_t*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const act_t* k = static_cast<const act_t*>(p.k) + b * p.k_batch_stride + h * p.k_head_stride;
  uint2 qraw[kVecs], kraw[kVecs];  // this lane's columns n = col(lane8, v, 0..3) of q_t and k_t (raw)
  act_t qsq[4], ksq[4];            // elements lane + 32 m: warp_sum_squares' share of this lane
  act_t v_raw = from_float<act_t>(0.f), a_raw = v_raw, b_raw = v_raw;
  float A_log = 0.f, dt_bias = 0.f;
  auto load_token = [&] {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      qraw[v] = *reinterpret_cast<const uint2*>(q + Layout::col(lane8, v, 0));
      kraw[v] = *reinterpret_cast<const uint2*>(k + Layout::col(lane8, v, 0));
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) qsq[m] = q[lane + 32 * m], ksq[m] = k[lane + 32 * m];
    v_raw = static_cast<const act_t*>(p.v)[b * p.v_batch_stride + int64_t(hv) * p.v_head_stride + i];
    a_raw = static_cast<const act_t*>(p.a)[b * p.a_batch_stride + hv * p.a_head_stride];
    b_raw = static_cast<const act_t*>(p.b)[b * p.b_batch_stride + hv * p.b_head_stride];
    A_log = p.A_log[hv];
    if (p.dt_bias) dt_bias = p.dt_bias[hv];
  };
  if (!pdl) load_token();

  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) {  // (waits first with PDL, as the general kernel)
    pdl_wait();
    fold_phase_pad_block(c.fold_phase, gridDim.z, blockIdx.x == 0 && blockIdx.y == 0, c.ring_len);
    return;
  }
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "gdn_replay_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);

  __shared__ __align__(16) float ru_s[K::kMaxRing - 1][K::kRows];  // ring u of the block's rows, positions 0..L-2
  __shared__ __align__(16) float rk_s[K::kMaxRing - 1][kK];        // ring k of the key head (the fold's rank-w update)
  __shared__ float kk_s[K::kMaxRing], kq_s[K::kMaxRing], weight_s[K::kMaxRing], decay_s;  // [kTj]: k_t . k_t, k_t . q_t
  __shared__ int w_s, phase_s;

  // ---- One trip: everything below needs only the slot. The ring is read whole, before the cursor is known;
  // entries past it are ignored (a position this launch appends to may be read while it is written: never used).
  float* ckpt_row = static_cast<float*>(c.checkpoint) + slot * c.ckpt_slot_stride + int64_t(hv) * c.ckpt_head_stride +
                    int64_t(i) * c.ckpt_row_stride;
  float s[kCols];
#pragma unroll
  for (int v = 0; v < kVecs; ++v) load16_stream(ckpt_row + Layout::col(lane8, v, 0), *reinterpret_cast<float(*)[4]>(&s[v * 4]));
  const float* ring_u = c.ring_u + slot * c.ring_u_slot_stride + int64_t(hv) * c.ring_u_head_stride + blockIdx.x * K::kRows;
  if (j < L - 1) cp_async16(&ru_s[j][lane8 * 4], ring_u + j * c.ring_u_pos_stride + lane8 * 4);  // (8 lanes: 32 rows)
  cp_async_commit();
  float kj[kCols] = {};  // ring k_j of this dot group, at this lane's columns (group kTj: none)
  if (j < L - 1) {
    const float* rk = c.ring_k + slot * c.ring_k_slot_stride + j * c.ring_k_pos_stride + h * c.ring_k_head_stride;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const float4 x = *reinterpret_cast<const float4*>(rk + Layout::col(lane8, v, 0));
      kj[v * 4] = x.x, kj[v * 4 + 1] = x.y, kj[v * 4 + 2] = x.z, kj[v * 4 + 3] = x.w;
    }
  }
  float* ring_g = c.ring_g + slot * c.ring_g_slot_stride + hv;
  const float g_ring = warp == 0 && lane < L - 1 ? ring_g[lane * c.ring_g_pos_stride] : 0.f;
  int w = warp == 0 ? __ldcg(c.cursor + slot) : 0;  // warp 0 alone waits for the cursor
  int phase = warp == 0 ? read_fold_phase(c.fold_phase) : -1;  // (and the aligned folds' phase; -1 without)

  if (pdl) {
    pdl_wait();
    pdl_trigger();
    load_token();
  }

  // ---- q_t and k_t normalised by every warp (gdn_step_kernel's and the general kernel's bits: warp_sum_squares'
  // order, then element times scale); g_t, alpha, beta by every thread.
  float qq = 0.f, kq2 = 0.f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const float qe = to_float(qsq[m]), ke = to_float(ksq[m]);
    qq = fmaf(qe, qe, qq), kq2 = fmaf(ke, ke, kq2);
  }
  qq = group_sum<32>(qq), kq2 = group_sum<32>(kq2);
  const float qs = (p.l2norm ? 1.f / sqrtf(qq + kL2NormEps) : 1.f) * p.scale;
  const float ks = p.l2norm ? 1.f / sqrtf(kq2 + kL2NormEps) : 1.f;
  float kv[kCols], qv[kCols];
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const uint32_t qw[2] = {qraw[v].x, qraw[v].y}, kw[2] = {kraw[v].x, kraw[v].y};
    unpack_words<act_t, 2>(qw, *reinterpret_cast<float(*)[4]>(&qv[v * 4]));
    unpack_words<act_t, 2>(kw, *reinterpret_cast<float(*)[4]>(&kv[v * 4]));
#pragma unroll
    for (int e = 0; e < 4; ++e) qv[v * 4 + e] *= qs, kv[v * 4 + e] *= ks;
  }
  const float g_t = gdn_log_decay(to_float(a_raw), dt_bias, A_log);
  const float alpha = expf(g_t), beta = sigmoid(to_float(b_raw));

  // ---- k_j . k_t and k_j . q_t on the 8 lanes of group j (the general kernel's order: 16-byte groups e4 of this
  // lane's columns, x y z w in turn, then the butterfly); group kTj forms k_t . k_t and k_t . q_t. Ring k_j goes to
  // the tile for a fold (fp32 rows: tile_pos is the identity).
  {
    float a = 0.f, qd = 0.f;
#pragma unroll
    for (int col = 0; col < kCols; ++col) {
      const float x = j == kTj ? kv[col] : kj[col];
      a = fmaf(x, kv[col], a), qd = fmaf(x, qv[col], qd);
    }
    a = group_sum<8>(a), qd = group_sum<8>(qd);
    if (lane8 == 0) kk_s[j] = a, kq_s[j] = qd;
    if (j < L - 1) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
        *reinterpret_cast<float4*>(&rk_s[j][Layout::col(lane8, v, 0)]) = make_float4(kj[v * 4], kj[v * 4 + 1], kj[v * 4 + 2], kj[v * 4 + 3]);
    }
  }
  // ---- The value head's decays (warp 0): weight_j = exp(g_{w-1} + ... + g_{j+1}) summed in that order (the
  // general kernel's), one running sum that lane j takes after adding g_{j+1}; exp(G_w) = exp(suffix_0 + g_0).
  if (warp == 0) {
    check_replay_cursor(w, L, slot, "gdn_replay_step");
    check_fold_phase(c.fold_phase, phase, L, "gdn_replay_step");
    float run = 0.f, suffix = 0.f;
    for (int m = w - 1; m > 0; --m) {
      run += __shfl_sync(0xffffffffu, g_ring, m);
      if (lane == m - 1) suffix = run;
    }
    if (lane < w) weight_s[lane] = expf(suffix);
    const float g0 = __shfl_sync(0xffffffffu, g_ring, 0);
    if (lane == 0) decay_s = w > 0 ? expf(suffix + g0) : 1.f, w_s = w, phase_s = phase;
  }
  cp_async_wait<0>();
  __syncthreads();
  int arrived = 0, counted = 0;
  if (tid == 0) {
    arrived = atomicAdd(&c.arrivals[slot], 1);  // every thread has what it needs of the cursor
    counted = fold_phase_count_in(c.fold_phase, gridDim.z);
  }
  w = w_s;
  phase = phase_s;
  const bool fold = folds_at(w, phase, L);
  const float dcy = decay_s, kq_t = kq_s[kTj];
  if (!fold) {  // append k_t (the key head's first block) and g_t (each value head's first block)
    if (blockIdx.x == 0 && hv == h * (p.nheads / p.nkheads) && j == kTj) {
      float* dst = c.ring_k + slot * c.ring_k_slot_stride + w * c.ring_k_pos_stride + h * c.ring_k_head_stride;
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
        *reinterpret_cast<float4*>(dst + Layout::col(lane8, v, 0)) = make_float4(kv[v * 4], kv[v * 4 + 1], kv[v * 4 + 2], kv[v * 4 + 3]);
    }
    if (blockIdx.x == 0 && tid == 0) ring_g[w * c.ring_g_pos_stride] = g_t;
  }

  // ---- The row: S_c k_t and S_c q_t (two chains each, as the general kernel), then the ring's part.
  float pk[2] = {0.f, 0.f}, pq[2] = {0.f, 0.f};
#pragma unroll
  for (int col = 0; col < kCols; ++col) pk[col % 2] = fmaf(s[col], kv[col], pk[col % 2]), pq[col % 2] = fmaf(s[col], qv[col], pq[col % 2]);
  float Sk = (pk[0] + pk[1]) * dcy, Sq = (pq[0] + pq[1]) * dcy;
  act_t* out = static_cast<act_t*>(p.out) + b * p.out_batch_stride + int64_t(hv) * p.out_head_stride + i;
  if (!fold) {  // (the general kernel's deferred epilogue: the row's sums, then the ring over j in order)
    Sk = group_sum<8>(Sk), Sq = group_sum<8>(Sq);
    if (lane8 == 0) {
#pragma unroll 4
      for (int jj = 0; jj < w; ++jj) {
        const float wu = weight_s[jj] * ru_s[jj][j];
        Sk = fmaf(wu, kk_s[jj], Sk), Sq = fmaf(wu, kq_s[jj], Sq);
      }
      const float u = beta * (to_float(v_raw) - alpha * Sk);
      *out = from_float<act_t>(alpha * Sq + u * kq_t);
      c.ring_u[slot * c.ring_u_slot_stride + w * c.ring_u_pos_stride + int64_t(hv) * c.ring_u_head_stride + i] = u;
    }
  } else {  // S_t = alpha (exp(G_w) S_c + sum_j weight_j u_j k_j^T) + u_t k_t^T
    for (int jj = lane8; jj < w; jj += 8) {
      const float wu = weight_s[jj] * ru_s[jj][j];
      Sk = fmaf(wu, kk_s[jj], Sk), Sq = fmaf(wu, kq_s[jj], Sq);
    }
    Sk = group_sum<8>(Sk), Sq = group_sum<8>(Sq);
    const float u = beta * (to_float(v_raw) - alpha * Sk);
    if (lane8 == 0) *out = from_float<act_t>(alpha * Sq + u * kq_t);
#pragma unroll
    for (int col = 0; col < kCols; ++col) s[col] *= dcy;
#pragma unroll 1
    for (int jj = 0; jj < w; ++jj) Layout::axpy_tile(weight_s[jj] * ru_s[jj][j], rk_s[jj], lane8, s);
#pragma unroll
    for (int col = 0; col < kCols; ++col) s[col] = fmaf(alpha, s[col], u * kv[col]);
    Layout::store_row(ckpt_row, lane8, s);
  }
  const int blocks_per_slot = int(gridDim.x * gridDim.y);
  if (tid == 0) {
    const bool row_last = arrived == blocks_per_slot - 1;
    if (row_last) {
      atomicSub(&c.arrivals[slot], blocks_per_slot);  // zero again for the next launch
      c.cursor[slot] = fold ? 0 : w + 1;
    }
    fold_phase_count_out(c.fold_phase, gridDim.z, counted, row_last, L);
  }
}

// Launches the small kernel and returns true when the step qualifies (above), else returns false (the general
// kernel serves it).
template <typename act_t>
bool launch_gdn_replay_step_small(const GdnReplayParams& p, cudaStream_t stream) {
  using K = GdnSmallReplay<act_t>;
  const int knob = tune_knob("gdn_replay_small");  // unset: 2 (resident grids)
  if (knob == 0) return false;
  // A forced general-kernel configuration means the general kernel (its launch-configuration tests and tune entries).
  for (const char* key : {"gdn_replay_rows", "gdn_replay_bps", "gdn_replay_split", "gdn_replay_variant", "gdn_replay_prefetch",
                          "stream_lean", "fold_pair", "replay_fold_first", "pdl_ring_ahead",
                          "replay_stage0_first"})
    if (tune_knob(key) >= 0) return false;
  const GdnReplayCacheParams& c = p.cache;
  const int ratio = p.nheads / p.nkheads;
  const bool shape_ok = p.kdim == K::kK && p.vdim % K::kRows == 0 && c.ring_len <= K::kMaxRing && c.view == nullptr &&
                        c.sr_seed == nullptr && c.ckpt_dtype == DType::kFloat32 && p.nheads % p.nkheads == 0 &&
                        p.nheads <= 65535 && p.batch <= 65535 && p.ntokens == 1;
  const bool aligned = aligned16(c.checkpoint) && c.ckpt_slot_stride % 4 == 0 && c.ckpt_head_stride % 4 == 0 &&
                       c.ckpt_row_stride % 4 == 0 && aligned16(c.ring_u) && c.ring_u_slot_stride % 4 == 0 &&
                       c.ring_u_pos_stride % 4 == 0 && c.ring_u_head_stride % 4 == 0 && aligned16(c.ring_k) &&
                       c.ring_k_slot_stride % 4 == 0 && c.ring_k_pos_stride % 4 == 0 && c.ring_k_head_stride % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(p.q) % 8 == 0 && p.q_batch_stride % 4 == 0 && p.q_head_stride % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(p.k) % 8 == 0 && p.k_batch_stride % 4 == 0 && p.k_head_stride % 4 == 0;
  // At most two blocks an SM: batches 1-2 here (session 37, H100, bench/results/session37/: the general kernel with its
  // blocks of at least 64 rows took batch 4 / 8 in 8.7 / 12.4 us against this kernel's 10.4 / 17.4, batch 2 in 6.9-7.2
  // against 6.2; eight blocks an SM in session 36, against the general kernel's 16-row blocks; one before).
  const bool resident = int64_t(p.batch) * p.nheads * (p.vdim / K::kRows) <= int64_t(2) * num_sms();
  if (!shape_ok || !aligned || (knob != 1 && !resident)) return false;
  const bool pdl = pdl_requested();
  launch_maybe_pdl(gdn_replay_step_small_kernel<act_t>, dim3(p.vdim / K::kRows, p.nheads, p.batch), K::kThreads, 0, stream, pdl,
                   "gdn_replay_step small kernel launch", p, pdl, fast_div_magic(ratio));
  return true;
}
