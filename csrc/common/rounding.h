// Counter-based random numbers (Philox4x32-10) and stochastic rounding to a narrow float format, shared by
// the CPU and CUDA implementations so that the same seed gives the same rounding on both.
#pragma once

#include <cmath>
#include <cstdint>

#include "dtype.h"
#include "math.h"

namespace replayssm {

// Philox4x32 with 10 rounds (Salmon et al., SC'11): counter (c0..c3) and key (k0, k1) -> 4 random words;
// returns the first.
RSSM_HD uint32_t philox_first(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return c0;
}

// The random word of element `index` of a slot's state at its `fold`-th fold, for that slot's 64-bit seed.
RSSM_HD uint32_t fold_random(uint64_t seed, uint32_t fold, uint64_t index) {
  return philox_first(uint32_t(index), uint32_t(index >> 32), fold, 0u, uint32_t(seed), uint32_t(seed >> 32));
}

// x rounded to a float format with `mant_bits` fraction bits, smallest normal exponent `min_exp` and largest
// finite value `max_finite`, up or down in magnitude with probabilities that make the result unbiased:
// E[result] = x. `random` is a uniform 32-bit word; probabilities are resolved to 2^-24 (so magnitudes below
// 2^-24 of an ulp, e.g. fp16 values under 2^-48, round down). Works on |x| so that negative values are exact
// too. Where the upper neighbour would exceed max_finite the value is returned as is, for the caller's
// round-to-nearest conversion (it saturates or overflows as round-to-nearest would): never a new infinity.
// The result is otherwise exactly representable in the format (bf16: 7, -126; fp16: 10, -14).
RSSM_HD float stochastic_round(float x, int mant_bits, int min_exp, float max_finite, uint32_t random) {
  if (!(x - x == 0.f) || x == 0.f) return x;  // NaN, infinities, zero
  const float a = fabsf(x);
  int e;
  frexpf(a, &e);                               // a = m 2^e, m in [0.5, 1): leading bit at 2^(e-1)
  const int exponent = (e - 1) < min_exp ? min_exp : (e - 1);
  const float ulp = ldexpf(1.f, exponent - mant_bits);
  const float lo = floorf(a / ulp) * ulp;      // exact: a power-of-two scaling and an integer part
  if (lo + ulp > max_finite) return x;
  const float frac = (a - lo) / ulp;           // in [0, 1), exact
  const float u = float(random >> 8) * (1.f / 16777216.f);
  const float r = u < frac ? lo + ulp : lo;
  return x < 0.f ? -r : r;
}

// Format parameters of the narrow storage types.
RSSM_HD float stochastic_round_to(DType dtype, float x, uint32_t random) {
  return dtype == DType::kBFloat16 ? stochastic_round(x, 7, -126, 3.3895313892515355e38f, random)
       : dtype == DType::kFloat16  ? stochastic_round(x, 10, -14, 65504.f, random)
                                   : x;
}

}  // namespace replayssm
