"""A lease's claims at its device's floors: each paper step's own sweep (the command its
result.json kept) rerun on the simulator's floor cost model at the lease's device, judged by the
paper result's own claims:

    python -m sarathi_lab.measure floor_claims docs/gpu/h200/2026-11-27_9e2ae41

writes ``<lease>.floor_claims.csv`` beside the lease's folder, which stays as collected. The
attribution reads it: a claim the device's floors allow and our run misses is our engine's."""
from __future__ import annotations

import csv
import io
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path

from sarathi_lab import cli_args, provenance
from sarathi_lab.analysis import gpu_records, registry
from sarathi_lab.analysis.claims import claims_table
from sarathi_lab.analysis.runs import Results
from sarathi_lab.harness.compose import run_as_command
from sarathi_lab.harness.interrupts import Interrupted, signals_interrupt

COST_MODEL = "floor"
COLUMNS = ("experiment", "claim", "floors", "holds", "sim_device", "cost_model", "overrides")
# What a lease's command set for its own machine and folders; the simulator's run sets its own.
# Of Hydra's keys only the one that drops the experiment's own axes is the sweep's: any other
# (a run or sweep folder, a search path) would write or read where the lease's command says.
DROPPED = ("device", "on_existing", "logger")
SWEEP_AXES_ONLY = "hydra.sweeper.params=null"
ALIGN = "scheduler.chunk_align"


def short_claims(folder: Path) -> list[str]:
    """The experiments whose claims the lease judged short of "yes", in its claims.csv's order."""
    rows = gpu_records.read_claims(folder / gpu_records.CLAIMS)
    found = list(dict.fromkeys(r["experiment"] for r in rows
                               if r.get("holds", "").strip() != "yes" and r.get("experiment")))
    if unknown := [e for e in found if e not in registry.names()]:
        raise ValueError(f"{folder / gpu_records.CLAIMS} is invalid: experiment={unknown[0]!r} "
                         f"is no paper result; allowed: {', '.join(registry.names())}")
    return found


def sweep_overrides(folder: Path, experiment: str) -> list[str] | None:
    """The lease's own overrides of its paper step, less what set its machine and folders; None
    where the step kept no command (a sweep cut by its call's end)."""
    path = folder / "steps" / f"paper.{experiment}" / "result.json"
    notes = (gpu_records.read(path, gpu_records.step_result).notes if os.path.lexists(path)
             else [])
    command = next((n for n in notes if n.startswith("sarathi_lab.run -m ")), None)
    if command is None:
        return None
    try:
        words = shlex.split(command)[2:]
    except ValueError as e:
        raise ValueError(f"{path} is invalid: its command is no command line ({e})") from None
    kept = [w for w in words if not w.startswith("-") and _key(w) not in DROPPED
            and (not _key(w).startswith("hydra.") or w == SWEEP_AXES_ONLY)]
    # A sweep that names no alignment ran the fixed chunk: it predates the tile-aligned default.
    if not any(_key(w) == ALIGN for w in kept):
        kept.append(f"++{ALIGN}=none")
    return kept


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def simulate(overrides: list[str], device: str, root: Path, experiment: str) -> str | None:
    """None where the sweep ran every job; else why not, in one line (its refusal, or a failure)."""
    sweep = root / experiment / "multiruns" / COST_MODEL
    with tempfile.TemporaryFile(mode="w+") as errors:
        code = run_as_command(["-m", *overrides, "executor=sim", f"engine.sim_device={device}",
                               f"engine.sim_cost_model={COST_MODEL}", "logger=none",
                               f"hydra.sweep.dir={sweep}"], quiet=True, stderr=errors)
        errors.seek(0)
        said = [line.strip() for line in errors if line.startswith("error:")]
    if code == 0:
        return None
    why = said[-1].removeprefix("error:").strip() if said else f"exit status {code}"
    return ("refused: " if code == 2 else "a job failed: ") + why


def floor_rows(folder: Path, root: Path) -> list[dict]:
    device = str(gpu_records.read(folder / gpu_records.LEASE_FILE, gpu_records.lease)["device"])
    found = []
    for experiment in short_claims(folder):
        overrides = sweep_overrides(folder, experiment)
        if overrides is None:
            print(f"{experiment}: skipped, {folder}/steps/paper.{experiment}/result.json keeps "
                  "no `sarathi_lab.run -m` command (the sweep it ran is unknown)")
            continue
        if (why := simulate(overrides, device, root, experiment)) is not None:
            raise ValueError(f"{folder}/steps/paper.{experiment}/result.json's sweep did not run "
                             f"on the simulator ({why}); nothing was written")
        table = claims_table(Results(root), only=[experiment])
        found += [{"experiment": experiment, "claim": r["claim"], "floors": r["ours"],
                   "holds": r["holds"], "sim_device": device, "cost_model": COST_MODEL,
                   "overrides": " ".join(overrides)} for _, r in table.iterrows()]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure floor_claims",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("lease", type=Path, help="a lease's folder under docs/gpu/<device>/")
    cli_args.shared(parser, force="replace a file beside the lease that another writer wrote")
    args = parser.parse_args(argv)
    lease = args.lease.resolve()
    made = provenance.Provenance(f"simulated {lease.parent.name.upper()} ({COST_MODEL})",
                                 lease=lease.name,
                                 writer="python -m sarathi_lab.measure floor_claims")
    try:
        out = gpu_records.derived_outputs(lease, (gpu_records.FLOOR_CLAIMS,), made, args.force)
        out.check()
        with signals_interrupt(signal.SIGINT, signal.SIGTERM), \
                tempfile.TemporaryDirectory(prefix="floor_claims.") as root:
            rows = floor_rows(lease, Path(root))
        table = io.StringIO(newline="")
        writer = csv.DictWriter(table, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
        (name,) = out.names
        out.add(name, table.getvalue())
        (written,) = out.write()
    except ValueError as e:
        parser.error(str(e))
    except Interrupted as e:
        print(f"interrupted ({e}): the simulator's sweeps are ended, nothing was written; the same "
              "command starts over", file=sys.stderr)
        raise SystemExit(e.exit_code) from None
    for r in rows:
        print(f"{r['experiment']}, {r['claim']}: {r['floors']} ({r['holds']})")
    print(f"wrote {written}")
    return 0
