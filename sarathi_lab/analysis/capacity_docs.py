"""The committed capacity tables (docs/capacity/*.csv) and what is drawn from them: the figures
capacity.png and capacity_tradeoff.png and the capacity rows of docs/figures/claims.csv. Which
table feeds which claim, with what provenance, is decided here; the claims, verdicts and figures
themselves are the capacity result's (analysis/paper_results/capacity.py).

    python -m sarathi_lab.measure capacity_docs MULTIRUN  # /tmp/cap/cpu: writes cpu_capacity.csv
    python -m sarathi_lab.measure capacity_docs --sim SWEEP  # a simulated table (EXPERIMENT_TABLES)
    python -m sarathi_lab.measure capacity_docs           # redraws from the committed tables only

Its files are written at once, or none of them (output_files.staged); a folder that cannot be
written, or a CPU table of another provenance without --force, is refused before any is drawn.

The simulated capacity_sim tables (one per cost model, SIM_TABLES) are written by
``python -m sarathi_lab.measure publish --sim ROOT`` from a root's capacity sweep; the others, each
its own experiment's (EXPERIMENT_TABLES), by --sim from that experiment's sweep.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sarathi_lab import cli_args, code_commit, output_files, provenance
from sarathi_lab.analysis import capacity
from sarathi_lab.analysis import claims as claim_checks
from sarathi_lab.analysis.figures import save
from sarathi_lab.analysis.paper_results import capacity as capacity_result
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.executors import recorded_as
from sarathi_lab.harness.results import current_names, simulated_source
from sarathi_lab.sim import CostModel

DOCS = REPO_ROOT / "docs"
SIM_CSV, TRADEOFF_CSV, CPU_CSV = "sim_capacity.csv", "sim_tradeoff.csv", "cpu_capacity.csv"
TP_CSV, TRACE_CSV = "sim_capacity_yi34b.csv", "sim_capacity_arxiv.csv"
# experiment=capacity_sim's searches by each cost model (produce --sim runs it as sim/capacity).
SIM_TABLES = {"roofline": SIM_CSV, "calibrated": "sim_capacity_uniform_calibrated.csv"}
AZURE_CONV_CSV, AZURE_CODE_CSV = "sim_capacity_azure_conv.csv", "sim_capacity_azure_code.csv"
# The simulated tables their own experiments make (python -m sarathi_lab.run -m experiment=NAME),
# each written by --sim from that sweep.
EXPERIMENT_TABLES = {"capacity_sim_yi34b": TP_CSV, "capacity_sim_arxiv": TRACE_CSV,
                     "capacity_sim_azure_conv": AZURE_CONV_CSV,
                     "capacity_sim_azure_code": AZURE_CODE_CSV}
WRITER = "python -m sarathi_lab.measure capacity_docs"
# The trace's lengths, which the table does not record.
TRACE_LENGTHS = ", arxiv_summarization lengths"
# What refresh writes under the docs folder, checked writable before the figures are drawn.
REFRESHED = ("figures/capacity.png", "figures/capacity_tradeoff.png", "figures/claims.csv")


class TableError(ValueError):
    """A committed capacity table that cannot be read; one line."""


def read_table(path: Path) -> pd.DataFrame:
    """Its columns under today's names (``attrs["path"]``: where it was read)."""
    try:
        # A commit of digits and one 'e' would read as a number.
        table = (pd.read_csv(path, dtype={capacity.COMMIT_COLUMN: str})
                 .rename(columns=current_names))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise TableError(f"{path} is invalid: not a readable CSV "
                         f"({' '.join(str(e).split())[:200]})") from None
    table.attrs["path"] = str(path)
    return table


def check_tables(docs: str | Path = DOCS, replaced: frozenset[str] = frozenset()) -> None:
    """Every committed simulated table reads (predicted_by), but those about to be ``replaced``:
    refused before anything is written."""
    folder = Path(docs) / "capacity"
    for name in (SIM_CSV, TRADEOFF_CSV, TP_CSV, TRACE_CSV):
        if name not in replaced and (folder / name).is_file():
            table = read_table(folder / name)
            predicted_by(table)
            if table.empty or "model" not in table or "scale" not in table:
                raise TableError(f"{folder / name} is invalid: it holds no search, or lacks its "
                                 "model or scale column; redraw it with its experiment "
                                 "(docs/capacity/README.md)")


def load(docs: str | Path = DOCS) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """The simulated capacities and trade-off, and the CPU capacities (None: not measured)."""
    folder = Path(docs) / "capacity"
    cpu = folder / CPU_CSV
    return (read_table(folder / SIM_CSV), read_table(folder / TRADEOFF_CSV),
            read_table(cpu) if cpu.exists() else None)


def cpu_searches(multirun: str | Path) -> pd.DataFrame:
    """The CPU-measured searches of a folder; SystemExit where it holds none."""
    searches = capacity.load_searches(multirun)
    if searches.empty or any(recorded_as(name, "simulated") for name in searches.executor):
        raise SystemExit(f"{multirun}: expected capacity searches of executor=model "
                         f"(capacity.json), found {len(searches)} search(es) with executors "
                         f"{sorted(set(searches.get('executor', [])))}")
    return searches


def cpu_outputs(searches: pd.DataFrame, docs: str | Path, force: bool = False,
                given: str = "") -> output_files.Outputs:
    """docs/capacity/cpu_capacity.csv's planned output, its table added (not yet written)."""
    prov = provenance.Provenance("measured CPU", "+".join(sorted(set(map(str, searches.scale)))),
                                 "+".join(sorted(set(map(str, searches.device_name)))),
                                 commit=commit_of(searches) or provenance.UNRECORDED,
                                 writer=WRITER)
    out = output_files.Outputs(Path(docs) / "capacity", {CPU_CSV: prov},
                               given=given or f"--docs={docs}", force=force,
                               how="--force replaces it; --docs DIR writes into another folder")
    out.add(CPU_CSV, capacity.csv_text(capacity.compact(searches)))
    return out


def experiment_searches(sweep: str | Path) -> tuple[str, pd.DataFrame]:
    """The simulated searches of one of EXPERIMENT_TABLES's sweeps, and the table they make."""
    searches = capacity.load_searches(sweep)
    if searches.empty or not all(recorded_as(name, "simulated") for name in searches.executor):
        raise TableError(f"--sim={sweep} is invalid: expected capacity searches of executor=sim "
                         f"(capacity.json), found {len(searches)} search(es) with executors "
                         f"{sorted(set(searches.get('executor', [])))}")
    names = sorted(set(map(str, searches.get("experiment", []))))
    if len(names) != 1 or names[0] not in EXPERIMENT_TABLES:
        raise TableError(f"--sim={sweep} is invalid: its searches are of experiment "
                         f"{', '.join(names) or 'none recorded'}; allowed: one sweep of "
                         f"{', '.join(EXPERIMENT_TABLES)}")
    return EXPERIMENT_TABLES[names[0]], searches


def sim_outputs(sweeps: list[tuple[str, pd.DataFrame]], docs: str | Path, force: bool = False,
                given: str = "") -> output_files.Outputs:
    """The simulated tables of experiment_searches's sweeps, planned (not yet written)."""
    tables = {name: capacity.compact(searches) for name, searches in sweeps}
    made = {name: provenance.Provenance(source(table), str(table.scale.iloc[0]),
                                        commit=commit_of(table) or provenance.UNRECORDED,
                                        writer=f"{WRITER} --sim")
            for name, table in tables.items()}
    out = output_files.Outputs(Path(docs) / "capacity", made, given=given or f"--docs={docs}",
                               force=force,
                               how="--force replaces it; --docs DIR writes into another folder")
    for name, table in tables.items():
        out.add(name, capacity.csv_text(table))
    return out


def tabulate(multirun: str | Path, docs: str | Path = DOCS, force: bool = False) -> Path:
    """docs/capacity/cpu_capacity.csv from searches; replaced only with ``force`` (no commit)."""
    return cpu_outputs(cpu_searches(multirun), docs, force).write()[0]


def tabulate_simulated(sweep: str | Path, docs: str | Path) -> Path | None:
    """A sweep's simulated searches into SIM_TABLES's file for its cost model (None: none is kept
    for it); the caller checks provenance."""
    searches = capacity.load_searches(sweep)
    if searches.empty or not all(recorded_as(name, "simulated") for name in searches.executor):
        raise TableError(f"{sweep}: expected capacity searches of executor=sim (capacity.json), "
                         f"found {len(searches)} search(es) with executors "
                         f"{sorted(set(searches.get('executor', [])))}")
    table = capacity.compact(searches)
    if (name := SIM_TABLES.get(predicted_by(table)["cost_model"])) is None:
        return None
    return capacity.write_csv(table, Path(docs) / "capacity" / name)


def commit_of(table: pd.DataFrame) -> str:
    """The commit(s) a committed table's searches ran at; '' where it does not say."""
    if capacity.COMMIT_COLUMN not in table:
        return ""
    return provenance.commits(table[capacity.COMMIT_COLUMN])


def predicted_by(sim: pd.DataFrame) -> dict:
    """The device, cost model and GPU count of a simulated table (one of each per table)."""
    where = sim.attrs.get("path", "a simulated capacity table")
    if lacking := [key for key in capacity.SIMULATED_COLUMNS if key not in sim]:
        raise TableError(f"{where} is invalid: it lacks column {lacking[0]} (a table written "
                         "before the simulator recorded it); redraw it with its experiment "
                         "(docs/capacity/README.md)")
    found = {key: sim[key].unique() for key in capacity.SIMULATED_COLUMNS}
    if bad := next((key for key, values in found.items() if len(values) != 1), None):
        raise TableError(f"{where} is invalid: its {bad} column holds {len(found[bad])} values "
                         f"({', '.join(map(str, found[bad]))}); a simulated capacity table is one "
                         "device's, cost model's and GPU count's: one table per device")
    return {"device": str(found["sim_device"][0]), "cost_model": str(found["sim_cost_model"][0]),
            "tp": int(found["sim_tp"][0])}


def simulated_provenance(sim: pd.DataFrame, table: str, suffix: str = "") -> dict[str, str]:
    """claims.PROVENANCE of a simulated table, or of its cost model alone (``table`` empty)."""
    where = f" (committed docs/capacity/{table})" if table else " (computed here)"
    # Computed here: by this code, at its commit.
    commit = commit_of(sim) if table else provenance.commits([code_commit.source_commit()[0]])
    return claim_checks.simulated_provenance(f"{source(sim)}{suffix}{where}",
                                             str(sim.scale.iloc[0])) | {"commit": commit}


def source(sim: pd.DataFrame) -> str:
    """e.g. 'simulated A100 (roofline), mistral-7b': what claims rows and figure titles call it."""
    return f"{simulated_source(**predicted_by(sim))}, {sim.model.iloc[0]}"


def claims(docs: str | Path = DOCS) -> pd.DataFrame:
    """The claims table's capacity rows: the CPU's, the simulated tables', the chunk overhead."""
    sim, tradeoff, cpu = load(docs)
    by = predicted_by(sim)
    cost = CostModel.for_device(by["device"], sim.model.iloc[0], by["cost_model"], tp=by["tp"])
    overhead = capacity_result.predicted_overhead(cost)
    if cpu is None:
        measured = capacity_result.Evidence(provenance={"source": "measured CPU (not yet: "
                                                           "experiment=capacity)"})
    else:  # claims.PROVENANCE of the committed CPU-measured table
        first = cpu.iloc[0]
        measured = capacity_result.Evidence(searches=cpu, provenance={
            "source": f"measured CPU, {first.model} (committed docs/capacity/{CPU_CSV})",
            "scale": str(first.scale), "dtype": str(first["dtype"]),
            "threads": f"{first.torch_threads:g}", "machine": str(first.device_name),
            "commit": commit_of(cpu)})
    # Each simulated claim beside the table it reads, whose commit it carries.
    rows = capacity_result.capacity_claims(
        measured, capacity_result.Evidence(sim, provenance=simulated_provenance(sim, SIM_CSV)),
        capacity_result.Evidence(tradeoff=tradeoff,
                          provenance=simulated_provenance(tradeoff, TRADEOFF_CSV)),
        capacity_result.Evidence(overhead=overhead, provenance=simulated_provenance(sim, ""),
                          overhead_model=by["cost_model"]))
    # Tables of other shapes, each its own claim where it exists.
    for csv, claim, suffix in ((TP_CSV, capacity_result.TP_CLAIM, ""),
                               (TRACE_CSV, capacity_result.TRACE_CLAIM, TRACE_LENGTHS)):
        path = Path(docs) / "capacity" / csv
        if path.exists():
            searches = read_table(path)
            evidence = capacity_result.Evidence(searches,
                                         provenance=simulated_provenance(searches, csv, suffix))
            rows = pd.concat([rows, capacity_result.capacity_claims(evidence, checks=(claim,))],
                             ignore_index=True)
    return rows


def with_capacity_claims(table: pd.DataFrame, docs: str | Path = DOCS) -> pd.DataFrame:
    """The claims table with its capacity rows replaced (appended if absent), in the claims
    table's columns (a table written before a column existed gains it, empty)."""
    joined = pd.concat([table[table.experiment != "capacity"], claims(docs)], ignore_index=True)
    columns = [*claim_checks.COLUMNS, *(c for c in table.columns if c not in claim_checks.COLUMNS)]
    return joined.reindex(columns=columns)


def draw(docs: str | Path = DOCS) -> list[Path]:
    sim, tradeoff, cpu = load(docs)
    fig = capacity_result.capacity_figure(sim, cpu, source(sim))
    tradeoff_fig = capacity_result.tradeoff_figure(tradeoff, source(tradeoff))
    return [save(fig, docs, "capacity"), save(tradeoff_fig, docs, "capacity_tradeoff")]


def refresh(docs: str | Path = DOCS, shown: str | Path | None = None) -> list[Path]:
    """The two figures and, where docs/figures/claims.csv exists, its capacity rows replaced;
    ``shown``: the folder its message names, where ``docs`` is a staged copy of it."""
    # The CPU table is optional; the simulated two are what every figure draws.
    tables = [Path(docs) / "capacity" / name for name in (SIM_CSV, TRADEOFF_CSV)]
    if missing := [t.name for t in tables if not t.is_file()]:
        # A docs folder other than the repository's (publish --docs DIR) holds no capacity tables.
        print(f"capacity: no {', '.join(missing)} under {Path(shown or docs) / 'capacity'}: its "
              "figures and claims rows left out")
        return []
    written, path = draw(docs), Path(docs) / "figures" / "claims.csv"
    if path.exists():
        table = with_capacity_claims(pd.read_csv(path, keep_default_na=False), docs)
        table.to_csv(path, index=False)
        written.append(path)
    return written


def write(multirun: str | Path | None, docs: str | Path = DOCS, force: bool = False,
          sims: tuple[str | Path, ...] = ()) -> list[Path]:
    """The CPU table from ``multirun`` (None: the committed one kept), the simulated tables of
    ``sims`` (EXPERIMENT_TABLES's sweeps) and what refresh redraws, all at once (a failure writes
    none); every refusal (TableError, OutputRefused) before the figures are drawn."""
    docs = Path(docs)
    given = f"--docs={docs}"
    searches = None if multirun is None else cpu_searches(multirun)
    simulated = [experiment_searches(sweep) for sweep in sims]
    if len({name for name, _ in simulated}) < len(simulated):
        raise TableError(f"--sim is invalid: two sweeps of one experiment "
                         f"({', '.join(map(str, sims))}); allowed: one sweep each")
    check_tables(docs, frozenset(name for name, _ in simulated))
    if searches is not None:
        cpu_outputs(searches, docs, force, given).check()
    if simulated:
        sim_outputs(simulated, docs, force, given).check()
    sidecar = [] if searches is None and not simulated else [f"capacity/{provenance.SIDECAR}"]
    output_files.check_writable(docs, [*REFRESHED, *sidecar], given)
    # refresh reads the tables written before it: all into a copy, written over at once.
    with output_files.staged(docs, given) as stage:
        stage = stage.resolve()
        # Whether they may replace the committed tables was checked above, on the folder itself.
        written = [] if searches is None else cpu_outputs(searches, stage, True, given).write()
        written += sim_outputs(simulated, stage, True, given).write() if simulated else []
        written += refresh(stage, docs)
    return [docs / path.relative_to(stage) for path in written]


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure capacity_docs",
                             description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("multirun", nargs="?",
                        help="capacity searches on this CPU (experiment=capacity)")
    parser.add_argument("--docs", default=DOCS, type=Path,
                        help="the docs folder (default: the repository's)")
    parser.add_argument("--sim", action="append", default=[], metavar="SWEEP",
                        help="a sweep of one of " + ", ".join(EXPERIMENT_TABLES)
                             + ": its simulated table (repeatable)")
    cli_args.shared(parser, force="replace a capacity table another command wrote")
    args = parser.parse_args(argv)
    try:
        written = write(args.multirun, args.docs, args.force, tuple(args.sim))
    except (output_files.OutputRefused, TableError) as e:
        parser.error(str(e))
    print("\n".join(map(str, written)))
