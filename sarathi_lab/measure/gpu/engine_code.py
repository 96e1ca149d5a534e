"""A step's engine code: a hash of its sources, alike from a tree (no .git on a GPU) or a commit."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from sarathi_lab.code_commit import source_commit
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.gpu import steps

# Source only: build products and caches are no change of the code, and absent from a commit.
SOURCE_SUFFIXES = (".py", ".yaml", ".cu", ".cuh", ".cpp", ".h", ".c")
ENGINE = ("kernels/sarathi_kernels", "sarathi_lab/engine", "sarathi_lab/model",
          "sarathi_lab/attention", "sarathi_lab/llm.py", "sarathi_lab/config.py")
# A run of the harness, and the tasks it measures with.
RUNS = ("sarathi_lab/harness", "sarathi_lab/conf", "sarathi_lab/host_load.py",
        "sarathi_lab/measure/tasks", "sarathi_lab/measure/profiling",
        "sarathi_lab/analysis/quantities.py")
# What the attention steps measure with.
ATTENTION = ("kernels/sarathi_kernels", "sarathi_lab/attention", "sarathi_lab/measure/profiling",
             "sarathi_lab/model/shape.py", "sarathi_lab/model/floors.py")


def paths_of(name: str) -> tuple[str, ...]:
    """What step ``name`` depends on (its module's STEP); no module: the engine (due too often,
    not seldom)."""
    group = name.split(".")[0]
    own = (f"sarathi_lab/measure/gpu/steps/{group}.py",)
    declared = steps.declared().get(group)
    if declared is None:
        return tuple(sorted({*ENGINE, *own}))
    return tuple(sorted({*declared.paths, *declared.step_paths(name), *own}))


def _wanted(path: str) -> bool:
    return path.endswith(SOURCE_SUFFIXES) and "__pycache__" not in path


def _digest(entries: list[tuple[str, str]]) -> str:
    """One hash of (path, git blob id) pairs, so a tree and a commit with the same files agree."""
    text = "".join(f"{p}\0{b}\n" for p, b in sorted(entries))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_hash(paths: tuple[str, ...], root: Path = REPO_ROOT) -> str:
    entries = []
    for rel in paths:
        base = root / rel
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*")
                                                     if p.is_file()) if base.is_dir() else []
        entries += [(p.relative_to(root).as_posix(), _blob_id(p.read_bytes())) for p in files
                    if _wanted(p.relative_to(root).as_posix())]
    return _digest(entries)


def commit_hash(paths: tuple[str, ...], commit: str, root: Path = REPO_ROOT) -> str | None:
    """None where git does not know ``commit``."""
    if not commit or commit == "?":
        return None
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", commit, "--", *paths],
                                check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    # <mode> <kind> <blob>\t<path>
    rows = [(meta.split()[1:3], path) for meta, path in
            (line.split("\t", 1) for line in listed.stdout.splitlines())]
    return _digest([(path, blob) for (kind, blob), path in rows
                    if kind == "blob" and _wanted(path)])


def step_hash(name: str) -> str:
    return tree_hash(paths_of(name))


def short_commit() -> str | None:
    """git's HEAD, else SARATHI_COMMIT / SARATHI_GPU_COMMIT (a copy without .git), 7 digits."""
    commit = source_commit()[0]
    return commit[:7] if commit else None
