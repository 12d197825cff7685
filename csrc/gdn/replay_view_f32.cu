// The GDN replay step with the bf16 output view of an fp32 checkpoint (declared in kernels.cuh): apart from
// replay_f32.cu so that neither is the build's longest translation unit.
#include "kernels.cuh"

namespace replayssm {
void gdn_replay_step_cuda_view(const GdnReplayParams& p, cudaStream_t stream) {
  RSSM_SWITCH_DTYPE(p.act_dtype, kAct, [&] {
    RSSM_SWITCH_DSTATE(p.kdim, kK, [&] {
      using act_t = typename CudaType<kAct>::type;
      using view_t = __nv_bfloat16;
      // K >= 128: 16 columns per lane in six stages (gdn_replay_variant=2's layout; the same bytes in flight as
      // ReplayLanes' 32 columns in three, which spill with the view at 168 registers: ptxas -v, 150 here).
      // (Session 12: with a `switch` as the first `if constexpr`'s statement, nvcc 13.0 compiled and launched the
      // last line's kernels for K >= 128 views of fp32/fp16 activations (ptxas's entry list), whose launch failed
      // on the H200 with "invalid device function". This form, 2794ff3's, compiles the intended ones.)
      if constexpr (kK == 128 && kAct == DType::kBFloat16)
        if (tune_knob("gdn_view_variant") != 0) return launch_gdn_replay_step<float, act_t, kK, 4, GdnStepLanes<view_t, kK>::value, 4, view_t>(p, stream);
      if constexpr (kK >= 128) return launch_gdn_replay_step<float, act_t, kK, 6, GdnStepLanes<view_t, kK>::value, 3, view_t>(p, stream);
      else return launch_gdn_replay_step<float, act_t, kK, 3, ReplayLanes<view_t, kK>::value, 3, view_t>(p, stream);
    });
  });
}
}  // namespace replayssm
