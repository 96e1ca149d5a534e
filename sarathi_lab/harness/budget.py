"""``token_budget=auto``: the largest budget whose fullest iteration meets ``slo.tbt_p99_s``."""
from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from sarathi_lab.config import AS_WRITTEN, ConfigError, EngineConfig, named_as
from sarathi_lab.host_features import resolve_device

# Budgets searched: past this the iteration is far longer than any TBT SLO on any device we model.
MAX_BUDGET = 1 << 16


@dataclass(frozen=True)
class Budget:
    tokens: int
    predicted_s: float      # the fullest iteration at that budget
    cost_model: str
    capped: bool            # MAX_BUDGET itself fits: the SLO does not bind


def largest_budget(iteration_s: Callable[[int], float], limit_s: float,
                   batch_size: int) -> int | None:
    """Bisected, so iteration_s must not decrease with the budget; None: even one token is slow."""
    budgets = range(batch_size + 1, MAX_BUDGET + 1)
    fits = bisect.bisect_right(budgets, limit_s, key=iteration_s)
    return budgets[fits - 1] if fits else None


def fullest_iteration_s(cost_model, budget: int, batch_size: int, context: int) -> float:
    chunk = budget - batch_size
    return cost_model.iteration_time_s(prefills=[(chunk, max(chunk, context))],
                                       decodes=[context] * batch_size)


@dataclass(frozen=True)
class BudgetSource:
    """Whose cost model sizes ``token_budget=auto``, as the executor's kind names it."""
    device: str | None  # None: no device here has a cost model for this engine
    kind: str | None
    # The dtype of this CPU's measured ceilings its roofline reads; None: it reads none.
    ceilings_dtype: str | None = None
    # A measured engine's budget is the simulator's model of it: refusals name its settings as
    # written; a simulated engine's are the user's keys, named as the run names them.
    keys_as_written: bool = True


def simulated_budget(engine: EngineConfig) -> BudgetSource:
    """The simulator's own device and cost model."""
    return BudgetSource(engine.sim_device, engine.sim_cost_model, keys_as_written=False)


def measured_budget(engine: EngineConfig) -> BudgetSource:
    """A real engine's: the CPU's profile of its model, else the CPU's roofline; a GPU has none."""
    from sarathi_lab.sim.profiles import profile_path

    if resolve_device(engine.device) != "cpu":
        return BudgetSource(None, None)
    dtype = None if profile_path("cpu", engine.model).is_file() else engine.dtype
    return BudgetSource("cpu", "roofline" if dtype else "profile", dtype)


def cpu_ceilings_dtype(engine: EngineConfig) -> str | None:
    """The dtype of this CPU's measured ceilings whose roofline sizes ``engine``'s budget (a real
    engine on the CPU, no profile of its model measured); None: it reads none."""
    return engine.kind.budget_source(engine).ceilings_dtype


def budget_cost_model(engine: EngineConfig):
    """(cost model, description): the simulator's own, or the CPU's profile, else its roofline."""
    from sarathi_lab.sim import CostModel

    source = engine.kind.budget_source(engine)
    device, kind = source.device, source.kind
    if device is None:
        raise ConfigError(f"token_budget=auto is invalid with device={engine.device} and "
                          "executor=model: only the CPU has measured ceilings here; use "
                          "executor=sim engine.sim_device=<the GPU>")
    tp, pp = engine.sim_tp, engine.sim_pp

    described = f"{kind} {device}" + (f" x{tp} (tensor parallel)" if tp > 1 else "") + \
        (f" x{pp} (pipeline stages)" if pp > 1 else "")
    with named_as(AS_WRITTEN) if source.keys_as_written else contextlib.nullcontext():
        model = CostModel.for_device(device, engine.model, kind, engine.dtype, tp=tp, pp=pp)
        return model, described


def auto_budget(engine: EngineConfig, tbt_p99_s: float,
                context: int) -> tuple[EngineConfig, Budget]:
    cost_model, described = budget_cost_model(engine)
    batch = engine.max_batch_size

    def iteration_s(budget: int) -> float:
        return fullest_iteration_s(cost_model, budget, batch, context)

    tokens = largest_budget(iteration_s, tbt_p99_s, batch)
    if tokens is None:
        raise ConfigError(f"slo.tbt_p99_s={tbt_p99_s} is invalid with token_budget=auto: the "
                          f"{described} cost model predicts {iteration_s(batch + 1):.4g} s for "
                          f"batch_size={batch} decodes at {context} tokens of context plus one "
                          "prompt token")

    budget = Budget(tokens, iteration_s(tokens), described, capped=tokens == MAX_BUDGET)
    return replace(engine, chunk_size=tokens), budget
