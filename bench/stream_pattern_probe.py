"""Does the GDN verify's row loop lose bandwidth to the order it requests the checkpoint in? (bench/NOTES.md, session 38.)

The tensor-core row loop of gdn_replay_verify_rowpass_kernel (GdnVerifyMma, csrc/gdn/kernels.cuh) streams a block's
256 rows (128 KB of fp32) as 64-row tiles, 32 columns (128 bytes of each 512-byte row) an iteration: an iteration's
8 KB is 64 pieces of 128 bytes at a 512-byte stride, and a row's four pieces go out in four consecutive iterations,
two stages in flight. The replay step streams whole rows. This times the checkpoint's read alone (cp.async into
per-thread stages, each thread reading back only what it copied and summing it; GDN at batch 256: 4096 blocks of
256 rows of 128 columns, 128 threads, 8 KB an iteration) with

    quarter   the verify's order (64 rows x 128 bytes an iteration)
    halves    32 rows x 256 bytes an iteration (a row's halves in consecutive iterations: the order of a loop whose
              MMA n tile is 8 state rows and m the window's outputs)
    rows      16 whole rows an iteration (8 lanes a row, 4 vectors a lane: contiguous 8 KB)

each with 2 or 4 stages in flight, at 4 blocks an SM (the verify's; unused shared memory holds it there) and at as
many as fit. If `quarter` reads well below `rows` at the same stages, the order costs the verify bandwidth and a
whole-row geometry is worth writing; if they are alike, the row loop's time is elsewhere. ~1 min with the compile.

    python bench/stream_pattern_probe.py [--blocks 4096] [--out bench/results/stream_pattern_probe.json]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

namespace {
constexpr int kK = 128, kThreads = 128, kRows = 256, kVecs = 4;  // 4 x 16 bytes a thread an iteration: 8 KB a block
constexpr int kIters = kRows * kK * 4 / (kThreads * kVecs * 16);  // 16

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); }

// Element offset (within the block's rows) of this thread's vector v in iteration it.
template <int kPattern>
__device__ __forceinline__ int offset(int it, int v) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if constexpr (kPattern == 0) {  // quarter: GdnVerifyMma's row(it, warp, lane), col(it, lane) + 16 m; v = 2 rs + m
    const int row = it / 4 * 64 + warp * 16 + (lane >> 2) + 8 * (v >> 1);
    const int col = it % 4 * 32 + 4 * (lane & 3) + 16 * (v & 1);
    return row * kK + col;
  } else if constexpr (kPattern == 2) {  // halves: 32 rows x 256 bytes an iteration, a row's two halves in consecutive
                                         // iterations (8 rows a warp, 4 lanes a row: an n tile of 8 state rows)
    const int row = it / 2 * 32 + warp * 8 + (lane >> 2);
    const int col = it % 2 * 64 + 16 * v + 4 * (lane & 3);
    return row * kK + col;
  } else {  // rows: 16 rows an iteration, 8 lanes a row, vector v of lane l at column (v * 8 + l) * 4
    const int row = it * 16 + warp * 4 + (lane >> 3);
    return row * kK + (v * 8 + (lane & 7)) * 4;
  }
}

template <int kPattern, int kStages>
__global__ void __launch_bounds__(kThreads) stream_pattern(const float* ckpt, float* out) {
  extern __shared__ uint4 staging[];
  const float* base = ckpt + int64_t(blockIdx.x) * kRows * kK;
  auto issue = [&](int it) {
    if (it < kIters)
#pragma unroll
      for (int v = 0; v < kVecs; ++v)
        cp_async16(&staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x], base + offset<kPattern>(it, v));
    cp_async_commit();
  };
#pragma unroll
  for (int it = 0; it < kStages; ++it) issue(it);
  float acc = 0.f;
  for (int it = 0; it < kIters; ++it) {
    cp_async_wait<kStages - 1>();
    float4 x[kVecs];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) x[v] = *reinterpret_cast<const float4*>(&staging[((it % kStages) * kVecs + v) * kThreads + threadIdx.x]);
    issue(it + kStages);  // into the stage just read (the thread's own vectors)
#pragma unroll
    for (int v = 0; v < kVecs; ++v) acc += (x[v].x + x[v].y) + (x[v].z + x[v].w);
  }
  out[int64_t(blockIdx.x) * kThreads + threadIdx.x] = acc;
}

template <int kPattern, int kStages>
void launch(const float* ckpt, float* out, int blocks, int smem_bytes, cudaStream_t stream) {
  const int smem = max(smem_bytes, kStages * kVecs * kThreads * 16);
  auto kernel = stream_pattern<kPattern, kStages>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<blocks, kThreads, smem, stream>>>(ckpt, out);
}
}  // namespace

void run_pattern(torch::Tensor ckpt, torch::Tensor out, int64_t pattern, int64_t stages, int64_t smem_bytes) {
  TORCH_CHECK(ckpt.is_cuda() && ckpt.is_contiguous() && ckpt.scalar_type() == at::kFloat && ckpt.numel() % (kRows * kK) == 0,
              "ckpt: a contiguous CUDA float tensor of whole blocks (256 rows of 128)");
  const int blocks = static_cast<int>(ckpt.numel() / (kRows * kK));
  TORCH_CHECK(out.is_cuda() && out.is_contiguous() && out.scalar_type() == at::kFloat && out.numel() == int64_t(blocks) * kThreads,
              "out: a contiguous CUDA float tensor of blocks x 128");
  auto stream = c10::cuda::getCurrentCUDAStream();
  const float* c = ckpt.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int smem = static_cast<int>(smem_bytes);
  if (pattern == 0 && stages == 2) launch<0, 2>(c, o, blocks, smem, stream);
  else if (pattern == 0 && stages == 4) launch<0, 4>(c, o, blocks, smem, stream);
  else if (pattern == 1 && stages == 2) launch<1, 2>(c, o, blocks, smem, stream);
  else if (pattern == 1 && stages == 4) launch<1, 4>(c, o, blocks, smem, stream);
  else if (pattern == 2 && stages == 2) launch<2, 2>(c, o, blocks, smem, stream);
  else if (pattern == 2 && stages == 4) launch<2, 4>(c, o, blocks, smem, stream);
  else TORCH_CHECK(false, "pattern 0, 1 or 2, stages 2 or 4");
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "stream_pattern launch failed");
}
"""

PATTERNS = {"quarter": 0, "rows": 1, "halves": 2}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=256 * 16)  # GDN verify, batch 256: (batch, key head) blocks of 256 rows
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "stream_pattern_probe.json"))
    args = parser.parse_args()
    ext = load_inline("rssm_stream_pattern_probe", cpp_sources="void run_pattern(torch::Tensor ckpt, torch::Tensor out, "
                      "int64_t pattern, int64_t stages, int64_t smem_bytes);", cuda_sources=CUDA_SRC, functions=["run_pattern"],
                      extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)
    ckpt = torch.randn(args.blocks * 256, 128, device="cuda")
    out = torch.empty(args.blocks, 128, device="cuda")
    # Every pattern reads each element of a block once: the per-block sums over all threads agree with torch's.
    expect = ckpt.view(args.blocks, -1).double().sum(1)
    for name, pattern in PATTERNS.items():
        for stages in (2, 4):
            out.zero_()
            ext.run_pattern(ckpt, out, pattern, stages, 0)
            got = out.double().sum(1)
            assert torch.allclose(got, expect, rtol=1e-4, atol=1e-2), (name, stages)
    props = torch.cuda.get_device_properties(0)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    smem = {4: smem_sm // 4 - 1024, 0: 0}  # blocks per SM: the verify's 4, and as many as fit
    fns = {(name, stages, bps): (lambda p=pattern, s=stages, b=bytes_: ext.run_pattern(ckpt, out, p, s, b))
           for name, pattern in PATTERNS.items() for stages in (2, 4) for bps, bytes_ in smem.items()}
    times, spreads = common.time_interleaved(fns, replays=20)
    bw = common.measure_bandwidth()
    nbytes = ckpt.numel() * 4
    rows = {}
    for (name, stages, bps), us in times.items():
        key = f"{name}|stages={stages}|{bps or 'max'}_blocks_per_sm"
        rows[key] = {"us": us, "bytes": nbytes, "TBps": nbytes / us / 1e6, "frac_read_bw": nbytes / us / 1e6 / bw["read_TBps"],
                     "round_spread": spreads[(name, stages, bps)]}
        print(f"{key:>34}: {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s  ({100 * rows[key]['frac_read_bw']:.0f}% of read)"
              f"  spread {100 * spreads[(name, stages, bps)]:.1f}%")
    common.write_result(args.out, {"blocks": args.blocks, "bandwidth": bw, "patterns": rows})


if __name__ == "__main__":
    main()
