// Parameters of the short-convolution ops with speculative tokens (conv/ops.cpp fills them; CPU loops and
// CUDA kernels read them). Every tensor here is contiguous.
#pragma once

#include <cstdint>

#include "../common/dtype.h"

namespace replayssm {

struct ConvParams {
  int batch = 0, ntokens = 0, dim = 0, width = 0, tmax = 0;  // rows, T, channels, W, window capacity
  int64_t num_slots = 0;
  DType dtype = DType::kFloat32;   // conv_state, conv_window, x, out
  void* conv_state = nullptr;      // (num_slots, dim, W - 1), oldest first
  void* conv_window = nullptr;     // (num_slots, tmax, dim)
  const void* x = nullptr;         // (batch, T, dim)
  const float* weight = nullptr;   // (dim, W)
  const float* bias = nullptr;     // (dim,) or null
  bool silu = false;
  void* out = nullptr;             // (batch, T, dim)
  const void* slot_ids = nullptr;  // (batch,) int32 or int64
  bool slot_ids_int64 = false;
  const int* accepted = nullptr;   // commit: (batch,) in [0, tmax]
};

void causal_conv1d_verify_cuda(const ConvParams& p, void* stream);
void causal_conv1d_commit_cuda(const ConvParams& p, void* stream);

}  // namespace replayssm
