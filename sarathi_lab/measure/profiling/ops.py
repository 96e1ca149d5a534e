"""One forward's time, whole and split by operation as the paper's Fig. 3 and 7 split it, from
forward hooks. The hooks synchronise and see no graph's replay, so the whole forward is timed bare
and an eager pass's split scaled to add up to it."""
from __future__ import annotations

import statistics
from collections import defaultdict

from sarathi_lab.config import AS_WRITTEN, ConfigError
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.sim.profiles import OPS


def replayable(runner, prepared):
    """The forward of ``prepared`` as one call: the replay of its own CUDA graph where the backend
    can be replayed on CUDA, else the eager forward."""
    from sarathi_lab.model import cuda_graphs

    if not cuda_graphs.can_replay(runner.model.backend, runner.device):
        return lambda: runner.forward(prepared)
    capture_cuda_graph = cuda_graphs.capture_cuda_graph

    replay, out, _ = capture_cuda_graph(lambda: runner.forward(prepared))

    def call():
        replay()
        return out
    return call


def forward_timer(llm, batch: ScheduledBatch, eager: bool = False, exact: bool = False):
    """After one untimed forward; with ``eager``, the model's own forward, which runs every hook;
    with ``exact``, a graph of this very batch where the engine would replay its bucket's."""
    executor, clock = llm.engine.executor, llm.engine.clock
    prepared = executor.runner.prepare(batch)
    if exact:
        call = replayable(executor.runner, prepared)
    else:
        run = executor.runner.forward if eager else executor.forward
        call = lambda: run(prepared)

    def forward() -> float:
        start = clock.now()
        call()
        return clock.now() - start

    forward()
    return forward


def time_by_op(llm, batch: ScheduledBatch, reps: int, exact: bool = False) -> dict[str, float]:
    refuse_cut(llm, batch)
    forward = forward_timer(llm, batch, exact=exact)
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
    # The hooks' cost and, under a CUDA graph, the launches the replay saves are spread over the ops
    # in proportion, so that a stacked split is the measured time.
    scale = total / sum(split.values())
    return {"total": total} | {op: t * scale for op, t in split.items()}


def refuse_cut(llm, batch: ScheduledBatch) -> None:
    """Nano-batches have no honest split here: the hooks' syncs serialise the two streams."""
    rule = llm.engine.executor.runner.overlap
    at = rule.cut(batch.num_tokens, batch.num_prefill_tokens, len(batch.decodes))
    if at is not None:
        raise ConfigError(
            "engine.overlap", rule.mode, "is invalid with an op breakdown of a batch it cuts "
            f"({batch.num_tokens} tokens, {len(batch.decodes)} decodes: nano-batches at token "
            f"{at}): the hooks time each op between device syncs, which serialise the two streams",
            "none (the launch step's timeline.csv times the streams)", keys=AS_WRITTEN)
