"""Into how many programs each tile's KV walk is split (attention_plan.py says why a walk is split).

The cost model, here and only here (``walk_time``): the GPU runs a launch in waves of ``wave``
programs (SMs x resident CTAs a SM, occupancy.py); a launch of ``programs`` unsplit programs split
``s`` ways takes ceil(programs * s / wave) waves, each as long as one split's walk: its share of the
``key_tiles`` plus a split's fixed cost (loading its query tile, writing its fp32 partial for the merge
to read back). Its critical path is waves x per-program walk, in key tiles walked one after another;
the same KV read by a whole wave at once takes programs * key_tiles / wave of them.

The rule takes the split count with the shortest critical path, the smallest where several tie, at
any grid size: a grid just over a whole number of waves splits too, where the shorter walks outweigh
the extra waves and fixed costs, by ``min_gain`` at least (FlashAttention-2's ``num_splits_heuristic``,
csrc/flash_attn/flash_api.cpp, weighs the same wave efficiency but never splits a grid of 0.8 of a wave
or more). So a split grid fills its last wave as far as a split count can.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from sarathi_kernels._checks import require

# The most splits any launch may be given: the device integers split_merge.py keeps go up to it.
MAX_SPLIT_COUNT = 64


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SplitRule:
    """The rule's knobs (a per-device tuned table may pass others)."""

    # A split walks at least this many key tiles: with fewer, writing and merging its partial costs
    # about as much as the walk it takes off another program.
    min_key_tiles: int = 4
    # A cap on the partial buffers (rows x heads x splits x head_dim fp32) and the merge's loop.
    max_splits: int = 32
    # Split counts are sought up to this many times the waves of the unsplit grid and one more: past
    # that, a wave's share of the walk is small against the launch's fixed costs.
    max_waves: int = 2
    # A split's fixed cost in key tiles' worth of memory traffic: a query tile read and a partial
    # written and read back are each about one key/value tile of the same rows.
    split_cost_tiles: float = 1.0
    # A launch splits only where its best split count shortens the unsplit critical path by this share:
    # the model leaves out the merge's launch and the partials' contention, which eat a smaller gain
    # (FlashAttention-2's num_splits_heuristic likewise settles for 85% of the best wave efficiency).
    min_gain: float = 0.15

    def __post_init__(self):
        require(self.min_key_tiles >= 1, f"split_rule.min_key_tiles={self.min_key_tiles} is invalid: "
                                         "must be >= 1")
        require(1 <= self.max_splits <= MAX_SPLIT_COUNT, f"split_rule.max_splits={self.max_splits} is invalid: "
                                                         f"must be in [1, {MAX_SPLIT_COUNT}]")
        require(self.max_waves >= 1, f"split_rule.max_waves={self.max_waves} is invalid: must be >= 1")
        require(self.split_cost_tiles >= 0, f"split_rule.split_cost_tiles={self.split_cost_tiles} is "
                                            "invalid: must be >= 0")
        require(0 <= self.min_gain < 1, f"split_rule.min_gain={self.min_gain} is invalid: must be in [0, 1)")


    @classmethod
    def with_knobs(cls, knobs: dict, where: str = "split_rule") -> SplitRule:
        """The rule with ``knobs`` moved from the defaults (a tuned table's); an unknown knob, a
        fraction for a whole-number one or one out of range fails in one line naming ``where.knob``."""
        names = {f.name for f in fields(cls)}
        for key, value in knobs.items():
            require(key in names, f"{where}.{key}={value!r} is invalid; allowed: {', '.join(sorted(names))}")
            whole = isinstance(getattr(DEFAULT_RULE, key), int)
            require(not whole or float(value).is_integer(), f"{where}.{key}={value!r} is invalid: must be an integer")
        return cls(**{k: int(v) if isinstance(getattr(DEFAULT_RULE, k), int) else v for k, v in knobs.items()})

    def moved_knobs(self) -> dict:
        """The knobs that differ from the defaults (what a tuned table stores)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(DEFAULT_RULE, f.name)}


DEFAULT_RULE = SplitRule()


def most_splits(programs: int, key_tiles: int, wave: int | None, rule: SplitRule = DEFAULT_RULE) -> int:
    """The largest split count the rule considers for ``programs`` unsplit programs whose longest walk
    has ``key_tiles``: a bound that holds for any more programs and any fewer key tiles (what a CUDA
    graph sizes its grid by). Its split grid holds at most ``most_programs(programs, wave)``."""
    if wave is None or programs <= 0:
        return 1
    return max(1, min(rule.max_splits, key_tiles // rule.min_key_tiles,
                      rule.max_waves * (programs + wave) // programs))


def most_programs(programs: int, wave: int, rule: SplitRule = DEFAULT_RULE) -> int:
    """The most programs a split launch of at most ``programs`` unsplit ones runs: p x most_splits(p)
    <= max_waves x (p + wave), which grows with p."""
    return rule.max_waves * (programs + wave)


def waves(programs: int, wave: int) -> int:
    return cdiv(programs, wave)


def walk_time(programs: int, key_tiles: int, splits: int, wave: int, rule: SplitRule = DEFAULT_RULE) -> float:
    """The launch's critical path in key tiles walked one after another: waves x the longest program's
    walk (the module's cost model)."""
    fixed = rule.split_cost_tiles if splits > 1 else 0.0
    return waves(programs * splits, wave) * (cdiv(key_tiles, splits) + fixed)


def choose_splits(programs: int, key_tiles: int, wave: int | None, rule: SplitRule = DEFAULT_RULE) -> int:
    """The split count of a launch of ``programs`` unsplit programs with work whose longest walk has
    ``key_tiles`` key tiles, on a GPU that runs ``wave`` of them at once (None, no GPU: 1): the one of
    the shortest critical path (``walk_time``), the smallest of those that tie; unsplit where that
    path is not ``min_gain`` shorter than the unsplit one."""
    top = most_splits(programs, key_tiles, wave, rule)
    if top == 1:
        return 1
    best = min(range(1, top + 1), key=lambda s: (walk_time(programs, key_tiles, s, wave, rule), s))
    unsplit = walk_time(programs, key_tiles, 1, wave, rule)
    return best if walk_time(programs, key_tiles, best, wave, rule) <= (1 - rule.min_gain) * unsplit else 1
