// What the prefill attention kernels share (paged_prefill_cpu.cpp, paged_prefill_amx.cpp): the work
// items, and the inline exp of their online softmax.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

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

#if defined(SARATHI_AMX)
// paged_prefill_cpu.cpp's bfloat16 attention through AMX tiles (paged_prefill_amx.cpp); same
// arguments. The caller checks amx_permitted().
void paged_prefill_amx(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc, const int32_t* tables,
                       const int32_t* starts, const int32_t* lens, bf16* out, int64_t n, int64_t heads, int64_t d,
                       int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads);
#endif

}  // namespace sarathi
