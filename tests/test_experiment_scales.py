"""One declaration per experiment: each paper result's scales are Hydra overlays, ``experiment=<scale>/<name>``
(sections of ``conf/experiment/<name>.yaml``), that compose, and what the GPU suite runs at each scale is what
it ran when its overrides were Python strings (tests/data/experiment_scales_golden.json, written from the
code before they moved: each step's command line and its first job's composed config)."""
from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sarathi_lab.analysis import registry
from sarathi_lab.harness import CONF_DIR, scales
from sarathi_lab.harness.cli_check import compose_config
from sarathi_lab.measure.gpu import plan

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "data" / "experiment_scales_golden.json").read_text())
RESULTS = [r for r in registry.RESULTS if r.gpu is not None]


def _first_job(args: list[str]) -> list[str]:
    """A sweep's first job: each swept key at its first value (hydra.* keys as given)."""
    return [a if a.startswith("hydra.") else a.split(",")[0] for a in args]


def _resolved(args: list[str]) -> dict:
    return OmegaConf.to_container(compose_config(_first_job(args)), resolve=True)


def _as_golden(resolved, golden):
    """``resolved`` cut to the keys the golden config has: keys the config gained since (new engine
    knobs at their defaults) are another change's, each tested where it was added; a golden key
    missing or changed still fails."""
    if isinstance(resolved, dict) and isinstance(golden, dict):
        return {k: _as_golden(resolved[k], golden[k]) if k in resolved else "<missing>" for k in golden}
    return resolved


def _overlays() -> list[tuple[str, str, str]]:
    """(name, scale, part) of every registered result's overlay at every scale, its parts included."""
    found = []
    for r in RESULTS:
        for scale in scales.SCALES:
            run = (r.gpu.unscaled or r.gpu) if scale == "own" else r.gpu
            parts = run.parts if scale != "dry" else ()
            found += [(r.name, scale, "")] + [(r.name, scale, p.name) for p in parts]
    return found


@pytest.mark.parametrize("scale", ["gpu", "own"])
def test_gpu_steps_run_the_overrides_they_ran_before(scale):
    steps = {s.name: s for s in plan.steps_of(scale == "own") if s.group == "paper"}
    assert set(steps) == set(GOLDEN[scale])
    for name, step in steps.items():
        golden = GOLDEN[scale][name]
        # The same overrides (the shared ones now come first, in the scale file's order) and minutes.
        assert Counter([f"experiment={step.arg}", *step.overrides]) == Counter(golden["argv"]), name
        assert step.minutes == golden["minutes"], name


@pytest.mark.parametrize("result", [r.name for r in RESULTS])
def test_dry_job_composes_to_the_config_it_ran_before(result):
    args = [f"experiment={result}", *scales.overrides(result, "dry")]
    golden = GOLDEN["dry"][result]["first_job"]
    assert _as_golden(_resolved(args), golden) == golden


@pytest.mark.parametrize("scale", ["gpu", "own"])
def test_each_overlay_s_first_job_composes_to_the_config_the_suite_ran_before(scale):
    """``experiment=<scale>/<name>[/<part>]`` at its sweep's first values, as a user runs it, is the job the
    suite ran when its overrides were strings: the overlay's defaults (scale/gpu.yaml) are the shared keys."""
    shared = scales.shared("gpu")
    for name, step in ((n, s) for n, s in plan.by_name(scale == "own").items() if s.group == "paper"):
        part = name.removeprefix(f"paper.{step.arg}").lstrip(".")
        overlay = "/".join(filter(None, (scale, step.arg, part)))
        own = scales.overrides(step.arg, scale, part)[len(shared):]   # the shared keys come from the overlay itself
        golden = GOLDEN[scale][name]["first_job"]
        assert _as_golden(_resolved([f"experiment={overlay}", *own]), golden) == golden, name


@pytest.mark.parametrize(("name", "scale", "part"), _overlays())
def test_every_scale_of_every_result_composes_to_what_the_suite_passes(name, scale, part):
    """``-m experiment=<scale>/<name>[/<part>]`` sweeps the keys the suite passes on its command line."""
    overlay = "/".join(filter(None, (scale, name, part)))
    cfg = compose_config([f"experiment={overlay}"], hydra=True)
    params = {k: str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}
    passed = dict(o.split("=", 1) for o in scales.overrides(name, scale, part) if "=" in o)
    swept = {k: v for k, v in passed.items() if k in params}
    assert swept and all(params[k] == v for k, v in swept.items()), overlay
    assert cfg.name == name


def test_an_overlay_that_does_not_exist_is_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        scales.overrides("per_token_cost", "gpu", "nope")
    message = str(err.value)
    assert message.startswith("error: experiment=gpu/per_token_cost/nope is invalid") and "\n" not in message


_OVERRIDES = re.compile(r"\s*(\+{0,2}[A-Za-z_][\w.]*=\S+\s*)+")   # a string of key=value overrides alone


def _text(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):   # an f-string: its fields as a placeholder value
        return "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
    return None


def _override_strings(path: Path):
    """(line, keys) of each string, and each list, tuple or set of strings, made of overrides alone."""
    for node in ast.walk(ast.parse(path.read_text())):
        items = node.elts if isinstance(node, ast.List | ast.Tuple | ast.Set) else [node]
        texts = [_text(item) for item in items]
        if texts and all(t is not None and _OVERRIDES.fullmatch(t) for t in texts):
            yield node.lineno, {w.split("=", 1)[0].lstrip("+") for t in texts for w in t.split()}


# The profile step runs task=profile, the simulator's cost table, on each model: no paper experiment.
NOT_AN_EXPERIMENT = {ROOT / "sarathi_lab" / "measure" / "gpu" / "steps" / "profile.py",
                     # bench sim_speed's workload as a run's overrides: the bench's own, no paper experiment.
                     ROOT / "sarathi_lab" / "measure" / "sim_check" / "sim_process.py",
                     # a measured run rebuilt on the simulator: how it is rerun, not what it ran.
                     ROOT / "sarathi_lab" / "measure" / "sim_check" / "rebuild.py",
                     # the sim-vs-GPU smoke's own points over the dry overlay (PaperResult.smoke_runs):
                     # what the smoke compares, not what the experiment runs at any scale.
                     ROOT / "sarathi_lab" / "analysis" / "paper_results" / "pd_ratio.py",
                     # Fig. 13c's P:D sensitivity: a what-if grid over the sim overlay, each chunk's own
                     # C / (B - 1) derived from the setups' B, not a scale the experiment runs at.
                     ROOT / "sarathi_lab" / "measure" / "sim_check" / "sim_chunk_pd.py"}


def test_no_python_module_writes_a_paper_experiment_s_overrides():
    """The overlays are the one place: no module under sarathi_lab/ holds a string (or a list of them) of
    two or more overrides of the keys the overlays set."""
    keys = {o.split("=", 1)[0].lstrip("+") for name, scale, part in _overlays()
            for o in scales.overrides(name, scale, part)} - {"hydra.sweeper.params"}
    found = [f"{path.relative_to(ROOT)}:{line}: {sorted(named & keys)}"
             for path in sorted((ROOT / "sarathi_lab").rglob("*.py")) if path not in NOT_AN_EXPERIMENT
             for line, named in _override_strings(path) if len(named & keys) >= 2]
    assert not found, "\n".join(found)


def test_the_tiny_cpu_scale_is_declared_once():
    """scale/dry.yaml is the quick set (scale/ci.yaml) on the CPU: it includes it, restating none of it."""
    dry = OmegaConf.load(CONF_DIR / "scale" / "dry.yaml")
    assert "/scale/ci" in dry.defaults
    assert "model" not in str(dry.defaults) and "logger" not in str(dry.defaults)


def test_produce_runs_the_dry_scale_from_the_overlays(tmp_path):
    from sarathi_lab.produce import sweep_args

    args = sweep_args("orca_compare", tmp_path, "dry", ["seed=3"])
    assert args[:2] == ["-m", "experiment=dry/orca_compare"] and args[-1] == "seed=3"
    # Its runs are labelled the quick set's (scale: ci), and so is its folder.
    assert args[2].startswith(f"hydra.sweep.dir={tmp_path.resolve()}/orca_compare/multiruns/ci-dry-")


def bless(scale: str) -> list[str]:
    """Writes GOLDEN[scale] anew for the paper steps whose command line or minutes changed (and drops
    steps the suite no longer has): ``python tests/test_experiment_scales.py --bless gpu``. Run it
    only for a change of a GPU grid made on purpose, and say why in its commit."""
    path = ROOT / "tests" / "data" / "experiment_scales_golden.json"
    golden = json.loads(path.read_text())
    steps = {s.name: s for s in plan.steps_of(scale == "own") if s.group == "paper"}
    changed = []
    for name, step in steps.items():
        argv = [f"experiment={step.arg}", *step.overrides]
        old = golden[scale].get(name)
        if old and Counter(old["argv"]) == Counter(argv) and old["minutes"] == step.minutes:
            continue
        golden[scale][name] = {"argv": argv, "first_job": _resolved(argv), "minutes": step.minutes}
        changed.append(name)
    for name in sorted(set(golden[scale]) - set(steps)):
        del golden[scale][name]
        changed.append(f"{name} (dropped)")
    golden[scale] = dict(sorted(golden[scale].items()))
    path.write_text(json.dumps(golden, indent=1, sort_keys=False) + "\n")
    return changed


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["--bless"] or len(sys.argv) != 3 or sys.argv[2] not in ("gpu", "own"):
        sys.exit("usage: python tests/test_experiment_scales.py --bless gpu|own")
    print("\n".join(bless(sys.argv[2])) or "nothing changed")
