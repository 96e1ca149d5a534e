"""The iteration loop: arrivals -> scheduler -> executor -> update -> metrics."""
from __future__ import annotations

import contextlib
import math
import operator
from collections import deque
from collections.abc import Callable

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.client import serve
from sarathi_lab.engine.clock import Clock
from sarathi_lab.engine.executor import Executor, PipelineExecutor, StepOutput
from sarathi_lab.engine.metrics import IterationRecord, Metrics, RequestRecord
from sarathi_lab.engine.scheduler import Scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence


class LLMEngine:
    def __init__(self, scheduler: Scheduler, executor: Executor, clock: Clock):
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        executor.likely_next = scheduler.likely_next
        self.metrics = Metrics()
        self._records: dict[int, RequestRecord] = {}
        self._t0 = clock.now()
        # (batch, start, schedule_s), oldest first; None: one batch at a time.
        self._in_flight: deque[tuple[ScheduledBatch, float, float]] | None = (
            deque() if isinstance(executor, PipelineExecutor) and executor.depth > 1 else None)
        if self._in_flight is not None:
            scheduler.micro_batches = executor.depth

    def start(self, metrics: Metrics, sampling: SamplingParams) -> None:
        self.metrics, self._records = metrics, {}
        self.executor.start(sampling)
        self._t0 = self.clock.now()

    def elapsed(self) -> float:
        return self.clock.now() - self._t0

    def add_request(self, seq: Sequence) -> None:
        queued = sum(s.num_computed == 0 for s in self.scheduler.waiting)
        record = RequestRecord(seq.seq_id, seq.prompt_len, seq.arrival, queue_at_arrival=queued)
        self._records[seq.seq_id] = record
        self.metrics.requests.append(record)
        self.scheduler.add(seq)

    def _schedule(self) -> tuple[ScheduledBatch, float, float]:
        """The batch, when scheduling it began and how long it took."""
        start = self.clock.now()
        batch = self.scheduler.schedule()
        return batch, start - self._t0, self.clock.now() - start

    def step(self) -> IterationRecord | None:
        batch, t_start, schedule_s = self._schedule()
        if not batch:
            return None
        return self.finish(batch, self.executor.execute(batch), t_start, schedule_s)

    def advance(self) -> tuple[bool, IterationRecord | None]:
        """A pipeline submits while it has room, else collects the oldest (as vLLM's does); an
        executor that hands outputs over as they leave (``oldest_left``) has them taken first."""
        in_flight, scheduler = self._in_flight, self.scheduler
        if in_flight is None:
            record = self.step() if scheduler.has_work() else None
            return record is not None, record
        left = bool(in_flight) and self.executor.oldest_left()
        if not left and len(in_flight) < self.executor.depth and scheduler.has_work():
            batch, t_start, schedule_s = self._schedule()
            if batch:
                self.executor.submit(batch)
                scheduler.in_flight.update(_request_ids(batch))
                in_flight.append((batch, t_start, schedule_s))
                return True, None
        if not in_flight:
            return False, None
        batch, t_start, schedule_s = in_flight.popleft()
        out = self.executor.collect()
        scheduler.in_flight.difference_update(_request_ids(batch))
        return True, self.finish(batch, out, t_start, schedule_s)

    def finish(self, batch: ScheduledBatch, out: StepOutput, t_start: float,
               schedule_s: float) -> IterationRecord:
        blocks = self.scheduler.blocks
        # Before the finished requests free theirs.
        kv_blocks_used = blocks.num_blocks - blocks.num_free
        finished = self.scheduler.update(batch, out.tokens)
        t_end = self.elapsed()
        records = self._records
        # First scheduled with a prefill chunk: a decode's prefill ran earlier and set it.
        for chunk in batch.prefills:
            rec = records[chunk.seq.seq_id]
            if rec.first_scheduled is None:
                rec.first_scheduled = t_start
        for seq in batch.sampled:
            rec = records[seq.seq_id]
            times = rec.token_times
            if not times:
                rec.first_token = t_end
            times.append(t_end)
            rec.output_len = len(times)
        for seq in batch.preempted:
            records[seq.seq_id].num_preemptions += 1
        for seq in finished:
            records[seq.seq_id].finish = t_end
        record = IterationRecord(
            iteration=len(self.metrics.iterations), start=t_start, duration=t_end - t_start,
            num_prefill_tokens=batch.num_prefill_tokens, num_decode_tokens=batch.num_decode_tokens,
            num_prefill_requests=len(batch.prefills), num_decode_requests=len(batch.decodes),
            kv_tokens_read=batch.kv_tokens_read, num_preempted=len(batch.preempted),
            schedule_time=schedule_s, prepare_time=out.prepare_s, forward_time=out.forward_s,
            sample_time=out.sample_s,
            prefill_request_ids=tuple([c.seq.seq_id for c in batch.prefills]),
            prefill_chunk_tokens=tuple([c.num_tokens for c in batch.prefills]),
            decode_request_ids=tuple(map(_SEQ_ID, batch.decodes)),
            preempted_request_ids=tuple(map(_SEQ_ID, batch.preempted)),
            num_kv_blocks_used=kv_blocks_used)
        self.metrics.iterations.append(record)
        return record

    def run(self, seqs: list[Sequence], metrics: Metrics, sampling: SamplingParams,
            on_iteration: Callable[[IterationRecord], None] | None = None,
            max_concurrency: int | None = None) -> None:
        self.start(metrics, sampling)
        metrics.num_submitted += len(seqs)
        serve(self, seqs, on_iteration, max_concurrency)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def in_system(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def wait_until(self, elapsed_s: float) -> None:
        # (t0 + a) - t0 can round below a: wake at least at the arrival in elapsed time, else a
        # reused engine (t0 > 0) would sleep to the same instant forever.
        due = self._t0 + elapsed_s
        while due - self._t0 < elapsed_s:
            due = math.nextafter(due, math.inf)
        self.clock.sleep_until(due)

    def abandon(self) -> None:
        if self._in_flight:
            # The next run starts on an empty pipeline; a failed executor's error is the one raised.
            with contextlib.suppress(Exception):
                self.executor.drain()
            self._in_flight.clear()
        self.scheduler.abort_all()


# A request's id, read in C: taken of every decode of every iteration.
_SEQ_ID = operator.attrgetter("seq_id")


def _request_ids(batch: ScheduledBatch) -> list[int]:
    return [c.seq.seq_id for c in batch.prefills] + [s.seq_id for s in batch.decodes]
