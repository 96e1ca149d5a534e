"""The engine's records and figures; times are seconds since the ``generate`` call began."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, fields
from itertools import accumulate, chain

import numpy as np


@dataclass(slots=True)
class IterationRecord:
    iteration: int
    start: float
    duration: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_requests: int
    num_decode_requests: int
    kv_tokens_read: int
    num_preempted: int
    # forward_time is the device's work (device time); the rest is overhead.
    schedule_time: float
    prepare_time: float
    forward_time: float
    sample_time: float
    prefill_request_ids: tuple[int, ...] = ()
    prefill_chunk_tokens: tuple[int, ...] = ()
    decode_request_ids: tuple[int, ...] = ()
    preempted_request_ids: tuple[int, ...] = ()
    # Before its finished requests give theirs back.
    num_kv_blocks_used: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_requests(self) -> int:
        return self.num_prefill_requests + self.num_decode_requests


def overhead_fraction(outside_s, forward_s):
    return outside_s / (outside_s + forward_s)


def iteration_kinds(num_prefill_tokens, num_decode_tokens) -> np.ndarray:
    prefill, decode = np.asarray(num_prefill_tokens) > 0, np.asarray(num_decode_tokens) > 0
    return np.select([prefill & decode, prefill], ["hybrid", "prefill"], "decode")


# This many times its kind's median is a stall (a compile, a descheduled host), not work.
STALL = 5.0


def stalled(seconds, kinds) -> np.ndarray:
    seconds, kinds = np.asarray(seconds, dtype=float), np.asarray(kinds)
    medians = {kind: np.median(seconds[kinds == kind]) for kind in np.unique(kinds)}
    return seconds > STALL * np.array([medians[k] for k in kinds],
                                      dtype=float).reshape(seconds.shape)


@dataclass(slots=True)
class RequestRecord:
    request_id: int
    prompt_len: int
    arrival: float
    output_len: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    finish: float | None = None
    num_preemptions: int = 0
    queue_at_arrival: int = 0
    token_times: list[float] = field(default_factory=list)

    @property
    def sched_delay(self) -> float:
        return self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def tpot(self) -> float:
        return ((self.finish - self.first_token) / (self.output_len - 1) if self.output_len > 1
                else float("nan"))

    def meets(self, slo: SLO, gaps: np.ndarray | None = None) -> bool:
        checks = [(slo.ttft_s, self.ttft), (slo.tpot_s, self.tpot), (slo.e2e_s, self.e2e)]
        # A one-token request has no TPOT or TBT, so it cannot miss those targets.
        if not all(limit is None or math.isnan(value) or value <= limit for limit, value in checks):
            return False
        if slo.tbt_p99_s is None or self.output_len <= 1:
            return True
        gaps = np.diff(self.token_times) if gaps is None else gaps
        # Within the target when the greatest gap is: the percentile's sort is costly.
        return (bool(gaps.max() <= slo.tbt_p99_s)
                or float(np.percentile(gaps, 99)) <= slo.tbt_p99_s)


@dataclass(frozen=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    tbt_p99_s: float | None = None
    sched_delay_p50_s: float | None = None


def token_gaps(requests: list[RequestRecord]) -> list[np.ndarray]:
    lengths = [len(r.token_times) for r in requests]
    flat = np.fromiter(chain.from_iterable(r.token_times for r in requests), float, sum(lengths))
    diffs = np.diff(flat)
    starts = accumulate([0, *lengths])
    return [diffs[start:start + max(n - 1, 0)] for start, n in zip(starts, lengths)]


def _pcts(name: str, values, unit: str = "_s", pcts=(50, 90, 99)) -> dict[str, float]:
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    found = np.percentile(values, pcts) if len(values) else [float("nan")] * len(pcts)
    return {f"{name}_p{p}{unit}": float(v) for p, v in zip(pcts, found)}


# vLLM's `bench serve` statistics (vllm/benchmarks/serve.py), named as its --save-result JSON
# names them: mean_ttft_ms, median_ttft_ms, std_ttft_ms, p99_ttft_ms, likewise tpot, itl, e2el.
VLLM_LATENCIES = ("ttft", "tpot", "itl", "e2el")
VLLM_STATS = ("mean", "median", "std", "p99")
# vLLM's other result keys this summary holds under its own names, {vLLM's: ours}.
VLLM_RESULT_KEYS = {"completed": "num_requests", "duration": "makespan_s",
                    "total_output_tokens": "generated_tokens",
                    "request_throughput": "request_throughput_rps",
                    "output_throughput": "output_throughput_tok_s"}


def vllm_names() -> tuple[str, ...]:
    return tuple(f"{stat}_{name}_ms" for name in VLLM_LATENCIES for stat in VLLM_STATS)


def _vllm_stats(name: str, seconds) -> dict[str, float]:
    """As vLLM reports them: milliseconds, a population std; NaN where no value (vLLM says 0)."""
    ms = np.asarray(seconds, dtype=float) * 1e3
    ms = ms[~np.isnan(ms)]
    if not len(ms):
        return {f"{stat}_{name}_ms": float("nan") for stat in VLLM_STATS}
    return {f"mean_{name}_ms": float(np.mean(ms)), f"median_{name}_ms": float(np.median(ms)),
            f"std_{name}_ms": float(np.std(ms)), f"p99_{name}_ms": float(np.percentile(ms, 99))}


# Queue growth over the arrivals marking arrivals outpacing service: this many, this share.
SATURATION_MIN_GROWTH = 4
SATURATION_MIN_SHARE = 0.1


def queue_growth(requests: list[RequestRecord]) -> float:
    """A stable queue comes and goes; an overloaded one grows linearly over the arrivals."""
    t = np.array([r.arrival for r in requests], dtype=float)
    if len(t) < 3 or t.max() <= t.min():
        return 0.0
    return float(np.polyfit(t, [r.queue_at_arrival for r in requests], 1)[0] * (t.max() - t.min()))


def _latency_stats(reqs, gaps) -> dict[str, float]:
    """Percentiles of each request latency in seconds, and vLLM's mean/median/std/p99 in ms."""
    out = {}
    latencies = {"ttft": [r.ttft for r in reqs],
                 "itl": np.concatenate(gaps) if reqs else [],
                 "e2el": [r.e2e for r in reqs]}
    for name, values in latencies.items():
        out |= _pcts(name, values)
    out |= _pcts("sched_delay", [r.sched_delay for r in reqs if r.first_scheduled is not None])
    latencies["tpot"] = [r.tpot for r in reqs]
    out |= _pcts("tpot", latencies["tpot"])
    out |= _pcts("normalized_latency", [r.e2e / r.output_len for r in reqs], unit="_s_per_token")
    for name in VLLM_LATENCIES:
        out |= _vllm_stats(name, latencies[name])
    return out


@dataclass
class Metrics:
    iterations: list[IterationRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    # Requests are recorded on arrival: a run stopped early has none of those yet to arrive.
    num_submitted: int = 0
    # A parallel driver's host seconds and bytes sending each batch (part of prepare_time).
    broadcast_s: list[float] = field(default_factory=list)
    broadcast_bytes: list[int] = field(default_factory=list)

    def keep_broadcasts(self, sends_s: list[float], sizes: list[int]) -> None:
        n = len(self.iterations)
        self.broadcast_s = list(sends_s[max(len(sends_s) - n, 0):]) if n else []
        self.broadcast_bytes = list(sizes[max(len(sizes) - n, 0):]) if n else []

    def summary(self, slo: SLO | None = None) -> dict[str, float]:
        """Throughputs count computed tokens, as SARATHI's do (a recomputed prefill again)."""
        reqs = [r for r in self.requests if r.finish is not None]
        its = self.iterations
        end = max([r.finish for r in reqs] + [i.start + i.duration for i in its[-1:]], default=0.0)
        makespan = end - min((r.arrival for r in self.requests), default=0.0)
        # map over attrgetter, not a generator: hundreds of thousands of iterations.
        total = (lambda name: sum(map(operator.attrgetter(name), its)))
        prefill, decode = total("num_prefill_tokens"), total("num_decode_tokens")
        busy, forward = total("duration"), total("forward_time")
        rate = (lambda n: n / makespan) if makespan > 0 else (lambda n: float("nan"))
        growth = queue_growth(self.requests)
        generated = sum(r.output_len for r in reqs)
        out = {
            "num_requests": len(reqs),
            "num_unfinished": max(self.num_submitted, len(self.requests)) - len(reqs),
            "num_iterations": len(its),
            "makespan_s": makespan,
            "busy_time_s": busy,
            "overhead_fraction": (overhead_fraction(busy - forward, forward) if busy > 0
                                  else float("nan")),
            "prefill_tokens": prefill,
            "decode_tokens": decode,
            "generated_tokens": generated,
            "kv_tokens_read": total("kv_tokens_read"),
            "num_preemptions": total("num_preempted"),
            "preemptions_per_request": (sum(r.num_preemptions for r in reqs) / len(reqs) if reqs
                                        else float("nan")),
            "prefill_throughput_tok_s": rate(prefill),
            "decode_throughput_tok_s": rate(decode),
            "total_throughput_tok_s": rate(prefill + decode),
            "request_throughput_rps": rate(len(reqs)),
            # The tokens the finished requests returned, as vLLM's output_throughput counts them.
            "output_throughput_tok_s": rate(generated),
            "queue_growth_requests": growth,
            "saturated": float(growth >= max(SATURATION_MIN_GROWTH,
                                             SATURATION_MIN_SHARE * len(self.requests))),
        }
        gaps = token_gaps(reqs)
        out |= _latency_stats(reqs, gaps)
        if self.broadcast_s:
            out |= _pcts("broadcast", np.asarray(self.broadcast_s) * 1e3, unit="_ms")
            out |= {"broadcast_p50_bytes": float(np.median(self.broadcast_bytes)),
                    "broadcast_fraction": (sum(self.broadcast_s) / busy if busy > 0
                                           else float("nan"))}
        if slo is not None:
            met = sum(r.meets(slo, g) for r, g in zip(reqs, gaps))
            out |= {"goodput_rps": rate(met),
                    "slo_attainment": met / len(reqs) if reqs else float("nan")}
        return out

    def iteration_columns(self) -> dict[str, np.ndarray]:
        """Filled straight from the records: a capacity trial has hundreds of thousands."""
        its = self.iterations
        return {ITERATION_COLUMNS.get(name, name):
                np.fromiter(map(operator.attrgetter(name), its), dtype, len(its))
                for name, dtype in _ITERATION_DTYPES.items()} if its else {}

    def iteration_rows(self) -> list[dict]:
        columns = self.iteration_columns()
        return [dict(zip(columns, values))
                for values in zip(*(c.tolist() for c in columns.values()))]

    def request_rows(self) -> list[dict]:
        rows = []
        for r in self.requests:
            row = {REQUEST_COLUMNS.get(k, k): getattr(r, k) for k in _REQUEST_FIELDS}
            row["token_times_s"] = list(r.token_times)
            done = r.finish is not None
            row |= {"sched_delay_s": r.sched_delay if r.first_scheduled is not None else None,
                    "ttft_s": r.ttft if r.first_token is not None else None,
                    "e2el_s": r.e2e if done else None, "tpot_s": r.tpot if done else None}
            rows.append(row)
        return rows


ITERATION_COLUMNS = {"start": "start_s", "duration": "duration_s", "schedule_time": "schedule_s",
                     "prepare_time": "prepare_s", "forward_time": "forward_s",
                     "sample_time": "sample_s"}
REQUEST_COLUMNS = {"prompt_len": "prompt_tokens", "output_len": "output_tokens",
                   "arrival": "arrival_s", "first_scheduled": "first_scheduled_s",
                   "first_token": "first_token_s", "finish": "finish_s",
                   "token_times": "token_times_s"}

# The records have slots, no __dict__: a long run holds many.
_REQUEST_FIELDS = tuple(f.name for f in fields(RequestRecord))
# Tuples of ids and chunk sizes are list columns (object).
_ITERATION_DTYPES = {f.name: {"int": np.int64, "float": np.float64}.get(f.type, object)
                     for f in fields(IterationRecord)} | {"num_tokens": np.int64}

