// The torch layer of the Gated DeltaNet ops: validate, fill the params (the one place), run on the CPU or with
// the CUDA kernels (gdn/kernels.cuh).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#include "../common/checks.h"
#include "../common/math.h"
#include "../common/split.h"
#include "cpu.h"

#ifdef RSSM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda.h"
#endif

namespace replayssm {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// q, k (batch, [T,] H, K); v, out (batch, [T,] HV, V); a, b (batch, [T,] HV). With tokens, T is dim 1.
void fill_gdn_token(GdnTokenParams& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                    const Tensor& A_log, const OptTensor& dt_bias, bool l2norm, double scale, const Tensor& slot_ids,
                    const Tensor& out, int64_t num_slots, bool with_tokens) {
  const int64_t d = with_tokens ? 1 : 0;
  TORCH_CHECK_VALUE(q.dim() == 3 + d, "replayssm: q must have shape (batch, ", with_tokens ? "T, " : "", "nkheads, kdim), got ",
                    shape_str(q.sizes()));
  TORCH_CHECK_VALUE(v.dim() == 3 + d, "replayssm: v must have shape (batch, ", with_tokens ? "T, " : "", "nheads, vdim), got ",
                    shape_str(v.sizes()));
  const int64_t batch = q.size(0), T = with_tokens ? q.size(1) : 1, H = q.size(1 + d), K = q.size(2 + d),
                HV = v.size(1 + d), V = v.size(2 + d);
  TORCH_CHECK_VALUE(T >= 1, "replayssm: q must hold at least one token per row");
  TORCH_CHECK_VALUE(!q.is_cuda() || batch <= 65535, "replayssm: the CUDA kernels take at most 65535 rows per call, got ", batch);
  TORCH_CHECK_VALUE(H > 0 && HV % H == 0, "replayssm: value heads (", HV, ") must be a multiple of key heads (", H, ")");
  auto shp = [&](std::initializer_list<int64_t> tail) {
    std::vector<int64_t> s{batch};
    if (with_tokens) s.push_back(T);
    s.insert(s.end(), tail);
    return s;
  };
  const at::Device device = q.device();
  const at::ScalarType act = q.scalar_type();
  p.act_dtype = float_dtype(q, "q");
  for (auto [t, name, want] : {std::tuple{&k, "k", shp({H, K})}, {&v, "v", shp({HV, V})}, {&a, "a", shp({HV})},
                               {&b, "b", shp({HV})}, {&out, "out", shp({HV, V})}}) {
    TORCH_CHECK_VALUE(t->sizes().vec() == want, "replayssm: ", name, " must have shape ", shape_str(want), ", got ",
                      shape_str(t->sizes()));
    check_device(*t, name, device);
    check_dtype(*t, name, act);
  }
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_inner_contiguous(*t, name);
  check_shape(A_log, "A_log", {HV});
  check_dtype(A_log, "A_log", at::kFloat);
  check_device(A_log, "A_log", device);
  TORCH_CHECK_VALUE(A_log.is_contiguous(), "replayssm: A_log must be contiguous");
  if (dt_bias) {
    check_shape(*dt_bias, "dt_bias", {HV});
    check_dtype(*dt_bias, "dt_bias", at::kFloat);
    check_device(*dt_bias, "dt_bias", device);
    TORCH_CHECK_VALUE(dt_bias->is_contiguous(), "replayssm: dt_bias must be contiguous");
    p.dt_bias = dt_bias->data_ptr<float>();
  }
  check_shape(slot_ids, "slot_ids", {batch});
  check_device(slot_ids, "slot_ids", device);
  check_slot_ids(slot_ids, num_slots);
  p.batch = static_cast<int>(batch);
  p.nheads = static_cast<int>(HV);
  p.nkheads = static_cast<int>(H);
  p.kdim = static_cast<int>(K);
  p.vdim = static_cast<int>(V);
  p.ntokens = static_cast<int>(T);
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.out = out.data_ptr();
  p.q_batch_stride = q.stride(0);
  p.k_batch_stride = k.stride(0);
  p.v_batch_stride = v.stride(0);
  p.a_batch_stride = a.stride(0);
  p.b_batch_stride = b.stride(0);
  p.out_batch_stride = out.stride(0);
  p.q_head_stride = q.stride(1 + d);
  p.k_head_stride = k.stride(1 + d);
  p.v_head_stride = v.stride(1 + d);
  p.a_head_stride = a.stride(1 + d);
  p.b_head_stride = b.stride(1 + d);
  p.out_head_stride = out.stride(1 + d);
  if (with_tokens) {
    p.q_token_stride = q.stride(1);
    p.k_token_stride = k.stride(1);
    p.v_token_stride = v.stride(1);
    p.a_token_stride = a.stride(1);
    p.b_token_stride = b.stride(1);
    p.out_token_stride = out.stride(1);
  }
  p.A_log = A_log.data_ptr<float>();
  p.l2norm = l2norm;
  p.scale = static_cast<float>(scale);
  p.slot_ids = slot_ids.data_ptr();
  p.slot_ids_int64 = slot_ids.scalar_type() == at::kLong;
  p.num_slots = num_slots;
}

GdnReplayCacheParams fill_gdn_cache(const Tensor& checkpoint, const Tensor& ring_u, const Tensor& ring_k, const Tensor& ring_g,
                                    const Tensor& cursor, int64_t HV, int64_t H, int64_t K, int64_t V, const at::Device& device,
                                    bool cursor_may_be_full) {
  GdnReplayCacheParams c;
  TORCH_CHECK_VALUE(checkpoint.dim() == 4 && ring_u.dim() == 4, "replayssm: checkpoint must have shape (num_slots, nheads, ",
                    "vdim, kdim) and ring_u (num_slots, ring_len, nheads, vdim)");
  const int64_t slots = checkpoint.size(0), L = ring_u.size(1);
  TORCH_CHECK_VALUE(L >= kMinRing && L <= kMaxRing, "replayssm: ring_len (ring_u.size(1)) must be in [", kMinRing, ", ", kMaxRing,
                    "], got ", L);
  check_shape(checkpoint, "checkpoint", {slots, HV, V, K});
  check_shape(ring_u, "ring_u", {slots, L, HV, V});
  check_shape(ring_k, "ring_k", {slots, L, H, K});
  check_shape(ring_g, "ring_g", {slots, L, HV});
  check_shape(cursor, "cursor", {slots});
  for (auto [t, name] : {std::pair{&checkpoint, "checkpoint"}, {&ring_u, "ring_u"}, {&ring_k, "ring_k"}, {&ring_g, "ring_g"},
                         {&cursor, "cursor"}}) {
    check_device(*t, name, device);
    check_inner_contiguous(*t, name);
  }
  c.ckpt_dtype = float_dtype(checkpoint, "checkpoint");
  for (auto [t, name] : {std::pair{&ring_u, "ring_u"}, {&ring_k, "ring_k"}, {&ring_g, "ring_g"}}) check_dtype(*t, name, at::kFloat);
  check_dtype(cursor, "cursor", at::kInt);
  TORCH_CHECK_VALUE(cursor.is_contiguous(), "replayssm: cursor must be contiguous");
  const int64_t max_cursor = cursor_may_be_full ? L : L - 1;
  if (!cursor.is_cuda())  // on the GPU the kernels check on the device (no sync: graph-safe)
    TORCH_CHECK_VALUE(!(cursor < 0).logical_or(cursor > max_cursor).any().item<bool>(), "replayssm: every cursor must be in [0, ",
                      max_cursor, "], ring_len = ", L);
  c.ring_len = static_cast<int>(L);
  c.checkpoint = checkpoint.data_ptr();
  c.ckpt_slot_stride = checkpoint.stride(0);
  c.ckpt_head_stride = checkpoint.stride(1);
  c.ckpt_row_stride = checkpoint.stride(2);
  c.ring_u = ring_u.data_ptr<float>();
  c.ring_u_slot_stride = ring_u.stride(0);
  c.ring_u_pos_stride = ring_u.stride(1);
  c.ring_u_head_stride = ring_u.stride(2);
  c.ring_k = ring_k.data_ptr<float>();
  c.ring_k_slot_stride = ring_k.stride(0);
  c.ring_k_pos_stride = ring_k.stride(1);
  c.ring_k_head_stride = ring_k.stride(2);
  c.ring_g = ring_g.data_ptr<float>();
  c.ring_g_slot_stride = ring_g.stride(0);
  c.ring_g_pos_stride = ring_g.stride(1);
  c.cursor = cursor.data_ptr<int>();
  return c;
}

void gdn_step(Tensor state, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
              const Tensor& A_log, const OptTensor& dt_bias, bool l2norm, double scale, const Tensor& slot_ids, Tensor out) {
  GdnStepParams p;
  TORCH_CHECK_VALUE(state.dim() == 4, "replayssm: state must have shape (num_slots, nheads, vdim, kdim), got ",
                    shape_str(state.sizes()));
  fill_gdn_token(p, q, k, v, a, b, A_log, dt_bias, l2norm, scale, slot_ids, out, state.size(0), false);
  check_shape(state, "state", {-1, p.nheads, p.vdim, p.kdim});
  check_device(state, "state", q.device());
  check_inner_contiguous(state, "state");
  p.state_dtype = float_dtype(state, "state");
  p.state = state.data_ptr();
  p.state_slot_stride = state.stride(0);
  p.state_head_stride = state.stride(1);
  p.state_row_stride = state.stride(2);
  if (!p.batch) return;
#ifdef RSSM_WITH_CUDA
  if (q.is_cuda()) {
    check_vector_aligned(state, "state");
    TORCH_CHECK_VALUE(p.kdim == 16 || p.kdim == 32 || p.kdim == 64 || p.kdim == 128 || p.kdim == 256, "replayssm: the CUDA GDN kernels take kdim 16, 32, 64, 128 or 256");
    const c10::cuda::CUDAGuard guard(q.device());
    return gdn_step_cuda(p, c10::cuda::getCurrentCUDAStream());
  }
#endif
  gdn_step_cpu(p);
}

void gdn_replay(Tensor checkpoint, Tensor ring_u, Tensor ring_k, Tensor ring_g, Tensor cursor, const Tensor& q, const Tensor& k,
                const Tensor& v, const Tensor& a, const Tensor& b, const Tensor& A_log, const OptTensor& dt_bias, bool l2norm,
                double scale, const Tensor& slot_ids, const OptTensor& num_tokens, Tensor out, bool verify,
                const OptTensor& pending = std::nullopt, const Tensor* arrivals = nullptr, const OptTensor& view = std::nullopt,
                const OptTensor& sr_seed = std::nullopt, const OptTensor& fold_count = std::nullopt,
                const OptTensor& fold_phase = std::nullopt) {
  GdnReplayParams p;
  TORCH_CHECK_VALUE(checkpoint.dim() == 4, "replayssm: checkpoint must have shape (num_slots, nheads, vdim, kdim), got ",
                    shape_str(checkpoint.sizes()));
  fill_gdn_token(p, q, k, v, a, b, A_log, dt_bias, l2norm, scale, slot_ids, out, checkpoint.size(0), verify);
  p.cache = fill_gdn_cache(checkpoint, ring_u, ring_k, ring_g, cursor, p.nheads, p.nkheads, p.kdim, p.vdim, q.device(), verify);
  fill_split_params(p.cache, checkpoint, view, sr_seed, fold_count);
  fill_fold_phase(p.cache, checkpoint, fold_phase);
  if (checkpoint.is_cuda() && (view || fold_count)) {  // the numerical split as the CUDA replay step kernel takes it
    TORCH_CHECK_VALUE(!view || p.cache.ckpt_dtype == DType::kFloat32,
                      "replayssm: on CUDA the GDN output view must be of an fp32 checkpoint");
    TORCH_CHECK_VALUE(!fold_count || view || p.cache.ckpt_dtype != DType::kFloat32,
                      "replayssm: on CUDA a GDN fold counter (fold_count) comes with an output view or a bf16/fp16 checkpoint");
    if (view) check_vector_aligned(*view, "view");
  }
  if (arrivals) {
    check_device(*arrivals, "arrivals", q.device());
    TORCH_CHECK_VALUE(arrivals->is_contiguous(), "replayssm: arrivals must be contiguous");
    p.cache.arrivals = arrivals->data_ptr<int>();
  }
  if (verify) {
    p.cache.pending = pending_ptr(pending, cursor);
    TORCH_CHECK_VALUE(p.ntokens <= p.cache.ring_len, "replayssm: a window of T = ", p.ntokens, " tokens does not fit a ring of ",
                      p.cache.ring_len, " (ring_len = history + window)");
    if (num_tokens) {
      check_shape(*num_tokens, "num_tokens", {p.batch});
      check_dtype(*num_tokens, "num_tokens", at::kInt);
      check_device(*num_tokens, "num_tokens", q.device());
      TORCH_CHECK_VALUE(num_tokens->is_contiguous(), "replayssm: num_tokens must be contiguous");
      if (!num_tokens->is_cuda())  // on the GPU the kernel checks on the device
        TORCH_CHECK_VALUE(!(*num_tokens < 1).logical_or(*num_tokens > p.ntokens).any().item<bool>(),
                          "replayssm: every num_tokens must be in [1, T = ", p.ntokens, "]");
      p.num_tokens = num_tokens->data_ptr<int>();
    }
  }
  if (!p.batch) return;
#ifdef RSSM_WITH_CUDA
  if (q.is_cuda()) {
    TORCH_CHECK_VALUE(p.cache.arrivals != nullptr, "replayssm: the CUDA GDN replay kernels need the cache's arrivals");
    check_vector_aligned(checkpoint, "checkpoint");
    TORCH_CHECK_VALUE(p.kdim == 16 || p.kdim == 32 || p.kdim == 64 || p.kdim == 128 || p.kdim == 256, "replayssm: the CUDA GDN kernels take kdim 16, 32, 64, 128 or 256");
    const c10::cuda::CUDAGuard guard(q.device());
    if (verify) return gdn_replay_verify_cuda(p, c10::cuda::getCurrentCUDAStream());
    const Tensor order = at::empty({p.batch * kOrderInts}, q.options().dtype(at::kInt));  // the fold-first row order's memory
    p.row_order = order.data_ptr<int>();
    return gdn_replay_step_cuda(p, c10::cuda::getCurrentCUDAStream());
  }
#endif
  if (verify) gdn_replay_verify_cpu(p);
  else gdn_replay_step_cpu(p);
}

void gdn_replay_step(Tensor checkpoint, Tensor ring_u, Tensor ring_k, Tensor ring_g, Tensor cursor, Tensor arrivals,
                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b, const Tensor& A_log,
                     const OptTensor& dt_bias, bool l2norm, double scale, const Tensor& slot_ids, Tensor out, const OptTensor& view,
                     const OptTensor& sr_seed, const OptTensor& fold_count, const OptTensor& fold_phase) {
  check_shape(arrivals, "arrivals", {checkpoint.size(0)});
  check_dtype(arrivals, "arrivals", at::kInt);
  gdn_replay(checkpoint, ring_u, ring_k, ring_g, cursor, q, k, v, a, b, A_log, dt_bias, l2norm, scale, slot_ids, std::nullopt,
             out, false, std::nullopt, &arrivals, view, sr_seed, fold_count, fold_phase);
}

void gdn_replay_verify(Tensor checkpoint, Tensor ring_u, Tensor ring_k, Tensor ring_g, Tensor cursor, const Tensor& q,
                       const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b, const Tensor& A_log,
                       const OptTensor& dt_bias, bool l2norm, double scale, const Tensor& slot_ids, const OptTensor& num_tokens,
                       Tensor out, const OptTensor& pending, const OptTensor& arrivals, const OptTensor& view,
                       const OptTensor& sr_seed, const OptTensor& fold_count) {
  // The numerical split (early folds store as the step's folds do): on CUDA the row-pass verify kernel takes it
  // (gdn_replay_verify_cuda_for_ckpt), with the step's checks.
  if (arrivals) {
    check_shape(*arrivals, "arrivals", {checkpoint.size(0)});
    check_dtype(*arrivals, "arrivals", at::kInt);
  }
  gdn_replay(checkpoint, ring_u, ring_k, ring_g, cursor, q, k, v, a, b, A_log, dt_bias, l2norm, scale, slot_ids, num_tokens, out,
             true, pending, arrivals ? &*arrivals : nullptr, view, sr_seed, fold_count);
}

void gdn_replay_state(const Tensor& checkpoint, const Tensor& ring_u, const Tensor& ring_k, const Tensor& ring_g,
                      const Tensor& cursor, const Tensor& slot_ids, const OptTensor& positions, Tensor out) {
  GdnReplayStateParams p;
  TORCH_CHECK_VALUE(checkpoint.dim() == 4 && ring_k.dim() == 4, "replayssm: checkpoint must have shape (num_slots, nheads, vdim, ",
                    "kdim) and ring_k (num_slots, ring_len, nkheads, kdim)");
  const int64_t HV = checkpoint.size(1), V = checkpoint.size(2), K = checkpoint.size(3), H = ring_k.size(2);
  TORCH_CHECK_VALUE(H > 0 && HV % H == 0, "replayssm: value heads (", HV, ") must be a multiple of key heads (", H, ")");
  p.cache = fill_gdn_cache(checkpoint, ring_u, ring_k, ring_g, cursor, HV, H, K, V, checkpoint.device(), true);
  check_shape(slot_ids, "slot_ids", {-1});
  check_device(slot_ids, "slot_ids", checkpoint.device());
  check_slot_ids(slot_ids, checkpoint.size(0));
  const int64_t batch = slot_ids.size(0);
  TORCH_CHECK_VALUE(!checkpoint.is_cuda() || batch <= 65535, "replayssm: the CUDA kernels take at most 65535 rows per call, got ",
                    batch);
  check_shape(out, "out", {batch, HV, V, K});
  check_dtype(out, "out", at::kFloat);
  check_device(out, "out", checkpoint.device());
  TORCH_CHECK_VALUE(out.is_contiguous(), "replayssm: out must be contiguous");
  p.positions = positions_ptr(positions, slot_ids, cursor);
  p.batch = static_cast<int>(batch);
  p.nheads = static_cast<int>(HV);
  p.nkheads = static_cast<int>(H);
  p.kdim = static_cast<int>(K);
  p.vdim = static_cast<int>(V);
  p.slot_ids = slot_ids.data_ptr();
  p.slot_ids_int64 = slot_ids.scalar_type() == at::kLong;
  p.num_slots = checkpoint.size(0);
  p.out = out.data_ptr<float>();
  if (!p.batch) return;
#ifdef RSSM_WITH_CUDA
  if (checkpoint.is_cuda()) {
    const c10::cuda::CUDAGuard guard(checkpoint.device());
    return gdn_replay_state_cuda(p, c10::cuda::getCurrentCUDAStream());
  }
#endif
  gdn_replay_state_cpu(p);
}

}  // namespace

TORCH_LIBRARY_IMPL(replayssm, CPU, m) {
  m.impl("gdn_step", &gdn_step);
  m.impl("gdn_replay_step", &gdn_replay_step);
  m.impl("gdn_replay_verify", &gdn_replay_verify);
  m.impl("gdn_replay_state", &gdn_replay_state);
}

#ifdef RSSM_WITH_CUDA
TORCH_LIBRARY_IMPL(replayssm, CUDA, m) {
  m.impl("gdn_step", &gdn_step);
  m.impl("gdn_replay_step", &gdn_replay_step);
  m.impl("gdn_replay_verify", &gdn_replay_verify);
  m.impl("gdn_replay_state", &gdn_replay_state);
}
#endif

}  // namespace replayssm
