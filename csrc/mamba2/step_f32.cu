// Instantiates the Mamba-2 standard step for one state dtype (one file per dtype: builds parallelise).
#include "kernels.cuh"

namespace replayssm {
template void mamba2_step_cuda_for_state<DType::kFloat32>(const Mamba2StepParams&, cudaStream_t);
}  // namespace replayssm
