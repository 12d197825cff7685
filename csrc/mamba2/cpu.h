// Entry points of the CPU and CUDA implementations of the Mamba-2 ops. Both take the same params.
#pragma once

#include "params.h"

namespace replayssm {

void mamba2_step_cpu(const Mamba2StepParams& p);
void mamba2_replay_step_cpu(const Mamba2ReplayStepParams& p);
void mamba2_replay_state_cpu(const Mamba2ReplayStateParams& p);
void mamba2_replay_verify_cpu(const Mamba2ReplayVerifyParams& p);

}  // namespace replayssm
