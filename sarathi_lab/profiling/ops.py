"""One iteration's forward time, whole and split by operation as the paper's Fig. 3 and 7 split it:
``qkv_proj`` (preproj), ``attention`` (self_attn less its projections), ``o_proj`` (postproj), ``ffn``
and ``others``, from forward hooks. The hooks synchronise the device, so the whole forward is also
timed bare, and that is the iteration's time."""
from __future__ import annotations

import statistics
from collections import defaultdict

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import Clock

OPS = ("qkv_proj", "attention", "o_proj", "ffn", "others")


class _Hooks:
    """Seconds spent inside each watched module, summed over layers, since the last reset."""

    def __init__(self, model, clock: Clock):
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self._handles = []
        for layer in model.layers:
            attn = layer.self_attn
            for name, module in (("self_attn", attn), ("qkv_proj", attn.qkv_proj), ("o_proj", attn.o_proj),
                                 ("ffn", layer.mlp)):
                self._watch(name, module)

    def _watch(self, name: str, module) -> None:
        started = []

        def pre(_module, _args):
            started.append(self.clock.now())

        def post(_module, _args, _out):
            self.seconds[name] += self.clock.now() - started.pop()

        self._handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def split(self, total: float) -> dict[str, float]:
        s = self.seconds
        ops = {"qkv_proj": s["qkv_proj"], "attention": s["self_attn"] - s["qkv_proj"] - s["o_proj"],
               "o_proj": s["o_proj"], "ffn": s["ffn"]}
        return ops | {"others": total - sum(ops.values())}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def forward_timer(llm, batch: ScheduledBatch):
    """A function timing one forward of ``batch`` on the engine's clock, after one untimed forward."""
    runner, clock = llm.engine.executor.runner, llm.engine.clock
    prepared = runner.prepare(batch)

    def forward() -> float:
        start = clock.now()
        runner.forward(prepared)
        return clock.now() - start

    forward()
    return forward


def time_by_op(llm, batch: ScheduledBatch, reps: int) -> dict[str, float]:
    """Median seconds of one forward of ``batch``: ``total`` (timed bare) and each of OPS (hooked)."""
    forward = forward_timer(llm, batch)
    totals = [forward() for _ in range(reps)]
    hooks = _Hooks(llm.engine.executor.runner.model, llm.engine.clock)
    try:
        splits = []
        for _ in range(reps):
            hooks.seconds.clear()
            splits.append(hooks.split(forward()))
    finally:
        hooks.remove()
    return {"total": statistics.median(totals)} | {op: statistics.median(s[op] for s in splits) for op in OPS}
