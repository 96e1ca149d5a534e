"""The paged attention kernel's tile configs swept per work kind at the benchmark shapes, each timed
interleaved with today's defaults and checked against them; the best correct one is kept. With those
tiles the split count is swept, and the split rule's knobs fitted to the times. On a CPU it dry-runs
in Triton's interpreter (its times say nothing)."""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable

import torch
from sarathi_kernels.split_rule import DEFAULT_RULE, SplitRule

from sarathi_lab.engine.timer import time_interleaved
from sarathi_lab.measure.profiling import attention_peers as peers
from sarathi_lab.measure.profiling.attention_grid import Case
from sarathi_lab.tuned_kernels import TileConfig

# Prefill work (any q-tile of 2+ rows): 128 rows on 8 warps, one warpgroup per 64 rows.
PREFILL_TILES = tuple(TileConfig(m, n, 4 if m == 64 else 8, s) for m, n, s in
                      ((64, 64, 2), (64, 64, 3), (64, 32, 3), (64, 128, 2), (128, 64, 2),
                       (128, 64, 3), (128, 32, 3), (128, 128, 2)))
# Decode work (one row per request, the GQA group in M): short tiles, long key steps.
DECODE_TILES = tuple(TileConfig(m, n, w, s) for m, n, w, s in
                     ((16, 64, 4, 2), (16, 64, 4, 3), (16, 128, 4, 2), (32, 64, 4, 3),
                      (16, 32, 2, 3), (64, 64, 4, 3)))
TILES = {"prefill": PREFILL_TILES, "decode": DECODE_TILES}
SPLIT_SCALES = (0.5, 1.0, 2.0)
MAX_REL_DIFF = 2e-2
# How short a split's walk may be, and its fixed cost (query tile, merge) in key tiles.
RULE_GRID = tuple(SplitRule(min_key_tiles=t, split_cost_tiles=c)
                  for t in (2, 4, 8) for c in (0.5, 1.0, 2.0))
# Another rule replaces the default only if it loses this much less: within it is noise.
FIT_MARGIN = 0.02


def shapes(device: str) -> dict[str, list[Case]]:
    """LLaMA-13B's and Mistral-7B's heads at the paper's chunks and batches; tiny on a CPU."""
    if device != "cuda":
        heads, d = ((2, 2), (4, 1)), 16
        return {"prefill": [Case("chunk", h, kv, d, 16, 48) for h, kv in heads],
                "decode": [Case("decode", h, kv, d, 1, 24, 3) for h, kv in heads]}
    heads, d = ((40, 40), (32, 8)), 128
    return {"prefill": [Case("chunk", h, kv, d, c, p + c)
                        for h, kv in heads for c in (256, 512) for p in (1024, 3072)]
            + [Case("prefill", h, kv, d, 2048, 2048) for h, kv in heads],
            "decode": [Case("decode", h, kv, d, 1, ctx, b)
                       for h, kv in heads for b, ctx in ((18, 1024), (64, 4096))]}


def planned_splits(x: peers.Inputs, tiles: TileConfig, rule: SplitRule = DEFAULT_RULE) -> int:
    from sarathi_kernels.attention_plan import plan_launch
    from sarathi_kernels.occupancy import device_sm_count

    q, m = x.query, x.meta
    return plan_launch(q.shape[0], m.seq_lens.shape[0], q.shape[1], x.k_cache.shape[2],
                       max_seq_len=m.block_tables.shape[1] * x.k_cache.shape[1],
                       element_size=q.element_size(), max_query_len=m.max_query_len,
                       num_sms=device_sm_count(q.device), rule=rule,
                       **tiles.launch_kwargs()).num_splits


def sweep_kind(kind: str, cases: list[Case], *, dtype: torch.dtype, device: torch.device,
               block_size: int, reps: int, warmup: int, limit: int | None = None,
               seconds_left: Callable[[], float | None] = lambda: None,
               ) -> tuple[TileConfig, float, list[dict]]:
    """The best config (the defaults unless beaten), its score and one row per (case, contender)."""
    inputs = [peers.make_inputs(case, dtype, device, block_size) for case in cases]
    defaults = [peers.engine_call(x)().float() for x in inputs]
    ratios: dict[TileConfig, list[float]] = {}
    rows = []
    for tiles in TILES[kind][:limit]:
        left = seconds_left()
        if left is not None and left < 20:
            break
        ratios[tiles] = []
        for case, x, reference in zip(cases, inputs, defaults):
            row = {"kind": kind, "shape": case.label, "tiles": tiles_label(tiles),
                   "splits": "planned"}
            try:
                call = peers.engine_call(x, **tiles.launch_kwargs())
                diff = peers.rel_diff(call(), reference)
                row["rel_diff"] = diff
                if diff > MAX_REL_DIFF:
                    raise ValueError(f"rel diff {diff:.3g} > {MAX_REL_DIFF}")
                times = time_interleaved({"default": peers.engine_call(x), "tiles": call}, reps,
                                         device, warmup)
                row |= {"ms": statistics.median(times["tiles"]),
                        "default_ms": statistics.median(times["default"])}
                ratios[tiles].append(row["ms"] / row["default_ms"])
            except Exception as e:  # noqa: BLE001 (a config that fails or is wrong is a result)
                first = str(e).splitlines()[0] if str(e) else ""
                row["error"] = f"{type(e).__name__}: {first}"[:200]
                ratios[tiles].append(math.inf)
            rows.append(row)
    scores = {t: _geomean(r) for t, r in ratios.items()}
    finite = {t: s for t, s in scores.items() if math.isfinite(s)}
    best = min(finite, key=finite.get) if finite and min(finite.values()) < 1.0 else TileConfig()
    by_label = {tiles_label(t): s for t, s in scores.items()}
    for row in rows:
        row["score"] = by_label[row["tiles"]]
    rows += _split_rows(kind, cases, inputs, best, reps, device, warmup)
    return best, scores.get(best, 1.0), rows


def _split_rows(kind, cases, inputs, tiles: TileConfig, reps, device, warmup) -> list[dict]:
    rows = []
    for case, x in zip(cases, inputs):
        planned = planned_splits(x, tiles)
        counts = sorted({max(1, round(planned * s)) for s in SPLIT_SCALES})
        calls = {f"splits={n}": peers.engine_call(x, num_splits=n, **tiles.launch_kwargs())
                 for n in counts}
        times = time_interleaved(calls, reps, device, warmup)
        by_rule = json.dumps({rule_label(r): planned_splits(x, tiles, r) for r in RULE_GRID})
        rows += [{"kind": kind, "shape": case.label, "tiles": tiles_label(tiles),
                  "splits": name.split("=")[1], "planned_splits": planned, "rule_splits": by_rule,
                  "ms": statistics.median(t)}
                 for name, t in times.items()]
    return rows


def rule_label(rule: SplitRule) -> str:
    """``k4_c1``: a split's fewest key tiles and its fixed cost in key tiles."""
    return f"k{rule.min_key_tiles}_c{rule.split_cost_tiles:g}"


def _loss(times: dict[int, float], count: int) -> float:
    """Interpolated in log2(count) between the counts timed, the nearest end's time outside them."""
    lo = max((c for c in times if c <= count), default=min(times))
    hi = min((c for c in times if c >= count), default=max(times))
    log2 = math.log2
    w = 0.0 if hi == lo else (log2(count) - log2(lo)) / (log2(hi) - log2(lo))
    return (times[lo] * (1 - w) + times[hi] * w) / min(times.values())


def fit_split_rule(rows: list[dict]) -> tuple[SplitRule, float]:
    """The rule losing least to each shape's fastest count, unless short of FIT_MARGIN."""
    shapes_: dict[tuple[str, str], tuple[dict[int, float], dict[str, int]]] = {}
    for row in rows:
        if row.get("rule_splits") and math.isfinite(row.get("ms", math.nan)):
            times, _ = shapes_.setdefault((row["kind"], row["shape"]),
                                          ({}, json.loads(row["rule_splits"])))
            times[int(row["splits"])] = row["ms"]
    if not shapes_:
        return DEFAULT_RULE, 1.0
    losses = {r: _geomean([_loss(times, by_rule[rule_label(r)])
                           for times, by_rule in shapes_.values()])
              for r in RULE_GRID}
    best = min(losses, key=losses.get)
    gain = losses[DEFAULT_RULE] / losses[best]
    return (best, gain) if gain > 1 + FIT_MARGIN else (DEFAULT_RULE, 1.0)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and all(
        math.isfinite(v) for v in values) else math.inf


def tiles_label(tiles: TileConfig) -> str:
    """``m128_n64_w8_s2``, or ``default`` (the kernel's own tiling)."""
    if tiles == TileConfig():
        return "default"
    return f"m{tiles.block_m}_n{tiles.block_n}_w{tiles.num_warps}_s{tiles.num_stages}"
