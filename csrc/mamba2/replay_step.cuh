// x, or x rounded to T (kRound): a folding row's fp32 master value as its view holds it.
template <bool kRound, typename T>
__device__ __forceinline__ float maybe_round(float x) {
  if constexpr (kRound) return round_to<T>(x);
  else return x;
}

// The replay-step kernel, for every cache: "v10" as measured at commit 6d3ccfd (its prologue and row loop
// unchanged), with the numerical split's fold paths added. It replaced, in session 4, the general kernel that
// had served the split from kernels.cuh: on the H200 at d8f3208 (bench/results/mamba2_decode.json) that one ran
// 1.14-1.58x slower on plain caches and 1.05-1.07x slower on the view at batch 32-256 (0.6 us faster on the view
// at batch 1), for reasons not found (the main loops compiled to the same instructions; the prologue forms were
// A/B'd without effect: bench/NOTES.md, bench/results/mamba2_decode_tune_cdcd8b1.json). (One change from v10:
// ReplayLanes gives 16-bit checkpoints of N = 256 eight lanes per row, not four, which spilled registers.)
// Included by kernels.cuh inside namespace replayssm, after everything it uses.
// src_t == ckpt_t: the checkpoint is streamed for the outputs and rewritten at folds, rounded to nearest or, for
// 16-bit checkpoints with sr_seed, stochastically (the fold count read before the block counts in, incremented
// by the last block). src_t == bf16: an fp32 checkpoint's output view, streamed for the outputs while folds read
// the fp32 master and write master and view.
// kLean (the default since 2026-12-01; REPLAYSSM_TUNE stream_lean=0, or offsets past 32 bits, take the 64-bit
// path): fewer instructions per row for the
// same work. ncu of the plain kernel at batch 256 (2026-11-29) counted ~470 warp instructions per row iteration
// where the arithmetic needs ~100 (an estimate): ~48 went to the cp.async issue (64-bit row addresses from (head, p) each
// iteration), ~22 to the output's address, ~83 to folds (scalar 2-byte loads of B_j per column). kLean forms
// the streamed row's address as a 32-bit offset from a per-lane base (the launcher checks it fits), the output's
// likewise, reads B_j at folds in 8/16-byte vectors, and forms the block scalars in parallel (below). Measured on
// the H200 at 3114e59 (bench/results/mamba2_decode_tune_3114e59.json), batch 256: 325.6 us against 329.3 on an fp32
// checkpoint, 279.7 against 296.8 on the view.
template <typename ckpt_t, typename src_t, typename act_t, int kN, int kThreads, int kStages, bool kLean = false,
          bool kWide = false, int kMinBlocks = 3>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    mamba2_replay_step_kernel_v10(const Mamba2ReplayStepParams p, const int rows_per_block, const int max_heads,
                              const bool io_vec, const bool prefetch_ring, const bool ring_ahead) {
  constexpr bool kView = !std::is_same_v<src_t, ckpt_t>;
  static_assert(!kView || std::is_same_v<ckpt_t, float>, "the output view is of an fp32 checkpoint");
  using Layout = RowLayout<src_t, kN, kThreads, 1, ReplayLanes<src_t, kN>::value>;
  constexpr int kLanes = Layout::kLanesPerRow;
  constexpr int kVecs = Layout::kVecsPerLane;
  constexpr int kCols = Layout::kColsPerLane;
  const Mamba2ReplayCacheParams& c = p.cache;
  // The batch row (the fold-first order's), and the slot and its cursor from the order's record when it carries them
  // (common/fold_order.cuh)
  const BlockRow row = block_row(p.row_order, p.order_carries, p.slot_ids, p.slot_ids_int64, c.cursor, p.num_slots);
  const int order_entry = row.entry;
  const int b = row.b, g = blockIdx.y;
  const int64_t slot = row.slot;
  if (slot == kPadSlot) {  // (waits first with PDL: no block of a step triggers before the launch ahead is done)
    pdl_wait();
    fold_phase_pad_block(c.fold_phase, gridDim.z, blockIdx.x == 0 && blockIdx.y == 0, c.ring_len);
    return;
  }
  RSSM_DEVICE_CHECK(slot >= 0 && slot < p.num_slots, "mamba2_replay_step: slot_ids[%d] = %lld is out of range", b, (long long)slot);
  const int w = row.w;  // (read in block_row: in flight while the first loads are issued; L2, before pdl_wait)
  const int phase = read_fold_phase(c.fold_phase);  // (aligned folds; -1 without)

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
  // This thread's row in the k-th iteration (RowPos).
  const RowPos pos0{row0, row0 / p.headdim - head_begin, row0 % p.headdim};
  auto ckpt_row = [&](const RowPos& q) { return ckpt_group + (head_begin + q.hl) * c.ckpt_head_stride + q.i * c.ckpt_row_stride; };
  // The rows streamed for the outputs: the checkpoint's, or its view's.
  auto src_row = [&](const RowPos& q) {
    if constexpr (kView)
      return static_cast<const src_t*>(c.view) + slot * c.view_slot_stride +
             (int64_t(g) * heads_per_group + head_begin + q.hl) * c.view_head_stride + q.i * c.view_row_stride;
    else
      return ckpt_row(q);
  };

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
  float* wb = reinterpret_cast<float*>(smem_raw + off.wb);  // (kLean)
  float* decay = reinterpret_cast<float*>(smem_raw + off.decay);
  float* Ds = reinterpret_cast<float*>(smem_raw + off.Ds);
  float* As = reinterpret_cast<float*>(smem_raw + off.As);
  float* bc = reinterpret_cast<float*>(smem_raw + off.bc);
  const int ts = off.tile_stride;

  // kWide: the launch's folding rows take the throughput loops (the launcher, below: grids past one resident wave).
  // A view's kernel (launched with the fold-first order): a folding row that the order marks reads no
  // view. The view is always the master rounded to nearest (allocation, reset_slots and every fold write them so),
  // so the fp32 master that the fold reads serves the output too, rounded to bf16: the view's values bit for bit, 1/6
  // fewer bytes at a fold. The marked blocks stream the master rows through the staging buffer, kStages / 2
  // iterations ahead, in a row loop of their own (row_loop<true>, below). Unmarked folding rows (no order: grids
  // resident at once, which take the kernel without kWide and its code) stream the view and load the master
  // where used. H200, batch 256, every row folding (ncu, bench/NOTES.md, session 14): 789 us, against 866 with the
  // choice made inside the one row loop and the master loaded where used (bae7856: nothing in flight while the rank-w
  // update ran), and 932-950 with each lane staging its own columns (half-sector copies, 38% excess wavefronts).
  constexpr int kMasterStages = kStages / 2, kMasterVecs = 2 * kVecs;  // (the staging buffer, in fp32 vectors)
  constexpr bool kCanStage = kWide && kView && kStages >= 4 && kStages % 2 == 0;
  static_assert(!kCanStage || sizeof(src_t) == 2, "a lane's fp32 master columns are 2 kVecs 16-byte vectors of a 16-bit view's");
  static_assert(!kCanStage || Layout::kRowsPerIter * (kN / 4) == kMasterVecs * kThreads, "a master stage holds an iteration's rows");
  const bool marked = kCanStage && order_folds(order_entry);
  RowPos copy_pos = pos0;
  // kLean: this lane's first column in the block's first head, and 32-bit strides (src_row's values).
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
    copy_pos.advance<Layout::kRowsPerIter>(p.headdim);
  };
  // A marked row's master vectors of iteration `it` into master stage `stage` (an empty group past the end). A stage
  // holds the iteration's rows whole, [row of the iteration][16-byte chunk], and a row's lanes copy consecutive
  // chunks (whole 32-byte sectors per instruction): copying each lane's own columns (32-byte strides, half a sector
  // per access) cost 38% excess shared wavefronts (ncu, session 14). Odd rows of a warp store chunk k at k ^ 5, so
  // that neither the copies (a quarter-warp: two rows' 4 consecutive chunks) nor the reads (two rows' chunks 2l + h)
  // meet in a bank. The row's lanes read each other's copies: __syncwarp around the stage (row_loop<true>).
  constexpr int kChunks = kN / 4;  // 16-byte fp32 chunks per master row
  // (chunk k ^ mask: the mask only touches k's low 3 bits, so k ^ mask = (k & ~7) + ((k & 7) ^ mask).)
  const int chunk_mask = (kLanes == 4 && kChunks >= 8 && (row_in_warp & 1)) ? 5 : 0;
  const int master_row_s = (warp * Layout::kRowsPerWarp + row_in_warp) * kChunks;  // (+ stage * kMasterVecs * kThreads)
  auto master_chunk = [&](int k) { return master_row_s + (k & ~7) + ((k & 7) ^ chunk_mask); };
  auto issue_master = [&](int it, int stage) {
    if constexpr (kCanStage) {
      if (it < n_iter && copy_pos.r < row_end)
        copy_row_chunks_async<kMasterVecs, kLanes>(staging + stage * kMasterVecs * kThreads, ckpt_row(copy_pos), lane_in_row,
                                                   master_chunk);
    }
    cp_async_commit();
    copy_pos.advance<Layout::kRowsPerIter>(p.headdim);
  };
  // stage0_first (the default; REPLAYSSM_TUNE m2_replay_stage0_first=0: off): only iteration 0 now, iterations 1..
  // after the ring's group (below), so that the prologue waits for iteration 0 and the ring alone (a thread's groups
  // complete in order; the row loops' waits count as before, the ring's group being older than iteration 1's).
  const bool stage0_first = p.stage0_first != 0;
  auto issue_first = [&](int from, int to) {  // the first stages from..to-1 of the loop this block runs
    if (marked) {
#pragma unroll
      for (int it = 0; it < kMasterStages - 1; ++it)
        if (it >= from && it < to) issue_master(it, it);
    } else {
#pragma unroll
      for (int it = 0; it < kStages - 1; ++it)
        if (it >= from && it < to) issue(it, it);
    }
  };
  issue_first(0, stage0_first ? 1 : kStages);

  // ---- Prologue: this token's inputs and the ring into shared memory (one cp.async group).
  const act_t* ring_x =
      static_cast<const act_t*>(c.ring_x) + slot * c.ring_x_slot_stride + int64_t(g) * heads_per_group * c.ring_x_head_stride;
  const act_t* ring_B = static_cast<const act_t*>(c.ring_B) + slot * c.ring_B_slot_stride + g * c.ring_B_group_stride;
  const float* ring_dt = c.ring_dt + slot * c.ring_dt_slot_stride + h0;
  // The ring's positions 0..nj-1, every entry by cp.async (the dt entries too: a plain load whose value is stored
  // to shared memory holds its thread until it arrives, and the loads after it wait behind it; .ca, through L1:
  // the ring was written by an earlier launch, complete before this one began).
  auto load_ring = [&](int nj) {
    copy_head_rows<act_t, kThreads>(xs, ts, ring_x, c.ring_x_pos_stride, c.ring_x_head_stride, p.headdim, row_begin, nrows, nj,
                                    io_vec);
    copy_head_rows<act_t, kThreads>(Bring, kN, ring_B, c.ring_B_pos_stride, 0, kN, 0, kN, nj, io_vec);
    for (int idx = threadIdx.x; idx < nheads_block * nj; idx += kThreads) {
      const int hl = idx / nj, j = idx % nj;
      cp_async4(&dts[hl * L + j], &ring_dt[j * c.ring_dt_pos_stride + hl]);
    }
  };
  // ring_ahead (with PDL): the ring is this cache's, written by this layer's previous step, so it is requested
  // before the wait too, behind the row stages.
  if (ring_ahead) {
    check_replay_cursor(w, L, slot, "mamba2_replay_step");
    load_ring(prefetch_ring ? L - 1 : w);
  }

  // With PDL (common/cuda_utils.cuh) the rows above (the slot's checkpoint or view, and with ring_ahead the ring) were
  // requested before the kernel ahead on the stream had finished; this token's inputs are read, and anything
  // written, only after it has.
  pdl_wait();
  pdl_trigger();

  const act_t* x_t = static_cast<const act_t*>(p.x) + b * p.x_batch_stride + int64_t(g) * heads_per_group * p.x_head_stride;
  copy_head_rows<act_t, kThreads>(xt_s, 0, x_t, 0, p.x_head_stride, p.headdim, row_begin, nrows, 1, io_vec);
  if (p.z) {
    const act_t* z_t = static_cast<const act_t*>(p.z) + b * p.z_batch_stride + int64_t(g) * heads_per_group * p.z_head_stride;
    copy_head_rows<act_t, kThreads>(zs, 0, z_t, 0, p.z_head_stride, p.headdim, row_begin, nrows, 1, io_vec);
  }
  // (the ring's copies before the loads below, whose stores wait for them)
  load_ring_after_wait(ring_ahead, prefetch_ring, w, L, slot, "mamba2_replay_step", load_ring);
  {
    // This token's B, C and head scalars: every load issued before any value is used (each thread's values first
    // into registers, then converted and stored), so that they make one round trip. With a loop of loads and
    // stores per quantity (B and C, then the heads' dt, bias, D and A), each loop's loads waited for the stores
    // before them: a thread holding a head made two trips in sequence (three with the ring's dt loaded likewise).
    const act_t* Bt = static_cast<const act_t*>(p.B) + b * p.B_batch_stride + g * p.B_group_stride;
    const act_t* Ct = static_cast<const act_t*>(p.C) + b * p.C_batch_stride + g * p.C_group_stride;
    constexpr int kNPer = (kN + kThreads - 1) / kThreads;
    act_t braw[kNPer], craw[kNPer];
#pragma unroll
    for (int i = 0; i < kNPer; ++i) {
      const int n = threadIdx.x + i * kThreads;
      if (n < kN) braw[i] = Bt[n], craw[i] = Ct[n];
    }
    const int hl = threadIdx.x;  // a thread per head of the block (nheads_block <= kThreads: the launcher)
    const bool head = hl < nheads_block;
    float dt_raw = 0.f, dt_bias = 0.f, Dh = 0.f, Ah = 0.f;
    if (head) {
      const int h = h0 + hl;
      dt_raw = to_float(static_cast<const act_t*>(p.dt)[b * p.dt_batch_stride + h * p.dt_head_stride]);
      if (p.dt_bias) dt_bias = p.dt_bias[h];
      if (p.D) Dh = p.D[h];
      Ah = p.A[h];  // (beside the inputs: read where the decays use it, after the barrier, it was a round trip of its own)
    }
#pragma unroll
    for (int i = 0; i < kNPer; ++i) {
      const int n = threadIdx.x + i * kThreads;
      if (n < kN) Bt_s[n] = to_float(braw[i]), C_s[n] = to_float(craw[i]);
    }
    if (head) {
      dtt[hl] = process_dt(dt_raw, dt_bias, p.dt_softplus, p.dt_min, p.dt_max);
      Ds[hl] = Dh;
      As[hl] = Ah;
    }
  }
  check_replay_cursor(w, L, slot, "mamba2_replay_step");
  check_fold_phase(c.fold_phase, phase, L, "mamba2_replay_step");
  cp_async_commit();
  if (stage0_first) issue_first(1, kStages);
  // The fold count (stochastic rounding's Philox counter): read, and waited for, before the block counts in,
  // since the slot's last block increments it.
  uint32_t fold_no = 0;
  if (c.fold_count != nullptr) {  // (any cache that counts its folds: the last block increments it)
    fold_no = uint32_t(c.fold_count[slot]);
    if (fold_no == 0xffffffffu) __trap();  // (consumes the load before the barrier; 2^32 folds do not happen)
  }
  // The ring's group and every group before it (stage0_first: the later first stages may stay in flight).
  if (!stage0_first) cp_async_wait<0>();
  else if (marked) cp_async_wait<(kMasterStages > 2 ? kMasterStages - 2 : 0)>();
  else cp_async_wait<(kStages > 2 ? kStages - 2 : 0)>();
  __syncthreads();  // tiles written; every thread of the block has read the cursor

  // Count this block in: all its threads have read the cursor, so the slot's last block to arrive may advance
  // it now (the slot's other blocks read it before they arrived). No fence, and off the tail: the answer is
  // used at the end. (Counting in at the end behind a fence cost ~1 us per step at batch 1.)
  const int blocks_per_row = gridDim.x * gridDim.y;
  int arrived = 0, counted = 0;
  if (threadIdx.x == 0) {
    arrived = atomicAdd(&c.arrivals[slot], 1);
    counted = fold_phase_count_in(c.fold_phase, gridDim.z);
  }

  // ---- Block scalars: B_j . C_t (a warp per j) and the decays (a thread per head). kLean: 8 lanes per j (every
  // position at once for L <= kThreads / 8 + 1) and a thread per (head, j), each suffix sum in replay_decays'
  // order (the CPU's values) without its serial chain of exponentials: a shorter prologue at small batches.
  const bool fold = folds_at(w, phase, L);
  RSSM_DEVICE_CHECK(fold || !marked, "mamba2_replay_step: the fold-first order marks row %d folding, its cursor is %d", b, w);
  if constexpr (kLean) {
    constexpr int kPer = kN / 8;
    const int lane8 = lane & 7;
    for (int first = warp * 4; first <= w; first += kThreads / 8) {  // (every lane of a warp: the same trip count)
      const int j = first + (lane >> 3);
      float acc = 0.f;
      if (j <= w)
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int n = lane8 * kPer + e;
          acc = fmaf(j < w ? to_float(Bring[j * kN + n]) : Bt_s[n], C_s[n], acc);
        }
      acc = group_sum<8>(acc);  // (a butterfly: every lane of the 8 holds the same sum)
      if (j <= w) {
        // The decays of position j, a lane of its 8 per head: wdt for the fold, and wb = wdt (B_j . C_t), the
        // coefficient the output epilogue used to form per row and position, with D folded into the token's own
        // (the same fp32 operations as that epilogue's, contracted as nvcc contracted them there: the same bits).
        for (int hl = lane8; hl < nheads_block; hl += 8) {
          auto dt_at = [&](int k) { return k < w ? dts[hl * L + k] : dtt[hl]; };
          const float A = As[hl];
          float suffix = 0.f;
          for (int k = w; k > j; --k) suffix += dt_at(k);
          const float wd = expf(A * suffix) * dt_at(j);
          wdt[hl * L + j] = wd;
          wb[hl * L + j] = j < w ? wd * acc : fmaf(wd, acc, Ds[hl]);
          if (j == 0) decay[hl] = expf(A * (suffix + dt_at(0)));
        }
      }
    }
  } else {
    for (int j = warp; j <= w; j += Layout::kWarps) {
      float acc = 0.f;
      for (int n = lane; n < kN; n += 32) acc = fmaf(j < w ? to_float(Bring[j * kN + n]) : Bt_s[n], C_s[n], acc);
      acc = group_sum<32>(acc);
      if (lane == 0) bc[j] = acc;
    }
    if (threadIdx.x < nheads_block) {
      const int hl = threadIdx.x;
      auto dt_at = [&](int j) { return j < w ? dts[hl * L + j] : dtt[hl]; };
      float* w_row = wdt + hl * L;
      decay[hl] = replay_decays(dt_at, w, As[hl], w_row);
      for (int j = 0; j <= w; ++j) w_row[j] *= dt_at(j);
    }
  }
  // This lane's columns of C_t: in registers, or (4 blocks per SM: 128 registers) read from shared memory where used.
  constexpr bool kCvShared = kMinBlocks >= 4 && Layout::kVec % 4 == 0;
  float Cv[kCvShared ? 1 : kCols];
  if constexpr (!kCvShared)
#pragma unroll
    for (int v = 0; v < kVecs; ++v)
#pragma unroll
      for (int e = 0; e < Layout::kVec; ++e) Cv[v * Layout::kVec + e] = C_s[Layout::col(lane_in_row, v, e)];
  // part[0..3] += x[col] C_t[col] over this lane's columns, four independent chains (one chain of kCols dependent
  // FMAs was the largest stall, waiting on the previous FMA); x rounded to src_t first when kRound.
  auto dot_C = [&](const float* x, float* part, auto round_tag) {
    constexpr bool kRound = decltype(round_tag)::value;
    if constexpr (kCvShared) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
#pragma unroll
        for (int e = 0; e < Layout::kVec; e += 4) {
          const float4 c4 = *reinterpret_cast<const float4*>(C_s + Layout::col(lane_in_row, v, e));
          const int col = v * Layout::kVec + e;
          part[0] = fmaf(maybe_round<kRound, src_t>(x[col]), c4.x, part[0]);
          part[1] = fmaf(maybe_round<kRound, src_t>(x[col + 1]), c4.y, part[1]);
          part[2] = fmaf(maybe_round<kRound, src_t>(x[col + 2]), c4.z, part[2]);
          part[3] = fmaf(maybe_round<kRound, src_t>(x[col + 3]), c4.w, part[3]);
        }
    } else {
#pragma unroll
      for (int col = 0; col < kCols; ++col) part[col % 4] = fmaf(maybe_round<kRound, src_t>(x[col]), Cv[col], part[col % 4]);
    }
  };
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
  act_t* const out_block = static_cast<act_t*>(p.out) + b * p.out_batch_stride + int64_t(h0) * p.out_head_stride;  // (kLean)
  // The output epilogue (this token's x, D, the gate, the store) of kLanes consecutive iterations runs at once,
  // a row per lane: lane k of a row's lanes keeps the sum of the iteration it with it % kLanes == k (y_pend, its
  // row in pend), so every lane works where one in kLanes did (ncu, batch 256, view: ~60 of ~230 warp instructions per iteration were the
  // epilogue). Measured with the other row-loop cuts of adf5103: view 241.6 against 256.3 us at batch 256.
  // Pending: (head within the block) << 16 | p, or -1 for none (two registers, not five: the view's kernel spilled).
  // record: iteration it's sum y of row q; the epilogue at every kLanes-th iteration and the last.
  auto record = [&](float& y_pend, int& pend, int it, float y, const RowPos& q, bool valid) {
    const int k = it % kLanes;
    if (k == lane_in_row) y_pend = y, pend = valid ? q.hl << 16 | q.i : -1;
    if (k == kLanes - 1 || it == n_iter - 1) {  // lanes past the last iteration hold nothing (pend -1)
      if (pend >= 0) {
        const int hp = pend >> 16, ip = pend & 0xffff, rp = (head_begin + hp) * p.headdim + ip - row_begin;
        // The ring's part of the output, sum_{j<w} exp(c_t - c_j) dt_j (B_j . C_t) x_j[p], by the row's epilogue
        // lane alone: no loop in every iteration with a stride of kLanes (~35 of ~200 warp instructions).
        float yo = y_pend;
        if constexpr (kLean) {  // (the products formed once per block, with the decays)
          const float* wb_p = wb + hp * L;
#pragma unroll 4
          for (int j = 0; j < w; ++j) yo = fmaf(wb_p[j], to_float(xs[j * ts + rp]), yo);
          yo = fmaf(wb_p[w], to_float(xt_s[rp]), yo);
        } else {
          const float* wdt_p = wdt + hp * L;
#pragma unroll 4
          for (int j = 0; j < w; ++j) yo = fmaf(wdt_p[j] * bc[j], to_float(xs[j * ts + rp]), yo);
          yo = fmaf(wdt_p[w] * bc[w] + Ds[hp], to_float(xt_s[rp]), yo);
        }
        if (p.z) yo *= silu(to_float(zs[rp]));
        if constexpr (kLean)
          out_block[hp * int(p.out_head_stride) + ip] = from_float<act_t>(yo);
        else
          static_cast<act_t*>(p.out)[b * p.out_batch_stride + (h0 + hp) * p.out_head_stride + ip] = from_float<act_t>(yo);
      }
      pend = -1;
    }
  };
  // The row loop; kMaster: a marked folding row's (every row folds; the master staged, no view read).
  auto row_loop = [&](auto master_tag) {
    constexpr bool kMaster = decltype(master_tag)::value;
    RowPos pos = pos0;
    float y_pend = 0.f;  // (record's)
    int pend = -1;
    int stage = 0;  // it % kStages
    for (int it = 0; it < n_iter; ++it) {
      if constexpr (kMaster) {
        __syncwarp();  // the row's lanes have read the stage that this issue refills
        issue_master(it + kMasterStages - 1, stage == 0 ? kMasterStages - 1 : stage - 1);
        cp_async_wait<kMasterStages - 1>();
        __syncwarp();  // and its lanes' copies of iteration `it` have landed
      } else {
        issue(it + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
        cp_async_wait<kStages - 1>();  // this thread's vectors of iteration `it` have landed
      }
      const RowPos q = pos;
      pos.advance<Layout::kRowsPerIter>(p.headdim);
      const bool valid = q.r < row_end;
      const int hl = valid ? q.hl : 0, rl = valid ? q.r - row_begin : 0;
      float s[kCols];
      // S_c . C_t over this lane's columns in four independent chains (one chain of kCols dependent FMAs was the
      // largest stall, waiting on the previous FMA).
      float part[4] = {0.f, 0.f, 0.f, 0.f};
      if constexpr (kMaster) {  // the master row; the view's values are its bf16 rounding
        read_row_chunks<Layout, kMasterVecs>(staging + stage * kMasterVecs * kThreads, lane_in_row, master_chunk, s);
        stage = stage == kMasterStages - 1 ? 0 : stage + 1;
        dot_C(s, part, std::true_type{});
      } else {
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
          unpack16<src_t>(staging[(stage * kVecs + v) * kThreads + threadIdx.x],
                          *reinterpret_cast<float(*)[Layout::kVec]>(&s[v * Layout::kVec]));
        stage = stage == kStages - 1 ? 0 : stage + 1;
        dot_C(s, part, std::false_type{});
      }
      const float* wdt_h = wdt + hl * L;
      const float y = group_sum<kLanes>(decay[hl] * ((part[0] + part[1]) + (part[2] + part[3])));
      record(y_pend, pend, it, y, q, valid);
      if (kMaster || fold) {
        // New checkpoint row: exp(c_t) S_c + sum_{j<=w} exp(c_t - c_j) dt_j x_j[p] B_j.
        if constexpr (kView && !kMaster) {  // from this lane's columns of the fp32 master row (the view served the output)
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
          const float coef = wdt_h[j] * to_float(xs[j * ts + rl]);
          const act_t* Bj = Bring + j * kN;
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
            if constexpr (kLean) {
              float bv[Layout::kVec];
              load_shared_vec<act_t, Layout::kVec>(Bj + Layout::col(lane_in_row, v, 0), bv);
#pragma unroll
              for (int e = 0; e < Layout::kVec; ++e) s[v * Layout::kVec + e] = fmaf(coef, bv[e], s[v * Layout::kVec + e]);
            } else {
#pragma unroll
              for (int e = 0; e < Layout::kVec; ++e)
                s[v * Layout::kVec + e] = fmaf(coef, to_float(Bj[Layout::col(lane_in_row, v, e)]), s[v * Layout::kVec + e]);
            }
          }
        }
        const float coef = wdt_h[w] * to_float(xt_s[rl]);
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < Layout::kVec; ++e)
            s[v * Layout::kVec + e] = fmaf(coef, Bt_s[Layout::col(lane_in_row, v, e)], s[v * Layout::kVec + e]);
        if (valid) {
          ckpt_t* row = const_cast<ckpt_t*>(ckpt_row(q));
          if constexpr (kView) {  // the fp32 master and its bf16 view (rounded to nearest) of the same values
            Layout::store_master_and_view(row, const_cast<src_t*>(src_row(q)), lane_in_row, s);
          } else {
            if constexpr (!std::is_same_v<ckpt_t, float>) {
              if (c.sr_seed != nullptr) {  // stochastic rounding: Philox keyed by the slot's seed, its fold count, the element
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
            }
#pragma unroll
            for (int v = 0; v < kVecs; ++v)
              store16_stream(row + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[Layout::kVec]>(&s[v * Layout::kVec]));
          }
        }
      }
    }
  };
  // A folding step of an fp32 checkpoint in a kWide kernel (REPLAYSSM_TUNE fold_pair, the launcher): two
  // row iterations per trip, so that each B_j vector the rank-w update reads from shared memory, and converts, serves
  // two rows. ncu, H200, batch 256, every row folding (bench/NOTES.md, session 15): 640 us and 368M warp
  // instructions against 677 us and 462M one row per trip (the other launches: 274-296 us at 3.9-4.0 TB/s).
  // Per row the same arithmetic in the same order as row_loop's: the same bits.
  constexpr bool kFoldPair = kWide && !kView && sizeof(ckpt_t) == 4;
  static_assert(!kFoldPair || Layout::kVec == 4, "an fp32 row's 16-byte vectors");
  auto fold_pair_loop = [&] {
    if constexpr (kFoldPair) {  // (compiled for fp32 checkpoints only)
      RowPos pos = pos0;
      float y_pend = 0.f;
      int pend = -1;
      int stage = 0;  // it % kStages
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
        pos.advance<Layout::kRowsPerIter>(p.headdim);
        const RowPos qb = pos;
        pos.advance<Layout::kRowsPerIter>(p.headdim);
        const bool va = qa.r < row_end, vb = qb.r < row_end;  // (vb false past the last iteration)
        const int hla = va ? qa.hl : 0, rla = va ? qa.r - row_begin : 0, hlb = vb ? qb.hl : 0, rlb = vb ? qb.r - row_begin : 0;
        // C_t from shared memory here (Cv is the loop below's: kept live across this loop as well, it spilled).
        float pa[4] = {0.f, 0.f, 0.f, 0.f}, pb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          const float4 c4 = *reinterpret_cast<const float4*>(C_s + Layout::col(lane_in_row, v, 0));
          const float cv[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
          for (int e = 0; e < Layout::kVec; ++e) {
            const int col = v * Layout::kVec + e;
            pa[col % 4] = fmaf(sa[col], cv[e], pa[col % 4]), pb[col % 4] = fmaf(sb[col], cv[e], pb[col % 4]);
          }
        }
        // Iteration it + kStages into iteration it's stage, whose vectors are in sa (the shared loads are consumed).
        issue(it + kStages, stage);
        stage = stage_b == kStages - 1 ? 0 : stage_b + 1;
        const float da = decay[hla], db = decay[hlb];
        record(y_pend, pend, it, group_sum<kLanes>(da * ((pa[0] + pa[1]) + (pa[2] + pa[3]))), qa, va);
        const float yb = group_sum<kLanes>(db * ((pb[0] + pb[1]) + (pb[2] + pb[3])));
        if (it + 1 < n_iter) record(y_pend, pend, it + 1, yb, qb, vb);
        // New checkpoint rows: exp(c_t) S_c + sum_{j<=w} exp(c_t - c_j) dt_j x_j[p] B_j.
#pragma unroll
        for (int col = 0; col < kCols; ++col) sa[col] *= da, sb[col] *= db;
        const float* w_a = wdt + hla * L;
        const float* w_b = wdt + hlb * L;
#pragma unroll 1
        for (int j = 0; j < w; ++j) {
          const float ca = w_a[j] * to_float(xs[j * ts + rla]), cb = w_b[j] * to_float(xs[j * ts + rlb]);
          const act_t* Bj = Bring + j * kN;
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
            float bv[Layout::kVec];
            if constexpr (kLean) {
              load_shared_vec<act_t, Layout::kVec>(Bj + Layout::col(lane_in_row, v, 0), bv);
            } else {
#pragma unroll
              for (int e = 0; e < Layout::kVec; ++e) bv[e] = to_float(Bj[Layout::col(lane_in_row, v, e)]);
            }
#pragma unroll
            for (int e = 0; e < Layout::kVec; ++e) {
              sa[v * Layout::kVec + e] = fmaf(ca, bv[e], sa[v * Layout::kVec + e]);
              sb[v * Layout::kVec + e] = fmaf(cb, bv[e], sb[v * Layout::kVec + e]);
            }
          }
        }
        const float cta = w_a[w] * to_float(xt_s[rla]), ctb = w_b[w] * to_float(xt_s[rlb]);
#pragma unroll
        for (int v = 0; v < kVecs; ++v)
#pragma unroll
          for (int e = 0; e < Layout::kVec; ++e) {
            const float bt = Bt_s[Layout::col(lane_in_row, v, e)];
            sa[v * Layout::kVec + e] = fmaf(cta, bt, sa[v * Layout::kVec + e]);
            sb[v * Layout::kVec + e] = fmaf(ctb, bt, sb[v * Layout::kVec + e]);
          }
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          if (va) store16_stream(const_cast<ckpt_t*>(ckpt_row(qa)) + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[Layout::kVec]>(&sa[v * Layout::kVec]));
          if (vb) store16_stream(const_cast<ckpt_t*>(ckpt_row(qb)) + Layout::col(lane_in_row, v, 0), *reinterpret_cast<float(*)[Layout::kVec]>(&sb[v * Layout::kVec]));
        }
      }
    }
  };
  if constexpr (kCanStage) {
    if (marked)
      row_loop(std::true_type{});
    else
      row_loop(std::false_type{});
  } else if constexpr (kFoldPair) {
    if (fold)
      fold_pair_loop();
    else
      row_loop(std::false_type{});
  } else {
    row_loop(std::false_type{});
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
  if (threadIdx.x == 0) {
    const bool row_last = arrived == blocks_per_row - 1;
    if (row_last) {
      atomicSub(&c.arrivals[slot], blocks_per_row);  // zero again for the next launch
      c.cursor[slot] = fold ? 0 : w + 1;
      if (fold && c.fold_count) c.fold_count[slot] = int(fold_no) + 1;
    }
    fold_phase_count_out(c.fold_phase, gridDim.z, counted, row_last, L);
  }
}

// kMinBlocks: blocks per SM (__launch_bounds__; the rows rule, the shared-memory budget, the ring prefetch, the
// fold-first order and the pair choice follow it).
template <typename ckpt_t, typename act_t, int kN, typename src_t = ckpt_t, int kStages = 3, int kMinBlocks = 3>
void launch_mamba2_replay_step_v10(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  // Two stages in flight while a third is read, 128 bytes of a row per thread per stage: with three blocks
  // of 128 threads per SM, ~96 KiB of checkpoint reads outstanding per SM.
  constexpr int kThreads = 128;
  using Layout = RowLayout<src_t, kN, kThreads, 1, ReplayLanes<src_t, kN>::value>;
  const Mamba2ReplayCacheParams& c = p.cache;
  // Rows of a group per block: enough blocks for ~4 waves of 3 blocks per SM (prologues overlap other
  // blocks' streaming; the last wave is short), at most 128 KiB of streamed rows, as each block repeats the
  // prologue: 256 fp32 rows of N = 128 (512 rows measured 5% slower at batch 128 and within noise at 256:
  // +1.6% at 3114e59, -1.4% at aef8ba1, bench/results/mamba2_decode*.json), 512 bf16 ones (the view: 255.8 us
  // against 279.7 at batch 256, the same at 128; H200, 3114e59, bench/results/mamba2_decode_tune_3114e59.json).
  const int group_rows = (p.nheads / p.ngroups) * p.headdim;
  const int64_t groups_total = int64_t(p.batch) * p.ngroups;
  const int64_t target_blocks = int64_t(num_sms()) * 12;
  int64_t rows = (groups_total * group_rows + target_blocks - 1) / target_blocks;
  const int forced_rows = tune_knob("replay_rows");
  if (forced_rows > 0) rows = forced_rows;
  rows = std::max<int64_t>(Layout::kRowsPerIter, (rows + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter * Layout::kRowsPerIter);
  // An fp32 checkpoint whose grid is one resident wave (batch 1 here): a block per SM, not blocks of one row
  // iteration, each repeating the whole prologue. H200, N = 128, batch 1, four runs in session 15: 64 rows (128
  // blocks) 7.39 us against 7.48-7.78 for the rule's 32 (256 blocks), 8.1 for 128. REPLAYSSM_TUNE replay_sm_rows=0:
  // the rule above.
  if (forced_rows <= 0 && sizeof(src_t) == 4 && tune_knob("replay_sm_rows") != 0) {
    const int64_t per_sm = (groups_total * group_rows + num_sms() - 1) / num_sms();
    const int64_t r = (per_sm + Layout::kRowsPerIter - 1) / Layout::kRowsPerIter * Layout::kRowsPerIter;
    const int64_t rule_blocks = groups_total * ((group_rows + rows - 1) / rows);
    if (r <= group_rows && r > rows && rule_blocks <= int64_t(num_sms()) * kMinBlocks) rows = r;  // (the rule's grid: one wave)
  }
  // Where the rule gives fewer than 256 rows and its grid is past two blocks an SM (batches 2-43 here): blocks of 128
  // rows. The rule's 32-224 rows repeat the prologue (slot, ring, B . C, decays) for one to seven row iterations. H100,
  // N = 128, us (bench/results/session36/ and session37/, the replay_rows=128 entries): fp32 checkpoint 11.3 / 18.8 /
  // 31.1-31.5 / 57.6-58.2 at batch 4 / 8 / 16 / 32 against the rule's 18.8 / 20.4 / 32.1-32.5 / 58.4-58.8 (32, 64, 96
  // and 192 rows; 256 rows 12.9 / 20.4-21.3 / 33.8-34.4 / 58.9-59.7); the bf16 view 7.6 / 8.8 / 9.6 / 14.9 / 26.5 at
  // batch 2 / 3 / 4 / 8 / 16 against 8.8 / 16.9 / 18.5 / 20.9 / 29.6 (from 32 up the view's own rule below gives 256 or
  // 512). REPLAYSSM_TUNE replay_min_rows=0: the rule's rows.
  if (forced_rows <= 0 && tune_knob("replay_min_rows") != 0 && rows < 256 &&
      groups_total * ((group_rows + rows - 1) / rows) > int64_t(num_sms()) * 2) {
    const int64_t r = std::max<int64_t>(Layout::kRowsPerIter, 128 / Layout::kRowsPerIter * Layout::kRowsPerIter);
    rows = std::min<int64_t>(r, group_rows);
  }
  // At most kThreads heads per block (the decays take a thread per head; a block that straddles heads holds one
  // more than rows / headdim).
  constexpr int kMaxRows = 128 * 1024 / (kN * int(sizeof(src_t)));
  const int max_rows = std::max(kMaxRows, Layout::kRowsPerIter);
  int rows_per_block = static_cast<int>(std::min<int64_t>({rows, group_rows, forced_rows > 0 ? int64_t(1) << 20 : max_rows,
                                                          int64_t(kThreads - 1) * p.headdim}));
  // 16-bit rows of N = 128 (the view), since the fold-first order: 512 rows where the grid is three waves of kMinBlocks
  // blocks per SM or more, else 256 where it is two waves of 3 or more, else the rule above. H200, session 11, shuffled
  // interleaved timings (bench/results/session11/), us at batch 32 / 128 / 256 for 128, 256, 512, 1024 rows: 53.0 /
  // 41.8 / 55.5 / 81.6; 181.9 / 128.7 / 110.3 / 121.5; 349.9 / 245.1 / 207.4 / 213.0 (the former rule's 46.9 / 128.8
  // / 206.9). Until session 49 512 rows also needed only two waves of 3: batches 50-98 here. H100, L = 16 (4 blocks
  // per SM), session 49 (bench/results/session49/mamba2_view_bps12_call3_h100.json), 128 / 256 / 512 rows: batch 32
  // 45.3 / 44.1 / 68.4, 48 63.1 / 57.5 / 67.5, 64 80.6 / 73.7 / 82.8, 96 115.1 / 106.0 / 106.2, 128 149.2 / 138.5 / 135.5.
  // This rule, session 50 (bench/results/session50/mamba2_view_mw_call1_h100.json): 63.65 / 71.77 / 79.37 us at batch
  // 56 / 64 / 72 against the replay_rows=512 entry's (the former rule's) 72.75 / 80.33 / 85.34; 48 and 96-256 as before.
  if constexpr (sizeof(src_t) == 2 && kN == 128) {
    if (forced_rows <= 0)
      for (const int r : {512, 256}) {
        const int64_t chunks_r = (group_rows + r - 1) / r;
        const int64_t min_blocks = int64_t(num_sms()) * (r == 512 ? kMinBlocks * 3 : 3 * 2);
        // (r <= (kThreads - 1) * headdim: at most kThreads heads per block, as above; the kernel's prologue takes a
        // thread per head)
        if (r <= group_rows && r % Layout::kRowsPerIter == 0 && r <= (kThreads - 1) * p.headdim &&
            chunks_r * groups_total >= min_blocks) {
          rows_per_block = std::max(rows_per_block, r);
          break;
        }
      }
  }
  auto heads_for = [&](int r) { return std::min((r + p.headdim - 1) / p.headdim + 1, p.nheads / p.ngroups); };
  auto smem_for = [&](int r) {
    return size_t(ReplaySmem(kStages * Layout::kVecsPerLane * kThreads * 16, sizeof(act_t), r, kN, c.ring_len, heads_for(r)).total);
  };
  const size_t smem_limit = size_t(max_smem_per_block());
  // Past 256 rows only while three blocks still fit an SM's shared memory (long rings).
  while (forced_rows <= 0 && rows_per_block > 256 && smem_for(rows_per_block) > size_t(smem_per_sm() / kMinBlocks - 1024))
    rows_per_block = std::max(256, rows_per_block / 2 / Layout::kRowsPerIter * Layout::kRowsPerIter);
  while (smem_for(rows_per_block) > smem_limit && rows_per_block > Layout::kRowsPerIter)
    rows_per_block = std::max(Layout::kRowsPerIter, rows_per_block / 2 / Layout::kRowsPerIter * Layout::kRowsPerIter);
  if (smem_for(rows_per_block) > smem_limit)
    throw std::invalid_argument("replayssm: mamba2_replay_step needs more shared memory than the device has for this "
                                "dstate and ring_len");
  if (p.headdim > 0xffff)  // (the kernel packs a row's p into 16 bits)
    throw std::invalid_argument("replayssm: mamba2_replay_step on CUDA supports headdim up to 65535, got " + std::to_string(p.headdim));
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
  const bool prefetch_ring = forced_prefetch >= 0 ? forced_prefetch > 0 : blocks <= int64_t(num_sms()) * kMinBlocks;
  const size_t smem_bytes = smem_for(rows_per_block);
  // kLean's 32-bit offsets: a block's rows within a group of heads, and the outputs of a batch row.
  const bool view = !std::is_same_v<src_t, ckpt_t>;
  const int64_t head_stride = view ? c.view_head_stride : c.ckpt_head_stride, row_stride = view ? c.view_row_stride : c.ckpt_row_stride;
  const bool offsets_fit = int64_t(p.nheads / p.ngroups) * head_stride + int64_t(p.headdim) * row_stride < (int64_t(1) << 31) &&
                           int64_t(p.nheads) * p.out_head_stride < (int64_t(1) << 31);
  Mamba2ReplayStepParams q = p;
  // Default on since session 36 (H100, one run, bench/results/session36/: plain 24.1 / 58.4 / 206.6 / 401.3 ->
  // 20.4 / 56.9 / 205.5 / 400.2 us at batch 8 / 32 / 128 / 256, the view 22.5 / 45.2 / 133.3 / 258.0 -> 20.7 / 43.7 /
  // 131.9 / 257.1; batch 2 level within its spread).
  q.stage0_first = tune_knob("m2_replay_stage0_first") == 0 ? 0 : 1;
  q.row_order = fold_first_order(p.row_order, p.slot_ids, p.slot_ids_int64, c.cursor, c.fold_phase, p.num_slots, c.ring_len,
                                 p.batch, blocks, int64_t(num_sms()) * kMinBlocks, view, stream);
  q.order_carries = q.row_order != nullptr && order_carries() ? 1 : 0;
  // kWide (the kernel, above): a view's folding rows marked by the order read the master alone, staged
  // (REPLAYSSM_TUNE view_fold_lean=0: the view streamed too); an fp32 checkpoint's folding steps run two row
  // iterations per trip (fold_pair: unset, grids past one resident wave; 1 always; 0 never). Batch 1 (one wave)
  // measured 7.78 us with pairs against 7.59 without (H200, session 15): a resident grid's fold is latency-bound,
  // and the pair's longer trips only lengthen it. Other launches take the kernel without those loops.
  const bool lean = tune_knob("stream_lean") != 0 && offsets_fit;
  const bool wide = view ? q.row_order != nullptr && tune_knob("view_fold_lean") != 0
                         : sizeof(ckpt_t) == 4 && fold_pairs(blocks, int64_t(num_sms()) * kMinBlocks);
  auto kernel = lean ? mamba2_replay_step_kernel_v10<ckpt_t, src_t, act_t, kN, kThreads, kStages, true, false, kMinBlocks>
                     : mamba2_replay_step_kernel_v10<ckpt_t, src_t, act_t, kN, kThreads, kStages, false, false, kMinBlocks>;
  if constexpr (std::is_same_v<ckpt_t, float>)  // (a 16-bit checkpoint's kernel has no such loop)
    if (wide)
      kernel = lean ? mamba2_replay_step_kernel_v10<ckpt_t, src_t, act_t, kN, kThreads, kStages, true, true, kMinBlocks>
                    : mamba2_replay_step_kernel_v10<ckpt_t, src_t, act_t, kN, kThreads, kStages, false, true, kMinBlocks>;
  if (smem_bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)),
               "mamba2_replay_step shared memory");
  const dim3 grid(chunks, p.ngroups, p.batch);
  // PDL only without the order kernel just ahead (fold_first_order returns null when it launched none): the kernel
  // reads its entry of the order before pdl_wait().
  // With PDL the ring is requested before the wait too (REPLAYSSM_TUNE pdl_ring_ahead=0: after it, as without PDL).
  const bool pdl = pdl_requested() && q.row_order == nullptr, ring_ahead = pdl && tune_knob("pdl_ring_ahead") != 0;
  launch_maybe_pdl(kernel, grid, kThreads, smem_bytes, stream, pdl, "mamba2_replay_step kernel launch", q, rows_per_block,
                   heads_for(rows_per_block), io_vec, prefetch_ring, ring_ahead);
}

