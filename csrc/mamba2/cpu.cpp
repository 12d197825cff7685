// CPU implementations of the Mamba-2 decode ops: plain loops, parallel over batch rows, in fp32 with the
// same index and decay math (common/math.h) as the CUDA kernels. Simple on purpose; they must be right.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <vector>

#include "../common/cpu_utils.h"
#include "../common/math.h"
#include "../common/rounding.h"
#include "cpu.h"

namespace replayssm {
namespace {


float head_dt(const Mamba2TokenParams& p, int b, int h, float raw) {
  return process_dt(raw, p.dt_bias ? p.dt_bias[h] : 0.f, p.dt_softplus, p.dt_min, p.dt_max);
}

template <typename act_t>
void write_output(const Mamba2TokenParams& p, int b, int h, int i, float y, float x) {
  if (p.D) y += p.D[h] * x;
  if (p.z) y *= silu(ld<act_t>(p.z, b * p.z_batch_stride + h * p.z_head_stride + i));
  st<act_t>(p.out, b * p.out_batch_stride + h * p.out_head_stride + i, y);
}

template <typename state_t, typename act_t>
void step_cpu(const Mamba2StepParams& p) {
  const int heads_per_group = p.nheads / p.ngroups;
  at::parallel_for(0, p.batch, 1, [&](int64_t b0, int64_t b1) {
    for (int b = static_cast<int>(b0); b < b1; ++b) {
      const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
      if (slot == kPadSlot) continue;
      const int64_t dst = p.dst_slot_ids ? slot_at(p.dst_slot_ids, p.slot_ids_int64, b) : slot;
      for (int h = 0; h < p.nheads; ++h) {
        const int g = h / heads_per_group;
        const float dt = head_dt(p, b, h, ld<act_t>(p.dt, b * p.dt_batch_stride + h * p.dt_head_stride));
        const float decay = expf(dt * p.A[h]);
        const int64_t Bo = b * p.B_batch_stride + g * p.B_group_stride;
        const int64_t Co = b * p.C_batch_stride + g * p.C_group_stride;
        for (int i = 0; i < p.headdim; ++i) {
          const float x = ld<act_t>(p.x, b * p.x_batch_stride + h * p.x_head_stride + i);
          const int64_t row = slot * p.state_slot_stride + h * p.state_head_stride + i * p.state_row_stride;
          const int64_t row_out = row + (dst - slot) * p.state_slot_stride;
          float y = 0.f;
          for (int n = 0; n < p.dstate; ++n) {
            const float s = decay * ld<state_t>(p.state, row + n) + dt * x * ld<act_t>(p.B, Bo + n);
            st<state_t>(p.state, row_out + n, s);
            y += s * ld<act_t>(p.C, Co + n);
          }
          write_output<act_t>(p, b, h, i, y, x);
        }
      }
    }
  });
}

template <typename ckpt_t, typename act_t>
void replay_step_cpu(const Mamba2ReplayStepParams& p) {
  const Mamba2ReplayCacheParams& c = p.cache;
  const int heads_per_group = p.nheads / p.ngroups;
  const int phase = c.fold_phase ? c.fold_phase[0] : -1;  // (aligned folds: every row sees the step's phase)
  at::parallel_for(0, p.batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> bc(c.ring_len), weight(c.ring_len), x_j(c.ring_len);
    for (int b = static_cast<int>(b0); b < b1; ++b) {
      const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
      if (slot == kPadSlot) continue;
      const int w = c.cursor[slot];  // tokens in the ring; this token is number w (0-based)
      const bool fold = folds_at(w, phase, c.ring_len);
      auto ring_B_at = [&](int j, int g, int n) {
        return j < w ? ld<act_t>(c.ring_B, slot * c.ring_B_slot_stride + j * c.ring_B_pos_stride + g * c.ring_B_group_stride + n)
                     : ld<act_t>(p.B, b * p.B_batch_stride + g * p.B_group_stride + n);
      };
      for (int g = 0; g < p.ngroups; ++g) {
        // (B_j . C_t) once per group, shared by its heads.
        for (int j = 0; j <= w; ++j) {
          float acc = 0.f;
          for (int n = 0; n < p.dstate; ++n) acc += ring_B_at(j, g, n) * ld<act_t>(p.C, b * p.C_batch_stride + g * p.C_group_stride + n);
          bc[j] = acc;
        }
        for (int h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
          const float dt_t = head_dt(p, b, h, ld<act_t>(p.dt, b * p.dt_batch_stride + h * p.dt_head_stride));
          auto dt_at = [&](int j) { return j < w ? c.ring_dt[slot * c.ring_dt_slot_stride + j * c.ring_dt_pos_stride + h] : dt_t; };
          const float ckpt_decay = replay_decays(dt_at, w, p.A[h], weight.data());
          for (int i = 0; i < p.headdim; ++i) {
            const float x_t = ld<act_t>(p.x, b * p.x_batch_stride + h * p.x_head_stride + i);
            for (int j = 0; j < w; ++j)
              x_j[j] = ld<act_t>(c.ring_x, slot * c.ring_x_slot_stride + j * c.ring_x_pos_stride + h * c.ring_x_head_stride + i);
            x_j[w] = x_t;
            const int64_t row = slot * c.ckpt_slot_stride + h * c.ckpt_head_stride + i * c.ckpt_row_stride;
            const int64_t vrow = slot * c.view_slot_stride + h * c.view_head_stride + i * c.view_row_stride;
            float sc = 0.f;  // S_c C_t, from the bf16 view when there is one (its rounding reaches this output only)
            for (int n = 0; n < p.dstate; ++n)
              sc += (c.view ? ld<c10::BFloat16>(c.view, vrow + n) : ld<ckpt_t>(c.checkpoint, row + n)) *
                    ld<act_t>(p.C, b * p.C_batch_stride + g * p.C_group_stride + n);
            float y = ckpt_decay * sc;
            for (int j = 0; j <= w; ++j) y += weight[j] * dt_at(j) * bc[j] * x_j[j];
            if (fold) {  // checkpoint <- state after this token (the only write of the checkpoint), from the master
              for (int n = 0; n < p.dstate; ++n) {
                float s = ckpt_decay * ld<ckpt_t>(c.checkpoint, row + n);
                for (int j = 0; j <= w; ++j) s += weight[j] * dt_at(j) * x_j[j] * ring_B_at(j, g, n);
                const int64_t index = (int64_t(h) * p.headdim + i) * p.dstate + n;
                const float stored = c.sr_seed ? stochastic_round_to(c.ckpt_dtype, s,
                                                                     fold_random(uint64_t(c.sr_seed[slot]), c.fold_count[slot], index))
                                               : s;
                st<ckpt_t>(c.checkpoint, row + n, stored);
                if (c.view) st<c10::BFloat16>(c.view, vrow + n, s);
              }
            } else {
              st<act_t>(c.ring_x, slot * c.ring_x_slot_stride + w * c.ring_x_pos_stride + h * c.ring_x_head_stride + i, x_t);
            }
            write_output<act_t>(p, b, h, i, y, x_t);
          }
          if (!fold) c.ring_dt[slot * c.ring_dt_slot_stride + w * c.ring_dt_pos_stride + h] = dt_t;
        }
        if (!fold)
          for (int n = 0; n < p.dstate; ++n)
            st<act_t>(c.ring_B, slot * c.ring_B_slot_stride + w * c.ring_B_pos_stride + g * c.ring_B_group_stride + n, ring_B_at(w, g, n));
      }
      if (fold && c.fold_count) c.fold_count[slot] += 1;
      c.cursor[slot] = fold ? 0 : w + 1;
    }
  });
  if (c.fold_phase) c.fold_phase[0] = next_phase(phase, c.ring_len);
}

// Element (h, i, n) of a slot's state after its first w ring tokens (the checkpoint with them folded in);
// weight and ckpt_decay come from ring_decays(.., w, h, ..).
template <typename ckpt_t, typename act_t>
float state_element(const Mamba2ReplayCacheParams& c, int64_t slot, int w, int h, int g, int i, int n, const float* weight,
                    float ckpt_decay) {
  float s = ckpt_decay * ld<ckpt_t>(c.checkpoint, slot * c.ckpt_slot_stride + h * c.ckpt_head_stride + i * c.ckpt_row_stride + n);
  for (int j = 0; j < w; ++j)
    s += weight[j] * c.ring_dt[slot * c.ring_dt_slot_stride + j * c.ring_dt_pos_stride + h] *
         ld<act_t>(c.ring_x, slot * c.ring_x_slot_stride + j * c.ring_x_pos_stride + h * c.ring_x_head_stride + i) *
         ld<act_t>(c.ring_B, slot * c.ring_B_slot_stride + j * c.ring_B_pos_stride + g * c.ring_B_group_stride + n);
  return s;
}

// Decays of head h over the first w ring tokens; returns the checkpoint's.
inline float ring_decays(const Mamba2ReplayCacheParams& c, int64_t slot, int w, int h, float A, float* weight) {
  return replay_decays([&](int j) { return c.ring_dt[slot * c.ring_dt_slot_stride + j * c.ring_dt_pos_stride + h]; }, w - 1, A,
                       weight);
}

template <typename ckpt_t, typename act_t>
void replay_state_cpu(const Mamba2ReplayStateParams& p) {
  const Mamba2ReplayCacheParams& c = p.cache;
  const int heads_per_group = p.nheads / p.ngroups;
  at::parallel_for(0, p.batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> weight(c.ring_len);
    for (int b = static_cast<int>(b0); b < b1; ++b) {
      const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
      if (slot == kPadSlot) continue;
      const int w = p.positions ? p.positions[b] : c.cursor[slot];
      for (int h = 0; h < p.nheads; ++h) {
        const float ckpt_decay = ring_decays(c, slot, w, h, p.A[h], weight.data());
        for (int i = 0; i < p.headdim; ++i) {
          float* out = p.out + ((static_cast<int64_t>(b) * p.nheads + h) * p.headdim + i) * p.dstate;
          for (int n = 0; n < p.dstate; ++n)
            out[n] = state_element<ckpt_t, act_t>(c, slot, w, h, h / heads_per_group, i, n, weight.data(), ckpt_decay);
        }
      }
    }
  });
}

// Speculative verification: fold the committed history first when the window would not fit, append the
// row's tentative tokens to the ring after the cursor, and give each its output from the checkpoint and
// the ring up to itself. The cursor moves only at such a fold (to 0); commit moves it over accepted tokens.
template <typename ckpt_t, typename act_t>
void replay_verify_cpu(const Mamba2ReplayVerifyParams& p) {
  const Mamba2ReplayCacheParams& c = p.cache;
  const int heads_per_group = p.nheads / p.ngroups;
  const int L = c.ring_len;
  at::parallel_for(0, p.batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> weight(L), bc(L), folded(p.dstate);
    for (int b = static_cast<int>(b0); b < b1; ++b) {
      const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
      if (slot == kPadSlot) continue;
      const int T = p.num_tokens ? p.num_tokens[b] : p.ntokens;
      int w = c.cursor[slot];
      if (w + T > L) {  // early fold: checkpoint <- state at the cursor, ring emptied
        for (int h = 0; h < p.nheads; ++h) {
          const float ckpt_decay = ring_decays(c, slot, w, h, p.A[h], weight.data());
          for (int i = 0; i < p.headdim; ++i) {
            for (int n = 0; n < p.dstate; ++n)
              folded[n] = state_element<ckpt_t, act_t>(c, slot, w, h, h / heads_per_group, i, n, weight.data(), ckpt_decay);
            for (int n = 0; n < p.dstate; ++n) {  // stored as a step's fold stores it (rounding, view)
              const int64_t index = (int64_t(h) * p.headdim + i) * p.dstate + n;
              const float stored = c.sr_seed ? stochastic_round_to(c.ckpt_dtype, folded[n],
                                                                   fold_random(uint64_t(c.sr_seed[slot]), c.fold_count[slot], index))
                                             : folded[n];
              st<ckpt_t>(c.checkpoint, slot * c.ckpt_slot_stride + h * c.ckpt_head_stride + i * c.ckpt_row_stride + n, stored);
              if (c.view)
                st<c10::BFloat16>(c.view, slot * c.view_slot_stride + h * c.view_head_stride + i * c.view_row_stride + n, folded[n]);
            }
          }
        }
        if (c.fold_count) c.fold_count[slot] += 1;
        w = 0;
        c.cursor[slot] = 0;
      }
      if (c.pending) c.pending[slot] = T;
      for (int k = 0; k < T; ++k) {  // the window goes into the ring: accepting it later costs nothing
        const int pos = w + k;
        for (int h = 0; h < p.nheads; ++h) {
          c.ring_dt[slot * c.ring_dt_slot_stride + pos * c.ring_dt_pos_stride + h] =
              head_dt(p, b, h, ld<act_t>(p.dt, b * p.dt_batch_stride + k * p.dt_token_stride + h * p.dt_head_stride));
          for (int i = 0; i < p.headdim; ++i)
            static_cast<act_t*>(c.ring_x)[slot * c.ring_x_slot_stride + pos * c.ring_x_pos_stride + h * c.ring_x_head_stride + i] =
                static_cast<const act_t*>(p.x)[b * p.x_batch_stride + k * p.x_token_stride + h * p.x_head_stride + i];
        }
        for (int g = 0; g < p.ngroups; ++g)
          for (int n = 0; n < p.dstate; ++n)
            static_cast<act_t*>(c.ring_B)[slot * c.ring_B_slot_stride + pos * c.ring_B_pos_stride + g * c.ring_B_group_stride + n] =
                static_cast<const act_t*>(p.B)[b * p.B_batch_stride + k * p.B_token_stride + g * p.B_group_stride + n];
      }
      for (int k = 0; k < T; ++k) {
        const int t = w + k;  // ring position of token k; the sums run over positions 0..t
        for (int g = 0; g < p.ngroups; ++g) {
          const int64_t Co = b * p.C_batch_stride + k * p.C_token_stride + g * p.C_group_stride;
          for (int j = 0; j <= t; ++j) {
            float acc = 0.f;
            for (int n = 0; n < p.dstate; ++n)
              acc += ld<act_t>(c.ring_B, slot * c.ring_B_slot_stride + j * c.ring_B_pos_stride + g * c.ring_B_group_stride + n) *
                     ld<act_t>(p.C, Co + n);
            bc[j] = acc;
          }
          for (int h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
            const float ckpt_decay = ring_decays(c, slot, t + 1, h, p.A[h], weight.data());
            for (int i = 0; i < p.headdim; ++i) {
              const int64_t row = slot * c.ckpt_slot_stride + h * c.ckpt_head_stride + i * c.ckpt_row_stride;
              const int64_t vrow = slot * c.view_slot_stride + h * c.view_head_stride + i * c.view_row_stride;
              float sc = 0.f;  // from the bf16 view when there is one, as the step's outputs
              for (int n = 0; n < p.dstate; ++n)
                sc += (c.view ? ld<c10::BFloat16>(c.view, vrow + n) : ld<ckpt_t>(c.checkpoint, row + n)) * ld<act_t>(p.C, Co + n);
              float y = ckpt_decay * sc;
              for (int j = 0; j <= t; ++j)
                y += weight[j] * c.ring_dt[slot * c.ring_dt_slot_stride + j * c.ring_dt_pos_stride + h] * bc[j] *
                     ld<act_t>(c.ring_x, slot * c.ring_x_slot_stride + j * c.ring_x_pos_stride + h * c.ring_x_head_stride + i);
              const float x = ld<act_t>(p.x, b * p.x_batch_stride + k * p.x_token_stride + h * p.x_head_stride + i);
              if (p.D) y += p.D[h] * x;
              if (p.z) y *= silu(ld<act_t>(p.z, b * p.z_batch_stride + k * p.z_token_stride + h * p.z_head_stride + i));
              st<act_t>(p.out, b * p.out_batch_stride + k * p.out_token_stride + h * p.out_head_stride + i, y);
            }
          }
        }
      }
    }
  });
}

}  // namespace

void mamba2_step_cpu(const Mamba2StepParams& p) {
  RSSM_SWITCH_DTYPE(p.state_dtype, kState, [&] {
    RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
      step_cpu<typename CpuType<kState>::type, typename CpuType<kAct>::type>(p);
    });
  });
}

void mamba2_replay_step_cpu(const Mamba2ReplayStepParams& p) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kCkpt, [&] {
    RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
      replay_step_cpu<typename CpuType<kCkpt>::type, typename CpuType<kAct>::type>(p);
    });
  });
}

void mamba2_replay_verify_cpu(const Mamba2ReplayVerifyParams& p) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kCkpt, [&] {
    RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
      replay_verify_cpu<typename CpuType<kCkpt>::type, typename CpuType<kAct>::type>(p);
    });
  });
}

void mamba2_replay_state_cpu(const Mamba2ReplayStateParams& p) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kCkpt, [&] {
    RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
      replay_state_cpu<typename CpuType<kCkpt>::type, typename CpuType<kAct>::type>(p);
    });
  });
}

}  // namespace replayssm
