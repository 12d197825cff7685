// The numerical split's optional cache tensors (MATH.md), validated and filled the same way for both layer
// kinds: a bf16 view of the checkpoint, per-slot seeds for stochastic rounding at folds, and the per-slot fold
// counter that Philox counts with. The caller has set c.ckpt_dtype.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "checks.h"

namespace replayssm {

template <typename CacheParams>
void fill_split_params(CacheParams& c, const at::Tensor& checkpoint, const std::optional<at::Tensor>& view, const std::optional<at::Tensor>& sr_seed,
                       const std::optional<at::Tensor>& fold_count) {
  const int64_t slots = checkpoint.size(0);
  if (view) {
    check_shape(*view, "view", {slots, checkpoint.size(1), checkpoint.size(2), checkpoint.size(3)});
    check_dtype(*view, "view", at::kBFloat16);
    check_device(*view, "view", checkpoint.device());
    check_inner_contiguous(*view, "view");
    c.view = view->data_ptr();
    c.view_slot_stride = view->stride(0);
    c.view_head_stride = view->stride(1);
    c.view_row_stride = view->stride(2);
  }
  if (sr_seed) {
    TORCH_CHECK_VALUE(c.ckpt_dtype != DType::kFloat32, "replayssm: stochastic rounding (sr_seed) needs a bf16 or fp16 checkpoint");
    TORCH_CHECK_VALUE(fold_count.has_value(), "replayssm: stochastic rounding (sr_seed) needs fold_count, its counter");
    check_shape(*sr_seed, "sr_seed", {slots});
    check_dtype(*sr_seed, "sr_seed", at::kLong);
    check_device(*sr_seed, "sr_seed", checkpoint.device());
    TORCH_CHECK_VALUE(sr_seed->is_contiguous(), "replayssm: sr_seed must be contiguous");
    c.sr_seed = sr_seed->data_ptr<int64_t>();
  }
  if (fold_count) {
    check_shape(*fold_count, "fold_count", {slots});
    check_dtype(*fold_count, "fold_count", at::kInt);
    check_device(*fold_count, "fold_count", checkpoint.device());
    TORCH_CHECK_VALUE(fold_count->is_contiguous(), "replayssm: fold_count must be contiguous");
    c.fold_count = fold_count->data_ptr<int>();
  }
}

// The cache's aligned-folds phase (replayssm/cache.py `fold_phase`; common/math.h folds_at), for the replay steps:
// (2,) int32 on the checkpoint's device, [0] the phase in [0, ring_len), [1] zero between steps (the CUDA kernels'
// count). Checked on the CPU; on the GPU the kernels check the phase on the device.
template <typename CacheParams>
void fill_fold_phase(CacheParams& c, const at::Tensor& checkpoint, const std::optional<at::Tensor>& fold_phase) {
  if (!fold_phase) return;
  check_shape(*fold_phase, "fold_phase", {2});
  check_dtype(*fold_phase, "fold_phase", at::kInt);
  check_device(*fold_phase, "fold_phase", checkpoint.device());
  TORCH_CHECK_VALUE(fold_phase->is_contiguous(), "replayssm: fold_phase must be contiguous");
  if (!fold_phase->is_cuda()) {
    const int* v = fold_phase->data_ptr<int>();
    TORCH_CHECK_VALUE(v[0] >= 0 && v[0] < c.ring_len, "replayssm: fold_phase[0] = ", v[0], " must be in [0, ring_len = ",
                      c.ring_len, ")");
    TORCH_CHECK_VALUE(v[1] == 0, "replayssm: fold_phase[1] must be 0 between steps, got ", v[1]);
  }
  c.fold_phase = fold_phase->data_ptr<int>();
}

}  // namespace replayssm
