"""The claims as each GPU measured them, newest per device, older as history (RESULTS.md)."""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from sarathi_lab.analysis import gpu_records, registry
from sarathi_lab.analysis.gpu_records import Summary, cell

BEGIN = ("<!-- gpu-claims: written by python -m sarathi_lab.analysis.publish --gpu-claims; "
         "edits here are replaced -->")
END = "<!-- /gpu-claims -->"
# The seeds a paper sweep's command named.
SEEDS = re.compile(r"\bseed=([0-9][0-9,]*)")


@dataclass(frozen=True)
class Judged:
    claim: str
    experiment: str
    paper: str
    ours: str
    spread: str
    holds: str
    device: str
    run: str
    commit: str
    engine: str      # eager, or with which CUDA graphs (lease.json)
    seeds: str
    why: str = ""    # for a claim not judged "yes": the lease's attribution of it


# claims.csv's "left out" for a claim from an unfinished sweep.
JOBS = re.compile(r"incomplete: ([0-9]+) of ([0-9]+) jobs")


def _seeds(record: dict, summary: Summary, experiment: str, left_out: str = "") -> str:
    """The sweep's seeds: lease.json's ``sweeps``, else its command; jobs where unfinished."""
    sweep = ((record.get("sweeps") or {}).get(experiment)
             if isinstance(record.get("sweeps"), dict) else None)
    jobs = JOBS.search(left_out or "")
    if isinstance(sweep, dict) and sweep.get("seeds"):
        done, planned = sweep.get("jobs_finished"), sweep.get("jobs_planned")
        seeds = ",".join(map(str, sweep["seeds"]))
        return seeds + (f" ({done} of {planned} jobs)" if done is not None and planned
                        and done < planned else "")
    found = {int(s) for step in summary.steps if step.step.split(".")[1:2] == [experiment]
             for note in step.notes for m in SEEDS.findall(note) for s in m.split(",") if s}
    return (",".join(map(str, sorted(found))) if found else "0") + (
        f" ({jobs[1]} of {jobs[2]} jobs)" if jobs else "")


def judged(gpu_docs: Path) -> list[Judged]:
    """Every claim of every kept run, oldest first; a damaged run is skipped with a warning."""
    found = []
    for kept in sorted(gpu_records.kept_leases(gpu_docs),
                       key=lambda k: (k.folder.name, k.folder.parent.name)):
        path = kept.folder / gpu_records.CLAIMS
        if not path.exists():
            continue
        try:
            rows = gpu_records.read_claims(path)
        except gpu_records.RecordError as e:
            gpu_records.warn(f"{e}; its claims are skipped")
            continue
        whys = _whys(kept.folder)
        for row in rows:
            found.append(Judged(row["claim"], row["experiment"], row.get("paper", ""),
                                row.get("ours", ""), row.get("spread", ""), row.get("holds", ""),
                                kept.folder.parent.name,
                                kept.folder.name, kept.lease["commit"], kept.lease["engine"],
                                _seeds(kept.lease, kept.summary, row["experiment"],
                                       row.get("left out", "")), _why(whys, row)))
    return found


def _whys(folder: Path) -> dict[tuple[str, str], str] | None:
    """(experiment, claim) -> why from the lease's attribution table; None without one."""
    try:
        with open(gpu_records.beside(folder, gpu_records.ATTRIBUTION_TABLE), newline="") as f:
            return {(r.get("experiment", ""), r.get("claim", "")): r.get("why", "")
                    for r in csv.DictReader(f) if r.get("kind") == "claim"}
    except (OSError, ValueError, csv.Error):
        return None


def _why(whys: dict | None, row: dict) -> str:
    if row.get("holds", "").strip() == "yes":
        return ""
    if whys is None:
        return "not attributed (no attribution beside the lease)"
    return whys.get((row.get("experiment", ""), row.get("claim", ""))) or "not attributed"


def newest(rows: list[Judged]) -> tuple[list[Judged], list[Judged]]:
    """(each claim's newest judgement per device, the others), runs sorted by folder date."""
    latest = {(row.claim, row.device): row for row in sorted(rows, key=lambda r: r.run)}
    current = set(latest.values())
    order = {claim: i for i, claim in enumerate(dict.fromkeys(r.claim for r in rows))}
    key = (lambda r: (order[r.claim], r.device, r.run))
    return sorted(current, key=key), sorted((r for r in rows if r not in current), key=key)


def section(gpu_docs: Path) -> str:
    """The newest run per device for every claim, then the history."""
    current, history = newest(judged(gpu_docs))
    def link(r: Judged) -> str:
        return f"[{r.run}](gpu/{r.device}/{r.run}/README.md)"

    how = ("Per claim and device, the newest kept run that judged it "
           "(`docs/gpu/<device>/<run>/claims.csv`); engine: the engine the run measured (eager, or "
           "replaying CUDA graphs), seeds: the seeds its sweep ran (and the jobs it stands on "
           "where the sweep did not finish), spread: over them (none with one seed); why: for a "
           "claim that does not hold, the part the device explains and the part our engine does "
           "(`docs/gpu/<device>/<run>.attribution.md`, `python -m "
           "sarathi_lab.analysis.attribute`). Older runs follow as history.")
    lines = [BEGIN, "", "### Every claim on the newest GPU run of each device", "", how, "",
             ("| claim | paper | device | run (commit) | engine | seeds | measured | spread | "
              "holds? | why |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {cell(r.claim)} | {cell(r.paper)} | {r.device.upper()} | {link(r)} "
              f"(`{r.commit}`) | {cell(r.engine)} | {cell(r.seeds)} | {cell(r.ours)} | "
              f"{cell(r.spread)} | {cell(r.holds)} | {cell(r.why)} |" for r in current]
    if history:
        lines += ["", "History: the same claims on older runs.", "",
                  "| claim | device | run (commit) | engine | seeds | measured | holds? | why |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {cell(r.claim)} | {r.device.upper()} | {link(r)} (`{r.commit}`) | "
                  f"{cell(r.engine)} | {cell(r.seeds)} | {cell(r.ours)} | {cell(r.holds)} | "
                  f"{cell(r.why)} |" for r in history]
    judged_here = {r.experiment for r in current}
    waiting = [r.name for r in registry.RESULTS if r.gpu is not None and r.name not in judged_here]
    if waiting:
        lines += ["", "Not judged on any GPU yet: " + ", ".join(f"`{n}`" for n in waiting)
                  + " (their steps wait in the GPU queue: "
                  "`python -m sarathi_lab.measure.gpu --next`)."]
    return "\n".join([*lines, "", END])


def write(results_md: Path, gpu_docs: Path) -> Path:
    """Rewrites ``results_md`` between MARKERS (placed by hand once); ValueError without them."""
    text = results_md.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{results_md} is invalid: it has no section between {BEGIN!r} and "
                         f"{END!r} to rewrite")
    results_md.write_text(text[:start] + section(gpu_docs) + text[end + len(END):])
    return results_md
