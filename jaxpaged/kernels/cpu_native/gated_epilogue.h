// SiLU on a register of float32 sums, for the packed matmul's gated form (packed_matmul.cc, which includes this file;
// the build key hashes it too): silu(gate) * up written straight from the tile's registers, so the gate's and the up
// projection's [rows, intermediate] results never go through memory and XLA's elementwise pass over them is gone.

#ifndef JAXPAGED_CPU_NATIVE_GATED_EPILOGUE_H_
#define JAXPAGED_CPU_NATIVE_GATED_EPILOGUE_H_

#include <cstdint>

#include "packed_tiles.h"

namespace gated_epilogue {

using packed_tiles::kLanes;
using packed_tiles::Vec;
typedef int32_t IntVec __attribute__((vector_size(kLanes * sizeof(int32_t))));

// exp(t) for every lane, t clamped to [-87, 88] (the float32 range of 2^n below): 2^(t log2 e) as 2^n * 2^f with n
// the nearest integer and f in [-0.5, 0.5], 2^f by a degree-6 polynomial (relative error ~2e-7, vec8.h's).
inline Vec Exp(Vec t) {
  const Vec low = Vec{} - 87.0f, high = Vec{} + 88.0f;
  t = t < low ? low : t;
  t = t > high ? high : t;
  const Vec scaled = t * 1.44269504088896341f;
  const Vec shift = Vec{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const Vec n = (scaled + shift) - shift;
  const Vec f = scaled - n;
  Vec p = Vec{} + 1.5353362e-4f;
  p = p * f + 1.3398874e-3f;
  p = p * f + 9.6180319e-3f;
  p = p * f + 5.5503406e-2f;
  p = p * f + 2.4022652e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  const IntVec exponent = (__builtin_convertvector(n, IntVec) + 127) << 23;
  return p * reinterpret_cast<const Vec&>(exponent);
}

// silu(g) = g / (1 + exp(-g)): g's infinities and NaNs stay (exp's argument is clamped, not g).
inline Vec Silu(Vec g) { return g / (1.0f + Exp(-g)); }

}  // namespace gated_epilogue

#endif  // JAXPAGED_CPU_NATIVE_GATED_EPILOGUE_H_
