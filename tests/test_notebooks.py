"""The experiments run for real at the CI scale, and every notebook executes top to bottom on
their results, as a user runs it right after set-up: with README's command, which writes the executed
copy under outputs/ and leaves the committed notebook as it is."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import nbformat
import pandas as pd
import pytest

from sarathi_lab.analysis import registry
from sarathi_lab.analysis.captions import AGREE
from sarathi_lab.analysis.runs import EXPERIMENTS, INCLUDE_UNRELIABLE_ENV
from sarathi_lab.harness import REPO_ROOT
from sarathi_lab.harness.results import load_runs
from sarathi_lab.produce import run_experiments
from sarathi_lab.sim.device import CEILINGS_ENV
from tests.test_capacity_docs import docs_copy

pytestmark = pytest.mark.e2e
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


@pytest.fixture(scope="module")
def results_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    assert run_experiments(EXPERIMENTS, root, scale="ci") == []
    # The notebook's default SARATHI_SIM_RESULTS: the same set on the simulator (seconds per sweep).
    assert run_experiments(EXPERIMENTS, root / "sim", scale="ci", sim=True) == []
    return root


def test_every_ci_experiment_finishes_every_job(results_root):
    for name in EXPERIMENTS:
        (sweep,) = (results_root / name / "multiruns").iterdir()
        jobs = json.loads((sweep / "sweep_summary.json").read_text())
        assert jobs and {j["status"] for j in jobs.values()} == {"ok"}, (name, jobs)
        assert len(list(sweep.glob("*/metrics.json"))) == len(jobs)


def readme_command(path, output_dir) -> list[str]:
    """README's: `.venv/bin/jupyter nbconvert --to notebook --execute notebooks/NAME --output-dir
    outputs/notebooks`, with this interpreter's jupyter."""
    return [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
            str(path.relative_to(REPO_ROOT)), "--output-dir", str(output_dir)]


def _execute(path, results_root, docs, output_dir, include_unreliable=True, env=None):
    committed = path.read_bytes()
    # SARATHI_DOCS: capacity redraws docs/.
    env = (env or os.environ) | {"SARATHI_RESULTS": str(results_root), "SARATHI_DOCS": str(docs),
                                 "PYTHONPATH": str(REPO_ROOT)}
    env.pop("WANDB_PROJECT", None)
    env.pop(INCLUDE_UNRELIABLE_ENV, None)
    if include_unreliable:
        # The quick set checks the pipeline: on a shared machine (the other test workers) its runs are
        # flagged timing_unreliable, and figures.ipynb would leave them all out.
        env[INCLUDE_UNRELIABLE_ENV] = "1"
    run = subprocess.run(readme_command(path, output_dir), cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=1200, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert path.read_bytes() == committed, "the README command must leave the committed notebook as it is"
    # Progress on the terminal while it runs: each code cell after the first announces itself.
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)
    assert f"[{path.name}] cell {code_cells - 1}: " in run.stderr, run.stderr[-2000:]
    return nbformat.read(output_dir / path.name, as_version=4)


def test_every_notebook_is_tested():
    # capacity.ipynb's runs are its own test's (below): with and without a CPU table and searches.
    assert {p.name for p in NOTEBOOKS} == {"figures.ipynb", "capacity.ipynb"}


def test_the_figures_notebook_runs_top_to_bottom_on_a_fresh_machine(results_root, tmp_path):
    # As on a fresh clone: no measured CPU ceilings (none of the tests' synthetic ones, an empty cache),
    # no simulated runs, and no capacity search, whose CI-scale token budget reads those ceilings: the
    # notebook measures them first and says so, and runs the simulator at the paper's shapes by default.
    root = tmp_path / "results"
    shutil.copytree(results_root, root, ignore=shutil.ignore_patterns("sim", "capacity", "figures"))
    env = {k: v for k, v in os.environ.items() if k not in (CEILINGS_ENV, "SARATHI_SIM_PRODUCE")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    notebook = _execute(NOTEBOOKS_DIR / "figures.ipynb", root, docs_copy(tmp_path), tmp_path / "outputs",
                        env=env)
    shown = json.dumps([cell.outputs for cell in notebook.cells if cell.cell_type == "code"], ensure_ascii=False)
    assert "measured this CPU's ceilings in " in shown and "for token_budget=auto of capacity" in shown
    assert (tmp_path / "cache" / "sarathi_lab" / "cpu_ceilings.json").is_file()
    # The machine balance that explains the runs is measured in their precision (bfloat16 where
    # the CPU has bf16 units), not always in float32.
    dtype = load_runs(root / "per_token_cost")["env.dtype"].iloc[0]
    assert f", {dtype}, " in json.dumps(notebook.cells[-1].outputs)
    assert sorted(p.stem for p in (root / "figures").glob("*.png")) == sorted(EXPERIMENTS)
    claims = pd.read_csv(root / "figures" / "claims.csv", keep_default_na=False)
    # Simulated paper results at the paper's shapes, on the calibrated cost model (produce --sim).
    simulated = claims[claims.source == "simulated A6000 (calibrated), llama-13b"]
    assert len(simulated) and set(simulated.scale) == {"full"}
    # Mistral-7B's three measured (not yet: no CPU table) and three simulated, Yi-34B's tensor-parallel
    # one, and Mistral-7B's on the arxiv_summarization lengths.
    assert (claims.experiment == "capacity").sum() == 8
    # Every claim a source does not hold is under its figure, with why.
    for row in claims[~claims.holds.isin(AGREE) & (claims.experiment != "capacity")].itertuples():
        assert f"{row.claim}: **{row.holds}**" in shown, row
    assert "Why: the quick CI scale, not the paper's" in shown


def test_the_figures_notebook_finishes_where_every_run_is_unreliable(results_root, tmp_path):
    # As on a busy machine: every measured run flagged. Each figure's place says why it is not drawn
    # and how to draw it anyway, and the notebook runs to its end (the machine balance included).
    root = tmp_path / "results"
    shutil.copytree(results_root, root, ignore=shutil.ignore_patterns("figures"))
    flagged = 0
    for metrics in root.glob("*/multiruns/*/**/metrics.json"):  # a capacity search's trials are runs too
        record = json.loads(metrics.read_text())
        record["environment"]["timing_unreliable"] = True
        metrics.write_text(json.dumps(record))
        flagged += 1
    assert flagged
    notebook = _execute(NOTEBOOKS_DIR / "figures.ipynb", root, docs_copy(tmp_path), tmp_path / "out",
                        include_unreliable=False)
    shown = json.dumps([cell.outputs for cell in notebook.cells if cell.cell_type == "code"])
    for name in EXPERIMENTS:
        assert f"no reliable run of {name}: " in shown and "SARATHI_INCLUDE_UNRELIABLE=1 to draw them anyway" in shown
    # The simulated runs, which no load changes, are drawn all the same: every simulated result's figure.
    simulated = {n for n in EXPERIMENTS if registry.by_name(n).simulated}
    assert {p.stem for p in (root / "figures").glob("*.png")} >= simulated and "matmul GFLOP/s" in shown
    assert "The simulated runs are drawn alone." in shown


@pytest.mark.parametrize("cpu_table", [False, True], ids=["not measured", "measured"])
def test_capacity_notebook_draws_with_and_without_the_cpu_table(cpu_table, results_root, tmp_path):
    # Not measured: beside the CI set's capacity searches, as a user's own; measured: with none.
    docs = docs_copy(tmp_path, cpu_table)
    results = tmp_path / "results" if cpu_table else results_root
    notebook = _execute(NOTEBOOKS_DIR / "capacity.ipynb", results, docs, tmp_path / "outputs")
    own = json.dumps([c.outputs for c in notebook.cells if c.cell_type == "code" and "load_searches" in c.source])
    assert ("no capacity searches under" in own) == cpu_table and ("tbt_slo_s" in own) != cpu_table, own[-2000:]
    assert {p.name for p in (docs / "figures").glob("*.png")} == {"capacity.png", "capacity_tradeoff.png"}
    claims = pd.read_csv(docs / "figures" / "claims.csv")
    measured = claims[claims.experiment == "capacity"].ours.iloc[0]
    assert ("cpu-small" in measured) == cpu_table and ("not measured yet" in measured) != cpu_table
    shown = json.dumps(notebook.cells[-1].outputs)
    assert "simulated A100 (roofline), mistral-7b" in shown


def test_publish_redraws_every_figure_and_the_claims_table_from_result_roots(results_root, tmp_path):
    docs = docs_copy(tmp_path)
    # --include-unreliable, as the notebooks' SARATHI_INCLUDE_UNRELIABLE: the quick set checks the pipeline,
    # and beside the other test workers its measured runs may be flagged timing_unreliable. --force: the
    # copy's claims table is the committed full-scale one, which CI-scale runs replace only when told.
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "publish", "--measured", str(results_root),
                          "--sim", str(results_root / "sim"), "--docs", str(docs), "--include-unreliable", "--force"],
                         check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    drawn = {p.stem for p in (docs / "figures").glob("*.png")}
    simulated = [n for n in EXPERIMENTS if registry.by_name(n).simulated]
    assert {*EXPERIMENTS, *(f"{n}_sim" for n in simulated), "capacity", "capacity_tradeoff"} <= drawn
    claims = pd.read_csv(docs / "figures" / "claims.csv")
    sources = set(claims.source)
    assert any(s.startswith("measured CPU") for s in sources)
    assert "simulated A6000 (calibrated), llama-13b" in sources
    assert (claims.experiment == "capacity").sum() == 8


def test_publish_refuses_a_missing_root_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "publish", "--measured", str(tmp_path / "nope")],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "nope" in run.stderr, run.stderr
