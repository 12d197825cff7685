// Routes each Mamba-2 op to the instantiation for its storage dtype (defined in step_*.cu, replay_*.cu).
#include "cuda.h"
#include "kernels.cuh"
#include "verify.cuh"

namespace replayssm {

#define RSSM_EXTERN_FOR(D)                                                                               \
  extern template void mamba2_step_cuda_for_state<DType::D>(const Mamba2StepParams&, cudaStream_t);        \
  extern template void mamba2_replay_step_cuda_for_ckpt<DType::D>(const Mamba2ReplayStepParams&, cudaStream_t); \
  extern template void mamba2_replay_state_cuda_for_ckpt<DType::D>(const Mamba2ReplayStateParams&, cudaStream_t); \
  extern template void mamba2_replay_verify_cuda_for_ckpt<DType::D>(const Mamba2ReplayVerifyParams&, cudaStream_t);
RSSM_EXTERN_FOR(kFloat32)
RSSM_EXTERN_FOR(kBFloat16)
RSSM_EXTERN_FOR(kFloat16)
#undef RSSM_EXTERN_FOR

void mamba2_step_cuda(const Mamba2StepParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.state_dtype, kState, [&] { mamba2_step_cuda_for_state<kState>(p, stream); });
}

void mamba2_replay_step_cuda(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kCkpt, [&] { mamba2_replay_step_cuda_for_ckpt<kCkpt>(p, stream); });
}

void mamba2_replay_state_cuda(const Mamba2ReplayStateParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kCkpt, [&] { mamba2_replay_state_cuda_for_ckpt<kCkpt>(p, stream); });
}

void mamba2_replay_verify_cuda(const Mamba2ReplayVerifyParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kCkpt, [&] { mamba2_replay_verify_cuda_for_ckpt<kCkpt>(p, stream); });
}

}  // namespace replayssm
