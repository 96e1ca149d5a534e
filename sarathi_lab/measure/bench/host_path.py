"""The engine's host time per iteration against the GPU forward pass it would feed: the real engine
loop for Llama-2-7B's shapes with a no-op forward, beside the H100 forward the simulator predicts
for each batch (method: docs/benchmarks.md). Target: the overhead_fraction, host / (host + forward),
under 5% at every batch."""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch

from sarathi_lab import host_load as load
from sarathi_lab.config import DTYPE_BYTES, EngineConfig
from sarathi_lab.engine.block_manager import blocks_for
from sarathi_lab.engine.metrics import overhead_fraction
from sarathi_lab.measure.bench.args import hybrid_pairs, positive_int, positive_ints
from sarathi_lab.measure.bench.case import Case, Report
from sarathi_lab.measure.profiling.overhead import TARGET

MODEL = "llama2-7b"
GPU = "h100"
DTYPE = "bfloat16"
BLOCK_SIZE = EngineConfig.block_size
PREFILL_BUDGET = 2048


@dataclass
class NoopModel:
    """The model seam without a model; the batch's metadata is read after the step, untimed."""
    vocab_size: int
    meta: object = None
    # Every sampled row's token, as a GPU's greedy path hands back.
    argmax_rows: ClassVar[int] = 1 << 30
    # Plans nothing per iteration, as the Triton backend the engine runs on CUDA.
    backend: ClassVar = types.SimpleNamespace(plan=lambda meta, k_cache: None)

    def __call__(self, input_ids, positions, kv_caches, meta, logits_indices, argmax: bool = False):
        self.meta = meta
        n = len(logits_indices)
        return [1] * n if argmax else torch.empty(n, self.vocab_size)


def build_engine(max_batch_size: int, token_budget: int, num_blocks: int, max_model_len: int):
    from sarathi_lab.engine.block_manager import BlockManager
    from sarathi_lab.engine.clock import WallClock
    from sarathi_lab.engine.llm_engine import LLMEngine
    from sarathi_lab.engine.metrics import Metrics
    from sarathi_lab.engine.scheduler import make_scheduler
    from sarathi_lab.engine.sequence import SamplingParams
    from sarathi_lab.model import load_config
    from sarathi_lab.model.executor import ModelExecutor
    from sarathi_lab.model.runner import ModelRunner

    config = load_config(MODEL)
    blocks = BlockManager(num_blocks, BLOCK_SIZE)
    scheduler = make_scheduler("sarathi_serve", blocks, max_batch_size=max_batch_size,
                               chunk_size=token_budget, max_model_len=max_model_len)
    empty = torch.empty(0)
    runner = ModelRunner(NoopModel(config.vocab_size), [(empty, empty)] * config.num_hidden_layers,
                         BLOCK_SIZE, torch.device("cpu"))
    # The numpy path a CUDA device takes, not the CPU's own for small decode-only batches.
    runner.decode_lists = False
    clock = WallClock()
    engine = LLMEngine(scheduler, ModelExecutor(runner, clock), clock)
    engine.start(Metrics(), SamplingParams(ignore_eos=True))
    return engine


def _requests(first_id: int, n: int, prompt_len: int, new_tokens: int):
    from sarathi_lab.engine.sequence import Sequence

    return [Sequence(first_id + i, [(first_id + i + t) % 31_000 + 2 for t in range(prompt_len)],
                     new_tokens)
            for i in range(n)]


def _steps(engine, n: int) -> list[tuple]:
    """Each step's record and its batch as the cost model reads it."""
    out = []
    for _ in range(n):
        record = engine.step()
        meta = engine.executor.runner.model.meta
        p, contexts = meta.num_prefills, meta.seq_lens_host
        out.append((record, (list(zip(meta.query_lens_host[:p], contexts[:p])), contexts[p:])))
    return out


def timed_steps(decodes: int, context: int, chunk: int, reps: int, warmup: int) -> list[tuple]:
    """Beside a ``chunk``-token chunk of a long prompt arriving once they decode (0: none)."""
    # The decodes' prompts are prefilled first under a budget the timed iterations do not reach.
    runs, prefill = warmup + reps, chunk or PREFILL_BUDGET
    new = -(-decodes * context // prefill) + runs + 3
    prompt = chunk * (runs + 1)
    max_len = max(context + new, prompt + 1)
    blocks = decodes * blocks_for(context + new, BLOCK_SIZE) + (blocks_for(max_len, BLOCK_SIZE)
                                                                if chunk else 0)
    engine = build_engine(decodes + bool(chunk), prefill + decodes, blocks, max_len)
    for seq in _requests(0, decodes, context - 1, new):
        engine.add_request(seq)
    while engine.step().num_prefill_tokens:
        pass
    if chunk:
        engine.add_request(_requests(decodes, 1, prompt, 1)[0])
    steps = _steps(engine, runs)[warmup:]
    if not all(r.num_decode_requests == decodes
               and r.num_prefill_tokens == chunk for r, _ in steps):
        raise RuntimeError(f"{decodes} decodes beside a chunk of {chunk} at context {context}: "
                           "the scheduler ran other batches")
    return steps


def measure(args, point: tuple[int, int, int]) -> dict:
    """``args.kv_fits(tokens, kv_tokens)``: whether such an iteration fits on the GPU."""
    context, chunk, batch = point
    steps = timed_steps(batch, context, chunk, args.reps, args.warmup)
    times = pd.DataFrame([{
        "host": r.duration - r.forward_time, "schedule": r.schedule_time, "prepare": r.prepare_time,
        "sample": r.sample_time,
        "rest": r.duration - r.schedule_time - r.prepare_time - r.forward_time - r.sample_time,
        f"{GPU}_forward": args.cost_model.iteration_cost(prefills, decodes,
                                                         r.num_decode_requests).forward_s,
    } for r, (prefills, decodes) in steps])
    frac = overhead_fraction(times["host"], times[f"{GPU}_forward"]).median()
    return {
        "case": "hybrid" if chunk else "decode", "batch": batch, "context": context, "chunk": chunk,
        **(times.median() * 1e6).add_suffix("_us").to_dict(), "overhead_fraction": frac,
        "met": frac < TARGET,
        "kv_fits": all(args.kv_fits(r.num_tokens, sum(c for _, c in prefills) + sum(decodes))
                       for r, (prefills, decodes) in steps),
    }


def start(args) -> None:
    from sarathi_lab.model import load_config
    from sarathi_lab.sim import CostModel, kv_capacity_tokens, load_device

    gpu, config = load_device(GPU, DTYPE), load_config(MODEL)

    def kv_fits(tokens: int, kv_tokens: int) -> bool:
        return kv_tokens <= kv_capacity_tokens(gpu, config, DTYPE_BYTES[DTYPE], tokens)

    args.kv_fits, args.cost_model = kv_fits, CostModel.for_device(GPU, MODEL, dtype=DTYPE)


def grid(args) -> list[tuple[int, int, int]]:
    """(context, chunk, decodes): every decode batch, then the hybrid ones, at each context."""
    return [(context, chunk, decodes) for context in args.contexts
            for chunk, decodes in [(0, batch) for batch in args.decode_batches] + args.hybrid]


def report(args, table: pd.DataFrame) -> Report:
    head = [(f"# {MODEL} shapes, forward a no-op; predicted forward: the roofline cost model of "
             f"one {GPU} | median of {args.reps} iterations after {args.warmup} | "
             f"{load.contention(args.load)}")]
    tail = [] if table["kv_fits"].all() else [
        (f"kv_fits False: that batch's KV cache does not fit one {GPU} beside the weights; its "
         "forward is the cost model's what-if")]
    missed = table[~table["met"]]
    tail.append(f"target: overhead_fraction < {TARGET:.0%} beside the predicted {GPU} forward at "
                "every batch: " + ("met" if missed.empty else
                                   f"missed at {len(missed)} of {len(table)}"))
    return Report(head, f"Host time per iteration beside the predicted {GPU} forward: its "
                  f"overhead_fraction (target < {TARGET:.0%})", {"model": MODEL, "gpu": GPU}, tail)


def knobs(p) -> None:
    p.add_argument("--decode-batches", type=positive_ints, default=[1, 8, 32, 64, 128, 256],
                   help="decode batch sizes (requests)")
    p.add_argument("--contexts", type=positive_ints, default=[1024, 4096],
                   help="each decode's context (tokens)")
    p.add_argument("--hybrid", type=hybrid_pairs, default=[(512, 8), (512, 32), (512, 128)],
                   help="CHUNK+DECODES cases: one prefill chunk of CHUNK tokens beside DECODES "
                        "decodes")
    p.add_argument("--reps", type=positive_int, default=30,
                   help="iterations timed per case (their median)")
    p.add_argument("--warmup", type=positive_int, default=5, help="iterations run first, untimed")


def check(args) -> str | None:
    if not (args.contexts and (args.decode_batches or args.hybrid)):
        return ("--contexts is empty, or --decode-batches and --hybrid both are: give at least one "
                "case")
    if min(args.contexts) < 2:
        return (f"--contexts={','.join(map(str, args.contexts))} is invalid: a decode's context "
                "holds its prompt and its new token, so each must be >= 2")


CASE = Case(name="host_path",
            reference=f"peer: the {GPU} forward the simulator's cost model predicts per batch; "
                      f"target: overhead_fraction under {TARGET:.0%}",
            grid=grid, measure=measure, report=report, knobs=knobs, start=start,
            check=check, shared=(),
            smoke={"decode_batches": [1, 16], "contexts": [256], "hybrid": [(64, 4)], "reps": 3,
                   "warmup": 1})
main = CASE.run
