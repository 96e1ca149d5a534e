"""How far the simulated headlines of pd_ratio (Fig. 9/11b) and orca_compare (Fig. 11a) move with
SARATHI's chunk alignment: the fixed chunk beside the tile-aligned one (chunk + B - 1 decodes in
whole 128-token tiles, as the paper), at the paper's setups on a simulated A6000
(docs/sim/README.md, section 6). Runs experiment=sim/pd_ratio and sim/orca_compare, which sweep
both, unless --runs names a results root that holds them (python -m sarathi_lab.produce pd_ratio
orca_compare --sim)."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis import derive
from sarathi_lab.analysis.paper_results import orca_compare, pd_ratio
from sarathi_lab.analysis.runs import Results
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.sim_check import sensitivity
from sarathi_lab.measure.sim_check.sensitivity import Sweep, Table

EXPERIMENTS = ("pd_ratio", "orca_compare")
ALIGNMENTS = {"none": "fixed", "tile": "tile_aligned"}


def sweeps() -> list[Sweep]:
    """Both experiments' sim variants as they are: each sweeps both alignments."""
    return [Sweep(name, "full-chunk_align") for name in EXPERIMENTS]


def pd_ratio_rows(results: Results) -> list[dict]:
    """Per chunk: the peak gain over P:D and where it lies, with each alignment."""
    gains = pd_ratio.pd_gains(results.summary("pd_ratio"))
    keys = [*derive.WORKLOAD_KEYS, "chunk", "chunk_align"]
    means = gains.groupby(keys, as_index=False).gain.mean()
    paper_peaks = {(c, b): (pd_, g) for c, b, pd_, g in pd_ratio.PD_PEAKS}
    rows = []
    for (chunk, size, length), point in means.groupby(["chunk", "batch_size", "seq_len"]):
        peaks = point.loc[point.groupby("chunk_align").gain.idxmax()].set_index("chunk_align")
        pd_, g = paper_peaks.get((chunk, size), (None, None))
        where = {"experiment": "pd_ratio", "seq_len": length, "batch_size": size, "chunk": chunk}
        rows += [where | {"headline": "peak gain over the baseline (x)", "paper": g}
                 | _by_alignment(peaks.gain),
                 where | {"headline": "P:D of the peak", "paper": pd_}
                 | _by_alignment(peaks.pd_ratio)]
    return rows


def orca_compare_rows(results: Results) -> list[dict]:
    """Per paper setup (what-ifs left out): SARATHI over the baseline and over Orca's best case."""
    gains = orca_compare.orca_gains(results.summary("orca_compare"))
    gains = gains[~derive.beyond_paper_device(gains)]
    means = gains.groupby(["seq_len", "batch_size", "chunk", "variant"]).gain.mean()
    rows = []
    for (length, size, chunk), by in means.groupby(level=[0, 1, 2]):
        by = by.droplevel([0, 1, 2])
        sarathi = pd.Series({"none": by.get("SARATHI"), "tile": by.get(orca_compare.ALIGNED)})
        where = {"experiment": "orca_compare", "seq_len": length, "batch_size": size,
                 "chunk": chunk}
        rows += [where | {"headline": "SARATHI over the baseline (x)",
                          "paper": orca_compare.ORCA_FIG11A["SARATHI"].get(length)}
                 | _by_alignment(sarathi),
                 where | {"headline": "SARATHI over Orca's best case (x)",
                          "paper": _ratio(orca_compare.ORCA_FIG11A["SARATHI"].get(length),
                                          orca_compare.ORCA_FIG11A["Orca best"].get(length))}
                 | _by_alignment(sarathi / by.get("Orca best"))]
    return rows


def _ratio(a, b):
    return None if a is None or b is None else a / b


def _by_alignment(values: pd.Series) -> dict:
    """The fixed and tile-aligned values and how far the headline moves from one to the other."""
    out = {column: values.get(align) for align, column in ALIGNMENTS.items()}
    both = all(v is not None and pd.notna(v) for v in out.values())
    return out | {"moves": out["tile_aligned"] - out["fixed"] if both else None}


def table(results: Results) -> pd.DataFrame:
    columns = ["experiment", "headline", "seq_len", "batch_size", "chunk", "paper", "fixed",
               "tile_aligned", "moves"]
    return pd.DataFrame(pd_ratio_rows(results) + orca_compare_rows(results), columns=columns)


TABLE = Table(
    writer="python -m sarathi_lab.measure sim_chunk_align", description=__doc__.split("\n\n")[0],
    out=REPO_ROOT / "docs" / "sim" / "chunk_align_sensitivity.csv", sweeps=sweeps, rows=table,
    heading="How far each headline moves with the chunk alignment "
            "(moves: tile-aligned minus fixed)")


def main(argv: list[str] | None = None) -> pd.DataFrame:
    return sensitivity.main(TABLE, argv)
