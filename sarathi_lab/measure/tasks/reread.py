"""What chunking one prompt costs (paper Fig. 13): attention, prefill and end to end, chunked
against whole, and the KV tokens re-read (chunk k re-reads the k - 1 before it)."""
from __future__ import annotations

import statistics

import pandas as pd

from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.harness.workloads import split_length
from sarathi_lab.measure.profiling.attention import measure_reread
from sarathi_lab.measure.tasks._timing import attention_reread


def _serve_alone(llm, prompt: list[int], decode_len: int, chunk: int) -> Metrics:
    """Never tile-aligned: Fig. 13 is about the chunk's size, and a whole prompt is one chunk."""
    scheduler = make_scheduler("sarathi", llm.block_manager, max_batch_size=1, chunk_size=chunk,
                               max_model_len=llm.max_model_len, chunk_align="none")
    metrics = Metrics()
    LLMEngine(scheduler, llm.engine.executor, llm.engine.clock).run(
        [Sequence(0, prompt, decode_len)], metrics, SamplingParams(ignore_eos=True))
    return metrics


def _prefill(metrics: Metrics) -> tuple[float, int]:
    """Seconds of the prefill iterations, and the KV tokens they read per layer."""
    its = [i for i in metrics.iterations if i.num_prefill_tokens]
    return sum(i.duration for i in its), sum(i.kv_tokens_read for i in its)


def run(cfg, llm) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    prompt_len, decode_len = split_length(cfg.seq_len, cfg.pd_ratio)
    reps = cfg.measure.reps
    model = llm.plan.cost_model
    if model is not None:
        attention = attention_reread(model, prompt_len, cfg.chunk)
    else:
        # One layer's attention takes milliseconds: ten times the repetitions steady it cheaply.
        shape = llm.plan.shape
        attention = measure_reread(prompt_len, cfg.chunk, num_heads=shape.heads,
                                   num_kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                                   dtype=llm.dtype, device=llm.device,
                                   attention=llm.config.attention,
                                   block_size=llm.config.block_size, reps=10 * reps)
    prompt = [i % llm.model_config.vocab_size for i in range(prompt_len)]
    runs: dict[str, list[tuple[float, float, int]]] = {"whole": [], "chunked": []}
    for _ in range(reps):
        for mode, chunk in (("whole", prompt_len), ("chunked", cfg.chunk)):
            metrics = _serve_alone(llm, prompt, decode_len, chunk)
            runs[mode].append((*_prefill(metrics), metrics.summary()["makespan_s"]))
    med = {mode: [statistics.median(col) for col in zip(*rows)] for mode, rows in runs.items()}
    rows = [{"component": "attention", "whole_ms": attention["whole_ms"],
             "chunked_ms": attention["chunked_ms"]}]
    rows += [{"component": component, "whole_ms": med["whole"][i] * 1e3,
              "chunked_ms": med["chunked"][i] * 1e3}
             for component, i in (("prefill", 0), ("end_to_end", 2))]
    overhead = pd.DataFrame(rows).assign(slowdown=lambda d: d.chunked_ms / d.whole_ms)
    slowdown = overhead.set_index("component").slowdown
    kv_whole, kv_chunked = med["whole"][1], med["chunked"][1]
    summary = {"attention_slowdown": slowdown.attention, "prefill_slowdown": slowdown.prefill,
               "end_to_end_slowdown": slowdown.end_to_end, "kv_tokens_read_whole": kv_whole,
               "kv_tokens_read_chunked": kv_chunked, "kv_reread_ratio": kv_chunked / kv_whole,
               "num_chunks": -(-prompt_len // cfg.chunk), "prompt_len": prompt_len,
               "decode_len": decode_len}
    return summary, {"overhead": overhead}
