"""One iteration's forward time, whole and split by operation as the paper's Fig. 3 and 7 split it:
``qkv_proj`` (preproj), ``attention`` (self_attn less its projections), ``o_proj`` (postproj), ``ffn``
and ``others``, from forward hooks. The hooks synchronise the device, so the whole forward is also
timed bare, as the engine runs it (a CUDA graph's replay where one holds the batch), and that is the
iteration's time. Hooks see no graph's replay, so the split is always timed in an eager pass of the
same batch and scaled to add up to that time: its shares are the eager forward's."""
from __future__ import annotations

import statistics
from collections import defaultdict

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.sim.profiles import OPS


def forward_timer(llm, batch: ScheduledBatch, eager: bool = False):
    """A function timing one forward of ``batch`` on the engine's clock, after one untimed forward: the
    forward the engine runs (a CUDA graph's replay where one holds the batch), or with ``eager`` the
    model's own forward, which runs every module (and so every hook)."""
    executor, clock = llm.engine.executor, llm.engine.clock
    prepared = executor.runner.prepare(batch)
    run = executor.runner.forward if eager else executor.forward

    def forward() -> float:
        start = clock.now()
        run(prepared)
        return clock.now() - start

    forward()
    return forward


def time_by_op(llm, batch: ScheduledBatch, reps: int) -> dict[str, float]:
    """Median seconds of one forward of ``batch``: ``total`` (timed bare, as the engine runs it) and
    each of OPS (hooked, in an eager forward), scaled to add up to ``total``."""
    forward = forward_timer(llm, batch)
    totals = [forward() for _ in range(reps)]
    eager = forward_timer(llm, batch, eager=True)
    clock, seconds, handles = llm.engine.clock, defaultdict(float), []

    def watch(name: str, module) -> None:
        started = []

        def post(_module, _args, _out):
            seconds[name] += clock.now() - started.pop()

        handles.extend((module.register_forward_pre_hook(lambda _module,
                                                         _args: started.append(clock.now())),
                        module.register_forward_hook(post)))

    for layer in llm.engine.executor.runner.model.layers:
        attn = layer.self_attn
        for name, module in (("self_attn", attn), ("qkv_proj", attn.qkv_proj),
                             ("o_proj", attn.o_proj), ("ffn", layer.mlp)):
            watch(name, module)
    splits = []
    try:
        for _ in range(reps):
            seconds.clear()
            total = eager()
            s = seconds
            ops = {"qkv_proj": s["qkv_proj"],
                   "attention": s["self_attn"] - s["qkv_proj"] - s["o_proj"], "o_proj": s["o_proj"],
                   "ffn": s["ffn"]}
            splits.append(ops | {"others": total - sum(ops.values())})
    finally:
        for handle in handles:
            handle.remove()
    total = statistics.median(totals)
    split = {op: statistics.median(x[op] for x in splits) for op in OPS}
    # The hooks' own cost (a device sync at every boundary, which on a launch-bound GPU forward also
    # exposes the launches) and, under a CUDA graph, the launches the replay saves are spread over the
    # ops in proportion, so that a stacked split is the iteration's measured time rather than the
    # longer hooked eager one.
    scale = total / sum(split.values())
    return {"total": total} | {op: t * scale for op, t in split.items()}
