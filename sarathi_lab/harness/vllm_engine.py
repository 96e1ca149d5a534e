"""executor=vllm: vLLM's engine on the run's weights, driven by our client and recorded as Metrics,
so tables and figures read it like any run; the times vLLM does not split are NaN."""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sarathi_lab import inputs
from sarathi_lab.attention import make_backend
from sarathi_lab.engine.client import serve
from sarathi_lab.engine.metrics import IterationRecord, Metrics, RequestRecord
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.engine.sequence import Sequence as Request
from sarathi_lab.harness.vllm_args import UNAVAILABLE, VllmArgs, vllm_args, vllm_version
from sarathi_lab.harness.vllm_threads import torch_threads_kept
from sarathi_lab.model import PRESETS, build_model
from sarathi_lab.model.checkpoint import save_checkpoint
from sarathi_lab.plan import EnginePlan

log = logging.getLogger(__name__)
NOT_TIMED = ("schedule_time", "prepare_time", "forward_time", "sample_time")


def save_weights(plan: EnginePlan, directory: Path) -> str:
    """A model directory as it is, or a preset built as our engine builds it and saved once."""
    cfg = plan.config
    if cfg.model not in PRESETS:
        return cfg.model
    cpu = torch.device("cpu")
    lm = build_model(cfg.model, plan.model_config, make_backend("torch", cpu), plan.max_model_len,
                     plan.dtype, cpu, cfg.seed, "aten")
    save_checkpoint(lm, plan.model_config, directory)
    return str(directory)


def _environment(threads: int | None, kv_bytes: int) -> None:
    """Its core in this process (the hooks read its scheduler); on a CPU threads and KV bytes."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    threads = threads or torch.get_num_threads()
    cores = sorted(os.sched_getaffinity(0))[:threads]
    os.environ.update({"OMP_NUM_THREADS": str(threads),
                       "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
                       "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                       # GiB, whole; num_gpu_blocks_override holds the cache to the plan's.
                       "VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_bytes / 2**30)))})


class CallClock:
    """The call's records and clock, read by hooks as from ``LLM.engine`` (the SLO guard)."""

    def __init__(self):
        self.metrics = Metrics()
        self._t0 = time.perf_counter()

    def restart(self, metrics: Metrics) -> None:
        self.metrics, self._t0 = metrics, time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0


@dataclass
class _Call:
    """One generate call's requests, by our id (outputs carry it) and by vLLM's scheduler's."""
    params: list
    first_id: int
    iterations: int = 0
    records: dict[str, RequestRecord] = field(default_factory=dict)
    internal: dict[str, RequestRecord] = field(default_factory=dict)
    prompt_len: dict[str, int] = field(default_factory=dict)
    outputs: dict[int, list[int]] = field(default_factory=dict)
    # The last step's iteration records not yet handed out (a step may schedule twice).
    ready: deque = field(default_factory=deque)


def _vllm_sampling(sampling: SamplingParams, new_tokens: list[int]) -> list:
    """Token ids only, each sampled request seeded apart."""
    from vllm import SamplingParams as VllmSampling

    return [VllmSampling(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=new,
                         min_tokens=new if sampling.ignore_eos else 0,
                         ignore_eos=sampling.ignore_eos,
                         seed=None if sampling.temperature == 0 else (sampling.seed or 0) + i,
                         detokenize=False)
            for i, new in enumerate(new_tokens)]


class VllmLLM:

    def __init__(self, plan: EnginePlan):
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine as VllmEngine

        self.plan, self.config = plan, plan.config
        self.model_config, self.max_model_len = plan.model_config, plan.max_model_len
        self.num_kv_blocks, self.dtype, self.device = plan.num_kv_blocks, plan.dtype, plan.device
        self.cpu_gemm, self.cuda_graphs = None, None
        self.vllm_version = vllm_version()
        self._weights = tempfile.TemporaryDirectory(prefix="sarathi_vllm_")
        self.args: VllmArgs = vllm_args(plan, save_weights(plan, Path(self._weights.name)))
        shape = plan.shape
        kv_bytes = (2 * shape.layers * shape.kv_heads * shape.head_dim * plan.kv_capacity_tokens
                    * plan.dtype.itemsize)
        _environment(self.config.num_threads, kv_bytes)
        with torch_threads_kept():
            self.core = VllmEngine.from_engine_args(EngineArgs(**dataclasses.asdict(self.args)))
        self.engine = CallClock()
        self._scheduled: list = []
        self._hook_scheduler()
        self._next_id = 0
        self._call = _Call([], 0)
        # A run that failed before close() shuts the engine down when collected all the same.
        self._shutdown = weakref.finalize(self, _shutdown, self.core, self._weights)

    @classmethod
    def from_plan(cls, plan: EnginePlan, shared: None = None) -> VllmLLM:
        """The registry's build (``shared``: none, our engine's parts are no use to vLLM's)."""
        llm = cls(plan)
        log.info("%s", UNAVAILABLE)
        return llm

    def close(self) -> None:
        """A sweep's next job runs in this process: no idle engine keeps its memory. Idempotent."""
        self._shutdown()

    @property
    def metrics(self) -> Metrics:
        return self.engine.metrics

    @property
    def kv_capacity_tokens(self) -> int:
        return self.plan.kv_capacity_tokens

    def _hook_scheduler(self) -> None:
        scheduler = self.core.engine_core.engine_core.scheduler
        schedule = scheduler.schedule

        def keep(*args, **kwargs):
            out = schedule(*args, **kwargs)
            self._scheduled.append(out)
            return out

        scheduler.schedule = keep

    def generate(self, prompts: Sequence[Sequence[int]],
                 max_new_tokens: int | Sequence[int] = 16,
                 sampling: SamplingParams | None = None,
                 arrival_times: Sequence[float] | None = None,
                 on_iteration: Callable[[IterationRecord], None] | None = None,
                 max_concurrency: int | None = None) -> list[list[int]]:
        token_lists = inputs.prompts_as_lists(prompts)
        n = len(token_lists)
        new_tokens = inputs.per_request_ints("max_new_tokens", max_new_tokens, n)
        arrivals = [0.0] * n if arrival_times is None else inputs.arrival_list(arrival_times, n)
        first = self._next_id
        self._call = _Call(_vllm_sampling(sampling or SamplingParams(), new_tokens), first)
        self._next_id += n
        self.engine.restart(Metrics(num_submitted=n))
        seqs = [Request(first + i, p, new, a)
                for i, (p, new, a) in enumerate(zip(token_lists, new_tokens, arrivals))]
        serve(self, seqs, on_iteration, max_concurrency)
        return [self._call.outputs.get(first + i, []) for i in range(n)]

    # What the client (engine/client.py) drives, as it drives our engine.
    def add_request(self, seq: Request) -> None:
        call = self._call
        waiting = sum(r.first_scheduled is None for r in call.records.values())
        record = RequestRecord(seq.seq_id, seq.prompt_len, seq.arrival, queue_at_arrival=waiting)
        self.metrics.requests.append(record)
        rid = str(seq.seq_id)
        own = self.core.add_request(rid, {"prompt_token_ids": seq.prompt},
                                    call.params[seq.seq_id - call.first_id])
        call.records[rid], call.internal[own], call.prompt_len[own] = record, record, seq.prompt_len

    def has_work(self) -> bool:
        return bool(self._call.ready) or self.core.has_unfinished_requests()

    def in_system(self) -> int:
        return self.core.get_num_unfinished_requests()

    def elapsed(self) -> float:
        return self.engine.elapsed()

    def wait_until(self, elapsed_s: float) -> None:
        time.sleep(max(0.0, elapsed_s - self.engine.elapsed()))

    def abandon(self) -> None:
        self.core.abort_request([rid for rid, r in self._call.records.items() if r.finish is None])

    def advance(self) -> tuple[bool, IterationRecord | None]:
        """One engine step, its iterations handed out one a move; tokens timed when it returns."""
        call = self._call
        if call.ready:
            return True, call.ready.popleft()
        if not self.core.has_unfinished_requests():
            return False, None
        self._scheduled.clear()
        began = self.engine.elapsed()
        step = self.core.step()
        ended = self.engine.elapsed()
        for out in step:
            record = call.records[out.request_id]
            tokens = list(out.outputs[0].token_ids)
            fresh = len(tokens) - record.output_len
            if fresh > 0:
                record.first_token = ended if record.first_token is None else record.first_token
                record.token_times.extend([ended] * fresh)
                record.output_len = len(tokens)
                call.outputs[record.request_id] = tokens
            if out.finished:
                record.finish = ended
        for scheduled in self._scheduled:
            it = _iteration(call.iterations, began, ended - began, scheduled, call.prompt_len,
                            call.internal)
            if it is not None:
                self.metrics.iterations.append(it)
                call.iterations += 1
                call.ready.append(it)
        return True, call.ready.popleft() if call.ready else None


def _shutdown(core, weights: tempfile.TemporaryDirectory) -> None:
    core.engine_core.shutdown()
    weights.cleanup()


def _iteration(index: int, start: float, duration: float, scheduled, prompt_len: dict[str, int],
               records: dict[str, RequestRecord]) -> IterationRecord | None:
    """A request short of its prompt ran a prefill chunk, else a decode; None: empty schedule."""
    counts: dict[str, int] = dict(scheduled.num_scheduled_tokens)
    if not counts:
        return None
    computed = {r.req_id: r.num_computed_tokens for r in scheduled.scheduled_new_reqs}
    cached = scheduled.scheduled_cached_reqs
    computed |= dict(zip(cached.req_ids, cached.num_computed_tokens))
    prefills, chunks, decodes = [], [], []
    kv_read = prefill_tokens = decode_tokens = 0
    for rid, n in counts.items():
        done = computed.get(rid, 0)
        kv_read += done + n
        record = records[rid]
        if record.first_scheduled is None:
            record.first_scheduled = start
        if done < prompt_len[rid]:
            prefills.append(record.request_id)
            chunks.append(n)
            prefill_tokens += n
        else:
            decodes.append(record.request_id)
            decode_tokens += n
    nan = float("nan")
    return IterationRecord(iteration=index, start=start, duration=duration,
                           num_prefill_tokens=prefill_tokens,
                           num_decode_tokens=decode_tokens, num_prefill_requests=len(prefills),
                           num_decode_requests=len(decodes), kv_tokens_read=kv_read,
                           num_preempted=len(getattr(scheduled, "preempted_req_ids", None) or ()),
                           **dict.fromkeys(NOT_TIMED, nan), prefill_request_ids=tuple(prefills),
                           prefill_chunk_tokens=tuple(chunks), decode_request_ids=tuple(decodes))
