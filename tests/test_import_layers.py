"""Subpackages import only downward, and no import cycle exists between them.

The graph is built from the source (the AST of every module, imports inside functions included),
not from what happens to be imported at run time, so an import that only a rarely taken branch
makes still counts. ``python tests/test_import_layers.py`` prints the graph.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sarathi_lab"
WING = "measure"  # its folders are nodes of their own

# Lowest first; the simulator below the measurement that writes what it reads. ``llm`` is the
# public API (sarathi_lab/__init__.py and llm.py, with ``inputs``, the checks of what users pass it,
# and ``plan``, the engine's plan it builds from): it builds an engine with its model, or the
# simulator's executor, so it sits above both and below the harness. The measurement wing
# (sarathi_lab/measure/, a node for each of its folders) sits above the analysis, whose records it
# writes and whose registry plans the GPU suite; ``measure`` is its runner, listing them all.
LAYERS = (
    ("executors", "config", "refusal", "cli_args", "provenance", "output_files", "code_commit", "tuned_kernels",
     "env_flags", "host_memory", "host_features", "host_load"),
    ("engine",),
    ("model", "attention", "sarathi_kernels"),
    ("sim",),
    ("llm", "inputs", "plan"),
    ("harness",),
    ("analysis",),
    ("measure.profiling",),
    ("measure.tasks",),
    ("measure.bench",),
    ("measure.sim_check",),
    ("measure.gpu",),
    ("run", "produce", "measure", "sweep_report"),
)
RANK = {node: rank for rank, nodes in enumerate(LAYERS) for node in nodes}
# Upward imports seen when this test was written, each to be removed by the change named beside
# it (issue 12); the test fails on any other, and on an entry here that no longer occurs.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
CLIS = {"run", "produce", "measure.bench", "measure.gpu"}
# Scripts outside the package, ranked by their node (none now: the GPU kernel check is the lab's own).
SCRIPTS: dict[str, Path] = {}


def _node_of_file(path: Path) -> str:
    if path.is_relative_to(ROOT / "kernels" / "sarathi_kernels"):
        return "sarathi_kernels"
    for node, script in SCRIPTS.items():
        if path == script:
            return node
    parts = path.relative_to(PACKAGE).parts
    if parts[0] == WING:
        return f"{WING}.{parts[1]}" if len(parts) > 2 else WING
    part = parts[0].removesuffix(".py")
    return "llm" if part == "__init__" else part


def _node_of_module(module: str, names: list[str] = ()) -> list[str]:
    """The nodes that ``from module import names`` (or ``import module``) reaches."""
    parts = module.split(".")
    if parts[0] == "sarathi_kernels":
        return ["sarathi_kernels"]
    if parts[0] != "sarathi_lab":
        return []
    if len(parts) == 1 and not names:
        return ["llm"]  # ``import sarathi_lab``: the package's public API
    if len(parts) > 1 and parts[1] == WING:
        if len(parts) > 2:
            return [f"{WING}.{parts[2]}" if (PACKAGE / WING / parts[2]).is_dir() else WING]
        return [f"{WING}.{n}" if (PACKAGE / WING / n).is_dir() else WING for n in names or [""]]
    if len(parts) > 1:
        return ["llm" if parts[1] == "__init__" else parts[1]]
    # ``from sarathi_lab import X``: a subpackage or module by that name, else the public API.
    return [n if (PACKAGE / n).is_dir() or (PACKAGE / f"{n}.py").is_file() else "llm" for n in names or [""]]


def _module_name(path: Path) -> str:
    base = ROOT / "kernels" if path.is_relative_to(ROOT / "kernels") else ROOT
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: str | None = None) -> list[tuple[str, int]]:
    """(node imported, line) for every import in the file, at any depth; ``package``: the one the
    file belongs to (by default, from its place in the repository)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if package is None:
        package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(n, node.lineno) for alias in node.names for n in _node_of_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found += [(n, node.lineno) for n in _node_of_module(module, [a.name for a in node.names])]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found += [(n, node.lineno) for n in _node_of_module(node.args[0].value)]
    return found


def import_graph() -> dict[str, dict[str, list[str]]]:
    """{importer: {imported: ["file:line", ...]}} between nodes, self-imports left out."""
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "kernels" / "sarathi_kernels").rglob("*.py"), *SCRIPTS.values()]
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in files:
        src = _node_of_file(path)
        graph[src]  # every node appears, importing nothing or not
        for dst, line in _imports(path):
            if dst != src:
                graph[src][dst].append(f"{path.relative_to(ROOT)}:{line}")
    return graph


def _cycle(graph) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in graph.get(node, {}):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, [*path, nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in list(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def render(graph) -> str:
    order = sorted(graph, key=lambda n: (RANK.get(n, -1), n))
    return "\n".join(f"{n:16s} -> {', '.join(sorted(graph[n], key=lambda d: (RANK.get(d, -1), d))) or '-'}"
                     for n in order)


def test_every_subpackage_has_a_layer():
    unplaced = sorted(set(import_graph()) - set(RANK))
    assert not unplaced, f"place {unplaced} in LAYERS of this test"


def test_imports_go_only_downward_and_clis_do_not_import_each_other():
    graph = import_graph()
    print("\n" + render(graph))
    upward = {(src, dst): where[0] for src, dsts in graph.items() for dst, where in dsts.items()
              if RANK.get(dst, -1) > RANK.get(src, -1)}
    new = [f"{src} -> {dst} ({where})" for (src, dst), where in upward.items() if (src, dst) not in KNOWN_UPWARD]
    assert not new, "imports against the layers:\n" + "\n".join(new)
    gone = sorted(set(KNOWN_UPWARD) - set(upward))
    assert not gone, f"fixed, remove from KNOWN_UPWARD: {gone}"
    between_clis = [f"{src} -> {dst} ({where[0]})" for src, dsts in graph.items() if src in CLIS
                    for dst, where in dsts.items() if dst in CLIS]
    assert not between_clis, "command lines share code through the layers below, not each other:\n" + \
        "\n".join(between_clis)


def test_no_import_cycle_between_subpackages():
    assert _cycle(import_graph()) is None, f"import cycle: {' -> '.join(_cycle(import_graph()))}"


def test_analysis_reads_result_files_and_launches_nothing():
    """Of the harness, the analysis uses only the results contract (reading run directories, and a
    sweep directory's record of its jobs)."""
    used = set()
    for path in (PACKAGE / "analysis").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sarathi_lab.harness"):
                used |= {node.module} if node.module != "sarathi_lab.harness" else {f"{node.module}.{a.name}"
                                                                                  for a in node.names}
            elif isinstance(node, ast.Import):
                used |= {a.name for a in node.names if a.name.startswith("sarathi_lab.harness")}
    assert used <= {"sarathi_lab.harness.results", "sarathi_lab.harness.sweep_state"}, used


def test_the_checker_sees_function_level_relative_and_dynamic_imports(tmp_path):
    source = ("def f():\n    from sarathi_lab.harness import runner\n"
              "from . import floors\nimportlib.import_module('sarathi_lab.measure.bench.common')\n"
              "from sarathi_lab.measure import gpu\nfrom sarathi_lab import measure\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert sorted(n for n, _ in _imports(path, package="sarathi_lab.measure.profiling")) == [
        "harness", "measure", "measure.bench", "measure.gpu", "measure.profiling"]
    assert _cycle({"a": {"b": []}, "b": {"a": []}}) in (["a", "b", "a"], ["b", "a", "b"])
    assert _cycle({"a": {"b": []}, "b": {}}) is None


if __name__ == "__main__":
    sys.exit(print(render(import_graph())))


def test_kernels_import_nothing_from_the_lab():
    """kernels/ is below the lab: what checks the kernels against the lab's reference lives in the lab."""
    found = []
    for path in (ROOT / "kernels").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "sarathi_lab"]
    assert found == []


def test_the_simulator_imports_nothing_of_the_measurement_wing_nor_torch():
    """The simulator reads data (profiles, kernel tables, a ceilings file); what measures is above.
    That a simulated run loads no torch at all: tests/test_sim_imports.py."""
    found = []
    for path in (PACKAGE / "sim").rglob("*.py"):
        where = path.relative_to(ROOT)
        found += [f"{where}:{line}: {node}" for node, line in _imports(path)
                  if node.split(".")[0] == WING]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{where}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "torch"]
    assert found == []
