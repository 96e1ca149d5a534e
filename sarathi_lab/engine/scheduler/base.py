"""Scheduler interface and registry. Out of cache the newest is preempted, so the oldest
progresses; orca and static reserve max_model_len on admission instead."""
from __future__ import annotations

import bisect
import difflib
import functools
import heapq
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from sarathi_lab.config import (
    ENGINE_FIELDS,
    ConfigError,
    Key,
    Words,
    Written,
    check_choice,
    check_fields,
    marked_as,
    settings_of,
)
from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.block_manager import BlockManager, blocks_for
from sarathi_lab.engine.next_batch import NextBatch, finishes_by_length, likely_next
from sarathi_lab.engine.sequence import Sequence, Status, append_tokens, split_prefilling

log = logging.getLogger(__name__)


# The waiting requests likely_next reads: an iteration's budget is spent by a few prompts.
LIKELY_JOINS = 4


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    max_batch_size: int
    max_model_len: int
    # {field: engine setting} where the scheduler's word differs: one name in the engine.
    reads_as: ClassVar[dict[str, str]] = {}

    def __post_init__(self):
        # The engine's settings it reads were checked as EngineConfig's: only its knobs here.
        engine = {f.name for f in settings_of(type(self))} - set(self.knobs())
        with marked_as(self.reads_as):
            check_fields(self, positive=True, held=engine)

    def key(self, name: str) -> Key:
        """A field named in a refusal as the engine's setting."""
        return Key(self.reads_as.get(name, name))

    def setting(self, name: str) -> Key:
        """A field and its value named in a refusal as the engine's setting."""
        return Key(self.reads_as.get(name, name), getattr(self, name))

    @classmethod
    def of(cls, settings: dict[str, Any]) -> SchedulerConfig:
        named = {f.name: cls.reads_as.get(f.name, f.name) for f in settings_of(cls)}
        return cls(**{name: settings[by] for name, by in named.items() if by in settings})

    @classmethod
    def reads(cls) -> frozenset[str]:
        return frozenset(cls.reads_as.get(f.name, f.name) for f in settings_of(cls))

    @property
    def chunk_alignment(self) -> str:
        return "none"

    @classmethod
    def knobs(cls) -> tuple[str, ...]:
        return tuple(f.name for f in settings_of(cls)
                     if cls.reads_as.get(f.name, f.name) not in ENGINE_FIELDS)


class Scheduler(ABC):
    name: str
    Config: type[SchedulerConfig] = SchedulerConfig
    reserves_max_model_len = False
    # An iteration may hold as many tokens as the cache: both are sized together on a GPU.
    prefills_whole_prompts = False

    @classmethod
    def largest_iteration_tokens(cls, config: SchedulerConfig) -> int | None:
        """A GPU keeps activations for this many tokens; None: the batch and cache bound it."""
        return None

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.blocks = block_manager
        if (why := self.cache_refusal(config, block_manager)) is not None:
            raise ConfigError("num_kv_blocks", block_manager.num_blocks, "is invalid" + why)
        self.waiting: list[Sequence] = []  # in arrival order, preempted requests included
        self.running: list[Sequence] = []
        self.in_flight: set[int] = set()
        # Micro-batches a pipeline holds at once, each of up to max_batch_size requests (the cache
        # is sized for all of them); the engine sets it from its executor.
        self.micro_batches = 1

    @classmethod
    def cache_refusal(cls, config: SchedulerConfig, block_manager: BlockManager) -> Words | None:
        """What follows "is invalid" where one request's reserved blocks don't fit."""
        need = cls.reserved_blocks(config.max_model_len, block_manager.block_size)
        kept = block_manager.watermark_blocks
        if need <= block_manager.admissible_blocks:
            return None
        watermark = config.key("kv_watermark")
        beside = f" beside the {kept} its " + watermark + " keeps free" if kept else ""
        return (" with " + config.key("scheduler") + f"={cls.name}: it reserves "
                + config.setting("max_model_len") + f" tokens ({need} blocks) for each "
                f"request" + beside + f"; allowed: >= {need + kept} blocks, or a smaller "
                + config.key("max_model_len"))

    @classmethod
    def reserved_blocks(cls, max_model_len: int, block_size: int) -> int:
        return blocks_for(max_model_len, block_size) if cls.reserves_max_model_len else 0

    def refusal(self, total: int) -> str | None:
        """The one fit check (``add``, LLM and the preflight use it)."""
        if total > self.config.max_model_len:
            return f"has {total} tokens, more than max_model_len={self.config.max_model_len}"
        # Its last token is never cached. One that cannot fit alone would be preempted forever or
        # stall the engine.
        cached, blocks = total - 1, self.blocks
        if cached > blocks.admissible_tokens:
            held = blocks.num_blocks * blocks.block_size
            room = (f"the {blocks.admissible_tokens} of its {held} tokens one request is "
                    f"admitted with (its kv_watermark keeps {blocks.watermark_blocks} blocks free)"
                    if blocks.watermark_blocks else f"all {held} tokens it holds")
            return f"needs {cached} tokens of KV cache, more than {room}"
        return None

    def add(self, seq: Sequence) -> None:
        reason = self.refusal(seq.prompt_len + seq.max_new_tokens)
        if reason is not None:
            raise ValueError(f"request {seq.seq_id} {reason}")
        seq.status = Status.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.priority)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """The oldest ``max_batch_size`` not ``in_flight``: micro-batches must not merge."""
        batch = ScheduledBatch()
        everyone, cap = self.running, self.config.max_batch_size
        if not self.in_flight and len(everyone) <= cap:
            self.compose(batch)
            return batch.freeze()
        shown = self.micro_batch([s for s in everyone if s.seq_id not in self.in_flight])
        seen = {s.seq_id for s in shown}
        held = [s for s in everyone if s.seq_id not in seen]
        self.running = shown
        try:
            self.compose(batch)
        finally:  # the policy admits to and preempts from the requests it saw
            self.running = list(heapq.merge(self.running, held, key=lambda s: s.priority))
        return batch.freeze()

    def micro_batch(self, free: list[Sequence]) -> list[Sequence]:
        """The requests not in flight (``free``, oldest first) a micro-batch's policy sees."""
        return free[:self.config.max_batch_size]

    @abstractmethod
    def compose(self, batch: ScheduledBatch) -> None:
        """The policy."""

    def likely_chunks(self, num_decodes: int, uncomputed: list[int]) -> list[int] | None:
        """The chunk each ongoing prefill gets beside ``num_decodes`` decodes; None: not said."""
        return None if uncomputed else []

    def likely_next(self, batch: ScheduledBatch) -> NextBatch | None:
        """``batch``'s likely successor (next_batch.py), read without deciding it."""
        # What this batch finishes by length leaves its slot and blocks to the waiting.
        leaving = [seq for seq in batch.sampled if finishes_by_length(seq)]
        room = self.config.max_batch_size - len(self.running) + len(leaving)
        freed = sum(len(seq.block_table) for seq in leaving)
        joining = []
        for seq in self.waiting[:min(room, LIKELY_JOINS)]:
            if not self._admits(seq, freed):
                break
            joining.append(seq)
        return likely_next(batch, self.likely_chunks, joining)

    def update(self, batch: ScheduledBatch, tokens: list[int]) -> list[Sequence]:
        """vLLM's update_from_output: the scheduler alone owns request state."""
        sampled = batch.sampled
        if len(tokens) != len(sampled):
            raise ValueError(f"{len(tokens)} tokens for {len(sampled)} sampled requests")
        for chunk in batch.prefills:
            chunk.seq.num_computed += chunk.num_tokens
        for seq in batch.decodes:
            seq.num_computed += 1
        finished = append_tokens(sampled, tokens)
        for seq in finished:
            self.blocks.free(seq)
            seq.status = Status.FINISHED
            self.running.remove(seq)
        return finished

    def abort_all(self) -> list[Sequence]:
        dropped = self.waiting + self.running
        for seq in dropped:
            self.blocks.free(seq)
            seq.num_computed = 0
        self.waiting, self.running = [], []
        self.in_flight.clear()
        return dropped

    def _admits(self, seq: Sequence, freed: int = 0) -> bool:
        """Only while all its tokens' blocks are free (can_allocate): one admitted on its first
        chunk alone finds later chunks' blocks taken by decodes and recomputes forever. ``freed``:
        blocks about to be freed, which a guess ahead counts."""
        return self.blocks.can_admit(seq, self._admission_tokens(seq), freed)

    def _admission_tokens(self, seq: Sequence) -> int:
        return self.config.max_model_len if self.reserves_max_model_len else seq.num_uncomputed

    def _admit(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        seq.status = Status.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.priority)

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.blocks.free(seq)
        seq.num_computed = 0
        self.running.remove(seq)
        self.add(seq)
        batch.preempted.append(seq)

    def _reserve(self, seq: Sequence, num_tokens: int, batch: ScheduledBatch) -> bool:
        """Preempts newer requests not in ``batch``; False if ``seq`` itself was preempted."""
        while not self.blocks.can_fit(seq, num_tokens):
            victim = next(s for s in reversed(self.running) if s is seq or s not in batch)
            self._preempt(victim, batch)
            if victim is seq:
                return False
        self.blocks.allocate(seq, num_tokens)
        return True

    def _schedule_decodes(self, batch: ScheduledBatch) -> list[Sequence]:
        """Returns the requests still prefilling (one pass for both, every iteration)."""
        decoding, prefilling = split_prefilling(self.running)
        # Only a decode starting a block needs one (vLLM's append_slots).
        blocks, block_size = self.blocks, self.blocks.block_size
        starting = [s for s in decoding if s.num_computed >= len(s.block_table) * block_size]
        if len(starting) <= blocks.num_free:
            for seq in starting:
                blocks.append_block(seq)
            batch.decodes.extend(decoding)
            return prefilling
        decodes = batch.decodes
        for seq in decoding:
            if seq.status is not Status.RUNNING:  # preempted by an earlier decode's reservation
                continue
            if (seq.num_computed < len(seq.block_table) * block_size
                    or self._reserve(seq, 1, batch)):
                decodes.append(seq)
        return [s for s in prefilling if s.status is Status.RUNNING]

    def _schedule_whole_prefills(self, batch: ScheduledBatch, max_tokens: int | None = None,
                                 max_prompts: int | None = None) -> None:
        tokens = 0
        while self.waiting and len(self.running) < self.config.max_batch_size:
            if max_prompts is not None and len(batch.prefills) >= max_prompts:
                break
            seq = self.waiting[0]
            if not self._admits(seq):
                break
            # The first prompt always goes: one longer than the cap would otherwise wait forever.
            if max_tokens is not None and tokens and tokens + seq.num_uncomputed > max_tokens:
                break
            tokens += seq.num_uncomputed
            self._admit(seq)
            self.blocks.allocate(seq, self._admission_tokens(seq))
            batch.prefills.append(ScheduledChunk(seq, seq.num_uncomputed))

    def _schedule_chunk(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> int:
        n = min(seq.num_uncomputed, budget)
        if seq.status is Status.WAITING:
            if not self._admits(seq):
                return 0
            self._admit(seq)
            self.blocks.allocate(seq, n)
        elif not self._reserve(seq, n, batch):
            return 0
        batch.prefills.append(ScheduledChunk(seq, n))
        return n


_REGISTRY: dict[str, type[Scheduler]] = {}


def register_scheduler(name: str):
    def wrap(cls: type[Scheduler]) -> type[Scheduler]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return wrap


def scheduler_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def scheduler_class(name: str) -> type[Scheduler]:
    check_choice("scheduler", name, tuple(_REGISTRY))
    return _REGISTRY[name]


def knob_names() -> set[str]:
    return {knob for cls in _REGISTRY.values() for knob in cls.Config.knobs()}


def scheduler_config(name: str, knobs: dict[str, Any] | None = None,
                     **settings: Any) -> SchedulerConfig:
    """Another scheduler's knob is ignored, so one config serves a sweep over schedulers."""
    cls, knobs, known = scheduler_class(name), knobs or {}, knob_names()
    for key, value in knobs.items():
        if key not in known:
            raise unknown_knob(key, repr(value))
    for key, value in knobs.items():
        if key not in cls.Config.knobs():
            _warn_foreign_knob(name, key, repr(value))
    return cls.Config.of(settings | knobs)


def unknown_knob(key: str, shown: str) -> ConfigError:
    """A misspelt engine setting lands here too (LLM(chunk=256)): the nearest of both named."""
    known = knob_names()
    names = sorted(known | ENGINE_FIELDS - {"scheduler_knobs"})
    near = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = " nor engine setting (nearest: " + Key(near[0]) + f"={shown})" if near else ""
    return ConfigError(key, Written(shown), "is invalid: no scheduler has this knob" + hint,
                       ", ".join(sorted(known)) or "none")


def knob_owners(key: str) -> list[str]:
    return sorted(n for n, c in _REGISTRY.items() if key in c.Config.knobs())


def foreign_knob(name: str, key: str, value: Any) -> ConfigError | None:
    """Refuses another scheduler's knob set for one engine: never silently dropped."""
    if key in scheduler_class(name).Config.knobs() or not (owners := knob_owners(key)):
        return None
    s, knobs = Key("scheduler"), scheduler_class(name).Config.knobs()
    return ConfigError(key, value, f"is invalid: {key} is a knob of " + s
                       + f"={' and '.join(owners)}, not of " + s + f"={name}",
                       s + f"={owners[0]} with it, or " + s
                       + f"={name}'s knobs: {', '.join(knobs) or 'none'}")


@functools.cache
def _warn_foreign_knob(name: str, key: str, value: str) -> None:
    # Said once, so a sweep over schedulers warns once; a single engine refused it before.
    log.info("%s=%s is ignored by scheduler=%s: a knob of scheduler=%s", key, value, name,
             " and ".join(knob_owners(key)))


def make_scheduler(name: str, block_manager: BlockManager, knobs: dict[str, Any] | None = None,
                   **settings: Any) -> Scheduler:
    return scheduler_class(name)(scheduler_config(name, knobs, **settings), block_manager)
