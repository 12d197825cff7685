// The short causal convolution (depthwise, width W) that both layer kinds run on their inputs, with
// speculative tokens that roll back (MATH.md, "The short convolution"). The conv state of a slot is its last
// W - 1 inputs, (dim, W - 1), oldest first. Verify computes the outputs of T tentative inputs from the state
// and keeps the inputs in a per-slot window without touching the state; commit derives the state after the
// first n of them. CPU loops here; CUDA kernels in kernels.cu (a thread per (row, channel)).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <optional>

#include "../common/checks.h"
#include "../common/math.h"
#include "params.h"

#ifdef RSSM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace replayssm {
namespace {

using at::Tensor;

template <typename T> float ld(const Tensor& t, int64_t i) { return static_cast<float>(t.const_data_ptr<T>()[i]); }

void check_conv_args(const Tensor& conv_state, const Tensor& conv_window, const Tensor& slot_ids) {
  TORCH_CHECK_VALUE(conv_state.dim() == 3, "replayssm: conv_state must have shape (num_slots, dim, width - 1), got ",
                    shape_str(conv_state.sizes()));
  const int64_t slots = conv_state.size(0), dim = conv_state.size(1);
  TORCH_CHECK_VALUE(conv_window.dim() == 3, "replayssm: conv_window must have shape (num_slots, T, dim), got ",
                    shape_str(conv_window.sizes()));
  check_shape(conv_window, "conv_window", {slots, -1, dim});
  TORCH_CHECK_VALUE(conv_state.is_contiguous() && conv_window.is_contiguous(), "replayssm: conv_state and conv_window must be contiguous");
  check_dtype(conv_window, "conv_window", conv_state.scalar_type());
  check_device(conv_window, "conv_window", conv_state.device());
  check_device(slot_ids, "slot_ids", conv_state.device());
  check_shape(slot_ids, "slot_ids", {-1});
  check_slot_ids(slot_ids, slots);
  TORCH_CHECK_VALUE(!conv_state.is_cuda() || slot_ids.size(0) <= 65535, "replayssm: the CUDA kernels take at most 65535 rows per call");
}

ConvParams conv_params(const Tensor& conv_state, const Tensor& conv_window, const Tensor& slot_ids) {
  ConvParams p;
  p.batch = static_cast<int>(slot_ids.size(0));
  p.dim = static_cast<int>(conv_state.size(1));
  p.width = static_cast<int>(conv_state.size(2)) + 1;
  p.tmax = static_cast<int>(conv_window.size(1));
  p.num_slots = conv_state.size(0);
  p.dtype = float_dtype(conv_state, "conv_state");
  p.conv_state = conv_state.data_ptr();
  p.conv_window = conv_window.data_ptr();
  p.slot_ids = slot_ids.data_ptr();
  p.slot_ids_int64 = slot_ids.scalar_type() == at::kLong;
  return p;
}

#ifdef RSSM_WITH_CUDA
void* current_stream(const Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

template <typename T>
void conv_verify_cpu(const Tensor& conv_state, Tensor& conv_window, const Tensor& x, const Tensor& weight,
                     const std::optional<Tensor>& bias, bool silu_act, const Tensor& slot_ids, Tensor& out) {
  const int64_t batch = x.size(0), ntok = x.size(1), dim = x.size(2), width = weight.size(1), hist = width - 1;
  const Tensor ids = slot_ids.to(at::kLong).contiguous();
  const int64_t* slot_of = ids.const_data_ptr<int64_t>();
  at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t s = slot_of[b];
      if (s == kPadSlot) continue;
      T* window = conv_window.data_ptr<T>() + s * conv_window.stride(0);
      for (int64_t k = 0; k < ntok; ++k)
        for (int64_t c = 0; c < dim; ++c) window[k * dim + c] = x.const_data_ptr<T>()[(b * ntok + k) * dim + c];
      for (int64_t k = 0; k < ntok; ++k)
        for (int64_t c = 0; c < dim; ++c) {
          // Inputs k - W + 1 .. k of the sequence [state (W - 1 oldest-first), window]: position q < 0 is state.
          float acc = bias ? ld<float>(*bias, c) : 0.f;
          for (int64_t w = 0; w < width; ++w) {
            const int64_t q = k - hist + w;
            const float v = q < 0 ? ld<T>(conv_state, (s * dim + c) * hist + (hist + q)) : static_cast<float>(window[q * dim + c]);
            acc += ld<float>(weight, c * width + w) * v;
          }
          out.data_ptr<T>()[(b * ntok + k) * dim + c] = T(silu_act ? silu(acc) : acc);
        }
    }
  });
}

// conv_state (s, dim, W-1), conv_window (s, Tmax, dim) receives the inputs; x (b, T, dim), weight (dim, W) fp32,
// bias (dim,) fp32, out (b, T, dim).
void causal_conv1d_verify(const Tensor& conv_state, Tensor conv_window, const Tensor& x, const Tensor& weight,
                          const std::optional<Tensor>& bias, bool silu_act, const Tensor& slot_ids, Tensor out) {
  check_conv_args(conv_state, conv_window, slot_ids);
  const int64_t dim = conv_state.size(1), width = conv_state.size(2) + 1;
  TORCH_CHECK_VALUE(x.dim() == 3, "replayssm: x must have shape (batch, T, dim), got ", shape_str(x.sizes()));
  check_shape(x, "x", {slot_ids.size(0), -1, dim});
  TORCH_CHECK_VALUE(x.size(1) >= 1 && x.size(1) <= conv_window.size(1), "replayssm: x holds ", x.size(1),
                    " tokens per row; conv_window keeps at most ", conv_window.size(1));
  check_shape(weight, "weight", {dim, width});
  check_dtype(weight, "weight", at::kFloat);
  if (bias) {
    check_shape(*bias, "bias", {dim});
    check_dtype(*bias, "bias", at::kFloat);
  }
  check_shape(out, "out", {x.size(0), x.size(1), dim});
  for (auto [t, name] : {std::pair{&x, "x"}, {&out, "out"}}) {
    check_dtype(*t, name, conv_state.scalar_type());
    check_device(*t, name, conv_state.device());
    TORCH_CHECK_VALUE(t->is_contiguous(), "replayssm: ", name, " must be contiguous");
  }
  TORCH_CHECK_VALUE(weight.is_contiguous() && (!bias || bias->is_contiguous()), "replayssm: weight and bias must be contiguous");
  check_device(weight, "weight", conv_state.device());
  if (bias) check_device(*bias, "bias", conv_state.device());
  if (slot_ids.size(0) == 0) return;
#ifdef RSSM_WITH_CUDA
  if (conv_state.is_cuda()) {
    ConvParams p = conv_params(conv_state, conv_window, slot_ids);
    p.ntokens = static_cast<int>(x.size(1));
    p.x = x.data_ptr();
    p.weight = weight.data_ptr<float>();
    p.bias = bias ? bias->data_ptr<float>() : nullptr;
    p.silu = silu_act;
    p.out = out.data_ptr();
    const c10::cuda::CUDAGuard guard(conv_state.device());
    causal_conv1d_verify_cuda(p, current_stream(conv_state));
    return;
  }
#endif
  RSSM_SWITCH_DTYPE(float_dtype(conv_state, "conv_state"), kD, [&] {
    using T = std::conditional_t<kD == DType::kFloat32, float, std::conditional_t<kD == DType::kBFloat16, c10::BFloat16, c10::Half>>;
    conv_verify_cpu<T>(conv_state, conv_window, x, weight, bias, silu_act, slot_ids, out);
  });
}

// conv_state[slot] <- the last W-1 inputs of [conv_state[slot], conv_window[slot, :accepted[b]]].
void causal_conv1d_commit(Tensor conv_state, const Tensor& conv_window, const Tensor& slot_ids, const Tensor& accepted) {
  check_conv_args(conv_state, conv_window, slot_ids);
  check_shape(accepted, "accepted", {slot_ids.size(0)});
  check_dtype(accepted, "accepted", at::kInt);
  check_device(accepted, "accepted", conv_state.device());
  TORCH_CHECK_VALUE(accepted.is_contiguous(), "replayssm: accepted must be contiguous");
  if (slot_ids.size(0) == 0) return;
#ifdef RSSM_WITH_CUDA
  if (conv_state.is_cuda()) {  // device-side, no sync; accepted counts are checked on the device
    ConvParams p = conv_params(conv_state, conv_window, slot_ids);
    p.accepted = accepted.data_ptr<int>();
    const c10::cuda::CUDAGuard guard(conv_state.device());
    causal_conv1d_commit_cuda(p, current_stream(conv_state));
    return;
  }
#endif
  const int64_t dim = conv_state.size(1), hist = conv_state.size(2), tmax = conv_window.size(1);
  for (int64_t b = 0; b < slot_ids.size(0); ++b) {
    const int64_t s = slot_ids[b].item<int64_t>(), n = accepted[b].item<int64_t>();
    if (s == kPadSlot) continue;
    TORCH_CHECK_VALUE(n >= 0 && n <= tmax, "replayssm: accepted[", b, "] = ", n, " is outside [0, ", tmax, "]");
    const Tensor seq = at::cat({conv_state[s], conv_window[s].narrow(0, 0, n).t()}, 1);  // (dim, hist + n)
    conv_state[s].copy_(seq.narrow(1, n, hist));
  }
  (void)dim;
}

}  // namespace

TORCH_LIBRARY_IMPL(replayssm, CPU, m) {
  m.impl("causal_conv1d_verify", &causal_conv1d_verify);
  m.impl("causal_conv1d_commit", &causal_conv1d_commit);
}

#ifdef RSSM_WITH_CUDA
TORCH_LIBRARY_IMPL(replayssm, CUDA, m) {
  m.impl("causal_conv1d_verify", &causal_conv1d_verify);
  m.impl("causal_conv1d_commit", &causal_conv1d_commit);
}
#endif

}  // namespace replayssm
