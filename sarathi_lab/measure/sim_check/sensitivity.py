"""A sensitivity table: how far a simulated paper headline moves with a choice the paper leaves
open. Each table names the simulated sweeps it reads (an experiment's sim variant with overrides)
and a function from their results to rows; this module runs the sweeps (or reads a results root
that holds them, laid out as produce --sim lays them), checks --out before any sweep, and writes
the table with its provenance."""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sarathi_lab import cli_args, code_commit, output_files, provenance
from sarathi_lab.analysis.runs import Results
from sarathi_lab.harness.cli_check import compose_config
from sarathi_lab.harness.compose import run_as_command
from sarathi_lab.harness.results import simulated_source


@dataclass(frozen=True)
class Sweep:
    experiment: str             # its sim variant runs: experiment=sim/<experiment>
    label: str                  # its folder: <root>/<experiment>/multiruns/<label>
    settings: tuple[str, ...] = ()  # one value each ("setup=a6000_13b_1k")
    grid: tuple[str, ...] = ()      # swept beside the variant's own sweep ("chunk=64,128")


@dataclass(frozen=True)
class Table:
    writer: str                                  # the command that writes it
    description: str                             # its --help line
    out: Path                                    # --out's default
    sweeps: Callable[[], list[Sweep]]            # composed when the table runs, not at import
    rows: Callable[[Results], pd.DataFrame]
    heading: str                                 # printed above the table (after the source)

    def experiments(self) -> list[str]:
        return sorted({s.experiment for s in self.sweeps()})


def planned_source(table: Table) -> str:
    """Where the sweeps' numbers will come from, as their runs will say (before any runs)."""
    engines = [compose_config([f"experiment=sim/{s.experiment}", *s.settings]).engine
               for s in table.sweeps()]
    return " / ".join(sorted({simulated_source(e.sim_device, e.sim_cost_model) for e in engines}))


def run_sweeps(sweeps: list[Sweep], root: Path) -> None:
    """The simulated sweeps into ``root``, one folder each."""
    for s in sweeps:
        folder = root / s.experiment / "multiruns" / s.label
        args = ["-m", f"experiment=sim/{s.experiment}", *s.settings, *s.grid,
                f"hydra.sweep.dir={folder}"]
        if run_as_command(args, quiet=True):
            raise SystemExit(f"error: {' '.join(args[1:-1])} failed "
                             f"(see {folder}/sweep_summary.json)")


def planned_commit() -> str:
    """The commit the sweeps will record: this code's."""
    return provenance.commits([code_commit.source_commit()[0]])


def _outputs(p: cli_args.Parser, table: Table, args, source: str,
             commit: str) -> output_files.Outputs:
    """--out's table, checked: another command's, or another commit's, is replaced only with
    --force."""
    made = provenance.Provenance(source, scale="full", commit=commit, writer=table.writer)
    out = output_files.Outputs(args.out.parent, {args.out.name: made}, given=f"--out={args.out}",
                               force=args.force,
                               how="--force replaces it; --out FILE writes elsewhere")
    try:
        out.check()
    except ValueError as e:
        p.error(str(e))
    return out


def main(table: Table, argv: list[str] | None = None) -> pd.DataFrame:
    p = cli_args.Parser(prog=table.writer, description=table.description)
    p.add_argument("--runs", type=Path, help="a results root holding the simulated sweeps "
                                             "(default: run them into a temporary folder)")
    cli_args.shared(p, out="the table (.csv)", out_default=table.out,
                    force="replace a table another command wrote")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sensitivity-") as scratch:
        root = args.runs or Path(scratch)
        if args.runs is None:
            # Before the sweeps, on the source and commit they will record.
            _outputs(p, table, args, planned_source(table), planned_commit())
            run_sweeps(table.sweeps(), root)
        results = Results(root)
        names = table.experiments()
        if missing := [n for n in names if n in results.missing()]:
            p.error(f"--runs={root} is invalid: it holds no finished run of {', '.join(missing)}")
        source = " / ".join(sorted({results.source(n) for n in names}))
        out = _outputs(p, table, args, source,
                       " / ".join(sorted({results.commits(n) for n in names})))
        found = table.rows(results)
    pd.set_option("display.width", 160)
    print(f"{table.heading} ({source}):")
    print(found.round(3).to_string(index=False))
    out.add(args.out.name, found.to_csv(index=False, float_format="%.4g"))
    try:
        out.write()
    except ValueError as e:
        p.error(str(e))
    return found
