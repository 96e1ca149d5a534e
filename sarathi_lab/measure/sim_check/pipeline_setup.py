"""SARATHI Fig. 12's simulated setup (§5.3), every choice of the experiment in one typed place: the
paper's where it states one; where it leaves one open or this project once chose otherwise, a knob
whose default is the paper's reading and which the sensitivity table flips one at a time."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from sarathi_lab.config import AS_WRITTEN, ConfigError, check_choice, check_count

KEY = "sim_pipeline"  # errors name a knob as sim_pipeline.<field>
CHUNK_ALIGNS = ("none", "tile")
COLLECTIONS = ("as_leaves", "when_full")


@dataclass(frozen=True)
class PipelineSetup:
    requests: int = 10_000
    seed: int = 0
    # The workload (§5.3): Zipf(0.4) total lengths over 1K-4K, split at P:D 10, all at once.
    min_tokens: int = 1024
    max_tokens: int = 4096
    theta: float = 0.4
    pd_ratio: float = 10.0
    # GPT-3 on 64 A100s: TP8 within a node; PP8 across nodes, or 64 / tp replicas of TP alone.
    device: str = "a100"
    tp: int = 8
    pp: int = 8
    # The largest batch that fits (§5.3): a micro-batch's with TP+PP, a replica's with TP alone.
    batch: int = 27
    tp_only_batch: int = 11
    chunk: int = 256
    # "none": every chunk `chunk` tokens, as §5.3; "tile": shrunk so that it and its decodes fill
    # whole 128-token GEMM tiles (256 - (batch - 1)), the scheduler's own default.
    chunk_align: Literal["none", "tile"] = "none"
    # "as_leaves": a micro-batch's tokens return as it leaves the last stage (sarathi-serve's
    # PipelineParallelLLMEngine); "when_full": only when 8 are in flight or nothing else can go.
    collect: Literal["as_leaves", "when_full"] = "as_leaves"
    # The cost model's host step (prepare) on stage 0 before each forward; off: overlapped.
    stage0_host: bool = True
    # Whole prompts an Orca micro-batch takes in: 1 is the paper's best-case Orca; None, every
    # free slot's (Orca's iteration-level scheduling, tens of thousands of tokens at once).
    orca_prompts: int | None = 1

    def __post_init__(self):
        for name in ("requests", "min_tokens", "tp", "pp", "batch", "tp_only_batch", "chunk"):
            check_count(f"{KEY}.{name}", getattr(self, name), 1, AS_WRITTEN)
        check_count(f"{KEY}.seed", self.seed, 0, AS_WRITTEN)
        if self.max_tokens < self.min_tokens:
            raise ConfigError(f"{KEY}.max_tokens", self.max_tokens, "is invalid: must be >= "
                              f"{KEY}.min_tokens={self.min_tokens}", keys=AS_WRITTEN)
        for name in ("theta", "pd_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ConfigError(f"{KEY}.{name}", value, "is invalid: must be a finite number > 0",
                                  keys=AS_WRITTEN)
        check_choice(f"{KEY}.chunk_align", self.chunk_align, CHUNK_ALIGNS, AS_WRITTEN)
        check_choice(f"{KEY}.collect", self.collect, COLLECTIONS, AS_WRITTEN)
        if not isinstance(self.stage0_host, bool):
            raise ConfigError(f"{KEY}.stage0_host", self.stage0_host,
                              "is invalid: must be true or false", keys=AS_WRITTEN)
        if self.orca_prompts is not None:
            check_count(f"{KEY}.orca_prompts", self.orca_prompts, 1, AS_WRITTEN)

    @property
    def replicas(self) -> int:
        """TP alone on the same GPUs: one replica per pipeline stage's node."""
        return self.pp

    @property
    def collect_as_leaves(self) -> bool:
        return self.collect == "as_leaves"

    def knobs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Flip:
    """One knob away from the paper's setup."""
    label: str
    knob: str
    value: Any

    def applied(self, setup: PipelineSetup) -> PipelineSetup:
        return replace(setup, **{self.knob: self.value})


# What the paper leaves open or what this project ran before: the sensitivity table's rows.
FLIPS = (
    Flip("chunks tile-aligned (256 - (B - 1))", "chunk_align", "tile"),
    Flip("outputs collected when the pipeline is full", "collect", "when_full"),
    Flip("no host step on stage 0", "stage0_host", False),
    Flip("batch 32 a micro-batch (TP+PP)", "batch", 32),
    Flip("Orca takes every free slot's prompt", "orca_prompts", None),
)
