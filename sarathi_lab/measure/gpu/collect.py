"""Unpack a GPU call's archive into what the repository keeps, one folder per lease:
docs/gpu/<device>/<lease>/ (summary, claims, step results, figures, lease.json) and
profiles/<device>/<lease>/, the lease being <date>_<commit> of its steps; then docs/gpu/leases.md,
the index of every lease kept. Never the raw run folders.

    python -m sarathi_lab.measure gpu_collect .gpu/suite.tar.gz [--root DIR] [--force]
"""
from __future__ import annotations

import json
import re
import tarfile
import time
from pathlib import Path

from sarathi_lab import cli_args, output_files, provenance, tuned_kernels
from sarathi_lab.analysis import gpu_records
from sarathi_lab.analysis.gpu_records import COMMIT, DEVICE, StepResult, Summary
from sarathi_lab.config import REPO_ROOT, device_slug
from sarathi_lab.harness.environment import EAGER, GRAPHS, engine_kind
from sarathi_lab.measure.gpu import archive_members
from sarathi_lab.measure.gpu.archive_members import ArchiveRefused

# Kept: small tables and figures; never the paper sweeps' run folders.
KEEP = re.compile(r"^(summary\.(json|csv)|claims\.csv|figures/[\w.-]+\.png"
                  r"|steps/[\w.-]+/[\w.-]+\.(json|csv|log|txt))$")
PROFILE = re.compile(r"^profiles/([\w.-]+)/([\w.-]+\.(csv|json))$")
# A tuned-kernel table the tune step wrote (read once committed to sarathi_lab/tuned/).
TUNED = re.compile(r"^steps/tune/(?!result\.json$)[\w.-]+\.json$")
# paper/<experiment>/multiruns/<sweep>/<job>/metrics.json, and the sweep's launch record.
RUN = re.compile(r"^paper/([\w.-]+)/multiruns/[^/]+/[^/]+/metrics\.json$")
LOCK = re.compile(r"^paper/([\w.-]+)/multiruns/[^/]+/\.sweep\.lock$")
ENV = "steps/env/env.json"
SUMMARY = gpu_records.SUMMARY
LEASE = gpu_records.LEASE_FILE
INDEX = "leases.md"


def gpu_docs(root: Path) -> Path:
    return Path(root) / "docs" / "gpu"


def _checked_commits(summary: Summary) -> None:
    """Each step's commit a safe name (it names the lease's folder)."""
    for i, step in enumerate(summary.steps):
        if step.commit and not COMMIT.fullmatch(step.commit):
            raise ArchiveRefused(f"{SUMMARY}'s steps[{i}].commit={step.commit[:80]!r} is not a "
                                 "commit: must be 1 to 40 of A-Z a-z 0-9 . _ - (git's hex), not "
                                 "starting with . _ -")


def lease_of(summary: Summary) -> str:
    """'<date>_<commit>': the first step's UTC date and the steps' commit(s), '+'-joined."""
    _checked_commits(summary)
    steps = [s for s in summary.steps if s.started_at]
    commits = sorted({s.commit for s in steps if s.commit})
    if not steps or not commits:
        raise ValueError("its summary.json has no step with a start time and a commit, so its "
                         "lease is unknown")
    date = time.strftime("%Y-%m-%d", time.gmtime(min(s.started_at for s in steps)))
    return archive_members.check_name(f"{date}_{'+'.join(commits)}", "its lease")


def engine_of(environments: list[dict], overhead: StepResult | None) -> str:
    """From the runs' environment records, else the overhead step's ``cuda_graphs_captured``."""
    if kind := engine_kind(environments):
        return kind
    metrics = {m.metric: m.value for m in (overhead.metrics if overhead else [])}
    captured = metrics.get("cuda_graphs_captured")
    if captured is None:
        return "unrecorded"
    return GRAPHS if captured else EAGER


def lease_record(device: str, machine: str, summary: Summary, engine: str,
                 profiles: list[str]) -> dict:
    steps = summary.steps
    return {"device": device, "machine": machine, "lease": lease_of(summary),
            "commit": "+".join(sorted({s.commit for s in steps if s.commit})),
            "steps_done": [s.step for s in steps if s.status == "done"],
            "steps_not_done": {s.step: s.status for s in steps if s.status != "done"},
            "engine": engine, "profiles": sorted(profiles)}


def _json(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str,
          label: str) -> dict | None:
    try:
        record = json.loads(archive_members.file_bytes(tar, members, name, label) or b"null")
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _seed(record: dict) -> int | None:
    for key in ("config", "resolved_config"):
        section = record.get(key)
        if isinstance(section, dict) and isinstance(section.get("seed"), int):
            return section["seed"]
    return None


def sweeps(runs: dict[str, dict], locks: dict[str, dict]) -> dict[str, dict]:
    """What a lease's paper sweeps ran, per experiment: ``seeds``, jobs finished and planned."""
    found: dict[str, dict] = {}
    for name, record in runs.items():
        if not (m := RUN.match(name)):
            continue
        entry = found.setdefault(m[1], {"seeds": set(), "jobs_finished": 0, "jobs_found": 0})
        entry["jobs_found"] += 1
        if record.get("partial") is False or "partial" not in record:
            entry["jobs_finished"] += 1
            if (seed := _seed(record)) is not None:
                entry["seeds"].add(seed)
    planned = {m[1]: record.get("jobs") for name, record in locks.items()
               if (m := LOCK.match(name))}
    return {exp: {"seeds": sorted(e["seeds"]), "jobs_finished": e["jobs_finished"],
                  "jobs_planned": max(e["jobs_found"], planned.get(exp)
                                      if isinstance(planned.get(exp), int) else 0)}
            for exp, e in sorted(found.items())}


# Parsed later (the queue, publish --gpu-claims): checked before any is kept.
RESULT = re.compile(r"^steps/([\w.-]+)/result\.json$")


def _check_kept(contents: dict[str, bytes], label: str) -> StepResult | None:
    """Kept step results, env.json and claims.csv checked against their schemas; returns
    overhead's."""
    overhead = None
    for name, data in contents.items():
        where = f"{label}'s {name}"
        if m := RESULT.match(name):
            result = gpu_records.step_result(gpu_records.parse_json(data, where), where)
            if result.step != m[1]:
                raise gpu_records.invalid(where, "step", result.step, f"its folder's {m[1]!r}")
            overhead = result if m[1] == "overhead" else overhead
        elif name == gpu_records.CLAIMS:
            gpu_records.claims(data, where)
        elif name == ENV:  # the floors of every analysis divide by its rates
            gpu_records.env(gpu_records.parse_json(data, where), where)
    return overhead


def device_of(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo],
              label: str) -> tuple[str, str]:
    """(device folder, GPU name) from the env step's record."""
    if ENV not in members:
        raise ValueError(f"{label} is invalid: it has no {ENV} (the env step has not finished), so "
                         "the device it measured is unknown")
    if members[ENV].isdir():
        raise ArchiveRefused(f"{label} is invalid: its {ENV} is a folder, so the device it "
                             "measured is unknown")
    env = _json(tar, members, ENV, label)
    if env is None:
        raise ArchiveRefused(f"{label} is invalid: its {ENV} is not a JSON object, so the device "
                             "it measured is unknown")
    machine = env.get("device")
    if not isinstance(machine, str) or not machine.strip():
        raise ArchiveRefused(f"{label} is invalid: {ENV}'s device is {str(machine)[:80]!r}, not a "
                             "GPU's name, so the folder its results go to is unknown")
    device = device_slug(machine[:200])
    if not DEVICE.fullmatch(device) or not any(c.isalpha() for c in device):
        raise ArchiveRefused(f"{label} is invalid: {ENV}'s device "
                             f"{' '.join(machine.split())[:80]!r} names no device folder (a GPU's "
                             "name, e.g. 'NVIDIA H100 80GB HBM3')")
    return device, " ".join(machine.split())[:200]


def _writable(root: Path, paths: list[Path]) -> None:
    """Every folder on the way a folder, each path a regular file (or missing); else ValueError."""
    for path in paths:
        for above in reversed(path.relative_to(root).parents):
            folder = root / above
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise ValueError(f"--root={root} is invalid: {folder} is not a folder, and "
                                 f"{path.relative_to(root)} would be written under it")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ValueError(f"--root={root} is invalid: {path} is not "
                             "a regular file, and would be replaced")


def _lease(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo],
           archive: Path) -> tuple[Summary, str]:
    """The archive's summary and lease; a dry run's refused, as one whose lease is unknown."""
    summary = archive_members.read_summary(tar, members, str(archive))
    if summary is None:
        raise ValueError(f"{archive} is invalid: it has no readable {SUMMARY}, so its lease (the "
                         "date and commit its steps ran at) is unknown")
    if summary.suite.get("dry_run"):
        raise ValueError(f"{archive} is invalid: a dry run's (tiny shapes on the CPU), not a "
                         "GPU's measurements")
    try:
        return summary, lease_of(summary)
    except ValueError as e:
        raise ValueError(f"{archive} is invalid: {e}") from None


def collect(archive: Path, root: Path = REPO_ROOT, force: bool = False) -> list[Path]:
    """Keeps an archive's files, all or none; dry runs, foreign archives, other leases' refused."""
    label = str(archive)
    root = Path(root).resolve()
    with archive_members.open_archive(archive, label) as (tar, members):
        device, machine = device_of(tar, members, label)
        summary, lease = _lease(tar, members, archive)
        why = f"{archive} is invalid: its lease"
        docs = archive_members.inside(root, Path("docs", "gpu", device, lease), why)
        profiles = archive_members.inside(root, Path("profiles", device, lease), why)
        targets, runs, run_records, locks = {}, [], {}, {}
        for name, member in members.items():
            if member.isdir():
                continue
            if m := PROFILE.match(name):
                targets[name] = profiles / m[2]
            elif KEEP.match(name):
                targets[name] = docs / name
            elif RUN.match(name) and (record := _json(tar, members, name, label)):
                runs.append(record.get("environment") if isinstance(record.get("environment"), dict)
                            else {})
                run_records[name] = record
            elif LOCK.match(name) and (record := _json(tar, members, name, label)):
                locks[name] = record
        for name, target in targets.items():  # within root once links are followed
            archive_members.inside(root, target.relative_to(root),
                                   f"{archive} is invalid: member {name!r}")
        # Every member read (the whole archive readable) before the first file is written.
        contents = {n: archive_members.read_member(tar, members[n], label) for n in targets}
        for name in filter(TUNED.match, contents):
            tuned_kernels.from_bytes(contents[name], f"{archive}: {name}", device=machine)
    overhead = _check_kept(contents, label)
    record = lease_record(device, machine, summary, engine_of(runs, overhead),
                          [Path(n).stem for n in targets if PROFILE.match(n)
                           and n.endswith(".csv")])
    record["sweeps"] = sweeps(run_records, locks)
    record = gpu_records.lease(record, f"{label}'s {LEASE}")
    prov = provenance.Provenance("measured GPU", machine=machine, lease=lease,
                                 commit=record["commit"],
                                 writer="python -m sarathi_lab.measure gpu_collect")
    files = {target: contents[name] for name, target in targets.items()}
    files[docs / LEASE] = (json.dumps(record, indent=1) + "\n").encode()
    provenance.check(dict.fromkeys(files, prov), force,
                     "--force replaces them; --root DIR collects under another folder", root)
    for folder in (docs, profiles):
        if folder.is_dir() or any(p.parent == folder for p in files):
            text = provenance.sidecar_text(folder, {provenance.EVERYTHING: prov})
            files[folder / provenance.SIDECAR] = text.encode()
    files[gpu_docs(root) / INDEX] = index_text(root, record).encode()
    _writable(root, list(files))
    output_files.write_all(files)
    return [*targets.values(), docs / LEASE, gpu_docs(root) / INDEX]


def leases(root: Path) -> list[dict]:
    """Every kept lease by device then date; a damaged one skipped with a warning."""
    return [kept.lease for kept in gpu_records.kept_leases(gpu_docs(root))]


def index_text(root: Path, new: dict | None = None) -> str:
    """docs/gpu/leases.md: one row per lease (and ``new``)."""
    rows, kept = [], {(r["device"], r["lease"]): r for r in leases(root)}
    if new is not None:
        kept[new["device"], new["lease"]] = new
    for (device, name), lease in sorted(kept.items()):
        folder = f"{device}/{name}"
        readme = (f"{folder}/README.md" if (gpu_docs(root) / folder / "README.md").is_file()
                  else f"{folder}/")
        done, not_done = lease["steps_done"], lease["steps_not_done"]
        steps = f"{len(done)} done: {', '.join(done)}"
        if not_done:
            steps += "; not done: " + ", ".join(f"{s} ({gpu_records.cell(status)})"
                                                for s, status in not_done.items())
        profile = (f"[{', '.join(lease['profiles'])}](../../profiles/{folder}/)"
                   if lease["profiles"] else "none")
        rows.append(f"| {device} | [{name}]({readme}) | `{lease['commit']}` | "
                    f"{gpu_records.cell(lease['engine'])} | {steps} | {profile} |")
    return ("# GPU suite leases\n\nOne folder per lease, `docs/gpu/<device>/<lease>/` (lease: the "
            "date and the commit its steps ran at), written by `python -m "
            "sarathi_lab.measure gpu_collect`, which also writes this index; the simulator reads "
            "the newest lease's profiles of a device unless told one (`SARATHI_PROFILE_LEASE`)."
            "\n\n| device | lease | engine commit | engine | steps | profiles |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure gpu_collect",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("archive", type=Path, help="suite.tar.gz as a GPU call brought it back")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="the folder that holds docs/ and profiles/ (default: this clone)")
    cli_args.shared(parser, force="replace files another lease wrote")
    args = parser.parse_args(argv)
    try:
        written = collect(args.archive, args.root, args.force)
    except (OSError, tarfile.TarError, ValueError) as e:
        parser.error(str(e))
    for path in written:
        print(path.relative_to(args.root) if path.is_relative_to(args.root) else path)
