"""The experiments run for real at the CI scale, and every notebook executes top to bottom on
their results, as a user runs it right after set-up."""
from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

from sarathi_lab.analysis.runs import EXPERIMENTS
from sarathi_lab.harness import REPO_ROOT
from sarathi_lab.produce import run_experiments

pytestmark = pytest.mark.e2e
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def results_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    assert run_experiments(EXPERIMENTS, root, scale="ci") == []
    return root


def test_every_ci_experiment_finishes_every_job(results_root):
    for name in EXPERIMENTS:
        (sweep,) = (results_root / name / "multiruns").iterdir()
        jobs = json.loads((sweep / "sweep_summary.json").read_text())
        assert jobs and {j["status"] for j in jobs.values()} == {"ok"}, (name, jobs)
        assert len(list(sweep.glob("*/metrics.json"))) == len(jobs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path, results_root, monkeypatch):
    monkeypatch.setenv("SARATHI_RESULTS", str(results_root))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    if path.name == "figures.ipynb":
        assert sorted(p.stem for p in (results_root / "figures").glob("*.png")) == sorted(EXPERIMENTS)
        assert (results_root / "figures" / "claims.csv").is_file()
