"""The paper's device beside ours: each device's ridge point (the tokens from which a bf16 GEMM is
compute-bound: its matmul rate over its memory rate, at data-sheet peaks and, where a lease measured
them, at measured ceilings), and the simulator's prediction of the chunking claims (a prompt's prefill
in chunks of 256 / 512 over the whole) on each, so that a reader sees which "no" moves with the device.
The simulator's prediction is its cost model's iteration times (what ``executor=sim`` adds up), summed
over the chunks of one prompt."""
from __future__ import annotations

import json
from pathlib import Path

from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.device import load_device

DEVICES = ("a6000", "a100", "h100", "h200")
SIMULATED = ("a6000", "h100")   # the paper's device and ours
MODEL, CHUNKS, LENGTHS = "llama-13b", (256, 512), (1024, 3072)
COST_MODELS = ("roofline", "calibrated")
# The paper's bounds on a chunked prefill over the whole (SARATHI, Fig. 13).
BOUNDS = {256: 1.2, 512: 1.1}


def ridge_tokens(matmul_flops: float, bytes_per_s: float, elem_bytes: int = 2) -> float:
    """Tokens M from which an M x K by K x N GEMM does more flops than its weights' bytes allow:
    2MKN / rate = KN * elem_bytes / bandwidth."""
    return matmul_flops / bytes_per_s * elem_bytes / 2


def measured_ceilings(gpu_docs: Path, device: str) -> tuple[str, float, float] | None:
    """(lease, matmul TFLOP/s, memory GB/s: the read rate where measured, else the copy rate) of the
    newest lease of ``device`` kept under ``gpu_docs`` whose env step measured both."""
    for env_json in sorted(gpu_docs.glob(f"{device}/*/steps/env/env.json"), reverse=True):
        try:
            env = json.loads(env_json.read_text())
            gbps = float(env.get("read_gbps") or env["copy_gbps"])
            return env_json.parents[2].name, float(env["matmul_tflops"]), gbps
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def prefill_ratio(model: CostModel, chunk: int, length: int) -> float:
    """A ``length``-token prompt's prefill in chunks of ``chunk`` over the whole, as ``model`` times it."""
    chunked = sum(model.iteration_time_s(prefills=[(min(chunk, length - start), min(start + chunk, length))],
                                         num_sampled=int(start + chunk >= length))
                  for start in range(0, length, chunk))
    return chunked / model.iteration_time_s(prefills=[(length, length)], num_sampled=1)


def ridge_rows(gpu_docs: Path) -> list[dict]:
    found = []
    for name in DEVICES:
        device = load_device(name)
        row = {"device": name, "datasheet_tflops": device.peak_flops / 1e12,
               "datasheet_gbps": device.memory_bandwidth / 1e9,
               "ridge_datasheet": ridge_tokens(device.peak_flops, device.memory_bandwidth)}
        if measured := measured_ceilings(gpu_docs, name):
            lease, tflops, gbps = measured
            row |= {"lease": lease, "measured_tflops": tflops, "measured_gbps": gbps,
                    "ridge_measured": ridge_tokens(tflops * 1e12, gbps * 1e9)}
        found.append(row)
    return found


def sim_rows() -> list[dict]:
    found = []
    for name in SIMULATED:
        for cost in COST_MODELS:
            model = CostModel.for_device(name, MODEL, cost_model=cost)
            found += [{"device": name, "cost_model": cost, "chunk": c, "length": n,
                       "prefill_ratio": prefill_ratio(model, c, n)} for c in CHUNKS for n in LENGTHS]
    return found


def markdown(lease) -> str:
    """The section of the attribution that sets the paper's device beside ours."""
    gpu_docs = lease.folder.parent.parent
    lines = ["## The paper's device beside ours", "",
             ("Ridge point: the tokens from which a bf16 GEMM is compute-bound (matmul rate / memory rate; "
              "`analysis/device_beside.py`). Data sheets from `sarathi_lab/sim/devices/`; measured: the newest "
              "lease's env step (read rate where measured, else copy)."), "",
             "| device | data sheet TFLOP/s | GB/s | ridge (tokens) | measured TFLOP/s | GB/s | ridge (tokens) |",
             "|---|---|---|---|---|---|---|"]
    for r in ridge_rows(gpu_docs):
        measured = (f"{r['measured_tflops']:.0f} ({r['lease']}) | {r['measured_gbps']:,.0f} | {r['ridge_measured']:.0f}"
                    if "lease" in r else "- | - | -")
        lines.append(f"| {r['device'].upper()} | {r['datasheet_tflops']:.0f} | {r['datasheet_gbps']:,.0f} | "
                     f"{r['ridge_datasheet']:.0f} | {measured} |")
    lines += ["", (f"The simulator's chunk_overhead prefill ratio (chunked / whole, {MODEL}, bf16; paper: chunk "
                   "256 <= 1.2x, 512 <= 1.1x), by cost model:"), "",
              "| device | cost model | " + " | ".join(f"chunk {c}, length {n}" for c in CHUNKS for n in LENGTHS) + " |",
              "|---|---|" + "---|" * (len(CHUNKS) * len(LENGTHS))]
    rows = sim_rows()
    for name in SIMULATED:
        for cost in COST_MODELS:
            cells = [r for r in rows if (r["device"], r["cost_model"]) == (name, cost)]
            lines.append(f"| {name.upper()} | {cost} | " + " | ".join(
                f"{r['prefill_ratio']:.2f}x ({'holds' if r['prefill_ratio'] <= BOUNDS[r['chunk']] else 'no'})"
                for r in cells) + " |")
    lines += ["", *moves(rows)]
    return "\n".join(lines)


def moves(rows: list[dict]) -> list[str]:
    """For each chunk and cost model, whether its verdict at the longest length moves with the device
    (holds on the paper's, not on ours)."""
    paper, ours = SIMULATED
    found = []
    for cost in COST_MODELS:
        for c in CHUNKS:
            at = {r["device"]: r["prefill_ratio"] for r in rows
                  if (r["cost_model"], r["chunk"], r["length"]) == (cost, c, max(LENGTHS))}
            holds = {d: at[d] <= BOUNDS[c] for d in at}
            verdict = ("moves with the device" if holds[paper] and not holds[ours] else
                       "holds on both" if holds[paper] and holds[ours] else "fails on both" if not holds[paper]
                       and not holds[ours] else "holds on ours only")
            found.append(f"- {cost}, chunk {c} at length {max(LENGTHS)}: {paper.upper()} {at[paper]:.2f}x, "
                         f"{ours.upper()} {at[ours]:.2f}x: {verdict}")
    return found
