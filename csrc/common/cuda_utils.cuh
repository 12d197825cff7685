// Device helpers shared by the CUDA kernels: element conversions, 16-byte loads and stores, warp sums,
// the device-side check of indices, and the compile-time switch over the state size.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include "dtype.h"

namespace replayssm {

template <DType D> struct CudaType;
template <> struct CudaType<DType::kFloat32> { using type = float; };
template <> struct CudaType<DType::kBFloat16> { using type = __nv_bfloat16; };
template <> struct CudaType<DType::kFloat16> { using type = __half; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
// silu with the fast exponential and division (ex2.approx, div.approx): a few fp32 ulp near the origin, up to ~100
// ulp of the (tiny) value for v << 0 (__expf's error grows with |v|); far below an output's bf16 rounding and within
// the fp32 tests' 2e-5. ~9 SASS instructions (sm_90a, the ex2's denormal guard included) where silu (math.h: expf's
// range reduction, the IEEE division's check and slow path) compiles to ~27. For v < -87.3 the result is -0 (the
// division returns 0 once the denominator passes 2^126), where silu is ~-1e-36 or less.
__device__ __forceinline__ float silu_fast(float v) { return __fdividef(v, 1.f + __expf(-v)); }
// For idx in [0, n), a block's threads kThreads apart: store(idx, load(idx)), kPer indices a thread at a time with
// every load of the batch issued before the batch's first store. (A store may alias a later load, so the compiler
// keeps a plain loop's load-store pairs in order: one round trip to memory per index. The Mamba-2 verify's last
// block copied the window's B that way, 32 bf16 elements a thread at T = 4, G = 8, N = 128: 3.1% of the kernel's
// warp samples at batch 256 on that one store line; batched, the kernel went from 359 to 345 us, ncu, session 25.)
template <int kThreads, int kPer, typename Load, typename Store>
__device__ __forceinline__ void copy_batched(int n, const Load& load, const Store& store) {
  using V = std::decay_t<decltype(load(0))>;
  for (int i0 = threadIdx.x; i0 < n; i0 += kPer * kThreads) {
    V v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u)
      if (i0 + u * kThreads < n) v[u] = load(i0 + u * kThreads);
#pragma unroll
    for (int u = 0; u < kPer; ++u)
      if (i0 + u * kThreads < n) store(i0 + u * kThreads, v[u]);
  }
}
// v as T holds it (rounded to nearest), back as a float.
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

// The elements of 32-bit words of T, as floats: a bf16 pair by one integer op each (the upper half by a mask;
// __bfloat162float of the upper element takes two, a byte permute and a shift), an fp16 pair by one conversion.
// Exact, as to_float.
template <typename T, int kWords>
__device__ __forceinline__ void unpack_words(const uint32_t (&w)[kWords], float (&out)[kWords * 4 / sizeof(T)]) {
#pragma unroll
  for (int q = 0; q < kWords; ++q) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      out[2 * q] = __uint_as_float(w[q] << 16);
      out[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    } else if constexpr (std::is_same_v<T, __half>) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[q]));
      out[2 * q] = f.x, out[2 * q + 1] = f.y;
    } else {
      static_assert(std::is_same_v<T, float>, "float, bf16 or fp16");
      out[q] = __uint_as_float(w[q]);
    }
  }
}
// 16 bytes of T (a uint4 as loaded) as floats.
template <typename T, int kVec = 16 / sizeof(T)>
__device__ __forceinline__ void unpack16(const uint4& raw, float (&out)[kVec]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  unpack_words<T, 4>(w, out);
}

// 16 bytes of T, converted to float. Streaming hint (.cs): the state is read once per step, so it
// should not push the small, reused data (rings, inputs) out of L2.
template <typename T, int kVec = 16 / sizeof(T)>
__device__ __forceinline__ void load16_stream(const T* ptr, float (&out)[kVec]) {
  unpack16<T>(__ldcs(reinterpret_cast<const uint4*>(ptr)), out);
}

// kVec floats converted to T, as the 16 bytes that store them.
template <typename T, int kVec = 16 / sizeof(T)>
__device__ __forceinline__ uint4 pack16(const float (&in)[kVec]) {
  uint4 raw;
  T* elems = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int e = 0; e < kVec; ++e) elems[e] = from_float<T>(in[e]);
  return raw;
}

template <typename T, int kVec = 16 / sizeof(T)>
__device__ __forceinline__ void store16_stream(T* ptr, const float (&in)[kVec]) {
  __stcs(reinterpret_cast<uint4*>(ptr), pack16<T>(in));
}

// kCount contiguous elements of T from shared memory, as floats, in 8- or 16-byte loads (p aligned to
// min(16, kCount * sizeof(T)) bytes; kCount * sizeof(T) a multiple of 8).
template <typename T, int kCount>
__device__ __forceinline__ void load_shared_vec(const T* p, float (&out)[kCount]) {
  constexpr int kBytes = kCount * int(sizeof(T));
  static_assert(kBytes % 8 == 0, "whole 8-byte words");
  using Word = std::conditional_t<kBytes % 16 == 0, uint4, uint2>;  // the widest load the alignment allows
  constexpr int kPer = int(sizeof(Word) / sizeof(T));
#pragma unroll
  for (int q = 0; q < kBytes / int(sizeof(Word)); ++q) {
    const Word raw = reinterpret_cast<const Word*>(p)[q];
    uint32_t w[sizeof(Word) / 4];
    static_assert(sizeof(w) == sizeof(raw));
    memcpy(w, &raw, sizeof(raw));
    unpack_words<T, int(sizeof(Word) / 4)>(w, *reinterpret_cast<float(*)[kPer]>(&out[q * kPer]));
  }
}

// Sum over aligned groups of kWidth lanes (kWidth a power of two <= 32); every lane gets its group's sum.
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// kTok sums over aligned groups of kWidth lanes at once (kTok a power of two <= kWidth): v[k] of every lane
// in, and each lane ends with the group's sum of v[lane_in_group / (kWidth / kTok)]. Each halving step sends
// half of the remaining values to the partner lane and keeps the other half, so kTok sums cost
// kTok - 1 + log2(kWidth / kTok) shuffles where kTok group_sums cost kTok * log2(kWidth). v is clobbered.
template <int kWidth, int kTok>
__device__ __forceinline__ float reduce_scatter(float (&v)[kTok], int lane_in_group) {
  static_assert(kTok >= 1 && (kTok & (kTok - 1)) == 0 && kTok <= kWidth, "kTok: a power of two <= kWidth");
#pragma unroll
  for (int half = kTok / 2, mask = kWidth / 2; half >= 1; half /= 2, mask /= 2) {
    const bool upper = (lane_in_group & mask) != 0;  // keeps the upper half of the remaining values
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float send = upper ? v[i] : v[i + half];
      const float keep = upper ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
    }
  }
  float r = v[0];
#pragma unroll
  for (int mask = kWidth / (2 * kTok); mask > 0; mask /= 2) r += __shfl_xor_sync(0xffffffffu, r, mask);
  return r;
}

// An index that validation on the host cannot see (it lives on the device) is out of range: report it
// and stop the kernel, the way PyTorch's device-side asserts do. Nothing out of bounds is touched.
#define RSSM_DEVICE_CHECK(cond, fmt, ...)                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      printf("replayssm device check failed: " fmt "\n", __VA_ARGS__);        \
      __trap();                                                               \
    }                                                                         \
  } while (0)

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("replayssm: ") + what + ": " + cudaGetErrorString(err));
}

inline int num_sms() {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

// The current device's opt-in shared-memory limit per block (what cudaFuncSetAttribute may raise a kernel to).
inline int max_smem_per_block() {
  int device = 0, bytes = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  return bytes;
}

// The current device's shared memory per SM (occupancy: blocks per SM times their bytes plus 1 KiB each, the
// driver's reserve, must fit it).
inline int smem_per_sm() {
  int device = 0, bytes = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device), "cudaDeviceGetAttribute");
  return bytes;
}

// Launch-configuration overrides for benchmarking alternatives in one run (bench/): REPLAYSSM_TUNE holds
// "key=value,..." pairs; the value of `key`, or -1 when it is not set. Read at each launch (cheap next to
// the dispatcher; graphs capture the configuration in force when they were captured). Not for production
// use: the defaults are the measured best.
inline int tune_knob(const char* key) {
  const char* env = std::getenv("REPLAYSSM_TUNE");
  if (env == nullptr) return -1;
  const std::string all(env), pattern = std::string(key) + "=";
  for (size_t pos = all.find(pattern); pos != std::string::npos; pos = all.find(pattern, pos + 1))
    if (pos == 0 || all[pos - 1] == ',') return std::atoi(all.c_str() + pos + pattern.size());
  return -1;
}

// Programmatic dependent launch (PDL, Hopper; opt-in, see pdl_requested): a kernel launched with the attribute
// below may start while the kernel before it on the stream is still running, once every block of that one has
// passed pdl_trigger() (or exited). It must call pdl_wait() before it reads anything the kernel before it writes,
// and before it writes anything that kernel may still read; pdl_wait() returns once that kernel has completed and
// its writes are visible. Without the attribute (or on a device before sm_90) both are no-ops. The decode steps
// read only their own cache (slot ids, cursor, checkpoint or state rows, the ring) before pdl_wait() and call
// pdl_trigger() right after it. A kernel two back on the stream has then completed before this one starts when the
// one just before is one of these steps (every block, pad rows' too, waits before triggering or exiting) or was
// launched without PDL (it started after its predecessor completed, and triggers only by exiting). So with PDL the
// cache and slot ids must not be written by the kernel just before (e.g. a slot reset, or the same layer's
// previous step with nothing between), and that kernel must not be a foreign PDL kernel that triggers before its
// own wait.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the decode steps (mamba2_step, mamba2_replay_step, gdn_step, gdn_replay_step) launch with PDL: opt-in,
// REPLAYSSM_PDL=1 in the environment (0 or unset: off; read at each launch, and a CUDA graph keeps what was in
// force when it was captured). Valid only under the condition above: the kernel just before on the stream writes
// neither this layer's cache nor the slot ids, as in a model, where other kernels run between two steps of one
// layer (README, "Programmatic dependent launch"). REPLAYSSM_TUNE pdl=0|1 overrides it (the benchmarks' A/B).
inline bool pdl_requested() {
  const int knob = tune_knob("pdl");
  if (knob >= 0) return knob > 0;
  const char* env = std::getenv("REPLAYSSM_PDL");
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "0") == 0) return false;
  if (std::strcmp(env, "1") == 0) return true;
  throw std::invalid_argument(std::string("replayssm: REPLAYSSM_PDL must be 0 or 1, got '") + env + "'");
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when `pdl` (above).
template <typename... KernelArgs, typename... Args>
void launch_maybe_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                      const char* what, Args&&... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    check_cuda(cudaGetLastError(), what);
    return;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) cudaGetLastError();  // (clear it: the error is reported here, not by a later launch)
  check_cuda(err, what);
}

// Runs BODY with the compile-time constant NAME bound to the state size VALUE (the sizes the CUDA
// kernels are built for; the torch layer rejects others with a clear error before launching).
#define RSSM_SWITCH_DSTATE(VALUE, NAME, ...)                                             \
  [&] {                                                                                  \
    switch (VALUE) {                                                                     \
      case 16: { constexpr int NAME = 16; return __VA_ARGS__(); }                        \
      case 32: { constexpr int NAME = 32; return __VA_ARGS__(); }                        \
      case 64: { constexpr int NAME = 64; return __VA_ARGS__(); }                        \
      case 128: { constexpr int NAME = 128; return __VA_ARGS__(); }                      \
      case 256: { constexpr int NAME = 256; return __VA_ARGS__(); }                      \
    }                                                                                    \
    throw std::invalid_argument("replayssm: CUDA kernels support dstate 16, 32, 64, 128, 256"); \
  }()

}  // namespace replayssm
