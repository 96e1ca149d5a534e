// Nucleus (top-p) sampling's draw on the CPU. For each row of probabilities, in the order of
// descending probability with ties in id order: the nucleus ends at the first token whose running
// mass reaches top_p (the whole row if none does), and the draw is the first token whose running
// mass exceeds u times the nucleus' mass. This is the inverse CDF over the sorted row that the
// sampler's torch code computes, without building the sorted row.
//
// Why: that sort is the sampler's cost. A stable sort of 16 flat rows of 32,000 tokens (a random
// model's, which every sarathi_lab model is) takes 14 ms on 2 Xeon cores, about one decode
// iteration's forward pass; topk finds a peaked row's nucleus faster, a flat one's not at all.
// Here a radix select instead: non-negative floats order as their bit patterns, so the row's masses
// summed by the top 11 bits of each probability locate the bucket where the running mass crosses
// its target, and the same within that bucket's tokens over the next 10 bits and the last 10, then
// along the tokens of that exact probability in id order. Two passes over the row (the masses, then
// the tokens placed by bucket), then a bucket's tokens for each of the two targets.
//
// Masses are summed in double, each bucket's by itself, where torch sums the sorted row's prefix in
// float32 steps: the two agree on every draw but those within float32's rounding of a boundary.
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kTopBits = 11;  // the first level's buckets: sign (always 0), exponent, 3 mantissa bits
constexpr int kLowBits = 10;  // each of the two levels below
constexpr int kTop = 1 << kTopBits, kLow = 1 << kLowBits;
constexpr uint32_t kInf = 0x7F800000u, kNegativeZero = 0x80000000u;

inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Where the running mass first reaches the target: the token and the mass of all tokens before it.
struct Crossing {
  int32_t token;
  double before;
};

struct Row {
  const float* p;
  int64_t n;
  double mass[kTop];        // each first-level bucket's mass
  int32_t start[kTop + 1];  // where each bucket's tokens begin in ``placed``
  std::vector<int32_t> placed;  // the row's tokens by first-level bucket, each bucket's in id order
  std::vector<int32_t> ids;     // scratch: the tokens of the bucket being narrowed down
};

// Walks the buckets' masses from the highest probabilities down to the first that takes the running
// mass ``before`` to the target, or, where rounding leaves every bucket short, to the last non-empty
// one; ``before`` becomes the mass of the buckets ahead of it. Buckets without mass (tokens of
// probability 0 only) are never chosen.
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

// The token where the running mass first reaches ``target`` (``inclusive``: at or above it, else
// above it), or the last token of positive probability where rounding leaves the row's mass short.
Crossing find(Row& row, double target, bool inclusive) {
  auto reached = [&](double s) { return inclusive ? s >= target : s > target; };
  double before = 0;
  const int bucket = walk(row.mass, kTop, before, reached);
  int32_t* ids = row.ids.data();
  int64_t count = row.start[bucket + 1] - row.start[bucket];
  std::memcpy(ids, row.placed.data() + row.start[bucket], count * sizeof *ids);
  for (int shift = kLowBits; shift >= 0; shift -= kLowBits) {
    double mass[kLow] = {};
    for (int64_t j = 0; j < count; ++j) mass[(bits(row.p[ids[j]]) >> shift) & (kLow - 1)] += row.p[ids[j]];
    const uint32_t sub = static_cast<uint32_t>(walk(mass, kLow, before, reached));
    // Kept without a branch: a mispredicted one per token cost more than the loads.
    int64_t kept = 0;
    for (int64_t j = 0; j < count; ++j) {
      ids[kept] = ids[j];
      kept += ((bits(row.p[ids[j]]) >> shift) & (kLow - 1)) == sub;
    }
    count = kept;
  }
  // ids: the tokens of one positive probability, in id order.
  for (int64_t j = 0; j < count - 1; ++j) {
    if (reached(before + row.p[ids[j]])) return {ids[j], before};
    before += row.p[ids[j]];
  }
  return {ids[count - 1], before};
}

// Whether token a comes after token b in the sorted order.
inline bool after(const float* p, int32_t a, int32_t b) {
  const uint32_t ka = bits(p[a]), kb = bits(p[b]);
  return ka < kb || (ka == kb && a > b);
}

// The drawn token, or -1 where the row holds a probability that is negative, infinite or NaN, or
// none above 0 (the caller's torch code decides what such a row gives).
int64_t draw(Row& row, double top_p, double u) {
  std::memset(row.mass, 0, sizeof row.mass);
  std::memset(row.start, 0, sizeof row.start);
  bool positive = false;
  for (int64_t i = 0; i < row.n; ++i) {
    const uint32_t k = bits(row.p[i]);
    if (k >= kInf && k != kNegativeZero) return -1;
    const uint32_t b = (k & ~kNegativeZero) >> (2 * kLowBits);
    row.mass[b] += row.p[i];
    ++row.start[b + 1];
    positive |= (k & ~kNegativeZero) != 0;
  }
  if (!positive) return -1;
  for (int b = 0; b < kTop; ++b) row.start[b + 1] += row.start[b];
  int32_t* next = row.ids.data();  // each bucket's next free place, for the moment
  std::memcpy(next, row.start, kTop * sizeof *next);
  for (int64_t i = 0; i < row.n; ++i) row.placed[next[(bits(row.p[i]) & ~kNegativeZero) >> (2 * kLowBits)]++] = i;
  const Crossing end = find(row, top_p, true);
  const double mass = end.before + row.p[end.token];
  // u < 1 by at least 2^-24, so u * mass stays below the nucleus' mass in double.
  const Crossing pick = find(row, u * mass, false);
  return after(row.p, pick.token, end.token) ? end.token : pick.token;
}

}  // namespace

// probs [rows, cols] float32, each row a distribution (softmax's); top_p in (0, 1]; u [rows] in
// [0, 1) with 24 bits; out [rows]: the drawn tokens, -1 for a row that is not a distribution.
extern "C" void nucleus_draw_f32(const float* probs, int64_t rows, int64_t cols, double top_p, const double* u,
                                 int64_t* out, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1 && rows > 1)
  {
    Row row;
    row.n = cols;
    row.placed.resize(cols);
    row.ids.resize(cols > kTop ? cols : kTop);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      row.p = probs + r * cols;
      out[r] = draw(row, top_p, u[r]);
    }
  }
}
