"""The experiment harness around the engine: configs, workloads, runs, results, W&B, sweeps."""
from pathlib import Path

# conf/, experiments/ and data/ live next to the package in the repository (run from a clone).
REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
