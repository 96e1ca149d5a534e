"""Run the paper's experiments into a results root, at full (CPU default) or CI scale, or as the GPU
suite's dry run (``--scale dry``: each one's one tiny CPU job, ``experiment=dry/NAME``).

    python -m sarathi_lab.produce                     # all of them, CPU defaults
    python -m sarathi_lab.produce pd_ratio --scale ci -o device.num_threads=1
    python -m sarathi_lab.produce --sim               # the paper's shapes, simulated (outputs/sim)
    python -m sarathi_lab.measure.gpu --own                   # the paper on your own GPU

Each experiment's sweep is ``python -m sarathi_lab.run -m experiment=NAME`` into
``<root>/<name>/multiruns/<scale>-<time>/``; a failed sweep does not stop the others.
"""
from __future__ import annotations

import time
from pathlib import Path

from omegaconf import OmegaConf

from sarathi_lab import cli_args
from sarathi_lab.analysis import registry
from sarathi_lab.analysis.runs import Results
from sarathi_lab.harness import CONF_DIR, REPO_ROOT
from sarathi_lab.harness.compose import run_as_command
from sarathi_lab.harness.results import SWEEP_SUMMARY

SCALES = ("full", "ci", "dry")


def _simulated_set_choices() -> list[str]:
    """What every experiment=sim/NAME shares, as overrides."""
    shared = OmegaConf.load(CONF_DIR / "experiment" / "sim" / "_a6000_13b.yaml")
    groups = [f"{key.removeprefix('override /')}={value}"
              for entry in shared.defaults for key, value in entry.items()]
    return groups + [f"engine.{key}={value}" for key, value in shared.engine.items()]


# The quick set on the simulator: its shapes with the simulated set's model and device.
SIM_CI_OVERRIDES = _simulated_set_choices()
SIM_ROOT = REPO_ROOT / "outputs" / "sim"


def sweep_args(name: str, root: str | Path, scale: str, extra: list[str] = (),
               sim: bool = False) -> list[str]:
    # A dry run's runs are the quick set's (scale: ci), and its folder says so for analysis.
    label = "ci-dry" if scale == "dry" else scale
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    sweep_dir = Path(root).resolve() / name / "multiruns" / f"{label}-{stamp}"
    full_sim = (sim and scale == "full"
                and (CONF_DIR / "experiment" / "sim" / f"{name}.yaml").is_file())
    overrides = list(SIM_CI_OVERRIDES) if sim and not full_sim else []
    if full_sim:
        experiment = f"sim/{name}"
    elif scale in ("ci", "dry"):
        # experiment=<scale>/NAME (ci: fewer points; dry: one tiny CPU job), else scale=<scale>.
        if (CONF_DIR / "experiment" / scale / f"{name}.yaml").is_file():
            experiment = f"{scale}/{name}"
        else:
            experiment, overrides = name, [f"scale={scale}", *overrides]
    else:
        experiment = name
    return ["-m", f"experiment={experiment}", f"hydra.sweep.dir={sweep_dir}", *overrides, *extra]


def run_experiments(names, root: str | Path, scale: str = "full", extra: list[str] = (),
                    sim: bool = False) -> list[str]:
    """Returns the names of those with a failed job."""
    failed = []
    if sim and (real_only := [n for n in names if not registry.by_name(n).simulated]):
        print(f"not on the simulator: {', '.join(real_only)} "
              "(real ranks; each job holds its own prediction)", flush=True)
        names = [n for n in names if n not in real_only]
    for name in names:
        if run_as_command(sweep_args(name, root, scale, extra, sim)):
            failed.append(name)
    return failed


def produce_missing(results: Results, scale: str = "ci", sim: bool = False) -> Results:
    if missing := results.missing():
        print(f"no finished run under {results.root} of {', '.join(missing)}: "
              f"running them at scale {scale}" + (" on the simulator" if sim else ""), flush=True)
        if failed := run_experiments(missing, results.root, scale, sim=sim):
            raise RuntimeError(f"failed jobs in: {', '.join(failed)} (see {SWEEP_SUMMARY} of each)")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.produce",
                             description=__doc__.split("\n\n")[0])
    known = registry.names()
    parser.add_argument("names", nargs="*",
                        help=f"experiments to run (default: all): {', '.join(known)}")
    parser.add_argument("--root", help="results root (default: outputs, or outputs/sim with --sim)")
    parser.add_argument("--scale", choices=SCALES, default="full")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override added to every sweep (repeatable)")
    parser.add_argument("--sim", action="store_true",
                        help="run on the simulator at the paper's shapes "
                             "(experiment=sim/NAME; at --scale ci the quick set)")
    args = parser.parse_args(argv)
    if device := next((n for n in args.names if n.startswith("device=")), None):
        # The GPU's paper is the GPU suite's (its kernel, engine and profile steps too).
        parser.error(f"{device} is invalid here: the paper on your own GPU is "
                     "`python -m sarathi_lab.measure.gpu --own` (every GPU step at the paper's setting, "
                     "resumable; docs/gpu/README.md); produce runs the experiments at this CPU's "
                     "sizes (-o device=cuda runs those on a GPU)")

    if unknown := sorted(set(args.names) - set(known)):
        parser.error(f"unknown experiment {unknown[0]!r}; known: {', '.join(known)}")
    root = Path(args.root) if args.root else (SIM_ROOT if args.sim else REPO_ROOT / "outputs")
    if any(p.exists() and not p.is_dir() for p in (root, *root.absolute().parents)):
        parser.error(f"--root={root} is invalid: it (or a folder above it) is a file, "
                     "not a directory")

    if failed := run_experiments(args.names or known, root, args.scale, args.override, args.sim):
        raise SystemExit(f"failed jobs in: {', '.join(failed)} (see {SWEEP_SUMMARY} of each)")


if __name__ == "__main__":
    main()
