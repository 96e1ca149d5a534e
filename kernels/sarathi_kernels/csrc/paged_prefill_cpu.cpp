// Prefill attention over the paged KV cache on the CPU: every prefill chunk of an iteration in one
// call, each chunk's queries against its whole context (earlier chunks' tokens and its own), causal
// from the bottom right, keys and values read in place from their cache blocks (no gather).
//
// Why a kernel: torch's CPU flash attention runs cpu-small's heads (d = 64) at 55-63 GFLOP/s in
// float32 on 2 threads, a quarter of the machine's matmul rate, and slower still in bfloat16; and
// it needs each context gathered out of the cache first (benchmarks/RESULTS.md).
//
// How: a work item is one chunk's tile of TILE query tokens against one kv head, with all the query
// heads that share it (grouped-query attention reads each key once for the group). Its rows (token x
// query head) go W to a vector (cpu_common.h: 16 with AVX-512, 8 with AVX2): the queries are
// transposed once per item to [d][rows], so that the scores of W rows against one key are
// multiply-adds of a query vector by the key's elements broadcast from the cache, for W keys at a
// time. The online softmax then runs across rows, one lane each (max, exp and sums are plain vector
// ops: no horizontal reductions, no transposed keys), and probabilities x values accumulate four
// rows at a time so that each value vector loaded feeds four multiply-adds. exp is inline
// (exp_nonpositive); masked lanes' exp is discarded by a select (a conditional exp would not
// vectorise), the empty max is -FLT_MAX, and unwritten cache rows are never read, so nothing relies
// on inf/NaN.
//
// Storage is float32 or bfloat16 (cpu_common.h). The arithmetic is float32, except that bfloat16 on a
// CPU with AVX512_BF16 takes both products through vdpbf16ps (exact bf16 x bf16 products summed in
// float32): query and key elements in pairs, values as pairs of keys, and the probabilities rounded to
// bfloat16 before p x v, as torch's CPU flash attention and the GPU kernels round them.
// With AMX, bfloat16 runs in paged_prefill_amx.cpp instead.
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
#include "prefill_common.h"

namespace {

using sarathi::bf16;
using sarathi::load;
using sarathi::vec;
using sarathi::vload;
using sarathi::vstore;
using sarathi::W;  // floats per vector: rows per row group, and keys per softmax step

using sarathi::Item;
using sarathi::TILE;

typedef int32_t ivec __attribute__((vector_size(W * sizeof(int32_t))));

// exp(x) for x <= 0 (larger x as 0: the callers discard those lanes), inline: a libmvec call per W
// lanes spills every live vector register around it, ~40% of this kernel's bfloat16 time. 2^n by the
// exponent bits, exp(r) for |r| <= ln2 / 2 by its Taylor series to r^7 (error < 2e-7 relative).
inline vec exp_nonpositive(vec x) {
  x = x < 0.f ? x : vec{};
  x = x > -87.f ? x : vec{} - 87.f;  // 2^n stays a normal float
  const ivec n = __builtin_convertvector(x * 1.44269504f - 0.5f, ivec);  // round to nearest (x <= 0)
  const vec nf = __builtin_convertvector(n, vec);
  const vec r = x - nf * 0.693359375f + nf * 2.12194440e-4f;  // ln 2 in two parts, for the large n
  vec p = vec{} + 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const ivec bits = (n + 127) << 23;
  vec two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

#if defined(__AVX512BF16__)
// The pairs that vdpbf16ps multiplies.

// x's elements (x has d) in pairs (2j, 2j + 1) as 32-bit words (2j in the low half), n of them
// written to out[j * stride], zero past d. Whole pairs as one copy each: a copy of a length known
// only at run time was a byte loop (perf, session 13).
inline void element_pairs(const bf16* x, int64_t d, int64_t n, uint32_t* out, int64_t stride) {
  int64_t j = 0;
  for (; 2 * j + 1 < d; ++j) std::memcpy(out + j * stride, x + 2 * j, sizeof(uint32_t));
  if (2 * j < d) {  // odd d: the last pair's second half zero
    out[j * stride] = x[d - 1].bits;
    ++j;
  }
  for (; j < n; ++j) out[j * stride] = 0u;
}

// Values of two keys side by side: out[c] = (a[c], b[c]) as one 32-bit word (a in the low half) for
// c < dp, zero past d; a and b hold d elements.
inline void value_pairs(const bf16* a, const bf16* b, int64_t d, int64_t dp, uint32_t* out) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                      37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t c = 0; c < dp; c += 32) {
    const __mmask32 cols = static_cast<__mmask32>((1ull << std::min<int64_t>(32, d - c)) - 1);
    const __m512i x = _mm512_maskz_loadu_epi16(cols, a + c), y = _mm512_maskz_loadu_epi16(cols, b + c);
    _mm512_storeu_si512(out + c, _mm512_permutex2var_epi16(x, lo, y));
    if (c + 16 < dp) _mm512_storeu_si512(out + c + 16, _mm512_permutex2var_epi16(x, hi, y));
  }
}

#endif

// Rows r..r+3 x NC vectors of columns from c of acc (row stride dp) in registers while step(u, x)
// adds key (or key pair) u's terms, u < n: each vector loaded feeds four rows.
template <int NC, typename Step>
void accumulate_four_rows(float* acc, int64_t dp, int64_t r, int64_t c, int64_t n, Step step) {
  vec x[4][NC];
  for (int i = 0; i < 4; ++i)
    for (int b = 0; b < NC; ++b) x[i][b] = vload(acc + (r + i) * dp + c + b * W);
  for (int64_t u = 0; u < n; ++u) step(u, x);
  for (int i = 0; i < 4; ++i)
    for (int b = 0; b < NC; ++b) vstore(acc + (r + i) * dp + c + b * W, x[i][b]);
}

// acc [rows][dp] += probabilities x values, four rows at a time, the columns two vectors at a time
// where they fit (Dot::accumulate_columns<NC>; n: the keys, or key pairs, it reads).
template <typename Dot>
void accumulate_blocks(const Dot& dot, float* acc, int64_t rows, int64_t dp, int64_t n) {
  for (int64_t r = 0; r < rows; r += 4) {
    int64_t c = 0;
    for (; c + 2 * W <= dp; c += 2 * W) dot.template accumulate_columns<2>(acc, r, c, n);
    if (c < dp) dot.template accumulate_columns<1>(acc, r, c, n);
  }
}

// The float32 arithmetic, every machine.
template <typename T>
struct Float32Dot {
  int64_t d, dp, rows_pad;
  std::vector<float> qt, kf, vf, pt;  // queries [d][rows], keys [W][d], values [W][dp], probabilities [W][rows]
  Float32Dot(int64_t rows_pad, int64_t d, int64_t dp)
      : d(d), dp(dp), rows_pad(rows_pad), qt(d * rows_pad), kf(W * d), vf(W * dp, 0.f), pt(W * rows_pad, 0.f) {}

  void set_query(int64_t r, const T* src) {
    for (int64_t j = 0; j < d; ++j) qt[j * rows_pad + r] = load(src[j]);
  }
  // The block's keys and values, key t at k[t] and v[t] (a zero row past the context).
  void set_keys(const T* const* k, const T* const* v) {
    for (int64_t t = 0; t < W; ++t)
      for (int64_t j = 0; j < d; ++j) {
        kf[t * d + j] = load(k[t][j]);
        vf[t * dp + j] = load(v[t][j]);
      }
  }
  // s [W keys][W rows] <- q . k of rows r0.. against the block's keys.
  void scores(int64_t r0, float* s) const {
    vec acc[W] = {};
    for (int64_t j = 0; j < d; ++j) {
      const vec q = vload(qt.data() + j * rows_pad + r0);
      for (int64_t t = 0; t < W; ++t) acc[t] += kf[t * d + j] * q;
    }
    for (int64_t t = 0; t < W; ++t) vstore(s + t * W, acc[t]);
  }
  void set_probs(int64_t r0, const float* s) {
    for (int64_t t = 0; t < W; ++t) std::memcpy(pt.data() + t * rows_pad + r0, s + t * W, W * sizeof(float));
  }
  // acc_r += p_r[t] * values[t] for four rows and NC vectors of columns: each sum is a chain of
  // multiply-adds over the keys, so four of them (NC = 1) kept one FMA unit of two busy at their
  // latency (perf: the kernel's hottest loop); eight (NC = 2) fill both.
  template <int NC>
  void accumulate_columns(float* acc, int64_t r, int64_t c, int64_t keys) const {
    accumulate_four_rows<NC>(acc, dp, r, c, keys, [&](int64_t t, vec (&x)[4][NC]) {
      vec v[NC];
      for (int b = 0; b < NC; ++b) v[b] = vload(vf.data() + t * dp + c + b * W);
      const float* p = pt.data() + t * rows_pad + r;
      for (int i = 0; i < 4; ++i)
        for (int b = 0; b < NC; ++b) x[i][b] += p[i] * v[b];
    });
  }
  void accumulate(float* acc, int64_t rows, int64_t keys) const { accumulate_blocks(*this, acc, rows, dp, keys); }
};

#if defined(__AVX512BF16__)
// bfloat16 through vdpbf16ps (AVX512_BF16): the header says why.
struct Bf16Dot {
  int64_t d, dp, rows_pad, half;  // half: element pairs per row, the last one zero-padded where d is odd
  std::vector<uint32_t> qp, pp;   // query pairs [half][rows], probability pairs [W/2][rows]
  std::vector<uint32_t> vp;       // value pairs [W/2][dp]: keys 2u and 2u+1 side by side
  const bf16* const* keys = nullptr;
  Bf16Dot(int64_t rows_pad, int64_t d, int64_t dp)
      : d(d), dp(dp), rows_pad(rows_pad), half((d + 1) / 2), qp(half * rows_pad), pp(W / 2 * rows_pad, 0u),
        vp(W / 2 * dp, 0u) {}

  static uint32_t pair(const bf16* x, int64_t j, int64_t d) {
    uint32_t p = 0;
    std::memcpy(&p, x + 2 * j, (2 * j + 1 < d ? 2 : 1) * sizeof(bf16));
    return p;
  }
  static __m512bh broadcast(uint32_t p) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(p)); }

  void set_query(int64_t r, const bf16* src) { element_pairs(src, d, half, qp.data() + r, rows_pad); }
  void set_keys(const bf16* const* k, const bf16* const* v) {
    keys = k;
    for (int64_t u = 0; u < W / 2; ++u)
      value_pairs(v[2 * u], v[2 * u + 1], d, dp, vp.data() + u * dp);
  }
  void scores(int64_t r0, float* s) const {
    __m512 acc[W];
    for (int64_t t = 0; t < W; ++t) acc[t] = _mm512_setzero_ps();
    const int64_t whole = d / 2;  // pairs read as one 32-bit word from each key row
    for (int64_t j = 0; j < whole; ++j) {
      const __m512bh q = (__m512bh)_mm512_loadu_si512(qp.data() + j * rows_pad + r0);
      for (int64_t t = 0; t < W; ++t) {
        uint32_t k;
        std::memcpy(&k, keys[t] + 2 * j, sizeof k);
        acc[t] = _mm512_dpbf16_ps(acc[t], q, broadcast(k));
      }
    }
    if (whole < half) {
      const __m512bh q = (__m512bh)_mm512_loadu_si512(qp.data() + whole * rows_pad + r0);
      for (int64_t t = 0; t < W; ++t) acc[t] = _mm512_dpbf16_ps(acc[t], q, broadcast(pair(keys[t], whole, d)));
    }
    for (int64_t t = 0; t < W; ++t) _mm512_storeu_ps(s + t * W, acc[t]);
  }
  void set_probs(int64_t r0, const float* s) {
    for (int64_t u = 0; u < W / 2; ++u) {
      const __m512 a = _mm512_loadu_ps(s + 2 * u * W), b = _mm512_loadu_ps(s + (2 * u + 1) * W);
      _mm512_storeu_si512(pp.data() + u * rows_pad + r0, sarathi::probability_pairs(a, b));
    }
  }

  template <int NC>
  void accumulate_columns(float* acc, int64_t r, int64_t c, int64_t pairs) const {
    accumulate_four_rows<NC>(acc, dp, r, c, pairs, [&](int64_t u, vec (&x)[4][NC]) {
      __m512bh v[NC];
      for (int b = 0; b < NC; ++b) v[b] = (__m512bh)_mm512_loadu_si512(vp.data() + u * dp + c + b * W);
      for (int i = 0; i < 4; ++i) {
        const __m512bh p = broadcast(pp[u * rows_pad + r + i]);
        for (int b = 0; b < NC; ++b) x[i][b] = (vec)_mm512_dpbf16_ps((__m512)x[i][b], v[b], p);
      }
    });
  }
  // Four rows by 32 columns per step: eight sums, each pair vector loaded feeds four rows.
  void accumulate(float* acc, int64_t rows, int64_t keys) const { accumulate_blocks(*this, acc, rows, dp, (keys + 1) / 2); }
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

// Online softmax of one row group over one block of keys, a row per lane. s [W keys][W rows]: the
// raw scores in, the probabilities out; row i may see key t when t <= last[i]. m, l: the rows'
// running max and sum; rescale: what their accumulators must be multiplied by.
inline void softmax_block(float* s, const int32_t* last_keys, float scale, float* m_rows, float* l_rows,
                          float* rescale_rows) {
  const vec lowest = vec{} - FLT_MAX, m = vload(m_rows);
  ivec last;
  std::memcpy(&last, last_keys, sizeof last);
  vec top = m;
  for (int32_t t = 0; t < W; ++t) {
    const vec x = vload(s + t * W) * scale;
    vstore(s + t * W, x);
    const vec seen = t <= last ? x : lowest;
    top = seen > top ? seen : top;
  }
  vec sum = {};
  for (int32_t t = 0; t < W; ++t) {
    const vec e = exp_nonpositive(vload(s + t * W) - top), p = t <= last ? e : vec{};
    vstore(s + t * W, p);
    sum += p;
  }
  // A row's first key: nothing to rescale.
  const auto first = m == lowest;
  const vec e = exp_nonpositive(m - top), rescale = first ? vec{} : e;
  vstore(rescale_rows, rescale);
  vstore(l_rows, vload(l_rows) * rescale + sum);
  vstore(m_rows, top);
}

// q [tokens, heads, d] with token stride q_stride (elements; q may sit inside the fused qkv
// output); out [tokens, heads, d] contiguous; caches [blocks, block_size, kv_heads, d] contiguous;
// starts [n + 1] (the chunks' first rows in q), lens [n] (context lengths, this chunk included),
// tables [n, max_blocks]. Accumulators and values are padded to dp, d rounded up to W floats.
template <typename T, typename Dot>
void paged_prefill_with(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables,
                        const int32_t* starts, const int32_t* lens, T* out, int64_t n, int64_t heads, int64_t d,
                        int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
  const int64_t group = heads / kv_heads, row = kv_heads * d, dp = (d + W - 1) / W * W;
  const std::vector<Item> items = sarathi::work_items(starts, n, kv_heads);
  const int64_t nitems = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(threads) if (threads > 1 && nitems > 1)
  {
    // Rows padded to whole row groups; padding rows see no key and are never written out.
    const int64_t rows_pad = (TILE * group + W - 1) / W * W;
    Dot dot(rows_pad, d, dp);
    const std::vector<T> zero_row(dp + 2);  // stands in for the keys and values past a context
    std::vector<float> acc(rows_pad * dp), s(W * W), m(rows_pad), l(rows_pad), rescale(W);
    std::vector<int32_t> limit(rows_pad), last(W);
    const T* k[W];
    const T* v[W];
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t w = 0; w < nitems; ++w) {
      const Item it = items[w];
      const int64_t q_len = starts[it.seq + 1] - starts[it.seq], ctx = lens[it.seq];
      const int64_t t0 = it.tile * TILE, t1 = std::min(q_len, t0 + TILE);
      const int64_t rows = (t1 - t0) * group, groups = (rows + W - 1) / W;
      const int64_t h0 = it.kv_head * group;
      // Row r = (token t0 + r / group, query head h0 + r % group); its last visible key.
      for (int64_t r = 0; r < groups * W; ++r) {
        const bool real = r < rows;
        const int64_t tok = t0 + r / group;
        limit[r] = real ? static_cast<int32_t>(ctx - q_len + tok) : -1;
        dot.set_query(r, real ? q + (starts[it.seq] + tok) * q_stride + (h0 + r % group) * d : zero_row.data());
        m[r] = -FLT_MAX;
        l[r] = 0.f;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      const int64_t last_key = ctx - q_len + t1 - 1;
      for (int64_t k0 = 0; k0 <= last_key; k0 += W) {
        const int64_t keys = std::min(W, last_key + 1 - k0);
        // W keys may span two cache blocks (block sizes need not be multiples of W).
        for (int64_t t = 0; t < W; ++t) {
          const int64_t pos = k0 + t;
          const int64_t off = t < keys ? (static_cast<int64_t>(tables[it.seq * max_blocks + pos / block_size]) *
                                              block_size + pos % block_size) * row + it.kv_head * d
                                       : -1;
          k[t] = off < 0 ? zero_row.data() : kc + off;
          v[t] = off < 0 ? zero_row.data() : vc + off;
        }
        dot.set_keys(k, v);
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r0 = g * W;
          for (int64_t i = 0; i < W; ++i) last[i] = static_cast<int32_t>(limit[r0 + i] - k0);
          dot.scores(r0, s.data());
          softmax_block(s.data(), last.data(), scale, m.data() + r0, l.data() + r0, rescale.data());
          for (int64_t i = 0; i < W && r0 + i < rows; ++i) {
            if (rescale[i] == 1.f) continue;
            float* a = acc.data() + (r0 + i) * dp;
            for (int64_t j = 0; j < dp; ++j) a[j] *= rescale[i];
          }
          dot.set_probs(r0, s.data());
        }
        dot.accumulate(acc.data(), rows, keys);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* dst = out + ((starts[it.seq] + t0 + r / group) * heads + h0 + r % group) * d;
        const float inv = 1.f / l[r];  // every row sees key 0, so l > 0
        for (int64_t j = 0; j < d; ++j) dst[j] = sarathi::store<T>(acc[r * dp + j] * inv);
      }
    }
  }
}

template <typename T>
void paged_prefill(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables,
                   const int32_t* starts, const int32_t* lens, T* out, int64_t n, int64_t heads, int64_t d,
                   int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
#if defined(SARATHI_AMX)
  if constexpr (std::is_same<T, bf16>::value)
    if (sarathi::amx_permitted())
      return sarathi::paged_prefill_amx(q, q_stride, kc, vc, tables, starts, lens, out, n, heads, d, block_size,
                                        kv_heads, max_blocks, scale, threads);
#endif
  paged_prefill_with<T, typename DotFor<T>::type>(q, q_stride, kc, vc, tables, starts, lens, out, n, heads, d,
                                                  block_size, kv_heads, max_blocks, scale, threads);
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
