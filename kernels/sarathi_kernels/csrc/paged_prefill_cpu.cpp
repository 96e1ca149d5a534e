// Prefill attention over the paged KV cache on the CPU: every prefill chunk of an iteration in one
// call, each chunk's queries against its whole context (earlier chunks' tokens and its own), causal
// from the bottom right, keys and values read from their cache blocks (no gather by the caller).
//
// Why a kernel: torch's CPU flash attention runs cpu-small's heads (d = 64) at 55-63 GFLOP/s in
// float32 on 2 threads, a quarter of the machine's matmul rate, and slower still in bfloat16; and
// it needs each context gathered out of the cache first (benchmarks/RESULTS.md).
//
// How: a work item is one chunk's tile of TILE query tokens against one kv head, with all the query
// heads that share it (grouped-query attention reads each key once for the group). Its rows (token x
// query head) go W to a vector, a row group (cpu_common.h: 16 with AVX-512, 8 with AVX2), and every
// product keeps rows in lanes: the queries transposed once per item to [d][rows], the accumulators
// held transposed, [d][rows] per row group. Scores are then multiply-adds of a query vector by one
// key element broadcast from memory, and probabilities x values of a probability vector (one key,
// W rows) by one value element: the same register block (register_block) for both, two row groups
// by NB keys or columns. The online softmax runs across rows, one lane each (max, exp, sums and the
// rescale are plain vector ops: no horizontal reductions, no transposes), once per block of KB keys.
// A thread copies each (sequence, kv head)'s keys and values out of the cache once (Packed), for
// the items of that head it takes. exp is inline and in base 2 (exp2_nonpositive); masked lanes' exp
// is discarded by a select (a conditional exp would not vectorise), only in the blocks that need a
// mask; the empty max is -FLT_MAX, and unwritten cache rows are never read, so nothing relies on
// inf/NaN.
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
using sarathi::W;  // floats per vector: rows per row group

using sarathi::ContextRows;

using sarathi::Item;
using sarathi::TILE;

using sarathi::exp2_nonpositive;
using sarathi::ivec;

#if defined(__AVX512BF16__)
// The pairs that vdpbf16ps multiplies.

// x's elements (x has d) in pairs (2j, 2j + 1) as 32-bit words (2j in the low half), n of them
// written to out[j * stride], zero past d. Whole pairs as one copy each: a copy of a length known
// only at run time compiled to a byte loop (seen in perf).
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

// Register blocking of both products: RG row groups (vectors of W rows) by NB operands broadcast from
// memory, RG x NB sums in registers. Each step loads RG vectors and NB scalars for RG x NB
// multiply-adds: one row group against W keys loaded 17 times per 16 multiply-adds, more than the
// load ports issue beside two FMA units (6.3 against 5.2 multiply-adds per ns in L1, this Xeon).
constexpr int RG = 2;
constexpr int NB = W >= 16 ? 8 : 4;  // 16 sums of 32 registers (AVX-512), 8 of 16 (AVX2)
// Keys per block: the running max, the rescale and the accumulators' loads and stores once per KB keys.
constexpr int64_t KB = 4 * W;

// sums[g][i] += a(g, kk) (W rows of row group g) x b(i, kk) (one scalar broadcast), kk < depth.
template <int G, typename A, typename B, typename Madd>
inline void register_block(vec (&sums)[G][NB], int64_t depth, A a, B b, Madd madd) {
  for (int64_t kk = 0; kk < depth; ++kk) {
    decltype(a(0, kk)) av[G];
    for (int g = 0; g < G; ++g) av[g] = sarathi::in_register(a(g, kk));
    for (int i = 0; i < NB; ++i) {
      const auto bv = b(i, kk);
      for (int g = 0; g < G; ++g) sums[g][i] = madd(sums[g][i], av[g], bv);
    }
  }
}

// Transposed accumulators acc [G][dp][W] (a column's W rows per vector) of G row groups:
// acc = acc x rescale[g] + probabilities x values over n keys, NB columns at a time.
template <int G, typename A, typename B, typename Madd>
inline void accumulate_columns(float* acc, int64_t dp, const vec* rescale, int64_t n, A a, B b, Madd madd) {
  for (int64_t c = 0; c < dp; c += NB) {
    vec x[G][NB];
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < NB; ++i) x[g][i] = vload(acc + (g * dp + c + i) * W) * rescale[g];
    register_block<G>(x, n, a, [&](int i, int64_t kk) { return b(c + i, kk); }, madd);
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < NB; ++i) vstore(acc + (g * dp + c + i) * W, x[g][i]);
  }
}

inline vec fma_f32(vec x, vec a, float b) { return x + a * b; }

// 1 / x correctly rounded (divps), as a scalar division rounds it: under -ffast-math GCC turns a
// vector division into a reciprocal estimate and a Newton step (1 ulp off), which would change the
// last bits of the outputs from one build or ISA to another.
__attribute__((optimize("no-unsafe-math-optimizations"))) vec reciprocal(vec x) { return 1.f / x; }

// Which keys a thread's copies hold: [0, end) of one (sequence, kv head). A copy's rows cover the
// whole context once it grows, so that a head's later blocks do not reallocate it.
struct Packed {
  int64_t seq = -1, kv_head = -1, end = 0;
  // The first key still to copy for ctx (0 on a new head) and the rows a copy needs for keys up to upto.
  template <typename T>
  int64_t start(const ContextRows<T>& ctx) {
    if (ctx.seq != seq || ctx.kv_head != kv_head) {
      seq = ctx.seq;
      kv_head = ctx.kv_head;
      end = 0;
    }
    return end;
  }
  template <typename T>
  static int64_t rows(const ContextRows<T>& ctx, int64_t upto) {
    return std::max(upto, (ctx.len + KB - 1) / KB * KB);
  }
};

template <typename T>
inline void widen(const T* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = load(src[j]);
}

template <typename V>
void grow(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
}

// The float32 arithmetic, every machine. Keys and values are copied out of their cache blocks into
// rows of their own, once per thread for each (sequence, kv head): computing on them in place was
// slower, as a head's rows lie a token's whole row apart (kv_heads x d) and fall on a few L1 sets;
// and copying per work item was a fifth of the kernel (benchmarks/RESULTS.md). Work items of one
// kv head follow each other, most keys first, so a thread mostly packs a head once, a block at a time
// just before it computes on it. The AMX kernel's copy of every head up front, in one pass before the
// items, ran this kernel 0.74-0.92x (its copies no longer in cache when read).
template <typename T>
struct Float32Dot {
  int64_t d, dp, rows_pad;
  std::vector<float> qt, kf, vf;  // queries [d][rows]; keys [pos][d] and values [pos][dp] of one head
  Packed packed;
  Float32Dot(int64_t rows_pad, int64_t d, int64_t dp) : d(d), dp(dp), rows_pad(rows_pad), qt(d * rows_pad) {}

  // Row group g's queries (src[i]: row g W + i's d elements) into qt, W x W blocks transposed in
  // registers (one scalar store per element was a tenth of the kernel at 256 tokens).
  void set_queries(int64_t g, const T* const* src) {
    float* q = qt.data() + g * W;
    int64_t j = 0;
    for (; j + W <= d; j += W) {
      vec a[W];
      for (int i = 0; i < W; ++i) a[i] = vload(src[i] + j);
      sarathi::transpose(a);
      for (int i = 0; i < W; ++i) vstore(q + (j + i) * rows_pad, a[i]);
    }
    for (; j < d; ++j)
      for (int i = 0; i < W; ++i) q[j * rows_pad + i] = load(src[i][j]);
  }
  // Keys and values up to k0 + n into kf and vf.
  void set_keys(const ContextRows<T>& ctx, int64_t k0, int64_t n) {
    const int64_t from = packed.start(ctx), upto = k0 + n;
    if (from >= upto) return;
    const int64_t rows = Packed::rows(ctx, upto);
    grow(kf, rows * d);
    grow(vf, rows * dp);
    ctx.each_row(from, upto, [&](int64_t pos, const T* k, const T* v) {
      widen(k, kf.data() + pos * d, d);
      widen(v, vf.data() + pos * dp, d);
    });
    packed.end = upto;
  }
  // s [G][KB][W] <- q . k of row groups g0.. against keys k0 + t, t < n (n a multiple of NB).
  template <int G>
  void scores(int64_t g0, int64_t k0, int64_t n, float* s) const {
    const float* q = qt.data() + g0 * W;
    for (int64_t t0 = 0; t0 < n; t0 += NB) {
      const float* keys = kf.data() + (k0 + t0) * d;  // one base and offsets i x d: no pointer per key
      vec x[G][NB] = {};
      register_block<G>(x, d, [&](int g, int64_t j) { return vload(q + j * rows_pad + g * W); },
                        [&](int i, int64_t j) { return keys[i * d + j]; }, fma_f32);
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < NB; ++i) vstore(s + (g * KB + t0 + i) * W, x[g][i]);
    }
  }
  template <int G>
  void set_probs(const float*, int64_t) {}
  // acc [G][dp][W] = acc x rescale + the probabilities s [G][KB][W] x values k0 + t, t < n.
  template <int G>
  void accumulate(float* acc, const float* s, const vec* rescale, int64_t k0, int64_t n) const {
    const float* vals = vf.data() + k0 * dp;
    accumulate_columns<G>(acc, dp, rescale, n, [&](int g, int64_t t) { return vload(s + (g * KB + t) * W); },
                          [&](int64_t c, int64_t t) { return vals[t * dp + c]; }, fma_f32);
  }
};

#if defined(__AVX512BF16__)
inline vec dot_bf16(vec x, __m512bh a, uint32_t b) {
  return (vec)_mm512_dpbf16_ps((__m512)x, a, (__m512bh)_mm512_set1_epi32(static_cast<int>(b)));
}

// bfloat16 through vdpbf16ps (AVX512_BF16): the header says why. Keys and values are paired into
// copies of one head, as Float32Dot copies them.
struct Bf16Dot {
  int64_t d, dp, rows_pad, half;  // half: element pairs per row, the last one zero-padded where d is odd
  std::vector<uint32_t> qp, pp;   // query pairs [half][rows], probability pairs [G][KB/2][W]
  std::vector<uint32_t> kp, vp;   // one head's key pairs [pos][half] and value pairs [pos / 2][dp] (keys 2u, 2u + 1)
  Packed packed;
  Bf16Dot(int64_t rows_pad, int64_t d, int64_t dp)
      : d(d), dp(dp), rows_pad(rows_pad), half((d + 1) / 2), qp(half * rows_pad), pp(RG * KB / 2 * W, 0u) {}

  void set_queries(int64_t g, const bf16* const* src) {
    for (int64_t i = 0; i < W; ++i) element_pairs(src[i], d, half, qp.data() + g * W + i, rows_pad);
  }
  // Keys and values up to k0 + n paired into kp and vp (blocks start and end on even keys).
  void set_keys(const ContextRows<bf16>& ctx, int64_t k0, int64_t n) {
    const int64_t from = packed.start(ctx), upto = k0 + n;
    if (from >= upto) return;
    const int64_t rows = Packed::rows(ctx, upto);
    grow(kp, rows * half);
    grow(vp, rows / 2 * dp);
    ctx.each_row(from, upto,
                 [&](int64_t pos, const bf16* k, const bf16*) { element_pairs(k, d, half, kp.data() + pos * half, 1); });
    for (int64_t u = from / 2; u < upto / 2; ++u)
      value_pairs(ctx.value(2 * u), ctx.value(2 * u + 1), d, dp, vp.data() + u * dp);
    packed.end = upto;
  }
  template <int G>
  void scores(int64_t g0, int64_t k0, int64_t n, float* s) const {
    const uint32_t* q = qp.data() + g0 * W;
    for (int64_t t0 = 0; t0 < n; t0 += NB) {
      const uint32_t* keys = kp.data() + (k0 + t0) * half;
      vec x[G][NB] = {};
      register_block<G>(
          x, half, [&](int g, int64_t j) { return (__m512bh)_mm512_loadu_si512(q + j * rows_pad + g * W); },
          [&](int i, int64_t j) { return keys[i * half + j]; }, dot_bf16);
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < NB; ++i) vstore(s + (g * KB + t0 + i) * W, x[g][i]);
    }
  }
  // Probabilities s [G][KB][W] of keys t < n rounded and paired for vdpbf16ps.
  template <int G>
  void set_probs(const float* s, int64_t n) {
    for (int g = 0; g < G; ++g)
      for (int64_t u = 0; u < n / 2; ++u) {
        const float* p = s + (g * KB + 2 * u) * W;
        _mm512_storeu_si512(pp.data() + (g * KB / 2 + u) * W,
                            sarathi::probability_pairs(_mm512_loadu_ps(p), _mm512_loadu_ps(p + W)));
      }
  }
  template <int G>
  void accumulate(float* acc, const float*, const vec* rescale, int64_t k0, int64_t n) const {
    const uint32_t* vals = vp.data() + k0 / 2 * dp;
    accumulate_columns<G>(
        acc, dp, rescale, n / 2,
        [&](int g, int64_t u) { return (__m512bh)_mm512_loadu_si512(pp.data() + (g * KB / 2 + u) * W); },
        [&](int64_t c, int64_t u) { return vals[u * dp + c]; }, dot_bf16);
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

// Online softmax of one row group over n keys, a row per lane. s [n keys][W rows]: the raw scores in,
// the probabilities out; with Masked, row i may see key t only when t <= last[i] (a block with no
// such key needs no mask). c: the scale times log2(e), > 0, so the max is taken on raw scores and
// scaled once. m, l: the rows' running max (of scores times c) and sum. Returns what the rows'
// accumulators must be multiplied by.
template <bool Masked>
inline vec softmax_keys(float* s, int64_t n, ivec last, float c, float* m_rows, float* l_rows) {
  const vec lowest = vec{} - FLT_MAX, m = vload(m_rows);
  vec raw = lowest;
  for (int32_t t = 0; t < n; ++t) {
    vec x = vload(s + t * W);
    if constexpr (Masked) x = t <= last ? x : lowest;
    raw = x > raw ? x : raw;
  }
  const vec scaled = raw * c, top = scaled > m ? scaled : m;
  vec sum = {};
  for (int32_t t = 0; t < n; ++t) {
    vec p = exp2_nonpositive(vload(s + t * W) * c - top);
    if constexpr (Masked) p = t <= last ? p : vec{};
    vstore(s + t * W, p);
    sum += p;
  }
  // A row's first key: nothing to rescale.
  const auto first = m == lowest;
  const vec e = exp2_nonpositive(m - top), rescale = first ? vec{} : e;
  vstore(l_rows, vload(l_rows) * rescale + sum);
  vstore(m_rows, top);
  return rescale;
}

// Row groups g0 .. g0 + G - 1 of a work item against one block of keys (keys of them real, from
// k0): scores, online softmax, probabilities x values into their accumulators acc [groups][dp][W].
template <int G, typename Dot>
void attend_block(Dot& dot, int64_t g0, int64_t rows, int64_t k0, int64_t keys, const int32_t* limit, float c,
                  float* s, float* m, float* l, float* acc, int64_t dp) {
  // Limits grow with the row: the last real row sees the most, a group's first row the least.
  const int64_t top = limit[std::min(rows, (g0 + G) * W) - 1] - k0;
  if (top < 0) return;  // no row here sees a key of this block
  const int64_t nk = (std::min(keys, top + 1) + NB - 1) / NB * NB;
  dot.template scores<G>(g0, k0, nk, s);
  vec rescale[G];
  for (int g = 0; g < G; ++g) {
    const int64_t r0 = (g0 + g) * W;
    float *sg = s + g * KB * W, *mg = m + r0, *lg = l + r0;
    if (k0 + nk - 1 > limit[r0] || r0 + W > rows) {  // some lane may not see some key (padding rows see none)
      ivec last;
      for (int64_t i = 0; i < W; ++i) last[i] = static_cast<int32_t>(limit[r0 + i] - k0);
      rescale[g] = softmax_keys<true>(sg, nk, last, c, mg, lg);
    } else {
      rescale[g] = softmax_keys<false>(sg, nk, ivec{}, c, mg, lg);
    }
  }
  dot.template set_probs<G>(s, nk);
  dot.template accumulate<G>(acc + g0 * dp * W, s, rescale, k0, nk);
}

// q [tokens, heads, d] with token stride q_stride (elements; q may sit inside the fused qkv
// output); out [tokens, heads, d] contiguous; caches [blocks, block_size, kv_heads, d] contiguous;
// starts [n + 1] (the chunks' first rows in q), lens [n] (context lengths, this chunk included),
// tables [n, max_blocks]. Accumulators and values are padded to dp, d rounded up to W floats.
template <typename T, typename Dot>
void paged_prefill_with(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables,
                        const int32_t* starts, const int32_t* lens, T* out, int64_t n, int64_t heads, int64_t d,
                        int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
  static_assert(RG == 2, "a work item's last row group, when odd, runs alone");
  const int64_t group = heads / kv_heads, row = kv_heads * d, dp = (d + W - 1) / W * W;
  const float c = scale * 1.44269504f;  // the softmax in base 2
  const std::vector<Item> items = sarathi::work_items(starts, n, kv_heads);
  const int64_t nitems = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(threads) if (threads > 1 && nitems > 1)
  {
    // Rows padded to whole row groups; padding rows see no key and are never written out.
    const int64_t rows_pad = (TILE * group + W - 1) / W * W;
    Dot dot(rows_pad, d, dp);
    const std::vector<T> zero_row(dp + 2);  // stands in for the keys and values past a context
    std::vector<float> acc(rows_pad * dp), s(RG * KB * W), m(rows_pad), l(rows_pad);
    std::vector<int32_t> limit(rows_pad);
    float *const sb = s.data(), *const mb = m.data(), *const lb = l.data(), *const ab = acc.data();
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t w = 0; w < nitems; ++w) {
      const Item it = items[w];
      const sarathi::Span sp(it, starts, lens, group);
      const int64_t groups = (sp.rows + W - 1) / W;
      const auto row_out = [&](int64_t r) { return out + sp.at(r, heads * d, d); };
      // The output rows, a token's whole row apart, fetched for writing while the item computes:
      // written cold at the end, they cost a tenth of the kernel at 256 tokens.
      for (int64_t r = 0; r < sp.rows; ++r) sarathi::prefetch_for_write(row_out(r), d * sizeof(T));
      // Row r = (token t0 + r / group, query head h0 + r % group); its last visible key.
      for (int64_t g = 0; g < groups; ++g) {
        const T* src[W];
        for (int64_t i = 0; i < W; ++i) {
          const int64_t r = g * W + i, tok = sp.t0 + r / group;
          const bool real = r < sp.rows;
          limit[r] = real ? static_cast<int32_t>(sp.ctx - sp.q_len + tok) : -1;
          src[i] = real ? q + sp.at(r, q_stride, d) : zero_row.data();
          m[r] = -FLT_MAX;
          l[r] = 0.f;
        }
        dot.set_queries(g, src);
      }
      std::fill(acc.begin(), acc.begin() + groups * dp * W, 0.f);
      const int64_t last_key = sp.ctx - sp.q_len + sp.t1 - 1;
      const ContextRows<T> context{kc, vc, zero_row.data(), tables + it.seq * max_blocks, block_size, row,
                                   it.kv_head * d, sp.ctx, it.seq, it.kv_head};
      for (int64_t k0 = 0; k0 <= last_key; k0 += KB) {
        const int64_t keys = std::min(KB, last_key + 1 - k0);
        dot.set_keys(context, k0, (keys + NB - 1) / NB * NB);
        for (int64_t g = 0; g < groups; g += RG) {
          if (g + RG <= groups)
            attend_block<RG>(dot, g, sp.rows, k0, keys, limit.data(), c, sb, mb, lb, ab, dp);
          else
            attend_block<1>(dot, g, sp.rows, k0, keys, limit.data(), c, sb, mb, lb, ab, dp);
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t real = std::min(W, sp.rows - g * W);  // the rest are padding rows, never written
        T* dst[W];
        for (int64_t i = 0; i < real; ++i) dst[i] = row_out(g * W + i);
        // Real rows see key 0, so l > 0; padding rows (l = 0) divide by 1.
        const vec sum = vload(lb + g * W), inv = reciprocal(sum > 0.f ? sum : vec{} + 1.f);
        for (int64_t j = 0; j < dp; j += W) {
          vec a[W];
          for (int i = 0; i < W; ++i) a[i] = vload(ab + (g * dp + j + i) * W) * inv;
          sarathi::transpose(a);  // a[i]: row g W + i's elements j..j + W (zero past d)
          for (int64_t i = 0; i < real; ++i) {
            if (j + W <= d)
              vstore(dst[i] + j, a[i]);
            else
              for (int64_t k = j; k < d; ++k) dst[i][k] = sarathi::store<T>(a[i][k - j]);
          }
        }
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
