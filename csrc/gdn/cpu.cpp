// CPU implementations of the Gated DeltaNet decode ops: plain loops over (row, value head), fp32 math with
// the shared gate and decay helpers of common/math.h. MATH.md, "Gated DeltaNet decode", is the specification.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <vector>

#include "../common/cpu_utils.h"
#include "../common/math.h"
#include "../common/rounding.h"
#include "cpu.h"

namespace replayssm {
namespace {


// One token of one row as the recurrence uses it: q and k of every key head normalised (q scaled), and the
// log-decay g and beta of every value head.
struct Token {
  std::vector<float> q, k, g, beta;  // (H, K), (H, K), (HV,), (HV,)
};

template <typename act_t>
void load_token(const GdnTokenParams& p, int b, int t, Token& tok) {
  const int K = p.kdim;
  tok.q.resize(size_t(p.nkheads) * K);
  tok.k.resize(size_t(p.nkheads) * K);
  tok.g.resize(p.nheads);
  tok.beta.resize(p.nheads);
  for (int h = 0; h < p.nkheads; ++h) {
    float qq = 0.f, kk = 0.f;
    for (int n = 0; n < K; ++n) {
      const float qv = ld<act_t>(p.q, b * p.q_batch_stride + t * p.q_token_stride + h * p.q_head_stride + n);
      const float kv = ld<act_t>(p.k, b * p.k_batch_stride + t * p.k_token_stride + h * p.k_head_stride + n);
      tok.q[h * K + n] = qv;
      tok.k[h * K + n] = kv;
      qq += qv * qv;
      kk += kv * kv;
    }
    const float qs = (p.l2norm ? 1.f / std::sqrt(qq + kL2NormEps) : 1.f) * p.scale;
    const float ks = p.l2norm ? 1.f / std::sqrt(kk + kL2NormEps) : 1.f;
    for (int n = 0; n < K; ++n) {
      tok.q[h * K + n] *= qs;
      tok.k[h * K + n] *= ks;
    }
  }
  for (int hv = 0; hv < p.nheads; ++hv) {
    tok.g[hv] = gdn_log_decay(ld<act_t>(p.a, b * p.a_batch_stride + t * p.a_token_stride + hv * p.a_head_stride),
                              p.dt_bias ? p.dt_bias[hv] : 0.f, p.A_log[hv]);
    tok.beta[hv] = sigmoid(ld<act_t>(p.b, b * p.b_batch_stride + t * p.b_token_stride + hv * p.b_head_stride));
  }
}

float dot(const float* x, const float* y, int n) {
  float acc = 0.f;
  for (int i = 0; i < n; ++i) acc += x[i] * y[i];
  return acc;
}

template <typename state_t, typename act_t>
void step_cpu(const GdnStepParams& p) {
  const int ratio = p.nheads / p.nkheads, K = p.kdim, V = p.vdim;
  at::parallel_for(0, p.batch, 1, [&](int64_t b0, int64_t b1) {
    Token tok;
    std::vector<float> row(K);
    for (int b = static_cast<int>(b0); b < b1; ++b) {
      const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
      if (slot == kPadSlot) continue;
      load_token<act_t>(p, b, 0, tok);
      for (int hv = 0; hv < p.nheads; ++hv) {
        const float* k = &tok.k[(hv / ratio) * K];
        const float* q = &tok.q[(hv / ratio) * K];
        const float alpha = std::exp(tok.g[hv]);
        for (int r = 0; r < V; ++r) {
          const int64_t base = slot * p.state_slot_stride + hv * p.state_head_stride + r * p.state_row_stride;
          for (int n = 0; n < K; ++n) row[n] = ld<state_t>(p.state, base + n);
          const float v = ld<act_t>(p.v, b * p.v_batch_stride + hv * p.v_head_stride + r);
          const float u = tok.beta[hv] * (v - alpha * dot(row.data(), k, K));  // S_t = alpha S + u k^T
          float o = 0.f;
          for (int n = 0; n < K; ++n) {
            const float s = alpha * row[n] + u * k[n];
            st<state_t>(p.state, base + n, s);
            o += s * q[n];
          }
          st<act_t>(p.out, b * p.out_batch_stride + hv * p.out_head_stride + r, o);
        }
      }
    }
  });
}

// Row-local view of a slot's replay cache.
template <typename ckpt_t>
struct SlotCache {
  const GdnReplayCacheParams& c;
  int64_t slot;
  int K, V;
  float ckpt(int hv, int r, int n) const {
    return ld<ckpt_t>(c.checkpoint, slot * c.ckpt_slot_stride + hv * c.ckpt_head_stride + r * c.ckpt_row_stride + n);
  }
  // What a replay token's products S_c k and S_c q read: the bf16 view when there is one, else the checkpoint.
  float served(int hv, int r, int n) const {
    return c.view ? ld<c10::BFloat16>(c.view, slot * c.view_slot_stride + hv * c.view_head_stride + r * c.view_row_stride + n)
                  : ckpt(hv, r, n);
  }
  float* u(int j, int hv) const { return c.ring_u + slot * c.ring_u_slot_stride + j * c.ring_u_pos_stride + hv * c.ring_u_head_stride; }
  float* k(int j, int h) const { return c.ring_k + slot * c.ring_k_slot_stride + j * c.ring_k_pos_stride + h * c.ring_k_head_stride; }
  float& g(int j, int hv) const { return c.ring_g[slot * c.ring_g_slot_stride + j * c.ring_g_pos_stride + hv]; }
  // Decays of value head hv over ring positions 0..w-1: weight[j] = exp(g_{j+1} + ... + g_{w-1}); returns exp(G_w).
  float decays(int w, int hv, float* weight) const {
    return replay_decays([&](int j) { return g(j, hv); }, w - 1, 1.f, weight);
  }
  // State element (r, n) of value head hv after the first w ring tokens.
  float state(int w, int hv, int h, int r, int n, const float* weight, float ckpt_decay) const {
    float s = ckpt_decay * ckpt(hv, r, n);
    for (int j = 0; j < w; ++j) s += weight[j] * u(j, hv)[r] * k(j, h)[n];
    return s;
  }
};

// One replay token at ring position w (ring tokens 0..w-1 before it): output, and the correction u; the
// token is written to ring position w when `append`, else (a fold) the checkpoint becomes S_t.
template <typename ckpt_t, typename act_t>
void replay_token(const GdnTokenParams& p, const SlotCache<ckpt_t>& sc, int b, int t, int w, const Token& tok, bool fold,
                  std::vector<float>& weight, std::vector<float>& kk, std::vector<float>& kq, std::vector<float>& u) {
  const int ratio = p.nheads / p.nkheads, K = p.kdim, V = p.vdim;
  const GdnReplayCacheParams& c = sc.c;
  for (int h = 0; h < p.nkheads; ++h) {
    const float* k = &tok.k[h * K];
    const float* q = &tok.q[h * K];
    for (int j = 0; j < w; ++j) {  // (k_j . k_t) and (k_j . q_t): once per key head, shared by its value heads
      kk[h * c.ring_len + j] = dot(sc.k(j, h), k, K);
      kq[h * c.ring_len + j] = dot(sc.k(j, h), q, K);
    }
  }
  for (int hv = 0; hv < p.nheads; ++hv) {
    const int h = hv / ratio;
    const float* k = &tok.k[h * K];
    const float* q = &tok.q[h * K];
    const float ckpt_decay = sc.decays(w, hv, weight.data());
    const float alpha = std::exp(tok.g[hv]), kq_t = dot(k, q, K);
    for (int r = 0; r < V; ++r) {
      float Sk = 0.f, Sq = 0.f;
      for (int n = 0; n < K; ++n) {
        const float s = sc.served(hv, r, n);
        Sk += s * k[n];
        Sq += s * q[n];
      }
      Sk *= ckpt_decay;
      Sq *= ckpt_decay;
      for (int j = 0; j < w; ++j) {
        const float wu = weight[j] * sc.u(j, hv)[r];
        Sk += wu * kk[h * c.ring_len + j];
        Sq += wu * kq[h * c.ring_len + j];
      }
      const float v = ld<act_t>(p.v, b * p.v_batch_stride + t * p.v_token_stride + hv * p.v_head_stride + r);
      u[r] = tok.beta[hv] * (v - alpha * Sk);
      st<act_t>(p.out, b * p.out_batch_stride + t * p.out_token_stride + hv * p.out_head_stride + r, alpha * Sq + u[r] * kq_t);
    }
    if (fold) {  // checkpoint <- S_t = alpha S_{t-1} + u_t k_t^T (the only write of the checkpoint)
      for (int r = 0; r < V; ++r) {
        std::vector<float> row(K);
        for (int n = 0; n < K; ++n) row[n] = alpha * sc.state(w, hv, h, r, n, weight.data(), ckpt_decay) + u[r] * k[n];
        for (int n = 0; n < K; ++n) {
          const int64_t index = (int64_t(hv) * V + r) * K + n;  // the element's Philox counter, as for Mamba-2
          const float stored = c.sr_seed ? stochastic_round_to(c.ckpt_dtype, row[n],
                                                               fold_random(uint64_t(c.sr_seed[sc.slot]), c.fold_count[sc.slot], index))
                                         : row[n];
          st<ckpt_t>(c.checkpoint, sc.slot * c.ckpt_slot_stride + hv * c.ckpt_head_stride + r * c.ckpt_row_stride + n, stored);
          if (c.view)
            st<c10::BFloat16>(c.view, sc.slot * c.view_slot_stride + hv * c.view_head_stride + r * c.view_row_stride + n, row[n]);
        }
      }
    } else {
      for (int r = 0; r < V; ++r) sc.u(w, hv)[r] = u[r];
      sc.g(w, hv) = tok.g[hv];
    }
  }
  if (!fold)
    for (int h = 0; h < p.nkheads; ++h)
      for (int n = 0; n < K; ++n) sc.k(w, h)[n] = tok.k[h * K + n];
}

template <typename ckpt_t, typename act_t>
void replay_cpu(const GdnReplayParams& p, bool verify) {
  const GdnReplayCacheParams& c = p.cache;
  const int ratio = p.nheads / p.nkheads;
  const int phase = !verify && c.fold_phase ? c.fold_phase[0] : -1;  // (aligned folds: the replay step's only)
  at::parallel_for(0, p.batch, 1, [&](int64_t b0, int64_t b1) {
    Token tok;
    std::vector<float> weight(c.ring_len), kk(size_t(p.nkheads) * c.ring_len), kq(size_t(p.nkheads) * c.ring_len),
        u(p.vdim), row(p.kdim);
    for (int b = static_cast<int>(b0); b < b1; ++b) {
      const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
      if (slot == kPadSlot) continue;
      const SlotCache<ckpt_t> sc{c, slot, p.kdim, p.vdim};
      int w = c.cursor[slot];
      if (!verify) {
        load_token<act_t>(p, b, 0, tok);
        const bool fold = folds_at(w, phase, c.ring_len);
        replay_token<ckpt_t, act_t>(p, sc, b, 0, w, tok, fold, weight, kk, kq, u);
        if (fold && c.fold_count) c.fold_count[slot] += 1;
        c.cursor[slot] = fold ? 0 : w + 1;
        continue;
      }
      const int T = p.num_tokens ? p.num_tokens[b] : p.ntokens;
      if (w + T > c.ring_len) {  // early fold: checkpoint <- state at the cursor (from the master, never the view)
        for (int hv = 0; hv < p.nheads; ++hv) {
          const float ckpt_decay = sc.decays(w, hv, weight.data());
          for (int r = 0; r < p.vdim; ++r) {
            for (int n = 0; n < p.kdim; ++n) row[n] = sc.state(w, hv, hv / ratio, r, n, weight.data(), ckpt_decay);
            for (int n = 0; n < p.kdim; ++n) {  // stored as the step's fold stores it (rounding, view)
              const int64_t index = (int64_t(hv) * p.vdim + r) * p.kdim + n;  // the step fold's Philox counter
              const float stored = c.sr_seed ? stochastic_round_to(c.ckpt_dtype, row[n],
                                                                   fold_random(uint64_t(c.sr_seed[slot]), c.fold_count[slot], index))
                                             : row[n];
              st<ckpt_t>(c.checkpoint, slot * c.ckpt_slot_stride + hv * c.ckpt_head_stride + r * c.ckpt_row_stride + n, stored);
              if (c.view)
                st<c10::BFloat16>(c.view, slot * c.view_slot_stride + hv * c.view_head_stride + r * c.view_row_stride + n, row[n]);
            }
          }
        }
        if (c.fold_count) c.fold_count[slot] += 1;
        w = 0;
        c.cursor[slot] = 0;
      }
      if (c.pending) c.pending[slot] = T;
      for (int t = 0; t < T; ++t) {  // each token sees the ring and the window's earlier corrections
        load_token<act_t>(p, b, t, tok);
        replay_token<ckpt_t, act_t>(p, sc, b, t, w + t, tok, /*fold=*/false, weight, kk, kq, u);
      }
    }
  });
  if (!verify && c.fold_phase) c.fold_phase[0] = next_phase(phase, c.ring_len);
}

template <typename ckpt_t>
void state_cpu(const GdnReplayStateParams& p) {
  const GdnReplayCacheParams& c = p.cache;
  const int ratio = p.nheads / p.nkheads;
  at::parallel_for(0, p.batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> weight(c.ring_len);
    for (int b = static_cast<int>(b0); b < b1; ++b) {
      const int64_t slot = slot_at(p.slot_ids, p.slot_ids_int64, b);
      if (slot == kPadSlot) continue;
      const SlotCache<ckpt_t> sc{c, slot, p.kdim, p.vdim};
      const int w = p.positions ? p.positions[b] : c.cursor[slot];
      for (int hv = 0; hv < p.nheads; ++hv) {
        const float ckpt_decay = sc.decays(w, hv, weight.data());
        for (int r = 0; r < p.vdim; ++r)
          for (int n = 0; n < p.kdim; ++n)
            p.out[((int64_t(b) * p.nheads + hv) * p.vdim + r) * p.kdim + n] =
                sc.state(w, hv, hv / ratio, r, n, weight.data(), ckpt_decay);
      }
    }
  });
}

}  // namespace

void gdn_step_cpu(const GdnStepParams& p) {
  RSSM_SWITCH_DTYPE(p.state_dtype, kS, [&] {
    RSSM_SWITCH_DTYPE(p.act_dtype, kA, [&] { step_cpu<typename CpuType<kS>::type, typename CpuType<kA>::type>(p); });
  });
}

void gdn_replay_step_cpu(const GdnReplayParams& p) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kC, [&] {
    RSSM_SWITCH_DTYPE(p.act_dtype, kA, [&] { replay_cpu<typename CpuType<kC>::type, typename CpuType<kA>::type>(p, false); });
  });
}

void gdn_replay_verify_cpu(const GdnReplayParams& p) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kC, [&] {
    RSSM_SWITCH_DTYPE(p.act_dtype, kA, [&] { replay_cpu<typename CpuType<kC>::type, typename CpuType<kA>::type>(p, true); });
  });
}

void gdn_replay_state_cpu(const GdnReplayStateParams& p) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kC, [&] { state_cpu<typename CpuType<kC>::type>(p); });
}

}  // namespace replayssm
