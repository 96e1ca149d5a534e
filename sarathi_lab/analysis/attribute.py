"""Where each launch iteration's time over its physical floor goes, and how much of each paper claim
measured in a lease the hardware explains, from that lease's files alone:

    python -m sarathi_lab.measure attribute docs/gpu/h100/2026-11-27_7fae342

prints the table and writes ``<lease>.attribution.csv`` and ``.md`` beside the lease's folder, which
stays as collected; an iteration's parts sum to its time over the floor, and a part the lease lacks
says why."""
from __future__ import annotations

import csv
import io
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.analysis import gpu_records, gpu_tables, registry
from sarathi_lab.analysis import library_floor as lib
from sarathi_lab.analysis.claim_attribution import at_floors, short_of_yes
from sarathi_lab.analysis.gpu_records import prose
from sarathi_lab.analysis.launch_grid import SHAPES
from sarathi_lab.config import DTYPE_BYTES
from sarathi_lab.model import load_config
from sarathi_lab.model.floors import floor, memory_ceiling, sequential_floor
from sarathi_lab.model.shape import Shape

PARTS = ("overlap_gap_ms", "gemm_efficiency_ms", "attention_kernels_ms", "attention_over_peer_ms",
         "elementwise_ms", "padding_ms", "host_ms", "unattributed_ms")
COLUMNS = ("kind", "name", "tokens", "graph_tokens", "engine_ms", "floor_ms", "sequential_floor_ms",
           "library_floor_ms", "library_floor_padded_ms", "engine_over_library_floor",
           "over_floor_ms", *PARTS,
           "targets", "experiment", "claim", "ours", "hardware", "engine_part", "why", "note")
KEY = re.compile(r"^(?:c=(\d+)\+)?b=(\d+)(?:,ctx=(\d+))?(?:,(\w+))?$")
HOST = "host: not in the lease (the launch step keeps one time per iteration)"

@dataclass
class Lease:
    folder: Path
    device: str
    launch: dict[str, gpu_records.Metric]
    env: dict
    engine: str = ""
    # (experiment, claim) -> the lease's own sweep judged at the device's floors (floor_claims.py)
    floors: dict[tuple[str, str], dict] = field(default_factory=dict)

    def table(self, step: str, name: str) -> Path:
        return self.folder / "steps" / step / name


def load(folder: Path) -> Lease:
    """A lease's record, env and launch results through the suite's one reader: a RecordError
    naming the file and the field. A lease that ran no launch step has no iteration to attribute,
    but its claims still have one."""
    folder = Path(folder).resolve()
    where = folder / gpu_records.LEASE_FILE
    record = gpu_records.read(where, gpu_records.lease)
    if record["lease"] != folder.name:
        raise gpu_records.invalid(str(where), "lease", record["lease"],
                                  f"its folder's name {folder.name!r}")
    launch = {}
    if os.path.lexists(folder / "steps" / "launch"):
        path = folder / "steps" / "launch" / "result.json"
        launch = gpu_records.checked_values(gpu_records.read(path, gpu_records.step_result),
                                            str(path))
    env = gpu_records.read_env(folder / "steps" / "env")
    return Lease(folder, record["device"], launch, env, record["engine"], _floor_claims(folder))


FLOOR_COLUMNS = {name: gpu_tables.TEXT for name in ("experiment", "claim", "floors", "holds")}


def _floor_claims(folder: Path) -> dict[tuple[str, str], dict]:
    path = gpu_records.beside(folder, gpu_records.FLOOR_CLAIMS)
    if not os.path.lexists(path):
        return {}
    return {(r["experiment"], r["claim"]): r for r in gpu_tables.read_table(path, FLOOR_COLUMNS)}


def _value(lease: Lease, metric: str) -> float | None:
    """Checked by the reader: a finite time, a token count, or None (not measured)."""
    found = lease.launch.get(metric)
    return None if found is None or found.value is None else float(found.value)


def kinds(lease: Lease) -> list[tuple[str, int, int, int, str]]:
    """(key, chunk, decodes, context, variant) of each iteration the launch step timed, in order."""
    base = SHAPES["cuda"][2]
    found = []
    for metric in lease.launch:
        if metric.startswith("engine_ms[") and (m := KEY.match(metric[len("engine_ms["):-1])):
            found.append((metric[len("engine_ms["):-1], int(m[1] or 0), int(m[2]),
                          int(m[3] or base), m[4] or ""))
    return found


@dataclass(frozen=True)
class Tables:
    shape: Shape
    elem: int
    gbps: float
    ceiling: str      # which rate the floors' memory ceiling is: read or copy
    gemms: lib.GemmCurve
    attention: lib.AttentionTable
    largest: int      # the most tokens a launch iteration holds (its engine's top graph bucket)
    max_batch: int


def tables(lease: Lease) -> Tables:
    model, dtype = SHAPES["cuda"][:2]
    shape = Shape.of(load_config(model))
    gbps, which = memory_ceiling(lease.env)
    tune = lease.table("tune", "tune_gemm.csv")
    attention = lease.table("attention", "attention.csv")
    gemms = lib.gemm_curve(tune, model) if os.path.lexists(tune) else lib.GemmCurve({}, False)
    table = (lib.attention_table(attention, shape.heads, shape.kv_heads)
             if os.path.lexists(attention) else lib.AttentionTable({}, {}))
    shapes = kinds(lease)
    largest = max((c + b for _, c, b, _, _ in shapes if c), default=0)
    max_batch = max((b + (c > 0) for _, c, b, _, _ in shapes), default=1)
    return Tables(shape, DTYPE_BYTES[dtype], gbps, which, gemms, table, largest, max_batch)


def _sum(*parts: float | None) -> float | None:
    return None if any(p is None for p in parts) else sum(parts)


def iteration(lease: Lease, t: Tables, key: str, chunk: int, decodes: int, context: int,
              variant: str) -> dict:
    """One launch iteration's row: its floors, library floor and its time's parts over the floor."""
    queries = [chunk] * (chunk > 0) + [1] * decodes
    args = (t.shape, queries, [context] * len(queries), len(queries), t.elem, t.gbps,
            float(lease.env["matmul_tflops"]) * 1e3)
    physical, kernels = floor(*args).seconds * 1e3, sequential_floor(*args).kernels
    ms = {name: f.seconds * 1e3 for name, f in kernels.items()}
    sequential = sum(ms.values())
    tokens = sum(queries)
    rule = lib.padded_tokens(tokens, t.largest, t.max_batch, decode_only=not chunk)
    # The graph the lease's engine replayed (0: eager); today's bucket rule where unrecorded.
    recorded = _value(lease, f"engine_graph_tokens[{key}]")
    graph = rule if recorded is None else int(recorded) or tokens
    head = ms["embedding"] + ms.get("lm_head", 0.0)
    real, padded = (lib.library_floor(t.shape, chunk, decodes, context, rows, t.elem, t.gbps,
                                      t.gemms, t.attention, head) for rows in (tokens, graph))
    engine = _value(lease, f"engine_ms[{key}]")
    own_chunk = t.attention.chunk_ms("engine", chunk, context - chunk) if chunk else 0.0
    over_peer = (None if own_chunk is None or real.chunk_attention_ms is None
                 else own_chunk * t.shape.layers - real.chunk_attention_ms)
    gemm = None if real.gemm_ms is None else real.gemm_ms - sum(ms[p] for p in lib.PROJECTIONS)
    parts = {"overlap_gap_ms": sequential - physical, "gemm_efficiency_ms": gemm,
             "attention_kernels_ms": _sum(real.chunk_attention_ms, real.decode_attention_ms,
                                          -ms["attention"]),
             "attention_over_peer_ms": over_peer,
             "elementwise_ms": real.elementwise_ms - ms["kv_write"],
             "padding_ms": _sum(padded.ms, None if real.ms is None else -real.ms), "host_ms": None}
    over = None if engine is None else engine - physical
    parts["unattributed_ms"] = (None if over is None
                                else over - sum(v for v in parts.values() if v is not None))
    notes = [*real.missing, *(f"padded: {m}" for m in padded.missing if m not in real.missing),
             HOST]
    if variant:
        notes.append(f"{variant}: co-scheduled attention; its "
                     "parts are the sequential kernels' (isolated)")
    if recorded is not None and graph != rule:
        notes.append(f"the engine replayed a graph of {graph} tokens (this lease's buckets); "
                     f"today's rule gives {rule}")
    return {"kind": "iteration", "name": key, "tokens": tokens, "graph_tokens": graph,
            "engine_ms": engine,
            "floor_ms": physical, "sequential_floor_ms": sequential, "library_floor_ms": real.ms,
            "library_floor_padded_ms": padded.ms,
            "engine_over_library_floor": None if engine is None or not real.ms
            else engine / real.ms,
            "over_floor_ms": over, **parts,
            "targets": targets(lease, key, physical, sequential, real.ms),
            "note": "; ".join(notes)}


def targets(lease: Lease, key: str, physical: float, sequential: float,
            library: float | None) -> str:
    """The launch step's targets a floor puts out of reach, each saying which."""
    found = []
    for metric, base, name in (("engine_over_floor", physical, "physical"),
                               ("engine_over_sequential_floor", sequential, "sequential")):
        recorded = lease.launch.get(f"{metric}[{key}]")
        target = recorded.target if recorded is not None else ""
        if not (m := re.match(r"<=\s*(\d+(?:\.\d+)?)$", target)):
            continue
        limit = float(m[1])
        if name == "physical" and sequential / base > limit:
            found.append(f"{metric} {target} out of reach run one kernel after another "
                         f"(sequential floor {sequential / base:.2f}x the physical)")
        elif library and library / base > limit:
            found.append(f"{metric} {target} out of reach with today's kernels (library floor "
                         f"{library / base:.2f}x the {name} floor)")
    return "; ".join(found)




def claim_rows(lease: Lease, t: Tables) -> list[dict]:
    """Each claim the lease judged short of "yes", split into the device's part and the engine's
    by its result's own attribution (``PaperResult.attribute``), else at the device's floors."""
    own = {r.name: r.attribute for r in registry.RESULTS if r.attribute is not None}
    return [own.get(row.get("experiment", ""), at_floors)(row, lease, t)
            for row in short_of_yes(lease)]


def rows(folder: Path) -> tuple[list[dict], Tables, Lease]:
    lease = load(folder)
    t = tables(lease)
    found = [iteration(lease, t, *k) for k in kinds(lease)]
    found += claim_rows(lease, t)
    return found, t, lease


def _shown(value) -> str:
    if value is None:
        return ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _f(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(found: list[dict], t: Tables, lease: Lease) -> str:
    iterations = [r for r in found if r["kind"] == "iteration"]
    lines = [f"# Attribution: {lease.folder.name} ({lease.device.upper()})", "",
             (f"Written by `python -m sarathi_lab.measure attribute` from the files of "
              f"[{lease.folder.name}]({lease.folder.name}/README.md) (definitions: "
              "[Floors and attribution](../README.md#floors-and-attribution)). Memory "
              f"ceiling: {t.gbps:,.0f} GB/s ({t.ceiling} "
              f"rate{'' if t.ceiling == 'read' else ': the lease measured no read rate'}). Times "
              "in ms over all layers; parts sum to engine minus physical floor."), "",
             ("| iteration | tokens (graph) | engine | floor | sequential | library | engine / "
              "library | overlap gap | GEMM efficiency | attention kernels | attention over peer | "
              "elementwise | padding | host | unattributed |"), "|---" * 15 + "|"]
    for r in iterations:
        lines.append(f"| {r['name']} | {r['tokens']} ({r['graph_tokens']}) | {_f(r['engine_ms'])} "
                     f"| {_f(r['floor_ms'])} | {_f(r['sequential_floor_ms'])} | "
                     f"{_f(r['library_floor_ms'])} | {_f(r['engine_over_library_floor'])} | "
                     + " | ".join(_f(r[p]) for p in PARTS) + " |")
    notes = ["", ("n/a: not computable from the lease's files (csv's note says why); host: the "
                  "launch step keeps one time per iteration, so host work is in unattributed."), "",
             "Targets a floor puts out of reach:", ""]
    notes += [f"- {r['name']}: {prose(r['targets'])}" for r in iterations
              if r["targets"]] or ["- none"]
    if not iterations:
        # A table of headers alone would read as a lease whose iterations all vanished.
        lines[-2:], notes = [("No iteration attributed: this lease's launch step timed none "
                              "as the engine runs it (no `engine_ms[...]`: the suite predates "
                              "them, or the lease ran no launch step).")], []
    lines += notes
    lines += ["", "## The paper's claims: the device's part and the engine's", ""]
    # A claim's text is the lease's: as plain text, never a tag or a link.
    lines += [f"- {prose(r['experiment'])}, {prose(r['claim'])}: {prose(r['why'])}" for r in found
              if r["kind"] == "claim"] or ["- none"]
    lines += ["", ("The paper's device beside ours (ridge points, the simulator's chunking claims "
                   "on the A6000 and the H100): "
                   "[docs/sim/device_beside.md](../../sim/device_beside.md), by `python -m "
                   "sarathi_lab.measure device_beside`."), ""]
    return "\n".join(lines)


def outputs(folder: Path, force: bool = False) -> output_files.Outputs:
    """Derived from the lease's measurements, not measured: beside its folder, never in it."""
    derived = provenance.Provenance("computed from measured GPU", lease=Path(folder).resolve().name,
                                    writer="python -m sarathi_lab.measure attribute")
    return gpu_records.derived_outputs(folder, (gpu_records.ATTRIBUTION_TABLE,
                                                gpu_records.ATTRIBUTION_PAGE), derived, force)


def write(out: output_files.Outputs, found: list[dict], t: Tables, lease: Lease) -> list[Path]:
    table_name, page_name = out.names
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, COLUMNS)
    writer.writeheader()
    writer.writerows({c: _shown(r.get(c)) for c in COLUMNS} for r in found)
    out.add(table_name, table.getvalue())
    out.add(page_name, markdown(found, t, lease))
    return out.write()


def main(argv: list[str] | None = None) -> int:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure attribute",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("lease", type=Path, help="a lease's folder under docs/gpu/<device>/")
    cli_args.shared(parser, force="replace files beside the lease that another writer wrote")
    args = parser.parse_args(argv)
    try:
        out = outputs(args.lease, args.force)
        out.check()
        found, t, lease = rows(args.lease)
        written = write(out, found, t, lease)
    except ValueError as e:
        parser.error(str(e))
    sys.stdout.write(out.staged[written[1].name].decode())
    print("\nwrote " + ", ".join(map(str, written)))
    return 0
