"""The iteration loop: arrivals -> scheduler -> model runner -> sampler -> metrics."""
from __future__ import annotations

import time
from typing import Callable

from sarathi_lab.engine.clock import DeviceClock
from sarathi_lab.engine.metrics import IterationRecord, Metrics, RequestRecord
from sarathi_lab.engine.model_runner import ModelRunner
from sarathi_lab.engine.sampler import Sampler
from sarathi_lab.engine.scheduler import Scheduler
from sarathi_lab.engine.sequence import Sequence


class LLMEngine:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, clock: DeviceClock):
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock

    def run(self, seqs: list[Sequence], sampler: Sampler, metrics: Metrics,
            on_iteration: Callable[[IterationRecord], None] | None = None) -> None:
        """Serve ``seqs`` to completion; each becomes visible to the scheduler at its arrival time
        (seconds after the call starts). Records go into ``metrics`` as they happen, so an
        interrupted run leaves what it had done."""
        pending = sorted(seqs, key=lambda s: (s.arrival, s.seq_id))
        records = {s.seq_id: RequestRecord(s.seq_id, s.prompt_len, s.arrival) for s in seqs}
        metrics.requests.extend(records[s.seq_id] for s in seqs)
        t0 = self.clock.now()
        while pending or self.scheduler.has_work():
            now = self.clock.now() - t0
            while pending and pending[0].arrival <= now:
                self.scheduler.add(pending.pop(0))
            batch = self.scheduler.schedule()
            if not batch:
                if not pending:
                    raise RuntimeError("scheduler produced an empty batch with requests left and none to arrive")
                time.sleep(max(0.0, pending[0].arrival - (self.clock.now() - t0)))
                continue
            prepared = self.runner.prepare(batch)
            timer = self.clock.start_forward()
            logits = self.runner.forward(prepared)
            forward_time = self.clock.stop_forward(timer)
            tokens = sampler(logits)
            end = self.clock.now() - t0
            for seq, token in zip(prepared.sampled, tokens):
                seq.append(token)
                rec = records[seq.seq_id]
                rec.token_times.append(end)
                rec.output_len = seq.num_generated
                if rec.first_token is None:
                    rec.first_token = end
            for chunk in batch.chunks:
                if records[chunk.seq.seq_id].first_scheduled is None:
                    records[chunk.seq.seq_id].first_scheduled = now
            for seq in batch.preempted:
                records[seq.seq_id].num_preemptions += 1
            for seq in self.scheduler.complete(batch):
                records[seq.seq_id].finish = end
            record = IterationRecord(
                iteration=len(metrics.iterations), start=now, duration=end - now,
                num_prefill_tokens=batch.num_prefill_tokens, num_decode_tokens=batch.num_decode_tokens,
                num_prefill_requests=len(batch.prefills), num_decode_requests=len(batch.decodes),
                kv_tokens_read=prepared.meta.kv_tokens_read, num_preempted=len(batch.preempted),
                forward_time=forward_time)
            metrics.iterations.append(record)
            if on_iteration is not None:
                on_iteration(record)
