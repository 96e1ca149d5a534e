"""How a batch's paged attention is launched, decided on the host (no device sync, no Triton): which
launch takes which work, its tiles, its grid, and into how many programs each tile's KV walk is split.

Work kinds. A hybrid batch holds prefill chunks (many query rows a request) and decodes (one). Each
kind runs in its own launch with its own tiles: decodes one program a (request, KV head) on decode
tiles (the GQA group in a tile's rows), chunks on prefill tiles of 64 rows, or 128 rows on 8 warps (one
warpgroup per 64 rows, as FlashAttention-2 tiles) where a chunk fills a tile that tall. Within a
chunk the tiles walking the most keys (the last, causally) go first, so the last wave holds the short
walks.

Why split: a program owns one tile of query rows of one KV head and walks that tile's whole context.
A chunk of a few tiles, or a few decodes, is then fewer programs than the GPU holds at once, each
walking a long context alone while most SMs idle. As FlashDecoding and FlashInfer do, such a launch
splits every tile's walk across ``num_splits`` programs; each writes its
partial output and log-sum-exp, and a small merge kernel combines them (``split_merge.py``);
split_rule.py picks the count.

Balanced work. On a GPU both launches run balanced work instead (chunk_plan.py): a persistent grid
of a program a slot, each walking an equal share of the keys, a walk cut where a share ends in it
(or only the walks past whole waves cut, which then pay no wave for them as one split count would);
its pieces are planned here from the host lengths and copied into buffers the launch reads
(chunk_attention.py), a graph's sized at capture for any batch it holds. The tiles stay this
module's: 64-row tiles at two CTAs a SM came within a few percent of the tall ones at the attention
step's shapes, and a tall tile on four warps spills its accumulator.

CUDA graphs. A captured launch cannot change its grid, its tiles or its host arguments. So each
launch reads its split count and its range of requests from device integers, its programs are a flat
grid that it maps to (tile, KV head, split) by that count, and a graph's launch is captured with as
many programs as any batch it holds needs (``plan_graph``): programs past the batch's exit at once.
A replayed batch is planned on the host exactly as it would run eagerly (``plan_batch``), and its
split counts and requests are copied into the graph's integers before the replay; the graph is
chosen to have the tiles that plan asks for and room for its splits (cuda_graphs.py). Each program finds its share of
the keys on the device from the request's ``seq_len``, so any split count is right for any context.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from sarathi_kernels._checks import require
from sarathi_kernels.chunk_plan import BalancedWork, cached_chunks, piece_cap, plan_decodes
from sarathi_kernels.occupancy import GpuLimits, device_limits, kernel_resources, resident_ctas
from sarathi_kernels.split_rule import DEFAULT_RULE, SplitRule, cdiv, choose_splits, most_programs, most_splits

__all__ = ["AttentionLaunch", "AttentionPlan", "TileConfig", "WorkTiles", "cdiv", "default_tiles", "device_limits",
           "plan_batch", "plan_graph", "plan_launch", "prefill_tile_choices"]

PREFILL, DECODE = "prefill", "decode"


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@dataclass(frozen=True)
class TileConfig:
    """One launch's tile and compile options: ``block_m`` query rows (tokens x the padded GQA group;
    raised to the group where smaller), ``block_n`` keys a step, Triton's ``num_warps`` and
    ``num_stages`` (None: Triton's default)."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int | None = None

    def __post_init__(self):
        require(self.block_m >= 16 and _power_of_two(self.block_m),
                f"tiles.block_m={self.block_m} is invalid: must be a power of two >= 16")
        require(self.block_n >= 16 and _power_of_two(self.block_n),
                f"tiles.block_n={self.block_n} is invalid: must be a power of two >= 16")
        require(_power_of_two(self.num_warps), f"tiles.num_warps={self.num_warps} is invalid: must be a power of two")
        require(self.num_stages is None or self.num_stages >= 1,
                f"tiles.num_stages={self.num_stages} is invalid: must be >= 1 or None")


@dataclass(frozen=True)
class WorkTiles:
    """The tiles of each work kind (a per-device tuned table passes its own). ``tall_prefill``: the
    prefill tiles of a batch whose longest chunk fills ``tall_prefill.block_m`` rows (None: never)."""

    decode: TileConfig
    prefill: TileConfig
    tall_prefill: TileConfig | None


def default_tiles(element_size: int = 2) -> WorkTiles:
    """Today's tiles. fp32 K/V tiles of 64 positions overflow the ~100 KB of shared memory of consumer
    GPUs, so fp32 walks 32 keys a step."""
    block_n = 64 if element_size == 2 else 32
    return WorkTiles(decode=TileConfig(16, block_n), prefill=TileConfig(64, block_n),
                     tall_prefill=TileConfig(128, block_n, num_warps=8))


@dataclass(frozen=True)
class AttentionLaunch:
    """One launch of the paged attention kernel (and of the merge where it may split)."""

    kind: str  # PREFILL: tiles of block_q tokens of a request; DECODE: one program a request
    group: int  # query heads per KV head
    group_pad: int  # the group padded to a power of two (rows of one token in a tile)
    tiles: TileConfig  # block_m raised to the group
    grid_tiles: int  # an upper bound on its requests' tiles, from shapes alone
    working_tiles: int  # at most this many of them have rows to compute
    num_kv_heads: int
    num_splits: int  # this batch's split count (a graph's launch reads it from a device integer)
    split_capacity: int  # the most splits this launch may be given
    # Its requests, first_request to end_request (a graph's launch reads them from device integers):
    # prefill work is the batch's first requests (its chunks), decode work the rest.
    first_request: int
    end_request: int
    # Its programs, one a (tile, KV head, split), flat: an eager launch's exactly, a graph's as many as
    # any batch it holds needs (the rest exit at once).
    grid_programs: int
    # Prefill work on a GPU: the chunks' balanced pieces (chunk_plan.py), run by chunk_attention.py on
    # a persistent grid instead of the flat one; in a graph's launch, the buffers its replays refill.
    balanced: BalancedWork | None = field(default=None, compare=False)

    @property
    def block_m(self) -> int:
        return self.tiles.block_m

    @property
    def block_n(self) -> int:
        return self.tiles.block_n

    @property
    def num_warps(self) -> int:
        return self.tiles.num_warps

    @property
    def num_stages(self) -> int | None:
        return self.tiles.num_stages

    @property
    def block_q(self) -> int:
        return self.block_m // self.group_pad

    @property
    def grid(self) -> tuple[int]:
        return (self.grid_programs,)

    def device_row(self) -> tuple[int, int, int, int]:
        """What the kernels read of it from the device: split count, first and end request."""
        return self.num_splits, self.first_request, self.end_request, 0

    @property
    def working_programs(self) -> int:
        return self.working_tiles * self.num_kv_heads * self.num_splits

    def launch_options(self) -> dict[str, int]:
        options = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            options["num_stages"] = self.num_stages
        return options


@dataclass(frozen=True)
class AttentionPlan:
    """A batch's launches: prefill work, then decode work (either may be absent). ``split_counts``: a
    CUDA graph's device integers (int32 [2, 4], a row a launch, prefill then decode: ``device_row``)
    that its replays refill; None: each launch's own."""

    prefill: AttentionLaunch | None
    decode: AttentionLaunch | None
    split_counts: torch.Tensor | None = field(default=None, compare=False)

    def launches(self) -> list[AttentionLaunch]:
        return [launch for launch in (self.prefill, self.decode) if launch is not None]

    def work(self) -> dict[str, tuple[TileConfig, int]]:
        """What runs, by work kind with work: its tiles and split count (what a graph must replay as is)."""
        return {launch.kind: (launch.tiles, launch.num_splits) for launch in self.launches() if launch.working_tiles}

    @property
    def prefill_tiles(self) -> TileConfig | None:
        """The tiles of its prefill work (None: it has none)."""
        return self.prefill.tiles if self.prefill is not None and self.prefill.working_tiles else None

    def replays_in(self, graph: AttentionPlan) -> bool:
        """Whether launches captured as ``graph`` (plan_graph's) run this plan as it is: each work kind
        with work finds a launch of its tiles with room for its split count, or its balanced work."""
        for launch in self.launches():
            captured = graph.prefill if launch.kind == PREFILL else graph.decode
            if launch.working_tiles and (captured is None or captured.tiles != launch.tiles
                                         or captured.split_capacity < launch.num_splits
                                         or not _holds(captured.balanced, launch.balanced)):
                return False
        return True

    def with_split_counts(self, counts: list[int]) -> AttentionPlan:
        """These launches given split counts ``counts`` (prefill, decode): what a graph replays."""
        return AttentionPlan(*(None if launch is None else replace(launch, num_splits=count)
                               for launch, count in zip((self.prefill, self.decode), counts)))

    def device_rows(self) -> list[tuple[int, int, int, int]]:
        """Its launches' device integers, prefill then decode (an absent launch: unsplit, no requests)."""
        return [launch.device_row() if launch else (1, 0, 0, 0) for launch in (self.prefill, self.decode)]


def _holds(captured: BalancedWork | None, batch: BalancedWork | None) -> bool:
    if batch is None:
        return captured is None
    return captured is not None and captured.holds(batch)


def _group(num_heads: int, num_kv_heads: int) -> tuple[int, int]:
    group = num_heads // num_kv_heads
    return group, 1 << (group - 1).bit_length()


def _raised(tiles: TileConfig, group_pad: int) -> TileConfig:
    return tiles if tiles.block_m >= group_pad else TileConfig(group_pad, tiles.block_n, tiles.num_warps,
                                                               tiles.num_stages)


def wave_of(kind: str, tiles: TileConfig, limits: GpuLimits | None) -> int | None:
    """Programs of this launch the GPU runs at once (None: no GPU)."""
    if limits is None:
        return None
    return limits.num_sms * resident_ctas(kernel_resources(kind, tiles.block_m, tiles.num_warps), limits)


def prefill_tiles_for(longest_chunk: int, group_pad: int, tiles: WorkTiles) -> TileConfig:
    """Tall tiles where the longest chunk fills one; 64-row ones otherwise."""
    tall = tiles.tall_prefill
    if tall is not None and longest_chunk * group_pad >= tall.block_m:
        return _raised(tall, group_pad)
    return _raised(tiles.prefill, group_pad)


def prefill_tile_choices(num_heads: int, num_kv_heads: int, element_size: int = 2,
                         tiles: WorkTiles | None = None) -> list[tuple[TileConfig, int]]:
    """Every prefill tile ``prefill_tiles_for`` may pick, each with the fewest tokens of a batch's
    longest chunk that pick it, ascending (what a CUDA graph captures a variant for)."""
    tiles = tiles or default_tiles(element_size)
    _, group_pad = _group(num_heads, num_kv_heads)
    choices = [(_raised(tiles.prefill, group_pad), 2)]  # a chunk of one token is decode work
    if tiles.tall_prefill is not None:
        tall_from = cdiv(tiles.tall_prefill.block_m, group_pad)
        if tall_from <= 2:
            return [(_raised(tiles.tall_prefill, group_pad), 2)]
        choices.append((_raised(tiles.tall_prefill, group_pad), tall_from))
    return choices


def plan_batch(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, *,
               num_prefills: int | None = None, element_size: int = 2, limits: GpuLimits | None = None,
               tiles: WorkTiles | None = None, rule: SplitRule = DEFAULT_RULE) -> AttentionPlan:
    """The launches of a batch of requests with these query lengths and contexts (host values, as
    the engine knows them before its forward), its ``num_prefills`` chunks first (default: all but its
    trailing one-token requests), then its decodes. ``limits`` None (no GPU): nothing splits."""
    tiles = tiles or default_tiles(element_size)
    group, group_pad = _group(num_heads, num_kv_heads)
    requests = len(query_lens)
    if num_prefills is None:
        num_prefills = requests
        while num_prefills and query_lens[num_prefills - 1] == 1:
            num_prefills -= 1
    decode = prefill = None
    if num_prefills < requests:
        config = _raised(tiles.decode, group_pad)
        count = requests - num_prefills
        key_tiles = cdiv(max(seq_lens[num_prefills:]), config.block_n)
        splits = choose_splits(count * num_kv_heads, key_tiles, wave_of(DECODE, config, limits), rule)
        balanced = None
        if limits is not None:  # a GPU: balanced pieces (the flat launch's split unused)
            work = plan_decodes(seq_lens[num_prefills:], num_kv_heads, config.block_n,
                                wave_of(DECODE, config, limits), first_request=num_prefills,
                                first_token=sum(query_lens[:num_prefills]),
                                split_cost=rule.split_cost_tiles,
                                max_pieces=piece_cap(sum(query_lens)))
            balanced, splits = BalancedWork.of(work), 1
        decode = AttentionLaunch(DECODE, group, group_pad, config, count, count, num_kv_heads, splits, splits,
                                 num_prefills, requests, count * num_kv_heads * splits, balanced)
    if num_prefills:
        chunks = query_lens[:num_prefills]
        config = prefill_tiles_for(max(chunks), group_pad, tiles)
        block_q = config.block_m // group_pad
        working = sum(cdiv(q, block_q) for q in chunks)
        key_tiles = cdiv(max(seq_lens[:num_prefills]), config.block_n)
        splits = choose_splits(working * num_kv_heads, key_tiles, wave_of(PREFILL, config, limits), rule)
        grid_tiles = sum(chunks) // block_q + num_prefills
        balanced = None
        if limits is not None:  # a GPU: balanced pieces on a persistent grid (the flat launch's split unused)
            work = cached_chunks(chunks, seq_lens[:num_prefills], num_kv_heads, block_q, config.block_n,
                               wave_of(PREFILL, config, limits), split_cost=rule.split_cost_tiles,
                               max_pieces=piece_cap(sum(chunks)))
            balanced, splits = BalancedWork.of(work), 1
        prefill = AttentionLaunch(PREFILL, group, group_pad, config, grid_tiles, working, num_kv_heads, splits, splits,
                                  0, num_prefills, grid_tiles * num_kv_heads * splits, balanced)
    return AttentionPlan(prefill, decode)


def plan_graph(tokens: int, requests: int, num_heads: int, num_kv_heads: int, *, max_seq_len: int,
               prefill_tiles: TileConfig | None, fewest_tokens: int = 1, fewest_decodes: int = 1,
               element_size: int = 2,
               limits: GpuLimits | None = None, tiles: WorkTiles | None = None, rule: SplitRule = DEFAULT_RULE,
               split_counts: torch.Tensor | None = None) -> AttentionPlan:
    """The launches a CUDA graph captures for every batch of ``fewest_tokens`` to ``tokens`` tokens in
    at most ``requests`` requests of contexts up to ``max_seq_len`` (with at least ``fewest_decodes``
    decodes where it has any): a decode launch over every request and, with ``prefill_tiles`` (a mixed
    graph), a prefill launch on those tiles, each with as many splits as any batch it holds can be
    given (split_rule.most_splits at its fewest programs and longest walk)."""
    tiles = tiles or default_tiles(element_size)
    group, group_pad = _group(num_heads, num_kv_heads)
    config = _raised(tiles.decode, group_pad)
    wave = wave_of(DECODE, config, limits)
    capacity = most_splits(fewest_decodes * num_kv_heads, cdiv(max_seq_len, config.block_n), wave, rule)
    # A split launch's programs: D decodes x heads x s (split_rule.most_programs).
    programs = min(requests * num_kv_heads * capacity,
                   most_programs(requests * num_kv_heads, wave, rule) if capacity > 1 else requests * num_kv_heads)
    decode = AttentionLaunch(DECODE, group, group_pad, config, requests, requests, num_kv_heads, 1,
                             capacity, 0, requests, programs,
                             BalancedWork.room(requests * num_kv_heads, wave, fewest_tokens))
    prefill = None
    if prefill_tiles is not None:
        block_q = prefill_tiles.block_m // group_pad
        # A batch of this graph has prefill work of at least its tokens less one a decode beside it.
        fewest_tiles = max(1, cdiv(fewest_tokens - (requests - 1), block_q))
        wave = wave_of(PREFILL, prefill_tiles, limits)
        capacity = most_splits(fewest_tiles * num_kv_heads, cdiv(max_seq_len, prefill_tiles.block_n), wave, rule)
        grid_tiles = tokens // block_q + requests
        # A split launch's grid tiles (T // block_q + P) are at most twice its working ones W (each of
        # its P chunks has one), and W x heads x s <= most_programs(W x heads).
        programs = min(grid_tiles * num_kv_heads * capacity,
                       max(grid_tiles * num_kv_heads,
                           2 * most_programs(grid_tiles * num_kv_heads, wave, rule) if capacity > 1 else 0))
        # Its batches' chunks hold at least its tokens less one a decode beside them.
        fewest_chunks = max(1, fewest_tokens - (requests - 1))
        balanced = BalancedWork.room(grid_tiles * num_kv_heads, wave, fewest_chunks)
        prefill = AttentionLaunch(PREFILL, group, group_pad, prefill_tiles, grid_tiles,
                                  cdiv(tokens, block_q) + requests - 1, num_kv_heads, 1, capacity, 0, requests,
                                  programs, balanced)
    return AttentionPlan(prefill, decode, split_counts)


def plan_launch(num_tokens: int, num_requests: int, num_heads: int, num_kv_heads: int, *, max_seq_len: int,
                element_size: int = 2, max_query_len: int | None = None, num_sms: int | None = None,
                block_m: int | None = None, block_n: int | None = None, num_splits: int | None = None,
                num_warps: int | None = None, num_stages: int | None = None, limits: GpuLimits | None = None,
                rule: SplitRule = DEFAULT_RULE) -> AttentionLaunch:
    """One launch for a batch known only by its shapes (no host lengths: benchmarks and direct
    callers): decode tiles where ``max_query_len`` is 1, else prefill tiles walking every request
    (one-token ones too). ``num_sms`` (an H100-like GPU of that many SMs) or ``limits``; neither: no
    split. The keywords after it override the tiles, the
    split count and the compiler's warps/stages."""
    group, group_pad = _group(num_heads, num_kv_heads)
    defaults = default_tiles(element_size)
    kind = DECODE if max_query_len == 1 else PREFILL
    base = defaults.decode if kind == DECODE else prefill_tiles_for(max_query_len or num_tokens, group_pad, defaults)
    block_m = block_m or max(base.block_m, group_pad)
    require(block_m >= max(16, group_pad) and _power_of_two(block_m),
            f"block_m must be a power of two >= max(16, GQA group {group_pad}), got {block_m}")
    require(num_splits is None or num_splits >= 1, f"num_splits must be >= 1, got {num_splits}")
    # One warpgroup (4 warps) per 64 rows: a 128-row tile on 4 warps spills its accumulator.
    config = TileConfig(block_m, block_n or base.block_n, num_warps or (8 if block_m >= 128 else 4), num_stages)
    if kind == DECODE:
        grid_tiles = working_tiles = num_requests
    else:
        block_q = block_m // group_pad
        # Request i owns tiles from query_start_loc[i] // block_q + i (paged_attention.py), so the grid
        # needs T // block_q + R; of those, each request's ceil(q_len / block_q) have rows, at most
        # ceil(T / block_q) + R - 1 in all and R * ceil(max_query_len / block_q).
        grid_tiles = num_tokens // block_q + num_requests
        working_tiles = cdiv(num_tokens, block_q) + num_requests - 1
        if max_query_len is not None:
            working_tiles = min(working_tiles, num_requests * cdiv(max_query_len, block_q))
    if num_splits is None:
        limits = GpuLimits(num_sms) if num_sms is not None else limits
        num_splits = choose_splits(working_tiles * num_kv_heads, cdiv(max_seq_len, config.block_n),
                                   wave_of(kind, config, limits), rule)
    return AttentionLaunch(kind, group, group_pad, config, grid_tiles, working_tiles, num_kv_heads, num_splits,
                           num_splits, 0, num_requests, grid_tiles * num_kv_heads * num_splits)
