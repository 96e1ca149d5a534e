// Greedy sampling's argmax over each row of the logits on the CPU, with torch.argmax's answer: the
// first index of the row's maximum, or of its first NaN when it has one.
//
// Why: torch's CPU argmax tracks an index per element in scalar code, 0.41 ms for 16 rows of a
// 32,000-token vocabulary on 2 Zen 4 cores (4 GB/s), while its amax over the same rows takes 0.02 ms:
// the largest host cost of a decode iteration (benchmarks/RESULTS.md). Here a vectorised max, then
// a scan for the first element equal to it. NaN is detected on the bits, in integer arithmetic,
// because -ffast-math (cpu_build.py) lets the compiler assume float comparisons never see one.
#include <cstdint>
#include <cstring>

#include "cpu_common.h"

namespace {

using sarathi::load;

constexpr int64_t W = 16;  // lanes of the max

inline bool is_nan(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7FFFFFFFu) > 0x7F800000u;
}

template <typename T>
void argmax_rows(const T* x, int64_t rows, int64_t cols, int64_t* out, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows > 1 && rows * cols >= 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    // Lanes start from the row's own first value, never from a constant: under -ffast-math an
    // OpenMP max reduction would start from -FLT_MAX (no infinities), above a row of -inf.
    const float first = load(row[0]);
    float lane[W];
    uint32_t nan[W];
    for (int64_t l = 0; l < W; ++l) lane[l] = first, nan[l] = 0;
    int64_t j = 0;
    for (; j + W <= cols; j += W) {
      for (int64_t l = 0; l < W; ++l) {
        const float v = load(row[j + l]);
        lane[l] = v > lane[l] ? v : lane[l];
        nan[l] |= is_nan(v);
      }
    }
    for (; j < cols; ++j) {
      const float v = load(row[j]);
      lane[0] = v > lane[0] ? v : lane[0];
      nan[0] |= is_nan(v);
    }
    float top = lane[0];
    uint32_t any_nan = 0;
    for (int64_t l = 0; l < W; ++l) top = lane[l] > top ? lane[l] : top, any_nan |= nan[l];
    int64_t at = 0;
    if (any_nan) {
      while (at < cols - 1 && !is_nan(load(row[at]))) ++at;
    } else {
      while (at < cols - 1 && load(row[at]) != top) ++at;
    }
    out[r] = at;
  }
}

}  // namespace

extern "C" void argmax_f32(const float* x, int64_t rows, int64_t cols, int64_t* out, int threads) {
  argmax_rows<float>(x, rows, cols, out, threads);
}
extern "C" void argmax_bf16(const sarathi::bf16* x, int64_t rows, int64_t cols, int64_t* out, int threads) {
  argmax_rows<sarathi::bf16>(x, rows, cols, out, threads);
}
