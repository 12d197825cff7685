// Routes each GDN op to the instantiation for its state dtype (defined in step_, replay_ and verify_*.cu).
#include "cuda.h"
#include "kernels.cuh"

namespace replayssm {

#define RSSM_EXTERN_FOR(D)                                                                     \
  extern template void gdn_step_cuda_for_state<DType::D>(const GdnStepParams&, cudaStream_t); \
  extern template void gdn_replay_step_cuda_for_ckpt<DType::D>(const GdnReplayParams&, cudaStream_t); \
  extern template void gdn_replay_state_cuda_for_ckpt<DType::D>(const GdnReplayStateParams&, cudaStream_t); \
  extern template void gdn_replay_verify_cuda_for_ckpt<DType::D>(const GdnReplayParams&, cudaStream_t);
RSSM_EXTERN_FOR(kFloat32)
RSSM_EXTERN_FOR(kBFloat16)
RSSM_EXTERN_FOR(kFloat16)
#undef RSSM_EXTERN_FOR

void gdn_step_cuda(const GdnStepParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.state_dtype, kS, [&] { gdn_step_cuda_for_state<kS>(p, stream); });
}

void gdn_replay_step_cuda(const GdnReplayParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kC, [&] { gdn_replay_step_cuda_for_ckpt<kC>(p, stream); });
}

void gdn_replay_verify_cuda(const GdnReplayParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kC, [&] { gdn_replay_verify_cuda_for_ckpt<kC>(p, stream); });
}

void gdn_replay_state_cuda(const GdnReplayStateParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.cache.ckpt_dtype, kC, [&] { gdn_replay_state_cuda_for_ckpt<kC>(p, stream); });
}

}  // namespace replayssm
