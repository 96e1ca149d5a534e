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
// Storage is float32 or bfloat16 (cpu_common.h); the arithmetic is float32 either way.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_common.h"

namespace {

using sarathi::load;
using sarathi::vec;
using sarathi::vload;
using sarathi::vstore;
using sarathi::W;  // floats per vector, and keys per softmax step

constexpr int64_t TILE = 64;  // query tokens per work item (32: 0.9-0.97x at 288-1024 keys)

struct Item {
  int64_t seq, kv_head, tile;
};

// q [tokens, heads, d] with token stride q_stride (elements; q may sit inside the fused qkv
// output); out [tokens, heads, d] contiguous; caches [blocks, block_size, kv_heads, d] contiguous;
// starts [n + 1] (the chunks' first rows in q), lens [n] (context lengths, this chunk included),
// tables [n, max_blocks]. Accumulators and values are padded to dp, d rounded up to 16 floats.
template <typename T>
void paged_prefill(const T* q, int64_t q_stride, const T* kc, const T* vc, const int32_t* tables,
                   const int32_t* starts, const int32_t* lens, T* out, int64_t n, int64_t heads, int64_t d,
                   int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
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
    // Rows padded to a multiple of 4 so that the 4-row loops need no remainder.
    const int64_t rows_pad = (rows_max + 3) / 4 * 4;
    std::vector<float> qf(rows_pad * d), acc(rows_pad * dp), kt(d * W), vf(W * dp, 0.f), p(rows_pad * W);
    std::vector<float> m(rows_pad), l(rows_pad);
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
        float* dst = qf.data() + r * d;
        if (real) {
          const T* src = q + (starts[it.seq] + tok) * q_stride + (h0 + r % group) * d;
          for (int64_t j = 0; j < d; ++j) dst[j] = load(src[j]) * scale;
        } else {
          std::fill(dst, dst + d, 0.f);
        }
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
            for (int64_t j = 0; j < d; ++j) {
              kt[j * W + t] = load(kc[off + j]);
              vf[t * dp + j] = load(vc[off + j]);
            }
          } else {
            for (int64_t j = 0; j < d; ++j) {
              kt[j * W + t] = 0.f;
              vf[t * dp + j] = 0.f;
            }
          }
        }
        // Scores of four rows at a time: s_r += q[r][j] * keys^T[j], 16 keys per vector.
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
          vstore(p.data() + r * W, s0);
          vstore(p.data() + (r + 1) * W, s1);
          vstore(p.data() + (r + 2) * W, s2);
          vstore(p.data() + (r + 3) * W, s3);
        }
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
        // acc_r += p_r[t] * values[t], four rows per loaded value vector.
        for (int64_t r = 0; r < rows; r += 4) {
          const float *p0 = p.data() + r * W, *p1 = p0 + W, *p2 = p1 + W, *p3 = p2 + W;
          for (int64_t c = 0; c < dp; c += W) {
            float* base = acc.data() + r * dp + c;
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
