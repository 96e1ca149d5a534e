"""The next iteration's most likely lengths, read from this one's batch before its tokens come back:
every request still running, each decode a token longer, each partial prefill given the chunk its
scheduler would give it. Only to warm a cache ahead of time: it schedules nothing."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.sequence import Sequence


@dataclass(frozen=True)
class NextBatch:
    """A batch's lengths as the attention plans them: chunks first, then one-token decodes."""
    query_lens: list[int]
    seq_lens: list[int]
    num_prefills: int


def finishes_by_length(seq: Sequence) -> bool:
    """Whether the token this iteration samples for ``seq`` is its last (max_new_tokens)."""
    return len(seq.tokens) + 1 - seq.prompt_len >= seq.max_new_tokens


def likely_next(batch: ScheduledBatch, chunks: Callable[[int, list[int]], list[int] | None],
                joining: Iterable[Sequence] = ()) -> NextBatch | None:
    """``batch``'s successor if only ``joining`` (waiting now, in the policy's order) joins and
    nothing finishes on a sampled token or is preempted; ``chunks(decodes, uncomputed)``: the
    scheduler's chunk for each prefill in its walk's order (None: no guess)."""
    decoding, prefilling = [], []
    for chunk in batch.prefills:
        seq = chunk.seq
        if not chunk.samples:
            left = len(seq.tokens) - chunk.context_len
            prefilling.append((seq.priority, chunk.context_len, left))
        elif not finishes_by_length(seq):
            decoding.append((seq.priority, chunk.context_len + 1))
    for seq, context in zip(batch.decodes, batch.decode_contexts):
        if not finishes_by_length(seq):
            decoding.append((seq.priority, context + 1))
    # The scheduler walks its running requests in priority order (unique: arrival, id).
    decoding.sort()
    prefilling.sort()
    prefilling += [(seq.priority, seq.num_computed, seq.num_uncomputed) for seq in joining]
    sizes = chunks(len(decoding), [left for *_, left in prefilling])
    if sizes is None:
        return None
    scheduled = [(n, context + n) for n, (_, context, _) in zip(sizes, prefilling) if n > 0]
    return NextBatch([n for n, _ in scheduled] + [1] * len(decoding),
                     [c for _, c in scheduled] + [c for _, c in decoding], len(scheduled))
