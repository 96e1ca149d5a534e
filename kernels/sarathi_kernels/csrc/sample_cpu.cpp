// Temperature and nucleus (top-p) sampling's draw on the CPU, from the logits to the token: the
// sampler's torch code (model/sampler.py) in one pass per step instead of a tensor per step.
//
// For each row, the weights e_i = exp((x_i - max) / T) (softmax's numerators) and their sum Z. With
// top_p = 1 the draw is the first token, in id order, whose running mass exceeds u Z: the inverse CDF
// of torch's path. Below 1 it runs over the order of descending logit with ties in id order: the
// nucleus ends at the first token whose running mass reaches top_p Z (the whole row if none does),
// and the draw is the first token whose running mass exceeds u times the nucleus' mass.
//
// The order is the logits', never the float32 weights': two logits one ulp apart can round to one
// weight (or, through exp2's error, to reversed ones), and ordered as a tie in id order the less
// likely token took the other's place in the running mass: another token than the exact inverse
// CDF's, by a whole token's probability rather than by rounding.
//
// Why: torch's path sorts every row for its nucleus. A stable sort of 16 flat rows of 32,000 tokens
// (a random model's, which every sarathi_lab model is) took 14 ms on 2 Xeon cores, about one decode
// iteration's forward pass, and the five ops before it (to float32, max, shift, divide, softmax)
// another 0.5 ms, each writing its own 2 MB. Here the nucleus is a radix select: floats order as
// their bit patterns once negative ones are flipped (``key``), so the weights summed by the top 12
// bits of each logit's key locate the bucket where the running mass crosses its target, and the same
// within that bucket's tokens over the next 10 bits and the last 10, then along the tokens of that
// exact logit in id order. Two passes over the row (the masses, then the tokens placed by bucket),
// then one bucket's tokens per target.
//
// Weights come from an inline exp2 (relative error 2.3e-7) and masses are summed in double, where
// torch's path takes float32 probabilities from its own exp and sums them in float32 steps: the two
// agree on every draw but those within float32's rounding of a boundary (1-3 draws in 1,600 on flat
// rows of 32,000). Under -ffast-math (cpu_build.py) the compiler may assume no NaN or infinity: the
// logits' are found on their bits, and exp2's argument is kept finite.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_common.h"

namespace {

using sarathi::bf16;
using sarathi::load;
using sarathi::vec;
using sarathi::W;

constexpr int kTopBits = 12;  // of a logit's 32-bit key: sign, exponent and 3 bits of the mantissa
constexpr int kLowBits = 10;  // each of the two levels below
constexpr int kTop = 1 << kTopBits, kLow = 1 << kLowBits;
constexpr int64_t kBlock = 256;  // the id-order draw's blocks
// Weights of base-2 exponents at or below this are 0: 2^-125 times exp2_nonpositive's factor of at
// least 2^-1/2 is still a normal float. Subnormal weights would cost a microcode assist in every sum
// over them; such a token's probability is under 1e-37 of the most likely one's, and the uniform's
// 24 bits never land on it.
constexpr float kMinExponent = -125.f;
constexpr uint32_t kInf = 0x7F800000u, kMinusInf = 0xFF800000u;

inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// An unsigned key that orders as the (non-NaN) float does: negative floats' bits flipped, positive
// ones' sign set, and -0 taken as +0 (equal logits, a tie in id order).
inline uint32_t key(float x) {
  const uint32_t u = bits(x) == 0x80000000u ? 0u : bits(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// double(f) without cvtss2sd's merge into its destination's old value. Written plainly, GCC converts
// into the register that the previous iteration's sum had left, which chained every iteration of a
// histogram to the one before: 54 -> 24 us for a row of 32,000 (Xeon with AMX; the same held to AVX2).
inline double widen(float f) {
#if defined(__AVX__)
  double d;
  __asm__("vcvtss2sd %1, %1, %0" : "=v"(d) : "v"(f));
  return d;
#else
  return f;
#endif
}

template <typename T>
T minus_inf();
template <>
float minus_inf<float>() {
  const uint32_t u = kMinusInf;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
template <>
bf16 minus_inf<bf16>() { return bf16{static_cast<uint16_t>(kMinusInf >> 16)}; }

// Where the running mass first reaches the target: the token and the mass of all tokens before it.
struct Crossing {
  int32_t token;
  double before;
};

// One thread's buffers, kept between calls (thread_local): sized per call, 380 KB of them were
// zero-filled each time for a vocabulary of 32,000.
struct Row {
  std::vector<float> e;         // the row's weights
  std::vector<uint32_t> k;      // the row's logits' keys: the nucleus' order
  std::vector<double> blocks;   // each kBlock's mass, for the id-order draw
  std::vector<int32_t> placed;  // the row's tokens by first-level bucket, each bucket's in id order
  std::vector<int32_t> ids;     // scratch: the tokens of the bucket being narrowed down
  double mass[kTop];            // each first-level bucket's mass
  int32_t start[kTop + 1];      // where each bucket's tokens begin in ``placed``
  void fit(int64_t n) {
    if (static_cast<int64_t>(e.size()) >= n) return;
    e.resize(n);
    k.resize(n);
    blocks.resize((n + kBlock - 1) / kBlock);
    placed.resize(n);
    ids.resize(std::max<int64_t>(n, kTop));
  }
};

// Walks the buckets' masses from the highest weights down to the first that takes the running mass
// ``before`` to the target, or, where rounding leaves every bucket short, to the last non-empty one;
// ``before`` becomes the mass of the buckets ahead of it. Buckets without mass (tokens of weight 0
// only) are never chosen.
template <typename Reached>
int walk(const double* mass, int buckets, double& before, Reached reached) {
  int last = -1;
  double ahead = before;
  for (int b = buckets - 1; b >= 0; --b) {
    if (mass[b] == 0) continue;
    if (reached(before + mass[b])) return b;
    ahead = before;
    before += mass[b];
    last = b;
  }
  before = ahead;
  return last;
}

// The token where the running mass, in descending weight, first reaches ``target`` (``inclusive``:
// at or above it, else above it), or the last token of positive weight if rounding leaves the row's
// mass short.
Crossing find(Row& row, double target, bool inclusive) {
  auto reached = [&](double s) { return inclusive ? s >= target : s > target; };
  const float* e = row.e.data();
  const uint32_t* k = row.k.data();
  double before = 0;
  const int bucket = walk(row.mass, kTop, before, reached);
  int32_t* ids = row.ids.data();
  int64_t count = row.start[bucket + 1] - row.start[bucket];
  std::memcpy(ids, row.placed.data() + row.start[bucket], count * sizeof *ids);
  for (int shift = kLowBits; shift >= 0; shift -= kLowBits) {
    double mass[kLow] = {};
    for (int64_t j = 0; j < count; ++j) mass[(k[ids[j]] >> shift) & (kLow - 1)] += widen(e[ids[j]]);
    const uint32_t sub = static_cast<uint32_t>(walk(mass, kLow, before, reached));
    // Kept without a branch: a mispredicted one per token cost more than the loads.
    int64_t kept = 0;
    for (int64_t j = 0; j < count; ++j) {
      ids[kept] = ids[j];
      kept += ((k[ids[j]] >> shift) & (kLow - 1)) == sub;
    }
    count = kept;
  }
  // ids: the tokens of one logit (so of one positive weight), in id order.
  for (int64_t j = 0; j < count - 1; ++j) {
    if (reached(before + e[ids[j]])) return {ids[j], before};
    before += e[ids[j]];
  }
  return {ids[count - 1], before};
}

// Whether token a comes after token b in the order of descending logit.
inline bool after(const uint32_t* k, int32_t a, int32_t b) {
  return k[a] < k[b] || (k[a] == k[b] && a > b);
}

template <typename T>
int64_t nucleus(const T* x, Row& row, int64_t n, double top_p, double u) {
  const float* e = row.e.data();
  uint32_t* k = row.k.data();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) k[i] = key(load(x[i]));
  std::memset(row.mass, 0, sizeof row.mass);
  std::memset(row.start, 0, sizeof row.start);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = k[i] >> (2 * kLowBits);
    row.mass[b] += widen(e[i]);
    ++row.start[b + 1];
  }
  double z = 0;
  for (int b = 0; b < kTop; ++b) {
    z += row.mass[b];
    row.start[b + 1] += row.start[b];
  }
  int32_t* next = row.ids.data();  // each bucket's next free place, for the moment
  std::memcpy(next, row.start, kTop * sizeof *next);
  for (int64_t i = 0; i < n; ++i) row.placed[next[k[i] >> (2 * kLowBits)]++] = static_cast<int32_t>(i);
  const Crossing end = find(row, top_p * z, true);
  const double mass = end.before + e[end.token];
  // u < 1 by at least 2^-24, so u * mass stays below the nucleus' mass in double.
  const Crossing pick = find(row, u * mass, false);
  return after(k, pick.token, end.token) ? end.token : pick.token;
}

// The first token in id order whose running mass exceeds u Z: whole blocks skipped by their masses,
// then token by token, on past a block that rounding left short.
int64_t by_id(Row& row, int64_t n, double u) {
  const float* e = row.e.data();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  double z = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlock, hi = std::min(lo + kBlock, n);
    double mass = 0;
#pragma omp simd reduction(+ : mass)
    for (int64_t i = lo; i < hi; ++i) mass += e[i];
    row.blocks[b] = mass;
    z += mass;
  }
  const double x = u * z;
  double before = 0;  // at most x: a token of weight 0 never takes it above
  int64_t b = 0;
  for (; b < blocks && before + row.blocks[b] <= x; ++b) before += row.blocks[b];
  for (int64_t i = b * kBlock; i < n; ++i) {
    before += e[i];
    if (before > x) return i;
  }
  int64_t i = n - 1;
  while (e[i] == 0) --i;  // some weight is 1: the maximum's
  return i;
}

// -1 where the row holds a NaN or +inf, or only -inf (no distribution: the caller's torch code
// decides what such a row gives), else the drawn token.
template <typename T>
int64_t draw(const T* x, int64_t n, float temperature, double top_p, double u, Row& row) {
  // On the bits, in integer lanes: NaN or +inf anywhere, and whether any logit is above -inf (a
  // max reduction starts from -FLT_MAX under -ffast-math, so the maximum cannot tell).
  float top = load(x[0]);
  uint32_t bad = 0, live = 0;
#pragma omp simd reduction(max : top) reduction(| : bad, live)
  for (int64_t i = 0; i < n; ++i) {
    const float v = load(x[i]);
    const uint32_t k = bits(v);
    bad |= ((k & 0x7FFFFFFFu) >= kInf) & (k != kMinusInf);
    live |= k != kMinusInf;
    top = std::max(top, v);
  }
  if (bad || !live) return -1;
  // Weights in base 2, w = 2^((x - top) log2(e) / T), a whole vector at a time, the row's last
  // partial vector from a copy padded with -inf: every weight comes from the same instructions, so
  // that equal logits keep equal weights (libmvec's scalar and vector exp differ in the last bit).
  const float c = 1.44269504f / temperature;
  float* e = row.e.data();
  for (int64_t i = 0; i < n; i += W) {
    const int64_t m = std::min<int64_t>(W, n - i);
    T tail[W];
    const T* from = x + i;
    if (m < W) {
      std::fill(tail, tail + W, minus_inf<T>());
      std::copy(x + i, x + n, tail);
      from = tail;
    }
    const vec t = (sarathi::vload(from) - top) * c;
    // -inf logits reach exp2_nonpositive's floor: their weight is 0, as in torch's softmax.
    const vec w = t > kMinExponent ? sarathi::exp2_nonpositive(t) : vec{};
    if (m == W) {
      sarathi::vstore(e + i, w);
    } else {
      float out[W];
      sarathi::vstore(out, w);
      std::copy(out, out + m, e + i);  // a copy per vector was a `rep movs`: half this loop's time
    }
  }
  return top_p < 1 ? nucleus(x, row, n, top_p, u) : by_id(row, n, u);
}

template <typename T>
void sample_rows(const T* logits, int64_t rows, int64_t cols, float temperature, double top_p, const double* u,
                 int64_t* out, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1 && rows > 1)
  {
    thread_local Row row;
    row.fit(cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) out[r] = draw(logits + r * cols, cols, temperature, top_p, u[r], row);
  }
}

}  // namespace

// logits [rows, cols]; temperature > 0 (at least float32's smallest normal); top_p in (0, 1]; u [rows]
// in [0, 1) with 24 bits; out [rows]: the drawn tokens, -1 for a row without a distribution.
extern "C" void sample_f32(const float* logits, int64_t rows, int64_t cols, float temperature, double top_p,
                           const double* u, int64_t* out, int threads) {
  sample_rows(logits, rows, cols, temperature, top_p, u, out, threads);
}
extern "C" void sample_bf16(const bf16* logits, int64_t rows, int64_t cols, float temperature, double top_p,
                            const double* u, int64_t* out, int threads) {
  sample_rows(logits, rows, cols, temperature, top_p, u, out, threads);
}
