// Batch-1 bf16 decoder kernels for CPUs with AVX512_BF16 (pipeline/decoding/cpu_kernels.py builds and loads this).
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

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

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

// Y[n][out] (fp32) = X[n][in] W[out][in]^T with W packed; blocks split over threads (small weights, under
// ~1 MB, on one thread: the fork/join costs more than the work).
void gemv(const bf16* X, int64_t n, const bf16* P, int64_t in, int64_t out, float* Y) {
  if (n <= 0) return;
  const int64_t blocks = (out + OB - 1) / OB;
  const int64_t work = in * OB * 2 * ((n + RG - 1) / RG);  // bytes of weights streamed per block, times the row tiles
  const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 19) / std::max<int64_t>(work, 1));
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

// The k largest entries of every row of x [n, V] (float32), in descending order: (values [n, k], indices [n, k]).
// Among equal values the lower index comes first (deterministic). One pass per row: 16 entries at a time
// are compared with the current k-th largest, and only those above it enter the sorted list of k.
std::vector<torch::Tensor> topk(torch::Tensor x, int64_t k) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x must be [n, V] float32");
  auto xc = x.contiguous();
  const int64_t n = xc.size(0), V = xc.size(1);
  TORCH_CHECK(k >= 1 && k <= V, "k must be in [1, V]");
  auto values = torch::empty({n, k}, xc.options());
  auto index = torch::empty({n, k}, xc.options().dtype(at::kLong));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = xc.data_ptr<float>() + r * V;
    float* vals = values.data_ptr<float>() + r * k;
    int64_t* idx = index.data_ptr<int64_t>() + r * k;
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
    TORCH_CHECK(have == k, "a row has fewer than k non-NaN values");
  }
  return {values, index};
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
torch::Tensor decoder_forward(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> layers, int64_t start,
                              torch::Tensor allowed, torch::Tensor final_norm, int64_t heads, int64_t kv_heads, int64_t head_dim,
                              int64_t inter, double eps, double final_eps, double scale, int64_t keep) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "x must be [n, hidden] bf16");
  TORCH_CHECK(layers.size() % 9 == 0, "9 tensors per layer");
  const int64_t n = x.size(0), H = x.size(1);
  TORCH_CHECK(n > 0, "decoder_forward needs at least one row");
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "a [out, in] weight in the kernels' packed layout");
  m.def("linear", &linear, "bf16 x @ w^T for a few rows (batch-invariant), w packed");
  m.def("topk", &topk, "the k largest entries of each float32 row, descending (ties: lower index first)");
  m.def("exp", &exp_ps, "the kernels' vectorised exp (float32)");
  m.def("decoder_forward", &decoder_forward, "all decoder layers of a Llama-family model for a few rows");
}
