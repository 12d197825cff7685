// Helpers of the CPU implementations: the C++ element type of each DType and float loads and stores.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "dtype.h"

namespace replayssm {

template <DType D> struct CpuType;
template <> struct CpuType<DType::kFloat32> { using type = float; };
template <> struct CpuType<DType::kBFloat16> { using type = c10::BFloat16; };
template <> struct CpuType<DType::kFloat16> { using type = c10::Half; };

template <typename T> inline float ld(const void* base, int64_t i) { return static_cast<float>(static_cast<const T*>(base)[i]); }
template <typename T> inline void st(void* base, int64_t i, float v) { static_cast<T*>(base)[i] = T(v); }

}  // namespace replayssm
