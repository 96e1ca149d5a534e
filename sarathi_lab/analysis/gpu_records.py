"""The GPU suite's files, one schema for every reader; a failure is a one-line RecordError."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from sarathi_lab.output_files import COLLECTED, Outputs
from sarathi_lab.provenance import Provenance

# The suite's files in its out directory, archive and kept lease folders.
SUMMARY, LEASE_FILE, CLAIMS = "summary.json", COLLECTED, "claims.csv"
# What is derived from a lease, not collected, sits beside its folder, which stays as collected:
# <device>/<lease>.<name>: the attribution's table and page, the lease's sweeps at the floors.
ATTRIBUTION_TABLE, ATTRIBUTION_PAGE = "attribution.csv", "attribution.md"
FLOOR_CLAIMS = "floor_claims.csv"
# Any file of the suite, from an archive or disk.
MAX_FILE_BYTES = 16 << 20
# One part of a name the suite writes: what every filesystem takes.
NAME_PART = re.compile(r"[A-Za-z0-9_.=,+-]{1,128}")
# A commit as a lease's folder carries it (git hex, or SARATHI_COMMIT), never a path.
COMMIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
# config.device_slug of the GPU's name.
DEVICE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
LEASE = re.compile(r"(\d{4}-\d{2}-\d{2})_([A-Za-z0-9._+-]{1,200})")
# failed: error recorded; incomplete: killed or out of time; unavailable: not in checkout.
STATUSES = ("done", "failed", "incomplete", "unavailable")
# Times are the GPU machine's clock: a little ahead is skew, more is damage.
CLOCK_SKEW_S = 3600.0


def beside(folder: Path, name: str) -> Path:
    return folder.parent / f"{folder.name}.{name}"


def derived_outputs(folder: Path, names: tuple[str, ...], made: Provenance,
                    force: bool) -> Outputs:
    """What is derived from the lease in ``folder`` (a link or '.' resolved): beside its folder,
    never in it."""
    folder = Path(folder).resolve()
    return Outputs(folder.parent, {beside(folder, name).name: made for name in names},
                   given=f"the lease {folder}", force=force,
                   how="--force replaces them")


class RecordError(ValueError):
    """A suite file that is not what the suite writes; one line."""


@dataclass
class Metric:
    metric: str
    value: float | str | None
    unit: str = ""
    target: str = ""
    holds: bool | None = None


@dataclass
class StepResult:
    step: str
    status: str
    started_at: float
    seconds: float
    metrics: list[Metric] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    commit: str = ""  # the code it ran (fixes land between calls)
    device: str = ""  # cuda, or cpu in a dry run
    code: str = ""


@dataclass(frozen=True)
class Summary:
    suite: dict[str, Any]  # the call's settings (dry_run, commit, budget_min, started, own, ...)
    steps: list[StepResult]


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error shows it: one line, bounded."""
    text = " ".join(repr(value)[:limit * 4].split())
    return text if len(text) <= limit else text[:limit] + "..."


def invalid(where: str, key: str, value: Any, allowed: str) -> RecordError:
    return RecordError(f"{where} is invalid: {key}={shown(value)}: must be {allowed}")


def _get(data: dict, where: str, prefix: str, key: str, check, allowed: str,
         default: Any = ...) -> Any:
    """``data[key]`` where ``check`` accepts it; ``default`` where missing (required without)."""
    if key not in data:
        if default is ...:
            raise RecordError(f"{where} is invalid: {prefix}{key} is missing: must be {allowed}")
        return default
    if not check(data[key]):
        raise invalid(where, prefix + key, data[key], allowed)
    return data[key]


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and all(p not in (".", "..") and NAME_PART.fullmatch(p)
                                          for p in value.split("/"))


def metric(data: Any, where: str, prefix: str) -> Metric:
    if not isinstance(data, dict):
        raise invalid(where, prefix.rstrip("."), data,
                      "a mapping of metric, value, unit, target, holds")
    get = partial(_get, data, where, prefix)
    holds = get("holds", lambda v: v in (None, True, False, "True", "False"),
                "true, false or null", None)
    return Metric(get("metric", lambda v: isinstance(v, str) and v != "", "a name"),
                  get("value", lambda v: v is None or isinstance(v, (str, int, float)),
                      "a number, a string or null"),
                  get("unit", _is_str, "a string", ""), get("target", _is_str, "a string", ""),
                  # An older suite wrote numpy's bools as text.
                  holds if not isinstance(holds, str) else holds == "True")


def step_result(data: Any, where: str, prefix: str = "") -> StepResult:
    """result.json, or summary.json's step at ``prefix``."""
    if not isinstance(data, dict):
        raise invalid(where, prefix.rstrip(".") or "its content", data,
                      "a mapping (a step's record)")
    get = partial(_get, data, where, prefix)
    metrics = get("metrics", lambda v: isinstance(v, list), "a list of metrics", [])
    notes = get("notes", lambda v: isinstance(v, list) and all(map(_is_str, v)),
                "a list of strings", [])
    text = {key: get(key, _is_str, "a string", "") for key in ("error", "commit", "device", "code")}
    return StepResult(
        get("step", _is_name, "a step's name (A-Z a-z 0-9 _ . = , + -)"),
        get("status", lambda v: v in STATUSES, "one of " + ", ".join(STATUSES)),
        get("started_at", lambda v: is_number(v) and 0 <= v <= time.time() + CLOCK_SKEW_S,
            "a time in seconds since 1970, not in the future"),
        get("seconds", lambda v: is_number(v) and v >= 0, "a number >= 0", 0.0),
        [metric(m, where, f"{prefix}metrics[{i}].")
         for i, m in enumerate(metrics)], list(notes), **text)


def summary(data: Any, where: str) -> Summary:
    if not isinstance(data, dict):
        raise invalid(where, "its content", data, "a mapping of suite and steps")
    suite = _get(data, where, "", "suite", lambda v: isinstance(v, dict), "a mapping", {})
    checks = {"dry_run": (lambda v: isinstance(v, bool), "true or false"),
              "own": (lambda v: isinstance(v, bool), "true or false"),
              "commit": (_is_str, "a string"), "started": (_is_str, "a string"),
              "budget_min": (lambda v: v is None or (is_number(v) and v > 0),
                             "minutes > 0 or null")}
    for key, (check, allowed) in checks.items():
        _get(suite, where, "suite.", key, check, allowed, None)
    steps = _get(data, where, "", "steps", lambda v: isinstance(v, list), "a list of step records",
                 [])
    results = [step_result(s, where, f"steps[{i}].") for i, s in enumerate(steps)]
    names = [result.step for result in results]
    if twice := next((i for i, name in enumerate(names) if name in names[:i]), None):
        raise invalid(where, f"steps[{twice}].step", names[twice],
                      "one record per step: it occurs twice")
    return Summary(suite, results)


def lease(data: Any, where: str) -> dict[str, Any]:
    """lease.json (gpu.collect's lease_record); unknown keys are a newer suite's, kept."""
    if not isinstance(data, dict):
        raise invalid(where, "its content", data, "a mapping (a lease's record)")
    names = (lambda v: isinstance(v, list) and all(map(_is_name, v)), "a list of names")
    checks = {"device": (lambda v: isinstance(v, str) and DEVICE.fullmatch(v),
                         "a device's folder name"),
              "machine": (_is_str, "a string"), "engine": (_is_str, "a string"),
              "lease": (_is_lease, "<date>_<commit>, the date not in the future"),
              "commit": (lambda v: isinstance(v, str)
                         and all(COMMIT.fullmatch(c) for c in v.split("+")), "commits joined by +"),
              "steps_done": names, "profiles": names,
              "steps_not_done": (lambda v: isinstance(v, dict) and all(map(_is_name, v))
                                 and all(map(_is_str, v.values())),
                                 "a mapping of step names to statuses")}
    for key, (check, allowed) in checks.items():
        _get(data, where, "", key, check, allowed)
    if not data["lease"].endswith("_" + data["commit"]):
        raise invalid(where, "commit", data["commit"],
                      f"the commit its lease {data['lease']!r} names")
    return data


def _is_lease(value: Any) -> bool:
    if not (isinstance(value, str) and (m := LEASE.fullmatch(value)) and _is_name(value)):
        return False
    try:
        day = time.strptime(m[1], "%Y-%m-%d")
    except ValueError:
        return False
    latest = time.gmtime(time.time() + CLOCK_SKEW_S)
    return time.strftime("%Y-%m-%d", day) <= time.strftime("%Y-%m-%d", latest)


# claims.csv (analysis.claims.COLUMNS): a row needs these.
CLAIM_KEYS = ("experiment", "claim")


def csv_rows(data: bytes, where: str) -> tuple[list[dict[str, str]], list[str]]:
    """A lease's CSV file as rows of text and its header, or a one-line RecordError."""
    try:
        reader = csv.DictReader(io.StringIO(data.decode(), newline=""))
        rows = list(reader)
        header = reader.fieldnames or []
    except UnicodeDecodeError:
        raise RecordError(f"{where} is invalid: not UTF-8 text") from None
    except csv.Error as e:
        raise RecordError(f"{where} is invalid: not a CSV table ({e})") from None
    return rows, header


def claims(data: bytes, where: str) -> list[dict[str, str]]:
    rows, header = csv_rows(data, where)
    if missing := [k for k in CLAIM_KEYS if k not in header]:
        raise RecordError(f"{where} is invalid: its header {shown(header)} "
                          f"lacks {missing[0]!r}: must name "
                          + ", ".join(CLAIM_KEYS))
    for i, row in enumerate(rows, 2):
        if None in row:
            raise invalid(where, f"line {i}", row[None],
                          f"no more cells than its header's {len(header)}")
        if not row["claim"]:
            raise invalid(where, f"line {i}.claim", row["claim"], "a claim's text")
    return [{k: v or "" for k, v in row.items()} for row in rows]


def read_bytes(path: Path) -> bytes:
    """At most MAX_FILE_BYTES; a FIFO is refused, never waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise RecordError(f"{path} is unreadable ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            raise RecordError(f"{path} is invalid: " + ("not a regular file"
                                                        if not stat.S_ISREG(info.st_mode)
                              else f"{info.st_size} bytes, more than the {MAX_FILE_BYTES >> 20} "
                              "MiB of any file the suite writes"))
        try:
            return f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise RecordError(f"{path} is unreadable ({e.strerror or e})") from None


def parse_json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"{where} is invalid: not JSON "
                          f"({' '.join(str(e).split())[:120]})") from None


def read(path: Path, parse) -> Any:
    return parse(parse_json(read_bytes(path), str(path)), str(path))


def read_claims(path: Path) -> list[dict[str, str]]:
    return claims(read_bytes(path), str(path))


def _is_rate(value: Any) -> bool:
    return is_number(value) and value > 0


# The env step's rates (env.json, and its result.json's metrics of the same names): what the
# floors divide by, so finite and above zero. A memory ceiling is the read rate, else the copy rate.
RATES = {"matmul_tflops": "a rate in TFLOP/s: a finite number > 0",
         "read_gbps": "a rate in GB/s: a finite number > 0",
         "copy_gbps": "a rate in GB/s: a finite number > 0"}
MEMORY_RATES = ("read_gbps", "copy_gbps")
ENV_FILE = "env.json"


def env(data: Any, where: str) -> dict[str, Any]:
    """env.json (steps/env.py's record): every rate it holds checked; other keys kept."""
    if not isinstance(data, dict):
        raise invalid(where, "its content", data, "a mapping (the env step's record)")
    for key, allowed in RATES.items():
        _get(data, where, "", key, _is_rate, allowed, None)
    return data


def read_env(step_dir: Path) -> dict[str, Any]:
    """The env step's rates: env.json's, then its result.json's metrics of the same names over
    them; every rate checked in the file that holds it, matmul_tflops and a memory rate required."""
    record = dict(read(step_dir / ENV_FILE, env))
    where = str(step_dir / ENV_FILE)
    result_path = step_dir / "result.json"
    if os.path.lexists(result_path):
        result = read(result_path, step_result)
        for i, m in enumerate(result.metrics):
            if m.metric in RATES:
                if not _is_rate(m.value):
                    raise invalid(str(result_path), f"metrics[{i}].value ({m.metric})", m.value,
                                  RATES[m.metric])
                record[m.metric] = m.value
    if "matmul_tflops" not in record:
        raise RecordError(f"{where} is invalid: matmul_tflops is missing (nor in its result.json's "
                          f"metrics): must be {RATES['matmul_tflops']}")
    if not any(key in record for key in MEMORY_RATES):
        raise RecordError(f"{where} is invalid: read_gbps and copy_gbps are missing (nor in its "
                          f"result.json's metrics): must hold one, {RATES['copy_gbps']}")
    return record


# A step's metrics a reader computes with, by name before '[': ms times are physical.
_MS = (lambda v: _is_rate(v), "a time in ms: a finite number > 0")
METRIC_VALUES = {"engine_ms": _MS, "eager_ms": _MS, "graph_ms": _MS, "floor_ms": _MS,
                 "sequential_floor_ms": _MS,
                 "engine_graph_tokens": (lambda v: isinstance(v, int) and not isinstance(v, bool)
                                         and v >= 0, "a token count: an integer >= 0")}


def checked_values(result: StepResult, where: str) -> dict[str, Metric]:
    """A step's metrics by name, each METRIC_VALUES names checked (None: not measured)."""
    found = {}
    for i, m in enumerate(result.metrics):
        check = METRIC_VALUES.get(m.metric.split("[", 1)[0])
        if check is not None and m.value is not None and not check[0](m.value):
            raise invalid(where, f"metrics[{i}].value ({m.metric})", m.value, check[1])
        found[m.metric] = m
    return found


_warned: set[str] = set()


def warn(message: str) -> None:
    """Once per message: readers poll the same files."""
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Kept:
    """A kept lease, its records read and checked."""
    folder: Path
    lease: dict[str, Any]
    summary: Summary


def kept_leases(gpu_docs: Path) -> list[Kept]:
    """Every kept lease by device then lease; a damaged one is skipped with a warning."""
    found = []
    for folder in sorted(p for p in Path(gpu_docs).glob("*/*") if p.is_dir()
                         and not p.is_symlink()):
        try:
            record = read(folder / LEASE_FILE, lease)
            if (record["device"], record["lease"]) != (folder.parent.name, folder.name):
                raise invalid(str(folder / LEASE_FILE), "device, lease",
                              (record["device"], record["lease"]),
                              f"its folder's ({folder.parent.name!r}, {folder.name!r})")
            found.append(Kept(folder, record, read(folder / SUMMARY, summary)))
        except RecordError as e:
            warn(f"{e}; the lease is skipped")
    return found


# Markdown's and HTML's active characters as themselves: no tag, link or column break.
_PLAIN = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;",
                        **{c: "\\" + c for c in "\\`*_~[]|"}})
_AUTOLINK = re.compile(r"(?i)(://|www\.)")


def cell(text: Any) -> str:
    """``text`` as plain text in one table cell."""
    flat = " ".join(str(text).split()).translate(_PLAIN)
    return _AUTOLINK.sub(lambda m: m[1].replace("/", "&#47;").replace(".", "&#46;"), flat)


# In a page's prose, what could start a tag, an entity or a link; '<=' and code spans stay.
_ACTIVE = re.compile(r"<(?=[A-Za-z/!?])|&(?=#|\w+;)|[\\\[\]]")


def prose(text: Any) -> str:
    """``text`` of a lease (a claim, a device's name) as plain text on one line of a page."""
    flat = _ACTIVE.sub(lambda m: {"<": "&lt;", "&": "&amp;"}.get(m[0], "\\" + m[0]),
                       " ".join(str(text).split()))
    return _AUTOLINK.sub(lambda m: m[1].replace("/", "&#47;").replace(".", "&#46;"), flat)
