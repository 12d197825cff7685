// Math shared by the CPU and CUDA implementations: dt processing, gates, ring bookkeeping and the
// replay decays. Everything here is __host__ __device__ so that the CPU tests exercise the very
// functions that the kernels run (../../shared/docs/MATH.md is the specification).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RSSM_HD __host__ __device__ __forceinline__
#else
#define RSSM_HD inline
#endif

namespace replayssm {

// A slot id equal to this is a padding row: it is skipped and nothing of it is read or written.
constexpr int64_t kPadSlot = -1;

// Ints of device memory per batch row that the CUDA replay steps' fold-first order takes (a 16-byte record:
// common/fold_order.cuh; the ops allocate it).
constexpr int kOrderInts = 4;

// Ring length limits of the replay cache (tokens kept between two folds).
constexpr int kMinRing = 2;
constexpr int kMaxRing = 64;

// Row b's slot in the state pool; slot ids come as int32 or int64.
RSSM_HD int64_t slot_at(const void* slot_ids, bool is_int64, int b) {
  return is_int64 ? static_cast<const int64_t*>(slot_ids)[b] : static_cast<const int32_t*>(slot_ids)[b];
}

RSSM_HD float softplus(float v) { return v <= 20.f ? log1pf(expf(v)) : v; }

RSSM_HD float silu(float v) { return v / (1.f + expf(-v)); }

// dt as the recurrence uses it: softplus(raw + bias) when asked, then clamped to [dt_min, dt_max].
RSSM_HD float process_dt(float raw, float bias, bool use_softplus, float dt_min, float dt_max) {
  float dt = raw + bias;
  if (use_softplus) dt = softplus(dt);
  return fminf(fmaxf(dt, dt_min), dt_max);
}

RSSM_HD float sigmoid(float v) { return 1.f / (1.f + expf(-v)); }

// Gated DeltaNet's log-decay: g = -exp(A_log) * softplus(a + dt_bias) (< 0); alpha = exp(g).
RSSM_HD float gdn_log_decay(float a, float dt_bias, float A_log) { return -expf(A_log) * softplus(a + dt_bias); }

// Epsilon of the L2 normalisation of q and k (x / sqrt(sum x^2 + eps)), as in fla.
constexpr float kL2NormEps = 1e-6f;

// The ring holds the tokens since the checkpoint at positions 0..cursor-1. A step appends its token
// at position `cursor`; when that fills the ring (cursor + 1 == ring_len) the step folds instead:
// the checkpoint becomes the state after the token and the ring restarts empty (the cursor returns to 0).
// Aligned folds (replayssm/cache.py, `fold_phase`): a cache may carry a phase p in [0, ring_len) that every
// replay step advances by one (mod ring_len); the step then also folds a row when p + 1 == ring_len (an early
// fold of the w tokens the ring holds, by the same formula). After one phase boundary every row that steps at
// each call folds at the same call. phase -1: no phase (folds only when the ring fills).
RSSM_HD bool folds_at(int cursor, int phase, int ring_len) { return cursor + 1 == ring_len || phase + 1 == ring_len; }
RSSM_HD int next_phase(int phase, int ring_len) { return phase + 1 == ring_len ? 0 : phase + 1; }

// Replay decays over tokens 0..last (dt_at(j) is token j's processed dt, A < 0 the head's rate):
//   weight[j] = exp(A * (dt[j+1] + ... + dt[last]))      for j = 0..last   (weight[last] == 1)
//   returns     exp(A * (dt[0] + ... + dt[last]))         the decay of the checkpoint over all of them.
// Suffix sums (not differences of prefix sums) keep every exponent exact to rounding of its own terms.
// last == -1 (an empty ring, no token) returns 1 and writes nothing.
template <typename DtAt>
RSSM_HD float replay_decays(DtAt dt_at, int last, float A, float* weight) {
  float suffix = 0.f;
  for (int j = last; j >= 0; --j) {
    weight[j] = expf(A * suffix);
    suffix += dt_at(j);
  }
  return expf(A * suffix);
}

}  // namespace replayssm
