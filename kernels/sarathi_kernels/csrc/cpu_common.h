// What the CPU kernels share: float32 and bfloat16 storage behind one load/store, so that each
// kernel is written once as a template and computes in float32 whatever it reads; and a vector of
// 16 floats (GCC's vector extensions: one 512-bit register where the CPU has AVX-512, two 256-bit
// ones on AVX2, from the same source).
#pragma once
#include <cstdint>
#include <cstring>

namespace sarathi {

// bfloat16 as torch stores it: the high half of a float32.
struct bf16 {
  uint16_t bits;
};

inline float load(float x) { return x; }
inline float load(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <typename T>
inline T store(float f);
template <>
inline float store<float>(float f) { return f; }
// Round to nearest even, as torch's float -> bfloat16 conversion (finite values; the kernels
// produce no NaN from finite inputs).
template <>
inline bf16 store<bf16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

constexpr int64_t W = 16;  // floats per vector
typedef float vec __attribute__((vector_size(W * sizeof(float))));

inline vec vload(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
// 16 floats rounded to bfloat16 as store<bf16> rounds each.
inline void vstore(bf16* p, vec v) {
  typedef uint16_t half_bits __attribute__((vector_size(W * sizeof(uint16_t))));
  typedef uint32_t bits __attribute__((vector_size(W * sizeof(uint32_t))));
  bits u;
  std::memcpy(&u, &v, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  const half_bits h = __builtin_convertvector(u >> 16, half_bits);
  std::memcpy(p, &h, sizeof h);
}

// 32 bfloat16 as two vectors, the even elements and the odd ones, from one load, a shift and a
// mask: half the instructions of widening them in order (a shuffle per 8 elements); what they
// meet must be in the same order (csrc/linear_cpu.cpp packs its weights so that it is).
inline void vload2(const bf16* p, vec& a, vec& b) {
  typedef uint32_t bits __attribute__((vector_size(W * sizeof(uint32_t))));
  bits u;
  std::memcpy(&u, p, sizeof u);
  const bits even = u << 16, odd = u & 0xFFFF0000u;
  std::memcpy(&a, &even, sizeof a);
  std::memcpy(&b, &odd, sizeof b);
}

}  // namespace sarathi
