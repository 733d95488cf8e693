// The register tile of packed_matmul.cc (which includes this file; the build key hashes it too) and the element types
// its tiles multiply: float32, bfloat16 pairs (AVX512-BF16) and int8 widened to float32. One source builds the AVX2
// and the AVX-512 tile (-march=native).

#ifndef JAXPAGED_CPU_NATIVE_PACKED_TILES_H_
#define JAXPAGED_CPU_NATIVE_PACKED_TILES_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace packed_tiles {

constexpr int64_t kPanelWidth = 16;  // columns per panel

// The register tile, by the vector width this build targets (-march=native). AVX2 (16 ymm registers): 6 rows x one
// panel, two 8-float halves per panel row: 12 accumulators, 2 weight vectors, 1 broadcast. AVX-512 (32 zmm
// registers, whose cores run 512-bit FMAs at full width on Zen 5 and Xeons): 12 rows x two panels, one 16-float
// vector per panel row: 24 accumulators, and each broadcast of x feeds two FMAs, which halves the loads per FMA
// (the AVX2 tile, one panel per tile, fell well behind XLA's dot on such CPUs; docs/performance.md).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int64_t kTileRows = 12;
constexpr int kTilePanels = 2;
#else
constexpr int kLanes = 8;
constexpr int64_t kTileRows = 6;
constexpr int kTilePanels = 1;
#endif

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));

// float32: a panel row is kPanelWidth / kLanes vectors of 16 columns' weights for one inner index; each is multiplied
// by the broadcast x[r, i] and added.
struct Float32 {
  using Element = float;                                      // the panels' elements
  using XElement = float;                                     // x's elements
  static constexpr bool kScaled = false;                      // sums multiplied by per-column scales at the end
  static constexpr int kInnerStep = 1;                        // inner indices per panel row
  static constexpr int kVectorsPerRow = kPanelWidth / kLanes;  // 2 (AVX2) or 1 (AVX-512)
  using Weight = Vec;
  static Weight Load(const Element* at) { return *reinterpret_cast<const Vec*>(at); }
  static Element BroadcastSource(const Element* x) { return *x; }
  static void Accumulate(Vec& sum, Element x, const Weight& weight) { sum += x * weight; }
};

#if defined(__AVX512BF16__)
// bfloat16: a panel row is one vector of 16 (W[2i, c], W[2i + 1, c]) pairs; the pair (x[r, 2i], x[r, 2i + 1]) is
// broadcast as one 32-bit value and VDPBF16PS adds x[r, 2i] W[2i, c] + x[r, 2i + 1] W[2i + 1, c] to column c's sum.
struct Bfloat16 {
  using Element = uint16_t;  // bfloat16 bits, as XLA's FFI hands them over
  using XElement = uint16_t;
  static constexpr bool kScaled = false;
  static constexpr int kInnerStep = 2;
  static constexpr int kVectorsPerRow = 1;
  using Weight = __m512bh;
  static Weight Load(const Element* at) { return (__m512bh)_mm512_loadu_si512(at); }
  static int32_t BroadcastSource(const Element* x) {
    int32_t pair;
    std::memcpy(&pair, x, sizeof(pair));
    return pair;
  }
  static void Accumulate(Vec& sum, int32_t pair, const Weight& weight) {
    sum = (Vec)_mm512_dpbf16_ps((__m512)sum, (__m512bh)_mm512_set1_epi32(pair), weight);
  }
};
#endif

// int8: a panel row is 16 int8 values (16 bytes), widened to float32 vectors as they are loaded; x stays float32, so
// the multiply-adds are Float32's. The column scales are applied to the finished sums (Problem::scales).
struct Int8 {
  using Element = int8_t;
  using XElement = float;
  static constexpr bool kScaled = true;
  static constexpr int kInnerStep = 1;
  static constexpr int kVectorsPerRow = kPanelWidth / kLanes;
  using Weight = Vec;
  static Weight Load(const Element* at) {
#if defined(__AVX512F__)
    return (Vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))));
#elif defined(__AVX2__)
    return (Vec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
#else
    Vec widened;
    for (int k = 0; k < kLanes; ++k) widened[k] = static_cast<float>(at[k]);
    return widened;
#endif
  }
  static XElement BroadcastSource(const XElement* x) { return *x; }
  static void Accumulate(Vec& sum, XElement x, const Weight& weight) { sum += x * weight; }
};

// A tile's float32 sums written as bfloat16: only the bfloat16 kernel asks for that, built only with AVX512-BF16.
inline void StoreBfloat16(uint16_t* out, const Vec& sums) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh((__m512)sums));
#else
  (void)out;
  (void)sums;
  __builtin_unreachable();
#endif
}

}  // namespace packed_tiles

#endif  // JAXPAGED_CPU_NATIVE_PACKED_TILES_H_
