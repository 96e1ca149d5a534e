"""A run directory's contract; files renamed into place, metrics.json last: no false finish."""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sarathi_lab.engine.metrics import ITERATION_COLUMNS, REQUEST_COLUMNS
from sarathi_lab.executors import recorded_as, recorded_label

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

METRICS = "metrics.json"
WANDB_DIR = "wandb"
STATUS = "status.json"
log = logging.getLogger(__name__)
SWEEP_SUMMARY = "sweep_summary.json"
SWEEP_TABLE = "sweep_summary.csv"
CAPACITY_JSON = "capacity.json"
EXPORT = "export"
Status = Literal["running", "ok", "skipped", "failed", "interrupted", "killed"]

# Old metric names (before they carried units) to today's: old and new runs load as one table.
RENAMED = {
    **{f"{old}_throughput": f"{old}_throughput_tok_s" for old in ("prefill", "decode", "total")},
    **{f"{old}_p{p}": f"{new}_p{p}_s"
       for old, new in (("ttft", "ttft"), ("tbt", "itl"), ("e2e", "e2el"))
       for p in (50, 90, 99)},
    **ITERATION_COLUMNS, **REQUEST_COLUMNS, "ttft": "ttft_s", "e2e": "e2el_s",
    "capacity_qps": "capacity_rps", "lowest_failing_qps": "lowest_failing_rps", "qps": "rate_rps",
    "profile_seconds": "profile_wall_s", "outside_forward_share": "overhead_fraction",
}


@dataclass
class RunResult:
    summary: dict[str, float]
    config: dict[str, Any]
    environment: dict[str, Any]
    overrides: list[str]
    resolved_config: dict[str, Any]
    partial: bool
    wall_time_s: float
    inputs: dict[str, Any] = field(default_factory=dict)


def is_finished(run_dir: Path) -> bool:
    return (run_dir / METRICS).is_file()


def next_dir(run_dir: Path) -> Path:
    return run_dir.parent / f".{run_dir.name}.next"


def config_change(run_dir: Path, resolved_config: dict[str, Any],
                  inputs: dict[str, Any] | None = None) -> str | None:
    """The first differing key as "key: old -> new"; no recorded inputs count as unknown ones."""
    record, inputs = read_record(run_dir / METRICS), inputs or {}
    old, new = _flatten("", record["resolved_config"]), _flatten("", resolved_config)
    for key in sorted(old.keys() | new.keys()):
        # What a run does with its directory, or writes beside its results, changes no measure.
        ignored = key == "on_existing" or key.startswith(f"{EXPORT}.")
        if not ignored and old.get(key) != new.get(key):
            return f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
    recorded = record.get("inputs") if isinstance(record.get("inputs"), dict) else {}
    for key in sorted(inputs.keys() | recorded.keys()):
        if recorded.get(key) != inputs.get(key):
            was = "unrecorded" if key not in recorded else repr(recorded[key])
            return f"{key}: {was} -> {inputs.get(key)!r}"
    return None


def result_files(run_dir: Path) -> list[Path]:
    return [*run_dir.glob("metrics*.json"), *run_dir.glob("*.parquet")]


def clear_results(run_dir: Path) -> None:
    # metrics.json first: from that moment on the directory no longer claims a finished run.
    for path in sorted(result_files(run_dir), key=lambda p: p.name != METRICS):
        path.unlink()


def write_results(run_dir: Path, tables: dict[str, pd.DataFrame | pa.Table],
                  result: RunResult) -> None:
    suffix = ".partial" if result.partial else ""
    written = []
    try:
        for name, table in tables.items():
            path = run_dir / f"{name}{suffix}.parquet"
            write_atomically(path, lambda tmp, table=table: _write_parquet(table, tmp))
            written.append(path)
        write_json(run_dir / f"metrics{suffix}.json", asdict(result))
    except BaseException:
        # Half a result: removed, which also gives a full disk room for the failed status.
        for path in written:
            with suppress(OSError):
                path.unlink()
        raise


def _write_parquet(table: pd.DataFrame | pa.Table, path: Path) -> None:
    if hasattr(table, "to_parquet"):
        table.to_parquet(path, index=False)
        return
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def write_status(run_dir: Path, status: Status, error: str | None = None,
                 traceback: str | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"status": status, "time": time.time(), "error": error, "traceback": traceback}
    try:
        write_json(run_dir / STATUS, record)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not (run_dir / STATUS).is_file():
            raise
        # A full disk: rewritten in place, so a run that failed never stays `running`.
        with open(run_dir / STATUS, "r+") as f:
            f.write(json.dumps(record | {"traceback": None}))
            f.truncate()


def read_status(run_dir: Path) -> dict[str, Any] | None:
    return read_json(run_dir / STATUS)


def read_json(path: Path, warn: bool = False) -> Any:
    """Only a regular file is read: a FIFO would wait for a writer forever."""
    try:
        if path.exists() and not path.is_file():
            raise IsADirectoryError(f"{path} is not a regular file")
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        if warn:
            log.warning("%s is unreadable (%s); left out", path, e)
        return None


def lock(path: Path, flags: int = os.O_RDONLY) -> int | None:
    """A flock the kernel drops however its holder dies; None on a filesystem without locks."""
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if isinstance(e, BlockingIOError):
            raise
        return None
    return fd


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """A reader sees the old file or the new one whole."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        with suppress(FileNotFoundError):
            tmp.unlink()


def write_json(path: Path, payload: dict) -> None:
    # NaN is not JSON; null keeps every reader (pandas, jq, browsers) happy.
    text = json.dumps(_nan_to_none(payload), indent=2, default=str)
    write_atomically(path, lambda tmp: tmp.write_text(text))


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


class UnreadableRun(ValueError):
    """A finished run's records that cannot be read."""


def read_record(path: Path) -> dict[str, Any]:
    try:
        if path.exists() and not path.is_file():
            raise ValueError("not a regular file")
        record = json.loads(path.read_text())
        for key in ("config", "summary", "environment", "overrides", "resolved_config"):
            if not isinstance(record[key], list if key == "overrides" else dict):
                raise TypeError(f"{key} is not a {'list' if key == 'overrides' else 'mapping'}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        what = f"lacks {e}" if isinstance(e, KeyError) else (str(e) or type(e).__name__)
        raise UnreadableRun(f"{path} is unreadable ({what})") from None
    return record


def is_read(relative: Path) -> bool:
    """Not W&B's copy, nor under a dot folder (stale jobs, a rerun's, Hydra's)."""
    folders = relative.parts[:-1]
    return WANDB_DIR not in folders and not any(part.startswith(".") for part in folders)


def load_runs(root: str | Path, table: str = "summary", strict: bool = False) -> pd.DataFrame:
    """An unreadable run is left out with a warning (``strict``: raised)."""
    import pandas as pd

    frames = []
    for path in sorted(Path(root).rglob(METRICS), key=natural_order):
        if not is_read(path.relative_to(root)):
            continue
        try:
            record = read_record(path)
            keys = {"run_dir": str(path.parent)} | record["config"] | _override_columns(record)
            if table == "summary":
                env = {f"env.{k}": v for k, v in record["environment"].items()}
                frames.append(pd.DataFrame([keys | current_names(record["summary"]) | env]))
            elif (file := path.parent / f"{table}.parquet").exists():
                try:
                    rows = pd.read_parquet(file)
                except (OSError, ValueError) as e:
                    said = " ".join(str(e).split())[:200]
                    raise UnreadableRun(f"{file} is unreadable ({said})") from None
                # Only these had the old names; a measurement task's "start" is its own.
                if table in ("iterations", "requests", "trials"):
                    rows = rows.rename(columns=current_names)
                frames.append(rows.assign(**keys))
        except UnreadableRun as e:
            if strict:
                raise
            log.warning("%s; left out", e)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def current_names(names: Any) -> Any:
    if isinstance(names, str):
        return RENAMED.get(names, names)
    return {RENAMED.get(k, k): v for k, v in names.items()}


# The one way every table and figure names where a run's numbers come from.
def simulated_source(device: str, cost_model: str, tp: int = 1, pp: int = 1) -> str:
    """'simulated 2 x A100 (roofline, tensor parallel)'."""
    tp, pp = int(tp), int(pp)
    if pp > 1:
        return f"simulated {tp * pp} x {device.upper()} ({cost_model}, TP{tp} x PP{pp})"
    return (f"simulated {device.upper()} ({cost_model})" if tp == 1
            else f"simulated {tp} x {device.upper()} ({cost_model}, tensor parallel)")


def run_source(executor: Mapping[str, Any], device: str | None) -> str:
    """'measured CPU', 'measured GPU', 'measured CPU, vLLM 0.32.0' or a simulated_source."""
    if recorded_as(executor.get("executor"), "simulated"):
        return simulated_source(str(executor.get("sim_device", "unrecorded")),
                                str(executor.get("sim_cost_model", "unrecorded")),
                                executor.get("sim_tp") or 1, executor.get("sim_pp") or 1)
    measured = "measured GPU" if str(device or "").startswith("cuda") else "measured CPU"
    if label := recorded_label(executor.get("executor")):
        # Another engine's numbers must not read as this one's.
        version = executor.get("vllm_version")
        return f"{measured}, {label}" + (f" {version}" if version else "")
    return measured


def natural_order(path: Path) -> list:
    """Job dirs 2_... before 10_...."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def override_key(override: str) -> str:
    """'chunk' of 'chunk=256', 'workload.cv' of '+workload.cv=2', 'logger' of '~logger'."""
    return override.split("=", 1)[0].lstrip("+~")


def _override_columns(record: dict) -> dict[str, Any]:
    columns = {}
    for override in record["overrides"]:
        key = override_key(override)
        value = record["resolved_config"]
        for part in key.replace("/", ".").split("."):
            value = value.get(part) if isinstance(value, dict) else None
        # A key the config records is its column; a group choice it does not name
        # (workload=staggered, recorded as its kind, synthetic) is told apart by its resolved keys.
        choice = override.split("=", 1)[-1]
        named = key in record["config"] and (not isinstance(value, dict)
                                             or choice == str(record["config"][key]))
        if key.startswith("hydra") or named:
            continue
        columns |= {k: v for k, v in _flatten(key, value).items() if k not in record["config"]}
    return columns


def _flatten(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for sub, val in value.items()
                for k, v in _flatten(f"{key}.{sub}" if key else sub, val).items()}
    return {key: value}
