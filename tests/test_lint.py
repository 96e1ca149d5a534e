"""The code passes the linter pinned in pyproject's dev extra, with pyproject's settings, and the
notebooks nbformat's schema as committed, so that a finding fails the README's test command rather
than piling up."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "sarathi_lab", "tests", "kernels"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_committed_notebooks_are_valid_as_written(path):
    nbformat = pytest.importorskip("nbformat")
    # A cell without an id is patched in memory by nbformat today, with a warning that it will refuse it.
    cells = json.loads(path.read_text())["cells"]
    assert all("id" in cell for cell in cells), "fix: nbformat.write(nbformat.read(path, as_version=4), path)"
    nbformat.validate(nbformat.reads(path.read_text(), as_version=4))
