// Instantiates the GDN standard step and the replay cache's state read for one state/checkpoint dtype. The GDN
// kernels are instantiated one family and dtype per file (step_, replay_, verify_*.cu) so that the build's longest
// translation unit stays short on a many-core machine.
#include "kernels.cuh"

namespace replayssm {
template void gdn_step_cuda_for_state<DType::kFloat32>(const GdnStepParams&, cudaStream_t);
template void gdn_replay_state_cuda_for_ckpt<DType::kFloat32>(const GdnReplayStateParams&, cudaStream_t);
}  // namespace replayssm
