"""The engine parts a process keeps for its next engine. A sweep's jobs run one after another in one
process (Hydra's basic launcher), and most agree on the model: they share one set of weights, drawn
again in place for a job of another seed, one KV cache (zeroed for each job, rebuilt only to grow),
rotary tables per context, and CUDA graphs captured once per set of shapes and replayed by every job
that captures that set. Each part is reset to what a fresh build holds, so a job's tokens and
iterations are a fresh engine's; each build and rebuild is one log line (``engine: ...``)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from sarathi_lab.attention import AttentionBackend
    from sarathi_lab.model.cuda_graphs import CudaGraphs
    from sarathi_lab.model.decoder import CausalLM
    from sarathi_lab.model.nano_batch import OverlapRule
    from sarathi_lab.model.spec import ModelConfig

log = logging.getLogger("sarathi_lab")
# Graph sets kept at once (the oldest dropped first); one memory pool serves them all.
MAX_GRAPH_SETS = 16


@dataclass(frozen=True)
class ModelKey:
    """What the weights' tensors are: another value of any of these builds another model."""
    model: str
    dtype: str
    device: str
    attention: str
    cpu_linear: str

    def __str__(self) -> str:
        return f"{self.model} ({self.dtype} on {self.device}, attention {self.attention})"


@dataclass(frozen=True)
class GraphKey:
    """What a set of CUDA graphs was captured for (CudaGraphs' arguments and what they read)."""
    max_batch: int
    max_blocks: int
    mixed_tokens: int | None
    hybrid: str
    overlap: OverlapRule
    max_positions: int

    def __str__(self) -> str:
        mixed = f", mixed batches up to {self.mixed_tokens} tokens" if self.mixed_tokens else ""
        return f"batches up to {self.max_batch} requests of {self.max_blocks} blocks{mixed}"


@dataclass
class _Kept:
    key: ModelKey
    model_config: ModelConfig
    model: CausalLM
    seed: int | None  # None: weights of no seed (a draw cut short)
    free_before: int | None  # a GPU's free bytes before the build: what a fresh process finds
    rotary: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    cache: torch.Tensor | None = None
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    graphs: dict[GraphKey, CudaGraphs] = field(default_factory=dict)
    pool: Any = None


class SharedEngine:
    """At most one model at a time, with its KV cache and graphs; ``release`` frees them."""

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self.builds = 0  # models built, for tests and the log's count
        # What the last engine took of each part: built, re-seeded, reused, captured.
        self.parts: dict[str, str] = {}

    def model(self, key: ModelKey, model_config: ModelConfig, seed: int, max_positions: int,
              backend: AttentionBackend, build: Callable[[], CausalLM]) -> CausalLM:
        """The kept model where ``key`` and the config agree (its weights those of ``seed``, its
        rotary tables ``max_positions`` long, its attention ``backend``'s settings); else built."""
        kept = self._kept
        if kept is None or kept.key != key or kept.model_config != model_config:
            self.parts = {"model": "built"}
            return self._build(key, model_config, seed, max_positions, build)
        what, self.parts = [], {"model": "reused"}
        if seed != kept.seed:
            from sarathi_lab.model.loader import reseed

            start = time.perf_counter()
            # Weights half drawn (a signal, an error) belong to no seed: the next job draws again.
            kept.seed = None
            if reseed(kept.model, key.model, seed):
                what.append(f"weights drawn again for seed {seed} in place "
                            f"({time.perf_counter() - start:.1f} s)")
                self.parts["model"] = "re-seeded"
            kept.seed = seed
        if changed := _align_backend(kept.model.backend, backend):
            # Graphs captured under other attention settings launch other kernels.
            self._drop_graphs()
            what.append(f"attention settings reset to a fresh engine's ({', '.join(changed)}): "
                        "graphs dropped")
        self._use_rotary(kept, max_positions)
        log.info("engine: reused model %s%s", key, "; " + "; ".join(what) if what else "")
        return kept.model

    def _build(self, key: ModelKey, model_config: ModelConfig, seed: int, max_positions: int,
               build: Callable[[], CausalLM]) -> CausalLM:
        held = self._kept is not None
        self.release()  # before the build: the plan counted the kept memory as free
        free = _free_bytes(key.device)
        model = built(key, seed, build, " (the kept one did not match)" if held else "")
        self._kept = kept = _Kept(key, model_config, model, seed, free)
        kept.rotary[max_positions] = _tables(model)
        self.builds += 1
        return model

    def _use_rotary(self, kept: _Kept, max_positions: int) -> None:
        """A context's tables as a fresh model computes them, kept: graphs captured over them stay
        valid when a later job returns to that context."""
        rotary = kept.model.layers[0].self_attn.rotary
        if max_positions not in kept.rotary:
            from sarathi_lab.model.loader import rotary_for

            weight = kept.model.embed_tokens.weight
            fresh = rotary_for(kept.model_config, weight.dtype, weight.device, max_positions)
            kept.rotary[max_positions] = fresh.cos, fresh.sin
            log.info("engine: rotary tables built for a context of %d positions", max_positions)
        rotary.cos, rotary.sin = kept.rotary[max_positions]

    def kv_caches(self, shape: tuple[int, ...], dtype: torch.dtype,
                  device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (key, value) cache of at least ``shape``'s blocks, zeroed as a fresh one
        is; a larger kept cache serves (the block manager hands out ``shape``'s blocks only)."""
        import torch

        kept = self._kept
        assert kept is not None, "kv_caches before model"
        cache = kept.cache
        fits = (cache is not None and cache.dtype == dtype and _same_device(cache.device, device)
                and cache.shape[:2] == shape[:2] and cache.shape[3:] == shape[3:]
                and cache.shape[2] >= shape[2])
        if fits:
            cache.zero_()
            self.parts["kv_cache"] = "reused"
            return kept.kv_caches
        was = "" if cache is None else f" (the kept one held {cache.shape[2]})"
        # Graphs read the old cache's addresses; both are freed before the new one is taken.
        self._drop_graphs()
        kept.cache, kept.kv_caches = None, []
        del cache
        _free_cached(device)
        kept.cache = cache = torch.zeros(shape, dtype=dtype, device=device)
        kept.kv_caches = [(layer[0], layer[1]) for layer in cache]
        log.info("engine: KV cache built: %d blocks of %d tokens%s", shape[2], shape[3], was)
        self.parts["kv_cache"] = "built"
        return kept.kv_caches

    def graphs(self, key: GraphKey,
               capture: Callable[[Any], CudaGraphs | None]) -> tuple[CudaGraphs | None, bool]:
        """The set captured for ``key`` and whether it was kept; ``capture(pool)`` makes one."""
        kept = self._kept
        assert kept is not None, "graphs before model"
        if key in kept.graphs:
            graphs = kept.graphs.pop(key)
            kept.graphs[key] = graphs  # the most recently used last
            log.info("engine: CUDA graphs reused (%d, %s)", len(graphs.graphs), key)
            self.parts["cuda_graphs"] = "reused"
            return graphs, True
        graphs = capture(kept.pool)
        if graphs is None:  # a failed capture (warned) is tried again by the next job, as afresh
            return None, False
        kept.pool = graphs.pool
        self.parts["cuda_graphs"] = "captured"
        log.info("engine: CUDA graphs captured (%d in %.1f s, %s)", len(graphs.graphs),
                 graphs.record["capture_s"], key)
        kept.graphs[key] = graphs
        while len(kept.graphs) > MAX_GRAPH_SETS:
            del kept.graphs[next(iter(kept.graphs))]
        return graphs, False

    def _drop_graphs(self) -> None:
        if self._kept is not None and self._kept.graphs:
            self._kept.graphs.clear()
            self._kept.pool = None

    def free_before(self, device: torch.device) -> int | None:
        """A GPU's free bytes before the kept engine was built there, as a fresh process would
        find them (None: nothing kept on it). Every job plans from the same figure."""
        kept = self._kept
        return kept.free_before if kept is not None and kept.key.device == str(device) else None

    def held_bytes(self, device: torch.device) -> int:
        """The host memory the kept engine's tensors take, which a fresh process would find free
        (0 for a GPU: free_before)."""
        kept = self._kept
        if kept is None or device.type != "cpu" or kept.key.device != str(device):
            return 0
        tensors = [*kept.model.parameters(), *kept.model.buffers()]
        tensors += [kept.cache] if kept.cache is not None else []
        tensors += [t for pair in kept.rotary.values() for t in pair]
        return sum(_nbytes(t) for t in {id(t): t for t in tensors}.values())

    def release(self) -> None:
        """Everything freed (the device's cached blocks too)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            device = kept.key.device
            del kept
            _free_cached(device)


def built(key: ModelKey, seed: int, build: Callable[[], CausalLM], note: str = "") -> CausalLM:
    """``build()``, said in the one line that counts builds, shared or not."""
    start = time.perf_counter()
    model = build()
    log.info("engine: built model %s, seed %d, in %.1f s%s", key, seed, time.perf_counter() - start,
             note)
    return model


def _align_backend(kept: AttentionBackend, fresh: AttentionBackend) -> list[str]:
    """The kept backend's settings (public attributes) set to a fresh one's; the names changed."""
    changed = []
    for name, value in vars(fresh).items():
        if not name.startswith("_") and getattr(kept, name, None) != value:
            setattr(kept, name, value)
            changed.append(name)
    return changed


def _same_device(held: torch.device, asked: torch.device) -> bool:
    """A tensor's device names its index (cuda:0); the plan's may not (cuda: the current one)."""
    return held.type == asked.type and asked.index in (None, held.index)


def _tables(model: CausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = model.layers[0].self_attn.rotary
    return rotary.cos, rotary.sin


def _nbytes(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # an opaque (packed) tensor has no storage
        return t.numel() * t.element_size()


def _free_bytes(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    _free_cached(device)
    return torch.cuda.mem_get_info(torch.device(device))[0]


def _free_cached(device: torch.device | str) -> None:
    if str(device).startswith("cuda"):
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


# The process's own: the harness hands it to each job's engine (harness/runner.py).
SHARED = SharedEngine()
