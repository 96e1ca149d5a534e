"""The claims table: one row per claim and per source of numbers (measured, or simulated by one
cost model), never two sources in one row. Each check states its criterion in its claim text and
says ``yes``, ``partly`` (some of the points), ``no`` or ``n/a``; over repeated seeds ``spread`` is
the range of the row's headline number, and seeds that disagree make it ``unclear``."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis import derive, paper
from sarathi_lab.profiling import quantities

PROVENANCE = ["source", "scale", "dtype", "threads", "machine"]
DIFFERS = "differs by cost model"
COLUMNS = ["experiment", "claim", "paper", "source", "ours", "spread", "holds", "left out", *PROVENANCE[1:], DIFFERS]
NO_REPEATS = "one run per point: no spread"


def simulated_provenance(source: str, scale: str, dtype: str = "") -> dict[str, str]:
    """PROVENANCE of numbers a cost model predicted: no threads ran and no machine was measured."""
    return {"source": source, "scale": scale, "dtype": dtype, "threads": "n/a (simulated)",
            "machine": "none: predicted by the cost model"}


def _verdict(flags) -> str:
    """None: a point not judged, a run of it missing (a failed job); the verdict is on the others."""
    flags = [f for f in flags if f is not None]
    return "n/a" if not flags else "yes" if all(flags) else "partly" if any(flags) else "no"


def _unless_missing(values: pd.Series, flag) -> bool | None:
    return None if values.isna().any() else bool(flag)


def _saturated_by(sat: dict, tokens: int) -> bool | None:
    """Whether a ``derive.saturation`` is reached by ``tokens``; None (unresolved) when it is reached
    at the fewest tokens measured and they are past ``tokens``: it may have been reached before."""
    if sat["tokens"] <= tokens:
        return True
    return None if sat["tokens"] == sat["fewest_measured"] else False


def _row(experiment: str, claim: str, paper_text: str, ours: str, holds: str, value: float | None = None) -> dict:
    """``value``: the row's headline number, whose range over repeats is its spread (None: the
    spread lists each repeat's verdict instead)."""
    return {"experiment": experiment, "claim": claim, "paper": paper_text, "ours": ours, "holds": holds,
            "value": value}


def per_token_cost(results) -> list[dict]:
    ops = results.table("per_token_cost", "ops")
    ratio = derive.decode_over_prefill(ops)
    # One length, the longest, as in the figure (the paper's is 1024): batch sizes of two lengths mixed.
    ratio = ratio[ratio.seq_len == ratio.seq_len.max()].sort_values("batch_size")
    small, large = ratio.iloc[0], ratio.iloc[-1]
    sat = derive.prefill_saturation(ops)
    at_least = " (the fewest measured)" if sat["tokens"] == sat["fewest_measured"] else ""
    total = derive.iteration_ms(results)
    fine = derive.saturation(total.index / total)
    # Batch x length points that start past 512 tokens cannot tell; the finer sweep then decides.
    coarse = _saturated_by(sat, paper.PREFILL_SATURATION_TOKENS)
    return [
        _row("per_token_cost", "At small batch a decode token costs 10x or more a prefill token",
             "200x at batch 1, 16.7x at batch 18 (length 1024)",
             f"{small.ratio:.1f}x at batch {small.batch_size:g}, {large.ratio:.1f}x at batch {large.batch_size:g} "
             f"(length {small.seq_len:g})", _verdict([small.ratio >= 10]), small.ratio),
        _row("per_token_cost", "Prefill throughput saturates by batch x length = 512 tokens",
             f"~{paper.PREFILL_TOKENS_PER_MS:g} tokens/ms from {paper.PREFILL_SATURATION_TOKENS} tokens",
             f"{sat['tokens_per_ms']:.2f} tokens/ms; within 10% of it from {sat['tokens']} tokens{at_least}; "
             f"in tile_quantization's finer steps from {fine['tokens']} tokens",
             _verdict([coarse if coarse is not None else _saturated_by(fine, paper.PREFILL_SATURATION_TOKENS)]),
             sat["tokens"]),
    ]


def tile_quantization(results) -> list[dict]:
    summary = results.summary("tile_quantization")
    tile, jump = summary.tile.iloc[0], summary.tile_jump.mean()  # the mean over repeats, if any
    step_at, step = derive.largest_step(derive.iteration_ms(results))
    claim = f"One token past a multiple of the {tile:g}-token tile costs 10%+ more"
    return [_row("tile_quantization", claim,
                 f"256 -> 257 tokens: +{paper.TILE_JUMP:.0%} (tile {paper.TILE})",
                 f"{jump:+.1%} on average from m to m + 1 at multiples of {tile:g}; "
                 f"largest step anywhere: {step:+.1%} at {step_at} tokens", _verdict([jump >= 0.10]), jump)]


def _speedup_range(gains: pd.DataFrame) -> tuple[str, str]:
    """The range of the resolved speedups, and what is left unresolved ('' if nothing)."""
    resolved = derive.resolved_speedups(gains)
    unresolved = len(gains) - len(resolved)
    return ((f"{resolved.gain.min():.1f}x-{resolved.gain.max():.1f}x" if len(resolved) else "no point resolved"),
            f"{unresolved} of {len(gains)} points unresolved (hybrid iteration no slower than the chunk alone)"
            if unresolved else "")


def decode_speedup(results) -> list[dict]:
    gains = quantities.decode_speedup(results.table("decode_speedup", "piggyback"))
    low, high = paper.DECODE_SPEEDUP
    over = (f" over batch sizes {', '.join(f'{b:g}' for b in sorted(gains.batch_size.unique()))} and lengths "
            f"{', '.join(f'{s:g}' for s in sorted(gains.seq_len.unique()))}")
    aligned = gains.chunk_align.eq("tile") if "chunk_align" in gains else pd.Series(False, index=gains.index)
    # The paper sized its chunks to the tile: where the runs have aligned chunks, they are the verdict's.
    judged = gains[aligned] if aligned.any() else gains
    resolved = derive.resolved_speedups(judged)
    both = aligned.any() and (~aligned).any()
    parts = ([("tile-aligned chunks (chunk + B - 1 a multiple of 128): ", gains[aligned]),
              ("fixed chunk: ", gains[~aligned])] if both else [("", gains)])
    ranges = [(label, *_speedup_range(g)) for label, g in parts]
    unresolved = "; ".join(label + note for label, _, note in ranges if note)
    ours = ("; ".join(label + text for label, text, _ in ranges) + over
            + (f"; {unresolved}" if unresolved else ""))
    return [_row("decode_speedup", f"Piggybacking raises decode throughput {low:g}x-{high:g}x over the baseline",
                 f"{low:g}x-{high:g}x (13B/A6000, chunk 256); up to {paper.DECODE_SPEEDUP_33B_A100}x (33B/A100)",
                 ours, _verdict(resolved.gain >= low), resolved.gain.min() if len(resolved) else None)]


def pd_ratio(results) -> list[dict]:
    gains = derive.pd_ratio_gains(results.summary("pd_ratio"))
    # One gain per point, the mean of its repeats: the peak of single runs would favour the luckiest.
    normalised = gains.groupby([*derive.WORKLOAD_KEYS, "chunk"], as_index=False).gain.mean()
    peaks = derive.pd_peaks(normalised)
    # A peak below 1 is the least loss, not a gain: it says nothing about where gains peak.
    near = [p.gain > 1 and p.predicted_pd_ratio / 2 <= p.pd_ratio <= 2 * p.predicted_pd_ratio
            for p in peaks.itertuples()]
    best = normalised.gain.max()
    wide = (normalised.gain >= paper.PD_WIDE_GAIN).sum()
    return [
        _row("pd_ratio", "The gain peaks at P:D = C / (B - 1) (within a factor 2)",
             "; ".join(f"C={c} B={b}: P:D {pd:g}" for c, b, pd, _ in paper.PD_PEAKS),
             "; ".join(f"C={p.chunk:g} B={p.batch_size:g}: best {p.gain:.2f}x at {p.pd_ratio:g}, "
                       f"predicted peak {p.predicted_pd_ratio:.3g}" for p in peaks.itertuples()), _verdict(near)),
        _row("pd_ratio", f"SARATHI gains {paper.PD_WIDE_GAIN - 1:.0%}+ over the baseline at its best P:D",
             "; ".join(f"{g:g}x at C={c} B={b} P:D={pd:g}" for c, b, pd, g in paper.PD_PEAKS)
             + f"; ~{paper.PD_WIDE_GAIN - 1:.0%} over a wide range",
             f"peak {best:.2f}x; {wide} of {len(normalised)} points >= {paper.PD_WIDE_GAIN:g}x; "
             f"lowest {normalised.gain.min():.2f}x", _verdict([best >= paper.PD_WIDE_GAIN]), best),
    ]


def chunk_overhead(results) -> list[dict]:
    summary = results.summary("chunk_overhead")
    # The mean of repeated runs of a chunk, if any: one number per chunk.
    longest = summary[summary.seq_len == summary.seq_len.max()].groupby("chunk").mean(numeric_only=True)
    where = f"at length {summary.seq_len.max():g}"
    smallest = longest.index.min()
    rows = [_row("chunk_overhead", "Chunks of 64 cost 2x or more in attention",
                 f"about {paper.CHUNK64_ATTENTION_SLOWDOWN:g}x attention, "
                 f"{paper.CHUNK64_PREFILL_SLOWDOWN:g}x prefill",
                 f"chunk {smallest:g}: {longest.attention_slowdown[smallest]:.2f}x attention, "
                 f"{longest.prefill_slowdown[smallest]:.2f}x prefill, "
                 f"KV read {longest.kv_reread_ratio[smallest]:.1f}x "
                 f"{where}", _verdict([longest.attention_slowdown[smallest] >= 2]) if smallest == 64 else "n/a",
                 longest.attention_slowdown[smallest])]
    bounds = {c: b for c, b in paper.PREFILL_SLOWDOWN_BOUND.items() if c in longest.index}
    rows.append(_row(
        "chunk_overhead", "Chunks of 256 / 512 keep the prefill within 20% / 10% of unchunked",
        " / ".join(f"<= {b:.2f}x" for b in paper.PREFILL_SLOWDOWN_BOUND.values()),
        "; ".join(f"chunk {c}: {longest.prefill_slowdown[c]:.2f}x prefill, {longest.end_to_end_slowdown[c]:.2f}x "
                  f"end to end" for c in bounds) + f" {where}" if bounds else "chunks 256 / 512 not in these runs",
        _verdict(longest.prefill_slowdown[c] <= b for c, b in bounds.items()) if bounds else "n/a"))
    return rows


def orca_compare(results) -> list[dict]:
    gains = derive.orca_compare(results.summary("orca_compare"))
    # Every variant a column: one whose every run failed is NaN (not judged), not a KeyError.
    table = gains.pivot_table(index="seq_len", columns="variant", values="gain").reindex(
        columns=["SARATHI", "Orca best", "Orca worst"])
    overlap = derive.prefill_overlap(results.table("orca_compare", "iterations"))
    best_runs = gains[gains.variant == "Orca best"].run_dir
    share = overlap[overlap.run_dir.isin(best_runs)].hybrid_share.mean()
    return [_row("orca_compare", "SARATHI beats Orca's best case at every sequence length",
                 "SARATHI 1.27x / 1.25x / 1.23x, Orca best 1.11x / 1.0x / 1.0x at 1K / 2K / 3K",
                 "; ".join(f"length {s:g}: SARATHI {r['SARATHI']:.2f}x, Orca best {r['Orca best']:.2f}x, "
                           f"worst {r['Orca worst']:.2f}x" for s, r in table.iterrows())
                 + f" (Orca best: {share:.0%} of prefill iterations carry decodes)",
                 _verdict(_unless_missing(r[["SARATHI", "Orca best"]], r["SARATHI"] > r["Orca best"])
                          for _, r in table.iterrows()))]


def scheduler_latency(results) -> list[dict]:
    summary = results.summary("scheduler_latency")
    rivals = ["vllm", "orca"]
    # Every scheduler the claim names a column: one whose every run failed is NaN at each load (not
    # judged), neither a KeyError nor a claim judged without it.
    tbt = summary.pivot_table(index="workload.qps", columns="scheduler", values="itl_p99_s").reindex(
        columns=["sarathi_serve", *rivals])
    return [_row("scheduler_latency", "Stall-free batching keeps P99 TBT below vllm's and orca's at every load",
                 f"hybrid batching without a budget raises TBT up to {paper.NAIVE_HYBRID_TBT_INFLATION}x "
                 "(Sarathi-Serve)",
                 "; ".join(f"qps {q:g}: sarathi_serve {r['sarathi_serve'] * 1e3:.0f} ms, "
                           + ", ".join(f"{s} {r[s] * 1e3:.0f} ms" for s in rivals) for q, r in tbt.iterrows()),
                 _verdict(_unless_missing(r[["sarathi_serve", *rivals]], r["sarathi_serve"] < r[rivals].min())
                          for _, r in tbt.iterrows()))]


def _spread(check, results, rows: list[dict], name: str) -> list[dict]:
    """``rows`` with their spread over the experiment's seeds, and ``unclear`` where the seeds'
    verdicts differ (their interval straddles the threshold)."""
    seeds = results.seeds(name)
    if len(seeds) < 2:
        return [row | {"spread": NO_REPEATS} for row in rows]
    repeats = [check(results.repeat(seed)) for seed in seeds]
    out = []
    for row, *each in zip(rows, *repeats):
        values = [r["value"] for r in each if r["value"] is not None]
        if len(values) == len(each):
            spread = f"{min(values):.3g} to {max(values):.3g} over {len(seeds)} seeds (min-max)"
        else:
            spread = f"per seed: {', '.join(r['holds'] for r in each)}"
        judged = {r["holds"] for r in each} - {"n/a"}
        out.append(row | {"spread": spread, "holds": "unclear" if len(judged) > 1 else row["holds"]})
    return out


def rows_of(check, results, name: str) -> list[dict]:
    """The check's rows on the runs of experiment ``name`` in ``results``, with their spread, what
    they left out (an incomplete sweep's missing jobs, a newer incomplete sweep passed over,
    unreliable runs) and where they come from. An experiment whose every run is flagged unreliable
    has no verdict: its rows say so."""
    provenance = results.provenance(name)
    unreliable = results.unreliable_note(name)
    left_out = "; ".join(note for note in (results.sweep_note(name), unreliable) if note) or "none"
    if results.summary(name).empty:
        rows = [row | {"ours": f"no reliable run ({unreliable}; include_unreliable keeps them)", "holds": "n/a",
                       "spread": ""} for row in check(results.with_unreliable())]
    else:
        rows = _spread(check, results, check(results), name)
    return [{k: v for k, v in row.items() if k != "value"} | provenance | {"left out": left_out} for row in rows]


def mark_cost_model_differences(rows: list[dict], cost_models: list[str | None], why: dict[str, str]) -> list[dict]:
    """``rows`` with ``DIFFERS`` set on the simulated rows of each claim whose judged verdicts differ
    between cost models (``cost_models``: each row's, None for a measured one): every model's
    verdict, and ``why[claim]`` where it says why."""
    verdicts: dict[tuple[str, str], dict[str, str]] = {}
    for row, model in zip(rows, cost_models):
        if model is not None:
            verdicts.setdefault((row["experiment"], row["claim"]), {})[model] = row["holds"]
    out = []
    for row, model in zip(rows, cost_models):
        each = verdicts.get((row["experiment"], row["claim"]), {}) if model is not None else {}
        if len(set(each.values()) - {"n/a"}) > 1:
            note = "; ".join(f"{m}: {v}" for m, v in each.items())
            row = row | {DIFFERS: note + (f" ({why[row['claim']]})" if row["claim"] in why else "")}
        out.append(row)
    return out


def claims_table(results, simulated=None, checks=None) -> pd.DataFrame:
    """The rows of each check on our runs (``results``) and then, with ``simulated`` (the ``Results``
    of ``python -m sarathi_lab.produce --sim``, or a list of them: one per cost model), on the
    simulated runs, each row naming its source; an experiment with no simulated run has no simulated
    row. Where the cost models' verdicts on a claim differ, its simulated rows say so
    (``mark_cost_model_differences``, with the registered result's reason). ``checks``: checks named
    as their experiment; by default every registered paper result's."""
    from sarathi_lab.analysis import registry  # its results take their default checks from this module

    checks = ([(c.__name__, c) for c in checks] if checks is not None
              else [(r.name, r.claims) for r in registry.RESULTS])
    sims = [] if simulated is None else list(simulated) if isinstance(simulated, (list, tuple)) else [simulated]
    rows, models = [], []
    for name, check in checks:
        for runs, model in [(results, None), *((s, s.executor(name).get("sim_cost_model"))
                                                for s in sims if name not in s.missing())]:
            made = rows_of(check, runs, name)
            rows, models = rows + made, models + [model] * len(made)
    why = {claim: text for r in registry.RESULTS for claim, text in r.cost_models_differ.items()}
    return pd.DataFrame(mark_cost_model_differences(rows, models, why), columns=COLUMNS)
