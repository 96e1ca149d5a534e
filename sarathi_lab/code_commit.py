"""Which commit of the code runs, read without torch (the GPU suite's driver must not import it)."""
from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata

from sarathi_lab.config import PACKAGE_DIR

DISTRIBUTION = "sarathi-lab"
# Where a copy without .git is told its commit, in this order; the GPU suite sets the second.
COMMIT_ENV = ("SARATHI_COMMIT", "SARATHI_GPU_COMMIT")


def source_commit() -> tuple[str | None, str | None]:
    """(commit, where read): HEAD ('git'), else COMMIT_ENV's first set, else pip's git URL
    record ('pip'); (None, None) where none says."""
    if commit := _git("rev-parse", "HEAD"):
        return commit, "git"
    for name in COMMIT_ENV:
        if value := os.environ.get(name, "").strip():
            return value, name
    if installed := _installed()[1]:
        return installed, "pip"
    return None, None


def _installed() -> tuple[str | None, str | None]:
    """The installed version, and the commit of the git URL pip installed from (PEP 610)."""
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
    # The package's own clone only: an installed copy (even in a venv in a clone) has none.
    if _run_git("rev-parse", "--show-toplevel") != str(PACKAGE_DIR.parent):
        return None
    return _run_git(*args)


def _run_git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True,
                             timeout=10, check=False)

    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
