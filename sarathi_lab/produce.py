"""Run the paper's experiments into a results root, at full (CPU default) or CI scale, or as the GPU
suite's dry run (``--scale dry``: each one's one tiny CPU job, ``experiment=dry/NAME``).

    python -m sarathi_lab.produce                     # all of them, CPU defaults
    python -m sarathi_lab.produce pd_ratio --scale ci -o device.num_threads=1
    python -m sarathi_lab.produce --sim               # the paper's shapes, simulated (outputs/sim)
    python -m sarathi_lab.produce --sim --publish --force   # and docs/figures' simulated claims
    python -m sarathi_lab.measure gpu --own                   # the paper on your own GPU

Each experiment's sweep is ``python -m sarathi_lab.run -m experiment=NAME`` into
``<root>/<name>/multiruns/<scale>-<time>/``; a failed sweep does not stop the others. ``--publish``
then redraws docs/figures/ from the root (analysis/publish.py): the measured claims and figures, or,
with ``--sim``, the simulated ones on every cost model the table judges them by, each beside the
first in ``<root>-<cost model>``.
"""
from __future__ import annotations

import shlex
import signal
import sys
import time
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.analysis import capacity_docs, publish, registry
from sarathi_lab.analysis.runs import Results
from sarathi_lab.config import ConfigError
from sarathi_lab.env_flags import EnvFlagError
from sarathi_lab.harness import CONF_DIR, REPO_ROOT, experiment_variants
from sarathi_lab.harness.budget import cpu_ceilings_dtype
from sarathi_lab.harness.cli_check import check_command_line
from sarathi_lab.harness.compose import compose_config, run_as_command
from sarathi_lab.harness.interrupts import Interrupted, signals_interrupt
from sarathi_lab.harness.results import SWEEP_SUMMARY
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.measure.profiling import cpu_ceilings

SCALES = ("full", "ci", "dry")
# The cost models the published simulated claims are judged by besides the sim configs' own
# (calibrated): each into <root>-<name> (docs/figures/claims.csv's "differs by cost model").
OTHER_COST_MODELS = ("roofline",)
REFUSED = 2  # sarathi_lab.run's exit status for a refused command line or config: nothing ran


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
                and experiment_variants.exists(CONF_DIR, f"sim/{name}"))
    overrides = list(SIM_CI_OVERRIDES) if sim and not full_sim else []
    if full_sim:
        experiment = f"sim/{name}"
    elif scale in ("ci", "dry"):
        # experiment=<scale>/NAME (ci: fewer points; dry: one tiny CPU job), else scale=<scale>.
        if experiment_variants.exists(CONF_DIR, f"{scale}/{name}"):
            experiment = f"{scale}/{name}"
        else:
            experiment, overrides = name, [f"scale={scale}", *overrides]
    else:
        experiment = name
    return ["-m", f"experiment={experiment}", f"hydra.sweep.dir={sweep_dir}", *overrides, *extra]


def first_config(name: str, scale: str, extra: list[str] = (), sim: bool = False):
    """A sweep's config before its swept values, composed and parsed as ``python -m
    sarathi_lab.run`` does (ConfigError: its refusal)."""
    args = [a for a in sweep_args(name, ".", scale, extra, sim)[1:] if not a.startswith("hydra.")]
    return parse_config(compose_config(args))


_UNCOMPOSED = (ConfigError, ValueError, HydraException, OmegaConfBaseException)


def override_refusal(name: str, scale: str, overrides: list[str], sim: bool) -> str | None:
    """The run's own one-line refusal where ``overrides`` make a sweep's config invalid; None
    where they do not, or where what is refused is the sweep's own (left for it to say)."""
    try:
        first_config(name, scale, overrides, sim)
        return None
    except ConfigError as e:
        refusal = str(e)
    except _UNCOMPOSED:
        return None  # a sweep override (chunk=64,abc): each job is the sweep's to check
    try:
        first_config(name, scale, (), sim)
    except _UNCOMPOSED:
        return None
    return refusal


def ceilings_needed(names, scale: str, extra: list[str] = ()) -> dict[str, list[str]]:
    """{dtype: the experiments whose token_budget=auto reads this CPU's measured ceilings in it}."""
    needed = {}
    for name in names:
        try:
            cfg = first_config(name, scale, extra)
        except _UNCOMPOSED:
            continue  # its sweep refuses it, and is named with the failed ones
        if cfg.token_budget == "auto" and (dtype := cpu_ceilings_dtype(cfg.engine)):
            needed.setdefault(dtype, []).append(name)
    return needed


def ensure_ceilings(names, scale: str, extra: list[str] = ()) -> None:
    """Measures the ceilings a fresh machine lacks before the runs that read them, and says so."""
    for dtype, readers in ceilings_needed(names, scale, extra).items():
        if entry := cpu_ceilings.ensure(dtype):
            print(cpu_ceilings.measured_line(entry, f"token_budget=auto of {', '.join(readers)}"),
                  flush=True)


def run_experiments(names, root: str | Path, scale: str = "full", extra: list[str] = (),
                    sim: bool = False, refused: list[str] | None = None) -> list[str]:
    """Returns the names of those with a failed job, or refused (added to ``refused`` too: their
    sweep ran nothing, so it wrote no summary)."""
    failed = []
    if sim and (real_only := [n for n in names if not registry.by_name(n).simulated]):
        print(f"not on the simulator: {', '.join(real_only)} "
              "(real ranks; each job holds its own prediction)", flush=True)
        names = [n for n in names if n not in real_only]
    if not sim:
        ensure_ceilings(names, scale, extra)
    for i, name in enumerate(names):
        args = sweep_args(name, root, scale, extra, sim)
        try:
            code = run_as_command(args)
        except Interrupted as e:
            e.stopped = (name, args, names[i + 1:], Path(root))  # for the resume note
            raise
        if code == REFUSED and refused is not None:
            refused.append(name)
        if code:
            failed.append(name)
    return failed


def interrupted_note(e: Interrupted, scale: str, extra: list[str], sim: bool) -> str:
    """What stopped and how to go on: the sweep's own resume command (the run printed it above)
    and the experiments not started."""
    name, args, rest, root = getattr(e, "stopped", (None, [], [], None))
    if name is None:
        return f"interrupted ({e}) before any sweep started"
    sweep = next(a.partition("=")[2] for a in args if a.startswith("hydra.sweep.dir="))
    note = (f"interrupted ({e}): {name}'s sweep in {sweep} stopped (a run under way there is "
            "recorded as interrupted); the command above resumes it")
    if rest:
        options = [*rest, "--root", str(root), "--scale", scale,
                   *(w for o in extra for w in ("-o", o)), *["--sim"] * sim]
        note += (f"; not started: {', '.join(rest)} (python -m sarathi_lab.produce "
                 f"{shlex.join(options)})")
    return note


def produce_missing(results: Results, scale: str = "ci", sim: bool = False) -> Results:
    if missing := results.missing():
        print(f"no finished run under {results.root} of {', '.join(missing)}: "
              f"running them at scale {scale}" + (" on the simulator" if sim else ""), flush=True)
        if failed := run_experiments(missing, results.root, scale, sim=sim):
            raise RuntimeError(f"failed jobs in: {', '.join(failed)} (see {SWEEP_SUMMARY} of each)")
    return results


def _parser(known) -> cli_args.Parser:
    parser = cli_args.Parser(prog="python -m sarathi_lab.produce",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*",
                        help=f"experiments to run (default: all): {', '.join(known)}")
    parser.add_argument("--root", help="results root (default: outputs, or outputs/sim with --sim)")
    parser.add_argument("--scale", choices=SCALES, default="full")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override added to every sweep (repeatable)")
    parser.add_argument("--sim", action="store_true",
                        help="run on the simulator at the paper's shapes "
                             "(experiment=sim/NAME; at --scale ci the quick set)")
    parser.add_argument("--publish", action="store_true",
                        help="then redraw docs/figures/ from the runs (python -m "
                             "sarathi_lab.measure publish); with --sim, run on "
                             f"{', '.join(OTHER_COST_MODELS)} too, into <root>-<cost model>")
    parser.add_argument("--docs", type=Path, default=capacity_docs.DOCS,
                        help="the docs folder --publish writes (default: the repository's)")
    cli_args.shared(parser, force="--publish replaces figures and claims of another source, "
                                  "scale, machine or commit")
    return parser


def main(argv: list[str] | None = None) -> None:
    known = registry.names()
    parser = _parser(known)
    args = parser.parse_args(argv)
    if not args.publish and (args.force or args.docs != capacity_docs.DOCS):
        parser.error(f"{'--force' if args.force else f'--docs={args.docs}'} is invalid without "
                     "--publish: they say where and whether it writes")
    if device := next((n for n in args.names if n.startswith("device=")), None):
        # The GPU's paper is the GPU suite's (its kernel, engine and profile steps too).
        parser.error(f"{device} is invalid here: the paper on your own GPU is "
                     "`python -m sarathi_lab.measure gpu --own` (every GPU step at the paper's setting, "
                     "resumable; docs/gpu/README.md); produce runs the experiments at this CPU's "
                     "sizes (-o device=cuda runs those on a GPU)")

    if unknown := sorted(set(args.names) - set(known)):
        parser.error(f"unknown experiment {unknown[0]!r}; known: {', '.join(known)}")
    root = Path(args.root) if args.root else (SIM_ROOT if args.sim else REPO_ROOT / "outputs")
    if any(p.exists() and not p.is_dir() for p in (root, *root.absolute().parents)):
        parser.error(f"--root={root} is invalid: it (or a folder above it) is a file, "
                     "not a directory")

    roots = {root: []}
    if args.publish and args.sim:
        roots |= {root.with_name(f"{root.name}-{model}"): [f"engine.sim_cost_model={model}"]
                  for model in OTHER_COST_MODELS}
    names = args.names or known
    # A bad override is refused here in one line, before any sweep (each would refuse it alike):
    # the command line's, then the run's own refusal of the config it makes.
    running = [n for n in names if not args.sim or registry.by_name(n).simulated]
    for name in running if args.override else ():
        if problem := (check_command_line(sweep_args(name, root, args.scale, args.override,
                                                     args.sim))
                       or override_refusal(name, args.scale, args.override, args.sim)):
            parser.error(f"-o {problem}")
    failed, refused = [], []
    try:
        with signals_interrupt(signal.SIGINT, signal.SIGTERM):
            for each, overrides in roots.items():
                failed += run_experiments(names, each, args.scale, [*args.override, *overrides],
                                          args.sim, refused)
    except Interrupted as e:
        print(interrupted_note(e, args.scale, args.override, args.sim), file=sys.stderr)
        raise SystemExit(e.exit_code) from None
    refused = list(dict.fromkeys(refused))
    said = [f"refused, nothing of them ran (each said why above): {', '.join(refused)}"] * bool(
        refused)
    if ran := [n for n in dict.fromkeys(failed) if n not in refused]:
        said.append(f"failed jobs in: {', '.join(ran)} (see {SWEEP_SUMMARY} of each)")
    if said:
        raise SystemExit("; ".join(said))
    if args.publish:
        try:
            written = publish.publish(None if args.sim else root, list(roots) if args.sim else [],
                                      args.docs, force=args.force)
        except (provenance.ReplaceRefused, output_files.OutputRefused, EnvFlagError,
                capacity_docs.TableError) as e:
            roots_args = " ".join(f"--{'sim' if args.sim else 'measured'} {r}" for r in roots)
            parser.error(f"{e} (the runs are kept: python -m sarathi_lab.measure publish "
                         f"{roots_args} --docs {args.docs} --force publishes them)")
        print("\n".join(map(str, dict.fromkeys(written))))


if __name__ == "__main__":
    main()
