"""sarathi_lab against what a user would run instead: transformers ``generate`` with static batching.

Both systems run the same weights (a random model of the preset's shape, saved with
``save_pretrained`` and loaded by the engine from that directory), the same threads and the same
dtype: the one the engine runs (``--dtype bfloat16`` falls back to float32 on a CPU without bf16
units, and transformers then runs float32 too), and
the same workload: seeded random prompts and decode lengths, greedy, EOS ignored. transformers
gets the requests in arrival order in static batches of ``--batch-size``, left-padded to the
batch's longest prompt, each batch generating its longest request's token count (what
``generate`` does); each request is credited with its own tokens only, in both systems, so the
throughput ratio is the inverse ratio of the wall times. sarathi_lab runs each scheduler of
``--schedulers`` with the same batch size and ``--chunk-size``.

    python -m sarathi_lab.bench.versus                     # 64 requests, prompts 128-1024, 64-256 new
    python -m sarathi_lab.bench.versus --smoke
    python -m sarathi_lab.bench.versus --requests 16 --prompt-len 128-512 --new-tokens 32-64

vLLM's CPU build is compared by a separate script in its own environment: benchmarks/vllm_cpu.py.
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import torch

from sarathi_lab.bench.common import add_common_args, print_table, resolve_dtype, setup_threads, write_table
from sarathi_lab.bench.workload import add_workload_args, make_workload, workload_from_args
from sarathi_lab.profiling.machine import describe_machine, warn_if_loaded
from sarathi_lab.profiling.timer import make_clock

TARGET = 2.0


def save_random_model(preset: str, directory: Path, dtype: torch.dtype, seed: int = 0, std: float = 0.1):
    """A transformers model of the preset's shape with random weights, saved as safetensors; the
    live model is returned. Weights are drawn wider than the usual 0.02 so that greedy choices are
    rarely near-ties, which lets the two systems' outputs be compared token for token."""
    from transformers import AutoModelForCausalLM

    from sarathi_lab.model import PRESETS

    config = copy.deepcopy(PRESETS[preset])
    config.eos_token_id = config.bos_token_id = config.pad_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, std)
    model = model.to(dtype).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


@torch.no_grad()
def hf_static_generate(model, prompts: list[list[int]], new_tokens: list[int], batch_size: int,
                       pad_id: int = 0) -> tuple[list[list[int]], dict]:
    """Static batches in arrival order, left-padded; returns each request's own tokens and the
    padding/over-generation the batching cost."""
    outs, padded_prompt, generated = [], 0, 0
    for lo in range(0, len(prompts), batch_size):
        batch, news = prompts[lo : lo + batch_size], new_tokens[lo : lo + batch_size]
        width, steps = max(map(len, batch)), max(news)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=steps,
                             min_new_tokens=steps, pad_token_id=pad_id, eos_token_id=None)
        outs += [out[i, width : width + n].tolist() for i, n in enumerate(news)]
        padded_prompt += len(batch) * width
        generated += len(batch) * steps
    return outs, {"padded_prompt_tokens": padded_prompt, "generated_tokens_incl_waste": generated}


def _agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """Share of requests whose first token agrees, and share of all tokens before the first
    disagreement (greedy outputs diverge for good after one differing token). In float32 the two
    systems agree on every first token; in bfloat16 their rounding differs (other kernels, other
    summation orders), so there the shares are statistics of how far that moves greedy choices."""
    first = sum(x[:1] == y[:1] for x, y in zip(a, b)) / len(a)
    prefix = 0
    for x, y in zip(a, b):
        n = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        prefix += n
    return first, prefix / sum(len(x) for x in a)


def run(args) -> pd.DataFrame:
    from sarathi_lab import LLM, EngineConfig
    from sarathi_lab.engine.sequence import SamplingParams
    from sarathi_lab.model import PRESETS

    resolve_dtype(args)
    # Like with like: transformers runs the dtype the engine will run.
    dtype = EngineConfig(model=args.model, device="cpu", dtype=args.dtype).torch_dtype
    args.dtype = str(dtype).removeprefix("torch.")
    threads = setup_threads(args.threads)
    load = warn_if_loaded()
    prompts, new_tokens = make_workload(**workload_from_args(args, PRESETS[args.model].vocab_size))
    useful = sum(map(len, prompts)) + sum(new_tokens)
    rows, outputs = [], {}
    wall, cpu = make_clock("wall"), make_clock("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        if args.save_model:
            tmp = args.save_model  # kept: benchmarks/vllm_cpu.py serves the same weights from it
        hf = save_random_model(args.model, Path(tmp), dtype, args.seed)
        for name in args.schedulers:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                llm = LLM(tmp, scheduler=name, chunk_size=args.chunk_size, max_batch_size=args.batch_size,
                          device="cpu", dtype=args.dtype, num_threads=threads, cpu_linear=args.cpu_linear)
            if llm.dtype != dtype:
                raise RuntimeError(f"the engine runs {llm.dtype}, transformers {dtype}: not like with like")
            t0, c0 = wall.now(), cpu.now()
            outputs[name] = llm.generate(prompts, new_tokens, sampling=SamplingParams(ignore_eos=True))
            rows.append({"system": f"sarathi_lab/{name}", "dtype": args.dtype,
                         "time_s": wall.now() - t0, "cpu_s": cpu.now() - c0,
                         "overhead_frac": llm.metrics.summary()["overhead_fraction"]})
            del llm
        # First-call costs out of the clock, as the engine's warm-up does for it.
        hf_static_generate(hf, [prompts[0][:16]], [2], 1)
        t0, c0 = wall.now(), cpu.now()
        hf_out, waste = hf_static_generate(hf, prompts, new_tokens, args.batch_size)
        hf_time, hf_cpu = wall.now() - t0, cpu.now() - c0
    rows.append({"system": "transformers/static", "dtype": str(hf.dtype).removeprefix("torch."), "time_s": hf_time,
                 "cpu_s": hf_cpu, **waste})
    for row in rows:
        row["req_per_s"] = len(prompts) / row["time_s"]
        row["gen_tok_per_s"] = sum(new_tokens) / row["time_s"]
        row["tok_per_s"] = useful / row["time_s"]
        row["speedup_vs_hf"] = hf_time / row["time_s"]
        # CPU seconds: with --threads 1, the speedup on a core of its own (the machine may be shared).
        row["cpu_speedup_vs_hf"] = hf_cpu / row["cpu_s"]
        if row["system"].startswith("sarathi_lab"):
            first, prefix = _agreement(outputs[row["system"].split("/")[1]], hf_out)
            row |= {"first_token_agree": first, "agree_prefix_frac": prefix,
                    "target": TARGET, "met": row["speedup_vs_hf"] >= TARGET}
    print(describe_machine(args.device))
    print(f"# model {args.model} (random weights, saved and reloaded) | dtype {args.dtype} | {len(prompts)} requests,"
          f" prompts {args.prompt_len[0]}-{args.prompt_len[1]}, new tokens {args.new_tokens[0]}-{args.new_tokens[1]}"
          f" ({sum(map(len, prompts))} prompt + {sum(new_tokens)} generated tokens) | batch {args.batch_size}"
          f" | chunk {args.chunk_size} | load1 at start {load:.2f}")
    table = print_table(rows, None, "Throughput vs transformers generate (static, left-padded batches)", "{:.3f}")
    if args.out:
        write_table(table, args.out, {"model": args.model, "dtype": args.dtype, "cpu_linear": args.cpu_linear})
    return table


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sarathi_lab.bench.versus", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_args(p, engine=True)
    p.add_argument("--model", default="cpu-small", help="a preset")
    p.add_argument("--schedulers", type=lambda s: s.split(","), default=["sarathi", "vllm"])
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="max batch of sarathi_lab; static batch of transformers")
    p.add_argument("--save-model", metavar="DIR", help="save the random model here (kept) instead of a temp dir")
    add_workload_args(p, requests=64, prompt_len=(128, 1024), new_tokens=(64, 256))
    return p


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parser().parse_args(argv)
    if args.device != "cpu":
        raise SystemExit("versus runs on the CPU (--device cpu)")
    if args.smoke:
        # Prompts over 8 blocks: decodes read their prompt's blocks in place (torch backend).
        args.model, args.requests, args.prompt_len, args.new_tokens = "tiny", 4, (130, 260), (4, 8)
        args.chunk_size, args.batch_size = 64, 2
    return run(args)


if __name__ == "__main__":
    main()
