"""The paper's device beside ours: each device's ridge point (the tokens from which a bf16 GEMM is
compute-bound: its matmul rate over its memory rate, at data-sheet peaks and, where a lease measured
them, at measured ceilings), and the simulator's prediction of the chunking claims (a prompt's
prefill in chunks of 256 / 512 over the whole) on each, so that a reader sees which "no" moves with
the device. The prediction is the experiment's own task (``reread``) run on the simulator
(``executor=sim``) at the experiment's settings (conf/experiment/chunk_overhead.yaml)."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from types import SimpleNamespace

from omegaconf import OmegaConf

from sarathi_lab import LLM, cli_args, output_files, provenance
from sarathi_lab.analysis import gpu_records
from sarathi_lab.analysis.paper_results.chunk_overhead import PREFILL_SLOWDOWN_BOUND as BOUNDS
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.harness import CONF_DIR
from sarathi_lab.measure.tasks import reread
from sarathi_lab.model.floors import memory_ceiling
from sarathi_lab.sim.device import load_device

DEVICES = ("a6000", "a100", "h100", "h200")
SIMULATED = ("a6000", "h100")
MODEL, CHUNKS, LENGTHS = "llama-13b", (256, 512), (1024, 3072)
COST_MODELS = ("floor", "roofline", "calibrated")
# Whether a verdict holds on (the paper's device, ours).
VERDICTS = {(True, False): "moves with the device", (True, True): "holds on both",
            (False, False): "fails on both", (False, True): "holds on ours only"}


def ridge_tokens(matmul_flops: float, bytes_per_s: float, elem_bytes: int = 2) -> float:
    """2MKN / rate = KN * elem_bytes / bandwidth."""
    return matmul_flops / bytes_per_s * elem_bytes / 2


def measured_ceilings(gpu_docs: Path, device: str) -> tuple[str, float, float] | None:
    """The newest lease whose env step measured both (memory: read rate, else copy)."""
    for env_json in sorted(gpu_docs.glob(f"{device}/*/steps/env/env.json"), reverse=True):
        try:
            env = gpu_records.read_env(env_json.parent)
        except gpu_records.RecordError as e:
            gpu_records.warn(f"{e}; the lease is skipped")
            continue
        return env_json.parents[2].name, float(env["matmul_tflops"]), memory_ceiling(env)[0]
    return None


def simulated_prefill_ratio(device: str, cost_model: str, chunk: int, length: int,
                            model: str = MODEL) -> float:
    experiment = OmegaConf.load(CONF_DIR / "experiment" / "chunk_overhead.yaml")
    llm = LLM(model, executor="sim", sim_device=device, sim_cost_model=cost_model, dtype="bfloat16",
              max_model_len=length)
    cfg = SimpleNamespace(seq_len=length, pd_ratio=experiment.pd_ratio, chunk=chunk,
                          measure=SimpleNamespace(reps=experiment.measure.reps))
    return float(reread.run(cfg, llm)[0]["prefill_slowdown"])


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
    return [{"device": name, "cost_model": cost, "chunk": c, "length": n,
             "prefill_ratio": simulated_prefill_ratio(name, cost, c, n)}
            for name in SIMULATED for cost in COST_MODELS for c in CHUNKS for n in LENGTHS]


def markdown(gpu_docs: Path, rows: list[dict]) -> str:
    lines = ["# The paper's device beside ours", "",
             ("Written by `python -m sarathi_lab.measure device_beside`; read beside each "
             "lease's `docs/gpu/<device>/<lease>.attribution.md`."), "",
             ("Ridge point: the tokens from which a bf16 GEMM is compute-bound (matmul rate / "
              "memory rate; `measure/bench/device_beside.py`). Data sheets from "
              "`sarathi_lab/sim/devices/`; measured: the newest lease's env step (read rate where "
              "measured, else copy)."), "",
             ("| device | data sheet TFLOP/s | GB/s | ridge (tokens) | measured TFLOP/s | GB/s | "
             "ridge (tokens) |"), "|---|---|---|---|---|---|---|"]
    for r in ridge_rows(gpu_docs):
        measured = (f"{r['measured_tflops']:.0f} ({r['lease']}) | {r['measured_gbps']:,.0f} | "
                    f"{r['ridge_measured']:.0f}"
                    if "lease" in r else "- | - | -")
        lines.append(f"| {r['device'].upper()} | {r['datasheet_tflops']:.0f} | "
                     f"{r['datasheet_gbps']:,.0f} | {r['ridge_datasheet']:.0f} | {measured} |")
    lines += ["",
              (f"The simulator's chunk_overhead prefill ratio (chunked / whole, {MODEL}, bf16; the "
                   "experiment's task on `executor=sim`, its prompt the length split by its "
                   "pd_ratio; paper: chunk 256 <= 1.2x, 512 <= 1.1x), by cost model (floor: each "
                   "kernel at the data-sheet peaks, no tiles or host time, the sequential floor no "
                   "engine beats):"), "",
              "| device | cost model | "
              + " | ".join(f"chunk {c}, length {n}" for c in CHUNKS for n in LENGTHS) + " |",
              "|---|---|" + "---|" * (len(CHUNKS) * len(LENGTHS))]
    for name in SIMULATED:
        for cost in COST_MODELS:
            cells = [r for r in rows if (r["device"], r["cost_model"]) == (name, cost)]
            lines.append(f"| {name.upper()} | {cost} | " + " | ".join(
                f"{r['prefill_ratio']:.2f}x "
                f"({'holds' if r['prefill_ratio'] <= BOUNDS[r['chunk']] else 'no'})"
                for r in cells) + " |")
    lines += ["", *moves(rows)]
    return "\n".join(lines)


def moves(rows: list[dict]) -> list[str]:
    """Whether a verdict at the longest length holds on the paper's device and not on ours."""
    paper, ours = SIMULATED
    found = []
    for cost in COST_MODELS:
        for c in CHUNKS:
            at = {r["device"]: r["prefill_ratio"] for r in rows
                  if (r["cost_model"], r["chunk"], r["length"]) == (cost, c, max(LENGTHS))}
            verdict = VERDICTS[at[paper] <= BOUNDS[c], at[ours] <= BOUNDS[c]]
            found.append(f"- {cost}, chunk {c} at length {max(LENGTHS)}: {paper.upper()} "
                         f"{at[paper]:.2f}x, {ours.upper()} {at[ours]:.2f}x: {verdict}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure device_beside",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-docs", type=Path, default=REPO_ROOT / "docs" / "gpu",
                        help="the leases' folders")
    cli_args.shared(parser, out="where the page goes", out_default=REPO_ROOT / "docs" / "sim",
                    force="replace a page or table another command wrote in OUT")
    args = parser.parse_args(argv)
    made = provenance.Provenance("simulated A6000 and H100 (floor, roofline, calibrated); data "
                                 "sheets; "
                                 "leases' env steps",
                                 writer="python -m sarathi_lab.measure device_beside")
    out = output_files.Outputs(args.out, dict.fromkeys(("device_beside.csv", "device_beside.md"),
                                                       made),
                               given=f"--out={args.out}", force=args.force,
                               how="--force replaces them; --out DIR writes elsewhere")
    try:
        out.check()
        rows = sim_rows()
        table = io.StringIO(newline="")
        writer = csv.DictWriter(table, ["device", "cost_model", "chunk", "length",
                                        "prefill_ratio"])
        writer.writeheader()
        writer.writerows({**r, "prefill_ratio": f"{r['prefill_ratio']:.4f}"} for r in rows)
        text = markdown(args.gpu_docs, rows) + "\n"
        out.add("device_beside.csv", table.getvalue())
        out.add("device_beside.md", text)
        out.write()
    except output_files.OutputRefused as e:
        parser.error(str(e))
    print(text)
    return 0
