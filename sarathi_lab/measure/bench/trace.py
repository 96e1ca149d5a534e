"""A synthetic serving trace, the same every call (seed 0): the simulator's speed check and the
planning-cost benchmark replay it, so their figures compare across changes."""
from __future__ import annotations

import random

import numpy as np

from sarathi_lab import host_memory

# A load the simulated A100 keeps up with, so that queues and batches stay realistic.
ARRIVAL_RATE_RPS = 4.0


# What one request of a replayed trace holds until its run ends: its prompt (a list slot per token,
# all the same int), its generated tokens and their times (an int and a float each, in lists), and
# its records (the engine's request, the metrics' rows, the trace's three arrays and lists).
PROMPT_TOKEN_BYTES, DECODE_TOKEN_BYTES, REQUEST_BYTES = 8, 72, 10_000


def workload_bytes(n: int, prompt_tokens: tuple[int, int], decode_tokens: tuple[int, int]) -> int:
    """The most a run of ``n`` requests of this trace holds, as checked before it is drawn."""
    return n * (prompt_tokens[1] * PROMPT_TOKEN_BYTES + decode_tokens[1] * DECODE_TOKEN_BYTES
                + REQUEST_BYTES)


def requests_refused(n: int, prompt_tokens: tuple[int, int] = (0, 0),
                     decode_tokens: tuple[int, int] = (0, 0)) -> str | None:
    """--requests=N refused in one line where its run could not be held here (else None): checked
    before the trace is drawn, since an allocation past the machine's memory fails halfway."""
    too_much = host_memory.beyond(workload_bytes(n, prompt_tokens, decode_tokens))
    return too_much and (f"--requests={n} is invalid here: its trace and the simulator's records "
                         f"need {too_much}; allowed: fewer requests or shorter ones")


def workload(n: int, prompt_tokens: tuple[int, int] = (1024, 1024),
             decode_tokens: tuple[int, int] = (256, 256), rate_rps: float = ARRIVAL_RATE_RPS,
             ) -> tuple[list[list[int]], list[int], list[float]]:
    """The same trace every call (seed 0): its speed and digest compare across changes."""
    rng = np.random.default_rng(0)
    prompts = [[1] * int(p) for p in rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, size=n)]
    decodes = rng.integers(decode_tokens[0], decode_tokens[1] + 1, size=n).tolist()
    arrivals = np.cumsum(rng.exponential(1 / rate_rps, size=n)).tolist()
    return prompts, decodes, arrivals


def make_workload(requests: int, prompt_len: tuple[int, int], new_tokens: tuple[int, int],
                  vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Prompts of random tokens and new-token counts, each uniform in its range."""
    rng = random.Random(seed)
    lens = [rng.randint(*prompt_len) for _ in range(requests)]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lens]
    return prompts, [rng.randint(*new_tokens) for _ in range(requests)]
