// Exact integer division by a launch-time constant as one wide multiply, for the decode kernels' head -> group
// index: a runtime `/` is ~20 dependent SASS instructions (I2F, MUFU.RCP, ...; two when the divisor is itself a
// quotient, nheads / ngroups), and at batch 1 they sit between a kernel's start and its first input loads.
//
// n / d == (n * m) >> 32 with m = floor(2^32 / d) + 1, for 0 <= n < 2^16 and 1 <= d < 2^16: n * m / 2^32 =
// n / d + n * e / 2^32 with 0 < e <= 1, so the excess is below 2^-16 < 1 / d, the least distance from a
// non-integer n / d to the next integer. (d = 1: m = 2^32 + 1, (n * m) >> 32 = n.) Head indices come from a grid
// dimension (y or z: at most 65535), so they qualify; the host checks d.
#pragma once

#include <cstdint>

#include "math.h"

namespace replayssm {

RSSM_HD uint64_t fast_div_magic(int d) { return (uint64_t(1) << 32) / uint64_t(d) + 1; }

RSSM_HD int fast_div(int n, uint64_t magic) { return int((uint64_t(uint32_t(n)) * magic) >> 32); }

}  // namespace replayssm
