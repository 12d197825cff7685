// Fold-first block order of the replay steps (bench/NOTES.md, "Session 10").
//
// A row whose slot folds at this step costs its blocks several times a non-folding row's (the fold reads and
// writes the checkpoint, and with an output view writes the view too: ncu, batch 256, every cursor at 0, the GDN
// view's folding launch 705 us against ~100 for the others, the Mamba-2 view's 950 against ~165). With the cursors
// at different positions, as in a serving batch, every launch has some folding rows among many non-folding ones,
// and a folding row's blocks that start in the grid's last waves finish long after the rest: the launch waits on
// them. The replay step kernels therefore take their batch row from `order` when it is given: a permutation of
// the rows with the folding ones first, so that their blocks start in the first wave and the rest fill in around
// them. The block-to-row map changes nothing else (every block still reads its row's slot and cursor).
#pragma once

#include "cuda_utils.cuh"
#include "math.h"

namespace replayssm {

// A record of the order, four ints (16 bytes, one load): x the entry, the batch row with kOrderFolds set when its slot
// folds at this step (so that a block knows before it has read the cursor: the Mamba-2 view's folding blocks then
// stream the master, not the view); y the slot's cursor (0 for a pad row or an out-of-range slot); z, w the slot id's
// low and high halves, as slot_ids holds it (pad and out-of-range ids included: the kernels skip or reject those).
// The order kernel has read the slot and the cursor already, so a block that takes them from its record starts its
// dependent loads (the ring) one trip after its launch instead of three (record, slot id, cursor). The cursor is the
// one the block would read: no block of the launch writes it before every block of the slot has read it, and the
// order kernel runs just ahead on the stream. REPLAYSSM_TUNE order_cursor=0: the blocks read slot_ids and the cursor
// themselves (the form before). Measured (H100, two runs in one session, bench/results/session48/; the views are the
// grids that take the order): GDN view 150.3 against 151.1-151.5 us at batch 256, 80.3-81.0 against 81.3-81.7 at 128,
// 29.5-29.7 against 29.7-30.1 at 32; Mamba-2 view 264.2 against 264.8-265.0 at 256, 135.6-135.7 against 136.1-136.2 at
// 128, 43.9-44.0 against 44.3-44.4 at 32 (-0.2% to -1.2%).
constexpr int kOrderFolds = int(0x80000000u);
static_assert(sizeof(int4) == kOrderInts * sizeof(int), "the ops allocate kOrderInts ints a row (common/math.h) for one record");
__device__ __forceinline__ int order_row(int entry) { return entry & ~kOrderFolds; }
__device__ __forceinline__ bool order_folds(int entry) { return entry < 0; }
__device__ __forceinline__ int4 order_record(const int* order, int i) { return __ldcg(reinterpret_cast<const int4*>(order) + i); }
__device__ __forceinline__ int64_t order_slot(const int4& rec) { return int64_t(uint32_t(rec.z)) | int64_t(rec.w) << 32; }

// A replay block's batch row, slot and cursor: from its record of the order when the launcher says the order carries
// them (`carried`), else the row from the order (or the grid) and the slot id and cursor read here. `entry` keeps the
// record's entry (the fold mark) for the caller. The cursor is read only for a slot in [0, num_slots) (the caller
// rejects the rest before using it).
struct BlockRow {
  int entry, b, w;
  int64_t slot;
};
__device__ __forceinline__ BlockRow block_row(const int* order, bool carried, const void* slot_ids, bool slot_ids_int64,
                                              const int* cursor, int64_t num_slots) {
  BlockRow r;
  if (order != nullptr) {
    const int4 rec = order_record(order, blockIdx.z);
    r.entry = rec.x, r.b = order_row(rec.x);
    if (carried) {
      r.slot = order_slot(rec), r.w = rec.y;
      return r;
    }
  } else {
    r.entry = r.b = int(blockIdx.z);
  }
  r.slot = slot_at(slot_ids, slot_ids_int64, r.b);
  r.w = r.slot >= 0 && r.slot < num_slots ? __ldcg(cursor + r.slot) : 0;
  return r;
}

// ---- Aligned folds (common/math.h folds_at; the cache's fold_phase: [0] the phase, [1] a count, zero between
// launches). Every block of a replay step reads the phase with its cursor (and consumes the load before it counts
// in); the phase advances once per launch, after every block has read it:
// * a launch of several rows: every block, pad rows' blocks too, counts in on fold_phase[1] beside its slot's
//   arrival (issued together, the answer used at the end); the block that counts in last advances the phase and
//   zeroes the count at its end;
// * one row: no count; the row's last block (its slot's arrival) advances it, or, for a pad row, its first block.
// No block writes the phase before every block has counted in, so all read the same value.
__device__ __forceinline__ int read_fold_phase(const int* fold_phase) { return fold_phase ? __ldcg(fold_phase) : -1; }
// (a branch on the value: the load is consumed before the block counts in; the CPU checks the same on the host)
__device__ __forceinline__ void check_fold_phase(const int* fold_phase, int phase, int ring_len, const char* kernel) {
  RSSM_DEVICE_CHECK(fold_phase == nullptr || (phase >= 0 && phase < ring_len), "%s: fold_phase[0] = %d is outside [0, ring_len)",
                    kernel, phase);
}
__device__ __forceinline__ int fold_phase_count_in(int* fold_phase, int rows) {
  return fold_phase != nullptr && rows > 1 ? atomicAdd(fold_phase + 1, 1) : 0;
}
// Thread 0 at the block's end: `counted` its count_in's answer, `row_last` whether it arrived last for its slot. (A
// count that was not 0 at the launch, which only a hand-written fold_phase gives, would let a block advance the phase
// before others have read it: the blocks that count past the grid trap instead of going on quietly.) The block that
// advances the phase reads it again (no block writes it before this one: the value every block read), so that the
// kernels need not keep it in a register through their row loops (bench/NOTES.md, session 43).
__device__ __forceinline__ void fold_phase_count_out(int* fold_phase, int rows, int counted, bool row_last, int ring_len) {
  if (fold_phase == nullptr) return;
  const int total = int(gridDim.x * gridDim.y * gridDim.z);
  RSSM_DEVICE_CHECK(rows <= 1 || counted < total, "replay step: fold_phase[1] was %d, not 0, at the launch", counted - total + 1);
  if (rows > 1 ? counted == total - 1 : row_last) {
    fold_phase[1] = 0;
    fold_phase[0] = next_phase(__ldcg(fold_phase), ring_len);
  }
}
// A pad row's block (all its threads call it; thread 0 acts): counts in, and advances the phase if last.
__device__ __forceinline__ void fold_phase_pad_block(int* fold_phase, int rows, bool first_of_row, int ring_len) {
  if (fold_phase == nullptr || threadIdx.x != 0) return;
  const int total = int(gridDim.x * gridDim.y * gridDim.z);
  const int counted = rows > 1 ? atomicAdd(fold_phase + 1, 1) : 0;
  if (rows > 1 ? counted >= total - 1 : first_of_row) {  // (nobody writes before this)
    check_fold_phase(fold_phase, __ldcg(fold_phase), ring_len, "replay step (a pad row)");
    fold_phase_count_out(fold_phase, rows, counted, true, ring_len);
  }
}

// order[0, batch): the rows whose slot folds at this step (folds_at: its ring fills, or the phase says so) in row
// order, marked with
// kOrderFolds, then the others (pad rows and out-of-range slots among them: the replay kernel skips or rejects
// those). One block.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) fold_first_order_kernel(const void* slot_ids, bool slot_ids_int64, const int* cursor,
                                                                    const int* fold_phase, int64_t num_slots, int ring_len,
                                                                    int batch, int* order) {
  __shared__ int warp_folds[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int phase = fold_phase ? fold_phase[0] : -1;
  auto read = [&](int r, int64_t& slot, int& w) {  // row r's slot and its cursor (0 where the slot is not a live one)
    slot = r < batch ? slot_at(slot_ids, slot_ids_int64, r) : kPadSlot;
    w = slot >= 0 && slot < num_slots ? cursor[slot] : 0;
    return slot >= 0 && slot < num_slots && folds_at(w, phase, ring_len);  // (whether it folds)
  };
  int64_t slot;
  int w, total = 0;
  for (int r0 = 0; r0 < batch; r0 += kThreads) total += __syncthreads_count(read(r0 + threadIdx.x, slot, w));
  int fold_base = 0, rest_base = total;
  for (int r0 = 0; r0 < batch; r0 += kThreads) {
    const int r = r0 + threadIdx.x;
    const bool f = read(r, slot, w);
    const unsigned ballot = __ballot_sync(0xffffffffu, f);
    if (lane == 0) warp_folds[warp] = __popc(ballot);
    __syncthreads();
    int before = __popc(ballot & ((1u << lane) - 1u)), chunk_folds = 0;  // folding rows of the chunk before r, all
#pragma unroll 4
    for (int i = 0; i < kThreads / 32; ++i) {
      const int n = warp_folds[i];
      before += i < warp ? n : 0;
      chunk_folds += n;
    }
    if (r < batch)
      reinterpret_cast<int4*>(order)[f ? fold_base + before : rest_base + int(threadIdx.x) - before] =
          make_int4(f ? r | kOrderFolds : r, w, int(uint32_t(uint64_t(slot))), int(uint64_t(slot) >> 32));
    fold_base += chunk_folds;
    rest_base += min(kThreads, batch - r0) - chunk_folds;
    __syncthreads();  // (warp_folds is rewritten by the next chunk)
  }
}

// The row order for a replay step's grid of `blocks` blocks, `resident` of them at once: `order` (kOrderInts * batch
// ints of device memory, 16-byte aligned) filled fold-first on `stream`, or null (the grid's own order). By default fold-first only where
// it pays (`wanted`, the caller's rule), measured on the H200 (session 10, bench/results/session10/): caches with an
// output view (their folds write the master and the view, 5-7x a non-folding row's time; the GDN replay step took
// it for a plain checkpoint's grid of at most two resident waves in sessions 17-36, gdn/kernels.cuh), and only when the grid is not resident all
// at once (else the order cannot matter, and the extra launch cost 3 us at batch 1). GDN view at batch 32 / 128 /
// 256: 33.3 / 72.1 / 137.4 us against 38.6 / 105.3 / 167.2; Mamba-2 view 46.6 / 128.4 / 214.7 against 50.6 /
// 137.0 / 249.9. Plain fp32 checkpoints (folds ~2.5x a row's time) gained nothing, and the GDN replay at batch 256
// lost 4% (176.9 against 170.4 us: the first wave is then all folds, which stream below the bandwidth).
// REPLAYSSM_TUNE replay_fold_first=1 forces it, =0 turns it off.
// Whether an fp32 checkpoint's folding steps take two row iterations per trip (the replay kernels' pair loops,
// REPLAYSSM_TUNE fold_pair=1 always, 0 never): the Mamba-2 replay step's default, where the grid is past one resident
// wave. At batch 1 the pairs made it slower (7.78 against 7.59 us, H200, bench/results/session15/). (The GDN replay
// step takes pairs for every grid since session 37: gdn/kernels.cuh.)
inline bool fold_pairs(int64_t blocks, int64_t resident) {
  const int knob = tune_knob("fold_pair");
  return knob > 0 || (knob < 0 && blocks > resident);
}

inline int* fold_first_order(int* order, const void* slot_ids, bool slot_ids_int64, const int* cursor, const int* fold_phase,
                             int64_t num_slots, int ring_len, int batch, int64_t blocks, int64_t resident, bool wanted,
                             cudaStream_t stream) {
  const int knob = tune_knob("replay_fold_first");
  if (order == nullptr || knob == 0 || (knob < 0 && (!wanted || blocks <= resident))) return nullptr;
  if (reinterpret_cast<uintptr_t>(order) % 16 != 0)  // (the ops allocate it: an internal error if ever seen)
    throw std::logic_error("replayssm: the fold-first order's memory is not 16-byte aligned");
  fold_first_order_kernel<1024><<<1, 1024, 0, stream>>>(slot_ids, slot_ids_int64, cursor, fold_phase, num_slots, ring_len, batch,
                                                        order);
  check_cuda(cudaGetLastError(), "fold_first_order kernel launch");
  return order;
}

// Whether the replay blocks take their slot and cursor from the order's records (REPLAYSSM_TUNE order_cursor=0: not).
inline bool order_carries() { return tune_knob("order_cursor") != 0; }

}  // namespace replayssm
