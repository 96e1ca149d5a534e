"""Unpack a GPU call's archive into what the repository keeps, one folder per lease: docs/gpu/<device>/<lease>/
(summary, claims, step results, figures, lease.json) and profiles/<device>/<lease>/, the lease being
<date>_<commit> of its steps; then docs/gpu/leases.md, the index of every lease kept. Never the raw run folders.

    python -m sarathi_lab.gpu.collect .gpu/suite.tar.gz [--root DIR] [--force]
"""
from __future__ import annotations

import json
import re
import tarfile
import time
from pathlib import Path

from sarathi_lab import cli_args, provenance
from sarathi_lab.config import REPO_ROOT, device_slug
from sarathi_lab.harness.environment import EAGER, GRAPHS, engine_kind

# Kept: small text tables and figures; never the per-run folders of the paper sweeps.
KEEP = re.compile(r"^(summary\.(json|csv)|claims\.csv|figures/[\w.-]+\.png|steps/[\w.-]+/[\w.-]+\.(json|csv|log|txt))$")
PROFILE = re.compile(r"^profiles/([\w.-]+)/([\w.-]+\.(csv|json))$")
RUN = re.compile(r"^paper/[\w.-]+/multiruns/[^/]+/[^/]+/metrics\.json$")
ENV = "steps/env/env.json"  # names the device, hence where everything goes
SUMMARY = "summary.json"  # the steps' commits and start times, hence the lease
LEASE = "lease.json"  # in each lease's folder: what the index says of it
INDEX = "leases.md"


def gpu_docs(root: Path) -> Path:
    return Path(root) / "docs" / "gpu"


def lease_of(summary: dict) -> str:
    """'<date>_<commit>': the UTC date of the suite's first step and the commit(s) its steps ran at
    ('+'-joined where calls ran different ones). A ValueError where no step recorded either."""
    steps = [s for s in summary.get("steps", []) if s.get("started_at")]
    commits = sorted({s["commit"] for s in steps if s.get("commit")})
    if not steps or not commits:
        raise ValueError("its summary.json has no step with a start time and a commit, so its lease is unknown")
    date = time.strftime("%Y-%m-%d", time.gmtime(min(float(s["started_at"]) for s in steps)))
    return f"{date}_{'+'.join(commits)}"


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
    steps = summary.get("steps", [])
    return {"device": device, "machine": machine, "lease": lease_of(summary),
            "commit": "+".join(sorted({s["commit"] for s in steps if s.get("commit")})),
            "steps_done": [s["step"] for s in steps if s.get("status") == "done"],
            "steps_not_done": {s["step"]: s.get("status", "?") for s in steps if s.get("status") != "done"},
            "engine": engine, "profiles": sorted(profiles)}


def _json(tar: tarfile.TarFile, name: str) -> dict | None:
    try:
        return json.load(tar.extractfile(name))
    except (KeyError, ValueError, AttributeError):
        return None


def collect(archive: Path, root: Path = REPO_ROOT, force: bool = False) -> list[Path]:
    """The files kept, written under ``root``'s docs/gpu/<device>/<lease>/ and profiles/<device>/<lease>/.
    A ValueError, before writing any, for an archive that cannot say which device or lease it measured or
    that a dry run made (tiny shapes on the CPU); a provenance.ReplaceRefused for one whose files would
    replace another lease's (unless ``force``)."""
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        if ENV not in names:
            raise ValueError(f"{archive} is invalid: it has no {ENV} (the env step has not finished), so the "
                             "device it measured is unknown")
        summary = _json(tar, SUMMARY) if SUMMARY in names else None
        if summary is None:
            raise ValueError(f"{archive} is invalid: it has no readable {SUMMARY}, so its lease (the date and "
                             "commit its steps ran at) is unknown")
        if summary.get("suite", {}).get("dry_run"):
            raise ValueError(f"{archive} is invalid: a dry run's (tiny shapes on the CPU), not a GPU's measurements")
        try:
            lease = lease_of(summary)
        except ValueError as e:
            raise ValueError(f"{archive} is invalid: {e}") from None
        machine = str((_json(tar, ENV) or {}).get("device", ""))
        device = device_slug(machine)
        docs, profiles = gpu_docs(root) / device / lease, Path(root) / "profiles" / device / lease
        targets, runs = {}, []
        for member in tar.getmembers():
            if not member.isfile():
                continue
            if m := PROFILE.match(member.name):
                targets[member.name] = profiles / m[2]
            elif KEEP.match(member.name):
                targets[member.name] = docs / member.name
            elif RUN.match(member.name) and (record := _json(tar, member.name)):
                runs.append(record.get("environment", {}))
        record = lease_record(device, machine, summary, engine_of(runs, _json(tar, "steps/overhead/result.json")),
                              [Path(n).stem for n in targets if PROFILE.match(n) and n.endswith(".csv")])
        prov = provenance.Provenance("measured GPU", machine=machine, lease=lease, commit=record["commit"],
                                     writer="python -m sarathi_lab.gpu.collect")
        lease_file = docs / LEASE
        provenance.check({path: prov for path in [*targets.values(), lease_file]}, force,
                         "--force replaces them; --root DIR collects under another folder", Path(root))
        for name, target in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(name).read())
    lease_file.write_text(json.dumps(record, indent=1) + "\n")
    for folder in (docs, profiles):
        if folder.is_dir():
            provenance.record_folder(folder, {provenance.EVERYTHING: prov})
    return [*targets.values(), lease_file, write_index(root)]


def leases(root: Path) -> list[dict]:
    """Every lease kept under ``root``'s docs/gpu/ (its lease.json), by device then date."""
    found = []
    for path in sorted(gpu_docs(root).glob(f"*/*/{LEASE}")):
        try:
            found.append(json.loads(path.read_text()) | {"folder": path.parent.relative_to(gpu_docs(root))})
        except (OSError, ValueError):
            continue  # a damaged record: the lease's folder is still there, only unindexed
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
    path.write_text(text)
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
