// Greedy sampling's argmax over each row of the logits on the CPU, with torch.argmax's answer: the
// first index of the row's maximum, or of its first NaN when it has one.
//
// Why: torch's CPU argmax tracks an index per element in scalar code, 0.41 ms for 16 rows of a
// 32,000-token vocabulary on 2 Zen 4 cores (4 GB/s), while its amax over the same rows takes 0.02 ms:
// the largest host cost of a decode iteration (benchmarks/RESULTS.md). Here a max in vectors, then
// a search for the first element equal to it, a vector block at a time. Both are written on vectors
// (cpu_common.h) rather than left to the auto-vectoriser: it vectorised the max across blocks, with
// strided loads, and not the search at all (an early exit), 9 GB/s from L2 in all. NaN is detected
// on the bits (cpu_common.h's is_nan). linear_cpu.cpp's linear_argmax gives the same answers from
// inside the LM head's kernel.
#include <cstdint>

#include "cpu_common.h"

namespace {

using sarathi::bf16;
using sarathi::is_nan;
using sarathi::load;
using sarathi::vec;
using sarathi::W;

using lanes = sarathi::ivec;

inline bool any(lanes m) {
  int32_t a = 0;
  for (int64_t l = 0; l < W; ++l) a |= m[l];
  return a != 0;
}

// Elements per block, and ``f`` over a block's values as vectors (bf16 as its even and odd
// elements: the max and the search do not care which lane holds which element).
template <typename T>
constexpr int64_t kBlock = sizeof(T) == sizeof(bf16) ? 2 * W : W;
template <typename F>
inline void each(const float* p, F f) { f(sarathi::vload(p)); }
template <typename F>
inline void each(const bf16* p, F f) {
  vec a, b;
  sarathi::vload2(p, a, b);
  f(a);
  f(b);
}

// Blocks tested together before one test of their lanes: GCC folds ``any`` lane by lane in scalar
// code, some 35 instructions, against a few for a block's compare.
constexpr int64_t kGroup = 8;

// The first index where ``hit`` (a generic lambda: a vector of lanes or one bool) holds, or the last
// index if none does. Only the group of blocks that hit is searched element by element.
template <typename T, typename Hit>
inline int64_t first_where(const T* row, int64_t cols, Hit hit) {
  constexpr int64_t step = kGroup * kBlock<T>;
  int64_t j = 0;
  for (; j + step <= cols; j += step) {
    lanes m = {};
    for (int64_t b = 0; b < step; b += kBlock<T>) each(row + j + b, [&](vec v) { m |= hit(v); });
    if (any(m)) break;
  }
  while (j < cols - 1 && !hit(load(row[j]))) ++j;
  return j;
}

template <typename T>
void argmax_rows(const T* x, int64_t rows, int64_t cols, int64_t* out, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows > 1 && rows * cols >= 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    // Lanes start from the row's own first value, never from a constant: under -ffast-math a
    // reduction would start from -FLT_MAX (no infinities), above a row of -inf.
    float top = load(row[0]);
    vec lane = vec{} + top;
    lanes nan = {};
    int64_t j = 0;
    for (; j + kBlock<T> <= cols; j += kBlock<T>) {
      each(row + j, [&](vec v) {
        lane = v > lane ? v : lane;
        nan |= is_nan(v);
      });
    }
    bool any_nan = any(nan);
    for (int64_t l = 0; l < W; ++l) top = lane[l] > top ? lane[l] : top;
    for (; j < cols; ++j) {
      const float v = load(row[j]);
      top = v > top ? v : top;
      any_nan |= is_nan(v);
    }
    out[r] = any_nan ? first_where(row, cols, [](auto v) { return is_nan(v); })
                     : first_where(row, cols, [top](auto v) { return v == top; });
  }
}

}  // namespace

extern "C" void argmax_f32(const float* x, int64_t rows, int64_t cols, int64_t* out, int threads) {
  argmax_rows<float>(x, rows, cols, out, threads);
}
extern "C" void argmax_bf16(const bf16* x, int64_t rows, int64_t cols, int64_t* out, int threads) {
  argmax_rows<bf16>(x, rows, cols, out, threads);
}
