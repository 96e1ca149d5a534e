"""The package's import structure file by file: ``python tests/import_structure.py`` prints its counts
(files, import arrows between them, arrows from a lower layer into a higher one, circles) and
``--arrows`` every arrow as ``importer -> imported``.

Read from the AST as test_import_layers.py reads it (imports inside functions included) and ranked by
its layers; an arrow is one file importing another (``from pkg import sub`` reaches ``pkg/sub.py``,
``from pkg import name`` ``pkg/__init__.py``); a circle is a group of files each reachable from every
other (a strongly connected component of more than one file).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

# Run as a script, this folder is on the path.
from test_import_layers import PACKAGE, RANK, ROOT, _module_name, _node_of_file

KERNELS = ROOT / "kernels" / "sarathi_kernels"


def _files() -> dict[str, Path]:
    """{module name: file} of the package and the kernels."""
    return {_module_name(p): p for p in [*PACKAGE.rglob("*.py"), *KERNELS.rglob("*.py")]}


def _targets(module: str, names: list[str], files: dict[str, Path]) -> list[str]:
    """The modules of this tree ``from module import names`` (or ``import module``) reaches."""
    reached = [f"{module}.{n}" for n in names if f"{module}.{n}" in files]
    if module in files and len(reached) < len(names or [None]):
        reached.append(module)
    return reached


def arrows() -> set[tuple[str, str]]:
    files = _files()
    found = set()
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                reached = [t for a in node.names for t in _targets(a.name, [], files)]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                reached = _targets(base, [a.name for a in node.names], files)
            else:
                continue
            found |= {(module, t) for t in reached if t != module}
    return found


def circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iteratively)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, found = {}, {}, [], set(), []
    for root, children in graph.items():
        if root in index:
            continue
        work = [(root, iter(children))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on.add(child)
                work.append((child, iter(graph[child])))
            elif child in on:
                low[node] = min(low[node], index[child])
    return found


def main(argv: list[str]) -> None:
    files = _files()
    edges = arrows()
    rank = {m: RANK.get(_node_of_file(p), -1) for m, p in files.items()}
    upward = sorted((a, b) for a, b in edges if rank[b] > rank[a])
    groups = circles(edges)
    print(f"files: {len(files)}, import arrows: {len(edges)}, upward arrows: {len(upward)}, "
          f"circles: {len(groups)} ({sum(map(len, groups))} files)")
    for a, b in upward:
        print(f"  upward: {a} -> {b}")
    for group in groups:
        print(f"  circle: {', '.join(group)}")
    if "--arrows" in argv:
        print("\n".join(f"{a} -> {b}" for a, b in sorted(edges)))


if __name__ == "__main__":
    main(sys.argv[1:])
