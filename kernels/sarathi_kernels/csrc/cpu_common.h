// What the CPU kernels share: float32 and bfloat16 storage behind one load/store, so that each
// kernel is written once as a template and computes in float32 whatever it reads.
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

}  // namespace sarathi
