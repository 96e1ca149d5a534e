"""The public entry point: ``LLM(model=..., scheduler=...).generate(prompts)``."""
from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections.abc import Callable
from collections.abc import Sequence as Sequence_
from typing import TYPE_CHECKING

from sarathi_lab import inputs
from sarathi_lab.config import AS_WRITTEN, ENGINE_FIELDS, ConfigError, EngineConfig, check_attention_hybrid, named_as
from sarathi_lab.engine.block_manager import blocks_for
from sarathi_lab.engine.clock import VirtualClock, WallClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import IterationRecord, Metrics
from sarathi_lab.engine.scheduler import Scheduler, scheduler_names
from sarathi_lab.engine.scheduler.base import foreign_knob
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.executors import executor_class, llm_refusal, sampling_refusal
from sarathi_lab.model.configs import eos_token_of
from sarathi_lab.plan import EnginePlan, build_scheduler, plan_engine
from sarathi_lab.sim.executor import simulated_executor

if TYPE_CHECKING:
    from sarathi_lab.engine.executor import Executor
    from sarathi_lab.model.cuda_graphs import CudaGraphs
    from sarathi_lab.model.decoder import CausalLM
    from sarathi_lab.model.executor import ModelExecutor
    from sarathi_lab.model.parallel.driver import ParallelExecutor
    from sarathi_lab.model.runner import ModelRunner
    from sarathi_lab.model.shared_engine import SharedEngine


class LLM:
    def __init__(self, model: str = "tiny", **kwargs):
        """``kwargs``: EngineConfig's fields; any other is a scheduler's knob."""
        engine = {key: kwargs.pop(key) for key in list(kwargs) if key in ENGINE_FIELDS}
        scheduler = engine.get("scheduler", EngineConfig.scheduler)
        # One engine: a knob its scheduler ignores is a mistake, never dropped.
        for key, value in kwargs.items():
            if scheduler in scheduler_names() and (refused := foreign_knob(scheduler, key, value)):
                raise refused
        engine["scheduler_knobs"] = {**engine.get("scheduler_knobs", {}), **kwargs}
        self._shared = None
        with named_as(AS_WRITTEN):  # the edge: refusals name the settings as these keywords do
            self._build(plan_engine(EngineConfig(model=model, **engine)))

    @classmethod
    def from_plan(cls, plan: EnginePlan, shared: SharedEngine | None = None) -> LLM:
        """A plan made already (the preflight's) is decided no second time. ``shared``: the parts
        an earlier engine of this process left (its model, KV cache, graphs), taken over where they
        agree with this plan; that engine is not to be used again."""
        llm = cls.__new__(cls)
        llm._shared = shared
        llm._build(plan)
        return llm

    def _build(self, plan: EnginePlan) -> None:
        start = time.perf_counter()
        self.plan = plan
        self.config = cfg = plan.config
        self.kind = kind = executor_class(cfg.executor)
        # The harness serves another engine: LLM would run ours instead.
        if (refused := llm_refusal(cfg.executor)) is not None:
            raise refused
        if cfg.num_threads is not None:
            import torch

            torch.set_num_threads(cfg.num_threads)
        self.model_config, self.max_model_len = plan.model_config, plan.max_model_len
        self.num_kv_blocks, self.dtype = plan.num_kv_blocks, plan.dtype
        self.device = plan.device
        # Before the weights are allocated: it refuses a cache smaller than a request's reserve.
        scheduler = build_scheduler(plan)
        self.block_manager = scheduler.blocks
        self.cuda_graphs: dict | None = None
        self.cpu_gemm = None
        executor, clock = kind.build_batches(self, scheduler)
        self.engine = LLMEngine(scheduler, executor, clock)
        self.metrics = Metrics()
        self._next_id = 0
        # One generate call at a time (another thread's, a callback's): the queues are one caller's.
        self._call_lock = threading.Lock()
        warm = kind.warm_up(self)
        # What a run records of its engine's set-up: the parts built or reused (a shared engine's),
        # the seconds it took, the warm-up request it ran and discarded.
        self.setup = {"parts": kind.parts(self), "seconds": round(time.perf_counter() - start, 3),
                      "warmup": warm}

    def _build_model_executor(self, largest_tokens: int) -> tuple[ModelExecutor, WallClock]:
        # Imported here: a simulated engine builds no model, and loads none of what builds one.
        import torch

        from sarathi_lab.attention import make_backend
        from sarathi_lab.engine.timer import make_clock
        from sarathi_lab.model import build_model
        from sarathi_lab.model.cpu_linear import linear_gemm
        from sarathi_lab.model.cuda_graphs import can_replay
        from sarathi_lab.model.executor import ModelExecutor
        from sarathi_lab.model.host_allocator import reuse_freed_memory
        from sarathi_lab.model.nano_batch import OverlapRule
        from sarathi_lab.model.runner import ModelRunner
        from sarathi_lab.model.shared_engine import ModelKey, built
        from sarathi_lab.tuned_kernels import table_for

        cfg, shared = self.config, self._shared
        device = self.device
        if cfg.world_size > 1:
            return self._build_parallel_executor()
        if device.type == "cpu":
            reuse_freed_memory()  # activations' pages reused, not faulted in again by every layer
        backend = make_backend(cfg.attention, device, cfg.attention_hybrid)

        def build() -> CausalLM:
            return build_model(cfg.model, self.model_config, backend, self.max_model_len,
                               self.dtype, device, cfg.seed, cfg.cpu_linear)

        shape = self.plan.shape
        kv_shape = (shape.layers, 2, self.num_kv_blocks, cfg.block_size, shape.kv_heads,
                    shape.head_dim)
        key = ModelKey(cfg.model, str(self.dtype).removeprefix("torch."), str(device),
                       backend.name, cfg.cpu_linear)
        if shared is None:
            self.model = built(key, cfg.seed, build)
            cache = torch.zeros(kv_shape, dtype=self.dtype, device=device)
            self.kv_caches = [(layer[0], layer[1]) for layer in cache]
        else:
            self.model = shared.model(key, self.model_config, cfg.seed, self.max_model_len,
                                      backend, build)
            self.kv_caches = shared.kv_caches(kv_shape, self.dtype, device)
        self.cpu_gemm = linear_gemm(self.model) if device.type == "cpu" else None
        clock = make_clock("wall", device)
        runner = ModelRunner(self.model, self.kv_caches, cfg.block_size, device,
                             OverlapRule.of_table(cfg.overlap, table_for(device)))
        replayable = cfg.cuda_graphs and can_replay(self.model.backend, device)
        graphs = self._graphs(runner, largest_tokens) if replayable else None
        return ModelExecutor(runner, clock, graphs), clock

    def _build_parallel_executor(self) -> tuple[ParallelExecutor, WallClock]:
        """Rank 0, every forward eager (no CUDA graphs)."""
        from sarathi_lab.engine.timer import make_clock
        from sarathi_lab.model.cpu_linear import linear_gemm
        from sarathi_lab.model.parallel.driver import start_engine
        from sarathi_lab.model.parallel.rank import RankSpec

        plan = self.plan
        executor = start_engine(RankSpec(plan.config, plan.model_config, plan.max_model_len,
                                         plan.num_kv_blocks, plan.dtype, plan.host.device_type))
        runner = executor.runner
        self.model, self.kv_caches = runner.model, runner.kv_caches
        self.cpu_gemm = linear_gemm(self.model) if runner.device.type == "cpu" else None
        executor.clock = clock = make_clock("wall", runner.device)
        return executor, clock

    def _graphs(self, runner: ModelRunner, largest_tokens: int) -> CudaGraphs | None:
        """Captured, or the shared engine's set captured for the same shapes."""
        from sarathi_lab.model.shared_engine import GraphKey

        cfg = self.config
        max_blocks = blocks_for(self.max_model_len, cfg.block_size)
        mixed = largest_tokens if cfg.cuda_graphs_mixed else None

        def capture(pool=None) -> CudaGraphs | None:
            return self._capture_graphs(runner, max_blocks, mixed, pool)

        if self._shared is None:
            graphs, kept = capture(), False
        else:
            key = GraphKey(cfg.max_batch_size, max_blocks, mixed, cfg.attention_hybrid,
                           runner.overlap, self.max_model_len)
            graphs, kept = self._shared.graphs(key, capture)
        # What replays, and whether this engine captured it (capture_s is the capturing job's).
        self.cuda_graphs = None if graphs is None else graphs.record | {"kept": kept}
        return graphs

    def _capture_graphs(self, runner: ModelRunner, max_blocks: int, mixed: int | None,
                        pool=None) -> CudaGraphs | None:
        """A capture that fails leaves the engine eager, with one warning."""
        from sarathi_lab.model.cuda_graphs import CudaGraphs

        try:
            return CudaGraphs(runner, self.config.max_batch_size, max_blocks, mixed, pool=pool)
        except Exception as e:  # noqa: BLE001 - the run goes on eagerly, and says so
            warnings.warn(f"engine.cuda_graphs=true: capture failed, so every forward runs eagerly "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})", stacklevel=4)
            return None

    def use_attention_hybrid(self, hybrid: str) -> None:
        """One model's weights and cache timed both ways; graphs captured again, old freed first."""
        executor = self.engine.executor
        runner = getattr(executor, "runner", None)
        if runner is None or self.config.world_size > 1:
            raise ConfigError("attention_hybrid", hybrid, "cannot be switched on this engine: "
                              "only a single-process model executor's", keys=AS_WRITTEN)
        backend = runner.model.backend
        check_attention_hybrid(hybrid, backend.name)
        backend.hybrid = hybrid
        self.config = dataclasses.replace(self.config, attention_hybrid=hybrid)
        self.plan = dataclasses.replace(self.plan, config=self.config)
        if executor.graphs is not None:
            executor.graphs = self.cuda_graphs = None
            if self.device.type == "cuda" and self._shared is None:
                import torch

                torch.cuda.empty_cache()
            largest = largest_iteration_tokens(self.engine.scheduler)
            executor.graphs = self._graphs(executor.runner, largest)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.plan.kv_capacity_tokens

    def generate(self, prompts: Sequence_[Sequence_[int]],
                 max_new_tokens: int | Sequence_[int] = 16,
                 sampling: SamplingParams | None = None,
                 arrival_times: Sequence_[float] | None = None,
                 on_iteration: Callable[[IterationRecord], None] | None = None,
                 max_concurrency: int | None = None) -> list[list[int]]:
        """Each prompt's generated ids, in order (records in ``self.metrics``); the engine stays
        reusable whatever happens inside (a callback's exception, Ctrl-C)."""
        if not self._call_lock.acquire(blocking=False):
            raise RuntimeError("LLM.generate is already running on this LLM (another thread, or "
                               "a callback of the running call): one call at a time; give each "
                               "thread its own LLM")
        try:
            sampling = sampling or SamplingParams()
            if not isinstance(sampling, SamplingParams):
                raise TypeError(f"sampling must be a SamplingParams; got {type(sampling).__name__}")
            if (refused := sampling_refusal(self.config.executor, sampling.temperature)) is not None:
                raise refused
            token_lists = inputs.prompts_as_lists(prompts)
            n = len(token_lists)
            new_tokens = inputs.per_request_ints("max_new_tokens", max_new_tokens, n)
            arrivals = [0.0] * n if arrival_times is None else inputs.arrival_list(arrival_times, n)
            if max_concurrency is not None:
                inputs.per_request_ints("max_concurrency", max_concurrency, 1)
            eos = None if sampling.ignore_eos else eos_token_of(self.model_config)
            for i, (prompt, new) in enumerate(zip(token_lists, new_tokens)):
                self._check_request(i, prompt, new)
            seqs = [Sequence(self._next_id + i, prompt, new, arrival, eos, sample_key=i)
                    for i, (prompt, new, arrival)
                    in enumerate(zip(token_lists, new_tokens, arrivals))]

            self._next_id += n
            self.metrics = Metrics()
            try:
                self.engine.run(seqs, self.metrics, sampling, on_iteration, max_concurrency)
            finally:
                executor = self.engine.executor
                if getattr(executor, "broadcast_s", None):
                    self.metrics.keep_broadcasts(executor.broadcast_s, executor.broadcast_bytes)
            return [s.tokens[s.prompt_len:] for s in seqs]
        finally:
            self._call_lock.release()

    def _check_request(self, i: int, prompt: list[int], max_new_tokens: int) -> None:
        vocab = self.model_config.vocab_size
        if not prompt:
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
        if min(prompt) < 0 or max(prompt) >= vocab:
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise ValueError(f"prompts[{i}] holds token {bad}, outside the vocabulary [0, {vocab})")
        if (reason := self.engine.scheduler.refusal(len(prompt) + max_new_tokens)) is not None:
            raise ValueError(f"prompts[{i}] ({len(prompt)} tokens) with "
                             f"max_new_tokens={max_new_tokens} {reason}")


# The model executor's steps (executors.py's registry names them): our model's forwards, timed.
def model_batches(llm: LLM, scheduler: Scheduler) -> tuple[ModelExecutor | ParallelExecutor, WallClock]:
    return llm._build_model_executor(largest_iteration_tokens(scheduler))


def warm_up(llm: LLM) -> dict[str, int] | None:
    """A throwaway request, so that first-call costs stay out of the records; its shape (None:
    ``warmup_iters=0``)."""
    warm = llm.config.warmup_iters
    if not warm:
        return None
    # No longer than a request admitted alone beside the watermark.
    length = max(1, min(llm.config.chunk_size, llm.max_model_len - warm, 256,
                        llm.block_manager.admissible_tokens - warm))
    llm.generate([[0] * length], max_new_tokens=warm, sampling=SamplingParams(ignore_eos=True))
    ran = len(llm.metrics.iterations)
    llm.metrics = Metrics()
    return {"iterations": ran, "prompt_tokens": length, "new_tokens": warm}


def model_parts(llm: LLM) -> dict[str, str]:
    """Built here, or taken over from the process's shared engine (by a run on one rank)."""
    if llm._shared is not None and llm.config.world_size == 1:
        return dict(llm._shared.parts)
    return {"model": "built", "kv_cache": "built"} | (
        {"cuda_graphs": "captured"} if llm.cuda_graphs else {})


def interpreted_times(llm: LLM) -> str | None:
    """Why its times are not its kernels' whatever the load: our attention on an interpreter."""
    from sarathi_lab.attention.backend import interpreted

    return interpreted(llm.config.attention, llm.device)


def simulated_batches(llm: LLM, scheduler: Scheduler) -> tuple[Executor, VirtualClock]:
    """The simulator's: the plan's cost model on a virtual clock."""
    clock = VirtualClock()
    return simulated_executor(llm.plan.cost_model, clock, eos_token_of(llm.model_config)), clock


def largest_iteration_tokens(scheduler: Scheduler) -> int:

    config = scheduler.config
    every = config.max_batch_size * config.max_model_len
    bound = type(scheduler).largest_iteration_tokens(config)
    return every if bound is None else min(bound, every)
