// Input validation for the torch layer: every failure names the argument and the expected value.
#pragma once

#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dtype.h"
#include "math.h"

namespace replayssm {

inline std::string shape_str(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << (sizes.size() == 1 ? ",)" : ")");
  return os.str();
}

// Expected sizes; -1 accepts any size in that dimension.
inline void check_shape(const at::Tensor& t, const char* name, std::initializer_list<int64_t> expected) {
  std::vector<int64_t> want(expected);
  bool ok = t.dim() == static_cast<int64_t>(want.size());
  for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || t.size(i) == want[i];
  if (!ok) {
    std::ostringstream os;
    os << "(";
    for (size_t i = 0; i < want.size(); ++i) os << (i ? ", " : "") << (want[i] < 0 ? std::string("*") : std::to_string(want[i]));
    os << (want.size() == 1 ? ",)" : ")");
    TORCH_CHECK_VALUE(false, "replayssm: ", name, " must have shape ", os.str(), ", got ", shape_str(t.sizes()));
  }
}

inline void check_device(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK_VALUE(t.device() == device, "replayssm: ", name, " must be on ", device, " (like x), got ", t.device());
}

inline void check_dtype(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, "replayssm: ", name, " must have dtype ", dtype, ", got ", t.scalar_type());
}

inline DType float_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    default: TORCH_CHECK_VALUE(false, "replayssm: ", name, " must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

// The innermost dimension is read as contiguous memory.
inline void check_inner_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.size(-1) <= 1 || t.stride(-1) == 1, "replayssm: ", name,
                    " must be contiguous in its last dimension (stride 1), got strides ", shape_str(t.strides()));
}

// The CUDA kernels read these rows as 16-byte vectors: base and every outer stride 16-byte aligned.
inline void check_vector_aligned(const at::Tensor& t, const char* name) {
  const int64_t elem = t.element_size();
  bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int64_t d = 0; ok && d + 1 < t.dim(); ++d) ok = t.size(d) <= 1 || (t.stride(d) * elem) % 16 == 0;
  TORCH_CHECK_VALUE(ok, "replayssm: ", name, " must be 16-byte aligned with every stride but the last a multiple of 16 bytes ",
                    "(the CUDA kernels read its rows as 16-byte vectors); got strides ", shape_str(t.strides()));
}

// Slot ids: int32 or int64, contiguous; on the CPU also in range and no slot twice in a batch. On the GPU
// a host check of the values would need a sync, so the kernels check the range themselves (device-side assert).
inline void check_slot_ids(const at::Tensor& slot_ids, int64_t num_slots) {
  TORCH_CHECK_VALUE(slot_ids.scalar_type() == at::kInt || slot_ids.scalar_type() == at::kLong,
                    "replayssm: slot_ids must be int32 or int64, got ", slot_ids.scalar_type());
  TORCH_CHECK_VALUE(slot_ids.is_contiguous(), "replayssm: slot_ids must be contiguous");
  if (slot_ids.is_cuda()) return;
  std::vector<int64_t> seen;
  for (int64_t b = 0; b < slot_ids.size(0); ++b) {
    const int64_t s = slot_ids[b].item<int64_t>();
    if (s == kPadSlot) continue;
    TORCH_CHECK_INDEX(s >= 0 && s < num_slots, "replayssm: slot_ids[", b, "] = ", s, " is out of range for a pool of ",
                      num_slots, " slots (pad rows use ", kPadSlot, ")");
    seen.push_back(s);
  }
  std::sort(seen.begin(), seen.end());
  TORCH_CHECK_VALUE(std::adjacent_find(seen.begin(), seen.end()) == seen.end(), "replayssm: slot_ids must not repeat a slot");
}

// Committed positions (batch,) int32 of the rows' slots, each in [0, cursor[slot]] (checked on the CPU; the
// CUDA kernels check on the device). Returns the data pointer, or null without positions.
inline const int* positions_ptr(const std::optional<at::Tensor>& positions, const at::Tensor& slot_ids,
                                const at::Tensor& cursor) {
  if (!positions) return nullptr;
  check_shape(*positions, "positions", {slot_ids.size(0)});
  check_device(*positions, "positions", cursor.device());
  check_dtype(*positions, "positions", at::kInt);
  TORCH_CHECK_VALUE(positions->is_contiguous(), "replayssm: positions must be contiguous");
  if (!positions->is_cuda())
    for (int64_t b = 0; b < slot_ids.size(0); ++b) {
      const int64_t s = slot_ids[b].item<int64_t>(), pos = (*positions)[b].item<int64_t>();
      if (s == kPadSlot) continue;
      TORCH_CHECK_VALUE(pos >= 0 && pos <= cursor[s].item<int64_t>(), "replayssm: positions[", b, "] = ", pos,
                        " is not a committed position of slot ", s, " (0..", cursor[s].item<int64_t>(), ")");
    }
  return positions->const_data_ptr<int>();
}

// The per-slot count of verified, not yet committed tokens (written by verify, consumed by commit).
inline int* pending_ptr(const std::optional<at::Tensor>& pending, const at::Tensor& cursor) {
  if (!pending) return nullptr;
  check_shape(*pending, "pending", {cursor.size(0)});
  check_dtype(*pending, "pending", at::kInt);
  check_device(*pending, "pending", cursor.device());
  TORCH_CHECK_VALUE(pending->is_contiguous(), "replayssm: pending must be contiguous");
  return pending->data_ptr<int>();
}

}  // namespace replayssm
