// Eight-float vectors for the CPU attention kernel (paged_decode.cc, which includes this file; the build key hashes
// it too): loads that widen bfloat16 bits, horizontal sums, a vectorizable exp and a prefetch into L2. GCC's vector
// extensions, so one source builds for AVX2 and AVX-512 (-march=native), with an AVX2 intrinsic where GCC's own
// conversion is slower.

#ifndef JAXPAGED_CPU_NATIVE_VEC8_H_
#define JAXPAGED_CPU_NATIVE_VEC8_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace vec8 {

typedef float Vec8 __attribute__((vector_size(32), aligned(4)));

// A KV value as float32 (bfloat16 bits widen by a shift). Inlined into the loops, so both read the page in place.
inline float ToF32(float value) { return value; }

inline float ToF32(uint16_t bits) {
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

typedef uint16_t Bits8 __attribute__((vector_size(16), aligned(2)));
typedef uint32_t Wide8 __attribute__((vector_size(32)));

// Eight KV values from `row` as float32, in a register (bfloat16 bits widen by a shift, two instructions).
inline Vec8 Load8(const float* row) { return *reinterpret_cast<const Vec8*>(row); }

inline Vec8 Load8(const uint16_t* row) {
#ifdef __AVX2__
  // One zero-extending load and a shift (GCC splits the generic conversion below into 128-bit halves).
  const __m256i widened = _mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row))), 16);
  return reinterpret_cast<const Vec8&>(widened);
#else
  const Wide8 widened = __builtin_convertvector(*reinterpret_cast<const Bits8*>(row), Wide8) << 16;
  return reinterpret_cast<const Vec8&>(widened);
#endif
}

inline float Sum8(Vec8 v) {
  float total = 0.0f;
  for (int k = 0; k < 8; ++k) total += v[k];
  return total;
}

typedef int32_t Lanes8 __attribute__((vector_size(32)));

// The eight horizontal sums of s[0..7] as one vector (lane j: the sum of s[j]): three rounds of pairwise adds of
// shuffled halves, 21 instructions for eight sums where one sum alone takes seven.
inline Vec8 Sum8Each(const Vec8 (&s)[8]) {
  const Lanes8 even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
  const Lanes8 low_pairs = {0, 1, 8, 9, 4, 5, 12, 13}, high_pairs = {2, 3, 10, 11, 6, 7, 14, 15};
  const Lanes8 low_half = {0, 1, 2, 3, 8, 9, 10, 11}, high_half = {4, 5, 6, 7, 12, 13, 14, 15};
  Vec8 pairs[4];  // pairs[k]: lanes alternate s[2k] and s[2k + 1], each lane a sum of two of their lanes
  for (int k = 0; k < 4; ++k) {
    pairs[k] = __builtin_shuffle(s[2 * k], s[2 * k + 1], even) + __builtin_shuffle(s[2 * k], s[2 * k + 1], odd);
  }
  // quads[k]: lanes 0-3 partial sums of s[4k..4k+3] over lanes 0-3, lanes 4-7 over lanes 4-7
  const Vec8 quads0 = __builtin_shuffle(pairs[0], pairs[1], low_pairs) + __builtin_shuffle(pairs[0], pairs[1], high_pairs);
  const Vec8 quads1 = __builtin_shuffle(pairs[2], pairs[3], low_pairs) + __builtin_shuffle(pairs[2], pairs[3], high_pairs);
  return __builtin_shuffle(quads0, quads1, low_half) + __builtin_shuffle(quads0, quads1, high_half);
}

// exp(x) for x <= 0 (weights of an online softmax), vectorizable: 2^(x log2 e) as 2^n * 2^f, f in [-0.5, 0.5],
// 2^f by a degree-6 polynomial (relative error ~2e-7); underflows to 0 below -87.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  const float scaled = x * 1.44269504088896341f;
  const float n = std::nearbyint(scaled);
  const float f = scaled - n;
  float p = 1.5353362e-4f;
  p = p * f + 1.3398874e-3f;
  p = p * f + 9.6180319e-3f;
  p = p * f + 5.5503406e-2f;
  p = p * f + 2.4022652e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  const int32_t exponent = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &exponent, sizeof(scale));
  return p * scale;
}

// Asks for `bytes` at `address` into the L2 cache (not L1: the page being worked on lives there). Always inlined:
// GCC takes a function that only prefetches for one without effects and drops the calls to it.
__attribute__((always_inline)) inline void PrefetchToL2(const void* address, int64_t bytes) {
  const char* start = static_cast<const char*>(address);
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(start + offset, 0, 2);
}

}  // namespace vec8

#endif  // JAXPAGED_CPU_NATIVE_VEC8_H_
