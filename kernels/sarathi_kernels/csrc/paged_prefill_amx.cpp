// bfloat16 prefill attention through AMX tile multiply-adds, where the CPU has them (Sapphire Rapids
// Xeon on): paged_prefill_cpu.cpp's work items, masks and roundings (bfloat16 products summed in
// float32, probabilities rounded to bfloat16 before p x v), in a loop of its own.
//
// Why its own loop: the first AMX version (session 12) ran the vector kernels' loop with tiles in
// place of vdpbf16ps. Per 16 keys and 16 rows it stored the scores for the softmax, rescaled the
// accumulators in memory, gathered the probabilities into rows, and loaded, multiplied and stored
// four accumulator tiles at half depth; perf put most of its time at those tile loads and stores
// (prefill 512: 1.65-1.70 ms per layer, ~240 GFLOP/s where oneDNN's GEMMs reach 2.2 TFLOP/s).
// Here a row group keeps its accumulators in tile registers over all its keys (heads up to 64 wide:
// four tiles; wider ones load and store them around each block), keys go 32 at a time (full-depth
// tiles), and each row's running max moves only when a block's max passes it by more than 8 ln 2
// (FlashAttention-4's conditional rescaling): probabilities then reach at most 256, and the
// accumulators, which tiles cannot scale, leave their registers only when a max grows that much.
//
// Per row group (16 rows of token x query head, as in the vector kernels):
//   scores [32 keys][16 rows] = keys [32][d] x query pairs [d/2][16 rows][2]   (two tiles)
//   the online softmax across rows, one lane each
//   acc [16 rows][dp] += probabilities [16 rows][32 keys] x value pairs [16][dp][2]
// The softmax leaves probabilities as [keys][rows]: pairs of keys rounded to bfloat16 side by side,
// then a 16 x 16 transpose of those 32-bit pairs gives the A tile's rows.
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
constexpr float TAU = 5.545177444f;  // 8 ln 2: how far a block's max may pass a row's running max
constexpr float E_TAU = 256.f;       // exp(TAU)

// 16 rows of 16 32-bit elements transposed in registers.
inline void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // Now b[4i + k]'s 128-bit lane j holds rows 4i..4i+3 of column 4j + k.
  for (int k = 0; k < 4; ++k) {
    const __m512i c0 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x44), c1 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xEE);
    const __m512i c2 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x44);
    const __m512i c3 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xEE);
    r[k] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    r[4 + k] = _mm512_shuffle_i32x4(c0, c2, 0xDD);
    r[8 + k] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(c1, c3, 0xDD);
  }
}

// One block of KEYS keys for 16 rows, a row per lane. s [KEYS][16]: raw scores in, probabilities
// out; row i sees key t when t <= last[i]. m, l: the rows' running max and sum. Returns whether
// some row's accumulators must be multiplied by its rescale (1 in the other lanes).
inline bool softmax_block(float* s, const int32_t* last_keys, float scale, float* m_rows, float* l_rows,
                          float* rescale_rows) {
  const vec lowest = vec{} - FLT_MAX, m = vload(m_rows);
  ivec last;
  std::memcpy(&last, last_keys, sizeof last);
  // Four running maxima: one max's latency per key in a single chain was most of this function's
  // time (a select on a compare per key: ~7 cycles x 32 keys).
  __m512 tops[4] = {(__m512)m, (__m512)lowest, (__m512)lowest, (__m512)lowest};
  for (int32_t t = 0; t < KEYS; ++t) {
    const vec x = vload(s + t * W) * scale;
    vstore(s + t * W, x);
    tops[t % 4] = _mm512_max_ps(tops[t % 4], (__m512)(t <= last ? x : lowest));
  }
  const vec top = (vec)_mm512_max_ps(_mm512_max_ps(tops[0], tops[1]), _mm512_max_ps(tops[2], tops[3]));
  const ivec first = m == lowest, grow = first | (top > m + TAU), scaled = grow & ~first;
  const vec m_new = grow ? top : m;
  vec sums[2] = {};
  for (int32_t t = 0; t < KEYS; ++t) {
    const vec e = exp_nonpositive(vload(s + t * W) - m_new - TAU) * E_TAU, p = t <= last ? e : vec{};
    vstore(s + t * W, p);
    sums[t % 2] += p;
  }
  const vec sum = sums[0] + sums[1];
  const vec rescale = exp_nonpositive(scaled ? m - m_new : vec{});
  vstore(rescale_rows, rescale);
  vstore(l_rows, vload(l_rows) * rescale + sum);
  vstore(m_rows, m_new);
  return _mm512_test_epi32_mask((__m512i)scaled, (__m512i)scaled) != 0;
}

}  // namespace

// The tile intrinsics paste their tile number into the instruction: one statement per resident
// accumulator tile, as (cb, tile): tiles 3-6 hold columns 16 cb.. of the row group's accumulators
// acc [16][dp], nacc of them in use.
#define SARATHI_EACH_RESIDENT(STMT) STMT(0, 3) STMT(1, 4) STMT(2, 5) STMT(3, 6)
#define SARATHI_ZERO(cb, tile) \
  if (cb < nacc) _tile_zero(tile);
#define SARATHI_SPILL(cb, tile) \
  if (cb < nacc) _tile_stored(tile, acc.data() + cb * W, dp * sizeof(float));
#define SARATHI_FILL(cb, tile) \
  if (cb < nacc) _tile_loadd(tile, acc.data() + cb * W, dp * sizeof(float));
#define SARATHI_PV(cb, tile)                            \
  if (cb < nacc) {                                      \
    _tile_loadd(1, vb + cb * W, dp * sizeof(uint32_t)); \
    _tile_dpbf16ps(tile, 2, 1);                         \
  }

void paged_prefill_amx(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc, const int32_t* tables,
                       const int32_t* starts, const int32_t* lens, bf16* out, int64_t n, int64_t heads, int64_t d,
                       int64_t block_size, int64_t kv_heads, int64_t max_blocks, float scale, int threads) {
  if (n == 0) return;  // the buffers below are sized by the longest context
  const int64_t group = heads / kv_heads, row = kv_heads * d;
  const int64_t dk = (d + 31) / 32 * 32, dp = (d + W - 1) / W * W, nacc = dp / W;
  const bool resident = nacc <= RESIDENT;
  const int64_t max_keys = (*std::max_element(lens, lens + n) + KEYS - 1) / KEYS * KEYS;
  const std::vector<Item> items = work_items(starts, n, kv_heads);
  const int64_t nitems = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(threads) if (threads > 1 && nitems > 1)
  {
    TileConfig config;
    for (int t = 0; t < 8; ++t) config.set(t, 16, 64);
    _tile_loadconfig(&config);
    const int64_t rows_pad = (TILE * group + W - 1) / W * W;
    const std::vector<bf16> zero_row(dp + 32);       // keys and values past a context
    std::vector<bf16> kb(max_keys * dk);              // keys [keys][dk], zero past d
    std::vector<uint32_t> vp(max_keys / 2 * dp);      // value pairs [keys / 2][dp]: keys 2u, 2u + 1
    std::vector<uint32_t> qp(dk / 2 * rows_pad);      // query pairs [dk / 2][rows]
    std::vector<uint32_t> pa(W * W);                  // probabilities [16 rows][16 key pairs]
    std::vector<float> s(KEYS * W), acc(W * dp), m(W), l(W), rescale(W);
    std::vector<int32_t> limit(rows_pad), last(W);
    int64_t packed_seq = -1, packed_head = -1, packed_keys = 0;  // what kb and vp hold
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t w = 0; w < nitems; ++w) {
      const Item it = items[w];
      const int64_t q_len = starts[it.seq + 1] - starts[it.seq], ctx = lens[it.seq];
      const int64_t t0 = it.tile * TILE, t1 = std::min(q_len, t0 + TILE);
      const int64_t rows = (t1 - t0) * group, h0 = it.kv_head * group;
      const int64_t last_key = ctx - q_len + t1 - 1, keys = (last_key + KEYS) / KEYS * KEYS;
      // Row r = (token t0 + r / group, query head h0 + r % group); its last visible key.
      for (int64_t r = 0; r < rows_pad; ++r) {
        const bool real = r < rows;
        const bf16* src = real ? q + (starts[it.seq] + t0 + r / group) * q_stride + (h0 + r % group) * d : nullptr;
        limit[r] = real ? static_cast<int32_t>(ctx - q_len + t0 + r / group) : -1;
        element_pairs(src, real ? d : 0, dk / 2, qp.data() + r, rows_pad);
      }
      const auto cached = [&](const bf16* cache, int64_t pos) {
        if (pos > last_key) return zero_row.data();
        const int64_t slot = static_cast<int64_t>(tables[it.seq * max_blocks + pos / block_size]) * block_size;
        return cache + (slot + pos % block_size) * row + it.kv_head * d;
      };
      // Packed once for a run of items of one chunk and kv head (work_items hands them out in that
      // order, largest first); a later, smaller tile reads the earlier one's keys past its own
      // last key only under its masks.
      const bool repack = it.seq != packed_seq || it.kv_head != packed_head || keys > packed_keys;
      if (repack) {
        packed_seq = it.seq;
        packed_head = it.kv_head;
        packed_keys = keys;
      }
      for (int64_t t = 0; repack && t < keys; ++t) std::memcpy(kb.data() + t * dk, cached(kc, t), d * sizeof(bf16));
      for (int64_t u = 0; repack && u < keys / 2; ++u)
        value_pairs(cached(vc, 2 * u), cached(vc, 2 * u + 1), d, dp, vp.data() + u * dp);
      for (int64_t r0 = 0; r0 < rows; r0 += W) {
        const int64_t group_last = limit[std::min(rows, r0 + W) - 1];  // limits grow with r
        std::fill(m.begin(), m.end(), -FLT_MAX);
        std::fill(l.begin(), l.end(), 0.f);
        if (resident) {
          SARATHI_EACH_RESIDENT(SARATHI_ZERO)
        } else {
          std::fill(acc.begin(), acc.end(), 0.f);
        }
        for (int64_t k0 = 0; k0 <= group_last; k0 += KEYS) {
          _tile_zero(0);
          _tile_zero(7);
          for (int64_t j = 0; j < dk; j += 32) {
            _tile_loadd(2, qp.data() + j / 2 * rows_pad + r0, rows_pad * sizeof(uint32_t));
            _tile_loadd(1, kb.data() + k0 * dk + j, dk * sizeof(bf16));
            _tile_dpbf16ps(0, 1, 2);
            _tile_loadd(1, kb.data() + (k0 + W) * dk + j, dk * sizeof(bf16));
            _tile_dpbf16ps(7, 1, 2);
          }
          _tile_stored(0, s.data(), W * sizeof(float));
          _tile_stored(7, s.data() + W * W, W * sizeof(float));
          for (int64_t i = 0; i < W; ++i) last[i] = static_cast<int32_t>(limit[r0 + i] - k0);
          if (softmax_block(s.data(), last.data(), scale, m.data(), l.data(), rescale.data())) {
            if (resident) {
              SARATHI_EACH_RESIDENT(SARATHI_SPILL)
            }
            for (int64_t i = 0; i < W; ++i)
              for (int64_t j = 0; j < dp; ++j) acc[i * dp + j] *= rescale[i];
            if (resident) {
              SARATHI_EACH_RESIDENT(SARATHI_FILL)
            }
          }
          __m512i p[W];
          for (int64_t u = 0; u < W; ++u) p[u] = probability_pairs(s.data(), u);
          transpose16(p);
          for (int64_t i = 0; i < W; ++i) _mm512_storeu_si512(pa.data() + i * W, p[i]);
          _tile_loadd(2, pa.data(), W * sizeof(uint32_t));
          const uint32_t* vb = vp.data() + k0 / 2 * dp;
          if (resident) {
            SARATHI_EACH_RESIDENT(SARATHI_PV)
          } else {
            for (int64_t c = 0; c < dp; c += W) {
              _tile_loadd(3, acc.data() + c, dp * sizeof(float));
              _tile_loadd(1, vb + c, dp * sizeof(uint32_t));
              _tile_dpbf16ps(3, 2, 1);
              _tile_stored(3, acc.data() + c, dp * sizeof(float));
            }
          }
        }
        if (resident) {
          SARATHI_EACH_RESIDENT(SARATHI_SPILL)
        }
        for (int64_t i = 0; i < W && r0 + i < rows; ++i) {
          const int64_t r = r0 + i;
          bf16* dst = out + ((starts[it.seq] + t0 + r / group) * heads + h0 + r % group) * d;
          const float inv = 1.f / l[i];  // every row sees key 0, so l > 0
          for (int64_t j = 0; j < d; ++j) dst[j] = store<bf16>(acc[i * dp + j] * inv);
        }
      }
    }
    _tile_release();
  }
}

}  // namespace sarathi

#endif
