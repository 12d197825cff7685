// Instantiates the GDN step, replay, verify and state kernels for one state/checkpoint dtype (one file per dtype).
#include "kernels.cuh"

namespace replayssm {
template void gdn_step_cuda_for_state<DType::kBFloat16>(const GdnStepParams&, cudaStream_t);
template void gdn_replay_step_cuda_for_ckpt<DType::kBFloat16>(const GdnReplayParams&, cudaStream_t);
template void gdn_replay_state_cuda_for_ckpt<DType::kBFloat16>(const GdnReplayStateParams&, cudaStream_t);
template void gdn_replay_verify_cuda_for_ckpt<DType::kBFloat16>(const GdnReplayParams&, cudaStream_t);
}  // namespace replayssm
