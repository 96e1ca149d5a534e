from dataclasses import dataclass
from typing import Literal

from sarathi_lab.config import ConfigError
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, SchedulerConfig, register_scheduler
from sarathi_lab.engine.tiles import GEMM_TILE, aligned_chunk

CHUNK_ALIGNS = ("auto", "none", "tile")


@dataclass(frozen=True, kw_only=True)
class SarathiConfig(SchedulerConfig):
    # The prefill chunk: tokens of one request's prompt per iteration.
    chunk_size: int
    # "tile": each iteration's chunk shrinks so that it and the decodes beside it fill whole `tile`-token
    # GEMM tiles, as the paper sized its chunks: one token past a tile costs a whole tile. "none": every
    # chunk is chunk_size tokens (or what is left of the prompt). "auto", the default: "tile" wherever a
    # chunk beside decodes can fill a tile, "none" where none can (a chunk too small for the tile).
    chunk_align: Literal[CHUNK_ALIGNS] = "auto"
    tile: int = GEMM_TILE

    def __post_init__(self):
        super().__post_init__()
        if self.chunk_align == "tile" and self._most_tokens() < self.tile:
            raise ConfigError(f"{self.setting('chunk_align')} is invalid with {self.setting('chunk_size')}, "
                              f"{self.setting('max_batch_size')}, {self.setting('tile')}: a chunk and its decodes (at "
                              f"most {self._most_tokens()} tokens) never fill a whole tile; allowed: none, auto, or "
                              f"{self.key('chunk_size')}={self.tile - self.max_batch_size + 1} or more, or a smaller "
                              "tile")

    def _most_tokens(self) -> int:
        return self.chunk_size + self.max_batch_size - 1  # a chunk beside every other request decoding

    @property
    def chunk_alignment(self) -> str:
        """How its chunks run, "tile" or "none": chunk_align with "auto" settled (what a run records)."""
        if self.chunk_align != "auto":
            return self.chunk_align
        return "tile" if self._most_tokens() >= self.tile else "none"


@register_scheduler("sarathi")
class SarathiScheduler(Scheduler):
    """Chunked prefill with decode-maximal batching (SARATHI): every running decode plus one
    prefill chunk of ``chunk_size`` tokens, from one request at a time; tile-aligned (``chunk_align``)
    the chunk is sized per iteration so that chunk + decodes fill whole GEMM tiles."""

    Config = SarathiConfig
    config: SarathiConfig

    @classmethod
    def largest_iteration_tokens(cls, config: SarathiConfig) -> int:
        return config.chunk_size + config.max_batch_size  # one chunk beside a decode per running request

    def chunk_tokens(self, decodes: int) -> int:
        """The most prompt tokens this iteration's chunk takes beside ``decodes`` decodes: chunk_size;
        with chunk_align=tile the largest chunk up to it whose tokens with the decodes fill whole
        tiles. Where the decodes alone reach every whole tile within chunk_size + decodes, no aligned
        chunk exists, and the chunk is chunk_size as set: the prompt must go on, and the iteration
        still holds no more than chunk_size + decodes tokens."""
        size = self.config.chunk_size
        if self.config.chunk_alignment == "none":
            return size
        try:
            return aligned_chunk(size, decodes, self.config.tile)
        except ValueError:
            return size

    def compose(self, batch: ScheduledBatch) -> None:
        ongoing = self._schedule_decodes(batch)
        size = self.chunk_tokens(batch.num_decode_tokens)
        if ongoing:
            self._schedule_chunk(ongoing[0], size, batch)
        elif self.waiting and len(self.running) < self.config.max_batch_size:
            self._schedule_chunk(self.waiting[0], size, batch)
