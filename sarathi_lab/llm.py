"""The public entry point: ``LLM(model=..., scheduler=...).generate(prompts)``."""
from __future__ import annotations

import os
from typing import Callable

import torch

from sarathi_lab.attention import make_backend
from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import DeviceClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import IterationRecord, Metrics
from sarathi_lab.engine.model_runner import ModelRunner
from sarathi_lab.engine.sampler import Sampler
from sarathi_lab.engine.scheduler import SchedulerConfig, make_scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.model import build_model, load_config
from sarathi_lab.model.decoder import head_dim_of

# Without an explicit budget the CPU cache may take at most this share of the machine's memory.
_CPU_KV_MEMORY_SHARE = 0.25
_CUDA_MEMORY_UTILISATION = 0.9


class LLM:
    def __init__(self, model: str = "tiny", **kwargs):
        self.config = EngineConfig(model=model, **kwargs)
        cfg = self.config
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        self.model_config = load_config(cfg.model)
        self.max_model_len = self._max_model_len()
        device = cfg.torch_device
        self.dtype = dtype = cfg.torch_dtype
        backend = make_backend(cfg.attention, device)
        self.model = build_model(cfg.model, self.model_config, backend, self.max_model_len, dtype, device, cfg.seed,
                                 cfg.cpu_linear)
        self.num_kv_blocks = self._num_kv_blocks()
        self.kv_caches = self._allocate_kv_cache()
        self.block_manager = BlockManager(self.num_kv_blocks, cfg.block_size)
        scheduler = make_scheduler(cfg.scheduler, SchedulerConfig(cfg.max_batch_size, cfg.chunk_size, cfg.budget),
                                   self.block_manager)
        runner = ModelRunner(self.model, self.kv_caches, cfg.block_size, device)
        self.engine = LLMEngine(scheduler, runner, DeviceClock(device))
        self.metrics = Metrics()
        self._next_id = 0
        if cfg.warmup_iters:
            self._warm_up()

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.config.block_size

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int] = 16,
                 sampling: SamplingParams | None = None, arrival_times: list[float] | None = None,
                 on_iteration: Callable[[IterationRecord], None] | None = None) -> list[list[int]]:
        """Generated token ids of each prompt, in input order. Greedy unless ``sampling`` says
        otherwise. Per-iteration and per-request records of this call land in ``self.metrics``."""
        sampling = sampling or SamplingParams()
        n = len(prompts)
        new_tokens = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
        arrivals = [0.0] * n if arrival_times is None else list(arrival_times)
        if len(new_tokens) != n or len(arrivals) != n:
            raise ValueError(f"got {n} prompts but {len(new_tokens)} max_new_tokens and {len(arrivals)} arrival_times")
        eos = None if sampling.ignore_eos else getattr(self.model_config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0]
        seqs = []
        for prompt, new, arrival in zip(prompts, new_tokens, arrivals):
            self._check_request(prompt, new)
            seqs.append(Sequence(self._next_id, list(prompt), new, arrival, eos))
            self._next_id += 1
        self.metrics = Metrics()
        self.engine.run(seqs, Sampler(sampling, self.config.torch_device), self.metrics, on_iteration)
        return [s.tokens[s.prompt_len:] for s in seqs]

    def _check_request(self, prompt: list[int], max_new_tokens: int) -> None:
        vocab = self.model_config.vocab_size
        if not prompt:
            raise ValueError("prompt is empty: every prompt needs at least one token")
        if not all(isinstance(t, int) and 0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not (isinstance(t, int) and 0 <= t < vocab))
            raise ValueError(f"prompt token {bad!r} is outside the vocabulary [0, {vocab})")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: must be an int >= 1")
        total = len(prompt) + max_new_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) = {total} tokens exceeds"
                             f" the model's context of {self.max_model_len}")
        if total > self.kv_capacity_tokens:
            raise ValueError(f"a request of {total} tokens cannot fit the KV cache of {self.kv_capacity_tokens}"
                             " tokens even alone; raise num_kv_blocks or kv_cache_gb")

    def _max_model_len(self) -> int:
        hf = self.model_config
        limit = hf.max_position_embeddings
        # Sliding-window attention is not implemented, so the context stops at the window.
        if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
            limit = min(limit, hf.sliding_window)
        if self.config.max_model_len is not None:
            if self.config.max_model_len > limit:
                raise ConfigError(f"max_model_len={self.config.max_model_len} is invalid: the model allows at most"
                                  f" {limit}")
            return self.config.max_model_len
        return limit

    def _block_bytes(self) -> int:
        hf, cfg = self.model_config, self.config
        kv_heads = hf.num_key_value_heads or hf.num_attention_heads
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * hf.num_hidden_layers * cfg.block_size * kv_heads * head_dim_of(hf) * elem

    def _num_kv_blocks(self) -> int:
        cfg, block_bytes = self.config, self._block_bytes()
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        if cfg.kv_cache_gb is not None:
            blocks = int(cfg.kv_cache_gb * 2**30 // block_bytes)
        elif cfg.torch_device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(cfg.torch_device)
            blocks = int(free * _CUDA_MEMORY_UTILISATION // block_bytes)
        else:
            wanted = cfg.max_batch_size * -(-self.max_model_len // cfg.block_size)
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            blocks = min(wanted, int(ram * _CPU_KV_MEMORY_SHARE // block_bytes))
        if blocks < 1:
            raise ConfigError(f"kv_cache_gb={cfg.kv_cache_gb} is invalid: it holds no block of {block_bytes} bytes")
        return blocks

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        hf, cfg = self.model_config, self.config
        kv_heads = hf.num_key_value_heads or hf.num_attention_heads
        cache = torch.zeros(hf.num_hidden_layers, 2, self.num_kv_blocks, cfg.block_size, kv_heads,
                            head_dim_of(hf), dtype=self.dtype, device=cfg.torch_device)
        return [(layer[0], layer[1]) for layer in cache]

    def _warm_up(self) -> None:
        """Run the real path on a throwaway request so that first-call costs stay out of the records."""
        length = max(1, min(self.config.chunk_size, self.max_model_len - self.config.warmup_iters, 256,
                            self.kv_capacity_tokens - self.config.warmup_iters))
        self.generate([[0] * length], max_new_tokens=self.config.warmup_iters,
                      sampling=SamplingParams(ignore_eos=True))
        self.metrics = Metrics()
