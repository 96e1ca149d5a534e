"""Rank 0 of a parallel engine; its ranks are spawned once per process and reused."""
from __future__ import annotations

import atexit
import contextlib
import os

import torch
import torch.distributed as dist

from sarathi_lab.config import AS_WRITTEN, ConfigError
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import Clock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.model.parallel import spawn
from sarathi_lab.model.parallel.group import (
    BUILD_TIMEOUT_S,
    RankGroup,
    bounded,
    engine_groups,
    free_port,
    join_torchrun,
    torchrun_rank,
    wait_all,
)
from sarathi_lab.model.parallel.pipelined import PipelineParallelExecutor
from sarathi_lab.model.parallel.rank import RankPart, RankSpec, build_rank, run_step
from sarathi_lab.model.parallel.wire import BUILD, STOP, command, encode
from sarathi_lab.model.runner import batch_tensors
from sarathi_lab.model.sampler import Samples

# The ranks of this process's engines (None: none yet, or given up after a failure).
_ranks: RankGroup | None = None
# Whether this process ever joined ranks: gloo's worker threads can still hold a step's work when
# the interpreter tears down, and destroying it then aborts the process (SIGABRT, "terminate called
# without an active exception") after every record was written; such a process ends by os._exit once
# its exit handlers have run (sarathi_lab.run).
joined = False


def ranks(size: int) -> RankGroup:
    global _ranks, joined
    if _ranks is not None and _ranks.size == size and not _ranks.dead_ranks():
        return _ranks
    close()
    rank = torchrun_rank()
    if rank is not None:
        world = int(os.environ["WORLD_SIZE"])
        if world != size:
            raise ConfigError("tensor_parallel", size, "is invalid (with pipeline_parallel, the "
                              f"ranks): torchrun started {world} ranks", str(world),
                              keys=AS_WRITTEN)
        _ranks = join_torchrun(rank)
    else:
        # Gloo meets on the loopback interface only: the ranks are this machine's processes.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        port = free_port()
        _ranks = spawn.join_spawned(spawn.start(size, port), size, port)
    joined = True
    return _ranks


def close() -> None:
    global _ranks
    group, _ranks = _ranks, None
    if group is None:
        return
    stopped = False
    if not group.dead_ranks():
        with contextlib.suppress(Exception):  # a rank gone or left mid-step fails the command
            _command(group, command(STOP), 10.0)
            stopped = True
    if not stopped:
        spawn.kill(group.processes)  # the others cannot take a STOP: ended at once
    _stop(group.processes)
    if dist.is_initialized():
        dist.destroy_process_group()


atexit.register(close)


def _stop(processes: list) -> None:
    for process in processes:
        process.join(timeout=10.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5.0)


def _command(group: RankGroup, header: torch.Tensor, timeout_s: float) -> None:
    if group.chain is None:
        bounded(dist.broadcast(header, 0, group=group.control, async_op=True), timeout_s)
    else:
        wait_all(group.chain.forward(header, group.control), timeout_s)


def start_engine(spec: RankSpec) -> ParallelExecutor | PipelineParallelExecutor:
    cfg = spec.config
    group = ranks(cfg.world_size)
    group.label = f"tensor_parallel={cfg.tensor_parallel}" + (
        f" x pipeline_parallel={cfg.pipeline_parallel}" if cfg.pipeline_parallel > 1 else "")
    try:
        with spawn.watching(group):
            _command(group, command(BUILD), cfg.collective_timeout_s)
            dist.broadcast_object_list([spec], 0, group=group.control)
            groups = engine_groups(group, spec.device_type, cfg.collective_timeout_s,
                                   cfg.tensor_parallel)
            part = build_rank(spec, group, groups)
            bounded(dist.barrier(group=group.control, async_op=True), BUILD_TIMEOUT_S)
    except Exception as e:
        raise _give_up(group, spawn.rank_died(e) or e, cfg.collective_timeout_s) from e
    group.chain = part.chain
    if part.chain is not None:
        return PipelineParallelExecutor(part, group, groups.wire, cfg.collective_timeout_s,
                                        cfg.pipeline_parallel,
                                        lambda e: _give_up(group, e, cfg.collective_timeout_s))
    return ParallelExecutor(part, group, groups.wire, cfg.collective_timeout_s)


def _give_up(group: RankGroup, error: BaseException, timeout_s: float) -> RuntimeError:
    """The group is dropped; interrupted ranks are mid-collective and cannot take a STOP: ended."""
    interrupted = not isinstance(error, Exception)
    failure = (RuntimeError(f"interrupted ({error!r})") if interrupted
               else error if isinstance(error, spawn.RankDied) else group.failure(error, timeout_s))
    global _ranks
    if _ranks is group:
        _ranks = None
        spawn.kill(group.processes)  # a rank that hangs may be stopped, which only SIGKILL ends
        if dist.is_initialized():
            dist.destroy_process_group()
    return failure


class ParallelExecutor(Samples, Executor):
    """Its shard's LM head gathers the whole vocabulary's logits, sampled here."""

    def __init__(self, part: RankPart, group: RankGroup, wire, timeout_s: float,
                 clock: Clock | None = None):
        self.part = part
        self.runner = part.runner
        self.group = group
        self.wire = wire
        self.timeout_s = timeout_s
        self.clock = clock
        self.broadcast_s: list[float] = []
        self.broadcast_bytes: list[int] = []
        self._host = torch.device("cpu")

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        clock = self.clock
        t0 = clock.now()
        runner = self.runner
        host = batch_tensors(batch, runner.block_size, self._host, runner.tables)
        try:
            with self.group.step():
                t_wire = clock.now()
                sent = encode(host)
                bounded(dist.broadcast(sent.header, 0, group=self.group.control, async_op=True),
                        self.timeout_s)
                dist.broadcast(sent.payload, 0, group=self.wire)
                t1 = clock.now()
                self.broadcast_s.append(t1 - t_wire)
                self.broadcast_bytes.append(sent.header.numel() * 8 + sent.payload.numel())
                logits = run_step(self.part, sent.header.tolist(), sent.payload)
                t2 = clock.now()
        except BaseException as e:  # Ctrl-C included: the ranks wait for the rest of the step
            failure = _give_up(self.group, e, self.timeout_s)
            if isinstance(e, Exception):
                raise failure from e
            raise
        tokens = self.sample(logits, batch.sampled)
        t3 = clock.now()
        return StepOutput(tokens, prepare_s=t1 - t0, forward_s=t2 - t1, sample_s=t3 - t2)
