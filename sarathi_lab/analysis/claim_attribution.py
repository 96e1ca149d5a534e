"""Each paper claim a lease judged short of "yes", split into the part its device explains
(cuBLAS's curve, the floors at its ceilings, its sweep on the simulator's floor cost model) and the
part our engine does."""
from __future__ import annotations

import os
import re

from sarathi_lab.analysis import gpu_records
from sarathi_lab.model.floors import floor

# What a lease's claims.csv says of a claim, read back to attribute it.
NUMBER = r"\d+(?:\.\d+)?"
PREFILL = re.compile(rf"chunk (\d+): ({NUMBER})x prefill")
LENGTH = re.compile(r"at length (\d+)")
RANGE = re.compile(rf"({NUMBER})x-({NUMBER})x")
SWEEP = re.compile(r"batch sizes ([0-9, ]+?) and lengths ([0-9, ]+)")
# Each kernel at the data-sheet peaks, no tiles or host time (docs/gpu/README.md).
FLOORS = "the lease's sweep on the simulator's `floor` cost model"
NO_FLOORS = ("not attributed (no floor claims beside the lease: python -m "
             "sarathi_lab.measure floor_claims <lease>)")


def _claims(lease) -> list[dict]:
    path = lease.folder / gpu_records.CLAIMS
    if not os.path.lexists(path):
        return []
    return [r for r in gpu_records.read_claims(path) if r.get("holds", "").strip() != "yes"]


def _claim_row(row: dict, hardware: str, engine: str, why: str, note: str = "") -> dict:
    return {"kind": "claim", "name": row.get("experiment", ""),
            "experiment": row.get("experiment", ""),
            "claim": row.get("claim", ""), "ours": row.get("ours", ""), "hardware": hardware,
            "engine_part": engine, "why": why, "note": note}


def chunk_overhead(row: dict, lease, t) -> dict:
    """A chunked prefill's ratio: cuBLAS's part, the engine's rest; attention over the best peer."""
    length = int(m[1]) if (m := LENGTH.search(row.get("ours", ""))) else None
    pieces, hw, eng = [], [], []
    for chunk, ours in ((int(c), float(x)) for c, x in PREFILL.findall(row.get("ours", ""))):
        whole = max((m for m in t.gemms.layer_ms if length and m <= length), default=None)
        at_chunk = t.gemms.ms(chunk)
        if whole is None or at_chunk is None:
            pieces.append(f"chunk {chunk}: not attributed (tune_gemm.csv timed {t.gemms.measured})")
            continue
        hardware = (at_chunk / chunk) / (t.gemms.layer_ms[whole] / whole)
        own = t.attention.chunk_ms("engine", chunk, length - chunk)
        peer = t.attention.chunk_ms("best_peer", chunk, length - chunk)
        attention = (f" (its chunk attention {own / peer:.2f}x the best peer's over a "
                     f"{length - chunk:,}-token prefix)") if own and peer else ""
        hw.append(f"{chunk}: {hardware:.2f}")
        eng.append(f"{chunk}: {ours - hardware:+.2f}")
        pieces.append(f"chunk {chunk}: {hardware:.2f}x of {ours:.2f}x is cuBLAS at {chunk:,} vs "
                      f"{whole:,} tokens on the {lease.device.upper()}; {ours - hardware:+.2f}x is "
                      f"our engine{attention}")
    # The floors beside the library: a ratio even they exceed is the device's, whatever the kernels.
    pieces += [said] if (said := _at_floors(lease, row)[1]) else []
    return _claim_row(row, "; ".join(hw), "; ".join(eng), "; ".join(pieces))


def _floor_gain(lease, t, chunk: int, batch: int, length: int) -> float:
    """The paper's decode gain at the device's floors: decode-only per decode over riding ones."""
    rate = float(lease.env["matmul_tflops"]) * 1e3

    def ms(queries):
        return floor(t.shape, queries, [length] * len(queries), len(queries), t.elem, t.gbps,
                     rate).seconds

    alone = ms([1] * batch) / batch
    added = (ms([chunk] + [1] * (batch - 1)) - ms([chunk])) / (batch - 1)
    return alone / added


def decode_speedup(row: dict, lease, t) -> dict:
    """The paper's gain at this device's floors beside ours: a shortfall they allow is ours."""
    sweep, paper = SWEEP.search(row.get("ours", "")), RANGE.search(row.get("paper", ""))
    ours, chunk = RANGE.search(row.get("ours", "")), re.search(r"chunk (\d+)", row.get("paper", ""))
    if not (sweep and ours and chunk):
        return _claim_row(row, "", "",
                          "not attributed (claims.csv does not name the sweep's points)")
    points = [(int(b), int(n)) for b in sweep[1].split(",") if b.strip() and int(b) > 1
              for n in sweep[2].split(",") if n.strip()]
    gains = {p: _floor_gain(lease, t, int(chunk[1]), *p) for p in points}
    (b_lo, n_lo), (b_hi, n_hi) = min(gains, key=gains.get), max(gains, key=gains.get)
    low, high, top = gains[(b_lo, n_lo)], gains[(b_hi, n_hi)], float(ours[2])
    device = lease.device.upper()
    why = (f"the {device}'s physical floors allow {low:.1f}x (B={b_lo}, length {n_lo}) to "
           f"{high:.1f}x (B={b_hi}, length {n_hi}); ours {float(ours[1]):.1f}x-{top:.1f}x")
    if top > high:
        why += ": ours' top lies above the floors' (a ratio over a difference within the noise)"
    elif paper and top < float(paper[2]) <= high:
        why += (f": the paper's {paper[2]}x fits the device, so the shortfall at the top is our "
                "engine")
    elif paper and high < float(paper[2]):
        why += f": the device caps the gain below the paper's {paper[2]}x"
    if paper and low < float(paper[1]):
        why += f"; at B={b_lo}, length {n_lo} the floor itself is below the paper's {paper[1]}x"
    # Beside them, what an engine running one kernel after another can reach.
    why += f"; {said}" if (said := _at_floors(lease, row)[1]) else ""
    return _claim_row(row, f"{low:.2f}-{high:.2f}", f"ours' top {top / high:.2f} of the floors'",
                      why)


def _at_floors(lease, row: dict) -> tuple[dict | None, str]:
    floors = lease.floors.get((row.get("experiment", ""), row.get("claim", "")))
    said = floors and (f"at the {lease.device.upper()}'s sequential floors ({FLOORS}): "
                       f"{floors['floors']}")
    return floors, said or ""


def at_floors(row: dict, lease, t) -> dict:
    """A schedule's claim: the lease's own sweep at the device's floors beside our run of it."""
    floors, said = _at_floors(lease, row)
    if floors is None:
        return _claim_row(row, "", "", NO_FLOORS)
    if floors["holds"] == "yes":
        return _claim_row(row, "holds at the floors", "the whole shortfall",
                          f"{said}: the device allows the claim, so our shortfall is our engine's")
    return _claim_row(row, f"{floors['holds']} at the floors", "",
                      f"{said}: the claim is '{floors['holds']}' at the floors too, so the "
                      "device explains it")


def tile_quantization(row: dict, lease, t) -> dict:
    """A tile step is a kernel's choice, never a floor's: the task times each token count's own
    forward (a graph of exactly that batch where the engine replays graphs), so ours is this
    device's kernels'."""
    floors, said = _at_floors(lease, row)
    return _claim_row(row, "the device's kernels", "not separable from the lease's files",
                      "a tile step is a kernel's, never a floor's"
                      + (f" ({said})" if floors else "") + ": each token count runs at its "
                      f"exact tokens, so our steps are the {lease.device.upper()}'s kernels' "
                      "(cuBLAS's GEMMs, our attention's query tiles), not the A6000's of the paper")


ATTRIBUTORS = {"chunk_overhead": chunk_overhead, "decode_speedup": decode_speedup,
               "tile_quantization": tile_quantization}


def claim_rows(lease, t) -> list[dict]:
    """Each claim the lease judged short of "yes", split into the device's part and the engine's."""
    found = []
    for row in _claims(lease):
        attribute = ATTRIBUTORS.get(row.get("experiment", ""))
        found.append((attribute or at_floors)(row, lease, t))
    return found
