// What the prefill attention kernels share (paged_prefill_cpu.cpp, paged_prefill_amx.cpp): the work
// items, and the inline exp of their online softmax.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu_common.h"

namespace sarathi {

constexpr int64_t TILE = 64;  // query tokens per work item (32: 0.9-0.97x at 288-1024 keys)

struct Item {
  int64_t seq, kv_head, tile;
};

// One item per chunk tile and kv head, a chunk's last tiles first: they see the most keys, and
// dynamic scheduling balances best that way. A kv head's tiles follow each other, so that a thread
// mostly takes several of them in a row (the AMX kernel packs their keys once).
inline std::vector<Item> work_items(const int32_t* starts, int64_t n, int64_t kv_heads) {
  std::vector<Item> items;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t tiles = (starts[i + 1] - starts[i] + TILE - 1) / TILE;
    for (int64_t g = 0; g < kv_heads; ++g)
      for (int64_t t = tiles - 1; t >= 0; --t) items.push_back({i, g, t});
  }
  return items;
}

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
// The pairs that vdpbf16ps and AMX's tiles multiply, as both bfloat16 kernels lay them out.

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

// Probabilities of keys 2u and 2u + 1 (s [keys][16 rows] float32), rounded to bfloat16 and paired per
// row: lane r = (s[2u][r], s[2u + 1][r]).
inline __m512i probability_pairs(const float* s, int64_t u) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + (2 * u + 1) * 16), _mm512_loadu_ps(s + 2 * u * 16));
  return _mm512_permutexvar_epi16(order, (__m512i)both);
}
#endif

#if defined(SARATHI_AMX)
// paged_prefill_cpu.cpp's bfloat16 attention through AMX tiles (paged_prefill_amx.cpp); same
// arguments. The caller checks amx_permitted().
void paged_prefill_amx(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc, const int32_t* tables,
                       const int32_t* starts, const int32_t* lens, bf16* out, int64_t n, int64_t heads, int64_t d,
                       int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads);
#endif

}  // namespace sarathi
