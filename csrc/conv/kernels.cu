// CUDA kernels of the short convolution with speculative tokens (semantics: conv/ops.cpp, the CPU loops).
// A thread per (row, channel): the state and the window of one channel are a few values, read once.
#include <cuda_runtime.h>

#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "params.h"

namespace replayssm {
namespace {

constexpr int kMaxWidth = 8, kMaxTokens = 64;

template <typename T>
__global__ void conv_verify_kernel(const ConvParams p) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
  if (c >= p.dim) return;
  const int64_t s = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (s == kPadSlot) return;
  RSSM_DEVICE_CHECK(s >= 0 && s < p.num_slots, "causal_conv1d_verify: slot_ids[%d] = %lld is out of range", b, (long long)s);
  const int hist = p.width - 1;
  float seq[kMaxWidth - 1 + kMaxTokens];  // [state (oldest first), window]
  const T* state = static_cast<const T*>(p.conv_state) + (s * p.dim + c) * hist;
  for (int q = 0; q < hist; ++q) seq[q] = to_float(state[q]);
  const T* x = static_cast<const T*>(p.x) + int64_t(b) * p.ntokens * p.dim + c;
  T* window = static_cast<T*>(p.conv_window) + s * p.tmax * p.dim + c;
  for (int k = 0; k < p.ntokens; ++k) {
    const T v = x[k * p.dim];
    window[k * p.dim] = v;
    seq[hist + k] = to_float(v);
  }
  T* out = static_cast<T*>(p.out) + int64_t(b) * p.ntokens * p.dim + c;
  for (int k = 0; k < p.ntokens; ++k) {
    float acc = p.bias ? p.bias[c] : 0.f;
    for (int w = 0; w < p.width; ++w) acc += p.weight[c * p.width + w] * seq[k + w];
    out[k * p.dim] = from_float<T>(p.silu ? silu(acc) : acc);
  }
}

template <typename T>
__global__ void conv_commit_kernel(const ConvParams p) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
  if (c >= p.dim) return;
  const int64_t s = slot_at(p.slot_ids, p.slot_ids_int64, b);
  if (s == kPadSlot) return;
  RSSM_DEVICE_CHECK(s >= 0 && s < p.num_slots, "causal_conv1d_commit: slot_ids[%d] = %lld is out of range", b, (long long)s);
  const int n = p.accepted[b];
  RSSM_DEVICE_CHECK(n >= 0 && n <= p.tmax, "causal_conv1d_commit: accepted[%d] = %d is outside [0, %d]", b, n, p.tmax);
  const int hist = p.width - 1;
  T* state = static_cast<T*>(p.conv_state) + (s * p.dim + c) * hist;
  const T* window = static_cast<const T*>(p.conv_window) + s * p.tmax * p.dim + c;
  T seq[kMaxWidth - 1];  // the last hist inputs of [state, window[:n]]
  for (int q = 0; q < hist; ++q) {
    const int from = n + q;  // position in [state, window]
    seq[q] = from < hist ? state[from] : window[(from - hist) * p.dim];
  }
  for (int q = 0; q < hist; ++q) state[q] = seq[q];
}

template <template <typename> class Kernel>
void launch(const ConvParams& p, void* stream, const char* what) {
  const dim3 block(128), grid((p.dim + 127) / 128, p.batch);
  switch (p.dtype) {
    case DType::kFloat32: Kernel<float>::run(grid, block, p, stream); break;
    case DType::kBFloat16: Kernel<__nv_bfloat16>::run(grid, block, p, stream); break;
    case DType::kFloat16: Kernel<__half>::run(grid, block, p, stream); break;
  }
  check_cuda(cudaGetLastError(), what);
}
template <typename T> struct Verify {
  static void run(dim3 g, dim3 b, const ConvParams& p, void* s) { conv_verify_kernel<T><<<g, b, 0, static_cast<cudaStream_t>(s)>>>(p); }
};
template <typename T> struct Commit {
  static void run(dim3 g, dim3 b, const ConvParams& p, void* s) { conv_commit_kernel<T><<<g, b, 0, static_cast<cudaStream_t>(s)>>>(p); }
};

}  // namespace

void causal_conv1d_verify_cuda(const ConvParams& p, void* stream) {
  if (p.width > kMaxWidth || p.ntokens > kMaxTokens)
    throw std::invalid_argument("replayssm: the CUDA causal_conv1d_verify takes width <= 8 and at most 64 tokens");
  launch<Verify>(p, stream, "causal_conv1d_verify kernel launch");
}

void causal_conv1d_commit_cuda(const ConvParams& p, void* stream) {
  if (p.width > kMaxWidth) throw std::invalid_argument("replayssm: the CUDA causal_conv1d_commit takes width <= 8");
  launch<Commit>(p, stream, "causal_conv1d_commit kernel launch");
}

}  // namespace replayssm
