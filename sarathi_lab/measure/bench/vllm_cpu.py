"""vLLM's CPU build as a system of ``bench.versus``, in the same process, at the same token budget,
batch size and cores. Optional, in a venv of its own (docs/benchmarks.md)."""
from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Callable


def available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _kv_bytes_per_token(model_dir: str, dtype: str) -> int:
    import torch
    from transformers import AutoConfig

    from sarathi_lab.model.shape import Shape

    elem_bytes = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    return Shape.of(AutoConfig.from_pretrained(model_dir)).kv_bytes_per_token(elem_bytes)


def build(model_dir: str, threads: int, dtype: str, batch_size: int, token_budget: int,
          max_model_len: int) -> Callable[[list[list[int]], list[int]], list[list[int]]]:
    cores = sorted(os.sched_getaffinity(0))[:threads]
    # Set before vLLM reads them. Its KV cache is zero-filled at start: room for the batch's
    # longest requests, in whole GiB, not more.
    kv_bytes = batch_size * max_model_len * _kv_bytes_per_token(model_dir, dtype)
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(threads),
                       "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
                       "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                       "VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_bytes / 2**30))),
                       "VLLM_LOGGING_LEVEL": "WARNING"})
    from vllm import LLM, SamplingParams

    logging.getLogger("vllm").setLevel(logging.WARNING)
    llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype=dtype, enable_prefix_caching=False,
              enable_chunked_prefill=True, max_num_batched_tokens=token_budget,
              max_num_seqs=batch_size, max_model_len=max_model_len, seed=0)

    def serve(prompts: list[list[int]], new_tokens: list[int]) -> list[list[int]]:
        params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                                 detokenize=False)
                  for n in new_tokens]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return serve
