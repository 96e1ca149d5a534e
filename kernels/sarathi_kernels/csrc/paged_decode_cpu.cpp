// Decode attention over the paged KV cache on the CPU: one query token per request, each K/V row
// read once, straight from its cache block (no gather), with an online softmax per block.
//
// Why a kernel: the CPU flash-attention op reads a one-query head over strided cache rows at
// 6-7 GB/s per thread and needs the context gathered or split into runs; this loop streams every
// (request, kv head)'s rows in block order, so it runs near copy bandwidth (benchmarks/RESULTS.md).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
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

// query [n, heads, d]; k_cache, v_cache [blocks, block_size, kv_heads, d] (contiguous);
// block_tables [n, max_blocks] int32; seq_lens [n] int32 -> [n, heads, d]
torch::Tensor paged_decode(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale) {
  TORCH_CHECK(query.scalar_type() == torch::kFloat && k_cache.scalar_type() == torch::kFloat &&
                  v_cache.scalar_type() == torch::kFloat, "paged_decode: float32 only");
  TORCH_CHECK(query.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode: contiguous tensors only");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt && seq_lens.scalar_type() == torch::kInt,
              "paged_decode: int32 block tables and lengths");
  const int64_t n = query.size(0), heads = query.size(1), d = query.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = block_tables.size(1);
  const int64_t row = kv_heads * d;  // floats between consecutive tokens of one head
  auto tables = block_tables.contiguous();
  auto lens = seq_lens.contiguous();
  auto out = torch::empty_like(query);
  const float* q = query.data_ptr<float>();
  const float* kc = k_cache.data_ptr<float>();
  const float* vc = v_cache.data_ptr<float>();
  const int* tp = tables.data_ptr<int>();
  const int* lp = lens.data_ptr<int>();
  float* o = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);

  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * block_size), acc(group * d), m(group), l(group);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t i = w / kv_heads, g = w % kv_heads, len = lp[i];
      const float* qi = q + (i * heads + g * group) * d;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t b = 0; b * block_size < len; ++b) {
        const int64_t tokens = std::min(block_size, len - b * block_size);
        const int64_t base = (static_cast<int64_t>(tp[i * max_blocks + b]) * block_size * kv_heads + g) * d;
        const float* kb = kc + base;
        const float* vb = vc + base;
        // Scores of every query head of the group against the block's keys, and each head's
        // running max and sum rescaled once per block rather than once per key.
        for (int64_t h = 0; h < group; ++h) {
          float* s = scores.data() + h * block_size;
          float top = m[h];
          for (int64_t t = 0; t < tokens; ++t) {
            s[t] = dot(qi + h * d, kb + t * row, d) * sc;
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
        float* dst = o + (i * heads + g * group + h) * d;
        const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        for (int64_t j = 0; j < d; ++j) dst[j] = acc[h * d + j] * inv;
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "decode attention over a paged KV cache (CPU, float32)");
}
