// Entry points of the CUDA implementations of the Mamba-2 ops (torch-free: params and a stream).
#pragma once

#include <cuda_runtime_api.h>

#include "params.h"

namespace replayssm {

void mamba2_step_cuda(const Mamba2StepParams& p, cudaStream_t stream);
void mamba2_replay_step_cuda(const Mamba2ReplayStepParams& p, cudaStream_t stream);
void mamba2_replay_state_cuda(const Mamba2ReplayStateParams& p, cudaStream_t stream);
void mamba2_replay_verify_cuda(const Mamba2ReplayVerifyParams& p, cudaStream_t stream);

}  // namespace replayssm
