"""The claims as each GPU measured them, newest per device, older as history (RESULTS.md)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sarathi_lab import output_files
from sarathi_lab.analysis import gpu_records, gpu_rejudge, gpu_tables, registry
from sarathi_lab.analysis.gpu_records import Summary, cell
from sarathi_lab.analysis.verdict import WORDS, words_markdown

BEGIN = ("<!-- gpu-claims: written by python -m sarathi_lab.measure publish --gpu-claims; "
         "edits here are replaced -->")
END = "<!-- /gpu-claims -->"
# Where RESULTS.md lists what each verdict word means (verdict.WORDS), rewritten beside the claims.
WORDS_BEGIN = ("<!-- verdict-words: written by python -m sarathi_lab.measure publish --gpu-claims "
               "from sarathi_lab/analysis/verdict.py; edits here are replaced -->")
WORDS_END = "<!-- /verdict-words -->"
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
    versus: str = ""   # ours / paper at each point judged (analysis/verdict.py)
    recorded: str = ""   # the verdict the lease's claims.csv records, where it differs


# The repeats a point needs for its verdict to rest on a spread.
REPEATS = 3
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
            readers = next((r.rejudge for r in registry.RESULTS if r.name == row["experiment"]),
                           {})
            holds, versus, spread = gpu_rejudge.rejudge(row, kept.folder, readers)
            recorded = row.get("holds", "") if holds in WORDS else holds
            seeds = _seeds(kept.lease, kept.summary, row["experiment"], row.get("left out", ""))
            found.append(Judged(row["claim"], row["experiment"], row.get("paper", ""),
                                row.get("ours", ""), spread, _unrepeated(holds, seeds),
                                kept.folder.parent.name,
                                kept.folder.name, kept.lease["commit"], kept.lease["engine"],
                                seeds, _why(whys, row | {"holds": holds}, row.get("holds", "")),
                                versus, recorded if recorded != holds else ""))
    return found


def _unrepeated(holds: str, seeds: str) -> str:
    """A verdict on fewer than REPEATS seeds says how many: its spread is short or unknown."""
    count = len([s for s in seeds.split(" (")[0].split(",") if s.strip()])
    judged = holds in WORDS and holds not in ("n/a", "unclear")
    return (f"{holds} ({count} seed{'s' * (count != 1)})" if judged and count < REPEATS
            else holds)


WHY_COLUMNS = {name: gpu_tables.TEXT for name in ("kind", "experiment", "claim", "why")}


def _whys(folder: Path) -> dict[tuple[str, str], str] | None:
    """(experiment, claim) -> why from the lease's attribution table; None without one, or with a
    damaged one (warned)."""
    path = gpu_records.beside(folder, gpu_records.ATTRIBUTION_TABLE)
    if not os.path.lexists(path):
        return None
    try:
        rows = gpu_tables.read_table(path, WHY_COLUMNS)
    except gpu_records.RecordError as e:
        gpu_records.warn(f"{e}; its whys are skipped")
        return None
    return {(r["experiment"], r["claim"]): r["why"] for r in rows if r["kind"] == "claim"}


def _why(whys: dict | None, row: dict, recorded: str = "") -> str:
    if row.get("holds", "").strip() == "yes":
        return ""
    if whys is None:
        return "not attributed (no attribution beside the lease)"
    found = whys.get((row.get("experiment", ""), row.get("claim", "")))
    if not found and recorded.strip() == "yes":
        return ("not attributed (the lease's attribution covers the claims its recorded verdict "
                "left short of yes)")
    return found or "not attributed"


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
           "where the sweep did not finish), spread: over them (none with one seed; a verdict on "
           "fewer than three seeds says how many); ours / paper and holds?: judged both ways "
           "by `sarathi_lab/analysis/verdict.py` (the words are explained above), a run's row "
           "written before that re-judged from the numbers "
           "it states (`sarathi_lab/analysis/gpu_rejudge.py`), its recorded verdict beside it "
           "where that differs; why: for a claim not judged yes, the part the device explains "
           "and the part our engine does (`docs/gpu/<device>/<run>.attribution.md`, `python -m "
           "sarathi_lab.measure attribute`). Older runs follow as history.")
    lines = [BEGIN, "", "### Every claim on the newest GPU run of each device", "", how, "",
             ("| claim | paper | device | run (commit) | engine | seeds | measured | ours / paper "
              "| spread | holds? | why |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {cell(r.claim)} | {cell(r.paper)} | {r.device.upper()} | {link(r)} "
              f"(`{r.commit}`) | {cell(r.engine)} | {cell(r.seeds)} | {cell(r.ours)} | "
              f"{cell(r.versus)} | {cell(r.spread)} | {cell(_holds(r))} | {cell(r.why)} |"
              for r in current]
    if history:
        lines += ["", "History: the same claims on older runs.", "",
                  ("| claim | device | run (commit) | engine | seeds | measured | ours / paper | "
                   "holds? | why |"),
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {cell(r.claim)} | {r.device.upper()} | {link(r)} (`{r.commit}`) | "
                  f"{cell(r.engine)} | {cell(r.seeds)} | {cell(r.ours)} | {cell(r.versus)} | "
                  f"{cell(_holds(r))} | {cell(r.why)} |" for r in history]
    judged_here = {r.experiment for r in current}
    waiting = [r.name for r in registry.RESULTS if r.gpu is not None and r.name not in judged_here]
    if waiting:
        lines += ["", "Not judged on any GPU yet: " + ", ".join(f"`{n}`" for n in waiting)
                  + " (their steps wait in the GPU queue: "
                  "`python -m sarathi_lab.measure gpu --next`)."]
    return "\n".join([*lines, "", END])


def _holds(r: Judged) -> str:
    return r.holds + (f" (recorded: {r.recorded})" if r.recorded else "")


def words_section() -> str:
    return f"{WORDS_BEGIN}\n{words_markdown()}\n{WORDS_END}"


def write(results_md: Path, gpu_docs: Path) -> Path:
    """Rewrites ``results_md`` between BEGIN and END (placed by hand once; ValueError without
    them), and between WORDS_BEGIN and WORDS_END where placed."""
    text = results_md.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{results_md} is invalid: it has no section between {BEGIN!r} and "
                         f"{END!r} to rewrite")
    text = text[:start] + section(gpu_docs) + text[end + len(END):]
    start, end = text.find(WORDS_BEGIN), text.find(WORDS_END)
    if 0 <= start < end:
        text = text[:start] + words_section() + text[end + len(WORDS_END):]
    output_files.write_all({Path(results_md): text.encode()})
    return results_md
