// The rows a VNNI matmul call multiplies (vnni_matmul.cc, which includes this file; the build key hashes it too):
// int8 values shifted to unsigned (x + 128, an XOR of each byte's sign bit: VPDPBUSD multiplies unsigned bytes by
// signed ones) and arranged by groups of four per row block, once per call, so a register tile's broadcasts of one
// group read adjacent 32-bit words off one pointer.
//
// Layout: block b of `block_rows` rows (the work items' row blocks; the last may be shorter, n rows) starts at word
// b * block_rows * groups and holds group g of its row r at word g * n + r. A last group that is no whole four values
// is filled with shifted zeros (its weights are zero, so the filler adds nothing).
#ifndef JAXPAGED_CPU_NATIVE_VNNI_ROWS_H_
#define JAXPAGED_CPU_NATIVE_VNNI_ROWS_H_

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace vnni_rows {

constexpr uint32_t kShift = 0x80808080u;  // XOR of four bytes' sign bits: x + 128 in each

// A buffer of `words` 32-bit words reused by the calls on this thread (the caller's; its helpers only read it while
// the caller waits for them).
inline uint32_t* Buffer(int64_t words) {
  thread_local std::vector<uint32_t> buffer;
  if (static_cast<int64_t>(buffer.size()) < words) buffer.resize(words);
  return buffer.data();
}

// Where group g of row `row` goes (see the layout above).
inline int64_t WordOf(int64_t row, int64_t g, int64_t rows, int64_t groups, int64_t block_rows) {
  const int64_t first = row - row % block_rows, n = std::min(block_rows, rows - first);
  return first * groups + g * n + (row - first);
}

// int8 rows [0, rows) of x [rows, inner], shifted and arranged.
inline const uint32_t* ArrangeInt8(const int8_t* x, int64_t rows, int64_t inner, int64_t block_rows) {
  const int64_t groups = (inner + 3) / 4, full_groups = inner / 4;
  uint32_t* words = Buffer(rows * groups);
  for (int64_t row = 0; row < rows; ++row) {
    const int8_t* values = x + row * inner;
    uint32_t* at = words + WordOf(row, 0, rows, groups, block_rows);
    const int64_t stride = WordOf(row, 1, rows, groups, block_rows) - WordOf(row, 0, rows, groups, block_rows);
    for (int64_t g = 0; g < full_groups; ++g) {
      uint32_t four;
      std::memcpy(&four, values + 4 * g, sizeof(four));
      at[g * stride] = four ^ kShift;
    }
    if (full_groups < groups) {
      uint32_t four = 0;
      std::memcpy(&four, values + 4 * full_groups, static_cast<size_t>(inner - 4 * full_groups));
      at[full_groups * stride] = four ^ kShift;
    }
  }
  return words;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 float32 values of a row from `at` (float32, or bfloat16 bits widened exactly), the first `count` of them
// (the rest zeros).
inline __m512 LoadFloats(const float* at, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, at); }
inline __m512 LoadFloats(const uint16_t* at, __mmask16 mask) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, at));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// Rows [0, rows) of x [rows, inner] (float32 or bfloat16 bits) quantized per row, in float32, as XLA runs
// int8_activations.round_rows: s = max |x_row| / limit, v = round-half-even(x / s) clipped to [-limit, limit] (an
// all-zero row: s 0, v 0, divided by 1); each row's s into row_scale, and its values, shifted and arranged, into the
// returned words. XLA's algebraic simplifier turns both divisions into multiplies by a float32 reciprocal (1 / limit
// folded, 1 / s once per row), which an IEEE division differs from by an ulp now and then, moving some v by one:
// done the same way here, the values and scales equal XLA's bit for bit. kDigits (limit 32,639): each v as two int8
// digits, v = 256 hi + lo with hi = floor((v + 128) / 256) (int16_activations.split_rows), row r's high digits as
// arranged row 2r and its low as 2r + 1; else (limit 127) v itself as row r.
template <bool kDigits, typename Element>
const uint32_t* QuantizeRows(const Element* x, int64_t rows, int64_t inner, int64_t block_rows, float* row_scale) {
  constexpr int32_t kLimit = kDigits ? 127 * 256 + 127 : 127;
  const int64_t groups = (inner + 3) / 4, arranged_rows = kDigits ? 2 * rows : rows;
  uint32_t* words = Buffer(arranged_rows * groups);
  for (int64_t row = 0; row < rows; ++row) {
    const Element* values = x + row * inner;
    __m512 largest = _mm512_setzero_ps();
    for (int64_t k = 0; k < inner; k += 16) {
      const __mmask16 mask = static_cast<__mmask16>(inner - k >= 16 ? 0xffff : (1u << (inner - k)) - 1);
      largest = _mm512_max_ps(largest, _mm512_abs_ps(LoadFloats(values + k, mask)));
    }
    constexpr float kInverseLimit = 1.0f / static_cast<float>(kLimit);
    const float scale = _mm512_reduce_max_ps(largest) * kInverseLimit;
    row_scale[row] = scale;
    const __m512 inverse = _mm512_set1_ps(1.0f / (scale > 0 ? scale : 1.0f));
    const int64_t first = kDigits ? 2 * row : row;  // the arranged row of its (high) values
    uint32_t* at = words + WordOf(first, 0, arranged_rows, groups, block_rows);
    const int64_t stride = WordOf(first, 1, arranged_rows, groups, block_rows) - (at - words);
    const int64_t next_row = kDigits ? WordOf(first + 1, 0, arranged_rows, groups, block_rows) - (at - words) : 0;
    for (int64_t k = 0; k < inner; k += 16) {
      const __mmask16 mask = static_cast<__mmask16>(inner - k >= 16 ? 0xffff : (1u << (inner - k)) - 1);
      // VCVTPS2DQ rounds by MXCSR: to nearest even, as jnp.round does. The values past inner are zeros.
      const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(LoadFloats(values + k, mask), inverse));
      const __m512i v = _mm512_max_epi32(_mm512_min_epi32(rounded, _mm512_set1_epi32(kLimit)),
                                         _mm512_set1_epi32(-kLimit));
      const int64_t g = k / 4, count = std::min<int64_t>(4, groups - g);
      alignas(16) uint32_t four[4];
      const __m128i shift = _mm_set1_epi32(static_cast<int32_t>(kShift));
      if constexpr (kDigits) {
        const __m512i high = _mm512_srai_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(128)), 8);
        const __m512i low = _mm512_sub_epi32(v, _mm512_slli_epi32(high, 8));
        _mm_store_si128(reinterpret_cast<__m128i*>(four), _mm_xor_si128(_mm512_cvtepi32_epi8(high), shift));
        for (int64_t j = 0; j < count; ++j) at[(g + j) * stride] = four[j];
        _mm_store_si128(reinterpret_cast<__m128i*>(four), _mm_xor_si128(_mm512_cvtepi32_epi8(low), shift));
        for (int64_t j = 0; j < count; ++j) at[next_row + (g + j) * stride] = four[j];
      } else {
        _mm_store_si128(reinterpret_cast<__m128i*>(four), _mm_xor_si128(_mm512_cvtepi32_epi8(v), shift));
        for (int64_t j = 0; j < count; ++j) at[(g + j) * stride] = four[j];
      }
    }
  }
  return words;
}
#endif

}  // namespace vnni_rows

#endif  // JAXPAGED_CPU_NATIVE_VNNI_ROWS_H_
