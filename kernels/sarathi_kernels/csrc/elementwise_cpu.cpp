// The decoder's elementwise steps fused, one pass over the rows each, for the CPU: residual add +
// RMSNorm, rotary embedding of q and k in place, SiLU(gate) * up.
//
// Why: in torch each of these is 5-16 separate ops per layer (every op a dispatch and a pass over
// memory): about 20 ops per layer, 5-6 ms of a 40 ms decode iteration of cpu-small
// (benchmarks/RESULTS.md). Each function reproduces the roundings of the torch code it replaces
// (layers.py), step by step, so that bfloat16 results round where torch's do; in float32 the only
// difference is the order of the RMSNorm sum and contracted multiply-adds (-ffast-math).
#include <cmath>
#include <cstdint>

#include "cpu_common.h"

namespace {

using sarathi::load;
using sarathi::store;

// Rounds a float32 value to T's precision and back: where torch materialises a T tensor.
template <typename T>
inline float round_to(float x) {
  return load(store<T>(x));
}

// Rows are independent; threads only pay off once a call has some thousands of elements.
inline bool parallel(int64_t rows, int64_t width, int threads) { return threads > 1 && rows > 1 && rows * width >= 16384; }

// x, residual, out [rows, hidden]; weight [hidden]. With residual: residual <- x + residual, then
// out <- weight * rmsnorm(residual); without: out <- weight * rmsnorm(x). As layers.RMSNorm.
template <typename T>
void add_rms_norm(const T* x, T* residual, const T* weight, T* out, int64_t rows, int64_t hidden, float eps,
                  int threads) {
#pragma omp parallel for num_threads(threads) if (parallel(rows, hidden, threads))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * hidden;
    T* res = residual ? residual + r * hidden : nullptr;
    T* o = out + r * hidden;
    float sq = 0.f;
    if (res) {
#pragma omp simd reduction(+ : sq)
      for (int64_t j = 0; j < hidden; ++j) {
        const float v = round_to<T>(load(xr[j]) + load(res[j]));
        res[j] = store<T>(v);
        sq += v * v;
      }
    } else {
#pragma omp simd reduction(+ : sq)
      for (int64_t j = 0; j < hidden; ++j) sq += load(xr[j]) * load(xr[j]);
    }
    const float inv = 1.f / std::sqrt(sq / static_cast<float>(hidden) + eps);
    const T* src = res ? res : xr;
#pragma omp simd
    for (int64_t j = 0; j < hidden; ++j) o[j] = store<T>(load(weight[j]) * round_to<T>(load(src[j]) * inv));
  }
}

// qk [tokens, heads, d] at row stride `stride` (elements): rotated in place by the angles of each
// token's position; cos, sin [max_positions, d] float32. As layers.RotaryEmbedding: cos/sin cast
// to T, then x * cos + rotate_half(x) * sin with each product rounded to T.
template <typename T>
void rope(T* qk, const int64_t* positions, const float* cos, const float* sin, int64_t tokens, int64_t heads,
          int64_t d, int64_t stride, int threads) {
  const int64_t half = d / 2;
#pragma omp parallel for num_threads(threads) if (parallel(tokens, heads * d, threads))
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + positions[t] * d;
    const float* s = sin + positions[t] * d;
    for (int64_t h = 0; h < heads; ++h) {
      T* x = qk + t * stride + h * d;
#pragma omp simd
      for (int64_t j = 0; j < half; ++j) {
        const float a = load(x[j]), b = load(x[j + half]);
        const float c0 = round_to<T>(c[j]), s0 = round_to<T>(s[j]);
        const float c1 = round_to<T>(c[j + half]), s1 = round_to<T>(s[j + half]);
        x[j] = store<T>(round_to<T>(a * c0) + round_to<T>(-b * s0));
        x[j + half] = store<T>(round_to<T>(b * c1) + round_to<T>(a * s1));
      }
    }
  }
}

// gate_up [rows, 2 * inter] (gate then up); out [rows, inter] <- silu(gate) * up, as layers.GatedMLP.
template <typename T>
void silu_mul(const T* gate_up, T* out, int64_t rows, int64_t inter, int threads) {
#pragma omp parallel for num_threads(threads) if (parallel(rows, inter, threads))
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * inter;
    const T* u = g + inter;
    T* o = out + r * inter;
#pragma omp simd
    for (int64_t j = 0; j < inter; ++j) {
      const float x = load(g[j]);
      o[j] = store<T>(round_to<T>(x / (1.f + std::exp(-x))) * load(u[j]));
    }
  }
}

}  // namespace

#define SARATHI_ELEMENTWISE(SUFFIX, T)                                                                      \
  extern "C" void add_rms_norm_##SUFFIX(const T* x, T* residual, const T* weight, T* out, int64_t rows,        \
                                        int64_t hidden, float eps, int threads) {                               \
    add_rms_norm<T>(x, residual, weight, out, rows, hidden, eps, threads);                                    \
  }                                                                                                          \
  extern "C" void rope_##SUFFIX(T* qk, const int64_t* positions, const float* cos, const float* sin,           \
                                int64_t tokens, int64_t heads, int64_t d, int64_t stride, int threads) {       \
    rope<T>(qk, positions, cos, sin, tokens, heads, d, stride, threads);                                      \
  }                                                                                                          \
  extern "C" void silu_mul_##SUFFIX(const T* gate_up, T* out, int64_t rows, int64_t inter, int threads) {     \
    silu_mul<T>(gate_up, out, rows, inter, threads);                                                          \
  }
SARATHI_ELEMENTWISE(f32, float)
SARATHI_ELEMENTWISE(bf16, sarathi::bf16)
