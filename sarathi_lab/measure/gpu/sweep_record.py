"""What a lease's paper sweeps ran, kept in lease.json so a claim says what it stands on."""
from __future__ import annotations

import re

# paper/<experiment>/multiruns/<sweep>/<job>/metrics.json, and the sweep's launch record.
RUN = re.compile(r"^paper/([\w.-]+)/multiruns/[^/]+/[^/]+/metrics\.json$")
LOCK = re.compile(r"^paper/([\w.-]+)/multiruns/[^/]+/\.sweep\.lock$")


def _seed(record: dict) -> int | None:
    for key in ("config", "resolved_config"):
        section = record.get(key)
        if isinstance(section, dict) and isinstance(section.get("seed"), int):
            return section["seed"]
    return None


def sweeps(runs: dict[str, dict], locks: dict[str, dict]) -> dict[str, dict]:
    """Per experiment: sorted ``seeds``, ``jobs_finished`` and ``jobs_planned``."""
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
