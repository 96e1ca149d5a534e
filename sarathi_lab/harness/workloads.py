"""Request sets fed to the engine: synthetic, uniform or zipf lengths (as vidur), CSV traces."""
from __future__ import annotations

import csv
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sarathi_lab import host_memory
from sarathi_lab.config import AS_WRITTEN, ConfigError
from sarathi_lab.harness import PACKAGE_DIR
from sarathi_lab.harness.arrivals import gamma_arrivals, poisson_arrivals
from sarathi_lab.harness.schema import WorkloadCfg
from sarathi_lab.inputs import ARRIVAL_HORIZON_S

log = logging.getLogger(__name__)

LENGTH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
TRACE_COLUMNS = ("arrived_at", *LENGTH_COLUMNS)

# A prompt token as the engine holds it: a Python int (28 bytes) behind a list slot (8 bytes).
_BYTES_PER_PROMPT_TOKEN = 36

# Independent streams: switching e.g. the arrival process keeps the same lengths and tokens.
_LENGTHS, _ARRIVALS, _TOKENS = range(3)


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    decode_lens: list[int]
    arrival_times: list[float] | None
    max_concurrency: int | None = None
    recorded_rate_rps: float | None = None

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def max_request_len(self) -> int:
        return max(len(p) + d for p, d in zip(self.prompts, self.decode_lens))

    @property
    def total_tokens(self) -> int:
        return sum(len(p) + d for p, d in zip(self.prompts, self.decode_lens))


def split_length(total: int, pd_ratio: float, key: str = "seq_len") -> tuple[int, int]:
    """(prompt, decode) summing to total, their ratio as near pd_ratio as integers allow."""
    decode = round(total / (1 + pd_ratio))
    prompt = total - decode
    if prompt < 1 or decode < 1:
        raise ConfigError(key, total, f"is invalid with pd_ratio={pd_ratio}: it gives {prompt} "
                          f"prompt and {decode} decode tokens, and both must be >= 1 "
                          f"(prompt + decode = {key}, prompt / decode = pd_ratio)", keys=AS_WRITTEN)
    return prompt, decode


def build_workload(cfg: WorkloadCfg, seq_len: int, pd_ratio: float, seed: int, vocab_size: int,
                   context: int | None = None) -> Workload:
    """Lengths and memory are checked before any request is made."""
    def rng(stream: int) -> np.random.Generator:
        return np.random.default_rng([seed, stream])

    if context is not None and cfg.kind not in ("trace", "trace_lengths") and seq_len > context:
        raise ConfigError("seq_len", seq_len,
                          f"is invalid: more than the model's context of {context} tokens",
                          keys=AS_WRITTEN)
    recorded_rate = None
    if cfg.kind == "trace":
        lengths, recorded = read_recorded_trace(cfg, context)
        _check_memory(cfg, sum(p for p, _ in lengths))
        arrivals, recorded_rate = replay_times(cfg, recorded), mean_rate_rps(recorded)
    elif cfg.kind == "trace_lengths":
        lengths = read_trace_lengths(cfg, context, rng(_LENGTHS))
        _check_memory(cfg, sum(p for p, _ in lengths))
        arrivals = arrival_times(cfg, cfg.qps, seed)
    else:
        _check_memory(cfg, cfg.num_requests * seq_len)
        lengths = _sample_lengths(cfg, seq_len, pd_ratio, rng(_LENGTHS))
        arrivals = arrival_times(cfg, cfg.qps, seed)
        if arrivals and arrivals[-1] > ARRIVAL_HORIZON_S:
            raise ConfigError("workload.qps", cfg.qps,
                              f"is invalid: {cfg.num_requests} requests at that rate arrive over "
                              f"{arrivals[-1]:.3g} s, past the {ARRIVAL_HORIZON_S:g} s a run may "
                              "span; raise workload.qps or lower workload.num_requests",
                              keys=AS_WRITTEN)
    tokens = rng(_TOKENS)
    prompts = [tokens.integers(0, vocab_size, size=p).tolist() for p, _ in lengths]
    return Workload(prompts, [d for _, d in lengths], arrivals, cfg.max_concurrency, recorded_rate)


def _check_memory(cfg: WorkloadCfg, prompt_tokens: int) -> None:
    need = prompt_tokens * _BYTES_PER_PROMPT_TOKEN
    have = host_memory.available().bytes
    if need > have:
        key, value = (("workload.path", cfg.path) if cfg.kind in ("trace", "trace_lengths")
                      else ("workload.num_requests", cfg.num_requests))
        raise ConfigError(key, value, f"is invalid: its prompts need up to {need / 2**30:.1f} "
                          f"GiB as token lists, more than the {have / 2**30:.1f} GiB available",
                          keys=AS_WRITTEN)


def _sample_lengths(cfg: WorkloadCfg, seq_len: int, pd_ratio: float,
                    rng: np.random.Generator) -> list[tuple[int, int]]:
    n = cfg.num_requests
    if cfg.kind == "synthetic":
        prompt, decode = split_length(seq_len, pd_ratio)
        if cfg.stagger > decode:
            raise ConfigError("workload.stagger", cfg.stagger,
                              f"is invalid: seq_len={seq_len} and pd_ratio={pd_ratio} give "
                              f"{decode} decode tokens, and every request needs at least 1",
                              keys=AS_WRITTEN)
        return [(prompt, decode - i if i < cfg.stagger else decode) for i in range(n)]
    if cfg.min_tokens > seq_len:
        raise ConfigError("workload.min_tokens", cfg.min_tokens,
                          f"is invalid: must be <= seq_len={seq_len}", keys=AS_WRITTEN)
    # Both ends must split into a non-empty prompt and decode; the split is monotone in between.
    split_length(cfg.min_tokens, pd_ratio, key="workload.min_tokens")
    split_length(seq_len, pd_ratio)
    choices = np.arange(cfg.min_tokens, seq_len + 1)
    if cfg.kind == "uniform":
        totals = rng.choice(choices, size=n)
    else:
        weights = 1.0 / np.arange(1, len(choices) + 1) ** cfg.theta
        totals = rng.choice(choices, size=n, p=weights / weights.sum())
    return [split_length(int(t), pd_ratio) for t in totals]


def arrival_times(cfg: WorkloadCfg, qps: float, seed: int) -> list[float] | None:
    """One seed's draws at every rate, so that a capacity search compares rates on one pattern."""
    rng = np.random.default_rng([seed, _ARRIVALS])
    if cfg.arrival == "all_at_once":
        return None
    try:
        times = (poisson_arrivals(cfg.num_requests, qps, rng) if cfg.arrival == "poisson"
                 else gamma_arrivals(cfg.num_requests, qps, cfg.cv, rng))
    except (OverflowError, ZeroDivisionError):  # 1 / cv**2 past a float's range
        times = [math.nan]
    if not all(math.isfinite(t) for t in times):
        # Finite settings at a float's extremes (qps=5e-324, cv=1e-160) give gaps of inf or NaN.
        key, value = ("workload.cv", cfg.cv) if cfg.arrival == "gamma" else ("workload.qps", qps)
        raise ConfigError(key, value, f"is invalid: the {cfg.arrival} arrival times it gives at "
                          f"{qps!r} req/s are not finite numbers", keys=AS_WRITTEN)
    return times


def resolve_trace_path(path: str) -> Path:
    """The working directory first, then the package (data/traces/ ships there)."""
    p = Path(path).expanduser()
    for candidate in (p, PACKAGE_DIR / p):
        if candidate.is_file():
            return candidate
    for candidate in (p, PACKAGE_DIR / p):
        # There but no regular file: a directory, device or FIFO (read forever, or nothing).
        if candidate.exists():
            what = ("a directory" if candidate.is_dir()
                    else "not a regular file (a device, a FIFO or a socket)")
            raise ConfigError("workload.path", path, f"is invalid: {candidate} is {what}",
                              "a CSV file", keys=AS_WRITTEN)
    raise ConfigError("workload.path", path, "is invalid: no such file "
                      f"(looked in {Path.cwd()} and {PACKAGE_DIR})", keys=AS_WRITTEN)


def mean_rate_rps(times: list[float]) -> float | None:
    """(n - 1) gaps over the span, as Poisson arrivals count; None: no gap."""
    span = max(times, default=0.0) - min(times, default=0.0)
    return (len(times) - 1) / span if span > 0 else None


def scaled_to_rate(times: list[float], qps: float) -> list[float]:
    """Every gap times one factor, so the trace's burstiness (ratios between gaps) stays."""
    rate = mean_rate_rps(times)
    if rate is None:
        if len(times) > 1:
            raise ValueError(f"the {len(times)} times are all equal: they have no rate to scale")
        return list(times)
    factor = rate / qps
    return [t * factor for t in times]


def arrivals_at(cfg: WorkloadCfg, workload: Workload, qps: float, seed: int) -> list[float] | None:
    if cfg.kind == "trace":
        return scaled_to_rate(workload.arrival_times, qps)
    return arrival_times(cfg, qps, seed)


def read_trace(cfg: WorkloadCfg, context: int | None = None
               ) -> tuple[list[tuple[int, int]], list[float]]:
    lengths, recorded = read_recorded_trace(cfg, context)
    return lengths, replay_times(cfg, recorded)


def read_recorded_trace(cfg: WorkloadCfg, context: int | None = None
                        ) -> tuple[list[tuple[int, int]], list[float]]:
    lengths, arrivals = _read_csv(cfg, context, TRACE_COLUMNS, cfg.num_requests)
    if cfg.num_requests is not None and len(lengths) < cfg.num_requests:
        # Not refused: an experiment's num_requests applies to a trace in its workload's place.
        log.warning("workload.path=%r has %d rows after workload.offset=%d: replaying those, "
                    "fewer than workload.num_requests=%d",
                    cfg.path, len(lengths), cfg.offset, cfg.num_requests)
    start = min(arrivals)
    return lengths, [a - start for a in arrivals]


def replay_times(cfg: WorkloadCfg, recorded: list[float]) -> list[float]:
    key, value = (("workload.qps", cfg.qps) if cfg.qps is not None
                  else ("workload.time_scale", cfg.time_scale))
    if cfg.qps is None:
        times = [t * cfg.time_scale for t in recorded]
    else:
        try:
            times = scaled_to_rate(recorded, cfg.qps)
        except ValueError:
            raise ConfigError("workload.qps", cfg.qps,
                              f"is invalid: the {len(recorded)} replayed rows of "
                              f"workload.path={cfg.path!r} all arrive at once, so they have no "
                              "rate to scale", keys=AS_WRITTEN) from None
    if not all(math.isfinite(t) for t in times):
        raise ConfigError(key, value, "is invalid: it scales the trace's arrival times past the "
                          "largest float", keys=AS_WRITTEN)
    if max(times) > ARRIVAL_HORIZON_S and cfg.qps is not None:
        raise ConfigError("workload.qps", cfg.qps,
                          f"is invalid: the {len(times)} replayed rows of "
                          f"workload.path={cfg.path!r} span {max(times):.3g} s at that rate, past "
                          f"the {ARRIVAL_HORIZON_S:g} s a run may span; raise workload.qps or "
                          "lower workload.num_requests", keys=AS_WRITTEN)
    if max(times) > ARRIVAL_HORIZON_S:
        raise ConfigError("workload.path", cfg.path,
                          f"is invalid: its arrivals span {max(times):.3g} s at "
                          f"workload.time_scale={cfg.time_scale!r}, past the "
                          f"{ARRIVAL_HORIZON_S:g} s a run may span; lower workload.time_scale or "
                          "workload.num_requests", keys=AS_WRITTEN)
    return times


def read_trace_lengths(cfg: WorkloadCfg, context: int | None,
                       rng: np.random.Generator) -> list[tuple[int, int]]:
    """In an order whose every prefix is a sample too: a capacity trial serves a prefix."""
    lengths, _ = _read_csv(cfg, context, LENGTH_COLUMNS, cfg.max_requests)
    picks = rng.choice(len(lengths), size=cfg.num_requests, replace=cfg.num_requests > len(lengths))
    return [lengths[i] for i in picks]


def _read_csv(cfg: WorkloadCfg, context: int | None, columns: tuple[str, ...],
              limit: int | None) -> tuple[list[tuple[int, int]], list[float]]:
    path = resolve_trace_path(cfg.path)
    lengths, arrivals, skipped = [], [], 0
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if missing := [c for c in columns if c not in (reader.fieldnames or [])]:
                raise ConfigError("workload.path", cfg.path,
                                  f"is invalid: line 1 lacks column {missing[0]}; needed: "
                                  f"{', '.join(columns)}", keys=AS_WRITTEN)
            for row in reader:
                if skipped < cfg.offset:
                    skipped += 1
                    continue
                if limit is not None and len(lengths) == limit:
                    break
                where = (cfg.path, reader.line_num)
                if "arrived_at" in columns:
                    arrivals.append(_trace_field(where, row, "arrived_at", float, minimum=0.0))
                lengths.append(tuple(_scaled(cfg, _trace_field(where, row, c, int, minimum=1))
                                     for c in LENGTH_COLUMNS))
                if context is not None and sum(lengths[-1]) > context:
                    raise ConfigError("workload.path", cfg.path,
                                      f"line {reader.line_num}: a request of {sum(lengths[-1])} "
                                      f"tokens is invalid: more than the model's context of "
                                      f"{context} tokens", keys=AS_WRITTEN)
    except csv.Error as e:  # a field past the csv module's limit (128 KiB), a NUL byte
        raise ConfigError("workload.path", cfg.path, f"is invalid: not a readable CSV ({e})",
                          keys=AS_WRITTEN) from None
    except UnicodeDecodeError:
        # The reader's offset counts from its buffer; the whole file's names the line.
        raw = path.read_bytes()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            at = e.start
        line = raw.count(b"\n", 0, at) + 1
        raise ConfigError("workload.path", cfg.path, f"is invalid: line {line} is not UTF-8 text "
                          f"(byte 0x{raw[at]:02x})", keys=AS_WRITTEN) from None
    if not lengths and cfg.offset:
        raise ConfigError("workload.offset", cfg.offset,
                          f"is invalid: workload.path={cfg.path!r} has {skipped} rows",
                          keys=AS_WRITTEN)
    if not lengths:
        raise ConfigError("workload.path", cfg.path, "is invalid: the trace has no rows",
                          keys=AS_WRITTEN)
    return lengths, arrivals


def _scaled(cfg: WorkloadCfg, tokens: int) -> int:
    scaled = tokens * cfg.length_scale
    if not math.isfinite(scaled):
        raise ConfigError("workload.length_scale", cfg.length_scale,
                          "is invalid: it scales the trace's lengths past the largest float",
                          keys=AS_WRITTEN)
    return max(1, round(scaled))


def _trace_field(where: tuple[str, int], row: dict, column: str, kind: type,
                 minimum: float) -> float:
    """``where``: (the trace's path, the row's line)."""
    raw = row[column]
    try:
        value = kind(raw)
        # A length is scaled by a float, so a float's range bounds every field.
        finite = math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        value, finite = None, False
    if value is None or not finite or value < minimum:
        shown = raw if raw is None or len(raw) <= 40 else f"{raw[:20]}...({len(raw)} characters)"
        path, line = where
        raise ConfigError("workload.path", path, f"line {line}: {column}={shown!r} is invalid: "
                          f"must be a {kind.__name__} >= {minimum:g} within a float's range",
                          keys=AS_WRITTEN)
    return value
