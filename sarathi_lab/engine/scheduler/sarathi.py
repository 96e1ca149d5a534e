from dataclasses import dataclass
from typing import Literal

from sarathi_lab.config import ConfigError
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, SchedulerConfig, register_scheduler
from sarathi_lab.engine.sequence import Sequence, split_prefilling
from sarathi_lab.engine.tiles import GEMM_TILE, aligned_chunk

CHUNK_ALIGNS = ("auto", "none", "tile")


@dataclass(frozen=True, kw_only=True)
class SarathiConfig(SchedulerConfig):
    chunk_size: int
    # "tile": the chunk shrinks so it and its decodes fill whole GEMM tiles (one token past a tile
    # costs a whole tile); "none": chunk_size as set; "auto": "tile" where a chunk can fill one.
    chunk_align: Literal[CHUNK_ALIGNS] = "auto"
    tile: int = GEMM_TILE

    def __post_init__(self):
        super().__post_init__()
        if self.chunk_align == "tile" and self._most_tokens() < self.tile:
            raise ConfigError("chunk_align", self.chunk_align,
                              "is invalid with " + self.setting("chunk_size") + ", "
                              + self.setting("max_batch_size") + ", " + self.setting("tile")
                              + f": a chunk and its decodes (at most {self._most_tokens()} tokens) "
                              "never fill a whole tile",
                              "none, auto, or " + self.key("chunk_size")
                              + f"={self.tile - self.max_batch_size + 1} or more, or a smaller "
                              "tile")

    def _most_tokens(self) -> int:
        return self.chunk_size + self.max_batch_size - 1

    @property
    def chunk_alignment(self) -> str:
        if self.chunk_align != "auto":
            return self.chunk_align
        return "tile" if self._most_tokens() >= self.tile else "none"


@register_scheduler("sarathi")
class SarathiScheduler(Scheduler):
    """SARATHI's decode-maximal batching: every running decode plus one request's prefill chunk."""

    Config = SarathiConfig
    config: SarathiConfig

    @classmethod
    def largest_iteration_tokens(cls, config: SarathiConfig) -> int:
        # One chunk beside a decode per running request.
        return config.chunk_size + config.max_batch_size

    def chunk_tokens(self, decodes: int) -> int:
        """Where no aligned chunk exists, chunk_size as set: the prompt must go on, and the
        iteration holds at most chunk_size + decodes tokens."""
        size = self.config.chunk_size
        if self.config.chunk_alignment == "none":
            return size
        try:
            return aligned_chunk(size, decodes, self.config.tile)
        except ValueError:
            return size

    def micro_batch(self, free: list[Sequence]) -> list[Sequence]:
        """B - 1 decodes and a prompt's chunk wherever a prompt can go: the oldest B requests
        not in flight, all decoding, would leave out the ongoing prefill behind them, or the
        waiting prompt the pipeline has room for (B requests a micro-batch in flight), and the
        micro-batch would go out without a chunk."""
        cap = self.config.max_batch_size
        shown = free[:cap]
        if len(shown) < cap or split_prefilling(shown)[1]:
            return shown
        ongoing = split_prefilling(free[cap:])[1]
        if ongoing:
            return shown[:cap - 1] + ongoing[:1]
        if (self.waiting and len(self.running) < cap * self.micro_batches
                and self._admits(self.waiting[0])):
            return shown[:cap - 1]
        return shown

    def compose(self, batch: ScheduledBatch) -> None:
        ongoing = self._schedule_decodes(batch)
        size = self.chunk_tokens(batch.num_decode_tokens)
        if ongoing:
            self._schedule_chunk(ongoing[0], size, batch)
        elif self.waiting and len(self.running) < self.config.max_batch_size:
            self._schedule_chunk(self.waiting[0], size, batch)

    def likely_chunks(self, num_decodes: int, uncomputed: list[int]) -> list[int]:
        """compose's one chunk, for the oldest ongoing prefill."""
        if not uncomputed:
            return []
        return [min(uncomputed[0], self.chunk_tokens(num_decodes))] + [0] * (len(uncomputed) - 1)
