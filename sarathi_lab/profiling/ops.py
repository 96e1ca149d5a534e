"""One iteration's forward time, whole and split by operation as the paper's Fig. 3 and 7 split it:
``qkv_proj`` (preproj), ``attention`` (self_attn less its projections), ``o_proj`` (postproj), ``ffn``
and ``others``, from forward hooks. The hooks synchronise the device, so the whole forward is also
timed bare, as the engine runs it, and that is the iteration's time; the split (eager: hooks see no
graph's replay) is scaled to add up to it."""
from __future__ import annotations

import statistics
from collections import defaultdict

from sarathi_lab.engine.batch import ScheduledBatch

OPS = ("qkv_proj", "attention", "o_proj", "ffn", "others")


def forward_timer(llm, batch: ScheduledBatch):
    """A function timing one forward of ``batch`` on the engine's clock, after one untimed forward: the
    forward the engine runs (a CUDA graph's replay where one holds the batch)."""
    executor, clock = llm.engine.executor, llm.engine.clock
    prepared = executor.runner.prepare(batch)

    def forward() -> float:
        start = clock.now()
        executor.forward(prepared)
        return clock.now() - start

    forward()
    return forward


def time_by_op(llm, batch: ScheduledBatch, reps: int) -> dict[str, float]:
    """Median seconds of one forward of ``batch``: ``total`` (timed bare) and each of OPS (hooked)."""
    forward = forward_timer(llm, batch)
    totals = [forward() for _ in range(reps)]
    clock, seconds, handles = llm.engine.clock, defaultdict(float), []

    def watch(name: str, module) -> None:
        started = []

        def post(_module, _args, _out):
            seconds[name] += clock.now() - started.pop()

        handles.extend((module.register_forward_pre_hook(lambda _module, _args: started.append(clock.now())),
                        module.register_forward_hook(post)))

    for layer in llm.engine.executor.runner.model.layers:
        attn = layer.self_attn
        for name, module in (("self_attn", attn), ("qkv_proj", attn.qkv_proj), ("o_proj", attn.o_proj),
                             ("ffn", layer.mlp)):
            watch(name, module)
    splits = []
    try:
        for _ in range(reps):
            seconds.clear()
            total = forward()
            s = seconds
            ops = {"qkv_proj": s["qkv_proj"], "attention": s["self_attn"] - s["qkv_proj"] - s["o_proj"],
                   "o_proj": s["o_proj"], "ffn": s["ffn"]}
            splits.append(ops | {"others": total - sum(ops.values())})
    finally:
        for handle in handles:
            handle.remove()
    total = statistics.median(totals)
    split = {op: statistics.median(x[op] for x in splits) for op in OPS}
    # The hooks' own cost (a device sync at every boundary, which on a launch-bound GPU forward also
    # exposes the launches) is spread over the ops in proportion, so that a stacked split is the
    # iteration's measured time rather than the longer hooked one.
    scale = total / sum(split.values())
    return {"total": total} | {op: t * scale for op, t in split.items()}
