"""Unpack a GPU call's archive into what the repository keeps, one folder per lease: docs/gpu/<device>/<lease>/
(summary, claims, step results, figures, lease.json) and profiles/<device>/<lease>/, the lease being
<date>_<commit> of its steps; then docs/gpu/leases.md, the index of every lease kept. Never the raw run folders.

    python -m sarathi_lab.gpu.collect .gpu/suite.tar.gz [--root DIR] [--force]
"""
from __future__ import annotations

import json
import os
import re
import tarfile
import time
from contextlib import suppress
from pathlib import Path

from sarathi_lab import cli_args, provenance, tuned_kernels
from sarathi_lab.config import REPO_ROOT, device_slug
from sarathi_lab.gpu import archive_members
from sarathi_lab.gpu.archive_members import ArchiveRefused
from sarathi_lab.harness.environment import EAGER, GRAPHS, engine_kind

# Kept: small text tables and figures; never the per-run folders of the paper sweeps.
KEEP = re.compile(r"^(summary\.(json|csv)|claims\.csv|figures/[\w.-]+\.png|steps/[\w.-]+/[\w.-]+\.(json|csv|log|txt))$")
PROFILE = re.compile(r"^profiles/([\w.-]+)/([\w.-]+\.(csv|json))$")
# A tuned-kernel table the tune step wrote (the engine reads it once committed to sarathi_lab/tuned/).
TUNED = re.compile(r"^steps/tune/(?!result\.json$)[\w.-]+\.json$")
RUN = re.compile(r"^paper/[\w.-]+/multiruns/[^/]+/[^/]+/metrics\.json$")
ENV = "steps/env/env.json"  # names the device, hence where everything goes
SUMMARY = "summary.json"  # the steps' commits and start times, hence the lease
LEASE = "lease.json"  # in each lease's folder: what the index says of it
INDEX = "leases.md"


def gpu_docs(root: Path) -> Path:
    return Path(root) / "docs" / "gpu"


# A commit as a lease's folder name carries it: git's hex (a copy without .git says its own, as
# SARATHI_COMMIT), never a path.
COMMIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
# The device a lease's folders are named for: config.device_slug of the GPU's reported name.
DEVICE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


def _steps(summary: dict) -> list[dict]:
    """summary.json's steps, each a mapping whose step name and commit are safe names; an ArchiveRefused
    naming the field otherwise."""
    steps = summary.get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ArchiveRefused(f"{SUMMARY}'s steps is not a list of records")
    for i, step in enumerate(steps):
        archive_members.check_name(step.get("step"), f"{SUMMARY}'s steps[{i}].step")
        commit = step.get("commit")
        if commit and not (isinstance(commit, str) and COMMIT.fullmatch(commit)):
            raise ArchiveRefused(f"{SUMMARY}'s steps[{i}].commit={str(commit)[:80]!r} is not a commit: must be "
                                 "1 to 40 of A-Z a-z 0-9 . _ - (git's hex), not starting with . _ -")
    return steps


def lease_of(summary: dict) -> str:
    """'<date>_<commit>': the UTC date of the suite's first step and the commit(s) its steps ran at
    ('+'-joined where calls ran different ones). A ValueError where no step recorded either, or where
    they are not what the suite writes."""
    steps = [s for s in _steps(summary) if s.get("started_at")]
    commits = sorted({s["commit"] for s in steps if s.get("commit")})
    if not steps or not commits:
        raise ValueError("its summary.json has no step with a start time and a commit, so its lease is unknown")
    try:
        first = min(float(s["started_at"]) for s in steps)
        date = time.strftime("%Y-%m-%d", time.gmtime(first))
    except (TypeError, ValueError, OverflowError, OSError):
        raise ArchiveRefused(f"{SUMMARY}'s steps' started_at are not all times (seconds since 1970)") from None
    return archive_members.check_name(f"{date}_{'+'.join(commits)}", "its lease")


def engine_of(environments: list[dict], overhead: dict | None) -> str:
    """What the engine was: from the runs' environment records (environment.engine_kind), else from the
    overhead step's ``cuda_graphs_captured``; 'unrecorded' where neither says."""
    if kind := engine_kind(environments):
        return kind
    captured = {m["metric"]: m["value"] for m in (overhead or {}).get("metrics", [])}.get("cuda_graphs_captured")
    if captured is None:
        return "unrecorded"
    return GRAPHS if captured else EAGER


def lease_record(device: str, machine: str, summary: dict, engine: str, profiles: list[str]) -> dict:
    """lease.json: what the index shows of a lease."""
    steps = _steps(summary)
    return {"device": device, "machine": machine, "lease": lease_of(summary),
            "commit": "+".join(sorted({s["commit"] for s in steps if s.get("commit")})),
            "steps_done": [s["step"] for s in steps if s.get("status") == "done"],
            "steps_not_done": {s["step"]: str(s.get("status", "?")) for s in steps if s.get("status") != "done"},
            "engine": engine, "profiles": sorted(profiles)}


def _json(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str, label: str) -> dict | None:
    """The member ``name`` as a JSON object; None where it is missing or not one."""
    if name not in members or members[name].isdir():
        return None
    try:
        record = json.loads(archive_members.read_member(tar, members[name], label))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def device_of(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], label: str) -> tuple[str, str]:
    """(the device's folder name, the GPU's name as the env step recorded it); an ArchiveRefused naming
    the field where the env step's record cannot say it."""
    if ENV not in members:
        raise ValueError(f"{label} is invalid: it has no {ENV} (the env step has not finished), so the "
                         "device it measured is unknown")
    if members[ENV].isdir():
        raise ArchiveRefused(f"{label} is invalid: its {ENV} is a folder, so the device it measured is unknown")
    env = _json(tar, members, ENV, label)
    if env is None:
        raise ArchiveRefused(f"{label} is invalid: its {ENV} is not a JSON object, so the device it measured "
                             "is unknown")
    machine = env.get("device")
    if not isinstance(machine, str) or not machine.strip():
        raise ArchiveRefused(f"{label} is invalid: {ENV}'s device is {str(machine)[:80]!r}, not a GPU's name, "
                             "so the folder its results go to is unknown")
    device = device_slug(machine[:200])
    if not DEVICE.fullmatch(device) or not any(c.isalpha() for c in device):
        raise ArchiveRefused(f"{label} is invalid: {ENV}'s device {' '.join(machine.split())[:80]!r} names no "
                             "device folder (a GPU's name, e.g. 'NVIDIA H100 80GB HBM3')")
    return device, " ".join(machine.split())[:200]


def _write(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file renamed over it: a link there is replaced, never
    written through, and a failure leaves neither a half file nor the temporary one."""
    tmp = path.with_name(f".{path.name}.collecting-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        with suppress(FileNotFoundError):
            tmp.unlink()


def _writable(root: Path, paths: list[Path]) -> None:
    """An ArchiveRefused-free check before writing: every folder on the way to ``paths`` is a folder (or
    missing) and each path a regular file (or missing); a ValueError naming the first that is not."""
    for path in paths:
        for above in reversed(path.relative_to(root).parents):
            folder = root / above
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise ValueError(f"--root={root} is invalid: {folder} is not a folder, and "
                                 f"{path.relative_to(root)} would be written under it")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ValueError(f"--root={root} is invalid: {path} is not a regular file, and would be replaced")


def collect(archive: Path, root: Path = REPO_ROOT, force: bool = False) -> list[Path]:
    """The files kept, written under ``root``'s docs/gpu/<device>/<lease>/ and profiles/<device>/<lease>/.
    A ValueError (an ArchiveRefused for a hostile or damaged one), before writing any, for an archive that
    cannot say which device or lease it measured, that a dry run made (tiny shapes on the CPU) or that is
    not one the suite could have written (archive_members); a provenance.ReplaceRefused for one whose files
    would replace another lease's (unless ``force``)."""
    label = str(archive)
    root = Path(root).resolve()
    with archive_members.open_archive(archive, label) as (tar, members):
        device, machine = device_of(tar, members, label)
        summary = _json(tar, members, SUMMARY, label)
        if summary is None:
            raise ValueError(f"{archive} is invalid: it has no readable {SUMMARY}, so its lease (the date and "
                             "commit its steps ran at) is unknown")
        suite = summary.get("suite", {})
        if isinstance(suite, dict) and suite.get("dry_run"):
            raise ValueError(f"{archive} is invalid: a dry run's (tiny shapes on the CPU), not a GPU's measurements")
        try:
            lease = lease_of(summary)
        except ValueError as e:
            raise ValueError(f"{archive} is invalid: {e}") from None
        docs = archive_members.inside(root, Path("docs", "gpu", device, lease), f"{archive} is invalid: its lease")
        profiles = archive_members.inside(root, Path("profiles", device, lease), f"{archive} is invalid: its lease")
        targets, runs = {}, []
        for name, member in members.items():
            if member.isdir():
                continue
            if m := PROFILE.match(name):
                targets[name] = profiles / m[2]
            elif KEEP.match(name):
                targets[name] = docs / name
            elif RUN.match(name) and (record := _json(tar, members, name, label)):
                runs.append(record.get("environment") if isinstance(record.get("environment"), dict) else {})
        for name, target in targets.items():  # within root once links already under it are followed
            archive_members.inside(root, target.relative_to(root), f"{archive} is invalid: member {name!r}")
        record = lease_record(device, machine, summary,
                              engine_of(runs, _json(tar, members, "steps/overhead/result.json", label)),
                              [Path(n).stem for n in targets if PROFILE.match(n) and n.endswith(".csv")])
        prov = provenance.Provenance("measured GPU", machine=machine, lease=lease, commit=record["commit"],
                                     writer="python -m sarathi_lab.gpu.collect")
        lease_file = docs / LEASE
        provenance.check({path: prov for path in [*targets.values(), lease_file]}, force,
                         "--force replaces them; --root DIR collects under another folder", root)
        _writable(root, [*targets.values(), lease_file, docs / provenance.SIDECAR, profiles / provenance.SIDECAR,
                         gpu_docs(root) / INDEX])
        # Every member read (and so the whole archive found readable) before the first file is written.
        contents = {name: archive_members.read_member(tar, members[name], label) for name in targets}
        for name in filter(TUNED.match, contents):  # a table that breaks its schema is refused, as any damage
            tuned_kernels.from_bytes(contents[name], f"{archive}: {name}", device=machine)
    for name, target in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        _write(target, contents[name])
    docs.mkdir(parents=True, exist_ok=True)
    _write(lease_file, (json.dumps(record, indent=1) + "\n").encode())
    for folder in (docs, profiles):
        if folder.is_dir():
            provenance.record_folder(folder, {provenance.EVERYTHING: prov})
    return [*targets.values(), lease_file, write_index(root)]


# What the index shows of each lease (lease_record's fields).
_INDEXED = {"device", "lease", "commit", "engine", "steps_done", "steps_not_done", "profiles"}


def leases(root: Path) -> list[dict]:
    """Every lease kept under ``root``'s docs/gpu/ (its lease.json), by device then date."""
    found = []
    for path in sorted(gpu_docs(root).glob(f"*/*/{LEASE}")):
        try:
            if not path.is_file():  # a FIFO would wait for a writer forever
                continue
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a damaged record: the lease's folder is still there, only unindexed
        if isinstance(record, dict) and _INDEXED <= record.keys():
            found.append(record | {"folder": path.parent.relative_to(gpu_docs(root))})
    return found


def write_index(root: Path) -> Path:
    """docs/gpu/leases.md: one row per lease (device, lease, engine commit, steps, what the engine was)."""
    rows = []
    for lease in leases(root):
        folder = lease["folder"].as_posix()
        readme = f"{folder}/README.md" if (gpu_docs(root) / folder / "README.md").is_file() else f"{folder}/"
        done, not_done = lease["steps_done"], lease["steps_not_done"]
        steps = f"{len(done)} done: {', '.join(done)}"
        if not_done:
            steps += "; not done: " + ", ".join(f"{s} ({status})" for s, status in not_done.items())
        profile = (f"[{', '.join(lease['profiles'])}](../../profiles/{folder}/)" if lease["profiles"] else "none")
        rows.append(f"| {lease['device']} | [{lease['lease']}]({readme}) | `{lease['commit']}` | {lease['engine']} "
                    f"| {steps} | {profile} |")
    text = ("# GPU suite leases\n\nOne folder per lease, `docs/gpu/<device>/<lease>/` (lease: the date and the "
            "commit its steps ran at), written by `python -m sarathi_lab.gpu.collect`, which also writes this "
            "index; the simulator reads the newest lease's profiles of a device unless told one "
            "(`SARATHI_PROFILE_LEASE`).\n\n"
            "| device | lease | engine commit | engine | steps | profiles |\n|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n")
    path = gpu_docs(root) / INDEX
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, text.encode())
    return path


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.gpu.collect", description=__doc__.split("\n\n")[0])
    parser.add_argument("archive", type=Path, help="suite.tar.gz as a GPU call brought it back")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="the folder that holds docs/ and profiles/ (default: this clone)")
    parser.add_argument("--force", action="store_true", help="replace files another lease wrote")
    args = parser.parse_args(argv)
    try:
        written = collect(args.archive, args.root, args.force)
    except (OSError, tarfile.TarError, ValueError) as e:
        parser.error(str(e))
    for path in written:
        print(path.relative_to(args.root) if path.is_relative_to(args.root) else path)


if __name__ == "__main__":
    main()
