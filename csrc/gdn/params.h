// Parameters of the Gated DeltaNet decode ops (MATH.md, "Gated DeltaNet decode"), filled in one place
// (gdn/ops.cpp). Strides in elements; innermost dimensions contiguous. Value heads HV are a multiple of key
// heads H; value head hv uses key head hv / (HV / H). State S of a value head: (V, K), o = S q.
#pragma once

#include <cstdint>

#include "../common/dtype.h"

namespace replayssm {

struct GdnTokenParams {
  int batch = 0, nheads = 0, nkheads = 0, kdim = 0, vdim = 0;  // B, HV, H, K, V
  DType act_dtype = DType::kFloat32;                             // q, k, v, a, b, out
  const void* q = nullptr;  // (batch, H, K)
  int64_t q_batch_stride = 0, q_head_stride = 0;
  const void* k = nullptr;  // (batch, H, K)
  int64_t k_batch_stride = 0, k_head_stride = 0;
  const void* v = nullptr;  // (batch, HV, V)
  int64_t v_batch_stride = 0, v_head_stride = 0;
  const void* a = nullptr;  // (batch, HV) raw decay input
  int64_t a_batch_stride = 0, a_head_stride = 0;
  const void* b = nullptr;  // (batch, HV) raw beta input
  int64_t b_batch_stride = 0, b_head_stride = 0;
  const float* A_log = nullptr;    // (HV,)
  const float* dt_bias = nullptr;  // (HV,) or null
  bool l2norm = true;              // L2-normalise q and k
  float scale = 1.f;               // applied to q (after the normalisation)
  void* out = nullptr;             // (batch, HV, V)
  int64_t out_batch_stride = 0, out_head_stride = 0;
  const void* slot_ids = nullptr;  // (batch,) int32 or int64; kPadSlot rows are skipped
  bool slot_ids_int64 = false;
  int64_t num_slots = 0;
  // Verify only: token k of a row is k * *_token_stride past token 0.
  int ntokens = 1;
  const int* num_tokens = nullptr;
  int64_t q_token_stride = 0, k_token_stride = 0, v_token_stride = 0, a_token_stride = 0, b_token_stride = 0,
          out_token_stride = 0;
};

struct GdnStepParams : GdnTokenParams {
  DType state_dtype = DType::kFloat32;
  void* state = nullptr;  // (num_slots, HV, V, K)
  int64_t state_slot_stride = 0, state_head_stride = 0, state_row_stride = 0;
};

// Replay cache: the ring keeps the correction u (not raw v), the normalised k and the log-decay g, all fp32,
// so that folding them reproduces the sequential state exactly (no activation rounding enters history).
struct GdnReplayCacheParams {
  int ring_len = 0;
  DType ckpt_dtype = DType::kFloat32;
  void* checkpoint = nullptr;  // (num_slots, HV, V, K)
  int64_t ckpt_slot_stride = 0, ckpt_head_stride = 0, ckpt_row_stride = 0;
  float* ring_u = nullptr;  // (num_slots, L, HV, V)
  int64_t ring_u_slot_stride = 0, ring_u_pos_stride = 0, ring_u_head_stride = 0;
  float* ring_k = nullptr;  // (num_slots, L, H, K), normalised
  int64_t ring_k_slot_stride = 0, ring_k_pos_stride = 0, ring_k_head_stride = 0;
  float* ring_g = nullptr;  // (num_slots, L, HV)
  int64_t ring_g_slot_stride = 0, ring_g_pos_stride = 0;
  int* cursor = nullptr;
  int* arrivals = nullptr;
  // (2,) or null: the aligned folds' phase (common/math.h, folds_at) and, on CUDA, the launch's count of blocks
  // that have read it (zero between launches). The replay step reads and advances it; verify ignores it.
  int* fold_phase = nullptr;
  int* pending = nullptr;  // (num_slots,) tokens of the last verify not yet committed, or null
  // The numerical split (MATH.md; the replay step on the CPU and CUDA, verify on the CPU only): a bf16 view of the
  // checkpoint read by every replay step (for GDN it serves S k as well as S q, so its rounding reaches the
  // corrections u that the ring keeps: measured in bench/accuracy), refreshed by folds; stochastic rounding of a
  // narrow checkpoint at folds.
  void* view = nullptr;  // (num_slots, HV, V, K) bf16, or null
  int64_t view_slot_stride = 0, view_head_stride = 0, view_row_stride = 0;
  const int64_t* sr_seed = nullptr;
  int* fold_count = nullptr;
};

struct GdnReplayParams : GdnTokenParams {
  GdnReplayCacheParams cache;
  // Replay step on CUDA: kOrderInts * batch ints of device memory for the fold-first row order
  // (common/fold_order.cuh); the launcher passes the kernel the order it filled there, or null (the grid's order).
  int* row_order = nullptr;
  // 1 = the blocks take their slot and cursor from the order's records (the launcher sets it; common/fold_order.cuh)
  int order_carries = 0;
  // Replay step: 1 = only the first row iteration's copies ahead of the ring's (REPLAYSSM_TUNE replay_stage0_first;
  // the launcher sets it).
  int stage0_first = 0;
  // Replay step of a view: 1 = the folding rows the order marks stream the master alone (REPLAYSSM_TUNE
  // view_fold_lean; the launcher sets it).
  int view_fold_stage = 0;
};

struct GdnReplayStateParams {
  int batch = 0, nheads = 0, nkheads = 0, kdim = 0, vdim = 0;
  GdnReplayCacheParams cache;
  const void* slot_ids = nullptr;
  bool slot_ids_int64 = false;
  int64_t num_slots = 0;
  const int* positions = nullptr;
  float* out = nullptr;  // (batch, HV, V, K) fp32 contiguous
};

}  // namespace replayssm
