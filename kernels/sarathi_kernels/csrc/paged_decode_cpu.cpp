// Decode attention over the paged KV cache on the CPU: one query token per request, each K/V row
// read once, straight from its cache block (no gather), with an online softmax per block.
//
// Why a kernel: the CPU flash-attention op reads a one-query head over strided cache rows at
// 6-7 GB/s per thread and needs the context gathered or split into runs (benchmarks/RESULTS.md).
//
// Why this loop order: a cache block holds [block_size, kv_heads, d] contiguous, so a work item
// takes one request and a range of its kv heads and walks each block's rows in memory order, every
// head of the range at once. Walking one head at a time (the first version) read 256 bytes every
// kv_heads * d * 4 bytes: a new page every token or two, 4-5 GB/s on 2 threads.
// Why -ffast-math (cpu_decode.py): it lets the compiler call the vector exp of glibc's libmvec in
// the softmax loop (one exp per key was the other half of the old kernel's time) and sum the dot
// products in vector order; the result stays within float32 rounding of the reference (tested).
// Infinities are kept out by construction (-FLT_MAX as the empty max), so nothing relies on them.
//
// Why it prefetches: the hardware prefetcher follows addresses, so it starts cold wherever the
// stream jumps: at a block that does not follow the last one in the cache, and at every token when
// a work item reads only some heads of each row (one request: 4 items of 3 heads on cpu-small). There
// the next block's rows are asked for in L2 while this block's are read, one token's stretch per
// token: 1 request x 512 tokens 0.37-0.65x the time, 8 requests over scattered blocks 0.64-0.97x.
// bfloat16 rows gain even where the blocks follow each other (8 requests 0.76-0.92x), float32 rows
// do not (0.96-1.09x: the hardware prefetcher already streams them at the copy rate), so only
// bfloat16 asks for those. Into L1 instead: 1.06-1.41x at 8-16 requests, as it evicts the rows
// being read.
// (AVX-512, AVX2 and AVX-512-without-bf16 builds on Zen 4; benchmarks/RESULTS.md.)
//
// Storage is float32 or bfloat16 (cpu_common.h); the arithmetic is float32 either way.
//
// Plain C ABI over raw pointers, no torch headers: the system compiler builds it in about a second
// and ctypes loads it (cpu_decode.py checks dtypes, shapes and contiguity before calling).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_common.h"

namespace {

using sarathi::load;

// q [n, heads, d] with row stride q_stride (elements; q may sit inside the fused qkv output), out
// [n, heads, d] contiguous; k_cache, v_cache [blocks, block_size, kv_heads, d]; block_tables [n, max_blocks];
// seq_lens [n]. All contiguous; T is float or bf16; tables and lengths int32. Work items are
// (request, range of kv heads), handed out dynamically: requests' lengths differ, so equal counts
// are not equal work.
template <typename T>
void paged_decode(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens, T* out,
                  int64_t n, int64_t heads, int64_t d, int64_t block_size, int64_t kv_heads, int64_t max_blocks,
                  float scale, int threads) {
  if (n == 0) return;  // the split below divides by n
  const int64_t group = heads / kv_heads;
  const int64_t row = kv_heads * d;  // floats between consecutive tokens of one head
  // Enough items for every thread even with one request; whole requests when there are many.
  const int64_t splits = std::min<int64_t>(kv_heads, std::max<int64_t>(1, (2 * threads + n - 1) / n));
  const int64_t span = (kv_heads + splits - 1) / splits;
#pragma omp parallel num_threads(threads) if (threads > 1 && n * splits > 1)
  {
    const int64_t qh = span * group;  // query heads of one item
    std::vector<float> scores(qh * block_size), acc(qh * d), m(qh), l(qh), qf(qh * d);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t w = 0; w < n * splits; ++w) {
      const int64_t i = w / splits, g0 = (w % splits) * span, g1 = std::min(kv_heads, g0 + span);
      const int64_t nq = (g1 - g0) * group, len = lens[i];
      const T* qsrc = q + i * q_stride + g0 * group * d;
      for (int64_t j = 0; j < nq * d; ++j) qf[j] = load(qsrc[j]);
      const float* qi = qf.data();
      std::fill(acc.begin(), acc.begin() + nq * d, 0.f);
      std::fill(m.begin(), m.begin() + nq, -FLT_MAX);
      std::fill(l.begin(), l.begin() + nq, 0.f);
      for (int64_t b = 0; b * block_size < len; ++b) {
        const int64_t tokens = std::min(block_size, len - b * block_size);
        const int32_t* slot = tables + i * max_blocks + b;
        const int64_t base = static_cast<int64_t>(slot[0]) * block_size * row + g0 * d;
        const T* kb = kc + base;
        const T* vb = vc + base;
        const bool more = (b + 1) * block_size < len &&
                          (sizeof(T) == 2 || g1 - g0 < kv_heads || slot[1] != slot[0] + 1);
        const int64_t next = more ? static_cast<int64_t>(slot[1]) * block_size * row + g0 * d : 0;
        const int64_t stretch = more ? (g1 - g0) * d * static_cast<int64_t>(sizeof(T)) : 0;  // bytes per token
        // Scores, rows in memory order: token t's heads g0..g1 are one contiguous stretch.
        for (int64_t t = 0; t < tokens; ++t) {
          const T* k = kb + t * row;
          sarathi::prefetch_l2(kc + next + t * row, stretch);
          for (int64_t h = 0; h < nq; ++h) {
            const T* kh = k + (h / group) * d;
            const float* qv = qi + h * d;
            float s = 0.f;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < d; ++j) s += qv[j] * load(kh[j]);
            scores[h * block_size + t] = s * scale;
          }
        }
        // Each head's running max and sum, rescaled once per block; probabilities in place.
        for (int64_t h = 0; h < nq; ++h) {
          float* s = scores.data() + h * block_size;
          float top = m[h];
          for (int64_t t = 0; t < tokens; ++t) top = std::max(top, s[t]);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t t = 0; t < tokens; ++t) {
            s[t] = std::exp(s[t] - top);
            sum += s[t];
          }
          const float rescale = std::exp(m[h] - top);
          l[h] = l[h] * rescale + sum;
          m[h] = top;
          float* a = acc.data() + h * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) a[j] *= rescale;
        }
        for (int64_t t = 0; t < tokens; ++t) {
          const T* v = vb + t * row;
          sarathi::prefetch_l2(vc + next + t * row, stretch);
          for (int64_t h = 0; h < nq; ++h) {
            const float p = scores[h * block_size + t];
            const T* vh = v + (h / group) * d;
            float* a = acc.data() + h * d;
#pragma omp simd
            for (int64_t j = 0; j < d; ++j) a[j] += p * load(vh[j]);
          }
        }
      }
      for (int64_t h = 0; h < nq; ++h) {
        T* dst = out + (i * heads + g0 * group + h) * d;
        const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        for (int64_t j = 0; j < d; ++j) dst[j] = sarathi::store<T>(acc[h * d + j] * inv);
      }
    }
  }
}

}  // namespace

#define SARATHI_DECODE(NAME, T)                                                                             \
  extern "C" void NAME(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables,          \
                       const int32_t* lens, T* out, int64_t n, int64_t heads, int64_t d, int64_t block_size,   \
                       int64_t kv_heads, int64_t max_blocks, float scale, int threads) {                      \
    paged_decode<T>(q, q_stride, kc, vc, tables, lens, out, n, heads, d, block_size, kv_heads, max_blocks, scale, \
                    threads);                                                                                 \
  }
SARATHI_DECODE(paged_decode_f32, float)
SARATHI_DECODE(paged_decode_bf16, sarathi::bf16)
