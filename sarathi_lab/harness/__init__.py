"""The experiment harness around the engine: configs, workloads, runs, results, W&B, sweeps."""
from sarathi_lab.config import PACKAGE_DIR, REPO_ROOT

# Shipped inside the package (package data), so that the CLI works from `pip install .` as from a clone.
CONF_DIR = PACKAGE_DIR / "conf"
__all__ = ["CONF_DIR", "PACKAGE_DIR", "REPO_ROOT"]

# Registers the resolver that names sweep job folders (conf/config.yaml's hydra.sweep.subdir) in
# every process that composes the config: the CLI's, a launcher's, a submitit job's.
from sarathi_lab.harness import job_dirs  # noqa: F401
