// What the CPU kernels share: float32 and bfloat16 storage behind one load/store, so that each
// kernel is written once as a template and computes in float32 whatever it reads; and a vector of
// floats as wide as the CPU's vector registers (GCC's vector extensions: 16 floats with AVX-512, 8
// with AVX2, 4 below), so that each kernel is written once for every x86 machine kind.
#pragma once
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SARATHI_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

// Floats per vector, and vector registers, of the target the library is built for. Never wider
// than a register: GCC lowers a 16-float vector on AVX2 piecewise through the stack, and the
// AVX2-only build of these kernels ran 7-58x slower than the AVX-512 one on the same machine
// (benchmarks/RESULTS.md; tests/test_kernels_build.py fails a build that lowers one piecewise).
#if defined(__AVX512F__)
constexpr int64_t W = 16;
constexpr int kVectorRegisters = 32;
#elif defined(__AVX__)
constexpr int64_t W = 8;
constexpr int kVectorRegisters = 16;
#else
constexpr int64_t W = 4;
constexpr int kVectorRegisters = 16;
#endif
typedef float vec __attribute__((vector_size(W * sizeof(float))));

inline vec vload(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
// v held in a register from here: a vector that several multiply-adds read is otherwise folded by
// GCC into each of them as a memory operand, one load per multiply-add. On AVX2 (loads of 32 bytes,
// two a cycle on Zen 3) that made the load ports the bound of the few-row linear with its weights in
// L2; loaded once into a register, each weight vector feeds every multiply-add that reads it.
template <typename V>
inline V in_register(V v) {
  __asm__("" : "+v"(v));
  return v;
}
typedef int32_t ivec __attribute__((vector_size(W * sizeof(int32_t))));  // -1 where a test holds

// NaN tested on the bits, in integer arithmetic: -ffast-math (cpu_build.py) lets the compiler assume
// float comparisons never see one.
inline bool is_nan(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7FFFFFFFu) > 0x7F800000u;
}
inline ivec is_nan(vec v) {
  ivec u;
  std::memcpy(&u, &v, sizeof u);
  return (u & 0x7FFFFFFF) > 0x7F800000;
}

// 2^t for t <= 0 (larger t as 2^0: the callers discard those lanes), inline: a libmvec call per W
// lanes spills every live vector register around it (~40% of the prefill attention's bfloat16
// time), and its last bit differs between its vector and scalar versions, which ties must not see. The
// softmax works in base 2 (scores times scale x log2(e)), so no reduction by ln 2: 2^n by the exponent
// bits, 2^f for |f| <= 1/2 by a degree-5 polynomial fitted for relative error (2.3e-7 in float32
// arithmetic, as the degree-7 Taylor series of exp this replaced).
inline vec exp2_nonpositive(vec t) {
  t = t < 0.f ? t : vec{};
  t = t > -126.f ? t : vec{} - 126.f;  // 2^n stays a normal float
  const ivec n = __builtin_convertvector(t - 0.5f, ivec);  // round to nearest (t <= 0)
  const vec f = t - __builtin_convertvector(n, vec);
  vec p = vec{} + 1.32764445e-3f;
  p = p * f + 9.67553724e-3f;
  p = p * f + 5.55071346e-2f;
  p = p * f + 2.40221202e-1f;
  p = p * f + 6.93146944e-1f;
  p = p * f + 1.00000012f;
  const ivec bits = (n + 127) << 23;
  vec two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// W bfloat16 widened to float32 (exact).
inline vec vload(const bf16* p) {
  typedef uint16_t half_bits __attribute__((vector_size(W * sizeof(uint16_t))));
  typedef uint32_t bits __attribute__((vector_size(W * sizeof(uint32_t))));
  half_bits h;
  std::memcpy(&h, p, sizeof h);
  const bits u = __builtin_convertvector(h, bits) << 16;
  vec v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
// W floats rounded to bfloat16 as store<bf16> rounds each.
inline void vstore(bf16* p, vec v) {
  typedef uint16_t half_bits __attribute__((vector_size(W * sizeof(uint16_t))));
  typedef uint32_t bits __attribute__((vector_size(W * sizeof(uint32_t))));
  bits u;
  std::memcpy(&u, &v, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  const half_bits h = __builtin_convertvector(u >> 16, half_bits);
  std::memcpy(p, &h, sizeof h);
}

// a[i][j] <-> a[j][i]: a W x W block of floats transposed in registers, by log2(W) rounds that
// interleave row i with row i + W / 2 (W / 2 log2(W) pairs of two-source shuffles; GCC picks the
// instructions for the target: a 16 x 16 block took ~16 ns on the Xeon with AMX, an 8 x 8 ~13).
inline void transpose(vec (&a)[W]) {
  typedef int32_t lanes __attribute__((vector_size(W * sizeof(int32_t))));
#if defined(__AVX512F__)
  constexpr lanes lo = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
  constexpr lanes hi = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
#elif defined(__AVX__)
  constexpr lanes lo = {0, 8, 1, 9, 2, 10, 3, 11};
  constexpr lanes hi = {4, 12, 5, 13, 6, 14, 7, 15};
#else
  constexpr lanes lo = {0, 4, 1, 5};
  constexpr lanes hi = {2, 6, 3, 7};
#endif
  for (int round = 1; round < W; round *= 2) {
    vec b[W];
    for (int i = 0; i < W / 2; ++i) {
      b[2 * i] = __builtin_shuffle(a[i], a[i + W / 2], lo);
      b[2 * i + 1] = __builtin_shuffle(a[i], a[i + W / 2], hi);
    }
    for (int i = 0; i < W; ++i) a[i] = b[i];
  }
}

// 2W bfloat16 as two vectors, the even elements and the odd ones, from one load, a shift and a
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

constexpr int64_t kLineBytes = 64;  // one prefetch brings one cache line

// Buffers whose 64-byte rows tile loads read start on a cache line: malloc aligns to 16 bytes only, a
// row straddling two lines costs two loads, and the AMX prefill kernel's speed moved with where
// malloc put its buffers. The vector kernels measured even and keep std::vector.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kLineBytes})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{kLineBytes}); }
  bool operator==(const CacheLineAllocator&) const { return true; }
  bool operator!=(const CacheLineAllocator&) const { return false; }
};
template <typename T>
using line_vector = std::vector<T, CacheLineAllocator<T>>;

// Software prefetch, for streams the hardware prefetcher falls behind on or cannot guess. A prefetch
// never faults; the address is computed as an integer, so that one past the end of an allocation is
// no out-of-bounds pointer.
inline const void* ahead(const void* p, int64_t bytes) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + bytes);
}
// The bytes [p, p + bytes) into L2 (prefetcht1), as a paged KV cache's next block.
inline void prefetch_l2(const void* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += kLineBytes) __builtin_prefetch(ahead(p, o), 0, 2);
}
// The bytes [p, p + bytes) into L1, owned for writing (prefetchw where the target has it).
inline void prefetch_for_write(const void* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += kLineBytes) __builtin_prefetch(ahead(p, o), 1, 3);
}

#if defined(SARATHI_AMX)
// Linux gives a process AMX's tile registers only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); without them (an older kernel, a seccomp filter) the vector code runs.
inline bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// AMX's tile configuration (palette 1): rows and bytes per row of each tile register a kernel uses.
// Tile shapes are per thread: every thread loads the configuration before its first tile op.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void set(int tile, int64_t r, int64_t bytes) {
    rows[tile] = static_cast<uint8_t>(r);
    colsb[tile] = static_cast<uint16_t>(bytes);
  }
};
#endif

}  // namespace sarathi
