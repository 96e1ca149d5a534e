"""Rank 0 of a pipeline engine: micro-batches submitted without waiting for those before, logits
collected in order; every wait bounded by collective_timeout_s."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import Clock
from sarathi_lab.engine.executor import PipelineExecutor, StepOutput
from sarathi_lab.model.parallel.group import RankGroup, bounded, wait_all
from sarathi_lab.model.parallel.rank import FIELDS, RankPart, run_stage
from sarathi_lab.model.parallel.wire import LOGITS, TIMELINE, command, encode
from sarathi_lab.model.runner import batch_tensors
from sarathi_lab.model.sampler import Samples


@dataclass
class _InFlight:
    batch: ScheduledBatch
    sends: list  # (work, tensor) pairs on their way
    logits: torch.Tensor  # filled by ``received``
    received: object
    prepare_s: float
    sent_at: float


class PipelineParallelExecutor(Samples, PipelineExecutor):
    """``forward_s`` includes the waits behind the micro-batches ahead."""

    def __init__(self, part: RankPart, group: RankGroup, wire, timeout_s: float, depth: int,
                 give_up: Callable[[BaseException], RuntimeError], clock: Clock | None = None):
        self.part = part
        self.runner = part.runner
        self.chain = part.chain
        self.group = group
        self.wire = wire
        self.timeout_s = timeout_s
        self.depth = depth
        self.clock = clock
        self._give_up = give_up
        self.broadcast_s: list[float] = []
        self.broadcast_bytes: list[int] = []
        self._in_flight: deque[_InFlight] = deque()
        self._host = torch.device("cpu")
        self._failed: RuntimeError | None = None

    def submit(self, batch: ScheduledBatch) -> None:
        self._check_alive()
        clock, runner, chain = self.clock, self.runner, self.chain
        t0 = clock.now()
        host = batch_tensors(batch, runner.block_size, self._host, runner.tables)
        try:
            sent = encode(host)
            header = sent.header.tolist()
            sends = (chain.forward(sent.header, self.group.control)
                     + chain.forward(sent.payload, self.wire))
            t1 = clock.now()
            run = run_stage(self.part, header, sent.payload, t0)
            lm = runner.model
            logits = torch.empty(header[LOGITS], lm.config.vocab_size,
                                 dtype=lm.embed_tokens.weight.dtype, device=runner.device)
            # Posted after stage 0's activations: NCCL queues a pair's sends and receives in order,
            # and with two stages a receive queued first would wait for logits needing them.
            received = dist.irecv(logits, src=chain.logits_sender, group=self.part.p2p)
        except BaseException as e:
            # Stopped halfway, the ranks would take the next micro-batch's bytes for these.
            failure = self._fail(e)
            if isinstance(e, Exception):
                raise failure from e
            raise
        self.broadcast_s.append(t1 - t0)
        self.broadcast_bytes.append(sent.header.numel() * 8 + sent.payload.numel())
        self._in_flight.append(_InFlight(batch, sends + run.sends, logits, received, t1 - t0, t1))

    def collect(self) -> StepOutput:
        self._check_alive()
        mb = self._in_flight.popleft()
        clock = self.clock
        try:
            with self.group.step():
                bounded(mb.received, self.timeout_s)
                wait_all(mb.sends, self.timeout_s)
        except Exception as e:
            raise self._fail(e) from e
        t2 = clock.now()
        tokens = self.sample(mb.logits, mb.batch.sampled)
        t3 = clock.now()
        return StepOutput(tokens, prepare_s=mb.prepare_s, forward_s=t2 - mb.sent_at,
                          sample_s=t3 - t2)

    def drain(self) -> None:
        while self._in_flight and self._failed is None:
            self.collect()
        self._in_flight.clear()

    @property
    def micro_batches_submitted(self) -> int:
        return self.part.timeline.submitted

    def stage_timeline(self) -> pd.DataFrame:
        """Every rank's compute per micro-batch since the build; call it between runs."""
        self._check_alive()
        if self._in_flight:
            raise RuntimeError(f"stage_timeline: {len(self._in_flight)} micro-batches are still in "
                               f"flight; call it between runs")
        per_rank = [self.part.timeline.as_tensor()]
        try:
            wait_all(self.chain.forward(command(TIMELINE), self.group.control), self.timeout_s)
            for rank in range(1, self.group.size):
                count = torch.empty(1, dtype=torch.int64)
                bounded(dist.irecv(count, src=rank, group=self.wire), self.timeout_s)
                rows = torch.empty(int(count), len(FIELDS), dtype=torch.float64)
                if len(rows):
                    bounded(dist.irecv(rows, src=rank, group=self.wire), self.timeout_s)
                per_rank.append(rows)
        except Exception as e:
            raise self._fail(e) from e
        return timeline_frame(per_rank, self.part.tp)

    def _check_alive(self) -> None:
        if self._failed is not None:
            raise RuntimeError(f"this engine's ranks were given up after an earlier failure: "
                               f"{self._failed}")

    def _fail(self, error: BaseException) -> RuntimeError:
        self._in_flight.clear()
        self._failed = self._give_up(error)
        return self._failed


def timeline_frame(per_rank: list[torch.Tensor], tp: int) -> pd.DataFrame:
    out = pd.concat([pd.DataFrame(rows.numpy(), columns=list(FIELDS))
                     .assign(rank=rank, stage=rank // tp)
                     for rank, rows in enumerate(per_rank)], ignore_index=True)
    for column in ("micro_batch", "tokens", "prefill_tokens"):
        out[column] = out[column].astype("int64")
    return out.sort_values(["stage", "rank", "micro_batch"],
                           ignore_index=True)[["rank", "stage", *FIELDS]]
