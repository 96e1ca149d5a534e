"""Every check of the simulator as one table: a point is one quantity a cost model predicted and a
measurement timed, in seconds, with the columns that say which one it is (COLUMNS plus its own
keys). Its error is the signed relative error, predicted / measured - 1, and ``summary`` is the one
way a set of them is summed up; each check is an adapter that turns its source into points."""
from __future__ import annotations

import numpy as np
import pandas as pd

SOURCE, KIND, COST_MODEL, PREDICTED, MEASURED = ("source", "kind", "cost_model", "predicted_s",
                                                 "measured_s")
COLUMNS = (SOURCE, KIND, COST_MODEL, PREDICTED, MEASURED)
# summary's keys; ``points`` counts the errors it summed up.
STATS = ("points", "median_rel_err", "median_abs_rel_err", "worst_abs_rel_err", "worst_rel_err",
         "median_ratio")


def ratio(predicted, measured):
    """predicted / measured; NaN where nothing was measured (zero or less)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        found = np.where(m > 0, p / m, np.nan)
    return float(found) if found.ndim == 0 else found


def rel_err(predicted, measured):
    """The signed relative error: above 0, the prediction is slower than the measurement."""
    return ratio(predicted, measured) - 1


def summary(errors) -> dict[str, float]:
    """Signed relative errors summed up (a NaN, nothing measured, left out); ``worst_rel_err``
    keeps the sign of the one furthest from 0, ``median_ratio`` is 1 + the median."""
    err = pd.Series(np.asarray(errors, dtype=float)).dropna()
    size = err.abs()
    median = float(err.median())
    return {"points": len(err), "median_rel_err": median,
            "median_abs_rel_err": float(size.median()), "worst_abs_rel_err": float(size.max()),
            "worst_rel_err": float(err[size.idxmax()]) if len(err) else np.nan,
            "median_ratio": 1 + median}


def from_wide(rows: pd.DataFrame, source: str, models, keys=(),
              kind: str | None = None) -> pd.DataFrame:
    """Rows holding a ``<model>_s`` column per cost model beside ``measured_s``, as points: one per
    row and cost model, with the rows' ``keys``; their kind is ``kind``, else the rows' own."""
    keys = [k for k in keys if k != KIND]
    found = [rows[keys].assign(**{SOURCE: source, KIND: rows[KIND] if kind is None else kind,
                                  COST_MODEL: model, PREDICTED: rows[f"{model}_s"],
                                  MEASURED: rows[MEASURED]})
             for model in models]
    return pd.concat(found, ignore_index=True)[[*COLUMNS, *keys]]


def summarize(points: pd.DataFrame, by, sort: bool = True) -> pd.DataFrame:
    """One row per group of ``by``: the group's keys and its summary. Sorted by ``by``, cost models
    aside: they keep the order they first appear in (their columns' order in ``per_model``)."""
    order = {m: i for i, m in enumerate(dict.fromkeys(points[COST_MODEL]))}
    keyed = points.assign(_model=points[COST_MODEL].map(order))
    rows = []
    for key, group in keyed.groupby(["_model" if k == COST_MODEL else k for k in by], sort=sort):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        if COST_MODEL in row:
            row[COST_MODEL] = group[COST_MODEL].iloc[0]
        rows.append(row | summary(rel_err(group[PREDICTED], group[MEASURED])))
    return pd.DataFrame(rows, columns=[*by, *STATS])


def per_model(points: pd.DataFrame, by, blocks: tuple[dict[str, str], ...],
              count: str | None = None, sort: bool = True) -> pd.DataFrame:
    """``points`` summed up per group of ``by`` and cost model, one row per group of ``by``: its
    first cost model's point count as ``count``, then each block (column suffix -> STATS key) for
    each of its cost models, as ``<model>_<suffix>``."""
    groups: dict[tuple, list[dict]] = {}
    for row in summarize(points, [*by, COST_MODEL], sort).to_dict("records"):
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    rows = []
    for key, models in groups.items():
        row = dict(zip(by, key)) | ({count: models[0]["points"]} if count else {})
        for block in blocks:
            row |= {f"{m[COST_MODEL]}_{suffix}": m[stat] for m in models
                    for suffix, stat in block.items()}
        rows.append(row)
    return pd.DataFrame(rows)
