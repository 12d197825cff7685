// Entry points of the CPU implementations of the Gated DeltaNet ops.
#pragma once

#include "params.h"

namespace replayssm {

void gdn_step_cpu(const GdnStepParams& p);
void gdn_replay_step_cpu(const GdnReplayParams& p);
void gdn_replay_verify_cpu(const GdnReplayParams& p);
void gdn_replay_state_cpu(const GdnReplayStateParams& p);

}  // namespace replayssm
