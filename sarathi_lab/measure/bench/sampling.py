"""Sampling's CPU kernel against its torch path, side by side on the same logits and uniforms, flat
and peaked, at each top_p (docs/benchmarks.md)."""
from __future__ import annotations

import numpy as np
import torch
from sarathi_kernels import cpu_ops

from sarathi_lab import host_load as load
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.engine.timer import interleaved, make_clock
from sarathi_lab.measure.bench.args import comma_list, positive_int, positive_ints
from sarathi_lab.measure.bench.case import Case, Report
from sarathi_lab.model.host_allocator import reuse_freed_memory
from sarathi_lab.model.sampler import Sampler, uniform


def _probability(text: str) -> float:
    if not 0 < float(text) <= 1:
        raise ValueError(text)
    return float(text)


def measure(logits: torch.Tensor, params: SamplingParams, reps: int) -> dict:
    sampler = Sampler(params)
    uniforms = [uniform(params.seed, r, 0) for r in range(logits.shape[0])]
    paths = {"kernel": lambda: cpu_ops.sample(logits, sampler.temperature, params.top_p, uniforms),
             "torch": lambda: sampler.torch_draw(logits, uniforms)}
    times = interleaved(paths, reps, make_clock("wall"))
    kernel, torch_path = (float(np.median(times[name])) for name in paths)
    same = sum(a == b for a, b in zip(paths["kernel"](), paths["torch"]())) / logits.shape[0]
    return {"kernel_ms": kernel * 1e3, "torch_ms": torch_path * 1e3, "speedup": torch_path / kernel,
            "same_token": same}


def knobs(p) -> None:
    p.add_argument("--rows", type=positive_int, default=16,
                   help="rows sampled together (a decode batch)")
    p.add_argument("--vocab", type=positive_int, default=32000)
    p.add_argument("--top-p", type=comma_list(_probability, "numbers in (0, 1]", empty=False),
                   default=[1.0, 0.95], help="comma list, each in (0, 1]")
    p.add_argument("--scales", type=positive_ints, default=[1, 12],
                   help="logits' standard deviations, comma list: 1 flat, 12 peaked")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--reps", type=positive_int, default=21,
                   help="timed calls of each path (medians)")


def check(args) -> str | None:
    if not 0 < args.temperature < float("inf"):
        return f"--temperature={args.temperature} is invalid: must be a finite number > 0"
    if args.device != "cpu":
        return (f"--device={args.device} is invalid: the sampling kernel is the CPU's (CUDA "
                f"runs the torch path)")
    if args.torch_dtype not in cpu_ops.DTYPES:
        return f"--dtype={args.dtype} is invalid: the kernel takes float32 or bfloat16 logits"
    if not cpu_ops.supports(torch.zeros(1, dtype=args.torch_dtype)):
        return ("the CPU kernels are unavailable here (no C++ compiler, or the build failed): "
                "nothing to compare")


def start(args) -> None:
    reuse_freed_memory()  # torch's ops would otherwise pay fresh pages each call
    args.generator = torch.Generator().manual_seed(0)


def measure_scale(args, scale: int) -> list[dict]:
    logits = torch.randn(args.rows, args.vocab, generator=args.generator) * scale
    logits = logits.to(args.torch_dtype)
    return [{"dtype": args.dtype, "rows": args.rows, "vocab": args.vocab, "scale": scale,
             "top_p": top_p}
            | measure(logits, SamplingParams(temperature=args.temperature, top_p=top_p, seed=0),
                      args.reps)
            for top_p in args.top_p]


CASE = Case(name="sampling",
            reference="peer: the sampler's torch path, timed interleaved on the same inputs",
            grid=lambda args: args.scales, measure=measure_scale, start=start, check=check,
            report=lambda args, table: Report(
                [f"# {load.contention(args.load)}"],
                f"Sampling, T {args.temperature}: kernel vs torch path (speedup = torch / "
                f"kernel)"),
            knobs=knobs, smoke={"rows": 2, "vocab": 2000, "reps": 3})
main = CASE.run
