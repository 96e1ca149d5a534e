// bfloat16 prefill attention through AMX tile multiply-adds, where the CPU has them (Sapphire Rapids
// Xeon on): paged_prefill_cpu.cpp's work items and masks (bfloat16 products summed in float32,
// probabilities rounded to bfloat16 before p x v), in a loop of its own.
//
// Why its own loop: a first AMX version ran the vector kernels' loop with tiles in
// place of vdpbf16ps; perf put most of its time at tile loads and stores around every 16-key block.
// Here a row group keeps its accumulators in tile registers over all its keys (heads up to 64 wide:
// four tiles; wider ones load and store them around each block), keys go 32 at a time (full-depth
// tiles), and each row's running max moves only when a block's max passes it by more than 8 ln 2
// (FlashAttention-4's conditional rescaling; 8 in the softmax's base 2): probabilities then reach
// at most 256, and the accumulators, which tiles cannot scale, leave their registers only when a
// max grows that much.
//
// Per row group (16 rows of token x query head, as in the vector kernels), per block of 32 keys:
//   scores [32 keys][16 rows] = keys [32][d] x query pairs [d/2][16 rows][2]     (two tiles)
//   the online softmax across rows, one lane each
//   acc^T [d][16 rows] += values^T [d][32 keys] x probability pairs [16][16 rows][2]
// The accumulators are held transposed (a tile per 16 dimensions, a column per row) so that the
// probabilities, which the softmax leaves a row per lane, are the B operand as they stand: pairs of
// keys rounded to bfloat16 side by side. Holding them the usual way ([rows][d]) made the
// probabilities the A operand, a 16 x 16 transpose per block (64 shuffles, all on one port) and a
// tile load of that transpose's stores, where perf found a large share of the kernel stalled. The
// values are transposed instead, once per call, and the output once per row group.
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_common.h"
#include "prefill_common.h"

#if defined(SARATHI_AMX)

namespace sarathi {
namespace {

static_assert(W == 16, "AMX comes with AVX-512");
constexpr int64_t KEYS = 32;     // keys per block: a bfloat16 tile's full depth
constexpr int64_t RESIDENT = 4;  // accumulator tiles kept in registers (tile numbers 3-6)
// The softmax works in base 2: scores times scale x log2(e), so that 2^t needs no reduction by ln 2.
constexpr float TAU = 8.f;  // how far a block's max may pass a row's running max (log2 units)

// The first n (0..32) bfloat16 at p as 16 32-bit pairs, zero past n.
inline __m512i pairs_of(const bf16* p, int64_t n) {
  const __mmask32 mask = static_cast<__mmask32>((1ull << std::clamp<int64_t>(n, 0, 32)) - 1);
  return _mm512_maskz_loadu_epi16(mask, p);
}

// 2^t * 2^8 for t <= TAU-ish, t below -120 as -120 (a normal float, never a subnormal's slow path).
// 2^f on |f| <= 1/2 by a degree-4 polynomial fitted for relative error (< 3e-6, as the degree-5
// Taylor series in ln 2 units this replaced: the probabilities are rounded to bfloat16, 8 bits,
// before p x v); 2^n by scalef, and the 2^8 folded into the coefficients (exact: a power of two).
inline __m512 exp2_times_256(__m512 t) {
  t = _mm512_max_ps(t, _mm512_set1_ps(-120.f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(256 * 0.00957007147f), f, _mm512_set1_ps(256 * 0.0559177734f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(256 * 0.240247443f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(256 * 0.693121850f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(256 * 0.999999285f));
  return _mm512_scalef_ps(p, n);
}

// Lanes (rows) whose last visible key, relative to the block, is at least t.
inline __mmask16 sees(__m512i last, int32_t t) { return _mm512_cmp_epi32_mask(_mm512_set1_epi32(t), last, _MM_CMPINT_LE); }

// One block of KEYS keys for 16 rows, a row per lane. s [KEYS][16]: raw scores; row i sees key t
// when t <= last[i] (every key of the block, for every row, unless ``diagonal``). c: the softmax
// scale times log2(e), > 0. m, l: the rows' running max (of scores times c) and sum. Writes the
// probability pairs [KEYS / 2][16] (B's rows: keys 2u, 2u + 1 of each row side by side); returns
// whether a max moved, and then each row's rescale (1 where it held).
inline bool softmax_block(const float* s, bool diagonal, __m512i last, float c, __m512& m, __m512& l,
                          __m512& rescale, uint32_t* pairs) {
  const __m512 lowest = _mm512_set1_ps(-FLT_MAX), c_v = _mm512_set1_ps(c);
  // The raw scores' max, scaled once (c > 0 keeps their order). Four running maxima: one max's
  // latency per key in a single chain was most of this function's time (a select on a compare per
  // key: ~7 cycles x 32 keys). Unrolled whole: rolled, GCC kept tops[t % 4] on the stack, a store
  // and a reload around every max (unrolled: 1.01-1.03x the kernel; by 4: even).
  __m512 tops[4] = {lowest, lowest, lowest, lowest};
#pragma GCC unroll 32
  for (int32_t t = 0; t < KEYS; ++t) {
    const __m512 x = _mm512_loadu_ps(s + t * W);
    tops[t % 4] = diagonal ? _mm512_mask_max_ps(tops[t % 4], sees(last, t), tops[t % 4], x)
                           : _mm512_max_ps(tops[t % 4], x);
  }
  const __m512 top_raw = _mm512_max_ps(_mm512_max_ps(tops[0], tops[1]), _mm512_max_ps(tops[2], tops[3]));
  const __m512 top = _mm512_max_ps(m, _mm512_mul_ps(top_raw, c_v));
  const __mmask16 first = _mm512_cmp_ps_mask(m, lowest, _CMP_EQ_OQ);
  const __mmask16 grow = first | _mm512_cmp_ps_mask(top, _mm512_add_ps(m, _mm512_set1_ps(TAU)), _CMP_GT_OQ);
  const __mmask16 scaled = grow & ~first;
  const __m512 m_new = _mm512_mask_mov_ps(m, grow, top), shift = _mm512_add_ps(m_new, _mm512_set1_ps(TAU));
  __m512 sums[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int32_t u = 0; u < KEYS / 2; ++u) {
    __m512 e0 = exp2_times_256(_mm512_fmsub_ps(_mm512_loadu_ps(s + 2 * u * W), c_v, shift));
    __m512 e1 = exp2_times_256(_mm512_fmsub_ps(_mm512_loadu_ps(s + (2 * u + 1) * W), c_v, shift));
    if (diagonal) {
      e0 = _mm512_maskz_mov_ps(sees(last, 2 * u), e0);
      e1 = _mm512_maskz_mov_ps(sees(last, 2 * u + 1), e1);
    }
    sums[0] = _mm512_add_ps(sums[0], e0);
    sums[1] = _mm512_add_ps(sums[1], e1);
    _mm512_storeu_si512(pairs + u * W, probability_pairs(e0, e1));
  }
  const __m512 sum = _mm512_add_ps(sums[0], sums[1]);
  if (!scaled) {  // most blocks: no max moved (the first block's rows have no accumulators yet)
    l = _mm512_add_ps(l, sum);
    m = m_new;
    return false;
  }
  // 2^(m - m_new) where the max moved; 1 elsewhere.
  rescale = _mm512_mask_mov_ps(_mm512_set1_ps(1.f), scaled,
                               exp2_times_256(_mm512_sub_ps(_mm512_sub_ps(m, m_new), _mm512_set1_ps(TAU))));
  l = _mm512_fmadd_ps(l, rescale, sum);
  m = m_new;
  return true;
}

// Query pairs [dk / 2][rows_pad] (32-bit words: elements 2j, 2j + 1 of row r at j * rows_pad + r, zero
// past d and for padding rows) from rows' d elements: 16 x 16 blocks transposed in registers (a
// 32-bit store per pair was 7% of the kernel).
template <typename RowOf>
inline void pack_queries(RowOf row_of, int64_t rows, int64_t rows_pad, int64_t d, int64_t dk, uint32_t* qp) {
  for (int64_t r0 = 0; r0 < rows_pad; r0 += W)
    for (int64_t j0 = 0; j0 < dk / 2; j0 += W) {
      vec v[W];  // 32-bit words moved as floats: the transpose only moves bits
      for (int64_t i = 0; i < W; ++i)
        v[i] = (vec)(r0 + i < rows ? pairs_of(row_of(r0 + i) + 2 * j0, d - 2 * j0) : _mm512_setzero_si512());
      transpose(v);
      for (int64_t j = 0; j < W; ++j) _mm512_storeu_si512(qp + (j0 + j) * rows_pad + r0, (__m512i)v[j]);
    }
}

// Values of keys [k0, k0 + 32) transposed: vt [dp][32] bfloat16 (dimension c's 32 values in key
// order: the A operand of p x v), zero past d. value(t) gives key t's d elements.
template <typename ValueOf>
inline void pack_values(ValueOf value_of, int64_t k0, int64_t d, int64_t dp, bf16* vt) {
  for (int64_t c0 = 0; c0 < dp; c0 += W) {
    const __mmask16 cols = static_cast<__mmask16>((1u << std::clamp<int64_t>(d - c0, 0, 16)) - 1);
    vec v[W];  // v[u]: dimensions c0.. of keys 2u (low halves) and 2u + 1 (high)
    for (int64_t u = 0; u < W; ++u) {
      const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(cols, value_of(k0 + 2 * u) + c0));
      const __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(cols, value_of(k0 + 2 * u + 1) + c0));
      v[u] = (vec)_mm512_or_si512(a, _mm512_slli_epi32(b, 16));
    }
    transpose(v);
    for (int64_t c = 0; c < W; ++c) _mm512_storeu_si512(vt + (c0 + c) * KEYS, (__m512i)v[c]);
  }
}

}  // namespace

// The tile intrinsics paste their tile number into the instruction: one statement per resident
// accumulator tile, as (cb, tile): tiles 3-6 hold dimensions 16 cb.. of the row group's
// transposed accumulators acc [nacc][16][16], nacc of them in use.
#define SARATHI_EACH_RESIDENT(STMT) STMT(0, 3) STMT(1, 4) STMT(2, 5) STMT(3, 6)
#define SARATHI_ZERO(cb, tile) \
  if (cb < nacc) _tile_zero(tile);
#define SARATHI_SPILL(cb, tile) \
  if (cb < nacc) _tile_stored(tile, acc.data() + cb * W * W, W * sizeof(float));
#define SARATHI_FILL(cb, tile) \
  if (cb < nacc) _tile_loadd(tile, acc.data() + cb * W * W, W * sizeof(float));
#define SARATHI_PV(cb, tile)                                    \
  if (cb < nacc) {                                              \
    _tile_loadd(1, vb + cb * W * KEYS, KEYS * sizeof(bf16));    \
    _tile_dpbf16ps(tile, 1, 2);                                 \
  }

void paged_prefill_amx(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc, const int32_t* tables,
                       const int32_t* starts, const int32_t* lens, bf16* out, int64_t n, int64_t heads, int64_t d,
                       int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
  if (n == 0) return;
  const int64_t group = heads / kv_heads, row = kv_heads * d;
  const int64_t dk = (d + 31) / 32 * 32, dp = (d + W - 1) / W * W, nacc = dp / W;
  const bool resident = nacc <= RESIDENT;
  const float log2e_scale = scale * 1.44269504f;
  // Keys go into the tiles straight from the cache where 16 keys (a tile's rows) never straddle two
  // cache blocks and a head's d elements are whole tile rows; copying them first was half of the
  // packing below, itself a fifth of the kernel at 2K context.
  const bool keys_in_place = block_size % W == 0 && d == dk;
  // Every chunk's keys (where not read in place) and values, packed once per call for all its kv
  // heads: [chunk][kv head][its keys rounded up to 32] x dk keys and x dp transposed values
  // (pack_values' blocks), zero past its context. Packed per work item instead, each thread packed
  // every kv head it touched, one kv head's rows at a time (128 bytes every 1.5 KB of a cache row): a
  // third of the kernel at 256 + 256 tokens. Packing all heads of 32 keys at a time reads the cache's
  // rows whole. Kept by the calling thread between calls: a new buffer's pages faulted in on every call.
  std::vector<int64_t> first_key(n + 1, 0);  // chunk i's keys start at first_key[i] * kv_heads
  std::vector<std::pair<int64_t, int64_t>> key_blocks;  // (chunk, k0)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t keys = (lens[i] + KEYS - 1) / KEYS * KEYS;
    first_key[i + 1] = first_key[i] + keys;
    for (int64_t k0 = 0; k0 < keys; k0 += KEYS) key_blocks.emplace_back(i, k0);
  }
  thread_local line_vector<bf16> packed_k, packed_v;
  if (!keys_in_place) packed_k.resize(std::max<size_t>(packed_k.size(), first_key[n] * kv_heads * dk));
  packed_v.resize(std::max<size_t>(packed_v.size(), first_key[n] * kv_heads * dp));
  // Pointers, not the vectors: inside the parallel region each thread's thread_local is its own.
  bf16 *const all_k = packed_k.data(), *const all_v = packed_v.data();
  const auto packed = [&](bf16* buf, int64_t seq, int64_t head, int64_t width) {
    return buf + (first_key[seq] * kv_heads + head * (first_key[seq + 1] - first_key[seq])) * width;
  };
  const std::vector<Item> items = work_items(starts, n, kv_heads);
  const int64_t nitems = static_cast<int64_t>(items.size()), nblocks = static_cast<int64_t>(key_blocks.size());
#pragma omp parallel num_threads(threads) if (threads > 1 && nitems > 1)
  {
    const std::vector<bf16> zero_row(dp + 32);  // keys and values past a context
#pragma omp for schedule(dynamic, 4)
    for (int64_t b = 0; b < nblocks; ++b) {
      const auto [seq, k0] = key_blocks[b];
      for (int64_t h = 0; h < kv_heads; ++h) {
        const ContextRows<bf16> ctx{kc, vc, zero_row.data(), tables + seq * max_blocks, block_size, row, h * d,
                                    lens[seq], seq, h};
        if (!keys_in_place) {
          bf16* kb = packed(all_k, seq, h, dk) + k0 * dk;
          for (int64_t t = 0; t < KEYS; ++t) {
            std::memcpy(kb + t * dk, ctx.key(k0 + t), d * sizeof(bf16));
            std::fill(kb + t * dk + d, kb + (t + 1) * dk, bf16{0});
          }
        }
        pack_values([&](int64_t t) { return ctx.value(t); }, k0, d, dp, packed(all_v, seq, h, dp) + k0 * dp);
      }
    }
    TileConfig config;
    for (int t = 0; t < 8; ++t) config.set(t, 16, 64);
    _tile_loadconfig(&config);
    const int64_t rows_pad = (TILE * group + W - 1) / W * W;
    line_vector<uint32_t> qp(dk / 2 * rows_pad);  // query pairs [dk / 2][rows]
    line_vector<uint32_t> pairs(KEYS / 2 * W);    // probability pairs [16][16 rows]
    line_vector<float> s(2 * KEYS * W), acc(nacc * W * W);  // scores: two blocks' [KEYS][16]
    std::vector<int32_t> limit(rows_pad);
    // Each 16 keys' first row and the bytes between rows: in the cache (a block's rows are a token's
    // whole kv row apart), in the packed copy, or, past a context, a zero row read 16 times. Keys
    // past the context inside its last cache block are read as they are: their lanes are masked.
    std::vector<std::pair<const bf16*, int64_t>> key_rows;
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t w = 0; w < nitems; ++w) {
      const Item it = items[w];
      const sarathi::Span sp(it, starts, lens, group);
      // Row r = (token t0 + r / group, query head h0 + r % group); its last visible key. Padding rows
      // copy the last real row's, so that every lane sees key 0 and its softmax stays finite.
      for (int64_t r = 0; r < rows_pad; ++r)
        limit[r] = static_cast<int32_t>(sp.ctx - sp.q_len + sp.t0 + std::min(r, sp.rows - 1) / group);
      pack_queries([&](int64_t r) { return q + sp.at(r, q_stride, d); }, sp.rows, rows_pad, d, dk, qp.data());
      const bf16* vt = packed(all_v, it.seq, it.kv_head, dp);
      key_rows.clear();
      for (int64_t k = 0; k < first_key[it.seq + 1] - first_key[it.seq]; k += W) {
        if (!keys_in_place)
          key_rows.emplace_back(packed(all_k, it.seq, it.kv_head, dk) + k * dk, dk * sizeof(bf16));
        else if (k < sp.ctx)
          key_rows.emplace_back(kc + (static_cast<int64_t>(tables[it.seq * max_blocks + k / block_size]) * block_size +
                                      k % block_size) * row + it.kv_head * d,
                                row * sizeof(bf16));
        else
          key_rows.emplace_back(zero_row.data(), 0);
      }
      for (int64_t r0 = 0; r0 < sp.rows; r0 += W) {
        const int64_t group_last = limit[std::min(sp.rows, r0 + W) - 1];  // limits grow with r
        __m512 m = _mm512_set1_ps(-FLT_MAX), l = _mm512_setzero_ps(), rescale;
        const __m512i last_rows = _mm512_loadu_si512(limit.data() + r0);
        if (resident) {
          SARATHI_EACH_RESIDENT(SARATHI_ZERO)
        } else {
          std::fill(acc.begin(), acc.end(), 0.f);
        }
        // The scores of the block at k0, into tiles 0 and 7, then stored to its half of s. Two blocks
        // ahead: the tile unit computes a block's scores while the vector units run the softmax two
        // blocks before, and the softmax reads scores stored a block earlier (a vector load of a
        // tile store's bytes waits for them to reach the cache; perf put ~1/4 of the kernel there).
        const auto issue_scores = [&](int64_t k0) {
          _tile_zero(0);
          _tile_zero(7);
          const auto [lo, lo_stride] = key_rows[k0 / W];
          const auto [hi, hi_stride] = key_rows[k0 / W + 1];
          for (int64_t j = 0; j < dk; j += 32) {
            _tile_loadd(2, qp.data() + j / 2 * rows_pad + r0, rows_pad * sizeof(uint32_t));
            _tile_loadd(1, lo + (lo_stride ? j : 0), lo_stride);
            _tile_dpbf16ps(0, 1, 2);
            _tile_loadd(1, hi + (hi_stride ? j : 0), hi_stride);
            _tile_dpbf16ps(7, 1, 2);
          }
        };
        const auto scores_of = [&](int64_t k0) { return s.data() + (k0 / KEYS % 2) * KEYS * W; };
        const auto store_scores = [&](int64_t k0) {
          _tile_stored(0, scores_of(k0), W * sizeof(float));
          _tile_stored(7, scores_of(k0) + W * W, W * sizeof(float));
        };
        issue_scores(0);
        store_scores(0);
        if (KEYS <= group_last) issue_scores(KEYS);
        for (int64_t k0 = 0; k0 <= group_last; k0 += KEYS) {
          if (k0 + KEYS <= group_last) {
            store_scores(k0 + KEYS);
            if (k0 + 2 * KEYS <= group_last) issue_scores(k0 + 2 * KEYS);
          }
          // Masks only where some row's last key falls inside the block (the group's first row's
          // is the smallest).
          const bool diagonal = k0 + KEYS - 1 > limit[r0];
          const __m512i last = _mm512_sub_epi32(last_rows, _mm512_set1_epi32(static_cast<int32_t>(k0)));
          if (softmax_block(scores_of(k0), diagonal, last, log2e_scale, m, l, rescale, pairs.data())) {
            if (resident) {
              SARATHI_EACH_RESIDENT(SARATHI_SPILL)
            }
            for (int64_t j = 0; j < nacc * W; ++j)
              _mm512_storeu_ps(acc.data() + j * W, _mm512_mul_ps(_mm512_loadu_ps(acc.data() + j * W), rescale));
            if (resident) {
              SARATHI_EACH_RESIDENT(SARATHI_FILL)
            }
          }
          _tile_loadd(2, pairs.data(), W * sizeof(uint32_t));
          const bf16* vb = vt + k0 * dp;
          if (resident) {
            SARATHI_EACH_RESIDENT(SARATHI_PV)
          } else {
            for (int64_t cb = 0; cb < nacc; ++cb) {
              _tile_loadd(3, acc.data() + cb * W * W, W * sizeof(float));
              _tile_loadd(1, vb + cb * W * KEYS, KEYS * sizeof(bf16));
              _tile_dpbf16ps(3, 1, 2);
              _tile_stored(3, acc.data() + cb * W * W, W * sizeof(float));
            }
          }
        }
        if (resident) {
          SARATHI_EACH_RESIDENT(SARATHI_SPILL)
        }
        // acc^T / l, transposed back to rows of 16 dimensions and rounded to bfloat16 as store<bf16>.
        const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), l);  // every row sees key 0, so l > 0
        for (int64_t cb = 0; cb < nacc; ++cb) {
          vec v[W];
          for (int64_t c = 0; c < W; ++c) v[c] = (vec)_mm512_mul_ps(_mm512_loadu_ps(acc.data() + (cb * W + c) * W), inv);
          transpose(v);
          const __mmask16 cols = static_cast<__mmask16>((1u << std::min<int64_t>(W, d - cb * W)) - 1);
          for (int64_t i = 0; i < W && r0 + i < sp.rows; ++i) {
            const int64_t r = r0 + i;
            bf16* dst = out + sp.at(r, heads * d, d) + cb * W;
            _mm256_mask_storeu_epi16(dst, cols, (__m256i)_mm512_cvtneps_pbh((__m512)v[i]));
          }
        }
      }
    }
    _tile_release();
  }
}

}  // namespace sarathi

#endif
