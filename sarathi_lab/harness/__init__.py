"""The experiment harness around the engine: configs, workloads, runs, results, W&B, sweeps."""
from sarathi_lab.config import PACKAGE_DIR, REPO_ROOT

# Package data, so that the CLI works from `pip install .` as from a clone.
CONF_DIR = PACKAGE_DIR / "conf"
__all__ = ["CONF_DIR", "PACKAGE_DIR", "REPO_ROOT"]

# Registers the resolver naming sweep job folders in every process that composes the config.

from sarathi_lab.harness import job_dirs  # noqa: F401
