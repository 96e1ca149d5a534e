"""What the engine records about itself, and the latency/throughput figures derived from it.

Times are seconds on the engine's clock (``time.perf_counter`` after a device sync), relative to
the start of the ``generate`` call that produced them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class IterationRecord:
    iteration: int
    start: float
    duration: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_requests: int
    num_decode_requests: int
    # Cached key/value tokens attention read, per layer (each request reads its whole context).
    kv_tokens_read: int
    num_preempted: int
    # Time spent in the model's forward alone (device-synchronised); the rest is engine overhead.
    forward_time: float

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_requests(self) -> int:
        return self.num_prefill_requests + self.num_decode_requests


@dataclass
class RequestRecord:
    request_id: int
    prompt_len: int
    arrival: float
    output_len: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    finish: float | None = None
    num_preemptions: int = 0
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def tbts(self) -> list[float]:
        return list(np.diff(self.token_times))


def _pcts(name: str, values, pcts=(50, 90, 99)) -> dict[str, float]:
    if len(values) == 0:
        return {f"{name}_p{p}": float("nan") for p in pcts}
    arr = np.percentile(np.asarray(values, dtype=float), pcts)
    return {f"{name}_p{p}": float(v) for p, v in zip(pcts, arr)}


@dataclass
class Metrics:
    iterations: list[IterationRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Throughputs in tokens/s over the makespan (first arrival to last finish); latencies in s."""
        reqs = [r for r in self.requests if r.finish is not None]
        its = self.iterations
        makespan = max((r.finish for r in reqs), default=0.0) - min((r.arrival for r in reqs), default=0.0)
        prefill = sum(i.num_prefill_tokens for i in its)
        decode = sum(i.num_decode_tokens for i in its)
        busy = sum(i.duration for i in its)
        forward = sum(i.forward_time for i in its)
        rate = (lambda n: n / makespan) if makespan > 0 else (lambda n: float("nan"))
        out = {
            "num_requests": len(reqs),
            "num_iterations": len(its),
            "makespan_s": makespan,
            "busy_time_s": busy,
            "overhead_fraction": (busy - forward) / busy if busy > 0 else float("nan"),
            "prefill_tokens": prefill,
            "decode_tokens": decode,
            "generated_tokens": sum(r.output_len for r in reqs),
            "kv_tokens_read": sum(i.kv_tokens_read for i in its),
            "num_preemptions": sum(i.num_preempted for i in its),
            "prefill_throughput": rate(prefill),
            "decode_throughput": rate(decode),
            "total_throughput": rate(prefill + decode),
        }
        out |= _pcts("ttft", [r.ttft for r in reqs])
        out |= _pcts("tbt", [t for r in reqs for t in r.tbts])
        out |= _pcts("e2e", [r.e2e for r in reqs])
        return out

    def iteration_rows(self) -> list[dict]:
        return [asdict(i) | {"num_tokens": i.num_tokens} for i in self.iterations]

    def request_rows(self) -> list[dict]:
        rows = []
        for r in self.requests:
            row = asdict(r)
            row |= {"ttft": r.ttft if r.first_token is not None else None,
                    "e2e": r.e2e if r.finish is not None else None}
            rows.append(row)
        return rows
