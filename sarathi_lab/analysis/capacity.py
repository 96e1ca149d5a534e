"""Sarathi-Serve's capacity searches read back as a table: one row per finished search
(load_searches), the committed tables' columns (compact, csv_text) and the capacities per scheduler
and SLO (capacity_table). What is judged and drawn from them is the capacity result's
(analysis/paper_results/capacity.py); the search is harness/capacity.py's."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.executors import recorded_as
from sarathi_lab.harness.results import (
    CAPACITY_JSON,
    METRICS,
    current_names,
    is_finished,
    read_record,
)

log = logging.getLogger(__name__)

# The pair the capacity gain compares, first in tables; the others follow in registry order.
COMPARED = ("sarathi_serve", "vllm")
TABLE_COLUMNS = ["scheduler", "tbt_slo_s", "sched_delay_slo_s", "capacity_rps", "resolution",
                 "binding", "bounded",
                 "num_trials", "token_budget", "at_capacity_itl_p99_s", "at_capacity_ttft_p50_s",
                 "at_capacity_sched_delay_p50_s", "executor", "model", "scale"]
# What a measured capacity depends on besides the model.
MEASURED_COLUMNS = ["dtype", "device_name", "torch_threads", "timing_unreliable"]
# What a simulated capacity depends on besides the model.
SIMULATED_COLUMNS = ["sim_device", "sim_cost_model", "sim_tp"]
# A replayed trace's recorded rate, and the capacity as a multiple of it.
TRACE_COLUMNS = ["trace_rate_rps", "capacity_rate_scale"]
# The code's commit a search ran (its environment's); tables written before it lack the column.
COMMIT_COLUMN = "git_commit"


def load_searches(root: str | Path) -> pd.DataFrame:
    """One row per finished capacity search under root."""
    rows = []
    for path in sorted(Path(root).rglob(CAPACITY_JSON)):
        if not is_finished(path.parent):
            # capacity.json written but not metrics.json (written last)
            continue
        try:
            rows.append(_search_row(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            what = f"lacks {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
            log.warning("%s (or its metrics.json) is unreadable (%s); left out", path, what)
    return pd.DataFrame(rows)


def _search_row(path: Path) -> dict:
    # A search from before its rates' names carried their unit reads as today's.
    found = current_names(json.loads(path.read_text()))
    record = read_record(path.parent / METRICS)
    summary = current_names(record["summary"])
    return (record["config"] | {"run_dir": str(path.parent), "tbt_slo_s": found["slo"]["tbt_p99_s"],
                                "sched_delay_slo_s": found["slo"]["sched_delay_p50_s"]}
            | {key: found[key] for key in ("capacity_rps", "resolution", "binding", "bounded")}
            | {"num_trials": len(found["trials"])}
            | {key: summary.get(key) for key in ("token_budget", "at_capacity_itl_p99_s",
                                                 "at_capacity_ttft_p50_s",
                                                 "at_capacity_sched_delay_p50_s", *TRACE_COLUMNS)}
            | {key: record["environment"].get(key)
               for key in ("device_name", "torch_threads", "timing_unreliable",
                           *SIMULATED_COLUMNS, COMMIT_COLUMN)})


def compact(searches: pd.DataFrame) -> pd.DataFrame:
    """The committed table of searches (docs/capacity/*_capacity.csv), with what produced them."""
    simulated = searches.executor.map(lambda name: recorded_as(name, "simulated")).astype(bool)
    replayed = "trace_rate_rps" in searches and searches.trace_rate_rps.notna().any()
    committed = COMMIT_COLUMN in searches and searches[COMMIT_COLUMN].notna().any()
    columns = (TABLE_COLUMNS + TRACE_COLUMNS * bool(replayed)
               + MEASURED_COLUMNS * bool((~simulated).any())
               + SIMULATED_COLUMNS * bool(simulated.any()) + [COMMIT_COLUMN] * bool(committed))
    return searches[columns].sort_values(["tbt_slo_s", "scheduler",
                                          "token_budget"]).reset_index(drop=True)


def csv_text(table: pd.DataFrame) -> str:
    """Six significant digits: read by people and diffs, not re-analysed."""
    return table.to_csv(index=False, float_format="%g")


def write_csv(table: pd.DataFrame, path: str | Path) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(csv_text(table))
    return Path(path)


def capacity_table(searches: pd.DataFrame) -> pd.DataFrame:
    """Capacity (req/s) per scheduler and TBT SLO, with sarathi_serve / vllm."""
    # dropna=False: a scheduler that failed its lowest rate everywhere is a result, not a gap.
    table = searches.pivot_table(index="scheduler", columns="tbt_slo_s", values="capacity_rps",
                                 aggfunc="max", dropna=False)
    order = [*COMPARED, *(s for s in scheduler_names() if s not in COMPARED)]
    table = table.reindex([s for s in order if s in table.index])
    if {"sarathi_serve", "vllm"} <= set(table.index):
        table.loc["sarathi_serve / vllm"] = table.loc["sarathi_serve"] / table.loc["vllm"]
    return table
