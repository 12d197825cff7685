// Instantiates the Mamba-2 replay step and state read for one checkpoint dtype (one file per dtype).
#include "kernels.cuh"

namespace replayssm {
template void mamba2_replay_step_cuda_for_ckpt<DType::kFloat32>(const Mamba2ReplayStepParams&, cudaStream_t);
template void mamba2_replay_state_cuda_for_ckpt<DType::kFloat32>(const Mamba2ReplayStateParams&, cudaStream_t);
}  // namespace replayssm
