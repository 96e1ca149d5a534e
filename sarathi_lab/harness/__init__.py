"""The experiment harness around the engine: configs, workloads, runs, results, W&B, sweeps."""
from pathlib import Path

# Shipped inside the package (package data), so that the CLI works from `pip install .` as from a clone.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
CONF_DIR = PACKAGE_DIR / "conf"
# The clone's root (outputs/, notebooks/); meaningful only when running from a clone.
REPO_ROOT = PACKAGE_DIR.parent

# Registers the resolver that names sweep job folders (conf/config.yaml's hydra.sweep.subdir) in
# every process that composes the config: the CLI's, a launcher's, a submitit job's.
from sarathi_lab.harness import job_dirs  # noqa: F401
