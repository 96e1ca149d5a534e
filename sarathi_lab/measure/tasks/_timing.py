"""What a task times: the real forward on ``executor=model``, the cost model's prediction on
``executor=sim``, so that every experiment runs under both and reports the same quantities."""
from __future__ import annotations

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.measure.profiling import ops as measured
from sarathi_lab.sim.executor import composition


def predicted_ops(model, batch: ScheduledBatch) -> dict[str, float]:
    """Split into ``profiling.ops.OPS`` as the real forward's hooks split it, plus ``total``."""
    prefills, decodes = composition(batch)
    cost = model.iteration_cost(prefills, decodes)
    parts = cost.ops
    attention = parts.get("prefill_attention", 0.0) + parts.get("decode_attention", 0.0)
    if "dense" in parts:  # the profile cost model keeps its dense ops apart per token count
        dense = {op: model.dense[op](batch.num_tokens)[0] for op in ("qkv_proj", "o_proj", "ffn")}
    else:
        dense = {"qkv_proj": parts["qkv_proj"], "o_proj": parts["o_proj"],
                 "ffn": parts["gate_up_proj"] + parts["down_proj"]}
    split = {"qkv_proj": dense["qkv_proj"], "attention": attention, "o_proj": dense["o_proj"],
             "ffn": dense["ffn"]}
    return split | {"others": cost.forward_s - sum(split.values()), "total": cost.forward_s}


def time_by_op(llm, batch: ScheduledBatch, reps: int, exact: bool = False) -> dict[str, float]:
    """``total`` and by op: measured (median of reps; ``exact``: ops.forward_timer's) or
    predicted."""
    model = llm.plan.cost_model
    if model is None:
        return measured.time_by_op(llm, batch, reps, exact)
    return predicted_ops(model, batch)


def forward_timer(llm, batch: ScheduledBatch):
    model = llm.plan.cost_model
    if model is None:
        return measured.forward_timer(llm, batch)
    seconds = predicted_ops(model, batch)["total"]
    return lambda: seconds


def attention_reread(model, prompt_len: int, chunk: int) -> dict[str, float]:
    """The cost model's ``profiling.attention.measure_reread``, in ms."""
    layers = model.config.num_hidden_layers

    def ms(prefills) -> float:
        total = sum(model.iteration_cost([p]).ops["prefill_attention"] for p in prefills)
        return total / layers * 1e3

    chunks = [(min(chunk, prompt_len - s), min(s + chunk, prompt_len))
              for s in range(0, prompt_len, chunk)]

    return {"whole_ms": ms([(prompt_len, prompt_len)]), "chunked_ms": ms(chunks)}
