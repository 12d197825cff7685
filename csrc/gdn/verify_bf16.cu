// Instantiates the GDN speculative verification for one checkpoint dtype (see step_bf16.cu for the file split).
#include "kernels.cuh"

namespace replayssm {
template void gdn_replay_verify_cuda_for_ckpt<DType::kBFloat16>(const GdnReplayParams&, cudaStream_t);
}  // namespace replayssm
