// The Mamba-2 replay step with the bf16 output view of an fp32 checkpoint (declared in kernels.cuh): apart from
// replay_f32.cu so that neither is the build's longest translation unit.
#include "kernels.cuh"

namespace replayssm {
void mamba2_replay_step_cuda_view(const Mamba2ReplayStepParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.dstate, kN, [&] {
      using act_t = typename CudaType<kAct>::type;
      // The bf16 view of an fp32 checkpoint: six stages (kStreamStages), the same bytes in flight per thread as an
      // fp32 checkpoint's three (N >= 32). Measured against the general kernel that served the split until
      // session 4 (bench/results/mamba2_decode.json, d8f3208, as REPLAYSSM_TUNE replay_variant=3): the view 7.8 /
      // 58.6 / 160.4 / 296.4 us at batch 1 / 32 / 128 / 256 against 7.2 / 61.3 / 170.7 / 317.1.
      //
      // bf16 activations, N = 128: 4 blocks of 128 threads per SM (128 registers, C_t read from shared memory) in
      // 4 stages (3 in flight per block: 12 per SM, against 15 for 3 blocks of 6; 6 stages do not leave 4 blocks
      // of 256 rows room in an SM's shared memory). H200, session 16 (bench/results/session16/), us at batch
      // 1 / 32 / 128 / 256, L = 16: 7.23 / 39.5 / 106.7 / 197.9 against 3 blocks of 6 stages' 7.17 / 41.0 / 107.0 /
      // 199.5. The default up to rings of 16 (the length measured: past ~24 its blocks no longer fit 4 per SM);
      // REPLAYSSM_TUNE view_bps=4 / 3 forces either form.
      if constexpr (kAct == DType::kBFloat16 && kN == 128) {
        const int bps = tune_knob("view_bps");
        if (bps == 4 || (bps != 3 && p.cache.ring_len <= 16))
          return launch_mamba2_replay_step_v10<float, act_t, kN, __nv_bfloat16, 4, 4>(p, stream);
      }
      return launch_mamba2_replay_step_v10<float, act_t, kN, __nv_bfloat16, kStreamStages>(p, stream);
    });
  });
}
}  // namespace replayssm
