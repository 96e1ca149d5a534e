"""Balanced work for the prefill chunks' attention, planned on the host from the batch's lengths, as
FlashAttention-3 and FlashInfer plan persistent grids: compiled (plan_native.py, the same work), or
here in numpy where no compiler is found.

Why: one program per (q-tile, KV head) leaves a tail wave whenever the programs are just over a
multiple of the GPU's slots (SMs x resident CTAs): LLaMA-13B's c=512 chunk is 160 tall tiles on 132
slots, and the 28 of the second wave run while 104 SMs idle. Here a persistent grid of exactly one
program per slot each walks an equal share of the batch's keys: the (tile, KV head) walks, longest
first, are laid end to end in cost units (a key tile walked is one unit; a piece's query load and
output store ``BASE_COST`` more) and cut every ``total / slots`` units. A cut inside a walk splits
its KV range; the pieces leave fp32 partials that split_merge.py merges. A cut within ``MIN_PIECE``
key tiles of a walk's end moves to that end, so short walks are never split. A grid a few walks past
whole waves is also tried with those waves' walks whole and only the walks past them cut over every
slot. Where no such plan has a shorter critical path, today's flat grid is kept (a program per walk,
or per each of its equal shares of its keys). Decodes are planned alike (``plan_decodes``): a walk a
(request, KV head), one token's query rows.

Each piece is a row of ``ITEM_FIELDS`` int32s: request, KV head, first query token of its tile, first
and end key of its range, its index among its tile's pieces and their count. Program p runs rows
``work_indptr[p]:work_indptr[p + 1]``. ``row_splits`` [tokens, KV heads]: the pieces of the tile a
token's rows are in, which the merge reads (1: the piece stored its output itself).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from sarathi_kernels import plan_native
from sarathi_kernels._checks import require
from sarathi_kernels.plan_bounds import flat_bound, flat_path, shares, tail_bound, widest

ITEM_FIELDS = 8  # request, kv_head, first_q, key_lo, key_hi, split, splits, unused (16-byte rows)
# A piece's fixed cost in key tiles' worth: loading its query tile and storing its output are each
# about one key/value tile of the same rows.
BASE_COST = 1.0
# A split piece never walks fewer key tiles than this: its fixed and merge costs would outweigh it.
MIN_PIECE = 2
# The most pieces one tile's walk is cut into (the partial buffers' split capacity).
MAX_PIECES = 16
# A flat grid's split walks stay within this many waves of programs (split_rule.py's max_waves).
FLAT_WAVES = 2
# Token rows x pieces a tile the partials of one launch may take ([tokens, heads, pieces, head_dim] fp32):
# a long chunk has slots enough with few pieces a walk, a short one over a long prefix needs many.
PARTIAL_ROWS = 1024


def piece_cap(tokens: int) -> int:
    """The most pieces a tile of a launch of ``tokens`` prefill tokens is cut into."""
    return max(2, min(MAX_PIECES, PARTIAL_ROWS // max(tokens, 1)))


@dataclass(frozen=True)
class ChunkWork:
    """One batch's balanced prefill work (see the module's docstring)."""

    items: np.ndarray  # int32 [pieces, ITEM_FIELDS]
    work_indptr: np.ndarray  # int32 [programs + 1]
    row_splits: np.ndarray  # int32 [tokens, kv_heads]
    split_capacity: int  # the most pieces of any tile (1: nothing split)
    slots: int  # programs the GPU holds at once
    # In key tiles walked, fixed costs included: the plan's longest chain of work on one slot, and the
    # walks' total unsplit.
    critical_path: float
    unsplit_cost: float
    planned_cost: float  # the pieces' total: the unsplit walks and what their cuts add
    longest_piece: float

    @property
    def programs(self) -> int:
        return len(self.work_indptr) - 1

    @property
    def ideal(self) -> float:
        """The unsplit work spread evenly over every slot: no plan does better."""
        return self.unsplit_cost / self.slots


@dataclass
class BalancedWork:
    """A launch's balanced work: a batch's ``work`` (host arrays) and the device ``buffers``
    (chunk_attention.ChunkBuffers) it runs from, made on first use for an eager batch, at capture
    for a graph's launch (which has no work of its own); ``split_capacity``: the partials' stride."""

    work: ChunkWork | None
    split_capacity: int
    programs: int
    item_capacity: int
    buffers: object = None

    @classmethod
    def of(cls, work: ChunkWork) -> BalancedWork:
        return cls(work, work.split_capacity, work.programs, len(work.items))

    @classmethod
    def room(cls, walks: int, wave: int | None, fewest_tokens: int) -> BalancedWork | None:
        """Room for the work of any batch of a graph's launch (``holds``): ``walks`` at most, its
        pieces capped as those of ``fewest_tokens`` tokens are (``piece_cap``). None: no GPU."""
        if wave is None:
            return None
        most = FLAT_WAVES * wave
        return cls(None, piece_cap(fewest_tokens), max(most, walks), max(walks + wave, most))

    def holds(self, other: BalancedWork) -> bool:
        """Whether these buffers hold ``other``'s work."""
        return (self.split_capacity >= other.split_capacity and self.programs >= other.programs
                and self.item_capacity >= other.item_capacity)


def tile_walks(query_lens, seq_lens, block_q: int, block_n: int) -> tuple[np.ndarray, ...]:
    """Every q-tile of the chunks: (request, first query token, key tiles its causal walk reads),
    as paged_attention's program walks them (up to its last row's position)."""
    q = np.asarray(query_lens, dtype=np.int64)
    s = np.asarray(seq_lens, dtype=np.int64)
    tiles = -(-q // block_q)
    req = np.repeat(np.arange(len(q)), tiles)
    first_tile = np.cumsum(tiles) - tiles
    first_q = (np.arange(len(req)) - np.repeat(first_tile, tiles)) * block_q
    prefix = (s - q)[req]
    kv_end = np.minimum(s[req], prefix + first_q + block_q)
    return req, first_q, -(-kv_end // block_n)


def plan_chunks(query_lens, seq_lens, num_kv_heads: int, block_q: int, block_n: int, programs: int, *,
                split_cost: float = 1.0, max_pieces: int = MAX_PIECES,
                base_cost: float = BASE_COST) -> ChunkWork:
    """The balanced work of a batch's chunks (``query_lens``/``seq_lens``: its prefill requests) for a
    persistent grid of ``programs`` (SMs x resident CTAs); ``split_cost``: a split piece's partial
    written and merged, in key tiles (split_rule.SplitRule.split_cost_tiles); ``base_cost``: any
    piece's query load and output store. Where cutting walks would not shorten the critical path,
    today's grid instead: a program per walk, or per each of its equal shares, longest first. At
    most ``max(walks + programs - 1, FLAT_WAVES * programs)`` pieces and programs (what a graph's
    buffers hold)."""
    walks = tile_walks(query_lens, seq_lens, block_q, block_n)
    return _work(query_lens, walks, num_kv_heads, block_q, block_n, programs, split_cost, max_pieces,
                 base_cost)


def _work(query_lens, walks, heads: int, block_q: int, block_n: int, programs: int, split_cost: float,
          max_pieces: int, base_cost: float) -> ChunkWork:
    """``plan_chunks``' work from the batch's ``walks`` (``tile_walks``): compiled where the
    planner library is built (plan_native.py, the same work), else in numpy."""
    # Checked here for both: the compiled planner would divide by a zero count.
    require(programs >= 1 and heads >= 1 and block_q >= 1 and block_n >= 1 and max_pieces >= 2
            and split_cost >= 0 and base_cost >= 0,
            f"chunk plan: programs={programs}, heads={heads}, block_q={block_q}, block_n={block_n} must "
            f"be >= 1, max_pieces={max_pieces} >= 2, split_cost={split_cost} and "
            f"base_cost={base_cost} >= 0")
    native = plan_native.plan(walks, query_lens, heads, block_q, block_n, programs, split_cost,
                              max_pieces, base_cost, MIN_PIECE, FLAT_WAVES)
    if native is not None:
        items, indptr, rows, most, path, unsplit, planned, longest = native
        return ChunkWork(items, indptr, rows, most, programs, path, unsplit, planned, longest)
    req, first_q, keys = walks
    # (tile, head) walks, longest first (ties in tile order: the same batch always plans the same).
    order = np.argsort(-np.repeat(keys, heads), kind="stable")
    walk_tile, walk_head = order // heads, order % heads
    k = keys[walk_tile]
    best = _best(k, programs, split_cost, max_pieces, base_cost)
    pw, po, hi, counts, splits, piece_cost, program, path = best
    split = np.arange(len(pw)) - np.repeat(np.cumsum(counts) - counts, counts)
    by_program = np.argsort(program, kind="stable")
    tile = walk_tile[pw]
    items = np.zeros((len(pw), ITEM_FIELDS), dtype=np.int32)
    items[:, :7] = np.stack([req[tile], walk_head[pw], first_q[tile], po * block_n, hi * block_n, split,
                             splits], 1)[by_program]
    grid = max(programs, int(program.max(initial=0)) + 1)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(program, minlength=grid))]).astype(np.int32)
    tile_splits = np.ones((len(keys), heads), dtype=np.int32)
    tile_splits[walk_tile, walk_head] = counts
    return ChunkWork(items, indptr, _row_splits(query_lens, block_q, tile_splits), int(counts.max(initial=1)),
                     programs, path, float((k + base_cost).sum()), float(piece_cost.sum()),
                     float(piece_cost.max(initial=0.0)))


def _best(k: np.ndarray, programs: int, split_cost: float, max_pieces: int, base: float):
    """The pieces of the shortest critical path among the plans tried: the walks cut every equal
    share, whole waves of walks with only the rest cut, and today's flat grid. A plan whose lower
    bound (``tail_bound``, ``flat_bound``) cannot beat the best so far is not built: the same
    plan, fewer numpy calls."""
    best = _cut(k, programs, split_cost, max_pieces, base)
    if tail_bound(k, programs, base) < best[-1]:
        tail = _tail(k, programs, split_cost, max_pieces, base, best[-1])
        best = tail if tail is not None and tail[-1] < best[-1] else best
    # Today's grid (a program per walk, or per each of its equal shares within two waves, as
    # split_rule.py bounds it) where no cut plan beats it.
    for share_count in range(1, min(max_pieces, int(k.min()) if len(k) else 1) + 1):
        if share_count > 1 and len(k) * share_count > FLAT_WAVES * programs:
            break
        piece_bound, mean_bound = flat_bound(k, share_count, split_cost, programs, base)
        if mean_bound >= best[-1]:  # a higher count only adds fixed costs
            break
        # Share count 1 wins ties: only a bound over the best rules it out.
        if piece_bound > best[-1] or (share_count > 1 and piece_bound == best[-1]):
            continue
        flat = _flat(k, share_count, split_cost, programs, base)
        best = flat if flat[-1] < best[-1] or (flat[-1] == best[-1] and share_count == 1) else best
    return best


def _cut(k: np.ndarray, programs: int, split_cost: float, max_pieces: int, base: float):
    """The walks (longest first) laid end to end and cut every equal share (``_pieces``' result)."""
    ends = np.cumsum(k + base)
    starts = ends - k - base
    total = float(ends[-1]) if len(ends) else 0.0
    floor = (float(k.max(initial=0)) + base) / (max_pieces - 1)
    # Program j ends where the walks and the fixed costs its cuts add (a piece started inside a
    # walk: its query load and partial; one ended inside: its partial) come to (j + 1) shares. Which
    # cuts fall inside walks is known only after cutting: a few passes, the best kept.
    inner, best = np.zeros(max(programs - 1, 0), dtype=bool), None
    for _ in range(4):
        added = (base + 2 * split_cost) * inner
        share = max((total + added.sum()) / programs, floor)
        cut = np.arange(1, programs) * share - (np.cumsum(added) - added) - split_cost * inner
        walk, off, cut_at, cut_inner = _cuts(ends, starts, k, cut, base)
        # A program's pieces cost at least the span between its cuts: a pass whose widest span is
        # no shorter than the best plan so far cannot beat it, and is not built.
        if best is None or widest(cut_at, total, base, split_cost) < best[-1]:
            pieces = _pieces(k, starts, walk, off, cut_at, cut_inner, split_cost, programs, base)
            best = pieces if best is None or pieces[-1] < best[-1] else best
        was, inner = inner, np.zeros(max(programs - 1, 0), dtype=bool)
        inner[: len(cut_inner)] = cut_inner
        if np.array_equal(was, inner):  # the next pass would cut exactly here again
            break
    return best


def _tail(k: np.ndarray, programs: int, split_cost: float, max_pieces: int, base: float,
          beat: float = np.inf):
    """Whole waves of walks unsplit, a walk a slot a wave, and only the walks past them cut (every
    equal share, or each in equal shares within one wave), each share onto the slot its whole walks
    load least: a grid a few walks past whole waves spreads them over every slot instead of paying a
    wave for them. None: no such walks. Equal shares whose longest, on the least loaded slot, cannot
    ``beat`` a plan are not built (the best of them is then one that does, or none does)."""
    whole = len(k) // programs * programs
    if whole == 0 or whole == len(k):
        return None
    rest = k[whole:]
    slot = np.arange(whole) % programs
    load = np.bincount(slot, weights=k[:whole] + base, minlength=programs)
    lightest = np.argsort(load, kind="stable")
    tails = [_cut(rest, programs, split_cost, max_pieces, base)]
    for n in range(2, min(max_pieces, int(rest.min()) // MIN_PIECE) + 1):
        if len(rest) * n > programs:
            break
        # Its longest piece goes onto the least loaded slot, added as the path adds it.
        if float(load.min()) + (-(-int(rest.max()) // n) + base + split_cost) < beat:
            tails.append(_flat(rest, n, split_cost, programs, base))
    ones, best = np.ones(whole, dtype=np.int64), None
    for tw, to, th, tc, ts, tcost, tprog, _ in tails:
        cost = np.concatenate([k[:whole] + base, tcost])
        program = np.concatenate([slot, lightest[tprog]])
        path = float(np.bincount(program, weights=cost, minlength=programs).max(initial=0.0))
        if best is None or path < best[-1]:
            pairs = ((np.arange(whole), tw + whole), (0 * ones, to), (k[:whole], th), (ones, tc),
                     (ones, ts))
            join = [np.concatenate(pair) for pair in pairs]
            best = (*join, cost, program, path)
    return best


# Plans kept by signature (``cached_chunks``); past this many the least recently used goes.
MAX_CACHED_CHUNK_PLANS = 256
_CHUNK_PLANS: OrderedDict[tuple, ChunkWork] = OrderedDict()
# Lookups that found a plan and that made one, since the cache was last cleared.
_CACHE_COUNTS = {"hits": 0, "misses": 0}


def clear_plan_cache() -> None:
    _CHUNK_PLANS.clear()
    _CACHE_COUNTS.update(hits=0, misses=0)


def plan_cache_counts() -> dict[str, int]:
    return dict(_CACHE_COUNTS)


def cached_chunks(query_lens, seq_lens, num_kv_heads: int, block_q: int, block_n: int,
                  programs: int, *, split_cost: float = 1.0, max_pieces: int = MAX_PIECES,
                  base_cost: float = BASE_COST) -> ChunkWork:
    """``plan_chunks``' work, planned once per signature: the query lengths and every tile's key
    tiles, all the plan reads of the lengths, so a batch of a signature met before gets the very
    plan its own planning would make (its arrays are shared: read them, never write)."""
    walks = tile_walks(query_lens, seq_lens, block_q, block_n)
    key = (np.asarray(query_lens, dtype=np.int64).tobytes(), walks[2].astype(np.int64).tobytes(),
           num_kv_heads, block_q, block_n, programs, float(split_cost), max_pieces,
           float(base_cost))
    work = _CHUNK_PLANS.get(key)
    _CACHE_COUNTS["misses" if work is None else "hits"] += 1
    if work is None:
        work = _work(query_lens, walks, num_kv_heads, block_q, block_n, programs, split_cost,
                     max_pieces, base_cost)
        _CHUNK_PLANS[key] = work
        if len(_CHUNK_PLANS) > MAX_CACHED_CHUNK_PLANS:
            _CHUNK_PLANS.popitem(last=False)
    else:
        _CHUNK_PLANS.move_to_end(key)
    return work


def plan_decodes(seq_lens, num_kv_heads: int, block_n: int, programs: int, *, first_request: int,
                 first_token: int, split_cost: float = 1.0,
                 max_pieces: int = MAX_PIECES) -> ChunkWork:
    """The balanced work of a batch's decodes (requests ``first_request`` on, their one tokens from
    ``first_token`` on): a (request, KV head) walk each, cut as the chunks' are. A decode piece's
    query load and output store are one token's rows beside a key tile of many: no base cost."""
    work = cached_chunks([1] * len(seq_lens), seq_lens, num_kv_heads, 1, block_n, programs,
                         split_cost=split_cost, max_pieces=max_pieces, base_cost=0.0)
    items = work.items.copy()
    items[:, 0] += first_request
    rows = np.concatenate([np.ones((first_token, num_kv_heads), dtype=np.int32), work.row_splits])
    return replace(work, items=items, row_splits=rows)


def _cuts(ends: np.ndarray, starts: np.ndarray, k: np.ndarray, cut: np.ndarray, base: float):
    """Cuts at cost positions ``cut`` along the walks laid end to end (each from ``starts`` to
    ``ends``): the walk each falls in, its offset there in key tiles (moved to the walk's end where a
    piece would be under MIN_PIECE), its position in cost units once moved, and whether it falls
    inside its walk."""
    cut = cut[cut < (ends[-1] if len(ends) else 0.0)]
    walk = np.searchsorted(ends, cut, side="right")
    kw, sw = k[walk], starts[walk]
    off = np.minimum(np.maximum(np.rint(cut - sw - base), 0), kw).astype(np.int64)
    off = np.where(off < MIN_PIECE, 0, np.where(kw - off < MIN_PIECE, kw, off))
    cut_at = np.where(off == 0, sw, np.where(off == kw, ends[walk], sw + base + off))
    return walk, off, cut_at, (off > 0) & (off < kw)


def _pieces(k, starts, walk, off, cut_at, inner, split_cost: float, programs: int, base: float):
    """The pieces the cuts make (walk, first and end key tile, its walk's piece count, cost, program)
    and the busiest program's cost."""
    span = int(k.max(initial=0)) + 1  # a (walk, first key tile) pair as one sortable integer
    key = np.sort(np.concatenate([np.arange(len(k)) * span, walk[inner] * span + off[inner]]),
                  kind="stable")
    pw, po = np.divmod(key[np.concatenate([[True], key[1:] != key[:-1]])], span)
    last = np.concatenate([pw[1:] != pw[:-1], [True]])
    hi = np.where(last, k[pw], np.concatenate([po[1:], po[:1]]))
    counts = np.bincount(pw, minlength=len(k))
    splits = counts[pw]
    piece_cost = hi - po + base + np.where(splits > 1, split_cost, 0.0)
    start = starts[pw]
    first = np.where(po == 0, start, start + base + po)
    program = np.searchsorted(np.sort(cut_at), first, side="right")
    path = float(np.bincount(program, weights=piece_cost, minlength=programs).max(initial=0.0))
    return pw, po, hi, counts, splits, piece_cost, program, path


def _flat(k: np.ndarray, share_count: int, split_cost: float, programs: int, base: float):
    """``_pieces``' result for a program per piece, each walk in ``share_count`` equal shares of its key
    tiles (paged_attention's split), longest first as the GPU starts them."""
    pw, po, hi = shares(k, share_count)
    counts = np.full(len(k), share_count)
    piece_cost = hi - po + base + (split_cost if share_count > 1 else 0.0)
    program = np.empty(len(pw), dtype=np.int64)
    program[np.argsort(-piece_cost, kind="stable")] = np.arange(len(pw))
    return pw, po, hi, counts, counts[pw], piece_cost, program, flat_path(piece_cost, programs)


def _row_splits(query_lens, block_q: int, tile_splits: np.ndarray) -> np.ndarray:
    """[tokens, kv_heads]: each token's tile's piece count, per KV head."""
    q = np.asarray(query_lens, dtype=np.int64)
    tiles = -(-q // block_q)
    tok_req = np.repeat(np.arange(len(q)), q)
    within = np.arange(int(q.sum())) - np.repeat(np.cumsum(q) - q, q)
    return tile_splits[(np.cumsum(tiles) - tiles)[tok_req] + within // block_q]


def grid_path(query_lens, seq_lens, num_kv_heads: int, block_q: int, block_n: int, slots: int, splits: int = 1,
              split_cost: float = 1.0) -> float:
    """The critical path of today's grid (a program per walk, or per each of its ``splits`` equal
    shares of its key tiles, longest first onto whichever slot frees first), in ``ChunkWork``'s
    units: the figure the plan is held to."""
    _, _, keys = tile_walks(query_lens, seq_lens, block_q, block_n)
    walks = np.repeat(keys, num_kv_heads)
    share = (np.arange(1, splits + 1)[None, :] * walks[:, None] // splits
             - np.arange(splits)[None, :] * walks[:, None] // splits)
    return flat_path(share.ravel() + BASE_COST + (split_cost if splits > 1 else 0.0), slots)
