"""How far Fig. 13c's simulated headlines (experiment=sim/chunk_batch) move with the P:D ratio,
which the paper's text leaves open for that figure: the verdict runs one workload per length,
P:D = 256 / (B - 1) for every chunk (the setups of Fig. 11a), so a chunk of 64 carries four times
the decodes its iterations have room for. Beside it, each chunk at its own C / (B - 1) and at the
best of the P:D's swept (every claim chunk's own at each length), at the paper's setups on a
simulated A6000 (docs/sim/README.md, section 6). Runs experiment=sim/chunk_batch at those P:D's,
unless --runs names a results root that holds them."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis.paper_results import chunk_batch
from sarathi_lab.analysis.runs import Results
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.harness.cli_check import compose_config
from sarathi_lab.measure.sim_check import sensitivity
from sarathi_lab.measure.sim_check.sensitivity import Sweep, Table

EXPERIMENT = "chunk_batch"
# The paper's setups at 1K / 2K / 3K (setup/a6000_13b_*.yaml: the largest batch that fits, the
# verdict's P:D).
SETUPS = ("a6000_13b_1k", "a6000_13b_2k", "a6000_13b_3k")
(SMALL, _), (MID, _) = chunk_batch.CHUNK_BATCH_GAIN.items()
BETTER, WORSE = chunk_batch.CHUNK_BATCH_ABOVE
CHUNKS = (SMALL, MID, BETTER, WORSE)  # the chunks the claims read


def own_pd(chunk: float, batch_size: int) -> int:
    """The P:D at which a chunk's iterations carry every other request's decode: C / (B - 1)."""
    return round(chunk / (batch_size - 1))


def _setups() -> list:
    return [compose_config([f"experiment=sim/{EXPERIMENT}", f"setup={s}"]) for s in SETUPS]


def sweeps() -> list[Sweep]:
    """One sweep (a results root reads an experiment's newest): every setup with the claims'
    chunks at every claim chunk's own P:D at any setup, and the verdicts'."""
    cfgs = _setups()
    ratios = sorted({*(c.pd_ratio for c in cfgs),
                     *(own_pd(chunk, c.batch_size) for c in cfgs for chunk in CHUNKS)})
    return [Sweep(EXPERIMENT, "full-pd", grid=(f"setup={','.join(SETUPS)}",
                                              f"chunk={','.join(map(str, CHUNKS))}",
                                              f"pd_ratio={','.join(map(str, ratios))}"))]


def verdict_pd() -> dict[int, float]:
    """The verdict's P:D at each length, as its setup states it."""
    return {c.seq_len: c.pd_ratio for c in _setups()}


def gains_by_pd(results: Results) -> pd.DataFrame:
    """Per length, P:D and chunk: the mean gain over the baseline of the run each claim reads (a
    chunk tile-aligned where it can be, except the claim's fixed 320), a row per P:D."""
    runs = chunk_batch.run_gains(results)
    keys = ["seq_len", "batch_size", "pd_ratio", "chunk", "chunk_align"]
    means = runs.groupby(keys, as_index=False).gain.mean()
    first = means.sort_values("chunk_align", key=lambda a: a.ne("tile"), kind="stable")
    as_judged = first.drop_duplicates(["seq_len", "batch_size", "pd_ratio", "chunk"])
    fixed = means[means.chunk_align != "tile"]
    read = pd.concat([as_judged[as_judged.chunk != WORSE], fixed[fixed.chunk == WORSE]])
    return read.pivot_table(index=["seq_len", "batch_size", "pd_ratio"], columns="chunk",
                            values="gain")


def table(results: Results, verdicts: dict[int, float] | None = None) -> pd.DataFrame:
    """Each claim's headline at the verdict's P:D, at its chunk's own and at its best over the
    P:D's swept; ``moves`` is the own P:D's value less the verdict's."""
    verdicts = verdict_pd() if verdicts is None else verdicts
    by_pd = gains_by_pd(results)
    headlines = [(f"chunk {SMALL} over the baseline (x)", chunk_batch.CHUNK_BATCH_GAIN[SMALL],
                  SMALL, lambda t: t[SMALL]),
                 (f"chunk {MID} over the baseline (x)", chunk_batch.CHUNK_BATCH_GAIN[MID], MID,
                  lambda t: t[MID]),
                 # The paper gives the order only; at 320's own P:D its decodes fill its chunk.
                 (f"chunk {BETTER} over chunk {WORSE} (x)", None, WORSE,
                  lambda t: t[BETTER] / t[WORSE])]
    rows = []
    for (length, size), at in by_pd.groupby(level=[0, 1]):
        at = at.droplevel([0, 1])
        verdict, ratios = verdicts.get(length), set(at.index)
        for headline, paper, chunk, value in headlines:
            if chunk not in at or verdict not in ratios:
                continue
            values = value(at).dropna()
            own = own_pd(chunk, size)
            best = values.idxmax() if len(values) else None
            at_own, at_verdict = values.get(own), values.get(verdict)
            rows.append({"headline": headline, "seq_len": length, "batch_size": size,
                         "paper": paper, "verdict_pd": verdict,
                         "at_verdict_pd": at_verdict, "own_pd": own, "at_own_pd": at_own,
                         "best_pd": best, "at_best_pd": values.get(best),
                         "moves": None if at_own is None or at_verdict is None
                         else at_own - at_verdict})
    return pd.DataFrame(rows, columns=["headline", "seq_len", "batch_size", "paper", "verdict_pd",
                                       "at_verdict_pd", "own_pd", "at_own_pd", "best_pd",
                                       "at_best_pd", "moves"])


TABLE = Table(
    writer="python -m sarathi_lab.measure sim_chunk_pd", description=__doc__.split("\n\n")[0],
    out=REPO_ROOT / "docs" / "sim" / "chunk_batch_pd_sensitivity.csv", sweeps=sweeps,
    rows=table, heading="How far Fig. 13c's headlines move with the P:D ratio "
                        "(moves: at the chunk's own P:D minus at the verdict's)")


def main(argv: list[str] | None = None) -> pd.DataFrame:
    return sensitivity.main(TABLE, argv)
