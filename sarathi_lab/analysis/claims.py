"""The claims table: a row per claim and source, judged against the paper by analysis/verdict.py."""
from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from sarathi_lab.analysis.verdict import Judged, combine, versus_text
from sarathi_lab.executors import recorded_as

PROVENANCE = ["source", "scale", "dtype", "threads", "machine", "commit"]
DIFFERS = "differs by cost model"
# Ours' effect over the paper's at each point the verdict judged (verdict.judge).
VERSUS = "ours / paper"
COLUMNS = ["experiment", "claim", "paper", "source", "ours", VERSUS, "spread", "holds", "left out",
           *PROVENANCE[1:], DIFFERS]
NO_REPEATS = "one run per point: no spread"


def simulated_provenance(source: str, scale: str, dtype: str = "") -> dict[str, str]:
    """PROVENANCE of predicted numbers: no threads ran, no machine was measured."""
    return {"source": source, "scale": scale, "dtype": dtype, "threads": "n/a (simulated)",
            "machine": "none: predicted by the cost model"}


def no_run(root) -> str:
    """What stands for an experiment with no finished run, in claims and on the terminal."""
    return f"no finished run under {root}"


def missing_row(name: str, root) -> dict:
    """The row of an experiment with no finished run: named, not judged."""
    return {"experiment": name, "claim": "(every claim of it)", "paper": "", "ours": no_run(root),
            VERSUS: "", "holds": "n/a",
            "spread": "", "left out": f"every run: {no_run(root)}"} | dict.fromkeys(PROVENANCE, "")


def unless_missing(values: pd.Series, flag) -> bool | None:
    return None if values.isna().any() else bool(flag)


def simulated(results, name: str) -> bool:
    """Whether ``name``'s runs were simulated (False for a stand-in that cannot say)."""
    executor = getattr(results, "executor", None)
    return executor is not None and recorded_as(executor(name)["executor"], "simulated")


def why_left_out(results, name: str) -> str:
    """Why a point has no number: runs left out, else a job that left no finished run."""
    return "; ".join(n for n in (results.unreliable_note(name), results.sweep_note(name))
                     if n) or "no finished run"


def shown(value, spec: str, why: str, unit: str = "") -> str:
    """'left out (why)' where ``value`` is missing: a claim never prints nan."""
    if value is None or pd.isna(value):
        return f"left out ({why})"
    return f"{value:{spec}}{unit}"


def with_range(values: pd.Series) -> str:
    """A ratio's mean and, over repeats, their min-max: '1.05x (1.02-1.08x)'."""
    if len(values) < 2:
        return f"{values.mean():.2f}x"
    return f"{values.mean():.2f}x ({values.min():.2f}-{values.max():.2f}x)"


def claim_row(experiment: str, claim: str, paper_text: str, ours: str, holds: str,
              value: float | None = None, versus: str = "") -> dict:
    """``value``: the row's headline number, its range the spread (None: each repeat's verdict);
    ``versus``: the VERSUS cell (verdict.versus_text)."""
    return {"experiment": experiment, "claim": claim, "paper": paper_text, "ours": ours,
            VERSUS: versus, "holds": holds, "value": value}


def judged_row(experiment: str, claim: str, paper_text: str, ours: str,
               points: Iterable[tuple[str, Judged]], value: float | None = None,
               note: str = "", why: str = "") -> dict:
    """A claim judged at each labelled point: its verdict the points' (verdict.combine);
    ``note``: said after the points in the VERSUS cell, ``why`` too where the verdict is not yes."""
    points = list(points)
    holds = combine(j.word for _, j in points)
    versus = "; ".join(filter(None, [versus_text(points), note, why if holds != "yes" else ""]))
    return claim_row(experiment, claim, paper_text, ours, holds, value, versus)


def _spread(check, results, rows: list[dict], name: str) -> list[dict]:
    """``rows`` with their spread over the seeds, ``unclear`` where the seeds' verdicts differ."""
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
        out.append(row | {"spread": spread, "holds": "unclear" if len(judged) > 1
                          else row["holds"]})
    return out


def rows_of(check, results, name: str) -> list[dict]:
    """The check's rows on ``name``'s runs with spread, what was left out and provenance."""
    everything = results.with_unreliable() if hasattr(results, "with_unreliable") else results
    if everything.summary(name).empty:
        note = ((results.lacking_note(name) if hasattr(results, "lacking_note") else "")
                or "its runs are unreadable")
        return [missing_row(name, results.root) | {"ours": f"not judged: {note}", "left out": note}]
    provenance = results.provenance(name)
    unreliable = results.unreliable_note(name)
    lacking = results.lacking_note(name) if hasattr(results, "lacking_note") else ""
    left_out = "; ".join(note for note in (results.sweep_note(name), unreliable, lacking)
                         if note) or "none"
    try:
        if results.summary(name).empty:
            rows = [row | {"ours": f"no reliable run ({unreliable}; include_unreliable keeps them)",
                           VERSUS: "", "holds": "n/a",
                           "spread": ""} for row in check(results.with_unreliable())]
        else:
            rows = _spread(check, results, check(results), name)
    except (KeyError, AttributeError) as e:
        if isinstance(e, AttributeError) and "DataFrame" not in str(e) and "Series" not in str(e):
            raise
        column = (e.args[0] if isinstance(e, KeyError) and e.args
                  else str(e).rsplit(" ", 1)[-1].strip("'"))
        rows = [claim_row(name, "(every claim of it)", "",
                          f"not judged: its runs lack {column} (renamed, or "
                          "recorded by another version)", "n/a") | {"spread": ""}]
        left_out = f"every run: none has {column}" + (f"; {left_out}" if left_out != "none" else "")
    return [{k: v for k, v in row.items() if k != "value"} | provenance | {"left out": left_out}
            for row in rows]


def mark_cost_model_differences(rows: list[dict], cost_models: list[str | None],
                                why: dict[str, str]) -> list[dict]:
    """Sets ``DIFFERS`` on a claim's simulated rows where cost models' verdicts differ."""
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


def claims_table(results, simulated=None, only=None) -> pd.DataFrame:
    """Each result's rows on ``results``, then ``simulated`` (one Results per cost model);
    ``results`` None: the simulated rows alone."""
    from sarathi_lab.analysis import registry  # its result modules import this one's helpers

    chosen = [r for r in registry.RESULTS if only is None or r.name in only]
    sims = ([] if simulated is None else list(simulated) if isinstance(simulated, (list, tuple))
            else [simulated])
    rows, models = [], []
    missing = set(registry.names()) if results is None else set(results.missing())
    for result in chosen:
        name = result.name
        if name in missing and results is not None:
            rows, models = [*rows, missing_row(name, results.root)], [*models, None]
        for runs, model in [*([] if name in missing else [(results, None)]),
                            *((s, s.executor(name).get("sim_cost_model"))
                              for s in sims if name not in s.missing())]:
            made = rows_of(result.claims, runs, name)
            rows, models = rows + made, models + [model] * len(made)
    why = {claim: text for r in chosen for claim, text in r.cost_models_differ.items()}
    return pd.DataFrame(mark_cost_model_differences(rows, models, why), columns=COLUMNS)
