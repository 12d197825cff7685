// The replay step for grids of at most two blocks per SM (batches 1-2 on the benchmark shape): a small kernel.
// Included by kernels.cuh inside namespace replayssm, after replay_step.cuh.
//
// Why a second kernel: at batch 1 the step is one dependent chain (slot -> checkpoint, ring and inputs -> block
// scalars -> rows -> output), and v10 (replay_step.cuh) ran it in 6.1 us against the standard step's 5.3 (H200,
// sessions 22-24), 36% of its stall samples "no instruction": v10's instantiation is ~13k SASS instructions, larger
// than an SM's instruction cache, and each SM's block runs its prologue once, cold. This kernel does the same work
// in a straight line: a block per (head, batch row) with 256 threads, a thread's checkpoint columns loaded straight
// into registers (no staging), the ring's B_j loaded by the lanes that form B_j . C_t (no shared-memory round trip
// before the dots), the head's decays formed by warp 0 while the other warps form the dots, and one block barrier
// (two at folds). Only warp 0 reads the cursor, so the other warps form their dots without waiting for it.
// Per row and column the same fp32 operations in the same order as v10's lean path (REPLAYSSM_TUNE stream_lean,
// the default): the same bits (tests/test_mamba2.py, test_cuda_small_replay_gives_v10_bits).
//
// It serves an fp32 checkpoint without an output view, headdim <= 64, ring_len <= 32, N <= 128 with 16-byte
// rows of B and C per dot lane (bf16/fp16: N in {64, 128}; fp32: N in {32, 64, 128}) and 16-byte aligned rings
// and inputs; the launcher takes it when the grid has at most two blocks per SM (one until session 36, four in session
// 36) and no v10 launch knob is forced (REPLAYSSM_TUNE replay_small=0: never; 1: whenever the shape allows, at any batch, for tests).

template <typename act_t, int kN>
struct SmallReplay {
  static constexpr int kThreads = 256, kRows = 64, kMaxRing = 32;
  using Layout = RowLayout<float, kN, kThreads, 1, 4>;  // v10's rows: 4 lanes, 16-byte vectors interleaved
  static constexpr int kPer = kN / 8;                  // a dot lane's elements of B_j and C_t (8 lanes per j)
  static constexpr int kChunk = 16 / int(sizeof(act_t));  // activations per 16-byte word
  static constexpr bool kSupported = kN <= 128 && kN >= 16 && kPer % kChunk == 0 && Layout::kLanesPerRow == 4 &&
                                     Layout::kRowsPerIter == kRows;
  static constexpr int kWords = kSupported ? kPer / kChunk : 1;
};

template <typename act_t, int kN>
__global__ void __launch_bounds__(256, 1) mamba2_replay_step_small_kernel(const Mamba2ReplayStepParams p, const int arrive) {
  using K = SmallReplay<act_t, kN>;
  using Layout = typename K::Layout;
  static_assert(K::kSupported, "the launcher routes only supported shapes here");
  constexpr int kVecs = Layout::kVecsPerLane, kCols = Layout::kColsPerLane, kPer = K::kPer, kWords = K::kWords;
  const Mamba2ReplayCacheParams& c = p.cache;
  const int h = blockIdx.x, b = blockIdx.y;
  const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (slot == kPadSlot) {  // (waits first with PDL, as v10)
    pdl_wait();
    fold_phase_pad_block(c.fold_phase, gridDim.y, blockIdx.x == 0, c.ring_len);
    return;
  }
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_replay_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int L = c.ring_len, heads_per_group = p.nheads / p.ngroups, g = h / heads_per_group;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lane_in_row = lane & 3, r = warp * Layout::kRowsPerWarp + (lane >> 2);  // this thread's row (p)
  const bool row_ok = r < p.headdim;
  const int j = tid >> 3, lane8 = tid & 7;  // the dot B_j . C_t this thread shares, and its eighth of N

  __shared__ __align__(16) act_t xs[K::kMaxRing - 1][K::kRows];  // the head's ring x, positions 0..L-2
  __shared__ __align__(16) float Bs[K::kMaxRing][kN];            // at folds: B_j (j < w) and B_t (row kTj)
  __shared__ float bc_s[K::kMaxRing], wdt_s[K::kMaxRing], decay_s;  // bc_s[kMaxRing - 1]: B_t . C_t
  __shared__ int w_s, phase_s;
  constexpr int kTj = K::kMaxRing - 1;  // the dot group of B_t (ring positions stop at L - 2 <= 30)

  // ---- One trip: everything below needs only the slot (the cache) or nothing (this token's inputs, after the PDL
  // wait). The ring is read whole, before the cursor is known; entries past it are ignored.
  const float* ckpt = static_cast<const float*>(c.checkpoint) + slot * c.ckpt_slot_stride + h * c.ckpt_head_stride +
                      r * c.ckpt_row_stride;
  float s[kCols];
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    float* sv = &s[v * 4];
    if (row_ok) {
      load16_stream(ckpt + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[4]>(sv));
    } else {
      sv[0] = sv[1] = sv[2] = sv[3] = 0.f;
    }
  }
  const act_t* ring_x = static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + h * c.ring_x_head_stride;
  {
    const int per_pos = p.headdim / K::kChunk;
    for (int idx = tid; idx < (L - 1) * per_pos; idx += K::kThreads) {
      const int jj = idx / per_pos, k = idx - jj * per_pos;
      cp_async16(&xs[jj][k * K::kChunk], ring_x + jj * c.ring_x_pos_stride + k * K::kChunk);
    }
    cp_async_commit();
  }
  const act_t* ring_B = static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride + lane8 * kPer;
  uint4 braw[kWords];
#pragma unroll
  for (int q = 0; q < kWords; ++q) braw[q] = j < L - 1 ? reinterpret_cast<const uint4*>(ring_B + j * c.ring_B_pos_stride)[q] : uint4{};
  float* ring_dt = c.ring_dt + slot * c.ring_dt_slot_stride + h;
  const float dt_ring = warp == 0 && lane < L - 1 ? ring_dt[lane * c.ring_dt_pos_stride] : 0.f;
  // Warp 0 alone reads the cursor (w); its block then announces its arrival (the count that tells the slot's last
  // block that every block has read the cursor, so that it may advance it). `arrive` (REPLAYSSM_TUNE small_arrive)
  // places the announcement: 0 (default) after the block's barrier, 1 once warp 0 has w, 2 after warp 0's dots; each
  // is correct, no other warp reads the cursor. Batch 1, one H200 run (bench/results/session29/, call 3): 5.28 /
  // 5.52 / 5.60 us, with PDL 3.39 / 3.48 us for 0 / 1: the early atomics (every head's block on one counter) slow
  // the step instead of hiding a round trip. The other warps need w only after the barrier (the dots are formed for
  // every ring position and for B_t).
  int w = warp == 0 ? __ldcg(c.cursor + slot) : 0;
  int phase = warp == 0 ? read_fold_phase(c.fold_phase) : -1;  // (aligned folds; -1 without)

  pdl_wait();
  pdl_trigger();

  const act_t* Bt = static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride;
  const act_t* Ct = static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride;
  uint4 ctraw[kWords];  // (and B_t in group kTj's braw, whose ring position does not exist)
#pragma unroll
  for (int q = 0; q < kWords; ++q) {
    if (j == kTj) braw[q] = reinterpret_cast<const uint4*>(Bt + lane8 * kPer)[q];
    ctraw[q] = reinterpret_cast<const uint4*>(Ct + lane8 * kPer)[q];
  }
  float Cv[kCols];  // this lane's columns of C_t (the row's dot)
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    float* cv = &Cv[v * 4];
    const act_t* src = Ct + Layout::col(lane_in_row, v, 0);
    if constexpr (sizeof(act_t) == 4) {
      const float4 f = *reinterpret_cast<const float4*>(src);
      cv[0] = f.x, cv[1] = f.y, cv[2] = f.z, cv[3] = f.w;
    } else {
      const uint2 raw = *reinterpret_cast<const uint2*>(src);
      const uint32_t words[2] = {raw.x, raw.y};
      unpack_words<act_t, 2>(words, *reinterpret_cast<float(*)[4]>(cv));
    }
  }
  const act_t* x_t = static_cast<const act_t*>(p.x) + b * p.x_batch_stride + h * p.x_head_stride;
  const act_t xt_raw = row_ok ? x_t[r] : from_float<act_t>(0.f);
  const float zt = p.z && row_ok ? to_float(static_cast<const act_t*>(p.z)[b * p.z_batch_stride + h * p.z_head_stride + r]) : 0.f;
  const float Dh = p.D ? p.D[h] : 0.f;
  float dt_raw = 0.f, dt_bias = 0.f, Ah = 0.f;
  if (warp == 0) {
    dt_raw = to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + h * p.dt_head_stride]);
    if (p.dt_bias) dt_bias = p.dt_bias[h];
    Ah = p.A[h];
  }
  int arrived = 0;
  if (warp == 0) {
    check_replay_cursor(w, L, slot, "mamba2_replay_step");
    check_fold_phase(c.fold_phase, phase, L, "mamba2_replay_step");
    // (issued once w has arrived: the branch above waits for it, and a GPU does not run ahead of a branch)
    if (arrive == 1 && lane == 0) arrived = atomicAdd(&c.arrivals[slot], 1);
  }

  // ---- B_j . C_t, 8 lanes per position (v10 lean's order: each lane's kPer products in column order, then the
  // butterfly): every ring position j < L - 1, and B_t . C_t in group kTj.
  {
    float bv[kPer], cf[kPer];
#pragma unroll
    for (int q = 0; q < kWords; ++q) {
      unpack16<act_t>(braw[q], *reinterpret_cast<float(*)[K::kChunk]>(&bv[q * K::kChunk]));
      unpack16<act_t>(ctraw[q], *reinterpret_cast<float(*)[K::kChunk]>(&cf[q * K::kChunk]));
    }
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc = fmaf(bv[e], cf[e], acc);
    acc = group_sum<8>(acc);
    if (lane8 == 0) bc_s[j] = acc;
  }
  // ---- The head's decays (warp 0): lane k holds dt_k (k < w, the ring's) or dt_t (k = w); suffix_j =
  // dt_w + dt_{w-1} + ... + dt_{j+1} summed in that order (replay_decays' and v10's), one running sum that each
  // lane j takes after adding dt_{j+1}.
  if (warp == 0) {
    if (arrive == 2 && lane == 0) arrived = atomicAdd(&c.arrivals[slot], 1);
    const bool fold = folds_at(w, phase, L);
    const float dt_t = process_dt(dt_raw, dt_bias, p.dt_softplus, p.dt_min, p.dt_max);
    const float dk = lane < w ? dt_ring : dt_t;
    float run = 0.f, suffix = 0.f;
    for (int k = w; k > 0; --k) {
      run += __shfl_sync(0xffffffffu, dk, k);
      if (lane == k - 1) suffix = run;
    }
    if (lane <= w) wdt_s[lane] = expf(Ah * suffix) * dk;
    if (lane == 0) decay_s = expf(Ah * (suffix + dk)), w_s = w, phase_s = phase;
    if (lane == 0 && !fold) ring_dt[w * c.ring_dt_pos_stride] = dt_t;
  }
  cp_async_wait<0>();
  __syncthreads();
  if (arrive == 0 && tid == 0) arrived = atomicAdd(&c.arrivals[slot], 1);
  const int counted = tid == 0 ? fold_phase_count_in(c.fold_phase, gridDim.y) : 0;
  w = w_s;
  phase = phase_s;
  const bool fold = folds_at(w, phase, L);
  if (!fold && j == kTj && h % heads_per_group == 0) {  // the group's first head appends B_t (exact: it came as act_t)
    act_t* dst = static_cast<act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + w * c.ring_B_pos_stride +
                 g * c.ring_B_group_stride + lane8 * kPer;
#pragma unroll
    for (int q = 0; q < kWords; ++q) reinterpret_cast<uint4*>(dst)[q] = braw[q];
  }

  // ---- The row: y = decay (S_c . C_t) + sum_{j<w} wdt_j bc_j x_j + (wdt_w bc_w + D) x_t, gated.
  const float decay = decay_s;
  float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int col = 0; col < kCols; ++col) part[col % 4] = fmaf(s[col], Cv[col], part[col % 4]);
  const float y = group_sum<4>(decay * ((part[0] + part[1]) + (part[2] + part[3])));
  const float xt = to_float(xt_raw);
  if (lane_in_row == 0 && row_ok) {
    float yo = y;
#pragma unroll 4
    for (int jj = 0; jj < w; ++jj) yo = fmaf(wdt_s[jj] * bc_s[jj], to_float(xs[jj][r]), yo);
    yo = fmaf(fmaf(wdt_s[w], bc_s[kTj], Dh), xt, yo);
    if (p.z) yo *= silu(zt);
    static_cast<act_t*>(p.out)[b * p.out_batch_stride + h * p.out_head_stride + r] = from_float<act_t>(yo);
    if (!fold)
      static_cast<act_t*>(c.ring_x)[slot * c.ring_x_slot_stride + w * c.ring_x_pos_stride + h * c.ring_x_head_stride + r] = xt_raw;
  }
  if (fold) {  // the new checkpoint row: exp(c_t) S_c + sum_{j<=w} exp(c_t - c_j) dt_j x_j[p] B_j (v10's order)
    if (j < w || j == kTj) {  // the rank-w update's B_j (B_t in row kTj), as fp32 (exact), staged for the rows
      float bv[kPer];
#pragma unroll
      for (int q = 0; q < kWords; ++q) unpack16<act_t>(braw[q], *reinterpret_cast<float(*)[K::kChunk]>(&bv[q * K::kChunk]));
#pragma unroll
      for (int e = 0; e < kPer; e += 4)
        *reinterpret_cast<float4*>(&Bs[j][lane8 * kPer + e]) = make_float4(bv[e], bv[e + 1], bv[e + 2], bv[e + 3]);
    }
    __syncthreads();  // (a folding step's second barrier: one step in L)
#pragma unroll
    for (int col = 0; col < kCols; ++col) s[col] *= decay;
    auto axpy_B = [&](float coef, const float* Bj) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const float4 bq = *reinterpret_cast<const float4*>(Bj + Layout::col(lane_in_row, v, 0));
        float* sv = &s[v * 4];
        sv[0] = fmaf(coef, bq.x, sv[0]), sv[1] = fmaf(coef, bq.y, sv[1]), sv[2] = fmaf(coef, bq.z, sv[2]),
        sv[3] = fmaf(coef, bq.w, sv[3]);
      }
    };
    const int rr = row_ok ? r : 0;
#pragma unroll 1
    for (int jj = 0; jj < w; ++jj) axpy_B(wdt_s[jj] * to_float(xs[jj][rr]), Bs[jj]);
    axpy_B(wdt_s[w] * xt, Bs[kTj]);
    if (row_ok) {
      float* row = const_cast<float*>(ckpt);
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
        store16_stream(row + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[4]>(&s[v * 4]));
    }
  }
  if (tid == 0) {
    const bool row_last = arrived == int(gridDim.x) - 1;
    if (row_last) {
      atomicSub(&c.arrivals[slot], int(gridDim.x));  // zero again for the next launch
      c.cursor[slot] = fold ? 0 : w + 1;
      if (fold && c.fold_count) c.fold_count[slot] = c.fold_count[slot] + 1;
    }
    fold_phase_count_out(c.fold_phase, gridDim.y, counted, row_last, L);
  }
}

// Launches the small kernel and returns true when the step qualifies (above), else returns false (v10 serves it).
template <typename act_t, int kN>
bool launch_mamba2_replay_step_small(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  using K = SmallReplay<act_t, kN>;
  if constexpr (!K::kSupported) {
    return false;
  } else {
    const int knob = tune_knob("replay_small");
    if (knob == 0) return false;
    // A forced v10 configuration means v10 (its launch-configuration tests and tune entries).
    for (const char* key : {"replay_rows", "replay_prefetch", "replay_sm_rows", "fold_pair", "stream_lean",
                            "m2_replay_stage0_first"})
      if (tune_knob(key) >= 0) return false;
    const Mamba2ReplayCacheParams& c = p.cache;
    constexpr int kV = K::kChunk;
    const bool shape_ok = p.headdim <= K::kRows && p.headdim % kV == 0 && c.ring_len <= K::kMaxRing && c.view == nullptr &&
                          c.sr_seed == nullptr && p.nheads % p.ngroups == 0;
    const bool aligned = aligned16(c.checkpoint) && c.ckpt_slot_stride % 4 == 0 && c.ckpt_head_stride % 4 == 0 &&
                         c.ckpt_row_stride % 4 == 0 && aligned16(c.ring_x) && c.ring_x_slot_stride % kV == 0 &&
                         c.ring_x_pos_stride % kV == 0 && c.ring_x_head_stride % kV == 0 && aligned16(c.ring_B) &&
                         c.ring_B_slot_stride % kV == 0 && c.ring_B_pos_stride % kV == 0 && c.ring_B_group_stride % kV == 0 &&
                         aligned16(p.B) && p.B_batch_stride % kV == 0 && p.B_group_stride % kV == 0 && aligned16(p.C) &&
                         p.C_batch_stride % kV == 0 && p.C_group_stride % kV == 0;
    // At most two blocks an SM: batches 1-2 here (session 37, H100, bench/results/session37/: v10 with its blocks of
    // 128 rows took batch 4 in 11.3 us against this kernel's 13.5; batch 2 7.6 here, 7.6-8.2 there; four blocks an SM in
    // session 36, against v10's 32-row blocks at batch 4; one block an SM before).
    const bool resident = int64_t(p.batch) * p.nheads <= int64_t(2) * num_sms();
    const int arrive = tune_knob("small_arrive") >= 0 ? tune_knob("small_arrive") : 0;
    if (arrive > 2) throw std::invalid_argument("replayssm: REPLAYSSM_TUNE small_arrive must be 0, 1 or 2");
    if (!shape_ok || !aligned || (knob != 1 && !resident) || p.batch > 65535) return false;
    launch_maybe_pdl(mamba2_replay_step_small_kernel<act_t, kN>, dim3(p.nheads, p.batch), K::kThreads, 0, stream,
                     pdl_requested(), "mamba2_replay_step small kernel launch", p, arrive);
    return true;
  }
}
