"""The benchmarks' request mix: seeded random prompts and decode lengths, uniform in given ranges."""
from __future__ import annotations

import argparse
import random

from sarathi_lab.bench.args import int_range, positive_int


def make_workload(requests: int, prompt_len: tuple[int, int], new_tokens: tuple[int, int], vocab: int,
                  seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    lens = [rng.randint(*prompt_len) for _ in range(requests)]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lens]
    new = [rng.randint(*new_tokens) for _ in range(requests)]
    return prompts, new


def add_workload_args(parser: argparse.ArgumentParser, *, requests: int, prompt_len: tuple[int, int],
                      new_tokens: tuple[int, int]) -> None:
    parser.add_argument("--requests", type=positive_int, default=requests)
    parser.add_argument("--prompt-len", type=int_range, default=prompt_len, metavar="LO-HI",
                        help="prompt lengths, uniform in [LO, HI]")
    parser.add_argument("--new-tokens", type=int_range, default=new_tokens, metavar="LO-HI",
                        help="tokens generated per request, uniform in [LO, HI] (greedy, EOS ignored)")
    parser.add_argument("--seed", type=int, default=0)


def workload_from_args(args, vocab: int) -> dict:
    return {"requests": args.requests, "prompt_len": tuple(args.prompt_len), "new_tokens": tuple(args.new_tokens),
                "vocab": vocab, "seed": args.seed}
