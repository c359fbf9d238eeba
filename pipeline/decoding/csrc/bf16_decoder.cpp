// Batch-1 bf16 decoder kernels for CPUs with AVX512_BF16 (pipeline/decoding/cpu_kernels.py builds and loads this),
// and the same code on AVX2 + FMA through avx512_on_avx2.h (kernel path "bf16-avx2": bf16 weights widened to
// float32 in registers; the same batch invariance, the same rounding of every module output).
//
// What it is for: a decode step (1 row) and a speculative verification (2-32 rows) of a Llama-family model
// stream every weight once; at these row counts the time is the weights' bytes over the memory bandwidth,
// not FLOPs. oneDNN's bf16 linear reorders the weight on every call and the Python loop around ~45 small
// ops per layer costs more than the matmuls on a small model. Here one call runs all decoder layers:
// fused QKV and gate/up weights, each weight row read once for all rows (VDPBF16PS), RMSNorm, rotary,
// the KV-cache write and attention per row in C++.
//
// Batch invariance: every output element is computed by the same instruction sequence whatever the number
// of rows (the dot products walk the input in the same 32-wide chunks and reduce the same way; attention
// walks the same keys in the same order), so a row of a k-token verification is bit-identical to the
// one-token step that would have computed it. Greedy speculative decoding therefore equals greedy
// autoregressive decoding bit for bit in bf16, as it does in fp32.
//
// Rounding follows transformers' bf16 modules: every module output is rounded to bf16 where theirs is
// (RMSNorm: fp32 normalisation, rounded, times the bf16 weight, rounded; rotary: q*cos and rot(q)*sin
// rounded, their sum rounded; linear: fp32 accumulation rounded once; residual adds rounded). Attention
// computes scores, softmax and the weighted sum in fp32 and rounds the output once.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#if !defined(__AVX512BF16__)
#include "avx512_on_avx2.h"
#endif

using bf16 = at::BFloat16;

namespace {

// [0, n) in chunks of at least `grain` over torch's intra-op threads (at::parallel_for). A work-sharing pool
// that never waits for a thread to start was tried (a loaded machine makes each fork/join region wait a
// scheduler slice): on a quiet machine its worker competed with OpenMP's spinning threads and a 3-row
// verification took 1.40 steps against 1.22 here, so fork/join stays.
inline void parallel(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t threads = std::max(1, at::get_num_threads());
  const int64_t chunk = std::max<int64_t>(grain, (n + 2 * threads - 1) / (2 * threads));
  if (n <= chunk) {
    fn(0, n);
    return;
  }
  at::parallel_for(0, n, chunk, fn);
}

inline float to_f(bf16 v) { return static_cast<float>(v); }
inline bf16 to_b(float v) { return bf16(v); }  // round to nearest even (c10)
inline float round_b(float v) { return static_cast<float>(bf16(v)); }

inline __m512bh load_bh(const bf16* p) { return (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(p)); }

// Weights are packed once per model in the VNNI layout of VDPBF16PS: blocks of OB = 64 outputs, and within a
// block, for every pair of inputs (k, k+1), the 64 outputs' two weights side by side:
// P[out/64][in/2][64][2] (zero padded). One instruction then adds x[k] w[o][k] + x[k+1] w[o][k+1] to 16
// outputs at once, with x[k], x[k+1] broadcast: no horizontal reductions, a block is one sequential stream.
constexpr int OB = 64;   // outputs per block: 4 vectors of 16
constexpr int RG = 6;    // rows per register tile: 6 x 4 accumulators + 4 weights + 1 broadcast <= 32 registers

inline int64_t packed_numel(int64_t out, int64_t in) { return ((out + OB - 1) / OB) * ((in + 1) / 2) * OB * 2; }

// y[r][o0 .. o0 + 64) (fp32, valid outputs only) for N rows over one packed block.
// Each output is the sum over the input pairs in order, whatever N: batch invariance.
template <int N>
inline void block_tile(const bf16* const* x, const bf16* block, int64_t in, int64_t o0, int64_t out, float* const* y) {
  __m512 acc[N][4];
  for (int r = 0; r < N; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t pairs = in / 2;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const bf16* w = block + kp * OB * 2;
    __m512bh w0 = load_bh(w), w1 = load_bh(w + 32), w2 = load_bh(w + 64), w3 = load_bh(w + 96);
    for (int r = 0; r < N; ++r) {
      int32_t two;
      std::memcpy(&two, x[r] + 2 * kp, sizeof(two));
      __m512bh xb = (__m512bh)_mm512_set1_epi32(two);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xb, w2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], xb, w3);
    }
  }
  if (in % 2) {  // the last input alone (its pair partner is zero in P and in the broadcast)
    const bf16* w = block + pairs * OB * 2;
    __m512bh w0 = load_bh(w), w1 = load_bh(w + 32), w2 = load_bh(w + 64), w3 = load_bh(w + 96);
    for (int r = 0; r < N; ++r) {
      uint16_t lo;
      std::memcpy(&lo, x[r] + 2 * pairs, sizeof(lo));
      __m512bh xb = (__m512bh)_mm512_set1_epi32((int32_t)lo);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xb, w2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], xb, w3);
    }
  }
  const int64_t valid = std::min<int64_t>(OB, out - o0);
  for (int j = 0; j < 4; ++j) {
    const int64_t n_valid = std::max<int64_t>(0, std::min<int64_t>(16, valid - 16 * j));
    if (n_valid == 0) break;
    const __mmask16 m = (__mmask16)((1u << n_valid) - 1);
    for (int r = 0; r < N; ++r) _mm512_mask_storeu_ps(y[r] + o0 + 16 * j, m, acc[r][j]);
  }
}

// The blocks [b0, b1) for n rows: per block, the rows in register tiles of up to RG (the block is read from
// memory once, from L2 for the later tiles).
void gemv_blocks(int64_t n, const bf16* const* x, const bf16* P, int64_t in, int64_t out, int64_t b0, int64_t b1, float* const* y) {
  const int64_t bstride = ((in + 1) / 2) * OB * 2;
  // the first tile streams the block from memory with its compute hidden under the stream; the later tiles
  // read it from L2 and their compute is not hidden: the first tile as large as the registers allow (6 + 2
  // rows: 1.24 steps, 4 + 4: 1.31; a prefetch of the next block during the last tile made both slower)
  const int64_t size = RG;
  for (int64_t b = b0; b < b1; ++b) {
    const bf16* block = P + b * bstride;
    for (int64_t r0 = 0; r0 < n; r0 += size) {
      switch (std::min<int64_t>(size, n - r0)) {
        case 1: block_tile<1>(x + r0, block, in, b * OB, out, y + r0); break;
        case 2: block_tile<2>(x + r0, block, in, b * OB, out, y + r0); break;
        case 3: block_tile<3>(x + r0, block, in, b * OB, out, y + r0); break;
        case 4: block_tile<4>(x + r0, block, in, b * OB, out, y + r0); break;
        case 5: block_tile<5>(x + r0, block, in, b * OB, out, y + r0); break;
        default: block_tile<6>(x + r0, block, in, b * OB, out, y + r0); break;
      }
    }
  }
}

#if !defined(__AVX512BF16__)
// One row on AVX2 (a decode step, a draft step): the row widened to float32 once per call instead of each input
// pair per block, 8 accumulators of 8 outputs. Each output gets acc = fma(x[2k], w[2k], fma(x[2k+1], w[2k+1],
// acc)) over the input pairs in order, the emulated VDPBF16PS's sequence (avx512_on_avx2.h): the same bits as
// block_tile's rows (tests/test_bf16_kernels.py). Tiles of several rows in this form (R rows x C vectors in the 16
// registers, 2 to 6 rows) measured slower than block_tile's (6 rows: 68 against 32 ms for the default target's
// 30 layers); this one row form 13.8-15.5 ms against 15.3-16.3 (benchmarks/notes-cpu-bench-history.md).
void row_blocks_avx2(const float* x, const bf16* P, int64_t in, int64_t out, int64_t b0, int64_t b1, float* y) {
  const int64_t pairs = (in + 1) / 2, bstride = pairs * OB * 2;
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t b = b0; b < b1; ++b) {
    const bf16* block = P + b * bstride;
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t kp = 0; kp < pairs; ++kp) {
      const bf16* w = block + kp * OB * 2;
      const __m256 xo = _mm256_broadcast_ss(x + 2 * kp + 1), xe = _mm256_broadcast_ss(x + 2 * kp);
      for (int j = 0; j < 8; ++j) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * j));
        const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        acc[j] = _mm256_fmadd_ps(xe, we, _mm256_fmadd_ps(xo, wo, acc[j]));
      }
    }
    for (int j = 0; j < 8; ++j) {
      const int64_t first = b * OB + 8 * j;
      const int64_t n_valid = std::max<int64_t>(0, std::min<int64_t>(8, out - first));
      if (n_valid == 8) {
        _mm256_storeu_ps(y + first, acc[j]);
      } else if (n_valid > 0) {
        alignas(32) float t[8];
        _mm256_store_ps(t, acc[j]);
        std::memcpy(y + first, t, n_valid * sizeof(float));
      }
    }
  }
}
#endif  // !__AVX512BF16__

// Y[n][out] (fp32) = X[n][in] W[out][in]^T with W packed; blocks split over threads (small weights, under
// ~1 MB, on one thread: the fork/join costs more than the work).
void gemv(const bf16* X, int64_t n, const bf16* P, int64_t in, int64_t out, float* Y) {
  if (n <= 0) return;
  const int64_t blocks = (out + OB - 1) / OB;
  const int64_t work = in * OB * 2 * ((n + RG - 1) / RG);  // bytes of weights streamed per block, times the row tiles
  const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 19) / std::max<int64_t>(work, 1));
#if !defined(__AVX512BF16__)
  if (n == 1) {  // the row widened once (the odd input's partner a zero, as in the packed weights)
    std::vector<float> xf(2 * ((in + 1) / 2), 0.f);
    for (int64_t k = 0; k < in; ++k) xf[k] = to_f(X[k]);
    auto row = [&](int64_t b, int64_t e) { row_blocks_avx2(xf.data(), P, in, out, b, e, Y); };
    if (blocks <= grain) {
      row(0, blocks);
    } else {
      parallel(blocks, grain, row);
    }
    return;
  }
#endif
  std::vector<const bf16*> xr(n);
  std::vector<float*> yr(n);
  for (int64_t r = 0; r < n; ++r) {
    xr[r] = X + r * in;
    yr[r] = Y + r * out;
  }
  auto body = [&](int64_t b, int64_t e) { gemv_blocks(n, xr.data(), P, in, out, b, e, yr.data()); };
  if (blocks <= grain) {
    body(0, blocks);
  } else {
    parallel(blocks, grain, body);
  }
}

// transformers' LlamaRMSNorm in bf16: fp32 statistics, normalised value rounded, times the weight, rounded.
void rms_norm(const bf16* x, int64_t n, int64_t h, const bf16* w, float eps, bf16* y) {
  for (int64_t r = 0; r < n; ++r) {
    const bf16* xr = x + r * h;
    float ss = 0.f;
    for (int64_t i = 0; i < h; ++i) {
      float v = to_f(xr[i]);
      ss += v * v;
    }
    float inv = 1.f / std::sqrt(ss / (float)h + eps);
    for (int64_t i = 0; i < h; ++i) y[r * h + i] = to_b(to_f(w[i]) * round_b(to_f(xr[i]) * inv));
  }
}

struct Dims {
  int64_t hidden, heads, kv_heads, head_dim, inter;
  float eps, scale;
};

// exp(x) for 16 floats (Cephes' expf polynomial on x - n ln2, scaled by 2^n; within 2 ulp of expf): the same
// function for every element whatever the row count, so rows stay batch-invariant.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0f)), _mm512_set1_ps(-104.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

inline float exp1(float x) { return _mm512_cvtss_f32(exp512(_mm512_set1_ps(x))); }

// 16 floats rounded to bf16 precision (round to nearest even, as c10::BFloat16; finite inputs), kept as floats
inline __m512 round_b_ps(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_add_epi32(u, bias), _mm512_set1_epi32((int)0xFFFF0000u)));
}

// 16 bf16 -> 16 floats (exact)
inline __m512 load_bf16_ps(const bf16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// Attention of one query row over m keys, given by their cache indices `keys` in order (the allowed ones:
// a tree node's path is the same sequence as the chain it stands for, so its row is bit-identical to it).
// Scores: bf16 products summed in fp32 by VDPBF16PS; softmax and the weighted sum in fp32; output rounded once.
template <int D>
void attend_row(const bf16* qr, const bf16* K, const bf16* V, const int32_t* keys, int64_t m, float scale, float* p, bf16* o) {
  constexpr int C = D / 32, A = D / 16;
  __m512bh qv[C];
  for (int c = 0; c < C; ++c) qv[c] = load_bh(qr + 32 * c);
  float mx = -INFINITY;
  for (int64_t t = 0; t < m; ++t) {
    const bf16* kj = K + (int64_t)keys[t] * D;
    __m512 a = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) a = _mm512_dpbf16_ps(a, qv[c], load_bh(kj + 32 * c));
    const float sc = _mm512_reduce_add_ps(a) * scale;
    p[t] = sc;
    mx = std::max(mx, sc);
  }
  // exp and sum in 16-key chunks (lanes past m are zero): a fixed reduction for a given key sequence
  __m512 vsum = _mm512_setzero_ps();
  const __m512 vmx = _mm512_set1_ps(mx);
  for (int64_t t = 0; t < m; t += 16) {
    const __mmask16 k = (m - t >= 16) ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - t)) - 1);
    __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p + t), vmx));
    e = _mm512_maskz_mov_ps(k, e);
    _mm512_mask_storeu_ps(p + t, k, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const float inv = 1.f / _mm512_reduce_add_ps(vsum);
  __m512 acc[A];
  for (int c = 0; c < A; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < m; ++t) {
    if (p[t] == 0.f) continue;
    const bf16* vj = V + (int64_t)keys[t] * D;
    const __m512 pj = _mm512_set1_ps(p[t]);
    for (int c = 0; c < A; ++c) acc[c] = _mm512_fmadd_ps(pj, load_bf16_ps(vj + 16 * c), acc[c]);
  }
  alignas(64) float out[D];
  for (int c = 0; c < A; ++c) _mm512_store_ps(out + 16 * c, _mm512_mul_ps(acc[c], _mm512_set1_ps(inv)));
  for (int i = 0; i < D; ++i) o[i] = to_b(out[i]);
}

// The same for any head size (scalar; the vector form covers head sizes 64 and 128).
void attend_row_any(const bf16* qr, const bf16* K, const bf16* V, const int32_t* keys, int64_t m, int64_t d, float scale, float* p,
                    float* acc, bf16* o) {
  float mx = -INFINITY;
  for (int64_t t = 0; t < m; ++t) {
    const bf16* kj = K + (int64_t)keys[t] * d;
    float s = 0.f;
    for (int64_t i = 0; i < d; ++i) s += to_f(qr[i]) * to_f(kj[i]);
    p[t] = s * scale;
    mx = std::max(mx, p[t]);
  }
  float sum = 0.f;
  for (int64_t t = 0; t < m; ++t) {
    p[t] = exp1(p[t] - mx);
    sum += p[t];
  }
  std::fill(acc, acc + d, 0.f);
  for (int64_t t = 0; t < m; ++t) {
    if (p[t] == 0.f) continue;
    const bf16* vj = V + (int64_t)keys[t] * d;
    for (int64_t i = 0; i < d; ++i) acc[i] += p[t] * to_f(vj[i]);
  }
  const float inv = 1.f / sum;
  for (int64_t i = 0; i < d; ++i) o[i] = to_b(acc[i] * inv);
}

// Attention of n query rows at positions start..start+n-1 over the cache [0, start+n) of one layer.
// q: [n][heads*d] (bf16, rotated), caches [kv_heads][cap][d]; allowed: [n][start+n] or null (causal).
void attention(const bf16* q, int64_t n, const bf16* kc, const bf16* vc, int64_t cap, int64_t start, const bool* allowed,
               const Dims& dm, bf16* out /*[n][heads*d]*/) {
  const int64_t d = dm.head_dim, total = start + n, groups = dm.heads / dm.kv_heads;
  // a few heads over a short context are less work than waking a second thread
  const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 19) / std::max<int64_t>(total * d, 1));
  parallel(dm.heads * n, grain, [&](int64_t b, int64_t e) {
    std::vector<float> p(total + 16), acc(d);
    std::vector<int32_t> keys(total);
    int64_t keys_row = -1, m = 0;
    for (int64_t t = b; t < e; ++t) {
      int64_t r = t / dm.heads, hh = t % dm.heads, kvh = hh / groups;
      if (r != keys_row) {  // the row's keys: causal 0..start+r, or the allowed ones in order
        m = 0;
        for (int64_t j = 0; j < total; ++j)
          if (allowed ? allowed[r * total + j] : (j <= start + r)) keys[m++] = (int32_t)j;
        keys_row = r;
      }
      const bf16* qr = q + r * dm.heads * d + hh * d;
      const bf16* K = kc + kvh * cap * d;
      const bf16* V = vc + kvh * cap * d;
      bf16* o = out + r * dm.heads * d + hh * d;
      if (m == 0) {
        std::fill(o, o + d, to_b(0.f));
      } else if (d == 64) {
        attend_row<64>(qr, K, V, keys.data(), m, dm.scale, p.data(), o);
      } else if (d == 128) {
        attend_row<128>(qr, K, V, keys.data(), m, dm.scale, p.data(), o);
      } else {
        attend_row_any(qr, K, V, keys.data(), m, d, dm.scale, p.data(), acc.data(), o);
      }
    }
  });
}

// q or k rows [n][nh*d] in place: x*cos + rotate_half(x)*sin, each product and the sum rounded to bf16.
void rotary(bf16* x, int64_t n, int64_t nh, int64_t d, const bf16* cos, const bf16* sin, int64_t row_stride) {
  const int64_t half = d / 2;
  std::vector<float> tmp(d);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t hh = 0; hh < nh; ++hh) {
      bf16* v = x + r * row_stride + hh * d;
      const bf16* c = cos + r * d;
      const bf16* s = sin + r * d;
      for (int64_t i = 0; i < d; ++i) {
        float rot = i < half ? -to_f(v[i + half]) : to_f(v[i - half]);
        tmp[i] = round_b(round_b(to_f(v[i]) * to_f(c[i])) + round_b(rot * to_f(s[i])));
      }
      for (int64_t i = 0; i < d; ++i) v[i] = to_b(tmp[i]);
    }
}

}  // namespace

// A weight [out, in] in the kernels' packed layout (a flat bf16 tensor).
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2, "a weight is [out, in]");
  auto wc = w.to(at::kBFloat16).contiguous();
  const int64_t out = wc.size(0), in = wc.size(1), pairs = (in + 1) / 2;
  auto P = torch::zeros({packed_numel(out, in)}, wc.options());
  const bf16* src = wc.data_ptr<bf16>();
  bf16* dst = P.data_ptr<bf16>();
  for (int64_t o = 0; o < out; ++o) {
    bf16* block = dst + (o / OB) * pairs * OB * 2;
    const int64_t lane = o % OB;
    for (int64_t k = 0; k < in; ++k) block[(k / 2) * OB * 2 + lane * 2 + (k % 2)] = src[o * in + k];
  }
  return P;
}

// The kernels' exp over a float tensor (the softmax and SiLU use it; tests check its accuracy against expf).
torch::Tensor exp_ps(torch::Tensor x) {
  auto xc = x.to(at::kFloat).contiguous();
  auto y = torch::empty_like(xc);
  const float* src = xc.data_ptr<float>();
  float* dst = y.data_ptr<float>();
  const int64_t n = xc.numel();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = (n - i >= 16) ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, k, exp512(_mm512_maskz_loadu_ps(k, src + i)));
  }
  return y;
}

// The k largest entries of one row (NaN skipped) into vals/idx, descending, ties: lower index first; returns how
// many were found (k unless the row has fewer non-NaN values). Small k (the warps' top-k): one pass in which 16
// entries at a time are compared with the current k-th largest and only those above it enter the sorted list;
// large k (a whole row kept): a partial sort, the same order.
int64_t topk_row(const float* row, int64_t V, int64_t k, float* vals, int64_t* idx) {
  if (k > 64) {
    std::vector<int64_t> ids;
    ids.reserve(V);
    for (int64_t i = 0; i < V; ++i)
      if (row[i] == row[i]) ids.push_back(i);
    const int64_t have = std::min<int64_t>(k, (int64_t)ids.size());
    std::partial_sort(ids.begin(), ids.begin() + have, ids.end(),
                      [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int64_t i = 0; i < have; ++i) {
      vals[i] = row[ids[i]];
      idx[i] = ids[i];
    }
    return have;
  }
  int64_t have = 0;
  auto insert = [&](float v, int64_t i) {  // after every kept value >= v: earlier indices first among ties
    if (have == k) {
      if (!(v > vals[k - 1])) return;
      have = k - 1;  // the smallest kept value drops out
    }
    int64_t pos = have;
    while (pos > 0 && vals[pos - 1] < v) {
      vals[pos] = vals[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    vals[pos] = v;
    idx[pos] = i;
    ++have;
  };
  int64_t i = 0;
  for (; i < V && have < k; ++i)
    if (row[i] == row[i]) insert(row[i], i);  // NaN never enters
  for (; i + 16 <= V; i += 16) {
    __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), _mm512_set1_ps(vals[k - 1]), _CMP_GT_OQ);
    while (m) {
      const int j = __builtin_ctz(m);
      insert(row[i + j], i + j);
      m &= m - 1;
      // a raised threshold can drop later lanes of this chunk
      m &= _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), _mm512_set1_ps(vals[k - 1]), _CMP_GT_OQ);
    }
  }
  for (; i < V; ++i)
    if (row[i] > vals[k - 1]) insert(row[i], i);
  return have;
}

// One row of warp_topk: the kept ids (descending logits) into idx and their warped probabilities into p.
void warp_row(const float* row, int64_t V, int64_t k, float temperature, double top_p, float* vals, int64_t* idx, float* p) {
  const int64_t have = topk_row(row, V, k, vals, idx);
  TORCH_CHECK(have == k, "a row has fewer than k non-NaN values");
  const float mx = vals[0] / temperature;
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp(vals[i] / temperature - mx);
    sum += p[i];
  }
  for (int64_t i = 0; i < k; ++i) p[i] /= sum;
  if (top_p < 1.0) {
    double before = 0.0;
    float kept = 0.f;
    for (int64_t i = 0; i < k; ++i) {
      const float pi = p[i];
      if (before >= top_p) p[i] = 0.f;
      else kept += pi;
      before += pi;
    }
    for (int64_t i = 0; i < k; ++i) p[i] /= kept;
  }
}

// The warped rows of logits x [n, V] (float32 or bf16) under top-k, temperature and top-p, as the engine's
// Warper defines them (pipeline/decoding/warping.py): the k largest logits (ties: lower index first), divided
// by the temperature, softmax over the k (float32, max subtracted), then the smallest prefix whose mass
// reaches top_p (a token is kept while the mass strictly before it, summed in float64, is below top_p; the
// crossing token kept), renormalised. Returns (index [n, k] int64, probs [n, k] float32, 0 past the prefix):
// the warped row is probs at index and 0 elsewhere. One call instead of ~12 small tensor ops per row.
std::vector<torch::Tensor> warp_topk(torch::Tensor x, int64_t k, double temperature, double top_p) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16), "x must be [n, V] float32 or bf16");
  TORCH_CHECK(temperature > 0, "temperature must be > 0 (temperature 0 is greedy: no warped row to sample)");
  auto xc = x.scalar_type() == at::kFloat ? x.contiguous() : x.to(at::kFloat).contiguous();
  const int64_t n = xc.size(0), V = xc.size(1);
  TORCH_CHECK(k >= 1 && k <= V, "k must be in [1, V]");
  auto probs = torch::empty({n, k}, xc.options());
  auto index = torch::empty({n, k}, xc.options().dtype(at::kLong));
  std::vector<float> vals(k);
  for (int64_t r = 0; r < n; ++r)
    warp_row(xc.data_ptr<float>() + r * V, V, k, (float)temperature, top_p, vals.data(), index.data_ptr<int64_t>() + r * k,
             probs.data_ptr<float>() + r * k);
  return {index, probs};
}

// The inverse-CDF draw of sample_sparse on raw arrays (ids distinct).
int64_t sample_row(const int64_t* id, const float* pr, int64_t k, double u) {
  std::vector<int64_t> order(k);
  for (int64_t i = 0; i < k; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
  std::vector<double> cdf(k);
  double acc = 0.0;
  for (int64_t i = 0; i < k; ++i) cdf[i] = (acc += (double)pr[order[i]]);
  TORCH_CHECK_VALUE(acc > 0, "cannot sample from a row with no probability mass");
  const double target = u * acc;
  int64_t pos = std::upper_bound(cdf.begin(), cdf.end(), target) - cdf.begin();  // first cdf > target
  pos = std::min(pos, k - 1);
  return id[order[pos]];
}

// One draw from the row whose only non-zero entries are probs [k] at index [k] (distinct ids), given a uniform
// u in [0, 1): the inverse CDF in increasing id order, summed in float64 (the draw ``sample`` makes on the dense
// row with the same u). Returns the id as a 0-d int64 tensor.
torch::Tensor sample_sparse(torch::Tensor index, torch::Tensor probs, double u) {
  TORCH_CHECK(index.dim() == 1 && probs.dim() == 1 && index.numel() == probs.numel() && index.numel() > 0, "index and probs must be [k], k >= 1");
  TORCH_CHECK(index.scalar_type() == at::kLong && probs.scalar_type() == at::kFloat, "index int64, probs float32");
  auto ic = index.contiguous();
  auto pc = probs.contiguous();
  return at::scalar_tensor(sample_row(ic.data_ptr<int64_t>(), pc.data_ptr<float>(), ic.numel(), u), ic.options());
}

// One linear layer in the kernels' form (tests and the bench compare it with F.linear): x [..., in] bf16, P = pack(w).
torch::Tensor linear(torch::Tensor x, torch::Tensor P, int64_t out) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && P.scalar_type() == at::kBFloat16, "bf16 only");
  auto xc = x.contiguous();
  const int64_t in = x.size(-1), n = xc.numel() / in;
  TORCH_CHECK(P.numel() == packed_numel(out, in), "P is not pack(w) of a [", out, ", ", in, "] weight");
  auto y = torch::empty({n, out}, x.options().dtype(at::kFloat));
  gemv(xc.data_ptr<bf16>(), n, P.data_ptr<bf16>(), in, out, y.data_ptr<float>());
  auto shape = x.sizes().vec();
  shape.back() = out;
  return y.to(at::kBFloat16).reshape(shape);
}

// All decoder layers for n rows after a cache of `start` positions, then the final norm on the last `keep` rows.
// x: [n, hidden] bf16 (embedded); cos/sin: [n, head_dim] bf16; per layer 9 tensors
// (ln1 [H], pack(wqkv [(h+2kv)d, H]), bqkv or empty, pack(wo [H, h d]), ln2 [H], pack(wgu [2I, H]), pack(wd [H, I]), k cache, v cache
// [kv_heads, cap, d] views of the preallocated buffers); allowed: [n, start+n] bool or empty (causal).
// Returns the normed hidden rows [keep, H] (bf16); the caller applies the LM head.
namespace {
// decoder_forward's work; with `taps` (layer indices), `tapped` [n, taps * hidden] receives the input of each of
// those layers (the residual stream before it, as transformers' hooks on the layers see it), in the taps' order.
torch::Tensor decoder_run(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, const std::vector<torch::Tensor>& layers,
                          int64_t start, const torch::Tensor& allowed, const torch::Tensor& final_norm, int64_t heads, int64_t kv_heads,
                          int64_t head_dim, int64_t inter, double eps, double final_eps, double scale, int64_t keep,
                          const std::vector<int64_t>& taps, torch::Tensor* tapped) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "x must be [n, hidden] bf16");
  TORCH_CHECK(layers.size() % 9 == 0, "9 tensors per layer");
  const int64_t n = x.size(0), H = x.size(1);
  TORCH_CHECK(n > 0, "decoder_forward needs at least one row");
  const int64_t num_layers = (int64_t)layers.size() / 9, width = (int64_t)taps.size() * H;
  for (int64_t t : taps) TORCH_CHECK(t >= 0 && t < num_layers, "a tapped layer index is outside 0 .. layers - 1");
  if (tapped != nullptr) *tapped = torch::empty({n, width}, x.options());
  Dims dm{H, heads, kv_heads, head_dim, 0, (float)eps, (float)scale};
  const int64_t qd = heads * head_dim, kvd = kv_heads * head_dim, qkv = qd + 2 * kvd;
  auto opts = x.options();
  auto hidden = x.contiguous().clone();
  auto h = torch::empty({n, H}, opts);
  auto qkv_f = torch::empty({n, qkv}, opts.dtype(at::kFloat));
  auto qkv_b = torch::empty({n, qkv}, opts);
  auto att = torch::empty({n, qd}, opts);
  auto out_f = torch::empty({n, std::max<int64_t>(H, 1)}, opts.dtype(at::kFloat));
  auto q = torch::empty({n, qd}, opts);
  auto gu_f = torch::empty({n, 2 * inter}, opts.dtype(at::kFloat));
  auto act = torch::empty({n, inter}, opts);
  const bool* allowed_p = nullptr;
  torch::Tensor allowed_c;
  if (allowed.defined() && allowed.numel() > 0) {
    allowed_c = allowed.to(at::kBool).contiguous();
    TORCH_CHECK(allowed_c.size(0) == n && allowed_c.size(1) == start + n, "allowed must be [n, start + n]");
    allowed_p = allowed_c.data_ptr<bool>();
  }
  auto cos_c = cos.contiguous(), sin_c = sin.contiguous();
  bf16* hp = hidden.data_ptr<bf16>();
  for (size_t l = 0; l < layers.size(); l += 9) {
    for (size_t j = 0; j < taps.size(); ++j)
      if (tapped != nullptr && taps[j] == (int64_t)(l / 9))
        for (int64_t r = 0; r < n; ++r) std::memcpy(tapped->data_ptr<bf16>() + r * width + j * H, hp + r * H, H * sizeof(bf16));
    auto& ln1 = layers[l];
    auto& wqkv = layers[l + 1];
    auto& bqkv = layers[l + 2];
    auto& wo = layers[l + 3];
    auto& ln2 = layers[l + 4];
    auto& wgu = layers[l + 5];
    auto& wd = layers[l + 6];
    auto& kc = layers[l + 7];
    auto& vc = layers[l + 8];
    const int64_t cap = kc.size(1);
    TORCH_CHECK(wqkv.numel() == packed_numel(qkv, H) && wo.numel() == packed_numel(H, qd) && wgu.numel() == packed_numel(2 * inter, H) &&
                    wd.numel() == packed_numel(H, inter),
                "layer ", l / 9, ": packed weights do not match the dimensions");
    TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous(), "cache buffers must be contiguous");
    TORCH_CHECK(start + n <= cap, "cache capacity exceeded: reserve before the call");
    // attention block
    rms_norm(hp, n, H, ln1.data_ptr<bf16>(), dm.eps, h.data_ptr<bf16>());
    gemv(h.data_ptr<bf16>(), n, wqkv.data_ptr<bf16>(), H, qkv, qkv_f.data_ptr<float>());
    {
      float* f = qkv_f.data_ptr<float>();
      bf16* b = qkv_b.data_ptr<bf16>();
      const bf16* bias = (bqkv.defined() && bqkv.numel() > 0) ? bqkv.data_ptr<bf16>() : nullptr;
      for (int64_t i = 0; i < n * qkv; ++i) {
        // F.linear with bias: fp32 accumulation plus the bias, rounded once
        b[i] = to_b(bias ? f[i] + to_f(bias[i % qkv]) : f[i]);
      }
    }
    bf16* qb = qkv_b.data_ptr<bf16>();
    rotary(qb, n, heads, head_dim, cos_c.data_ptr<bf16>(), sin_c.data_ptr<bf16>(), qkv);
    rotary(qb + qd, n, kv_heads, head_dim, cos_c.data_ptr<bf16>(), sin_c.data_ptr<bf16>(), qkv);
    bf16* kp = kc.data_ptr<bf16>();
    bf16* vp = vc.data_ptr<bf16>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < kv_heads; ++g) {
        std::memcpy(kp + (g * cap + start + r) * head_dim, qb + r * qkv + qd + g * head_dim, head_dim * sizeof(bf16));
        std::memcpy(vp + (g * cap + start + r) * head_dim, qb + r * qkv + qd + kvd + g * head_dim, head_dim * sizeof(bf16));
      }
    // queries: a contiguous copy [n][heads*d]
    for (int64_t r = 0; r < n; ++r) std::memcpy(q.data_ptr<bf16>() + r * qd, qb + r * qkv, qd * sizeof(bf16));
    attention(q.data_ptr<bf16>(), n, kp, vp, cap, start, allowed_p, dm, att.data_ptr<bf16>());
    gemv(att.data_ptr<bf16>(), n, wo.data_ptr<bf16>(), qd, H, out_f.data_ptr<float>());
    {
      const float* f = out_f.data_ptr<float>();
      for (int64_t i = 0; i < n * H; ++i) hp[i] = to_b(to_f(hp[i]) + round_b(f[i]));
    }
    // MLP block: down(silu(gate) * up)
    rms_norm(hp, n, H, ln2.data_ptr<bf16>(), dm.eps, h.data_ptr<bf16>());
    gemv(h.data_ptr<bf16>(), n, wgu.data_ptr<bf16>(), H, 2 * inter, gu_f.data_ptr<float>());
    {
      const float* f = gu_f.data_ptr<float>();
      bf16* a = act.data_ptr<bf16>();
      // silu(gate) * up as transformers' bf16 modules round it; the same per element whatever the rows
      const __m512 one = _mm512_set1_ps(1.f);
      for (int64_t r = 0; r < n; ++r) {
        const float* fg = f + r * 2 * inter;
        int64_t i = 0;
        alignas(64) float buf[16];
        for (; i + 16 <= inter; i += 16) {
          __m512 g = round_b_ps(_mm512_loadu_ps(fg + i));
          __m512 u = round_b_ps(_mm512_loadu_ps(fg + inter + i));
          __m512 sg = round_b_ps(_mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
          _mm512_store_ps(buf, _mm512_mul_ps(sg, u));
          for (int j = 0; j < 16; ++j) a[r * inter + i + j] = to_b(buf[j]);
        }
        for (; i < inter; ++i) {
          float g = round_b(fg[i]);
          float u = round_b(fg[inter + i]);
          float sg = round_b(g / (1.f + exp1(-g)));
          a[r * inter + i] = to_b(sg * u);
        }
      }
    }
    gemv(act.data_ptr<bf16>(), n, wd.data_ptr<bf16>(), inter, H, out_f.data_ptr<float>());
    {
      const float* f = out_f.data_ptr<float>();
      for (int64_t i = 0; i < n * H; ++i) hp[i] = to_b(to_f(hp[i]) + round_b(f[i]));
    }
  }
  const int64_t k = keep > 0 ? std::min(keep, n) : n;
  auto y = torch::empty({k, H}, opts);
  rms_norm(hp + (n - k) * H, k, H, final_norm.data_ptr<bf16>(), (float)final_eps, y.data_ptr<bf16>());
  return y;
}
}  // namespace

torch::Tensor decoder_forward(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> layers, int64_t start,
                              torch::Tensor allowed, torch::Tensor final_norm, int64_t heads, int64_t kv_heads, int64_t head_dim,
                              int64_t inter, double eps, double final_eps, double scale, int64_t keep) {
  return decoder_run(x, cos, sin, layers, start, allowed, final_norm, heads, kv_heads, head_dim, inter, eps, final_eps, scale, keep, {},
                     nullptr);
}

// decoder_forward and the inputs of the layers `taps` (EAGLE-3 reads three of them): (y, tapped [n, taps * hidden]).
std::vector<torch::Tensor> decoder_forward_taps(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> layers,
                                                int64_t start, torch::Tensor allowed, torch::Tensor final_norm, int64_t heads,
                                                int64_t kv_heads, int64_t head_dim, int64_t inter, double eps, double final_eps, double scale,
                                                int64_t keep, std::vector<int64_t> taps) {
  torch::Tensor tapped;
  auto y = decoder_run(x, cos, sin, layers, start, allowed, final_norm, heads, kv_heads, head_dim, inter, eps, final_eps, scale, keep, taps,
                       &tapped);
  return {y, tapped};
}

// A draft chain in one call (the draft side of spd/block/typical on a CPU): feeds `ids` [n0] (the context tokens
// after the cache, usually 1) then every drawn token but the last, `gamma` forwards in all, each followed by the
// head, the warp (top-k, temperature, top-p) and a draw with a uniform from `gen` (at::rand [1, 1] float64: the
// stream and order of torch.rand in sample_sparse). Ids go through `token_map` (own head id -> target id; empty:
// identity) before the draw, so the draw is sample_sparse's on the target ids; logits past `vocab` are ignored.
// The rows are bit-identical to the separate calls (decoder_forward, linear rounded to bf16, warp_topk,
// sample_sparse). Writes the KV rows start .. start + n0 + gamma - 2 (the caller advances the cache).
// Returns (tokens [gamma], index [gamma, k] target ids, probs [gamma, k]).
std::vector<torch::Tensor> draft_chain(torch::Tensor ids, torch::Tensor embed, torch::Tensor cos_table, torch::Tensor sin_table,
                                       std::vector<torch::Tensor> layers, int64_t start, torch::Tensor final_norm, int64_t heads,
                                       int64_t kv_heads, int64_t head_dim, int64_t inter, double eps, double final_eps, double scale,
                                       torch::Tensor head, int64_t head_out, int64_t vocab, torch::Tensor token_map, int64_t gamma,
                                       int64_t k, double temperature, double top_p, c10::optional<at::Generator> gen) {
  TORCH_CHECK(ids.dim() == 1 && ids.numel() >= 1 && ids.scalar_type() == at::kLong, "ids must be [n0] int64, n0 >= 1");
  TORCH_CHECK(embed.dim() == 2 && embed.scalar_type() == at::kBFloat16, "embed must be [V, hidden] bf16");
  TORCH_CHECK(gamma >= 1 && temperature > 0, "gamma >= 1 and temperature > 0");
  const int64_t H = embed.size(1), n0 = ids.numel(), end = start + n0 + gamma - 1;
  TORCH_CHECK(cos_table.size(0) >= end && sin_table.size(0) >= end, "the rotary table must cover the chain's positions");
  const bool mapped = token_map.defined() && token_map.numel() > 0;
  const int64_t V = mapped ? std::min<int64_t>(head_out, token_map.numel()) : std::min<int64_t>(head_out, vocab);
  TORCH_CHECK(k >= 1 && k <= V, "k must be in [1, V]");
  auto map_c = mapped ? token_map.to(at::kLong).contiguous() : token_map;
  const int64_t* map = mapped ? map_c.data_ptr<int64_t>() : nullptr;
  auto lopts = ids.options();
  auto tokens = torch::empty({gamma}, lopts);
  auto index = torch::empty({gamma, k}, lopts);
  auto probs = torch::empty({gamma, k}, lopts.dtype(at::kFloat));
  auto logits_f = torch::empty({1, head_out}, lopts.dtype(at::kFloat));
  std::vector<float> row(head_out), vals(k);
  auto ec = embed.contiguous();
  auto ids_c = ids.contiguous();
  std::vector<int64_t> feed(ids_c.data_ptr<int64_t>(), ids_c.data_ptr<int64_t>() + n0);
  const auto dopts = at::TensorOptions().dtype(at::kDouble);
  int64_t pos = start;
  for (int64_t step = 0; step < gamma; ++step) {
    const int64_t n = (int64_t)feed.size();
    auto x = torch::empty({n, H}, ec.options());
    for (int64_t r = 0; r < n; ++r) {
      TORCH_CHECK(feed[r] >= 0 && feed[r] < ec.size(0), "token id outside the embedding");
      std::memcpy(x.data_ptr<bf16>() + r * H, ec.data_ptr<bf16>() + feed[r] * H, H * sizeof(bf16));
    }
    auto h = decoder_forward(x, cos_table.narrow(0, pos, n), sin_table.narrow(0, pos, n), layers, pos, torch::Tensor(), final_norm, heads,
                             kv_heads, head_dim, inter, eps, final_eps, scale, 1);
    gemv(h.data_ptr<bf16>(), 1, head.data_ptr<bf16>(), H, head_out, logits_f.data_ptr<float>());
    const float* lf = logits_f.data_ptr<float>();
    for (int64_t i = 0; i < V; ++i) row[i] = round_b(lf[i]);  // linear's bf16 output, as a float row
    int64_t* idx = index.data_ptr<int64_t>() + step * k;
    float* p = probs.data_ptr<float>() + step * k;
    warp_row(row.data(), V, k, (float)temperature, top_p, vals.data(), idx, p);
    if (mapped)
      for (int64_t i = 0; i < k; ++i) idx[i] = map[idx[i]];
    const double u = at::rand({1, 1}, gen, dopts).item<double>();
    const int64_t t = sample_row(idx, p, k, u);
    tokens.data_ptr<int64_t>()[step] = t;
    pos += n;
    feed.assign(1, t);
  }
  return {tokens, index, probs};
}

// Chain verification with the target rows given by their non-zero entries (pipeline/decoding/verification.py,
// token_verify_sparse and block_verify_sparse: the same rules, in one call instead of ~15-25 small tensor ops).
// P_index, P_probs [g+1, k] (int64, float32): row i of the warped target is P_probs[i] at P_index[i], 0 elsewhere;
// Q [g, V] float32 the warped draft rows; x [g] int64 the draft tokens; u [g] float32 the uniforms.
// Both return (n, index [k], weights [k]): n drafts kept, the next token drawn from weights over index.
namespace {
struct ChainRows {
  int64_t g, k, V;
  const int64_t* pi;
  const float* pp;
  const float* q;
  const int64_t* x;
  const float* u;
  torch::Tensor keep[5];  // contiguous copies alive for the pointers
};

ChainRows chain_rows(torch::Tensor P_index, torch::Tensor P_probs, torch::Tensor Q, torch::Tensor x, torch::Tensor u) {
  TORCH_CHECK(P_index.dim() == 2 && P_probs.sizes() == P_index.sizes() && P_index.scalar_type() == at::kLong && P_probs.scalar_type() == at::kFloat,
              "P_index int64 and P_probs float32, both [g+1, k]");
  const int64_t g = x.numel();
  TORCH_CHECK(P_index.size(0) == g + 1 && Q.dim() == 2 && Q.size(0) >= g && Q.scalar_type() == at::kFloat, "Q must be float32 [g, V] and P [g+1, k]");
  TORCH_CHECK(x.scalar_type() == at::kLong && u.scalar_type() == at::kFloat && u.numel() == g, "x int64 [g], u float32 [g]");
  ChainRows c;
  c.keep[0] = P_index.contiguous();
  c.keep[1] = P_probs.contiguous();
  c.keep[2] = Q.contiguous();
  c.keep[3] = x.contiguous();
  c.keep[4] = u.contiguous();
  c.g = g;
  c.k = P_index.size(1);
  c.V = Q.size(1);
  c.pi = c.keep[0].data_ptr<int64_t>();
  c.pp = c.keep[1].data_ptr<float>();
  c.q = c.keep[2].data_ptr<float>();
  c.x = c.keep[3].data_ptr<int64_t>();
  c.u = c.keep[4].data_ptr<float>();
  for (int64_t i = 0; i < g; ++i) TORCH_CHECK(c.x[i] >= 0 && c.x[i] < c.V, "a draft token is outside Q's vocabulary");
  for (int64_t i = 0; i < (g + 1) * c.k; ++i) TORCH_CHECK(c.pi[i] >= 0 && c.pi[i] < c.V, "an id of P_index is outside Q's vocabulary");
  return c;
}

// P[i, x_i]: the entry of row i at x_i (0 off its support)
inline float p_at(const ChainRows& c, int64_t i) {
  float s = 0.f;
  for (int64_t j = 0; j < c.k; ++j)
    if (c.pi[i * c.k + j] == c.x[i]) s += c.pp[i * c.k + j];
  return s;
}

// (n, index, weights) for residual row `row` of k values (weights = residual, or P's row `n` when it has no mass)
std::vector<torch::Tensor> chain_result(const ChainRows& c, int64_t n, const float* residual) {
  auto index = torch::empty({c.k}, c.keep[0].options());
  auto weights = torch::empty({c.k}, c.keep[1].options());
  float total = 0.f;
  for (int64_t j = 0; j < c.k; ++j) total += residual[j];
  const float* w = total > 0 ? residual : c.pp + n * c.k;
  std::memcpy(index.data_ptr<int64_t>(), c.pi + n * c.k, c.k * sizeof(int64_t));
  std::memcpy(weights.data_ptr<float>(), w, c.k * sizeof(float));
  return {at::scalar_tensor(n, c.keep[0].options()), index, weights};
}
}  // namespace

// Token verification: accept x_i while u_i * (lenience * q(x_i)) <= p(x_i); the residual relu(P[n] - Q[n]) on
// P[n]'s support (the bonus row P[g] when all passed).
std::vector<torch::Tensor> token_verify_sparse(torch::Tensor P_index, torch::Tensor P_probs, torch::Tensor Q, torch::Tensor x,
                                               torch::Tensor u, double lenience) {
  const ChainRows c = chain_rows(P_index, P_probs, Q, x, u);
  const float l = (float)lenience;
  int64_t n = 0;
  while (n < c.g && c.u[n] * (l * c.q[n * c.V + c.x[n]]) <= p_at(c, n)) ++n;
  std::vector<float> residual(c.k);
  for (int64_t j = 0; j < c.k; ++j) {
    const float qn = n < c.g ? c.q[n * c.V + c.pi[n * c.k + j]] : 0.f;
    residual[j] = std::max(c.pp[n * c.k + j] - qn, 0.f);
  }
  return chain_result(c, n, residual.data());
}

// Block verification (Sun et al., Algorithm 2, in log space): pi_i = min(1, pi_{i-1} p(x_i)/q(x_i)),
// R_i = relu(pi_i P[i] - Q[i]) (Q[g] := 0), h_i = Z_i / (Z_i + 1 - pi_i); tau = the longest i with eta_i <= h_i.
std::vector<torch::Tensor> block_verify_sparse(torch::Tensor P_index, torch::Tensor P_probs, torch::Tensor Q, torch::Tensor x,
                                               torch::Tensor eta) {
  const ChainRows c = chain_rows(P_index, P_probs, Q, x, eta);
  const int64_t g = c.g, k = c.k;
  std::vector<float> pi(g + 1), R((g + 1) * k);
  double S = 0.0;
  float Smax = 0.f;
  pi[0] = 1.f;
  for (int64_t i = 0; i < g; ++i) {
    S += (double)(std::log(p_at(c, i)) - std::log(c.q[i * c.V + c.x[i]]));
    const float Si = (float)S;
    Smax = std::max(Smax, Si);
    pi[i + 1] = std::exp(Si - Smax);
  }
  int64_t tau = 0;
  for (int64_t i = 0; i <= g; ++i) {
    float Z = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const float qv = i < g ? c.q[i * c.V + c.pi[i * k + j]] : 0.f;
      R[i * k + j] = std::max(pi[i] * c.pp[i * k + j] - qv, 0.f);
      Z += R[i * k + j];
    }
    if (i == 0) continue;
    const float den = Z + (1.f - pi[i]);
    const float h = den > 0 ? Z / std::max(den, std::numeric_limits<float>::min()) : 1.f;
    if (c.u[i - 1] <= h) tau = i;
  }
  return chain_result(c, tau, R.data() + tau * k);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "a [out, in] weight in the kernels' packed layout");
  m.def("linear", &linear, "bf16 x @ w^T for a few rows (batch-invariant), w packed");
  m.def("warp_topk", &warp_topk, "top-k, temperature and top-p of float32/bf16 rows: (index [n, k], probs [n, k])");
  m.def("sample_sparse", &sample_sparse, "one id from a sparse row (index, probs) given a uniform u: the dense inverse CDF's draw");
  m.def("token_verify_sparse", &token_verify_sparse, "token verification of a chain on sparse target rows: (n, index, weights)");
  m.def("block_verify_sparse", &block_verify_sparse, "block verification of a chain on sparse target rows: (tau, index, weights)");
  m.def("draft_chain", &draft_chain, "gamma draft tokens sampled from the warped draft in one call: (tokens, index, probs)");
  m.def("exp", &exp_ps, "the kernels' vectorised exp (float32)");
  m.def("decoder_forward", &decoder_forward, "all decoder layers of a Llama-family model for a few rows");
  m.def("decoder_forward_taps", &decoder_forward_taps, "decoder_forward and the inputs of some layers: (y, tapped [n, taps * hidden])");
}
