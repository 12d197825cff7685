// Element types as the kernels see them, without torch: one enum, and a switch that turns the runtime
// value into a compile-time one. Each backend maps the enum to its own C++ types.
#pragma once

#include <stdexcept>

namespace replayssm {

enum class DType { kFloat32, kBFloat16, kFloat16 };

// Runs BODY with the compile-time constant NAME bound to the runtime DType VALUE.
#define RSSM_SWITCH_DTYPE(VALUE, NAME, ...)                                                   \
  [&] {                                                                                      \
    switch (VALUE) {                                                                         \
      case ::replayssm::DType::kFloat32: { constexpr auto NAME = ::replayssm::DType::kFloat32; return __VA_ARGS__(); } \
      case ::replayssm::DType::kBFloat16: { constexpr auto NAME = ::replayssm::DType::kBFloat16; return __VA_ARGS__(); } \
      case ::replayssm::DType::kFloat16: { constexpr auto NAME = ::replayssm::DType::kFloat16; return __VA_ARGS__(); } \
    }                                                                                        \
    throw std::invalid_argument("replayssm: unknown dtype");                                 \
  }()

}  // namespace replayssm
