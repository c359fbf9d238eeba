// The AVX-512 intrinsics bf16_decoder.cpp uses, on AVX2 + FMA (included by it when the compiler targets no
// AVX512_BF16; cpu_kernels.py builds it so on CPUs without that extension, kernel path "bf16-avx2").
//
// A 512-bit vector is two 256-bit halves and every operation acts on each half with the AVX2 instruction
// that computes the same lanes, so the code above keeps its batch invariance: every output element is
// still one fixed instruction sequence whatever the number of rows. The one instruction AVX2 lacks,
// VDPBF16PS, follows Intel's pseudocode per 32-bit lane: acc += x[2j+1] w[2j+1], then acc += x[2j] w[2j],
// each a fused multiply-add (bf16 products are exact in float32, so each step rounds once, as there).
// No bit-exactness with AVX512_BF16 machines is claimed (how their VDPBF16PS rounds
// inside is not documented), only the same law and batch invariance.
// Denormal inputs are not flushed (VDPBF16PS flushes them); bf16 weights and activations of the models
// served here have none that matter. _mm512_reduce_add_ps adds in GCC's order; _mm512_scalef_ps(y, n)
// (n integral) multiplies by 2^(n - n/2) then 2^(n/2), exact while the result is a normal float.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace avx2_512 {

struct F {  // 16 floats
  __m256 lo, hi;
};
struct I {  // 16 int32 (or 32 bf16 / 64 bytes)
  __m256i lo, hi;
};
struct BH {  // 32 bf16 as 16 pairs; (BH)an_I is the reinterpretation the AVX-512 code writes as a cast
  __m256i lo, hi;
  BH() = default;
  BH(const I& v) : lo(v.lo), hi(v.hi) {}  // NOLINT(google-explicit-constructor): the cast the code spells
};
using Mask = uint16_t;

inline F setzero_ps() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F set1_ps(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline I set1_epi32(int32_t v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
inline F loadu_ps(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store_ps(float* p, F a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline I loadu_si512(const void* p) {
  const __m256i* q = reinterpret_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}

#define AVX2_512_BINARY(name, type, op) \
  inline type name(type a, type b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
AVX2_512_BINARY(add_ps, F, _mm256_add_ps)
AVX2_512_BINARY(sub_ps, F, _mm256_sub_ps)
AVX2_512_BINARY(mul_ps, F, _mm256_mul_ps)
AVX2_512_BINARY(div_ps, F, _mm256_div_ps)
AVX2_512_BINARY(min_ps, F, _mm256_min_ps)
AVX2_512_BINARY(max_ps, F, _mm256_max_ps)
AVX2_512_BINARY(add_epi32, I, _mm256_add_epi32)
AVX2_512_BINARY(and_si512, I, _mm256_and_si256)
#undef AVX2_512_BINARY

inline F fmadd_ps(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline F fnmadd_ps(F a, F b, F c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline I srli_epi32(I a, int n) { return {_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)}; }
inline I slli_epi32(I a, int n) { return {_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)}; }
inline I castps_si512(F a) { return {_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
inline F castsi512_ps(I a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
inline I cvtepu16_epi32(__m256i a) {
  return {_mm256_cvtepu16_epi32(_mm256_castsi256_si128(a)), _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1))};
}
inline float cvtss_f32(F a) { return _mm256_cvtss_f32(a.lo); }

// VDPBF16PS on one half: lanes hold (even, odd) bf16 pairs; a bf16 is the high half of its float32
inline __m256 pair_fma(__m256 acc, __m256 xo, __m256 wo, __m256 xe, __m256 we) {
  return _mm256_fmadd_ps(xe, we, _mm256_fmadd_ps(xo, wo, acc));
}
inline __m256 dpbf16_half(__m256 acc, __m256i x, __m256i w) {
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(x, high)), wo = _mm256_castsi256_ps(_mm256_and_si256(w, high));
  const __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  return pair_fma(acc, xo, wo, xe, we);
}
inline F dpbf16_ps(F acc, BH x, BH w) { return {dpbf16_half(acc.lo, x.lo, w.lo), dpbf16_half(acc.hi, x.hi, w.hi)}; }

inline float reduce_add_ps(F a) {  // GCC's _mm512_reduce_add_ps: halves, then quarters, then pairs
  const __m256 t3 = _mm256_add_ps(a.hi, a.lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

template <int IMM>
inline F roundscale_ps(F a) {
  static_assert((IMM & 0xF0) == 0, "only rounding to integers (scale 0) is emulated");
  return {_mm256_round_ps(a.lo, IMM & 0x0F), _mm256_round_ps(a.hi, IMM & 0x0F)};
}

inline __m256 pow2_half(__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); }
inline __m256 scalef_half(__m256 y, __m256 n) {  // n integral, |n| <= 150
  const __m256i e = _mm256_cvtps_epi32(n);
  const __m256i h = _mm256_srai_epi32(e, 1);
  return _mm256_mul_ps(_mm256_mul_ps(y, pow2_half(_mm256_sub_epi32(e, h))), pow2_half(h));
}
inline F scalef_ps(F y, F n) { return {scalef_half(y.lo, n.lo), scalef_half(y.hi, n.hi)}; }

// a 16-bit mask as two halves of all-ones / all-zeros lanes
inline __m256i mask_half(Mask m, int shift) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i b = _mm256_and_si256(_mm256_set1_epi32((m >> shift) & 0xFF), bits);
  return _mm256_cmpeq_epi32(b, bits);
}
inline F maskz_loadu_ps(Mask m, const float* p) {
  return {_mm256_maskload_ps(p, mask_half(m, 0)), _mm256_maskload_ps(p + 8, mask_half(m, 8))};
}
inline void mask_storeu_ps(float* p, Mask m, F a) {
  _mm256_maskstore_ps(p, mask_half(m, 0), a.lo);
  _mm256_maskstore_ps(p + 8, mask_half(m, 8), a.hi);
}
inline F maskz_mov_ps(Mask m, F a) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(mask_half(m, 0))), _mm256_and_ps(a.hi, _mm256_castsi256_ps(mask_half(m, 8)))};
}
template <int PRED>
inline Mask cmp_ps_mask(F a, F b) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, PRED));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, PRED));
  return static_cast<Mask>(lo | (hi << 8));
}


}  // namespace avx2_512

// The AVX-512 names of the code, bound to the emulation (after every system header: immintrin.h declares the
// real ones, which an AVX2 target cannot inline).
#define __m512 avx2_512::F
#define __m512i avx2_512::I
#define __m512bh avx2_512::BH
#define __mmask16 avx2_512::Mask
#define _mm512_setzero_ps avx2_512::setzero_ps
#define _mm512_set1_ps avx2_512::set1_ps
#define _mm512_set1_epi32 avx2_512::set1_epi32
#define _mm512_loadu_ps avx2_512::loadu_ps
#define _mm512_store_ps avx2_512::store_ps
#define _mm512_loadu_si512 avx2_512::loadu_si512
#define _mm512_add_ps avx2_512::add_ps
#define _mm512_sub_ps avx2_512::sub_ps
#define _mm512_mul_ps avx2_512::mul_ps
#define _mm512_div_ps avx2_512::div_ps
#define _mm512_min_ps avx2_512::min_ps
#define _mm512_max_ps avx2_512::max_ps
#define _mm512_add_epi32 avx2_512::add_epi32
#define _mm512_and_si512 avx2_512::and_si512
#define _mm512_fmadd_ps avx2_512::fmadd_ps
#define _mm512_fnmadd_ps avx2_512::fnmadd_ps
#define _mm512_srli_epi32 avx2_512::srli_epi32
#define _mm512_slli_epi32 avx2_512::slli_epi32
#define _mm512_castps_si512 avx2_512::castps_si512
#define _mm512_castsi512_ps avx2_512::castsi512_ps
#define _mm512_cvtepu16_epi32 avx2_512::cvtepu16_epi32
#define _mm512_cvtss_f32 avx2_512::cvtss_f32
#define _mm512_dpbf16_ps avx2_512::dpbf16_ps
#define _mm512_reduce_add_ps avx2_512::reduce_add_ps
#define _mm512_roundscale_ps(a, imm) avx2_512::roundscale_ps<(imm)>(a)
#define _mm512_scalef_ps avx2_512::scalef_ps
#define _mm512_maskz_loadu_ps avx2_512::maskz_loadu_ps
#define _mm512_mask_storeu_ps avx2_512::mask_storeu_ps
#define _mm512_maskz_mov_ps avx2_512::maskz_mov_ps
#define _mm512_cmp_ps_mask(a, b, pred) avx2_512::cmp_ps_mask<(pred)>(a, b)
