// Quantized KV rows for the CPU attention kernel (paged_decode.cc includes this file; the build key hashes it too):
// a row is head_dim 8-bit codes followed by its bfloat16 scale (pallas_kernels/kv_quantization.py). int8 codes are
// int8_t; float8_e4m3fn codes are their bits, uint8_t. A value is code * scale: the kernel widens the codes of a row
// to float32 and multiplies by the row's scale as it streams the page, the same exact product the jnp path forms.

#ifndef JAXPAGED_CPU_NATIVE_KV_CODES_H_
#define JAXPAGED_CPU_NATIVE_KV_CODES_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vec8.h"

namespace kv_codes {

using vec8::Vec8;

// Whether a pool of T holds quantized rows (codes + a scale) rather than values.
template <typename T>
inline constexpr bool kQuantized = std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>;

// Bytes after the codes: one bfloat16 scale.
inline constexpr int64_t kScaleElements = 2;

// float8_e4m3fn's 256 values: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is subnormal, and 0x7F / 0xFF
// are NaN (the format has no infinity).
inline std::array<float, 256> Fp8Table() {
  std::array<float, 256> table{};
  for (int bits = 0; bits < 256; ++bits) {
    const int exponent = (bits >> 3) & 0xF, mantissa = bits & 0x7;
    float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                    : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
    if ((bits & 0x7F) == 0x7F) magnitude = std::nanf("");
    table[bits] = bits & 0x80 ? -magnitude : magnitude;
  }
  return table;
}

inline const std::array<float, 256>& Fp8Values() {
  static const std::array<float, 256> table = Fp8Table();
  return table;
}

inline float ToF32(int8_t code) { return static_cast<float>(code); }
inline float ToF32(uint8_t bits) { return Fp8Values()[bits]; }

typedef int8_t Codes8 __attribute__((vector_size(8), aligned(1)));

// Eight codes as float32 (not yet scaled).
inline Vec8 Load8(const int8_t* row) {
#ifdef __AVX2__
  const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row));
  const __m256 widened = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
  return reinterpret_cast<const Vec8&>(widened);
#else
  return __builtin_convertvector(*reinterpret_cast<const Codes8*>(row), Vec8);
#endif
}

typedef uint8_t Bytes8 __attribute__((vector_size(8), aligned(1)));
typedef int32_t Mask8 __attribute__((vector_size(32)));

// Eight float8_e4m3fn codes as float32, in registers: a normal code's exponent and mantissa move into float32's
// fields (exponent rebiased by 127 - 7 = 120), a subnormal one (exponent 0) is mantissa * 2^-9, then the sign goes
// back on. (A 256-entry table looked up value by value ran at half the int8 rate.) NaN codes are never written.
inline Vec8 Load8(const uint8_t* row) {
#ifdef __AVX2__
  const __m256i bits = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7F));
  const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(magnitude, 20),
                                                             _mm256_set1_epi32(120 << 23)));
  const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(magnitude), _mm256_set1_ps(1.0f / 512.0f));
  const __m256 is_subnormal = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), magnitude));
  const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x80)), 24));
  const __m256 value = _mm256_or_ps(_mm256_blendv_ps(normal, subnormal, is_subnormal), sign);
  return reinterpret_cast<const Vec8&>(value);
#else
  const vec8::Wide8 bits = __builtin_convertvector(*reinterpret_cast<const Bytes8*>(row), vec8::Wide8);
  const vec8::Wide8 magnitude = bits & 0x7Fu;
  const vec8::Wide8 normal_bits = (magnitude << 20) + (120u << 23);
  Vec8 normal;
  std::memcpy(&normal, &normal_bits, sizeof(normal));
  const Vec8 subnormal = __builtin_convertvector(magnitude, Vec8) * (1.0f / 512.0f);
  const Mask8 is_subnormal = reinterpret_cast<const Mask8&>(magnitude) < 8;
  const Vec8 unsigned_value = is_subnormal ? subnormal : normal;
  vec8::Wide8 value_bits;
  std::memcpy(&value_bits, &unsigned_value, sizeof(value_bits));
  value_bits |= (bits & 0x80u) << 24;
  Vec8 value;
  std::memcpy(&value, &value_bits, sizeof(value));
  return value;
#endif
}

// The scale of a quantized row of head_dim codes (the bfloat16 after them); 1 for a row of values.
template <typename T>
inline float RowScale(const T* row, int64_t head_dim) {
  if constexpr (kQuantized<T>) {
    uint16_t bits;
    std::memcpy(&bits, row + head_dim, sizeof(bits));
    return vec8::ToF32(bits);
  } else {
    return 1.0f;
  }
}

// Elements of one K or V row of one head in a pool of T: head_dim values, or head_dim codes and the scale's bytes.
template <typename T>
inline int64_t RowWidth(int64_t head_dim) {
  return kQuantized<T> ? head_dim + kScaleElements : head_dim;
}

}  // namespace kv_codes

#endif  // JAXPAGED_CPU_NATIVE_KV_CODES_H_
