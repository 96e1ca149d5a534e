"""RESULTS.md's numbers, written by code: every block between a ``<!-- generated: KIND ARG -->``
marker and ``<!-- /generated -->`` is rewritten from the committed tables, so that the page's prose
explains and its numbers are what the tables hold now.

Kinds: ``claims NAME`` (an experiment's rows of docs/figures/claims.csv, one per source, with
where each came from) and ``capacity FILE`` (a committed docs/capacity table as capacities per
scheduler and SLO, what bound each, and the commit its searches ran at).
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from sarathi_lab.analysis import capacity, claims_glance

BLOCK = re.compile(r"(<!-- generated: (\w+) ([\w./-]+) -->\n)(.*?)(<!-- /generated -->)", re.DOTALL)
# What bound a search, in the page's words (capacity.py's binding column).
BOUND = {"tbt_p99_s": "P99 TBT", "sched_delay_p50_s": "scheduling delay",
         "saturated": "its queue grew", "ttft_p50_s": "TTFT"}


def _cell(value) -> str:
    return claims_glance.cell(value)


def claims_block(claims: pd.DataFrame, name: str) -> str:
    rows = claims[claims.experiment == name]
    if rows.empty:
        return f"(no row of {name} in docs/figures/claims.csv)\n"
    lines = ["| claim | source | ours | spread | holds | scale, machine, commit |",
             "|---|---|---|---|---|---|"]
    for _, r in rows.iterrows():
        where = ", ".join(_cell(r[k]) for k in ("scale", "machine", "commit") if _cell(r[k]))
        lines.append(f"| {_cell(r.claim)} | {_cell(r.source)} | {_cell(r.ours)} | "
                     f"{_cell(r.spread)} | **{_cell(r.holds)}** | {where} |")
    return "\n".join(lines) + "\n"


def capacity_block(path: Path) -> str:
    searches = pd.read_csv(path)
    table = capacity.capacity_table(searches)
    slos = list(table.columns)
    header = ["scheduler"] + [f"P99 TBT <= {s:g} s (req/s; bound by)" for s in slos]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for scheduler, values in table.iterrows():
        cells = [scheduler]
        for slo in slos:
            if scheduler == "sarathi_serve / vllm":
                cells.append(f"**{values[slo]:.2f}x**")
                continue
            found = searches[(searches.scheduler == scheduler) & (searches.tbt_slo_s == slo)]
            bound = BOUND.get(str(found.binding.iloc[0]), str(found.binding.iloc[0])) if len(
                found) else ""
            budget = found.token_budget.dropna() if "token_budget" in found else pd.Series()
            said = f"; budget {budget.iloc[0]:g}" if len(budget) else ""
            cells.append(f"{values[slo]:.3g}; {bound}{said}")
        lines.append("| " + " | ".join(cells) + " |")
    first = searches.iloc[0]
    if "sim_device" in searches:
        where = (f"simulated {first.sim_tp:g} x {str(first.sim_device).upper()} "
                 f"({first.sim_cost_model}), {first.model}")
    else:
        where = f"measured on {first.device_name}, {first.model}, {first['dtype']}"
    commit = (", ".join(sorted({str(c)[:7] for c in searches.git_commit.dropna()}))
              if "git_commit" in searches else "not recorded")
    resolution = f"{searches.resolution.max():.0%}" if "resolution" in searches else "?"
    lines += ["", (f"{where}; scale {first.scale}; search resolution {resolution}; "
                  f"commit {commit or 'not recorded'} ({path.parent.name}/{path.name}).")]
    return "\n".join(lines) + "\n"


def render(kind: str, arg: str, docs: Path, claims: pd.DataFrame) -> str:
    if kind == "claims":
        return claims_block(claims, arg)
    if kind == "capacity":
        return capacity_block(docs / "capacity" / arg)
    raise ValueError(f"a generated block of kind {kind!r} is invalid; allowed: claims, capacity")


def rewritten(text: str, docs: Path) -> str:
    """``text`` with every generated block as the committed tables give it."""
    claims = pd.read_csv(docs / "figures" / "claims.csv", keep_default_na=False)
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3), docs, claims)
                     + m.group(5), text)


def write(results_md: Path, docs: Path) -> Path:
    """The glance (claims_glance) and every generated block of ``results_md`` rewritten."""
    claims_glance.write(results_md, Path(docs) / "figures" / "claims.csv")
    results_md.write_text(rewritten(results_md.read_text(), Path(docs)))
    return results_md
