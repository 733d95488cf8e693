// The register tile of vnni_matmul.cc (which includes this file; the build key hashes it too), by the vector width
// the build targets (-march=native): AVX-512 VNNI, 12 rows x 2 panels of zmm int32 sums; AVX-VNNI, 6 rows x 1 panel
// of two ymm halves. And how a tile's sums become results: the column corrections taken off (exact int32), float32,
// the scales, stored as float32 or (zmm) rounded to bfloat16.
#ifndef JAXPAGED_CPU_NATIVE_VNNI_TILES_H_
#define JAXPAGED_CPU_NATIVE_VNNI_TILES_H_

#include <immintrin.h>

#include <cstdint>

namespace vnni_tiles {

// JAXPAGED_VNNI_YMM builds the ymm tiling on an AVX-512 VNNI CPU too (the tests check it there).
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && !defined(JAXPAGED_VNNI_YMM)
#define JAXPAGED_VNNI_ZMM 1
// One zmm holds a whole panel row: 16 columns' int32 sums. A vector of int32 rather than __m512i (whose elements are
// int64): VPDPBUSD's builtin takes int32 vectors, and the casts between the two kept GCC from holding an array of
// __m512i sums in registers (each was loaded and stored around every VPDPBUSD).
typedef int32_t Acc __attribute__((vector_size(64)));
constexpr int kVectorsPerPanel = 1;
constexpr int kLanes = 16;
constexpr int64_t kTileRows = 12;
constexpr int kTilePanels = 2;
inline Acc Zero() { return Acc{}; }
inline Acc LoadBytes(const int8_t* at) { return (Acc)_mm512_loadu_si512(at); }
inline Acc Broadcast(uint32_t four) { return (Acc)_mm512_set1_epi32(static_cast<int32_t>(four)); }
inline Acc Dot(Acc sum, Acc unsigned_x, Acc weights) {
  return (Acc)_mm512_dpbusd_epi32((__m512i)sum, (__m512i)unsigned_x, (__m512i)weights);
}
using Floats = __m512;
// (sum - correction) as float32: the exact int32 dot of the signed values.
inline Floats Exact(Acc sum, const int8_t* correction) {
  return _mm512_cvtepi32_ps(_mm512_sub_epi32((__m512i)sum, _mm512_loadu_si512(correction)));
}
// value * 256 + low, exact where 256 * value is (the digits' combination).
inline Floats Combine(Floats high, Floats low) { return _mm512_fmadd_ps(high, _mm512_set1_ps(256.0f), low); }
// value times the row's scale, then each column's.
inline Floats Scale(Floats value, float row_scale, const float* scale) {
  return _mm512_mul_ps(_mm512_mul_ps(value, _mm512_set1_ps(row_scale)), _mm512_loadu_ps(scale));
}
inline void Store(__m512 value, float* out) { _mm512_storeu_ps(out, value); }
// Rounded to bfloat16 to nearest even (a NaN stays a quiet NaN), as XLA's convert rounds.
inline void Store(__m512 value, uint16_t* out) {
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
  rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(rounded));
}
#else
// AVX-VNNI: a panel row is two ymm halves, columns 0-7 and 8-15 (int32 vectors, as with zmm above).
typedef int32_t Acc __attribute__((vector_size(32)));
constexpr int kVectorsPerPanel = 2;
constexpr int kLanes = 8;
constexpr int64_t kTileRows = 6;
constexpr int kTilePanels = 1;
inline Acc Zero() { return Acc{}; }
inline Acc LoadBytes(const int8_t* at) { return (Acc)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)); }
inline Acc Broadcast(uint32_t four) { return (Acc)_mm256_set1_epi32(static_cast<int32_t>(four)); }
#if defined(__AVX512VL__) && defined(__AVX512VNNI__)
inline Acc Dot(Acc sum, Acc unsigned_x, Acc weights) {
  return (Acc)_mm256_dpbusd_epi32((__m256i)sum, (__m256i)unsigned_x, (__m256i)weights);
}
#else
inline Acc Dot(Acc sum, Acc unsigned_x, Acc weights) {
  return (Acc)_mm256_dpbusd_avx_epi32((__m256i)sum, (__m256i)unsigned_x, (__m256i)weights);
}
#endif
using Floats = __m256;
inline Floats Exact(Acc sum, const int8_t* correction) {
  const __m256i corrections = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(correction));
  return _mm256_cvtepi32_ps(_mm256_sub_epi32((__m256i)sum, corrections));
}
inline Floats Combine(Floats high, Floats low) { return _mm256_fmadd_ps(high, _mm256_set1_ps(256.0f), low); }
inline Floats Scale(Floats value, float row_scale, const float* scale) {
  return _mm256_mul_ps(_mm256_mul_ps(value, _mm256_set1_ps(row_scale)), _mm256_loadu_ps(scale));
}
inline void Store(Floats value, float* out) { _mm256_storeu_ps(out, value); }
#endif

}  // namespace vnni_tiles

#endif  // JAXPAGED_CPU_NATIVE_VNNI_TILES_H_
