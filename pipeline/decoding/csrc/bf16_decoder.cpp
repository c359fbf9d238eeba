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
#include <vector>

using bf16 = at::BFloat16;

namespace {

inline float to_f(bf16 v) { return static_cast<float>(v); }
inline bf16 to_b(float v) { return bf16(v); }  // round to nearest even (c10)
inline float round_b(float v) { return static_cast<float>(bf16(v)); }

inline __m512bh load_bh(const bf16* p) { return (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(p)); }
inline __m512bh load_bh_tail(const bf16* p, __mmask32 m) { return (__m512bh)_mm512_maskz_loadu_epi16(m, reinterpret_cast<const void*>(p)); }

// Weights are packed once per model into blocks of 4 output rows: P[out/4][in/32][4][32] (zero padded), so a
// block is one sequential stream and each 32-wide chunk of a row is one cache line.
constexpr int RB = 4;
constexpr int KC = 32;

inline int64_t packed_numel(int64_t out, int64_t in) { return ((out + RB - 1) / RB) * ((in + KC - 1) / KC) * RB * KC; }

// acc[r][j] = x[r] . w[j] for rows [j0, j0 + R) of one packed block and N input rows. The chunk order and the
// final reduction do not depend on N, R or j0 (batch invariance).
template <int N, int R>
inline void dot_block(const bf16* const* x, const bf16* block, int64_t in, int j0, float* out /*[N][R]*/) {
  __m512 acc[N][R];
  for (int r = 0; r < N; ++r)
    for (int j = 0; j < R; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t full = in / KC;
  for (int64_t c = 0; c < full; ++c) {
    const bf16* wc = block + c * RB * KC + j0 * KC;
    __m512bh wv[R];
    for (int j = 0; j < R; ++j) wv[j] = load_bh(wc + j * KC);
    for (int r = 0; r < N; ++r) {
      __m512bh xv = load_bh(x[r] + c * KC);
      for (int j = 0; j < R; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, wv[j]);
    }
  }
  if (full * KC < in) {  // the last, partial chunk (the packed weight is zero padded)
    const int64_t k = full * KC;
    const __mmask32 m = (__mmask32)((1ull << (in - k)) - 1);
    const bf16* wc = block + full * RB * KC + j0 * KC;
    __m512bh wv[R];
    for (int j = 0; j < R; ++j) wv[j] = load_bh(wc + j * KC);
    for (int r = 0; r < N; ++r) {
      __m512bh xv = load_bh_tail(x[r] + k, m);
      for (int j = 0; j < R; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, wv[j]);
    }
  }
  for (int r = 0; r < N; ++r)
    for (int j = 0; j < R; ++j) out[r * R + j] = _mm512_reduce_add_ps(acc[r][j]);
}

// y[r][o] (fp32) for the packed blocks [b0, b1): per block, the rows in balanced groups of up to 6 (4 x 6
// accumulators fill the 32 vector registers; VDPBF16PS and its loads, not memory, limit larger groups), the
// block read from memory once and from L1 for the later groups.
template <int N>
inline void block_rows(const bf16* const* x, const bf16* block, int64_t in, int64_t o0, int64_t out, float* const* y) {
  float tmp[N * RB];
  dot_block<N, RB>(x, block, in, 0, tmp);
  for (int j = 0; j < RB && o0 + j < out; ++j)
    for (int r = 0; r < N; ++r) y[r][o0 + j] = tmp[r * RB + j];
}

void gemv_blocks(int n, const bf16* const* x, const bf16* P, int64_t in, int64_t out, int64_t b0, int64_t b1, float* const* y) {
  const int64_t bstride = ((in + KC - 1) / KC) * RB * KC;
  for (int64_t b = b0; b < b1; ++b) {
    const bf16* block = P + b * bstride;
    const int groups = (n + 5) / 6, size = (n + groups - 1) / groups;
    for (int r0 = 0; r0 < n; r0 += size) {
      switch (std::min(size, n - r0)) {
        case 1: block_rows<1>(x + r0, block, in, b * RB, out, y + r0); break;
        case 2: block_rows<2>(x + r0, block, in, b * RB, out, y + r0); break;
        case 3: block_rows<3>(x + r0, block, in, b * RB, out, y + r0); break;
        case 4: block_rows<4>(x + r0, block, in, b * RB, out, y + r0); break;
        case 5: block_rows<5>(x + r0, block, in, b * RB, out, y + r0); break;
        default: block_rows<6>(x + r0, block, in, b * RB, out, y + r0); break;
      }
    }
  }
}

// Y[n][out] (fp32) = X[n][in] W[out][in]^T with W packed; rows in groups of 32, blocks split over threads.
// Small weights (< ~1 MB) run on one thread: the fork/join costs more than the work.
void gemv(const bf16* X, int64_t n, const bf16* P, int64_t in, int64_t out, float* Y) {
  const int64_t blocks = (out + RB - 1) / RB;
  const int64_t grain = std::max<int64_t>(16, (int64_t)(1 << 19) / std::max<int64_t>(in * RB, 1));
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t r0 = 0; r0 < n; r0 += 32) {
      int g = (int)std::min<int64_t>(32, n - r0);
      const bf16* xr[32];
      float* yr[32];
      for (int r = 0; r < g; ++r) {
        xr[r] = X + (r0 + r) * in;
        yr[r] = Y + (r0 + r) * out;
      }
      gemv_blocks(g, xr, P, in, out, b, e, yr);
    }
  };
  if (blocks <= grain) {
    body(0, blocks);
  } else {
    at::parallel_for(0, blocks, grain, body);
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

// Attention of n query rows at positions start..start+n-1 over the cache [0, start+n) of one layer.
// q: [n][heads*d] (bf16, rotated), caches [kv_heads][cap][d]; allowed: [n][start+n] or null (causal).
void attention(const bf16* q, int64_t n, const bf16* kc, const bf16* vc, int64_t cap, int64_t start, const bool* allowed,
               const Dims& dm, bf16* out /*[n][heads*d]*/) {
  const int64_t d = dm.head_dim, total = start + n, groups = dm.heads / dm.kv_heads;
  // a few heads over a short context are less work than waking a second thread
  const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 17) / std::max<int64_t>(total * d, 1));
  at::parallel_for(0, dm.heads * n, grain, [&](int64_t b, int64_t e) {
    std::vector<float> p(total), acc(d);
    for (int64_t t = b; t < e; ++t) {
      int64_t hh = t / n, r = t % n, kvh = hh / groups;
      const bf16* qr = q + r * dm.heads * d + hh * d;
      const bf16* K = kc + kvh * cap * d;
      const bf16* V = vc + kvh * cap * d;
      const int64_t last = start + r;  // causal: keys 0..last
      float mx = -INFINITY;
      for (int64_t j = 0; j < total; ++j) {
        bool ok = allowed ? allowed[r * total + j] : (j <= last);
        if (!ok) {
          p[j] = -INFINITY;
          continue;
        }
        const bf16* kj = K + j * d;
        float s = 0.f;
        for (int64_t i = 0; i < d; ++i) s += to_f(qr[i]) * to_f(kj[i]);
        s *= dm.scale;
        p[j] = s;
        mx = std::max(mx, s);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < total; ++j) {
        float v = (p[j] == -INFINITY) ? 0.f : std::exp(p[j] - mx);
        p[j] = v;
        sum += v;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < total; ++j) {
        if (p[j] == 0.f) continue;
        const bf16* vj = V + j * d;
        float pj = p[j];
        for (int64_t i = 0; i < d; ++i) acc[i] += pj * to_f(vj[i]);
      }
      float inv = 1.f / sum;
      bf16* o = out + r * dm.heads * d + hh * d;
      for (int64_t i = 0; i < d; ++i) o[i] = to_b(acc[i] * inv);
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
  const int64_t out = wc.size(0), in = wc.size(1), chunks = (in + KC - 1) / KC;
  auto P = torch::zeros({packed_numel(out, in)}, wc.options());
  const bf16* src = wc.data_ptr<bf16>();
  bf16* dst = P.data_ptr<bf16>();
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k = c * KC, len = std::min<int64_t>(KC, in - k);
      std::memcpy(dst + ((o / RB) * chunks + c) * RB * KC + (o % RB) * KC, src + o * in + k, len * sizeof(bf16));
    }
  return P;
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
  Dims dm{H, heads, kv_heads, head_dim, 0, (float)eps, (float)scale};
  const int64_t qd = heads * head_dim, kvd = kv_heads * head_dim, qkv = qd + 2 * kvd;
  auto opts = x.options();
  auto hidden = x.contiguous().clone();
  auto h = torch::empty({n, H}, opts);
  auto qkv_f = torch::empty({n, qkv}, opts.dtype(at::kFloat));
  auto qkv_b = torch::empty({n, qkv}, opts);
  auto att = torch::empty({n, qd}, opts);
  auto out_f = torch::empty({n, std::max<int64_t>(H, 1)}, opts.dtype(at::kFloat));
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
    auto q = torch::empty({n, qd}, opts);
    for (int64_t r = 0; r < n; ++r) std::memcpy(q.data_ptr<bf16>() + r * qd, qb + r * qkv, qd * sizeof(bf16));
    attention(q.data_ptr<bf16>(), n, kp, vp, cap, start, allowed_p, dm, att.data_ptr<bf16>());
    gemv(att.data_ptr<bf16>(), n, wo.data_ptr<bf16>(), qd, H, out_f.data_ptr<float>());
    {
      const float* f = out_f.data_ptr<float>();
      for (int64_t i = 0; i < n * H; ++i) hp[i] = to_b(to_f(hp[i]) + round_b(f[i]));
    }
    // MLP block: down(silu(gate) * up)
    rms_norm(hp, n, H, ln2.data_ptr<bf16>(), dm.eps, h.data_ptr<bf16>());
    auto gu_f = torch::empty({n, 2 * inter}, opts.dtype(at::kFloat));
    gemv(h.data_ptr<bf16>(), n, wgu.data_ptr<bf16>(), H, 2 * inter, gu_f.data_ptr<float>());
    auto act = torch::empty({n, inter}, opts);
    {
      const float* f = gu_f.data_ptr<float>();
      bf16* a = act.data_ptr<bf16>();
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < inter; ++i) {
          float g = round_b(f[r * 2 * inter + i]);
          float u = round_b(f[r * 2 * inter + inter + i]);
          float s = round_b(g / (1.f + std::exp(-g)));
          a[r * inter + i] = to_b(s * u);
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
  m.def("decoder_forward", &decoder_forward, "all decoder layers of a Llama-family model for a few rows");
}
