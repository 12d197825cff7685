// Instantiates the GDN replay step for one checkpoint dtype (see step_f32.cu for the file split).
#include "kernels.cuh"

namespace replayssm {
template void gdn_replay_step_cuda_for_ckpt<DType::kFloat32>(const GdnReplayParams&, cudaStream_t);
}  // namespace replayssm
