// The parameters of the Mamba-2 decode ops, filled in one place (mamba2_ops.cpp) and read by both the
// CPU loops and the CUDA kernels. Strides are in elements; the innermost dimension of every tensor
// here is contiguous (checked when the struct is filled).
#pragma once

#include <cstdint>

#include "../common/dtype.h"

namespace replayssm {

// The per-token inputs shared by the standard and the replay step.
struct Mamba2TokenParams {
  int batch = 0, nheads = 0, headdim = 0, ngroups = 0, dstate = 0;  // B, H, P, G, N
  DType act_dtype = DType::kFloat32;  // x, dt, B, C, z, out

  const void* x = nullptr;   // (batch, nheads, headdim)
  int64_t x_batch_stride = 0, x_head_stride = 0;
  const void* dt = nullptr;  // (batch, nheads), raw
  int64_t dt_batch_stride = 0, dt_head_stride = 0;
  const float* A = nullptr;        // (nheads,)  A_h = -exp(A_log_h)
  const float* D = nullptr;        // (nheads,) or null
  const float* dt_bias = nullptr;  // (nheads,) or null
  const void* B = nullptr;  // (batch, ngroups, dstate)
  int64_t B_batch_stride = 0, B_group_stride = 0;
  const void* C = nullptr;  // (batch, ngroups, dstate)
  int64_t C_batch_stride = 0, C_group_stride = 0;
  const void* z = nullptr;  // (batch, nheads, headdim) or null: y *= silu(z)
  int64_t z_batch_stride = 0, z_head_stride = 0;
  void* out = nullptr;      // (batch, nheads, headdim)
  int64_t out_batch_stride = 0, out_head_stride = 0;

  bool dt_softplus = false;
  float dt_min = 0.f, dt_max = 0.f;

  const void* slot_ids = nullptr;  // (batch,) int32 or int64; kPadSlot rows are skipped
  bool slot_ids_int64 = false;
  int64_t num_slots = 0;
};

// Standard step: reads and writes state[slot] in place.
struct Mamba2StepParams : Mamba2TokenParams {
  DType state_dtype = DType::kFloat32;
  void* state = nullptr;  // (num_slots, nheads, headdim, dstate)
  int64_t state_slot_stride = 0, state_head_stride = 0, state_row_stride = 0;
  // (batch,) same dtype as slot_ids, or null: the new state goes to state[dst_slot_ids[b]] instead of back to
  // state[slot_ids[b]] (one state per draft position: the per-position baseline of speculative decoding).
  const void* dst_slot_ids = nullptr;
};

// The replay cache of one layer (replayssm/cache.py allocates it).
struct Mamba2ReplayCacheParams {
  int ring_len = 0;  // L
  DType ckpt_dtype = DType::kFloat32;
  void* checkpoint = nullptr;  // (num_slots, nheads, headdim, dstate)
  int64_t ckpt_slot_stride = 0, ckpt_head_stride = 0, ckpt_row_stride = 0;
  void* ring_x = nullptr;  // (num_slots, L, nheads, headdim), activation dtype
  int64_t ring_x_slot_stride = 0, ring_x_pos_stride = 0, ring_x_head_stride = 0;
  void* ring_B = nullptr;  // (num_slots, L, ngroups, dstate), activation dtype
  int64_t ring_B_slot_stride = 0, ring_B_pos_stride = 0, ring_B_group_stride = 0;
  float* ring_dt = nullptr;  // (num_slots, L, nheads), processed dt, fp32
  int64_t ring_dt_slot_stride = 0, ring_dt_pos_stride = 0;
  int* cursor = nullptr;    // (num_slots,) tokens in the ring since the checkpoint
  int* arrivals = nullptr;  // (num_slots,) zero between launches; CUDA blocks count in to advance the cursor
  // (2,) or null: the aligned folds' phase (common/math.h, folds_at) and, on CUDA, the launch's count of blocks
  // that have read it (zero between launches). The replay step reads and advances it; verify ignores it.
  int* fold_phase = nullptr;
  // The numerical split (MATH.md): an optional bf16 view of the checkpoint that serves outputs (refreshed at
  // each fold), and optional stochastic rounding of a narrow checkpoint at folds (seeded per slot).
  void* view = nullptr;  // (num_slots, nheads, headdim, dstate) bf16, or null
  int64_t view_slot_stride = 0, view_head_stride = 0, view_row_stride = 0;
  const int64_t* sr_seed = nullptr;  // (num_slots,) or null: round to nearest
  int* fold_count = nullptr;         // (num_slots,) folds so far (the Philox counter), or null
  int* pending = nullptr;            // (num_slots,) tokens of the last verify not yet committed, or null
};

struct Mamba2ReplayStepParams : Mamba2TokenParams {
  Mamba2ReplayCacheParams cache;
  // On CUDA: kOrderInts * batch ints of device memory for the fold-first row order (common/fold_order.cuh); the
  // launcher passes the kernel the order it filled there, or null (the grid's order).
  int* row_order = nullptr;
  // 1 = the blocks take their slot and cursor from the order's records (the launcher sets it; common/fold_order.cuh)
  int order_carries = 0;
  // 1 = only the first row iteration's copies ahead of the ring's (REPLAYSSM_TUNE m2_replay_stage0_first; the
  // launcher sets it: 1 unless the knob says 0).
  int stage0_first = 0;
};

// Speculative verification of up to `ntokens` tentative tokens per row (MATH.md, "Verifying T tokens at
// once"). The Mamba2TokenParams pointers address token 0; token k is `k * *_token_stride` further.
struct Mamba2ReplayVerifyParams : Mamba2TokenParams {
  Mamba2ReplayCacheParams cache;
  int ntokens = 0;                 // T (the window)
  const int* num_tokens = nullptr;  // (batch,) tokens of each row, 1..T, or null: T for every row
  int64_t x_token_stride = 0, dt_token_stride = 0, B_token_stride = 0, C_token_stride = 0, z_token_stride = 0,
          out_token_stride = 0;
};

// Writes the state at each slot's current cursor (checkpoint with the ring folded in) to out.
struct Mamba2ReplayStateParams {
  int batch = 0, nheads = 0, headdim = 0, ngroups = 0, dstate = 0;
  DType act_dtype = DType::kFloat32;
  const float* A = nullptr;
  Mamba2ReplayCacheParams cache;
  const void* slot_ids = nullptr;
  bool slot_ids_int64 = false;
  int64_t num_slots = 0;
  const int* positions = nullptr;  // (batch,) committed position of each row (<= cursor), or null: the cursor
  float* out = nullptr;  // (batch, nheads, headdim, dstate) fp32, contiguous
};

}  // namespace replayssm
