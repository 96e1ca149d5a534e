"""Read an offline W&B run back from its run-*.wandb file (wandb 0.31 keeps config, history and
summary only there, and ships no public reader).

The file is a 7-byte header (":W&B", magic 0xBEE1, version) followed by a LevelDB-style log:
32 KiB blocks of chunks, each with a 7-byte header (crc32 4, length 2, type 1) that a record
spans as FULL, or FIRST, MIDDLE..., LAST; a block tail too short for a chunk header is zero padding.
The crc is zlib's crc32 of the type byte and the chunk.

W&B's service writes the file while the run's process reads it, so a read can end inside a chunk:
the records before it are whole and returned, the torn tail is left for the next read.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from wandb.proto import wandb_internal_pb2

_FILE_HEADER = struct.Struct("<4sHB")
_CHUNK_HEADER = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    run: wandb_internal_pb2.RunRecord | None = None
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    metrics: list = field(default_factory=list)  # define_metric's records (name, step_metric)


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    return parse_records(Path(path).read_bytes(), str(path))


def parse_records(data: bytes, name: str = "W&B file") -> list[wandb_internal_pb2.Record]:
    """The whole records in data, which may end anywhere in the file W&B is still writing."""
    if len(data) < _FILE_HEADER.size:
        return []
    ident, magic, _ = _FILE_HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{name} is not a W&B record log"
    records, pending, pos = [], b"", _FILE_HEADER.size
    while pos + _CHUNK_HEADER.size <= len(data):
        if _BLOCK - pos % _BLOCK < _CHUNK_HEADER.size:
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0:  # zero padding at the end of a block
            pos += _CHUNK_HEADER.size + length
            continue
        start, pos = pos + _CHUNK_HEADER.size, pos + _CHUNK_HEADER.size + length
        if pos > len(data):
            break  # the writer has not finished this chunk yet
        chunk = data[start:pos]
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"{name}: chunk at byte {start} fails its crc"
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def read_offline_run(run_dir: Path, timeout_s: float = 30.0) -> OfflineRun:
    """The run, config, history rows and summary of the one offline W&B run under run_dir.

    W&B's service process writes the file asynchronously and has been seen to return from
    finish() before its records reached the disk, so wait (boundedly) for the exit record."""
    deadline = time.monotonic() + timeout_s
    while True:
        paths = list(Path(run_dir).rglob("run-*.wandb"))
        assert len(paths) <= 1, f"more than one W&B run under {run_dir}: {paths}"
        records = read_records(paths[0]) if paths else []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    assert paths, f"no run-*.wandb under {run_dir} after {timeout_s} s"
    out = OfflineRun()
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.run = record.run
            out.config |= _items(record.run.config.update)
        elif kind == "config":
            out.config |= _items(record.config.update)
        elif kind == "history":
            out.history.append(_items(record.history.item))
        elif kind == "summary":
            out.summary |= _items(record.summary.update)
        elif kind == "metric":
            out.metrics.append(record.metric)
    return out


def inspect_summary(run_dir: Path) -> dict:
    """W&B's own reader of an offline run (`wandb leet inspect --summary --json`): its state,
    config and summary as W&B itself reads them from the run's .wandb file."""
    (path,) = Path(run_dir).rglob("run-*.wandb")
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(path)],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(proc.stdout)


def _items(items) -> dict:
    # Nested keys arrive as nested_key paths; top-level ones as key.
    return {".".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json) for i in items}
