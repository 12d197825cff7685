"""Does the views' fold lose bandwidth to its access pattern? (bench/NOTES.md, session 10, next session item 3.)

With a bf16 view the replay kernels' row layout gives each lane 8 consecutive columns per 16-byte vector (kVec = 8
bf16), so a fold's fp32 master loads and stores are two float4 per vector at a 32-byte stride across lanes: every
instruction uses half of each sector it touches. This times the fold's memory traffic alone (read the fp32
master, write it and its bf16 view; GDN at batch 256: 262144 rows of 128 columns, 8 lanes per row, 128-thread
blocks of 64 rows, the replay kernels' shape) with four access patterns:

    view     the view kernels' pattern (8 columns per lane per vector, float4 halves at a 32-byte stride)
    paired   the same columns per lane, each float4 instruction covering whole sectors (lane pairs load each other's
             halves and swap them with shuffles; the stores the same way back)
    plain    4 columns per lane per vector (the fp32 layout, kVec = 4): contiguous across lanes, the view's stores
             8 bytes per lane
    copy     the plain pattern without the view (fp32 in, fp32 out)

If `view` is well below `plain` and `paired` recovers it, the pattern is a cause of the fold's 57% of the copy
rate, and `paired` is the fix to port; if all are alike, look elsewhere. ~1 min including the compile.

    python bench/fold_pattern_probe.py [--rows 262144] [--out bench/results/fold_pattern_probe.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CUDA_SRC = r"""
#include <cuda_bf16.h>
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

namespace {
constexpr int kK = 128, kLanes = 8, kThreads = 128, kRowsPerIter = kThreads / kLanes;

__device__ __forceinline__ float update(float x) { return fmaf(x, 0.999f, 1e-3f); }  // stands for the fold's arithmetic

__device__ __forceinline__ uint2 pack4(float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  return make_uint2(*reinterpret_cast<unsigned*>(&lo), *reinterpret_cast<unsigned*>(&hi));
}

// kPattern 0 view, 1 paired, 2 plain, 3 copy (no view written).
template <int kPattern>
__global__ void __launch_bounds__(kThreads) fold_pattern(float* master, __nv_bfloat16* view, int rows, int rows_per_block) {
  const int lane = threadIdx.x & 31, lane_in_row = lane % kLanes;
  const int row0 = blockIdx.x * rows_per_block + threadIdx.x / kLanes;
  const int row_end = min(rows, (blockIdx.x + 1) * rows_per_block);
  for (int r = row0; r < row_end; r += kRowsPerIter) {
    float* m = master + int64_t(r) * kK;
    __nv_bfloat16* vw = view + int64_t(r) * kK;
    if constexpr (kPattern == 0 || kPattern == 1) {
      float s[16];  // columns (v * 8 + lane_in_row) * 8 + e, v < 2, e < 8
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        float4 x, y;
        if constexpr (kPattern == 0) {
          x = __ldcs(reinterpret_cast<const float4*>(m + (v * 8 + lane_in_row) * 8));
          y = __ldcs(reinterpret_cast<const float4*>(m + (v * 8 + lane_in_row) * 8 + 4));
        } else {  // lane pairs: instruction 0 covers the even lane's 32 bytes, instruction 1 the odd lane's
          const bool even = (lane & 1) == 0;
          const int half = even ? 0 : 4;
          const float4 a = __ldcs(reinterpret_cast<const float4*>(m + (v * 8 + (lane_in_row & ~1)) * 8 + half));
          const float4 b = __ldcs(reinterpret_cast<const float4*>(m + (v * 8 + (lane_in_row | 1)) * 8 + half));
          // even: a = own first half, b = partner's first half; odd: a = partner's second half, b = own second half
          const float4 send = even ? b : a;
          float4 recv;
          recv.x = __shfl_xor_sync(0xffffffffu, send.x, 1);
          recv.y = __shfl_xor_sync(0xffffffffu, send.y, 1);
          recv.z = __shfl_xor_sync(0xffffffffu, send.z, 1);
          recv.w = __shfl_xor_sync(0xffffffffu, send.w, 1);
          x = even ? a : recv;
          y = even ? recv : b;
        }
        s[v * 8 + 0] = update(x.x), s[v * 8 + 1] = update(x.y), s[v * 8 + 2] = update(x.z), s[v * 8 + 3] = update(x.w);
        s[v * 8 + 4] = update(y.x), s[v * 8 + 5] = update(y.y), s[v * 8 + 6] = update(y.z), s[v * 8 + 7] = update(y.w);
      }
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const float4 x = make_float4(s[v * 8 + 0], s[v * 8 + 1], s[v * 8 + 2], s[v * 8 + 3]);
        const float4 y = make_float4(s[v * 8 + 4], s[v * 8 + 5], s[v * 8 + 6], s[v * 8 + 7]);
        if constexpr (kPattern == 0) {
          __stcs(reinterpret_cast<float4*>(m + (v * 8 + lane_in_row) * 8), x);
          __stcs(reinterpret_cast<float4*>(m + (v * 8 + lane_in_row) * 8 + 4), y);
        } else {  // the loads' exchange backwards: each instruction writes whole sectors
          const bool even = (lane & 1) == 0;
          const int half = even ? 0 : 4;
          const float4 send = even ? y : x;  // even gives its second half, odd its first
          float4 recv;
          recv.x = __shfl_xor_sync(0xffffffffu, send.x, 1);
          recv.y = __shfl_xor_sync(0xffffffffu, send.y, 1);
          recv.z = __shfl_xor_sync(0xffffffffu, send.z, 1);
          recv.w = __shfl_xor_sync(0xffffffffu, send.w, 1);
          // instruction 0 (even lane's 32 bytes): even stores its first half, odd the even lane's second (recv)
          __stcs(reinterpret_cast<float4*>(m + (v * 8 + (lane_in_row & ~1)) * 8 + half), even ? x : recv);
          // instruction 1 (odd lane's 32 bytes): even stores the odd lane's first half (recv), odd its second
          __stcs(reinterpret_cast<float4*>(m + (v * 8 + (lane_in_row | 1)) * 8 + half), even ? recv : y);
        }
        const uint2 lo = pack4(x.x, x.y, x.z, x.w), hi = pack4(y.x, y.y, y.z, y.w);
        __stcs(reinterpret_cast<uint4*>(vw + (v * 8 + lane_in_row) * 8), make_uint4(lo.x, lo.y, hi.x, hi.y));
      }
    } else {
#pragma unroll
      for (int v = 0; v < 4; ++v) {  // columns (v * 8 + lane_in_row) * 4 + e
        float4 x = __ldcs(reinterpret_cast<const float4*>(m + (v * 8 + lane_in_row) * 4));
        x = make_float4(update(x.x), update(x.y), update(x.z), update(x.w));
        __stcs(reinterpret_cast<float4*>(m + (v * 8 + lane_in_row) * 4), x);
        if constexpr (kPattern == 2) __stcs(reinterpret_cast<uint2*>(vw + (v * 8 + lane_in_row) * 4), pack4(x.x, x.y, x.z, x.w));
      }
    }
  }
}
}  // namespace

// smem_bytes: unused dynamic shared memory per block, to hold the blocks per SM to the replay kernels' (4).
template <int kPattern>
void launch(float* m, __nv_bfloat16* v, int rows, int rows_per_block, int smem_bytes, cudaStream_t stream) {
  if (smem_bytes > 48 * 1024) cudaFuncSetAttribute(fold_pattern<kPattern>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  fold_pattern<kPattern><<<(rows + rows_per_block - 1) / rows_per_block, kThreads, smem_bytes, stream>>>(m, v, rows, rows_per_block);
}

void run_pattern(torch::Tensor master, torch::Tensor view, int64_t pattern, int64_t rows_per_block, int64_t smem_bytes) {
  const int rows = static_cast<int>(master.size(0)), rpb = static_cast<int>(rows_per_block), smem = static_cast<int>(smem_bytes);
  auto stream = c10::cuda::getCurrentCUDAStream();
  float* m = master.data_ptr<float>();
  auto* v = reinterpret_cast<__nv_bfloat16*>(view.data_ptr<at::BFloat16>());
  switch (pattern) {
    case 0: launch<0>(m, v, rows, rpb, smem, stream); break;
    case 1: launch<1>(m, v, rows, rpb, smem, stream); break;
    case 2: launch<2>(m, v, rows, rpb, smem, stream); break;
    default: launch<3>(m, v, rows, rpb, smem, stream); break;
  }
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "fold_pattern launch failed");
}
"""

PATTERNS = {"view": 0, "paired": 1, "plain": 2, "copy": 3}


def reference(master: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(torch.full_like(master, 1e-3), master, torch.full_like(master, 0.999))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256 * 32 * 128)  # GDN, batch 256: (batch, HV, V) rows of K = 128
    parser.add_argument("--rows-per-block", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "fold_pattern_probe.json"))
    args = parser.parse_args()
    ext = load_inline("rssm_fold_pattern_probe", cpp_sources="void run_pattern(torch::Tensor master, torch::Tensor view, "
                      "int64_t pattern, int64_t rows_per_block, int64_t smem_bytes);", cuda_sources=CUDA_SRC, functions=["run_pattern"],
                      extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)
    master = torch.randn(args.rows, 128, device="cuda")
    view = torch.empty(args.rows, 128, device="cuda", dtype=torch.bfloat16)
    # Each pattern computes the same values: check them once (one launch on a copy) before timing.
    for name, pattern in PATTERNS.items():
        m = master[:4096].clone()
        v = torch.zeros_like(view[:4096])
        ext.run_pattern(m, v, pattern, args.rows_per_block, 0)
        expect = reference(master[:4096])
        assert torch.allclose(m, expect, rtol=1e-6, atol=1e-6), name
        if name != "copy":
            assert torch.equal(v, m.to(torch.bfloat16)), name
    props = torch.cuda.get_device_properties(0)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    # Blocks per SM: as the GDN view's replay kernel (4), and as many as fit (no shared memory asked).
    smem = {bps: (smem_sm // bps - 1024 if bps else 0) for bps in (4, 0)}
    fns = {(name, bps): (lambda p=pattern, b=bytes_: ext.run_pattern(master, view, p, args.rows_per_block, b))
           for name, pattern in PATTERNS.items() for bps, bytes_ in smem.items()}
    times, spreads = common.time_interleaved(fns, replays=20)
    bw = common.measure_bandwidth()
    rows = {}
    for (name, bps), us in times.items():
        nbytes = args.rows * 128 * (4 + 4 + (0 if name == "copy" else 2))
        key = f"{name}|{bps or 'max'}_blocks_per_sm"
        rows[key] = {"us": us, "bytes": nbytes, "TBps": nbytes / us / 1e6, "frac_copy_bw": nbytes / us / 1e6 / bw["copy_TBps"],
                     "round_spread": spreads[(name, bps)]}
        print(f"{key:>24}: {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s  ({100 * rows[key]['frac_copy_bw']:.0f}% of copy)"
              f"  spread {100 * spreads[(name, bps)]:.1f}%")
    common.write_result(args.out, {"rows": args.rows, "rows_per_block": args.rows_per_block, "bandwidth": bw, "patterns": rows,
                                   "median_us": statistics.median(times.values())})


if __name__ == "__main__":
    main()
