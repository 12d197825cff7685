// Instantiates the Mamba-2 speculative verification kernel for one checkpoint dtype (one file per dtype).
#include "verify.cuh"

namespace replayssm {
template void mamba2_replay_verify_cuda_for_ckpt<DType::kBFloat16>(const Mamba2ReplayVerifyParams&, cudaStream_t);
}  // namespace replayssm
