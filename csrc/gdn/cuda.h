// Entry points of the CUDA implementations of the GDN ops (torch-free: params and a stream).
#pragma once

#include <cuda_runtime_api.h>

#include "params.h"

namespace replayssm {

void gdn_step_cuda(const GdnStepParams& p, cudaStream_t stream);
void gdn_replay_step_cuda(const GdnReplayParams& p, cudaStream_t stream);
void gdn_replay_state_cuda(const GdnReplayStateParams& p, cudaStream_t stream);
void gdn_replay_verify_cuda(const GdnReplayParams& p, cudaStream_t stream);

}  // namespace replayssm
