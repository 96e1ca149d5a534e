// chunk_plan.py's search for balanced attention work (its _best and the candidates it weighs),
// compiled: the numpy search spends its time in a few hundred array calls a plan, each on a few
// thousand walks at most, so a plan made afresh on the critical path cost a share of the GPU's
// forward that planning ahead could not hide at the tail. This makes the very same plan: each
// candidate in the same order, each float sum in numpy's order (cumsum and bincount in index order,
// sum pairwise as numpy's add.reduce), built without -ffast-math and without fused multiply-adds
// (cpu_build.PLANNER), and held to the numpy search by tests/test_chunk_plan_native.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <tuple>
#include <vector>

namespace {

using I = int64_t;
using Ints = std::vector<I>;
using Reals = std::vector<double>;
constexpr double INF = std::numeric_limits<double>::infinity();

struct Knobs {
  I programs;
  double split_cost;
  I max_pieces;
  double base;
  I min_piece;
  I flat_waves;
};

// A candidate plan: its pieces (walk, first and end key tile, its walk's and its own piece count,
// cost, program) and its critical path; path INF: none.
struct Plan {
  Ints pw, po, hi, counts, splits, program;
  Reals cost;
  double path = INF;
};

// numpy's pairwise summation (add.reduce over a contiguous float64 array, from 0).
double pairwise(const double* a, I n) {
  if (n < 8) {
    double r = 0.0;
    for (I i = 0; i < n; ++i) r += a[i];
    return r;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    I i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  I n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

double sum(const Reals& a) { return 0.0 + pairwise(a.data(), static_cast<I>(a.size())); }

// A sort for arrays that come mostly in order already (cut positions rise with the cuts).
template <class V, class Less = std::less<>>
void sort_rising(V& v, Less less = {}) {
  if (!std::is_sorted(v.begin(), v.end(), less)) std::sort(v.begin(), v.end(), less);
}

bool whole(double x) { return std::isfinite(x) && std::floor(x) == x; }

// plan_bounds.below.
double below(double bound, bool exact = false) { return exact ? bound : bound * (1 - 1e-9) - 1e-9; }

// The busiest program's cost (np.bincount(program, weights=cost, minlength=programs).max()).
double busiest(const Ints& program, const Reals& cost, I programs) {
  I bins = programs;
  for (I p : program) bins = std::max(bins, p + 1);
  Reals load(bins, 0.0);
  for (size_t i = 0; i < program.size(); ++i) load[program[i]] += cost[i];
  return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}

I kmax(const I* k, I n) { return n ? *std::max_element(k, k + n) : 0; }

// np.searchsorted(v, x, side="right") for queries that mostly come in rising order: on from the last
// answer while they rise (a predictable scan where a binary search mispredicts at every step),
// searched afresh where one falls.
class Seek {
 public:
  explicit Seek(const Reals& v) : v_(v) {}
  I operator()(double x) {
    if (x < last_) {
      at_ = std::upper_bound(v_.begin(), v_.end(), x) - v_.begin();
    } else {
      while (at_ < static_cast<I>(v_.size()) && v_[at_] <= x) ++at_;
    }
    last_ = x;
    return at_;
  }

 private:
  const Reals& v_;
  I at_ = 0;
  double last_ = -INF;
};

// chunk_plan._cuts and _pieces: the pieces cuts at cost positions ``cut`` make.
struct Cuts {
  Ints walk, off;
  Reals at;
  std::vector<char> inner;
};

Cuts cuts(const Reals& ends, const Reals& starts, const I* k, const Reals& cut, const Knobs& o) {
  Cuts c;
  const double last = ends.empty() ? 0.0 : ends.back();
  Seek seek(ends);
  for (double x : cut) {
    if (!(x < last)) continue;
    const I w = seek(x);
    const I kw = k[w];
    const double sw = starts[w];
    double r = std::nearbyint(x - sw - o.base);
    r = std::min(std::max(r, 0.0), static_cast<double>(kw));
    I off = static_cast<I>(r);
    off = off < o.min_piece ? 0 : (kw - off < o.min_piece ? kw : off);
    c.walk.push_back(w);
    c.off.push_back(off);
    c.at.push_back(off == 0 ? sw : (off == kw ? ends[w] : sw + o.base + static_cast<double>(off)));
    c.inner.push_back(off > 0 && off < kw);
  }
  return c;
}

// The critical path of the pieces cuts ``c`` make, and into ``out`` (where given) the pieces.
double pieces(const I* k, I n, const Reals& starts, const Cuts& c, const Knobs& o, Plan* out) {
  // The inner cuts' (walk, offset), duplicates once: each walk's pieces start at 0 and at these.
  std::vector<std::pair<I, I>> inner;
  for (size_t j = 0; j < c.walk.size(); ++j)
    if (c.inner[j]) inner.emplace_back(c.walk[j], c.off[j]);
  sort_rising(inner);
  inner.erase(std::unique(inner.begin(), inner.end()), inner.end());
  Reals sorted_at(c.at);
  sort_rising(sorted_at);
  Seek seek(sorted_at);
  Reals load(o.programs, 0.0);  // a program past the last cut is at most programs - 1
  for (size_t j = 0, w = 0; w < static_cast<size_t>(n); ++w) {
    size_t e = j;
    while (e < inner.size() && inner[e].first == static_cast<I>(w)) ++e;
    const I count = static_cast<I>(1 + e - j);
    if (out) out->counts.push_back(count);
    for (I q = 0; q < count; ++q) {
      const I lo = q == 0 ? 0 : inner[j + q - 1].second, hi = q + 1 < count ? inner[j + q].second : k[w];
      const double cost = static_cast<double>(hi - lo) + o.base + (count > 1 ? o.split_cost : 0.0);
      const I program = seek(lo == 0 ? starts[w] : starts[w] + o.base + static_cast<double>(lo));
      load[program] += cost;
      if (out) {
        out->pw.push_back(static_cast<I>(w)), out->po.push_back(lo), out->hi.push_back(hi);
        out->splits.push_back(count), out->cost.push_back(cost), out->program.push_back(program);
      }
    }
    j = e;
  }
  double path = 0.0;
  for (double x : load) path = std::max(path, x);
  if (out) out->path = path;
  return path;
}

// plan_bounds.widest.
double widest(const Reals& at, double total, const Knobs& o) {
  if (!whole(o.base)) return -INF;
  Reals s(at);
  sort_rising(s);
  double prev = 0.0, most = -INF;
  for (double x : s) most = std::max(most, x - prev), prev = x;
  most = std::max(most, total - prev);
  return below(most, whole(o.base) && whole(o.split_cost));
}

// chunk_plan._cut.
Plan cut_plan(const I* k, I n, const Knobs& o) {
  Reals ends(n), starts(n);
  double run = 0.0;
  for (I i = 0; i < n; ++i) ends[i] = run = run + (static_cast<double>(k[i]) + o.base);
  for (I i = 0; i < n; ++i) starts[i] = ends[i] - static_cast<double>(k[i]) - o.base;
  const double total = n ? ends[n - 1] : 0.0;
  const double floor = (static_cast<double>(kmax(k, n)) + o.base) / static_cast<double>(o.max_pieces - 1);
  const I cuts_n = std::max<I>(o.programs - 1, 0);
  std::vector<char> in(cuts_n, 0);
  Cuts best;  // the best pass's cuts: only its pieces are built
  double best_path = INF;
  bool built = false;
  for (int pass = 0; pass < 4; ++pass) {
    Reals added(cuts_n), cut(cuts_n);
    for (I j = 0; j < cuts_n; ++j) added[j] = (o.base + 2 * o.split_cost) * (in[j] ? 1.0 : 0.0);
    const double share = std::max((total + sum(added)) / static_cast<double>(o.programs), floor);
    double cum = 0.0;
    for (I j = 0; j < cuts_n; ++j) {
      cum += added[j];
      cut[j] = static_cast<double>(j + 1) * share - (cum - added[j]) - o.split_cost * (in[j] ? 1.0 : 0.0);
    }
    Cuts c = cuts(ends, starts, k, cut, o);
    std::vector<char> next(cuts_n, 0);
    std::copy(c.inner.begin(), c.inner.end(), next.begin());
    if (!built || widest(c.at, total, o) < best_path) {
      const double path = pieces(k, n, starts, c, o, nullptr);
      if (!built || path < best_path) best = std::move(c), best_path = path;
      built = true;
    }
    const bool same = next == in;
    in.swap(next);
    if (same) break;
  }
  Plan plan;
  pieces(k, n, starts, best, o, &plan);
  return plan;
}

// plan_bounds.flat_path: one program per piece (longest first) onto the slot that frees first.
double flat_path(const Reals& costs, I slots) {
  if (static_cast<I>(costs.size()) <= slots) {  // a slot each
    double most = 0.0;
    for (double c : costs) most = std::max(most, c);
    return most;
  }
  std::map<double, I> frees{{0.0, slots}};
  Reals desc(costs);  // the costs longest first, a run of equal ones a group (np.unique's, reversed)
  sort_rising(desc, std::greater<double>());
  using Entry = std::tuple<double, double, I, I>;  // next start, free before, walks so far, slots
  for (size_t at = 0, end = 0; at < desc.size(); at = end) {
    const double cost = desc[at];
    for (end = at; end < desc.size() && desc[end] == cost; ++end) {
    }
    I left = static_cast<I>(end - at);
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (const auto& [free, m] : frees) heap.emplace(free, free, 0, m);
    while (left) {
      const auto [start, free, taken, m] = heap.top();
      heap.pop();
      const I now = std::min(m, left);
      left -= now;
      if (m > now) heap.emplace(start, free, taken, m - now);
      heap.emplace(free + cost * static_cast<double>(taken + 1), free, taken + 1, now);
    }
    frees.clear();
    for (; !heap.empty(); heap.pop()) frees[std::get<0>(heap.top())] += std::get<3>(heap.top());
  }
  return frees.rbegin()->first;
}

// plan_bounds.shares: each walk in ``count`` equal shares of its key tiles.
void shares(const I* k, I n, I count, Ints& pw, Ints& po, Ints& hi) {
  pw.reserve(n * count), po.reserve(n * count), hi.reserve(n * count);
  for (I w = 0; w < n; ++w)
    for (I j = 0; j < count; ++j) {
      pw.push_back(w);
      po.push_back(j * k[w] / count);
      hi.push_back((j + 1) * k[w] / count);
    }
}

// chunk_plan._flat.
Plan flat_plan(const I* k, I n, I count, const Knobs& o) {
  Plan p;
  shares(k, n, count, p.pw, p.po, p.hi);
  const I m = static_cast<I>(p.pw.size());
  p.counts.assign(n, count);
  p.splits.assign(m, count);
  for (I i = 0; i < m; ++i)
    p.cost.push_back(static_cast<double>(p.hi[i] - p.po[i]) + o.base + (count > 1 ? o.split_cost : 0.0));
  Ints order(m);
  std::iota(order.begin(), order.end(), 0);
  const auto longer = [&](I a, I b) { return -p.cost[a] < -p.cost[b]; };
  if (!std::is_sorted(order.begin(), order.end(), longer)) std::stable_sort(order.begin(), order.end(), longer);
  p.program.assign(m, 0);
  for (I i = 0; i < m; ++i) p.program[order[i]] = i;
  p.path = flat_path(p.cost, o.programs);
  return p;
}

// plan_bounds.flat_bound: (longest piece, or two past a wave; the total spread over the slots).
std::pair<double, double> flat_bound(const I* k, I n, I count, const Knobs& o) {
  const double split = count > 1 ? o.split_cost : 0.0;
  Reals cost;  // the shares' costs, as shares() cuts them
  cost.reserve(n * count);
  I keys = 0;
  double longest = 0.0;
  for (I w = 0; w < n; ++w) {
    keys += k[w];
    for (I j = 0; j < count; ++j) {
      cost.push_back(static_cast<double>((j + 1) * k[w] / count - j * k[w] / count) + o.base + split);
      longest = std::max(longest, cost.back());
    }
  }
  if (static_cast<I>(cost.size()) > o.programs) {
    // The programs-th and (programs + 1)-th longest pieces (np.partition's pair).
    sort_rising(cost, std::greater<double>());
    const double pair = 0.0 + cost[o.programs - 1] + cost[o.programs];
    longest = std::max(longest, below(pair, whole(o.base) && whole(split)));
  }
  const double spread = (static_cast<double>(keys) + static_cast<double>(n * count) * (o.base + split));
  return {longest, below(spread / static_cast<double>(o.programs))};
}

// plan_bounds.tail_bound.
double tail_bound(const I* k, I n, const Knobs& o) {
  const I full = n / o.programs * o.programs;
  if (full == 0 || full == n) return INF;
  Reals load(o.programs, 0.0), each(n);
  for (I i = 0; i < full; ++i) load[i % o.programs] += static_cast<double>(k[i]) + o.base;
  for (I i = 0; i < n; ++i) each[i] = static_cast<double>(k[i]) + o.base;
  return std::max(*std::max_element(load.begin(), load.end()), below(sum(each) / static_cast<double>(o.programs)));
}

// chunk_plan._tail.
Plan tail_plan(const I* k, I n, const Knobs& o, double beat) {
  const I full = n / o.programs * o.programs;
  Plan best;
  if (full == 0 || full == n) return best;
  const I* rest = k + full;
  const I rn = n - full;
  Reals load(o.programs, 0.0);
  for (I i = 0; i < full; ++i) load[i % o.programs] += static_cast<double>(k[i]) + o.base;
  Ints lightest(o.programs);
  std::iota(lightest.begin(), lightest.end(), 0);
  std::stable_sort(lightest.begin(), lightest.end(), [&](I a, I b) { return load[a] < load[b]; });
  std::vector<Plan> tails{cut_plan(rest, rn, o)};
  const I rest_min = *std::min_element(rest, rest + rn), rest_max = kmax(rest, rn);
  const double least = *std::min_element(load.begin(), load.end());
  for (I count = 2; count <= std::min(o.max_pieces, rest_min / o.min_piece); ++count) {
    if (rn * count > o.programs) break;
    const I longest = (rest_max + count - 1) / count;
    // Its longest piece onto the least loaded slot, added as the path adds it.
    if (least + (static_cast<double>(longest) + o.base + o.split_cost) < beat)
      tails.push_back(flat_plan(rest, rn, count, o));
  }
  for (const Plan& t : tails) {
    Plan p;
    for (I i = 0; i < full; ++i) {
      p.pw.push_back(i), p.po.push_back(0), p.hi.push_back(k[i]), p.splits.push_back(1);
      p.cost.push_back(static_cast<double>(k[i]) + o.base);
      p.program.push_back(i % o.programs);
    }
    for (size_t i = 0; i < t.pw.size(); ++i) {
      p.pw.push_back(t.pw[i] + full), p.po.push_back(t.po[i]), p.hi.push_back(t.hi[i]);
      p.splits.push_back(t.splits[i]), p.cost.push_back(t.cost[i]), p.program.push_back(lightest[t.program[i]]);
    }
    p.counts.assign(full, 1);
    p.counts.insert(p.counts.end(), t.counts.begin(), t.counts.end());
    p.path = busiest(p.program, p.cost, o.programs);
    if (p.path < best.path) best = std::move(p);
  }
  return best;
}

// chunk_plan._best.
Plan best_plan(const I* k, I n, const Knobs& o) {
  Plan best = cut_plan(k, n, o);
  if (tail_bound(k, n, o) < best.path) {
    Plan tail = tail_plan(k, n, o, best.path);
    if (tail.path < best.path) best = std::move(tail);
  }
  const I most = std::min(o.max_pieces, n ? *std::min_element(k, k + n) : I{1});
  for (I count = 1; count <= most; ++count) {
    if (count > 1 && n * count > o.flat_waves * o.programs) break;
    const auto [piece_bound, mean_bound] = flat_bound(k, n, count, o);
    if (mean_bound >= best.path) break;
    if (piece_bound > best.path || (count > 1 && piece_bound == best.path)) continue;
    Plan flat = flat_plan(k, n, count, o);
    if (flat.path < best.path || (flat.path == best.path && count == 1)) best = std::move(flat);
  }
  return best;
}

}  // namespace

// chunk_plan.plan_chunks' work from the batch's q-tiles (tile_walks: request, first query token, key
// tiles each) and its query lengths: ``items`` [capacity, 8] and ``indptr`` [capacity + programs + 1]
// int32 ordered by program, ``row_splits`` int32 [tokens, heads]; into ``reals`` the critical path,
// the walks' total unsplit, the pieces' total and the longest piece; into ``ints`` the grid's
// programs and the most pieces of a tile. Returns the piece count, or -1 past ``capacity``.
extern "C" int64_t chunk_plan_work(const int64_t* req, const int64_t* first_q, const int64_t* keys, int64_t tiles,
                                   const int64_t* query_lens, int64_t requests, int64_t heads, int64_t block_q,
                                   int64_t block_n, int64_t programs, double split_cost, int64_t max_pieces,
                                   double base, int64_t min_piece, int64_t flat_waves, int64_t capacity,
                                   int32_t* items, int32_t* indptr, int32_t* row_splits, double* reals,
                                   int64_t* ints) {
  // The (tile, head) walks, longest first, ties in walk order (np.argsort(-walks, kind="stable")).
  Ints tile_order(tiles);
  std::iota(tile_order.begin(), tile_order.end(), 0);
  std::stable_sort(tile_order.begin(), tile_order.end(), [&](I a, I b) { return keys[a] > keys[b]; });
  const I n = tiles * heads;
  Ints walk_tile(n), walk_head(n), k(n);
  for (I t = 0, w = 0; t < tiles; ++t)
    for (I h = 0; h < heads; ++h, ++w) walk_tile[w] = tile_order[t], walk_head[w] = h, k[w] = keys[tile_order[t]];
  const Plan p = best_plan(k.data(), n, Knobs{programs, split_cost, max_pieces, base, min_piece, flat_waves});
  const I m = static_cast<I>(p.pw.size());
  if (m > capacity) return -1;
  I grid = programs;
  for (I q : p.program) grid = std::max(grid, q + 1);
  // Rows by program, a program's pieces in piece order (np.argsort(program, kind="stable")).
  std::fill(indptr, indptr + grid + 1, 0);
  for (I q : p.program) ++indptr[q + 1];
  for (I q = 0; q < grid; ++q) indptr[q + 1] += indptr[q];
  Ints next(indptr, indptr + grid);
  for (I i = 0, split = 0; i < m; ++i) {
    split = i > 0 && p.pw[i] == p.pw[i - 1] ? split + 1 : 0;
    const I w = p.pw[i], t = walk_tile[w];
    int32_t* row = items + 8 * next[p.program[i]]++;
    const I fields[8] = {req[t], walk_head[w], first_q[t], p.po[i] * block_n, p.hi[i] * block_n,
                         split, p.splits[i], 0};
    for (int f = 0; f < 8; ++f) row[f] = static_cast<int32_t>(fields[f]);
  }
  Ints tile_splits(tiles * heads, 1);
  I most = 1;
  for (I w = 0; w < n; ++w) {
    tile_splits[walk_tile[w] * heads + walk_head[w]] = p.counts[w];
    most = std::max(most, p.counts[w]);
  }
  // Each token's tile's piece counts (chunk_plan._row_splits).
  for (I r = 0, tile = 0, token = 0; r < requests; ++r) {
    for (I within = 0; within < query_lens[r]; ++within, ++token)
      for (I h = 0; h < heads; ++h)
        row_splits[token * heads + h] = static_cast<int32_t>(tile_splits[(tile + within / block_q) * heads + h]);
    tile += (query_lens[r] + block_q - 1) / block_q;
  }
  Reals each(n);
  for (I w = 0; w < n; ++w) each[w] = static_cast<double>(k[w]) + base;
  double longest = 0.0;
  for (double c : p.cost) longest = std::max(longest, c);
  reals[0] = p.path, reals[1] = sum(each), reals[2] = sum(p.cost), reals[3] = longest;
  ints[0] = grid, ints[1] = most;
  return m;
}
