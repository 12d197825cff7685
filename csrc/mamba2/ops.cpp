// The torch layer of the Mamba-2 ops: validate every argument, fill the params structs (the one place
// where tensors become pointers and strides), and run the CPU or CUDA implementation on x's device.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "../common/checks.h"
#include "../common/math.h"
#include "../common/rounding.h"
#include "../common/split.h"
#include <ATen/Parallel.h>
#include "cpu.h"

#ifdef RSSM_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda.h"
#endif

namespace replayssm {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

void check_cuda_dstate(const Tensor& x, int64_t dstate) {
  TORCH_CHECK_VALUE(!x.is_cuda() || dstate == 16 || dstate == 32 || dstate == 64 || dstate == 128 || dstate == 256,
                    "replayssm: the CUDA kernels support dstate (B.size(-1)) 16, 32, 64, 128 or 256, got ", dstate);
}

void fill_token_params(Mamba2TokenParams& p, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                       const Tensor& C, const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias, bool dt_softplus,
                       double dt_min, double dt_max, const Tensor& slot_ids, const Tensor& out, int64_t num_slots) {
  TORCH_CHECK_VALUE(x.dim() == 3, "replayssm: x must have shape (batch, nheads, headdim), got ", shape_str(x.sizes()));
  TORCH_CHECK_VALUE(B.dim() == 3, "replayssm: B must have shape (batch, ngroups, dstate), got ", shape_str(B.sizes()));
  const int64_t batch = x.size(0), nheads = x.size(1), headdim = x.size(2), ngroups = B.size(1), dstate = B.size(2);
  TORCH_CHECK_VALUE(ngroups > 0 && nheads % ngroups == 0, "replayssm: nheads (", nheads, ") must be a multiple of ngroups (", ngroups, ")");
  TORCH_CHECK_VALUE(nheads > 0 && headdim > 0 && dstate > 0, "replayssm: nheads, headdim and dstate must be positive");
  check_cuda_dstate(x, dstate);
  const at::Device device = x.device();
  const at::ScalarType act = x.scalar_type();
  p.act_dtype = float_dtype(x, "x");

  check_shape(dt, "dt", {batch, nheads});
  check_shape(A, "A", {nheads});
  check_shape(B, "B", {batch, ngroups, dstate});
  check_shape(C, "C", {batch, ngroups, dstate});
  check_shape(out, "out", {batch, nheads, headdim});
  check_shape(slot_ids, "slot_ids", {batch});
  for (auto [t, name] : {std::pair{&dt, "dt"}, {&B, "B"}, {&C, "C"}, {&out, "out"}}) {
    check_device(*t, name, device);
    check_dtype(*t, name, act);
  }
  check_device(A, "A", device);
  check_dtype(A, "A", at::kFloat);
  check_device(slot_ids, "slot_ids", device);
  for (auto [t, name] : {std::pair{&x, "x"}, {&B, "B"}, {&C, "C"}, {&out, "out"}}) check_inner_contiguous(*t, name);
  TORCH_CHECK_VALUE(A.stride(0) == 1 || nheads <= 1, "replayssm: A must be contiguous");
  // The CUDA grids put the batch in a dimension limited to 65535 blocks.
  TORCH_CHECK_VALUE(!x.is_cuda() || batch <= 65535, "replayssm: the CUDA kernels take at most 65535 rows per call, got ", batch);
  TORCH_CHECK_VALUE(dt_min <= dt_max, "replayssm: dt_min (", dt_min, ") must not exceed dt_max (", dt_max, ")");

  p.batch = static_cast<int>(batch);
  p.nheads = static_cast<int>(nheads);
  p.headdim = static_cast<int>(headdim);
  p.ngroups = static_cast<int>(ngroups);
  p.dstate = static_cast<int>(dstate);
  p.x = x.data_ptr();
  p.x_batch_stride = x.stride(0);
  p.x_head_stride = x.stride(1);
  p.dt = dt.data_ptr();
  p.dt_batch_stride = dt.stride(0);
  p.dt_head_stride = dt.stride(1);
  p.A = A.data_ptr<float>();
  p.B = B.data_ptr();
  p.B_batch_stride = B.stride(0);
  p.B_group_stride = B.stride(1);
  p.C = C.data_ptr();
  p.C_batch_stride = C.stride(0);
  p.C_group_stride = C.stride(1);
  p.out = out.data_ptr();
  p.out_batch_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  for (auto [t, name, ptr] : {std::tuple{&D, "D", &p.D}, {&dt_bias, "dt_bias", &p.dt_bias}}) {
    if (!t->has_value()) continue;
    const Tensor& v = t->value();
    check_shape(v, name, {nheads});
    check_device(v, name, device);
    check_dtype(v, name, at::kFloat);
    TORCH_CHECK_VALUE(v.stride(0) == 1 || nheads == 1, "replayssm: ", name, " must be contiguous");
    *ptr = v.data_ptr<float>();
  }
  if (z.has_value()) {
    check_shape(*z, "z", {batch, nheads, headdim});
    check_device(*z, "z", device);
    check_dtype(*z, "z", act);
    check_inner_contiguous(*z, "z");
    p.z = z->data_ptr();
    p.z_batch_stride = z->stride(0);
    p.z_head_stride = z->stride(1);
  }
  p.dt_softplus = dt_softplus;
  p.dt_min = static_cast<float>(dt_min);
  p.dt_max = static_cast<float>(dt_max);
  p.slot_ids = slot_ids.data_ptr();
  p.slot_ids_int64 = slot_ids.scalar_type() == at::kLong;
  p.num_slots = num_slots;
  check_slot_ids(slot_ids, num_slots);
}

void check_state_pool(const Tensor& state, const char* name, const Mamba2TokenParams& p, const at::Device& device) {
  check_shape(state, name, {-1, p.nheads, p.headdim, p.dstate});
  check_device(state, name, device);
  float_dtype(state, name);
  check_inner_contiguous(state, name);
  if (state.is_cuda()) check_vector_aligned(state, name);
}

// The replay cache of one layer: checkpoint pool, rings, cursors (see replayssm/cache.py).
Mamba2ReplayCacheParams fill_cache_params(const Tensor& checkpoint, const Tensor& ring_x, const Tensor& ring_B,
                                          const Tensor& ring_dt, const Tensor& cursor, const Tensor* arrivals, int nheads,
                                          int headdim, int ngroups, int dstate, at::ScalarType act, const at::Device& device,
                                          bool cursor_may_be_full) {
  Mamba2ReplayCacheParams c;
  TORCH_CHECK_VALUE(checkpoint.dim() == 4, "replayssm: checkpoint must have shape (num_slots, nheads, headdim, dstate), got ",
                    shape_str(checkpoint.sizes()));
  TORCH_CHECK_VALUE(ring_x.dim() == 4, "replayssm: ring_x must have shape (num_slots, ring_len, nheads, headdim), got ",
                    shape_str(ring_x.sizes()));
  const int64_t slots = checkpoint.size(0), L = ring_x.size(1);
  TORCH_CHECK_VALUE(L >= kMinRing && L <= kMaxRing, "replayssm: ring_len (ring_x.size(1)) must be in [", kMinRing, ", ",
                    kMaxRing, "], got ", L);
  check_shape(checkpoint, "checkpoint", {slots, nheads, headdim, dstate});
  check_shape(ring_x, "ring_x", {slots, L, nheads, headdim});
  check_shape(ring_B, "ring_B", {slots, L, ngroups, dstate});
  check_shape(ring_dt, "ring_dt", {slots, L, nheads});
  check_shape(cursor, "cursor", {slots});
  for (auto [t, name] : {std::pair{&checkpoint, "checkpoint"}, {&ring_x, "ring_x"}, {&ring_B, "ring_B"}, {&ring_dt, "ring_dt"},
                         {&cursor, "cursor"}}) {
    check_device(*t, name, device);
    check_inner_contiguous(*t, name);
  }
  c.ckpt_dtype = float_dtype(checkpoint, "checkpoint");
  if (checkpoint.is_cuda()) check_vector_aligned(checkpoint, "checkpoint");
  check_dtype(ring_x, "ring_x", act);
  check_dtype(ring_B, "ring_B", act);
  check_dtype(ring_dt, "ring_dt", at::kFloat);
  check_dtype(cursor, "cursor", at::kInt);
  TORCH_CHECK_VALUE(cursor.stride(0) == 1 || slots == 1, "replayssm: cursor must be contiguous");
  if (arrivals) {
    check_shape(*arrivals, "arrivals", {slots});
    check_device(*arrivals, "arrivals", device);
    check_dtype(*arrivals, "arrivals", at::kInt);
    TORCH_CHECK_VALUE(arrivals->stride(0) == 1 || slots == 1, "replayssm: arrivals must be contiguous");
    c.arrivals = arrivals->data_ptr<int>();
  }
  // The replay step keeps cursors below ring_len (it folds when the ring fills); verify/commit may fill it.
  if (!checkpoint.is_cuda()) {
    const int64_t max_cursor = cursor_may_be_full ? L : L - 1;
    const Tensor bad = (cursor < 0).logical_or(cursor > max_cursor);
    TORCH_CHECK_VALUE(!bad.any().item<bool>(), "replayssm: every cursor must be in [0, ", max_cursor, "], ring_len = ", L);
  }
  c.ring_len = static_cast<int>(L);
  c.checkpoint = checkpoint.data_ptr();
  c.ckpt_slot_stride = checkpoint.stride(0);
  c.ckpt_head_stride = checkpoint.stride(1);
  c.ckpt_row_stride = checkpoint.stride(2);
  c.ring_x = ring_x.data_ptr();
  c.ring_x_slot_stride = ring_x.stride(0);
  c.ring_x_pos_stride = ring_x.stride(1);
  c.ring_x_head_stride = ring_x.stride(2);
  c.ring_B = ring_B.data_ptr();
  c.ring_B_slot_stride = ring_B.stride(0);
  c.ring_B_pos_stride = ring_B.stride(1);
  c.ring_B_group_stride = ring_B.stride(2);
  c.ring_dt = ring_dt.data_ptr<float>();
  c.ring_dt_slot_stride = ring_dt.stride(0);
  c.ring_dt_pos_stride = ring_dt.stride(1);
  c.cursor = cursor.data_ptr<int>();
  return c;
}

// Runs the CUDA implementation (on the tensors' device, current stream) or the CPU one. A CPU-only build
// registers no CUDA kernels, so CUDA tensors never reach it.
#ifdef RSSM_WITH_CUDA
template <typename Params>
void run(const at::Device& device, const Params& p, void (*cpu)(const Params&), void (*cuda)(const Params&, cudaStream_t)) {
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device);
    cuda(p, c10::cuda::getCurrentCUDAStream());
  } else {
    cpu(p);
  }
}
#define RSSM_RUN(DEVICE, PARAMS, NAME) run(DEVICE, PARAMS, NAME##_cpu, NAME##_cuda)
#else
#define RSSM_RUN(DEVICE, PARAMS, NAME) NAME##_cpu(PARAMS)
#endif

void mamba2_step(Tensor state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C,
                 const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias, bool dt_softplus, double dt_min,
                 double dt_max, const Tensor& slot_ids, Tensor out, const OptTensor& dst_slot_ids) {
  Mamba2StepParams p;
  TORCH_CHECK_VALUE(state.dim() == 4, "replayssm: state must have shape (num_slots, nheads, headdim, dstate), got ",
                    shape_str(state.sizes()));
  fill_token_params(p, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, slot_ids, out, state.size(0));
  check_state_pool(state, "state", p, x.device());
  p.state_dtype = float_dtype(state, "state");
  p.state = state.data_ptr();
  p.state_slot_stride = state.stride(0);
  p.state_head_stride = state.stride(1);
  p.state_row_stride = state.stride(2);
  if (dst_slot_ids) {
    check_shape(*dst_slot_ids, "dst_slot_ids", {slot_ids.size(0)});
    check_device(*dst_slot_ids, "dst_slot_ids", x.device());
    check_dtype(*dst_slot_ids, "dst_slot_ids", slot_ids.scalar_type());
    check_slot_ids(*dst_slot_ids, state.size(0));
    if (!x.is_cuda()) {  // pad rows alike; no row writes a slot that another row reads in the same call
      const Tensor src = slot_ids.to(at::kLong), dst = dst_slot_ids->to(at::kLong);
      TORCH_CHECK_VALUE(src.eq(kPadSlot).equal(dst.eq(kPadSlot)), "replayssm: dst_slot_ids must be padding exactly where slot_ids is");
      // (slot ids do not repeat, so a destination equal to some source is another row's unless it is its own)
      const Tensor clash = at::isin(dst, src).logical_and(dst.ne(src)).logical_and(dst.ne(kPadSlot));
      TORCH_CHECK_VALUE(!clash.any().item<bool>(), "replayssm: dst_slot_ids must not name a slot that another row reads (slot_ids)");
    }
    p.dst_slot_ids = dst_slot_ids->data_ptr();
  }
  if (p.batch == 0) return;
  RSSM_RUN(x.device(), p, mamba2_step);
}


void mamba2_replay_step(Tensor checkpoint, Tensor ring_x, Tensor ring_B, Tensor ring_dt, Tensor cursor, Tensor arrivals,
                        const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C,
                        const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias, bool dt_softplus, double dt_min,
                        double dt_max, const Tensor& slot_ids, Tensor out, const OptTensor& view, const OptTensor& sr_seed,
                        const OptTensor& fold_count, const OptTensor& fold_phase) {
  Mamba2ReplayStepParams p;
  TORCH_CHECK_VALUE(checkpoint.dim() == 4, "replayssm: checkpoint must have shape (num_slots, nheads, headdim, dstate), got ",
                    shape_str(checkpoint.sizes()));
  fill_token_params(p, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, slot_ids, out, checkpoint.size(0));
  p.cache = fill_cache_params(checkpoint, ring_x, ring_B, ring_dt, cursor, &arrivals, p.nheads, p.headdim, p.ngroups,
                              p.dstate, x.scalar_type(), x.device(), /*cursor_may_be_full=*/false);
  fill_split_params(p.cache, checkpoint, view, sr_seed, fold_count);
  fill_fold_phase(p.cache, checkpoint, fold_phase);
  if (checkpoint.is_cuda() && view) {
    TORCH_CHECK_VALUE(p.cache.ckpt_dtype == DType::kFloat32, "replayssm: on CUDA the output view must be of an fp32 checkpoint");
    check_vector_aligned(*view, "view");
  }
  if (p.batch == 0) return;
  Tensor order;  // on CUDA, the memory of the fold-first row order (common/fold_order.cuh)
  if (x.is_cuda()) {
    order = at::empty({p.batch * kOrderInts}, x.options().dtype(at::kInt));
    p.row_order = order.data_ptr<int>();
  }
  RSSM_RUN(x.device(), p, mamba2_replay_step);
}

void mamba2_replay_state(const Tensor& checkpoint, const Tensor& ring_x, const Tensor& ring_B, const Tensor& ring_dt,
                         const Tensor& cursor, const Tensor& A, const Tensor& slot_ids, const OptTensor& positions,
                         Tensor out) {
  Mamba2ReplayStateParams p;
  TORCH_CHECK_VALUE(checkpoint.dim() == 4 && ring_B.dim() == 4, "replayssm: checkpoint must have shape (num_slots, nheads, ",
                    "headdim, dstate) and ring_B (num_slots, ring_len, ngroups, dstate)");
  const int64_t batch = slot_ids.size(0), nheads = checkpoint.size(1), headdim = checkpoint.size(2),
                dstate = checkpoint.size(3), ngroups = ring_B.size(2);
  TORCH_CHECK_VALUE(ngroups > 0 && nheads > 0 && nheads % ngroups == 0, "replayssm: nheads (", nheads,
                    ") must be a positive multiple of ngroups (", ngroups, ")");
  TORCH_CHECK_VALUE(!checkpoint.is_cuda() || batch <= 65535, "replayssm: the CUDA kernels take at most 65535 rows per call");
  const at::Device device = checkpoint.device();
  p.cache = fill_cache_params(checkpoint, ring_x, ring_B, ring_dt, cursor, nullptr, nheads, headdim, ngroups, dstate,
                              ring_x.scalar_type(), device, /*cursor_may_be_full=*/true);
  p.act_dtype = float_dtype(ring_x, "ring_x");
  check_shape(A, "A", {nheads});
  check_device(A, "A", device);
  check_dtype(A, "A", at::kFloat);
  check_shape(slot_ids, "slot_ids", {batch});
  check_device(slot_ids, "slot_ids", device);
  check_shape(out, "out", {batch, nheads, headdim, dstate});
  check_device(out, "out", device);
  check_dtype(out, "out", at::kFloat);
  TORCH_CHECK_VALUE(out.is_contiguous() && A.is_contiguous(), "replayssm: out and A must be contiguous");
  check_slot_ids(slot_ids, checkpoint.size(0));
  p.positions = positions_ptr(positions, slot_ids, cursor);
  p.batch = static_cast<int>(batch);
  p.nheads = static_cast<int>(nheads);
  p.headdim = static_cast<int>(headdim);
  p.ngroups = static_cast<int>(ngroups);
  p.dstate = static_cast<int>(dstate);
  p.A = A.data_ptr<float>();
  p.slot_ids = slot_ids.data_ptr();
  p.slot_ids_int64 = slot_ids.scalar_type() == at::kLong;
  p.num_slots = checkpoint.size(0);
  p.out = out.data_ptr<float>();
  if (p.batch == 0) return;
  RSSM_RUN(device, p, mamba2_replay_state);
}

void mamba2_replay_verify(Tensor checkpoint, Tensor ring_x, Tensor ring_B, Tensor ring_dt, Tensor cursor, const Tensor& x,
                          const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
                          const OptTensor& z, const OptTensor& dt_bias, bool dt_softplus, double dt_min, double dt_max,
                          const Tensor& slot_ids, const OptTensor& num_tokens, Tensor out, const OptTensor& pending,
                          const OptTensor& arrivals, const OptTensor& view, const OptTensor& sr_seed, const OptTensor& fold_count) {
  TORCH_CHECK_VALUE(x.dim() == 4, "replayssm: x must have shape (batch, T, nheads, headdim), got ", shape_str(x.sizes()));
  TORCH_CHECK_VALUE(checkpoint.dim() == 4, "replayssm: checkpoint must have shape (num_slots, nheads, headdim, dstate), got ",
                    shape_str(checkpoint.sizes()));
  const int64_t T = x.size(1);
  TORCH_CHECK_VALUE(T >= 1, "replayssm: x must hold at least one token per row");
  for (auto [t, name] : {std::pair{&dt, "dt"}, {&B, "B"}, {&C, "C"}, {&out, "out"}})
    TORCH_CHECK_VALUE(t->dim() >= 2 && t->size(1) == T, "replayssm: ", name, " must have T = ", T, " tokens in dim 1, got ",
                      shape_str(t->sizes()));
  if (z.has_value())
    TORCH_CHECK_VALUE(z->dim() >= 2 && z->size(1) == T, "replayssm: z must have T = ", T, " tokens in dim 1, got ",
                      shape_str(z->sizes()));
  Mamba2ReplayVerifyParams p;
  // Token 0's slices validate shapes, dtypes and strides; token k sits k * stride(1) further.
  const OptTensor z0 = z.has_value() ? OptTensor(z->select(1, 0)) : std::nullopt;
  fill_token_params(p, x.select(1, 0), dt.select(1, 0), A, B.select(1, 0), C.select(1, 0), D, z0, dt_bias, dt_softplus,
                    dt_min, dt_max, slot_ids, out.select(1, 0), checkpoint.size(0));
  TORCH_CHECK_VALUE(!x.is_cuda() || arrivals.has_value(), "replayssm: mamba2_replay_verify on CUDA needs the cache's arrivals");
  p.cache = fill_cache_params(checkpoint, ring_x, ring_B, ring_dt, cursor, arrivals ? &*arrivals : nullptr, p.nheads, p.headdim,
                              p.ngroups, p.dstate, x.scalar_type(), x.device(), /*cursor_may_be_full=*/true);
  TORCH_CHECK_VALUE(T <= p.cache.ring_len, "replayssm: a window of T = ", T, " tokens does not fit a ring of ",
                    p.cache.ring_len, " (ring_len = history + window)");
  p.cache.pending = pending_ptr(pending, cursor);
  fill_split_params(p.cache, checkpoint, view, sr_seed, fold_count);
  if (checkpoint.is_cuda() && view) {
    TORCH_CHECK_VALUE(p.cache.ckpt_dtype == DType::kFloat32, "replayssm: on CUDA the output view must be of an fp32 checkpoint");
    check_vector_aligned(*view, "view");
  }
  p.ntokens = static_cast<int>(T);
  p.x_token_stride = x.stride(1);
  p.dt_token_stride = dt.stride(1);
  p.B_token_stride = B.stride(1);
  p.C_token_stride = C.stride(1);
  p.z_token_stride = z.has_value() ? z->stride(1) : 0;
  p.out_token_stride = out.stride(1);
  if (num_tokens.has_value()) {
    check_shape(*num_tokens, "num_tokens", {x.size(0)});
    check_device(*num_tokens, "num_tokens", x.device());
    check_dtype(*num_tokens, "num_tokens", at::kInt);
    TORCH_CHECK_VALUE(num_tokens->is_contiguous(), "replayssm: num_tokens must be contiguous");
    if (!num_tokens->is_cuda())
      TORCH_CHECK_VALUE(!(*num_tokens < 1).logical_or(*num_tokens > T).any().item<bool>(),
                        "replayssm: every num_tokens must be in [1, T = ", T, "]");
    p.num_tokens = num_tokens->data_ptr<int>();
  }
  if (p.batch == 0) return;
  RSSM_RUN(x.device(), p, mamba2_replay_verify);
}

// Device-side and graph-safe: plain tensor ops, no sync. Pad rows add 0 (to slot 0).
void mamba2_replay_commit(Tensor cursor, int64_t ring_len, const Tensor& slot_ids, const Tensor& accepted,
                          const OptTensor& pending) {
  check_shape(cursor, "cursor", {-1});
  check_dtype(cursor, "cursor", at::kInt);
  check_shape(slot_ids, "slot_ids", {-1});
  check_shape(accepted, "accepted", {slot_ids.size(0)});
  check_device(slot_ids, "slot_ids", cursor.device());
  check_device(accepted, "accepted", cursor.device());
  check_dtype(accepted, "accepted", at::kInt);
  check_slot_ids(slot_ids, cursor.size(0));
  TORCH_CHECK_VALUE(ring_len >= kMinRing && ring_len <= kMaxRing, "replayssm: ring_len must be in [", kMinRing, ", ", kMaxRing,
                    "], got ", ring_len);
  const Tensor pad = slot_ids.eq(kPadSlot);
  const Tensor index = slot_ids.masked_fill(pad, 0).to(at::kLong);
  Tensor add = accepted.masked_fill(pad, 0);
  pending_ptr(pending, cursor);  // validates
  if (!cursor.is_cuda()) {
    const Tensor after = cursor.index_select(0, index) + add;
    TORCH_CHECK_VALUE(!(add < 0).logical_or(after > ring_len).any().item<bool>(),
                      "replayssm: accepted counts must be >= 0 and keep every cursor within ring_len = ", ring_len);
    if (pending)
      TORCH_CHECK_VALUE(!(add > pending->index_select(0, index)).logical_and(pad.logical_not()).any().item<bool>(),
                        "replayssm: accepted counts must not exceed the tokens of the last verify");
  }
  if (pending) {  // device-side: clamp to the window, and consume it
    add = at::minimum(add, pending->index_select(0, index).masked_fill(pad, 0));
    pending->scatter_add_(0, index, -add);
  }
  cursor.scatter_add_(0, index, add);
  cursor.clamp_(0, ring_len);  // on the GPU, where nothing can be raised, out-of-range counts are clamped
}

Tensor stochastic_round_op(const Tensor& x, int64_t seed, int64_t fold, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kBFloat16 || dtype == at::kHalf, "replayssm: stochastic_round rounds to bfloat16 or float16");
  check_dtype(x, "x", at::kFloat);
  const Tensor src = x.contiguous();
  Tensor out = at::empty(x.sizes(), x.options().dtype(dtype));
  const DType target = dtype == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
  const float* in = src.const_data_ptr<float>();
  at::parallel_for(0, src.numel(), 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float r = stochastic_round_to(target, in[i], fold_random(uint64_t(seed), uint32_t(fold), uint64_t(i)));
      if (target == DType::kBFloat16) out.data_ptr<c10::BFloat16>()[i] = c10::BFloat16(r);
      else out.data_ptr<c10::Half>()[i] = c10::Half(r);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(replayssm, CPU, m) {
  m.impl("stochastic_round", &stochastic_round_op);
  m.impl("mamba2_step", &mamba2_step);
  m.impl("mamba2_replay_step", &mamba2_replay_step);
  m.impl("mamba2_replay_state", &mamba2_replay_state);
  m.impl("mamba2_replay_verify", &mamba2_replay_verify);
  m.impl("mamba2_replay_commit", &mamba2_replay_commit);
}

#ifdef RSSM_WITH_CUDA
TORCH_LIBRARY_IMPL(replayssm, CUDA, m) {
  m.impl("mamba2_step", &mamba2_step);
  m.impl("mamba2_replay_step", &mamba2_replay_step);
  m.impl("mamba2_replay_state", &mamba2_replay_state);
  m.impl("mamba2_replay_verify", &mamba2_replay_verify);
  m.impl("mamba2_replay_commit", &mamba2_replay_commit);
}
#endif

}  // namespace replayssm
