"""The committed capacity tables (docs/capacity/*.csv) and what is drawn from them: the figures
capacity.png and capacity_tradeoff.png and the capacity rows of docs/figures/claims.csv.

    python -m sarathi_lab.analysis.capacity_docs MULTIRUN   # e.g. /tmp/cap/cpu: writes cpu_capacity.csv
    python -m sarathi_lab.analysis.capacity_docs            # redraws from the committed tables only
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from sarathi_lab.analysis import capacity
from sarathi_lab.analysis import claims as claim_checks
from sarathi_lab.analysis.figures import save
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.harness.results import current_names
from sarathi_lab.sim import CostModel

DOCS = REPO_ROOT / "docs"
SIM_CSV, TRADEOFF_CSV, CPU_CSV = "sim_capacity.csv", "sim_tradeoff.csv", "cpu_capacity.csv"
TP_CSV = "sim_capacity_yi34b.csv"
# experiment=capacity_sim_arxiv: its lengths and cost model, which the table does not record.
TRACE_CSV, TRACE_LABEL = "sim_capacity_arxiv.csv", "calibrated"
# experiment=capacity_sim's engine.sim_device (capacity_sim_yi34b's too, with engine.sim_tp=2): the
# tables have the model but not the device.
SIM_DEVICE, TP_GPUS = "a100", 2
OVERHEAD_PROMPTS = (1024, 2048, 4096, 8192)


def read_table(path: Path) -> pd.DataFrame:
    """A committed table, its columns under today's names."""
    return pd.read_csv(path).rename(columns=current_names)


def load(docs: str | Path = DOCS) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """The simulated capacities, the simulated trade-off and the CPU capacities (None: not measured)."""
    folder = Path(docs) / "capacity"
    cpu = folder / CPU_CSV
    return (read_table(folder / SIM_CSV), read_table(folder / TRADEOFF_CSV),
            read_table(cpu) if cpu.exists() else None)


def tabulate(multirun: str | Path, docs: str | Path = DOCS) -> Path:
    """docs/capacity/cpu_capacity.csv from a folder of capacity searches on the real engine."""
    searches = capacity.load_searches(multirun)
    if searches.empty or (searches.executor == "sim").any():
        raise SystemExit(f"{multirun}: expected capacity searches of executor=model (capacity.json), found "
                         f"{len(searches)} search(es) with executors {sorted(set(searches.get('executor', [])))}")
    return capacity.write_csv(capacity.compact(searches), Path(docs) / "capacity" / CPU_CSV)


def measured_provenance(cpu: pd.DataFrame, table: str = CPU_CSV) -> dict[str, str]:
    """claims.PROVENANCE of a committed table of searches measured on a CPU: what it ran on."""
    first = cpu.iloc[0]
    return {"source": f"measured CPU, {first.model} (committed docs/capacity/{table})", "scale": str(first.scale),
            "dtype": str(first["dtype"]), "threads": f"{first.torch_threads:g}", "machine": str(first.device_name)}


def simulated_provenance(sim: pd.DataFrame, table: str, simulated_as: str) -> dict[str, str]:
    """claims.PROVENANCE of a committed table of simulated searches, or of the cost model alone."""
    where = f" (committed docs/capacity/{table})" if table else " (computed here)"
    return claim_checks.simulated_provenance(f"simulated {simulated_as}{where}", str(sim.scale.iloc[0]))


def claims(docs: str | Path = DOCS) -> pd.DataFrame:
    """The capacity rows of the claims table: the CPU table's, the simulated tables', and the
    roofline's chunk overhead (sim_capacity.csv's model on SIM_DEVICE)."""
    sim, tradeoff, cpu = load(docs)
    cost = CostModel.for_device(SIM_DEVICE, sim.model.iloc[0])
    overhead = {n: capacity.chunked_prefill_overhead(cost, n, 512) for n in OVERHEAD_PROMPTS}
    # Named as analysis/runs.py names simulated runs: "simulated A100 (roofline), mistral-7b".
    label = f"{SIM_DEVICE.upper()} (roofline), {sim.model.iloc[0]}"
    measured = (capacity.Evidence(searches=cpu, provenance=measured_provenance(cpu)) if cpu is not None
                else capacity.Evidence(provenance={"source": "measured CPU (not yet: experiment=capacity)"}))
    rows = capacity.capacity_claims(
        measured, capacity.Evidence(sim, tradeoff, provenance=simulated_provenance(sim, SIM_CSV, label)),
        capacity.Evidence(overhead=overhead, provenance=simulated_provenance(sim, "", label)))
    # The tables of other shapes, each its own claim where it exists.
    for csv, claim, label in (
            (TP_CSV, capacity.TP_CLAIM, "{n} x {dev} (roofline, tensor parallel), {model}"),
            (TRACE_CSV, capacity.TRACE_CLAIM, "{dev} ({trace}), {model}, arxiv_summarization lengths")):
        path = Path(docs) / "capacity" / csv
        if path.exists():
            searches = read_table(path)
            name = label.format(n=TP_GPUS, dev=SIM_DEVICE.upper(), trace=TRACE_LABEL, model=searches.model.iloc[0])
            evidence = capacity.Evidence(searches, provenance=simulated_provenance(searches, csv, name))
            rows = pd.concat([rows, capacity.capacity_claims(evidence, checks=(claim,))], ignore_index=True)
    return rows


def with_capacity_claims(table: pd.DataFrame, docs: str | Path = DOCS) -> pd.DataFrame:
    """The claims table with its capacity rows replaced by the current ones (appended if absent)."""
    kept = table[table.experiment != "capacity"]
    return pd.concat([kept, claims(docs)], ignore_index=True)


def draw(docs: str | Path = DOCS) -> list[Path]:
    """docs/figures/capacity.png and capacity_tradeoff.png from the committed tables."""
    sim, tradeoff, cpu = load(docs)
    cost_model = f"roofline ({SIM_DEVICE}, {sim.model.iloc[0]})"
    fig = capacity.capacity_figure(sim, cpu, cost_model)
    tradeoff_fig, ax = plt.subplots(figsize=(9.5, 4.5), layout="constrained")
    capacity.plot_tradeoff(tradeoff, ax, f"simulated, {cost_model}: TTFT vs TBT over token budgets, same load")
    return [save(fig, docs, "capacity"), save(tradeoff_fig, docs, "capacity_tradeoff")]


def refresh(docs: str | Path = DOCS) -> list[Path]:
    """Everything drawn from the committed tables: the two figures and, where docs/figures/claims.csv
    exists (figures.ipynb writes the rest of it), its capacity rows replaced in place."""
    written, path = draw(docs), Path(docs) / "figures" / "claims.csv"
    if path.exists():
        with_capacity_claims(pd.read_csv(path, keep_default_na=False), docs).to_csv(path, index=False)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.analysis.capacity_docs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("multirun", nargs="?", help="capacity searches on this CPU (experiment=capacity)")
    parser.add_argument("--docs", default=DOCS, type=Path, help="the docs folder (default: the repository's)")
    args = parser.parse_args(argv)
    written = [tabulate(args.multirun, args.docs)] if args.multirun else []
    written += refresh(args.docs)
    print("\n".join(map(str, written)))


if __name__ == "__main__":
    main()
