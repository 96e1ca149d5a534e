"""Redraw the committed figures and claims table (docs/figures/) from result roots, in one command:

    python -m sarathi_lab.produce --sim --publish --force   # every simulated claim, rerun
    python -m sarathi_lab.measure publish --sim outputs/sim --sim outputs/sim-roofline
    python -m sarathi_lab.measure publish --measured outputs   # the CPU's claims and figures
    # RESULTS.md's GPU claims from docs/gpu/*/*/claims.csv:
    python -m sarathi_lab.measure publish --gpu-claims

The claims table's measured rows come from --measured, its simulated rows from the --sim roots (an
experiment's from every root that has it); the rows no root given stands for are kept as the table
has them, each with its own commit and machine. A --sim root's capacity searches become its cost
model's committed table (docs/capacity/), from which the capacity rows and figures are drawn.
A figure whose runs the roots lack is left as it is, and named; a file of another source, scale,
machine or commit (provenance.json) is replaced only with --force.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.analysis import (
    capacity_docs,
    claims,
    figures,
    gpu_claims,
    pipeline_claims,
    registry,
    results_page,
)
from sarathi_lab.analysis.runs import Results, load_results
from sarathi_lab.env_flags import EnvFlagError
from sarathi_lab.executors import recorded_as
from sarathi_lab.provenance import Provenance

WRITER = "python -m sarathi_lab.measure publish"
CAPACITY = "capacity"
# What claims.simulated_provenance writes in every predicted row's machine column.
PREDICTED = claims.simulated_provenance("", "")["machine"]
# Written beside the planned files: redrawn from the tables (capacity_docs, pipeline_claims) and
# the page they are summed up in (results_page).
DERIVED = ("figures/claims.csv", "figures/capacity.png", "figures/capacity_tradeoff.png",
           "RESULTS.md")


def _joined(values) -> str:
    return "+".join(sorted({str(v) for v in values if str(v) not in ("", "nan")}))


def runs_provenance(results: Results, name: str) -> Provenance:
    """The source and scale, machines and commits behind experiment ``name``'s numbers."""
    summary = results.with_unreliable().summary(name)
    simulated = recorded_as(results.executor(name)["executor"], "simulated")
    machine = "" if simulated else _joined(summary.get("env.device_name", []))
    return Provenance(results.source(name), results.scale(name), machine,
                      commit=provenance.commits(summary.get("env.git_commit", [None])),
                      writer=WRITER)


def merged(each: list[Provenance]) -> Provenance:
    """One provenance for a file drawn from several experiments."""
    return Provenance(*(_joined(getattr(p, key) for p in each)
                        for key in ("source", "scale", "machine", "lease", "commit")),
                      writer=WRITER)


def _capacity_tables(sims: list[Results], docs: Path) -> dict[Path, Results]:
    """The committed capacity table each simulated root's capacity sweep writes."""
    tables = {}
    for results in sims:
        if CAPACITY in results.missing():
            continue
        model = results.executor(CAPACITY).get("sim_cost_model")
        if name := capacity_docs.SIM_TABLES.get(model):
            tables[docs / "capacity" / name] = results
        else:
            print(f"{CAPACITY}: no committed table is kept for cost model {model!r} "
                  f"(kept: {', '.join(capacity_docs.SIM_TABLES)}): {results.root}'s searches "
                  "are left out of docs/capacity/")
    return tables


def plan(measured: Results | None, sims: list[Results], docs: Path) -> dict[Path, Provenance]:
    """Each file publish would write from these roots, with its provenance (the claims table's:
    of the rows the roots give; a row kept from the table keeps its own in its columns)."""
    planned = {}
    roots = ([(measured, "")] if measured else []) + ([(sims[0], "_sim")] if sims else [])
    for results, suffix in roots:
        for name in (n for n in registry.names() if n not in results.missing()):
            planned[docs / "figures" / f"{name}{suffix}.png"] = runs_provenance(results, name)
    if each := [runs_provenance(r, n) for r in ([measured] if measured else []) + sims
                for n in registry.names() if n not in r.missing()]:
        planned[docs / "figures" / "claims.csv"] = merged(each)
    for path, results in _capacity_tables(sims, docs).items():
        planned[path] = runs_provenance(results, CAPACITY)
    return planned


def predicted(table: pd.DataFrame) -> pd.Series:
    """Which rows of a claims table are the simulator's."""
    return table["machine"] == PREDICTED


def claims_rows(measured: Results | None, sims: list[Results],
                committed: pd.DataFrame | None) -> pd.DataFrame:
    """The claims table: its measured rows from ``measured``, an experiment's simulated rows from
    the ``sims`` that have it; the rest kept from ``committed`` (None: there are none to keep)."""
    new = claims.claims_table(measured, sims)
    if committed is None or committed.empty:
        return new
    rerun = {n for r in sims for n in registry.names() if n not in r.missing()}
    old = committed.reindex(columns=claims.COLUMNS, fill_value="")
    # Fig. 12's row is no root's: kept here, rewritten from its committed tables after this
    # where they are under the docs folder.
    fig12 = pipeline_claims.owned(old)
    simulated = predicted(old) & ~fig12
    kept_sims = simulated & ~old.experiment.isin(rerun)
    keep = kept_sims | (~simulated & (measured is None)) | fig12
    kept = [n for n in registry.names() if n != CAPACITY and n in set(old.experiment[kept_sims])]
    if sims and kept:
        print(f"simulated rows kept as committed (no --sim root has them): {', '.join(kept)}")
    # Each experiment's measured rows, then its simulated ones, in the registry's order.
    both = pd.concat([old[keep], new], ignore_index=True)
    order = {n: i for i, n in enumerate(registry.names())}
    both["_order"] = both.experiment.map(lambda n: order.get(n, len(order)))
    both["_predicted"] = predicted(both)
    return (both.sort_values(["_order", "_predicted"], kind="stable")
            .drop(columns=["_order", "_predicted"]).reset_index(drop=True))


def draw_all(results, docs: Path, suffix: str = "") -> list[Path]:
    written = []
    for result in registry.RESULTS:
        if result.name in results.missing():
            print(f"{result.name}: {claims.no_run(results.root)}")
            continue
        fig = registry.draw(result, results)
        if fig is None:  # every run left out as unreliable: say so, keep the committed one
            print(f"{result.name}: no figure drawn: {results.unreliable_note(result.name)}")
            continue
        path = figures.save(fig, docs, result.name + suffix)
        plt.close(fig)
        written.append(path)
    return written


def publish(measured: str | Path | None, simulated: list[str | Path],
            docs: str | Path = capacity_docs.DOCS,
            include_unreliable: bool = False, force: bool = False) -> list[Path]:
    """The files written, all at once (a failure writes none); ReplaceRefused first where one
    would replace another provenance's, OutputRefused where one cannot be written."""
    capacity_docs.check_tables(docs)
    docs, sims = Path(docs), [load_results(root) for root in simulated]
    runs = (None if measured is None
            else load_results(measured, include_unreliable=include_unreliable))
    planned = plan(runs, sims, docs)
    provenance.check(planned, force, "--force replaces them; --docs DIR writes into another folder")
    given = f"--docs={docs}"
    output_files.check_writable(docs, [*(p.relative_to(docs) for p in planned), *DERIVED], given)
    # Each step below reads what an earlier one wrote (the claims table, the capacity tables).
    with output_files.staged(docs, given) as stage:
        written = _write(runs, sims, stage, {stage / p.relative_to(docs): prov
                                             for p, prov in planned.items()}, docs)
    return [docs / p.relative_to(stage) for p in written if p is not None]


def _write(runs: Results | None, sims: list[Results], docs: Path,
           planned: dict[Path, Provenance], shown: Path) -> list[Path]:
    """Into ``docs`` (a staged copy of ``shown``, the folder its messages name)."""
    written = []
    if runs is not None:
        written += draw_all(runs, docs)
    if sims:
        written += draw_all(sims[0], docs, "_sim")
    for path, results in _capacity_tables(sims, docs).items():
        written.append(capacity_docs.tabulate_simulated(results.sweep(CAPACITY), docs))
    path = docs / "figures" / "claims.csv"
    if path in planned:
        committed = pd.read_csv(path, keep_default_na=False) if path.is_file() else None
        table = claims_rows(runs, sims, committed)
        path.parent.mkdir(parents=True, exist_ok=True)
        # capacity rows: refresh's, below
        table.to_csv(path, index=False)
        written.append(path)
    provenance.record({path: prov for path, prov in planned.items() if path in written})
    written += capacity_docs.refresh(docs, shown)
    written += pipeline_claims.refresh(docs)
    # The page's glance is the table as it now stands (capacity's rows included, above).
    results_md = docs / "RESULTS.md"
    if path in written and results_md.is_file():
        written.append(results_page.write(results_md, docs))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure publish",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured",
                        help="a produce root of measured runs (default: none redrawn; the "
                             "table's measured rows kept)")
    parser.add_argument("--sim", action="append", default=[],
                        help="a produce --sim root (repeatable; the first draws the *_sim "
                             "figures; default: none, the table's simulated rows kept)")
    parser.add_argument("--docs", default=capacity_docs.DOCS, type=Path, help="the docs folder")
    parser.add_argument("--include-unreliable", action="store_true",
                        help="keep runs flagged timing_unreliable")
    cli_args.shared(parser, force="replace figures and claims of another source, scale, "
                                  "machine or commit")
    parser.add_argument("--gpu-claims", action="store_true",
                        help="rewrite RESULTS.md's GPU claims (the newest run of each device per "
                             "claim, older ones as history) from the runs kept under DOCS/gpu/")
    args = parser.parse_args(argv)
    for root in filter(None, [args.measured, *args.sim]):
        if not Path(root).is_dir():
            parser.error(f"root {root!r} is invalid: no such directory")
    if args.measured is None and not args.sim and not args.gpu_claims:
        parser.error("nothing to publish: give --measured ROOT and/or --sim ROOT, or --gpu-claims")
    if args.gpu_claims:
        results_md = Path(args.docs) / "RESULTS.md"
        try:
            output_files.check_writable(args.docs, [results_md.name], f"--docs={args.docs}")
            print(gpu_claims.write(results_md, Path(args.docs) / "gpu"))
        except output_files.OutputRefused as e:
            parser.error(str(e))
        except OSError as e:
            parser.error(f"--docs={args.docs} is invalid: must hold RESULTS.md and gpu/ "
                         f"({e.strerror})")
        except ValueError as e:
            parser.error(str(e))
        if args.measured is None and not args.sim:
            return
    try:
        written = publish(args.measured, args.sim, args.docs, args.include_unreliable, args.force)
    except (provenance.ReplaceRefused, output_files.OutputRefused, EnvFlagError,
            capacity_docs.TableError) as e:
        parser.error(str(e))
    print("\n".join(map(str, dict.fromkeys(written))))
