// What the prefill attention kernels share (paged_prefill_cpu.cpp, paged_prefill_amx.cpp): the work
// items and their keys' places in the caches, the probabilities' bfloat16 pairing, and the AMX
// loop's declaration.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu_common.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace sarathi {

constexpr int64_t TILE = 64;  // query tokens per work item (32: 0.9-0.97x at 288-1024 keys)

struct Item {
  int64_t seq, kv_head, tile;
};

// A work item's share of its chunk: query tokens [t0, t1) of the chunk's q_len, whose context holds
// ctx keys (the chunk's own included), as rows (token x query head) of query heads h0 .. h0 + group.
struct Span {
  int64_t first, q_len, ctx, t0, t1, group, rows, h0;
  Span(const Item& it, const int32_t* starts, const int32_t* lens, int64_t group)
      : first(starts[it.seq]), q_len(starts[it.seq + 1] - first), ctx(lens[it.seq]), t0(it.tile * TILE),
        t1(std::min(q_len, t0 + TILE)), group(group), rows((t1 - t0) * group), h0(it.kv_head * group) {}
  // Row r = (token t0 + r / group, query head h0 + r % group): its place in a [tokens, heads, d]
  // tensor whose tokens lie token_stride elements apart (q, inside the fused qkv output, or out).
  int64_t at(int64_t r, int64_t token_stride, int64_t d) const {
    return (first + t0 + r / group) * token_stride + (h0 + r % group) * d;
  }
};

// One item per chunk tile and kv head, a chunk's last tiles first: they see the most keys, and
// dynamic scheduling balances best that way. A kv head's tiles follow each other, so that a thread
// mostly takes several of them in a row and finds their keys in its caches.
inline std::vector<Item> work_items(const int32_t* starts, int64_t n, int64_t kv_heads) {
  std::vector<Item> items;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t tiles = (starts[i + 1] - starts[i] + TILE - 1) / TILE;
    for (int64_t g = 0; g < kv_heads; ++g)
      for (int64_t t = tiles - 1; t >= 0; --t) items.push_back({i, g, t});
  }
  return items;
}

// One chunk's keys and values of one kv head where they sit in the paged caches; past the context (a
// block's padding keys) a zero row.
template <typename T>
struct ContextRows {
  const T *kc, *vc, *zero;
  const int32_t* table;
  int64_t block_size, row, offset, len, seq, kv_head;
  int64_t at(int64_t pos) const {
    return (static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size) * row + offset;
  }
  const T* key(int64_t pos) const { return pos < len ? kc + at(pos) : zero; }
  const T* value(int64_t pos) const { return pos < len ? vc + at(pos) : zero; }
  // f(pos, key, value) for pos in [from, upto), a block's place looked up once (key() per position
  // divides by the block size twice: that was most of the float32 kernel's copying).
  template <typename F>
  void each_row(int64_t from, int64_t upto, F f) const {
    for (int64_t pos = from; pos < upto;) {
      if (pos >= len) {
        f(pos++, zero, zero);
        continue;
      }
      const int64_t end = std::min({upto, len, (pos / block_size + 1) * block_size});
      for (const T *k = kc + at(pos), *v = vc + at(pos); pos < end; ++pos, k += row, v += row) f(pos, k, v);
    }
  }
};

#if defined(__AVX512BF16__)
// Two keys' probabilities for 16 rows (a row per lane), rounded to bfloat16 and paired per row: lane r
// = (a[r], b[r]), a in the low half. One row of the B operand of vdpbf16ps (broadcast per row) and of
// a tile multiply-add.
inline __m512i probability_pairs(__m512 a, __m512 b) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(b, a));
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
