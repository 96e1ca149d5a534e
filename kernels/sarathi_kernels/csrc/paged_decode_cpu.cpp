// Decode attention over the paged KV cache on the CPU: one query token per request, each K/V row
// read once, straight from its cache block (no gather), with an online softmax per block.
//
// Why a kernel: the CPU flash-attention op reads a one-query head over strided cache rows at
// 6-7 GB/s per thread and needs the context gathered or split into runs; this loop streams every
// (request, kv head)'s rows in block order, so it runs near copy bandwidth (benchmarks/RESULTS.md).
//
// Plain C ABI over raw pointers, no torch headers: the system compiler builds it in about a second
// and ctypes loads it (cpu_decode.py checks dtypes, shapes and contiguity before calling).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) s += a[j] * b[j];
  return s;
}

}  // namespace

// q, out [n, heads, d]; k_cache, v_cache [blocks, block_size, kv_heads, d]; block_tables [n, max_blocks];
// seq_lens [n]. All contiguous, float32 and int32. Work items (request, kv head) are split into
// contiguous ranges over `threads` OpenMP threads, as torch's at::parallel_for does.
extern "C" void paged_decode(const float* q, const float* kc, const float* vc, const int32_t* tables,
                             const int32_t* lens, float* out, int64_t n, int64_t heads, int64_t d,
                             int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
  const int64_t group = heads / kv_heads;
  const int64_t row = kv_heads * d;  // floats between consecutive tokens of one head
#pragma omp parallel num_threads(threads) if (threads > 1 && n * kv_heads > 1)
  {
    std::vector<float> scores(group * block_size), acc(group * d), m(group), l(group);
    // nowait: the region's end is the only barrier; a second one measured 15-40% slower on a loaded
    // 2-core machine, where every barrier waits for a descheduled thread.
#pragma omp for schedule(static) nowait
    for (int64_t w = 0; w < n * kv_heads; ++w) {
      const int64_t i = w / kv_heads, g = w % kv_heads, len = lens[i];
      const float* qi = q + (i * heads + g * group) * d;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t b = 0; b * block_size < len; ++b) {
        const int64_t tokens = std::min(block_size, len - b * block_size);
        const int64_t base = (static_cast<int64_t>(tables[i * max_blocks + b]) * block_size * kv_heads + g) * d;
        const float* kb = kc + base;
        const float* vb = vc + base;
        // Scores of every query head of the group against the block's keys, and each head's
        // running max and sum rescaled once per block rather than once per key.
        for (int64_t h = 0; h < group; ++h) {
          float* s = scores.data() + h * block_size;
          float top = m[h];
          for (int64_t t = 0; t < tokens; ++t) {
            s[t] = dot(qi + h * d, kb + t * row, d) * scale;
            top = std::max(top, s[t]);
          }
          const float rescale = std::exp(m[h] - top);
          float* a = acc.data() + h * d;
          float sum = l[h] * rescale;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) a[j] *= rescale;
          for (int64_t t = 0; t < tokens; ++t) {
            const float p = std::exp(s[t] - top);
            sum += p;
            const float* v = vb + t * row;
#pragma omp simd
            for (int64_t j = 0; j < d; ++j) a[j] += p * v[j];
          }
          m[h] = top;
          l[h] = sum;
        }
      }
      for (int64_t h = 0; h < group; ++h) {
        float* dst = out + (i * heads + g * group + h) * d;
        const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        for (int64_t j = 0; j < d; ++j) dst[j] = acc[h * d + j] * inv;
      }
    }
  }
}
