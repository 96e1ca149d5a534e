// Prefill attention over the paged KV cache on the CPU: every prefill chunk of an iteration in one
// call, each chunk's queries against its whole context (earlier chunks' tokens and its own), causal
// from the bottom right, keys and values read in place from their cache blocks (no gather).
//
// Why a kernel: torch's CPU flash attention runs cpu-small's heads (d = 64) at 55-63 GFLOP/s in
// float32 on 2 threads, a quarter of the machine's matmul rate, and slower still in bfloat16; and
// it needs each context gathered out of the cache first (benchmarks/RESULTS.md).
//
// How: a work item is one chunk's tile of TILE query tokens against one kv head, with all the query
// heads that share it (grouped-query attention reads each key once for the group). For each cache
// block of 16 keys up to the tile's last visible key it transposes the block's keys to [d][16] so
// that scores are broadcast-FMAs of one query element against 16 keys, keeps an online softmax per
// row, and accumulates probabilities x values four rows at a time so that each value vector loaded
// feeds four FMAs, in cpu_common.h's 16-float vectors. -ffast-math (cpu_build.py) lets the
// exp of the softmax call libmvec's vector exp; masked scores never reach exp (a select writes 0),
// the empty max is -FLT_MAX, and unwritten cache rows are never read, so nothing relies on inf/NaN.
//
// Storage is float32 or bfloat16 (cpu_common.h). The arithmetic is float32, except that bfloat16 on a
// CPU with AVX512_BF16 takes both products through vdpbf16ps (exact bf16 x bf16 products summed in
// float32): keys as pairs [d/2][16][2] so that one instruction adds two elements of q . k for 16 keys,
// values as pairs of keys [8][d][2], and the probabilities rounded to bfloat16 before p x v, as
// torch's CPU flash attention and the GPU kernels round them. Half the multiply-add instructions of
// the float32 path, and keys widened by nobody.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu_common.h"

namespace {

using sarathi::bf16;
using sarathi::load;
using sarathi::vec;
using sarathi::vload;
using sarathi::vstore;
using sarathi::W;  // floats per vector, and keys per softmax step

constexpr int64_t TILE = 64;  // query tokens per work item (32: 0.9-0.97x at 288-1024 keys)

struct Item {
  int64_t seq, kv_head, tile;
};

// The float32 arithmetic, every machine: queries scaled into float32, each block's keys transposed
// to [d][16] so that scores are broadcast-FMAs of one query element against 16 keys, values widened.
template <typename T>
struct Float32Dot {
  int64_t d, dp;
  float scale;
  std::vector<float> qf, kt, vf;
  Float32Dot(int64_t rows_pad, int64_t d, int64_t dp, float scale)
      : d(d), dp(dp), scale(scale), qf(rows_pad * d), kt(d * W), vf(W * dp, 0.f) {}

  // Query row r (null: a padding row).
  void set_query(int64_t r, const T* src) {
    float* dst = qf.data() + r * d;
    for (int64_t j = 0; j < d; ++j) dst[j] = src ? load(src[j]) * scale : 0.f;
  }
  // Key t of the block (null: past the context).
  void set_key(int64_t t, const T* k, const T* v) {
    for (int64_t j = 0; j < d; ++j) {
      kt[j * W + t] = k ? load(k[j]) : 0.f;
      vf[t * dp + j] = v ? load(v[j]) : 0.f;
    }
  }
  // Scores of four rows at a time into p [rows][W]: s_r += q[r][j] * keys^T[j], 16 keys per vector.
  void scores(float* p, int64_t rows) {
    for (int64_t r = 0; r < rows; r += 4) {
      vec s0 = {}, s1 = {}, s2 = {}, s3 = {};
      const float *a0 = qf.data() + r * d, *a1 = a0 + d, *a2 = a1 + d, *a3 = a2 + d;
      for (int64_t j = 0; j < d; ++j) {
        const vec k = vload(kt.data() + j * W);
        s0 += a0[j] * k;
        s1 += a1[j] * k;
        s2 += a2[j] * k;
        s3 += a3[j] * k;
      }
      vstore(p + r * W, s0);
      vstore(p + (r + 1) * W, s1);
      vstore(p + (r + 2) * W, s2);
      vstore(p + (r + 3) * W, s3);
    }
  }
  // acc_r += p_r[t] * values[t], four rows per loaded value vector.
  void accumulate(float* acc, const float* p, int64_t rows, int64_t keys) {
    for (int64_t r = 0; r < rows; r += 4) {
      const float *p0 = p + r * W, *p1 = p0 + W, *p2 = p1 + W, *p3 = p2 + W;
      for (int64_t c = 0; c < dp; c += W) {
        float* base = acc + r * dp + c;
        vec x0 = vload(base), x1 = vload(base + dp), x2 = vload(base + 2 * dp), x3 = vload(base + 3 * dp);
        for (int64_t t = 0; t < keys; ++t) {
          const vec v = vload(vf.data() + t * dp + c);
          x0 += p0[t] * v;
          x1 += p1[t] * v;
          x2 += p2[t] * v;
          x3 += p3[t] * v;
        }
        vstore(base, x0);
        vstore(base + dp, x1);
        vstore(base + 2 * dp, x2);
        vstore(base + 3 * dp, x3);
      }
    }
  }
};

#if defined(__AVX512BF16__)
// bfloat16 through vdpbf16ps (AVX512_BF16): the header says why and how.
struct Bf16Dot {
  int64_t d, dp, half;  // half: element pairs per row, the last one zero-padded where d is odd
  float scale;
  std::vector<uint32_t> qp, kp, pp;  // query pairs [rows_pad][half], key pairs [half][W], p pairs [rows_pad][W/2]
  std::vector<uint16_t> vrows;       // the block's values [W][dp], zero-padded, and W more for the last row's 32-wide loads
  std::vector<uint16_t> vp;          // value pairs [W/2][dp][2]: keys 2u and 2u+1 side by side
  Bf16Dot(int64_t rows_pad, int64_t d, int64_t dp, float scale)
      : d(d), dp(dp), half((d + 1) / 2), scale(scale), qp(rows_pad * half), kp(half * W), pp(rows_pad * W / 2, 0u),
        vrows(W * dp + W, 0), vp(W * dp) {}

  void set_query(int64_t r, const bf16* src) {
    uint32_t* dst = qp.data() + r * half;
    std::fill(dst, dst + half, 0u);
    if (src) std::memcpy(dst, src, d * sizeof(bf16));
  }
  void set_key(int64_t t, const bf16* k, const bf16* v) {
    for (int64_t j = 0; j < half; ++j) {
      uint32_t pair = 0;
      if (k) std::memcpy(&pair, k + 2 * j, (2 * j + 1 < d ? 2 : 1) * sizeof(bf16));
      kp[j * W + t] = pair;
    }
    uint16_t* dst = vrows.data() + t * dp;
    if (v)
      std::memcpy(dst, v, d * sizeof(uint16_t));
    else
      std::fill(dst, dst + d, uint16_t{0});
    if (t % 2 == 1) {
      // Keys t-1 and t side by side: element 2c of a pair vector is key t-1's column c.
      const __m512i order = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                             38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
      for (int64_t c = 0; c < dp; c += W) {
        const __m512i a = _mm512_loadu_si512(dst - dp + c), b = _mm512_loadu_si512(dst + c);
        _mm512_storeu_si512(vp.data() + (t / 2 * dp + c) * 2, _mm512_permutex2var_epi16(a, order, b));
      }
    }
  }
  static __m512bh broadcast(uint32_t pair) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(pair)); }

  // Eight rows at a time (eight independent sums hide vdpbf16ps's latency); rows_pad is a multiple of 8.
  void scores(float* p, int64_t rows) {
    for (int64_t r = 0; r < rows; r += 8) {
      __m512 s[8];
      for (int i = 0; i < 8; ++i) s[i] = _mm512_setzero_ps();
      const uint32_t* q = qp.data() + r * half;
      for (int64_t j = 0; j < half; ++j) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(kp.data() + j * W);
        for (int i = 0; i < 8; ++i) s[i] = _mm512_dpbf16_ps(s[i], k, broadcast(q[i * half + j]));
      }
      for (int i = 0; i < 8; ++i) _mm512_storeu_ps(p + (r + i) * W, _mm512_mul_ps(s[i], _mm512_set1_ps(scale)));
    }
  }

  template <int NC>
  void accumulate_columns(float* acc, int64_t r, int64_t c, int64_t pairs) {
    __m512 x[4][NC];
    for (int i = 0; i < 4; ++i)
      for (int b = 0; b < NC; ++b) x[i][b] = _mm512_loadu_ps(acc + (r + i) * dp + c + b * W);
    for (int64_t u = 0; u < pairs; ++u) {
      __m512bh v[NC];
      for (int b = 0; b < NC; ++b) v[b] = (__m512bh)_mm512_loadu_si512(vp.data() + (u * dp + c + b * W) * 2);
      for (int i = 0; i < 4; ++i) {
        const __m512bh pr = broadcast(pp[(r + i) * (W / 2) + u]);
        for (int b = 0; b < NC; ++b) x[i][b] = _mm512_dpbf16_ps(x[i][b], v[b], pr);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int b = 0; b < NC; ++b) _mm512_storeu_ps(acc + (r + i) * dp + c + b * W, x[i][b]);
  }
  // Four rows by 32 columns per step: eight sums, each pair vector loaded feeds four rows.
  void accumulate(float* acc, const float* p, int64_t rows, int64_t keys) {
    const int64_t rows4 = (rows + 3) / 4 * 4, pairs = (keys + 1) / 2;
    for (int64_t r = 0; r < rows4; ++r)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp.data() + r * (W / 2)),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p + r * W)));
    for (int64_t r = 0; r < rows4; r += 4) {
      int64_t c = 0;
      for (; c + 2 * W <= dp; c += 2 * W) accumulate_columns<2>(acc, r, c, pairs);
      if (c < dp) accumulate_columns<1>(acc, r, c, pairs);
    }
  }
};
#endif

template <typename T>
struct DotFor {
  using type = Float32Dot<T>;
};
#if defined(__AVX512BF16__)
template <>
struct DotFor<bf16> {
  using type = Bf16Dot;
};
#endif

// q [tokens, heads, d] with token stride q_stride (elements; q may sit inside the fused qkv
// output); out [tokens, heads, d] contiguous; caches [blocks, block_size, kv_heads, d] contiguous;
// starts [n + 1] (the chunks' first rows in q), lens [n] (context lengths, this chunk included),
// tables [n, max_blocks]. Accumulators and values are padded to dp, d rounded up to 16 floats.
template <typename T>
void paged_prefill(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables,
                   const int32_t* starts, const int32_t* lens, T* out, int64_t n, int64_t heads, int64_t d,
                   int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
  using Dot = typename DotFor<T>::type;
  const int64_t group = heads / kv_heads, row = kv_heads * d, dp = (d + W - 1) / W * W;
  std::vector<Item> items;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t tiles = (starts[i + 1] - starts[i] + TILE - 1) / TILE;
    // Last tiles first: they see the most keys, and dynamic scheduling balances best that way.
    for (int64_t t = tiles - 1; t >= 0; --t)
      for (int64_t g = 0; g < kv_heads; ++g) items.push_back({i, g, t});
  }
  const int64_t nitems = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(threads) if (threads > 1 && nitems > 1)
  {
    const int64_t rows_max = TILE * group;
    // Rows padded to a multiple of 8 so that the 4- and 8-row loops need no remainder.
    const int64_t rows_pad = (rows_max + 7) / 8 * 8;
    Dot dot(rows_pad, d, dp, scale);
    std::vector<float> acc(rows_pad * dp), p(rows_pad * W, 0.f), m(rows_pad), l(rows_pad);
    std::vector<int64_t> limit(rows_pad);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t w = 0; w < nitems; ++w) {
      const Item it = items[w];
      const int64_t q_len = starts[it.seq + 1] - starts[it.seq], ctx = lens[it.seq];
      const int64_t t0 = it.tile * TILE, t1 = std::min(q_len, t0 + TILE);
      const int64_t rows = (t1 - t0) * group;
      const int64_t h0 = it.kv_head * group;
      // Row r = (token t0 + r / group, query head h0 + r % group); its last visible key.
      for (int64_t r = 0; r < rows_pad; ++r) {
        const bool real = r < rows;
        const int64_t tok = t0 + (real ? r / group : 0);
        limit[r] = real ? ctx - q_len + tok : -1;
        dot.set_query(r, real ? q + (starts[it.seq] + tok) * q_stride + (h0 + r % group) * d : nullptr);
        m[r] = -FLT_MAX;
        l[r] = 0.f;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      const int64_t last_key = ctx - q_len + t1 - 1;
      for (int64_t k0 = 0; k0 <= last_key; k0 += W) {
        const int64_t keys = std::min(W, last_key + 1 - k0);
        // W keys may span two cache blocks (block sizes need not be multiples of 16).
        for (int64_t t = 0; t < W; ++t) {
          if (t < keys) {
            const int64_t pos = k0 + t;
            const int64_t off = (static_cast<int64_t>(tables[it.seq * max_blocks + pos / block_size]) * block_size +
                                 pos % block_size) * row + it.kv_head * d;
            dot.set_key(t, kc + off, vc + off);
          } else {
            dot.set_key(t, nullptr, nullptr);
          }
        }
        dot.scores(p.data(), rows);
        // Online softmax per row; keys past a row's limit get probability 0 without reaching exp.
        for (int64_t r = 0; r < rows; ++r) {
          float* s = p.data() + r * W;
          const int64_t valid = std::min(keys, limit[r] - k0 + 1);
          if (valid <= 0) {
            std::fill(s, s + W, 0.f);
            continue;
          }
          float top = m[r];
#pragma omp simd reduction(max : top)
          for (int64_t t = 0; t < W; ++t) top = std::max(top, t < valid ? s[t] : -FLT_MAX);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t t = 0; t < W; ++t) {
            s[t] = t < valid ? std::exp(s[t] - top) : 0.f;
            sum += s[t];
          }
          const float rescale = m[r] == -FLT_MAX ? 0.f : std::exp(m[r] - top);  // no underflow path on the first step
          l[r] = l[r] * rescale + sum;
          m[r] = top;
          if (rescale != 1.f) {
            float* a = acc.data() + r * dp;
            for (int64_t j = 0; j < dp; ++j) a[j] *= rescale;
          }
        }
        dot.accumulate(acc.data(), p.data(), rows, keys);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* dst = out + ((starts[it.seq] + t0 + r / group) * heads + h0 + r % group) * d;
        const float inv = 1.f / l[r];  // every row sees key 0, so l > 0
        for (int64_t j = 0; j < d; ++j) dst[j] = sarathi::store<T>(acc[r * dp + j] * inv);
      }
    }
  }
}

}  // namespace

#define SARATHI_PREFILL(NAME, T)                                                                               \
  extern "C" void NAME(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables,           \
                       const int32_t* starts, const int32_t* lens, T* out, int64_t n, int64_t heads, int64_t d,  \
                       int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {    \
    paged_prefill<T>(q, q_stride, kc, vc, tables, starts, lens, out, n, heads, d, block_size, kv_heads,          \
                     max_blocks, scale, threads);                                                              \
  }
SARATHI_PREFILL(paged_prefill_f32, float)
SARATHI_PREFILL(paged_prefill_bf16, sarathi::bf16)
