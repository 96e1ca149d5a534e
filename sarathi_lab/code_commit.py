"""Which commit of the code runs, read without torch (the GPU suite's driver must not import it): the
clone's HEAD, else what whoever started a copy without .git said, else what pip recorded."""
from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata

from sarathi_lab.config import PACKAGE_DIR

DISTRIBUTION = "sarathi-lab"
# Where a copy without .git (the GPU suite's copy on a remote machine, a tarball) is told its commit, read
# in this order; SARATHI_GPU_COMMIT is the name the GPU suite's device command has always set.
COMMIT_ENV = ("SARATHI_COMMIT", "SARATHI_GPU_COMMIT")


def source_commit() -> tuple[str | None, str | None]:
    """(the commit of the code that runs, where it was read): the clone's HEAD ('git'), else the
    first of COMMIT_ENV set (its name: the copy has no .git, and whoever started it said), else the
    commit pip recorded installing from a git URL ('pip'); (None, None) where none says."""
    if commit := _git("rev-parse", "HEAD"):
        return commit, "git"
    for name in COMMIT_ENV:
        if value := os.environ.get(name, "").strip():
            return value, name
    if installed := _installed()[1]:
        return installed, "pip"
    return None, None


def _installed() -> tuple[str | None, str | None]:
    """The installed package's version, and the commit of the git URL pip installed it from (PEP 610)."""
    try:
        version = metadata.version(DISTRIBUTION)
        direct_url = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None, None
    try:
        return version, json.loads(direct_url or "{}").get("vcs_info", {}).get("commit_id")
    except ValueError:
        return version, None


def _git(*args: str) -> str | None:
    # The package's own clone only: an installed copy (even in a venv inside some clone) has no commit.
    if _run_git("rev-parse", "--show-toplevel") != str(PACKAGE_DIR.parent):
        return None
    return _run_git(*args)


def _run_git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
