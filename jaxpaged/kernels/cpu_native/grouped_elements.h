// The grouped matmul's weight element types (grouped_matmul.cc includes this file; its build key hashes it too):
// each loads kLanes elements as one float32 vector (Load) and widens one element (Scalar). kFromMemory: the tiles ask
// for the rows ahead (false for a strip already widened into a per-thread buffer, which is in L2).

#ifndef JAXPAGED_CPU_NATIVE_GROUPED_ELEMENTS_H_
#define JAXPAGED_CPU_NATIVE_GROUPED_ELEMENTS_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "packed_tiles.h"

namespace grouped_elements {

using packed_tiles::kLanes;
using packed_tiles::Vec;

struct Float32 {
  using Element = float;
  static constexpr bool kFromMemory = true;
  static Vec Load(const float* at) { return *reinterpret_cast<const Vec*>(at); }
  static float Scalar(float value) { return value; }
};

struct WidenedStrip : Float32 {
  static constexpr bool kFromMemory = false;
};

struct Bfloat16 {
  using Element = uint16_t;  // bfloat16 bits, as XLA's FFI hands them over; float32 is the same bits shifted up 16
  static constexpr bool kFromMemory = true;
  static Vec Load(const uint16_t* at) {
#if defined(__AVX512F__)
    const __m512i widened = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))), 16);
#elif defined(__AVX2__)
    const __m256i widened = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))), 16);
#else
    uint32_t widened[kLanes];
    for (int k = 0; k < kLanes; ++k) widened[k] = static_cast<uint32_t>(at[k]) << 16;
#endif
    Vec loaded;
    std::memcpy(&loaded, &widened, sizeof(loaded));
    return loaded;
  }
  static float Scalar(uint16_t bits) {
    const uint32_t widened = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &widened, sizeof(value));
    return value;
  }
};

struct Int8 {
  using Element = int8_t;
  static constexpr bool kFromMemory = true;
  static Vec Load(const int8_t* at) { return packed_tiles::Int8::Load(at); }  // reads kLanes bytes
  static float Scalar(int8_t value) { return static_cast<float>(value); }
};

}  // namespace grouped_elements

#endif  // JAXPAGED_CPU_NATIVE_GROUPED_ELEMENTS_H_
