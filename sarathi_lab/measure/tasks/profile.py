"""``task=profile``: the table the simulator's ``profile`` cost model interpolates, measured over
``grids``, written to ``$SARATHI_PROFILES_DIR/<device>/<model>.csv`` and ``.json``."""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from sarathi_lab.config import AS_WRITTEN, ConfigError, Written, device_slug
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.engine.timer import median_time
from sarathi_lab.harness.tasks import kv_blocks
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.measure.profiling.machine import machine_record
from sarathi_lab.measure.profiling.ops import forward_timer, time_by_op
from sarathi_lab.measure.tasks.iteration_sweep import token_groups
from sarathi_lab.model.sampler import Sampler
from sarathi_lab.sim.profile_model import (
    COLUMNS,
    DENSE_OPS,
    DRIFT_WARNING,
    ProfileCostModel,
    measured_iterations,
)
from sarathi_lab.sim.profiles import own_profile_path, profiles_dir

log = logging.getLogger(__name__)


def _powers_of_two(top: int) -> list[int]:
    return sorted({1 << i for i in range(top.bit_length())} | {top})


def _steps(low: int, high: int, n: int = 5) -> list[int]:
    if high <= low:
        return [low]
    return sorted({round(low + (high - low) * i / (n - 1)) for i in range(n)})


def grids(cfg) -> dict[str, list]:
    m = cfg.measure
    # Schedulers that batch whole prompts build iterations far larger than a chunk.
    max_tokens = max(cfg.chunk + cfg.batch_size, m.max_tokens or 0)
    # Powers of two too: a line from 4 tokens to the first step overestimates the weights' floor.
    tokens = sorted({*_powers_of_two(max_tokens),
                     *(n for grp in token_groups(max_tokens, m.token_step, m.tile) for n in grp)})
    # A model may have no position past seq_len: each chunk follows only the prefixes that fit.
    chunks = _powers_of_two(min(cfg.chunk, cfg.seq_len))
    prefills = [(c, before) for c in chunks for before in _steps(0, cfg.seq_len - c)]
    batches, contexts = _powers_of_two(cfg.batch_size), _steps(min(16, cfg.seq_len), cfg.seq_len)
    # Hybrids (chunk, decodes, their context): what a batch's attention parts pay once.
    hybrids = [(c, b, contexts[len(contexts) // 2])
               for c in sorted({chunks[len(chunks) // 2], chunks[-1]})
               for b in sorted({1, batches[-1]})]
    return {"tokens": tokens, "chunks": chunks, "prefills": prefills, "batches": batches,
            "contexts": contexts, "hybrids": hybrids}


def kv_requests(cfg, plan) -> list[int]:
    g = grids(cfg)
    batches = [[max(g["tokens"])], [max(c + before for c, before in g["prefills"])],
               [max(g["contexts"])] * max(g["batches"]),
               *([c] + [x] * b for c, b, x in g["hybrids"])]
    return max(batches, key=lambda lengths: kv_blocks(lengths, cfg.engine.block_size))


def check(cfg, context: int) -> None:
    check_destination()
    check_context(cfg, context)


def check_context(cfg, context: int) -> None:
    """Refused before the minutes of measuring: the rotary tables stop at the context."""
    largest = max(grids(cfg)["tokens"])
    if largest <= context:
        return
    if cfg.measure.max_tokens is not None and cfg.measure.max_tokens >= cfg.chunk + cfg.batch_size:
        setting, value = "measure.max_tokens", cfg.measure.max_tokens
        way = f"measure.max_tokens <= {context}"
    else:
        setting, value = "chunk", cfg.chunk
        way = f"chunk + batch_size <= {context} (batch_size={cfg.batch_size})"
    raise ConfigError(setting, value, f"is invalid with task=profile: its largest iteration, "
                      f"{largest} tokens in one prompt, is past the context of {context} tokens",
                      way, keys=AS_WRITTEN)


def check_destination() -> None:
    """Checked before measuring: a file there would end the run, minutes later, with a traceback."""
    where = profiles_dir()
    existing = next(p for p in (where, *where.parents) if p.exists() or p.is_symlink())
    said = (f"SARATHI_PROFILES_DIR={where}" if os.environ.get("SARATHI_PROFILES_DIR")
            else f"the profiles folder {where}")
    if not existing.is_dir():
        what = "is a file" if existing == where else f"lies under {existing}, which is a file"
        raise ConfigError(None, why=f"{said} is invalid: it {what}, not a folder",
                          allowed="a folder (created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(None, why=f"{said} is invalid: {existing} cannot be written (read-only, "
                          "or no permission)",
                          allowed="SARATHI_PROFILES_DIR=<a folder you can write>")


def _measure_batch(llm, batches: SyntheticBatches, reps: int,
                   **spec) -> tuple[dict[str, float], float]:
    with batches.made(**spec) as batch:
        runner = llm.engine.executor.runner
        ops = time_by_op(llm, batch, reps)
        return ops, median_time(lambda: runner.prepare(batch), reps, llm.engine.clock)


def reference_forward_s(llm, batches: SyntheticBatches, reference: dict[str, int],
                        reps: int) -> float:
    """Also timed by sim_validate on the host it validates."""
    with batches.made(**reference) as batch:
        forward = forward_timer(llm, batch)
        return statistics.median(forward() for _ in range(reps))


def run(cfg, llm) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    _check_replace(cfg, llm)
    g, reps = grids(cfg), cfg.measure.reps
    batches = SyntheticBatches(llm, seed=cfg.seed)
    rows: list[tuple] = []
    started = time.perf_counter()
    # A forward timed first, after each part and last: how far the machine's speed moved.
    reference = {"decodes": g["batches"][-1], "context": g["contexts"][len(g["contexts"]) // 2]}
    series: list[float] = []

    def time_reference() -> None:
        series.append(reference_forward_s(llm, batches, reference, reps))

    time_reference()
    for n in g["tokens"]:
        ops, prepare = _measure_batch(llm, batches, reps, prefills=[(n, 0)])
        rows += [(op, n, n, 1, ops[op]) for op in (*DENSE_OPS, "total")]
        rows.append(("prepare", n, n, 1, prepare))
    time_reference()
    for chunk, before in g["prefills"]:
        ops, _ = _measure_batch(llm, batches, reps, prefills=[(chunk, before)])
        rows.append(("prefill_attention", chunk, chunk + before, 1, ops["attention"]))
    time_reference()
    for size in g["batches"]:
        for context in g["contexts"]:
            ops, prepare = _measure_batch(llm, batches, reps, decodes=size, context=context)
            rows += [("decode_attention", size, context, size, ops["attention"]),
                     ("total", size, context, size, ops["total"]),
                     ("prepare", size, size * context, size, prepare)]
    time_reference()
    for chunk, size, context in g["hybrids"]:
        ops, _ = _measure_batch(llm, batches, reps, prefills=[(chunk, 0)], decodes=size,
                                context=context)
        rows += [("hybrid_attention", chunk, context, size, ops["attention"]),
                 ("hybrid_total", chunk, context, size, ops["total"])]
    rows += _head_and_sampler(llm, g["batches"], reps)
    time_reference()
    drift = {"reference": reference, "first_s": series[0], "last_s": series[-1],
             "rel_change": series[-1] / series[0] - 1, "series_s": series,
             "spread": max(series) / min(series) - 1}
    if drift["spread"] > DRIFT_WARNING:
        log.warning("the reference forward's time moved by up to %.1f%% while the profile was "
                    "measured (%s ms): the machine's speed moved; profile again on a quieter "
                    "machine", 100 * drift["spread"], ", ".join(f"{1e3 * t:.3g}" for t in series))
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    path = _write(cfg, llm, table, drift)
    summary = {"profile_rows": len(table), "profile_wall_s": time.perf_counter() - started,
               "reference_forward_rel_change": drift["rel_change"],
               "reference_forward_spread": drift["spread"], "max_tokens": max(g["tokens"]),
               "max_context": cfg.seq_len, "max_decodes": cfg.batch_size}
    summary |= _self_check(table, llm)
    print(f"profile written to {path}")
    return summary, {"profile": table}


@torch.inference_mode()
def _head_and_sampler(llm, sizes: list[int], reps: int) -> list[tuple]:
    model, sampler = llm.engine.executor.runner.model, Sampler(SamplingParams())
    clock = llm.engine.clock
    rows = []
    for n in sizes:
        hidden = torch.randn(n, model.config.hidden_size, device=llm.device).to(llm.dtype)
        logits = model.lm_head(model.norm(hidden))
        head_s = median_time(lambda h=hidden: model.lm_head(model.norm(h)), reps, clock)
        rows += [("lm_head", n, 0, n, head_s),
                 ("sample", n, 0, n, median_time(lambda x=logits: sampler(x), reps, clock))]
    return rows


def _self_check(table: pd.DataFrame, llm) -> dict[str, float]:
    """Interpolated op sums against bare forwards at the same points: the composition's error."""
    model = ProfileCostModel(table, llm.model_config, _torch_dtype(llm))
    errors = [model.iteration_cost(prefills, decodes).forward_s / seconds - 1
              for _, prefills, decodes, seconds in measured_iterations(table)]
    return {"forward_median_rel_error": statistics.median(errors),
            "forward_median_abs_rel_error": statistics.median(abs(e) for e in errors)}


def _torch_dtype(llm) -> str:
    return str(llm.dtype).removeprefix("torch.")


def _device(llm) -> tuple[str, str | None]:
    gpu = torch.cuda.get_device_name(llm.device) if llm.device.type == "cuda" else None
    return ("cpu" if gpu is None else device_slug(gpu)), gpu


def _identity(machine: dict) -> tuple:
    """Two profiles' machines are one: the same GPU, else the same CPU, ISA and ISA held to."""
    if machine.get("gpu"):
        return (machine.get("gpu"),)
    return (machine.get("cpu"), machine.get("isa"), machine.get("isa_as"))


def _check_replace(cfg, llm) -> None:
    """Another machine's table is replaced only when asked; this machine's is remeasured freely."""
    device, gpu = _device(llm)
    path = own_profile_path(device, cfg.model.engine_model)
    if not path.is_file() or cfg.on_existing == "overwrite":
        return
    try:
        recorded = json.loads(path.with_suffix(".json").read_text())["machine"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = {}
    here = machine_record() | ({"gpu": gpu} if gpu else {})
    if recorded and _identity(recorded) == _identity(here):
        return
    was = ", ".join(str(v) for v in _identity(recorded) if v) or "an unrecorded machine"
    now = ", ".join(str(v) for v in _identity(here) if v)
    raise ConfigError("task", Written("profile"), f"would replace {path}, measured on {was}, with "
                      f"this machine's table ({now})",
                      "on_existing=overwrite, or SARATHI_PROFILES_DIR=<another folder>",
                      keys=AS_WRITTEN)


def _write(cfg, llm, table: pd.DataFrame, drift: dict) -> Path:
    device, gpu = _device(llm)
    path = own_profile_path(device, cfg.model.engine_model)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    machine = (machine_record() | {"device": device, "torch_device": str(llm.device)}
               | ({"gpu": gpu} if gpu is not None else {}))
    keys = ("model", "dtype", "attention", "block_size", "cpu_linear")
    settings = {k: getattr(llm.config, k) for k in keys}
    description = {"machine": machine, "engine": settings | {"torch_dtype": _torch_dtype(llm)},
                   "clock": type(llm.engine.clock).__name__,
                   "grids": grids(cfg), "reps": cfg.measure.reps, "drift": drift,
                   "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path.with_suffix(".json").write_text(json.dumps(description, indent=1, default=str))
    return path
