// Linear layers of a few rows (decode batches) on the CPU: out = x W^T (+ bias), x [M, K] with
// M <= 16 (float32, and bfloat16 on AMX: any M, beyond 16 a GEMM, below), over a copy of W packed
// once at load time.
//
// Why: a decode iteration streams every linear weight from memory once; oneDNN's matmul streams
// them at 18-19 GB/s on 2 Zen 4 cores at 1-8 rows (float32 and bfloat16) where a plain read of the
// same tensors runs at 27-35 (benchmarks/RESULTS.md).
//
// Packed layout: tiles of W output columns (W floats per vector: 16 with AVX-512, 8 with AVX2; N
// padded with zero columns; linear_tile_columns() tells the caller). float32 [N/W][K][W]: one
// vector holds element k of W rows of W. bfloat16 [N/W][K/2][W][2] (K padded to even): one vector
// holds elements 2p and 2p+1 of W rows, side by side, as vdpbf16ps reads them.
// How: each thread takes a contiguous range of tiles and walks TB of them side by side; every
// weight vector loaded feeds M multiply-adds against x broadcast from a transposed copy of x
// ([K][M], so each broadcast is a fixed offset), the M x TB accumulators are registers (M is a
// template parameter; TB is chosen so that they fit the vector registers beside the weight
// vectors) and end as W finished outputs each: no horizontal sums. bfloat16 with AVX512_BF16: one
// vdpbf16ps per vector and row (exact products, float32 sums); without it, vload2's even/odd split
// and two FMAs, x in float32.
// bfloat16 with AMX (Intel Xeon Sapphire Rapids on): the bfloat16 layout is already AMX's
// VNNI-packed B tile (16 pairs of k x 16 columns = 1 KB contiguous), so tile multiply-adds take
// every row count at once. Why: there vdpbf16ps issues at ~0.5 per cycle, and at 8-16 rows the
// vector loop became compute-bound (cpu-small's weights at 9-11 GB/s against 25 at 1 row), while a
// tile multiply-add consumes 1 KB of weights per 16 cycles whatever the rows (benchmarks/RESULTS.md).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu_common.h"

namespace {

using sarathi::bf16;
using sarathi::load;
using sarathi::vec;
using sarathi::vload;
using sarathi::W;

constexpr int MAX_ROWS = 16;
constexpr int64_t SPAN = 64;  // packed vectors summed before joining an output's total
// Each tile's weights are prefetched this far ahead where a cache line of them feeds more than 8
// multiply-add instructions (rows x steps in a line x instructions per step and row): there the
// multiply-adds outrun the hardware prefetcher, which falls behind (8 float32 rows with AVX2
// streamed at 13-20 GB/s against a 30 GB/s copy; 0.71-0.76x the time at 8-16 rows, bfloat16
// 0.80-0.88x at 4-12). At 8 or fewer the prefetches cost more load slots than they save (AVX-512 float32:
// 1.3-1.7x the time at 1-4 rows; bfloat16 1.00-1.07x at 8 rows; benchmarks/RESULTS.md).
constexpr int64_t kPrefetchBytes = 2048;
constexpr bool kBf16Dot =
#if defined(__AVX512BF16__)
    true;
#else
    false;
#endif

template <typename T>
constexpr int64_t pair_of = std::is_same<T, bf16>::value ? 2 : 1;  // k elements per packed vector

// Register blocking: R rows x TB tiles of accumulators, TB weight vectors and a broadcast x in the
// vector registers. Up to a quarter of the registers' rows (4 with AVX-512's 32, 2 with AVX2's 16)
// TB is 4, all rows at once. Beyond, TB is 3 and the rows go in chunks of at most a quarter of the
// registers (8 with AVX-512, 4 with AVX2), one after another over each span of steps, whose weights
// the first chunk brought into L1: one weight vector then feeds up to 3 x 8 (3 x 4) multiply-adds
// per 8 (4) broadcasts, where one tile of up to 14 rows at once fed 1 per broadcast and 15-16 rows
// with AVX2 spilled accumulators. Measured on a Xeon with AMX, cpu-small's weights streamed from
// memory, 2 threads: AVX2 build 1.07-1.11x at 3-4 rows, 1.19-1.31x at 8-16; AVX-512 1.06-1.14x at
// 6-8 rows, 1.25-1.30x at 16 (1.03x over the two-tile blocks with spilled accumulators it replaces).
// Each output is the same sums in the same order whatever the rows and blocking: a row's results
// are equal bit for bit whichever batch it comes in.
constexpr int kSmallRows = sarathi::kVectorRegisters / 8;
constexpr int tiles_per_block(int m) { return m <= kSmallRows ? 4 : 3; }
constexpr int row_chunks(int m) {
  return m <= kSmallRows ? 1 : (m + sarathi::kVectorRegisters / 4 - 1) / (sarathi::kVectorRegisters / 4);
}
constexpr int chunk_row(int m, int c) { return c * m / row_chunks(m); }

// x for the inner loop: float32 [Kp][M] (k padded to the packing), or, for vdpbf16ps, bfloat16
// pairs [Kp / 2][M] as 32-bit words.
struct XT {
  const float* f;
  const uint32_t* pairs;
};

// Rows [R0, R1) of M against TB tiles over packed steps [s0, s1): their partial sums into total.
template <typename T, int M, int TB, int R0, int R1>
inline void span_rows(const XT& x, const T* const* wt, int64_t s0, int64_t s1, vec (&total)[M][TB]) {
  constexpr int R = R1 - R0;
  constexpr int64_t P = pair_of<T>;
  constexpr int64_t kStepBytes = W * P * sizeof(T);
  constexpr int64_t kStepsPerLine = std::max<int64_t>(1, sarathi::kLineBytes / kStepBytes);
  constexpr bool kPrefetch = R0 == 0 && M * kStepsPerLine * (P == 2 && !kBf16Dot ? 2 : 1) > 8;
  vec acc[R][TB] = {};
  for (int64_t s = s0; s < s1; ++s) {
    if constexpr (kPrefetch)
      if (s % kStepsPerLine == 0)
        for (int b = 0; b < TB; ++b) __builtin_prefetch(sarathi::ahead(wt[b] + s * W * P, kPrefetchBytes));
    if constexpr (P == 2 && kBf16Dot) {
#if defined(__AVX512BF16__)
      __m512bh w[TB];
      for (int b = 0; b < TB; ++b) w[b] = (__m512bh)_mm512_loadu_si512(wt[b] + s * W * 2);
      for (int m = 0; m < R; ++m) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x.pairs[s * M + R0 + m]));
        for (int b = 0; b < TB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], w[b], xb);
      }
#endif
    } else if constexpr (P == 2) {
      vec even[TB], odd[TB];
      for (int b = 0; b < TB; ++b) sarathi::vload2(wt[b] + s * W * 2, even[b], odd[b]);
      for (int m = 0; m < R; ++m) {
        const float xe = x.f[2 * s * M + R0 + m], xo = x.f[(2 * s + 1) * M + R0 + m];
        for (int b = 0; b < TB; ++b) acc[m][b] += xe * even[b] + xo * odd[b];
      }
    } else {
      vec w[TB];
      for (int b = 0; b < TB; ++b) w[b] = sarathi::in_register(vload(wt[b] + s * W));
      for (int m = 0; m < R; ++m) {
        const float xk = x.f[s * M + R0 + m];
        for (int b = 0; b < TB; ++b) acc[m][b] += xk * w[b];
      }
    }
  }
  for (int m = 0; m < R; ++m)
    for (int b = 0; b < TB; ++b) total[R0 + m][b] += acc[m][b];
}

template <typename T, int M, int TB, std::size_t... C>
inline void span_chunks(std::index_sequence<C...>, const XT& x, const T* const* wt, int64_t s0, int64_t s1,
                        vec (&total)[M][TB]) {
  (span_rows<T, M, TB, chunk_row(M, C), chunk_row(M, C + 1)>(x, wt, s0, s1, total), ...);
}

// Greedy sampling fused into the few-row paths (linear_argmax): each thread keeps, for each row, a
// running maximum per lane of the outputs it writes, read back as stored (rounded to T), and the
// answer is argmax_cpu.cpp's over the same outputs: each row's first index of its maximum, or of its
// first NaN. Why: the argmax over an LM head's logits just written read them back from L3 after the
// forward pass, 71.5 of a greedy bfloat16 decode iteration's 82 us of sampling (16 x 32,000, Xeon
// with AMX); here they are in L1. Per lane the columns come in increasing order, and a lane's entry
// changes only to a larger value or a first NaN, so it holds its earliest maximum (or first NaN).
struct alignas(64) RowTops {
  vec top[MAX_ROWS];
  sarathi::ivec at[MAX_ROWS];
  bool started[MAX_ROWS] = {};
};

template <std::size_t... I>
constexpr sarathi::ivec lane_numbers(std::index_sequence<I...>) {
  return sarathi::ivec{static_cast<int32_t>(I)...};
}
constexpr sarathi::ivec kLane = lane_numbers(std::make_index_sequence<W>{});

// Row m's outputs [n0, n0 + cols) as stored at y (cols <= W) offered to t; lanes past cols repeat
// column n0, an output offered anyway, so that they change no answer.
template <typename T>
inline void offer(RowTops& t, int64_t m, const T* y, int64_t n0, int64_t cols) {
  vec v;
  sarathi::ivec at;
  if (cols == W) {
    v = vload(y);
    at = kLane + static_cast<int32_t>(n0);
  } else {
    for (int64_t c = 0; c < W; ++c) {
      v[c] = load(y[c < cols ? c : 0]);
      at[c] = static_cast<int32_t>(n0 + (c < cols ? c : 0));
    }
  }
  if (!t.started[m]) {
    t.top[m] = v;
    t.at[m] = at;
    t.started[m] = true;
    return;
  }
  const sarathi::ivec take = ~sarathi::is_nan(t.top[m]) & ((v > t.top[m]) | sarathi::is_nan(v));
  t.top[m] = take ? v : t.top[m];
  t.at[m] = take ? at : t.at[m];
}

// Each row's token from every thread's lanes: the smallest index among lanes holding a NaN, else
// the smallest among those holding the largest value.
void answer(const std::vector<RowTops>& tops, int64_t rows, int64_t* tokens) {
  for (int64_t m = 0; m < rows; ++m) {
    int64_t best = -1, first_nan = INT64_MAX;
    float top = 0.f;
    for (const RowTops& t : tops) {
      if (!t.started[m]) continue;
      for (int64_t l = 0; l < W; ++l) {
        const float v = t.top[m][l];
        const int64_t at = t.at[m][l];
        if (sarathi::is_nan(v)) {
          first_nan = std::min(first_nan, at);
        } else if (best < 0 || v > top || (v == top && at < best)) {
          top = v;
          best = at;
        }
      }
    }
    tokens[m] = first_nan != INT64_MAX ? first_nan : best;
  }
}

// The calling thread's entry of tops (null: no argmax).
inline RowTops* mine(RowTops* tops) { return tops ? tops + omp_get_thread_num() : nullptr; }

// out [rows][N] in tiles [tile0, tile0 + TB) = total [rows][TB] + bias, offered to tops if given.
template <typename T, int TB>
inline void finish(const vec* total, int64_t rows, const T* bias, T* out, int64_t tile0, int64_t N,
                   RowTops* tops = nullptr) {
  for (int b = 0; b < TB; ++b) {
    const int64_t n0 = (tile0 + b) * W, cols = std::min<int64_t>(W, N - n0);
    vec bv = {};
    if (bias)
      for (int64_t c = 0; c < cols; ++c) bv[c] = load(bias[n0 + c]);
    for (int64_t m = 0; m < rows; ++m) {
      const vec y = total[m * TB + b] + bv;
      if (cols == W) {
        sarathi::vstore(out + m * N + n0, y);
      } else {
        for (int64_t c = 0; c < cols; ++c) out[m * N + n0 + c] = sarathi::store<T>(y[c]);
      }
      if (tops) offer(*tops, m, out + m * N + n0, n0, cols);
    }
  }
}

template <typename T, int M, int TB>
inline void block(const XT& x, const T* packed, const T* bias, T* out, int64_t tile0, int64_t N, int64_t K,
                  RowTops* tops) {
  constexpr int64_t P = pair_of<T>;
  const int64_t steps = (K + P - 1) / P;  // packed vectors per tile
  vec total[M][TB] = {};
  const T* wt[TB];
  for (int b = 0; b < TB; ++b) wt[b] = packed + (tile0 + b) * steps * W * P;
  // Partial sums of SPAN steps join the totals: a float32 sum's rounding error grows with its
  // length, and one running sum over K = 2048 erred 4x more than torch's blocked GEMM. The totals
  // live outside the step loop, so that only the partial sums compete for registers in it.
  for (int64_t s0 = 0; s0 < steps; s0 += SPAN)
    span_chunks<T, M, TB>(std::make_index_sequence<row_chunks(M)>{}, x, wt, s0, std::min(steps, s0 + SPAN), total);
  finish<T, TB>(&total[0][0], M, bias, out, tile0, N, mine(tops));
}

template <typename T, int M>
void linear_rows(const XT& x, const T* packed, const T* bias, T* out, int64_t N, int64_t K, int threads,
                 RowTops* tops) {
  constexpr int TB = tiles_per_block(M);
  const int64_t tiles = (N + W - 1) / W, blocks = tiles / TB;
  // Static ranges: each thread streams its own contiguous stretch of the packed weight.
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) block<T, M, TB>(x, packed, bias, out, b * TB, N, K, tops);
  for (int64_t t = blocks * TB; t < tiles; ++t) block<T, M, 1>(x, packed, bias, out, t, N, K, tops);
}

template <typename T, std::size_t... I>
constexpr auto table(std::index_sequence<I...>) {
  return std::array<void (*)(const XT&, const T*, const T*, T*, int64_t, int64_t, int, RowTops*), sizeof...(I)>{
      &linear_rows<T, static_cast<int>(I) + 1>...};
}


// Float32 rows beyond MAX_ROWS (decode batches of 17-48 requests in the engine; any count here): a
// GEMM over the same packed copy, x read in place. kGemmRows rows against kGemmTiles tiles at a time:
// 6 x 4 accumulators, four weight vectors and a broadcast fill 29 of AVX-512's 32 registers (6 x 2 +
// 3 = 15 of AVX2's 16), and six rows' addresses fit the general registers (fourteen rows against two
// tiles spilled them: six stack reloads per 28 multiply-adds). Each thread takes a contiguous range
// of tile groups; for each, span by span, every row runs past the span's weights (4 tiles x SPAN x W
// floats = 16 KB with AVX-512) while they sit in L1, so that the weights come from memory once per
// kGemmBlockRows rows. Why: oneDNN's and MKL's GEMMs run cpu-small's shapes at 17-48 rows well below
// the FMA rate; this one, streaming the weights, beats them up to 48 rows on every ISA build measured,
// and from 64 rows the libraries' blocked GEMMs win (benchmarks/RESULTS.md). Each output
// is the few-row path's sums in its order (products in k order, partial sums of SPAN steps), so a
// row's results are the same bits in a batch of any size, one row to thousands.
constexpr int kGemmTiles = sarathi::kVectorRegisters / 8;
constexpr int kGemmRows = (sarathi::kVectorRegisters - kGemmTiles - 1) / kGemmTiles;
constexpr int64_t kGemmBlockRows = 256;  // bounds the running totals: 64 KB with AVX-512

// One span [0, steps) of M rows (x read in place, ld apart) against TB tiles (w) into their running
// totals [M][TB]: the few-row path's sums (span_rows), in its order. PREFETCH: the first rows past
// these weights also prefetch the tiles' next lines, kPrefetchBytes ahead: a span of a tile is 4 KB
// with AVX-512 (2 KB with AVX2), a page, where the hardware prefetcher stops.
template <int TB, int M, bool PREFETCH>
inline void gemm_panel(const float* xp, int64_t ld, const float* const* w0, int64_t steps, vec* total) {
  constexpr int64_t kStepsPerLine = std::max<int64_t>(1, sarathi::kLineBytes / (W * sizeof(float)));
  vec acc[M][TB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < TB; ++b) acc[m][b] = vec{};
  for (int64_t s = 0; s < steps; ++s) {
    if constexpr (PREFETCH)
      if (s % kStepsPerLine == 0)
        for (int b = 0; b < TB; ++b) __builtin_prefetch(sarathi::ahead(w0[b] + s * W, kPrefetchBytes));
    vec w[TB];
    for (int b = 0; b < TB; ++b) w[b] = sarathi::in_register(vload(w0[b] + s * W));
    for (int m = 0; m < M; ++m) {
      const float xk = xp[m * ld + s];
      for (int b = 0; b < TB; ++b) acc[m][b] += xk * w[b];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < TB; ++b) total[m * TB + b] += acc[m][b];
}

// Steps [s0, s1) of `panels` panels of M rows (panel p at row p * M) into their totals
// [panels * M][TB]. One call takes every panel, so that its fixed costs are paid once per span, not
// once per panel (held to AVX2 on the Xeon: 135 GFLOP/s at 48-256 rows called per panel, 150-160 so).
template <int TB, int M>
void gemm_span(const float* x, int64_t ld, const float* const* wt, int64_t s0, int64_t s1, int64_t panels,
               vec* total) {
  const float* w0[TB];
  for (int b = 0; b < TB; ++b) w0[b] = wt[b] + s0 * W;
  for (int64_t p = 0; p < panels; ++p)
    (p == 0 ? gemm_panel<TB, M, true> : gemm_panel<TB, M, false>)(x + p * M * ld + s0, ld, w0, s1 - s0,
                                                                 total + p * M * TB);
}

template <int TB, std::size_t... I>
constexpr auto gemm_spans(std::index_sequence<I...>) {
  return std::array<void (*)(const float*, int64_t, const float* const*, int64_t, int64_t, int64_t, vec*),
                    sizeof...(I)>{&gemm_span<TB, static_cast<int>(I) + 1>...};
}

// Rows [0, rows) of x against tiles [tile0, tile0 + TB): span by span, every row past the span's
// weights (TB x SPAN x W floats: 16 KB with AVX-512, in L1) before the next span; total [rows][TB].
template <int TB>
void gemm_tiles(const float* x, const float* packed, const float* bias, float* out, int64_t rows, int64_t tile0,
                int64_t N, int64_t K, vec* total) {
  static constexpr auto tail = gemm_spans<TB>(std::make_index_sequence<kGemmRows>{});
  const int64_t panels = rows / kGemmRows, rest = rows % kGemmRows;
  const float* wt[TB];
  for (int b = 0; b < TB; ++b) wt[b] = packed + (tile0 + b) * K * W;
  std::fill(total, total + rows * TB, vec{});
  for (int64_t s0 = 0; s0 < K; s0 += SPAN) {
    const int64_t s1 = std::min(K, s0 + SPAN);
    gemm_span<TB, kGemmRows>(x, K, wt, s0, s1, panels, total);
    if (rest) tail[rest - 1](x + panels * kGemmRows * K, K, wt, s0, s1, 1, total + panels * kGemmRows * TB);
  }
  finish<float, TB>(total, rows, bias, out, tile0, N);
}

void gemm(const float* x, const float* packed, const float* bias, float* out, int64_t rows, int64_t N, int64_t K,
          int threads) {
  // Units of work: the groups of kGemmTiles tiles, then the tiles left over one by one.
  const int64_t tiles = (N + W - 1) / W, groups = tiles / kGemmTiles, units = groups + tiles % kGemmTiles;
#pragma omp parallel num_threads(threads) if (threads > 1 && units > 1)
  {
    std::vector<vec> total(std::min(kGemmBlockRows, rows) * kGemmTiles);
    for (int64_t r0 = 0; r0 < rows; r0 += kGemmBlockRows) {
      const int64_t block_rows = std::min(kGemmBlockRows, rows - r0);
      const float* xb = x + r0 * K;
      float* ob = out + r0 * N;
      // static with the same bounds every time: each thread keeps its tiles from block to block.
#pragma omp for schedule(static) nowait
      for (int64_t u = 0; u < units; ++u) {
        if (u < groups)
          gemm_tiles<kGemmTiles>(xb, packed, bias, ob, block_rows, u * kGemmTiles, N, K, total.data());
        else
          gemm_tiles<1>(xb, packed, bias, ob, block_rows, groups * kGemmTiles + (u - groups), N, K, total.data());
      }
    }
  }
}

#if defined(SARATHI_AMX)
// The tile registers' shapes: 0, 1 accumulate two tiles' outputs [M][16] float32; 2 holds x [M][32]
// and 3, 4 two tiles' weights [16 pairs][16 columns]; 5-7 the same for the last k block when K is
// not a multiple of 32.
sarathi::TileConfig linear_tiles(int64_t m, int64_t tail_pairs) {
  sarathi::TileConfig c;
  for (int t : {0, 1, 2}) c.set(t, m, 64);
  for (int t : {3, 4}) c.set(t, 16, 64);
  if (tail_pairs) {
    c.set(5, m, tail_pairs * 4);
    for (int t : {6, 7}) c.set(t, tail_pairs, 64);
  }
  return c;
}

// Outputs of the tiles [tile0, tile0 + TB) (TB = 1 or 2) for x [m][ldx] (k padded to even).
template <int TB>
void amx_block(const bf16* x, int64_t ldx, const bf16* packed, const bf16* bias, bf16* out, int64_t tile0, int64_t m,
               int64_t N, int64_t steps, RowTops* tops = nullptr) {
  constexpr int64_t kBlockPairs = 16, kTileBytes = kBlockPairs * W * 2 * sizeof(bf16);
  const int64_t blocks = steps / kBlockPairs, tail = steps % kBlockPairs, x_stride = ldx * sizeof(bf16);
  const char* w0 = reinterpret_cast<const char*>(packed + tile0 * steps * W * 2);
  const char* w1 = w0 + steps * W * 2 * sizeof(bf16);
  const bf16* xb = x;
  _tile_zero(0);
  if (TB == 2) _tile_zero(1);
  // One k block: x's tile X against the weights' tiles B0 (and B1). The intrinsics take tile
  // numbers as literals, hence a macro for the full blocks' registers and the tail's.
#define SARATHI_K_BLOCK(X, B0, B1, offset) \
  _tile_loadd(X, xb, x_stride);            \
  _tile_loadd(B0, w0 + (offset), 64);      \
  _tile_dpbf16ps(0, X, B0);                \
  if (TB == 2) {                           \
    _tile_loadd(B1, w1 + (offset), 64);    \
    _tile_dpbf16ps(1, X, B1);              \
  }
  for (int64_t b = 0; b < blocks; ++b, xb += 2 * kBlockPairs) {
    SARATHI_K_BLOCK(2, 3, 4, b * kTileBytes)
  }
  if (tail) {
    SARATHI_K_BLOCK(5, 6, 7, blocks * kTileBytes)
  }
#undef SARATHI_K_BLOCK
  vec sums[MAX_ROWS][TB];  // finish's layout: each tile's rows TB vectors apart
  _tile_stored(0, &sums[0][0], TB * sizeof(vec));
  if (TB == 2) _tile_stored(1, &sums[0][1], TB * sizeof(vec));
  finish<bf16, TB>(&sums[0][0], m, bias, out, tile0, N, mine(tops));
}

void amx_linear(const bf16* x, const bf16* packed, const bf16* bias, bf16* out, int64_t m, int64_t N, int64_t K,
                int threads, RowTops* tops = nullptr) {
  const int64_t steps = (K + 1) / 2, tiles = (N + W - 1) / W, pairs_of_tiles = tiles / 2;
  // A tile reads x in whole pairs of k: an odd K needs a copy with a zero after each row.
  std::vector<bf16> padded;
  int64_t ldx = K;
  if (K % 2) {
    ldx = K + 1;
    padded.assign(m * ldx, bf16{0});
    for (int64_t r = 0; r < m; ++r) std::memcpy(padded.data() + r * ldx, x + r * K, K * sizeof(bf16));
    x = padded.data();
  }
  const sarathi::TileConfig config = linear_tiles(m, steps % 16);
#pragma omp parallel num_threads(threads) if (threads > 1 && pairs_of_tiles > 1)
  {
    _tile_loadconfig(&config);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < pairs_of_tiles; ++p) amx_block<2>(x, ldx, packed, bias, out, 2 * p, m, N, steps, tops);
    _tile_release();
  }
  if (tiles % 2) {
    _tile_loadconfig(&config);
    amx_block<1>(x, ldx, packed, bias, out, tiles - 1, m, N, steps, tops);
    _tile_release();
  }
}

// Rows beyond MAX_ROWS in bfloat16 on AMX, K a multiple of 32: 32 rows against two tiles per block,
// four accumulator tiles (0-3), x's two 16-row tiles (4, 5) and two weight tiles (6, 7), so that
// each tile loaded feeds two multiply-adds. Each thread takes a contiguous range of tile pairs and
// runs every 32-row group past each pair, whose weights stay in L2 meanwhile. The last group's rows
// come from a copy padded with zero rows (tail: its rows, 1-32; a second slab only past 16), so that
// every tile has 16 rows and one configuration serves all: a last slab of other rows through
// amx_linear read every weight from memory a second time (17 rows 0.99x oneDNN against 1.28x at 32).
// Why: at 17-128 rows oneDNN's AMX GEMM streams cpu-small's weights at 10-17 GB/s where a copy runs at
// 28; this one 1.17-1.25x faster at 17-32 rows, 1.09-1.16x at 64-128 (benchmarks/RESULTS.md, session
// 27). From ~160 rows it loses (0.76-0.82x at 256): both its operands' tiles come from L2, 4 KB per 4
// multiply-adds, about L2's rate, where oneDNN's blocking reaches 2 TFLOP/s.
sarathi::TileConfig gemm_tile_config() {
  sarathi::TileConfig c;
  for (int t = 0; t < 8; ++t) c.set(t, 16, 64);
  return c;
}

void amx_gemm_pair(const bf16* x, const bf16* tail_x, int64_t tail, int64_t K, const bf16* packed, const bf16* bias,
                   bf16* out, int64_t tile0, int64_t groups, int64_t N) {
  constexpr int64_t kBlockPairs = 16, kTileBytes = kBlockPairs * W * 2 * sizeof(bf16);
  const int64_t steps = K / 2, blocks = steps / kBlockPairs, x_stride = K * sizeof(bf16);
  const char* w0 = reinterpret_cast<const char*>(packed + tile0 * steps * W * 2);
  const char* w1 = w0 + steps * W * 2 * sizeof(bf16);
  vec sums[32][2];  // finish's layout: [row][tile]
  for (int64_t g = 0; g < groups; ++g) {
    const bool last = g == groups - 1;
    const int64_t rows = last ? tail : 32;
    const bool two = rows > 16;
    const bf16* x0 = last ? tail_x : x + g * 32 * K;
    const bf16* x1 = x0 + 16 * K;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      _tile_loadd(6, w0 + b * kTileBytes, 64);
      _tile_loadd(7, w1 + b * kTileBytes, 64);
      _tile_loadd(4, x0 + b * 32, x_stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (two) {
        _tile_loadd(5, x1 + b * 32, x_stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, &sums[0][0], 2 * sizeof(vec));
    _tile_stored(1, &sums[0][1], 2 * sizeof(vec));
    if (two) {
      _tile_stored(2, &sums[16][0], 2 * sizeof(vec));
      _tile_stored(3, &sums[16][1], 2 * sizeof(vec));
    }
    finish<bf16, 2>(&sums[0][0], rows, bias, out + g * 32 * N, tile0, N);
  }
}

// Any rows beyond MAX_ROWS; K not a multiple of 32 (and the odd last tile) in slabs of up to 16 rows.
void amx_gemm(const bf16* x, const bf16* packed, const bf16* bias, bf16* out, int64_t rows, int64_t N, int64_t K,
              int threads) {
  if (K % 32) {
    for (int64_t r = 0; r < rows; r += MAX_ROWS)
      amx_linear(x + r * K, packed, bias, out + r * N, std::min<int64_t>(MAX_ROWS, rows - r), N, K, threads);
    return;
  }
  const int64_t groups = (rows + 31) / 32, tail = rows - (groups - 1) * 32, tiles = (N + W - 1) / W,
                pairs = tiles / 2;
  // Whole slabs are read in place; a slab of 1-15 rows is copied, padded with zero rows.
  const bf16* last = x + (groups - 1) * 32 * K;
  std::vector<bf16> padded;
  if (tail % 16) {
    padded.assign((tail + 15) / 16 * 16 * K, bf16{0});
    std::memcpy(padded.data(), last, tail * K * sizeof(bf16));
    last = padded.data();
  }
  const sarathi::TileConfig config = gemm_tile_config();
#pragma omp parallel num_threads(threads) if (threads > 1 && pairs > 1)
  {
    _tile_loadconfig(&config);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < pairs; ++p)
      amx_gemm_pair(x, last, tail, K, packed, bias, out, 2 * p, groups, N);
    _tile_release();
  }
  if (tiles % 2) {
    for (int64_t r = 0; r < rows; r += MAX_ROWS) {
      const int64_t m = std::min<int64_t>(MAX_ROWS, rows - r);
      const sarathi::TileConfig one = linear_tiles(m, 0);
      _tile_loadconfig(&one);
      amx_block<1>(x + r * K, K, packed, bias, out + r * N, tiles - 1, m, N, K / 2);
      _tile_release();
    }
  }
}
#endif

// x [rows, K], bias [N] or null, out [rows, N], contiguous; packed as pack() wrote it; rows >= 1,
// at most MAX_ROWS in bfloat16 without AMX, and with tops (one per thread: the argmax's, rows the
// few-row paths take).
template <typename T>
void linear(const T* x, const T* packed, const T* bias, T* out, int64_t rows, int64_t N, int64_t K, int threads,
            RowTops* tops = nullptr) {
  if constexpr (std::is_same<T, float>::value)
    if (rows > MAX_ROWS) return gemm(x, packed, bias, out, rows, N, K, threads);
#if defined(SARATHI_AMX)
  if constexpr (std::is_same<T, bf16>::value)
    if (sarathi::amx_permitted())
      return rows > MAX_ROWS ? amx_gemm(x, packed, bias, out, rows, N, K, threads)
                             : amx_linear(x, packed, bias, out, rows, N, K, threads, tops);
#endif
  static constexpr auto kernels = table<T>(std::make_index_sequence<MAX_ROWS>{});
  constexpr int64_t P = pair_of<T>;
  const int64_t kp = (K + P - 1) / P * P;
  std::vector<float> xf;
  std::vector<uint32_t> pairs;
  if (P == 2 && kBf16Dot) {
    pairs.assign(kp / 2 * rows, 0u);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t k = 0; k < K; ++k) {
        uint16_t bits;
        std::memcpy(&bits, x + m * K + k, sizeof bits);
        pairs[k / 2 * rows + m] |= static_cast<uint32_t>(bits) << (16 * (k % 2));
      }
  } else {
    xf.assign(kp * rows, 0.f);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t k = 0; k < K; ++k) xf[k * rows + m] = load(x[m * K + k]);
  }
  kernels[rows - 1](XT{xf.data(), pairs.data()}, packed, bias, out, N, K, threads, tops);
}

// w [N, K] row-major into the packed layout (zeros where N and K are padded).
template <typename T>
void pack(const T* w, T* packed, int64_t N, int64_t K) {
  constexpr int64_t P = pair_of<T>;
  const int64_t steps = (K + P - 1) / P, tiles = (N + W - 1) / W;
  std::memset(static_cast<void*>(packed), 0, tiles * steps * W * P * sizeof(T));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) packed[((n / W * steps + k / P) * W + n % W) * P + k % P] = w[n * K + k];
}

}  // namespace

// The packed layout's tile width: the caller sizes the packed copy with it.
extern "C" int64_t linear_tile_columns() { return W; }

// Whether bfloat16 takes the AMX paths (this linear and the prefill attention): built for a CPU
// with AMX, and the kernel let this process use it.
extern "C" int64_t bf16_uses_amx() {
#if defined(SARATHI_AMX)
  return sarathi::amx_permitted();
#else
  return 0;
#endif
}

#define SARATHI_LINEAR(SUFFIX, T)                                                                         \
  extern "C" void linear_pack_##SUFFIX(const T* w, T* packed, int64_t n, int64_t k) { pack<T>(w, packed, n, k); } \
  extern "C" void linear_##SUFFIX(const T* x, const T* packed, const T* bias, T* out, int64_t rows, int64_t n,    \
                                  int64_t k, int threads) {                                              \
    linear<T>(x, packed, bias, out, rows, n, k, threads);                                                \
  }                                                                                                      \
  extern "C" void linear_argmax_##SUFFIX(const T* x, const T* packed, const T* bias, T* out, int64_t rows,       \
                                         int64_t n, int64_t k, int threads, int64_t* tokens) {           \
    std::vector<RowTops> tops(std::max(threads, 1));                                                     \
    linear<T>(x, packed, bias, out, rows, n, k, threads, tops.data());                                   \
    answer(tops, rows, tokens);                                                                          \
  }
SARATHI_LINEAR(f32, float)
SARATHI_LINEAR(bf16, bf16)
