"""A paper claim a lease judged short of "yes", split into the part its device explains (cuBLAS's
curve, the floors at its ceilings, its sweep on the simulator's floor cost model) and the part our
engine does: the row every attribution writes, and the attribution of a result that names none of
its own (``PaperResult.attribute``), its sweep at the device's floors."""
from __future__ import annotations

import os

from sarathi_lab.analysis import gpu_records

# A number in a lease's claims.csv text, read back to attribute a claim.
NUMBER = r"\d+(?:\.\d+)?"
# Each kernel at the data-sheet peaks, no tiles or host time (docs/gpu/README.md).
FLOORS = "the lease's sweep on the simulator's `floor` cost model"
NO_FLOORS = ("not attributed (no floor claims beside the lease: python -m "
             "sarathi_lab.measure floor_claims <lease>)")


def short_of_yes(lease) -> list[dict]:
    """The lease's claims rows judged short of "yes"."""
    path = lease.folder / gpu_records.CLAIMS
    if not os.path.lexists(path):
        return []
    return [r for r in gpu_records.read_claims(path) if r.get("holds", "").strip() != "yes"]


def attribution_row(claim: dict, hardware: str, engine: str, why: str, note: str = "") -> dict:
    return {"kind": "claim", "name": claim.get("experiment", ""),
            "experiment": claim.get("experiment", ""),
            "claim": claim.get("claim", ""), "ours": claim.get("ours", ""), "hardware": hardware,
            "engine_part": engine, "why": why, "note": note}


def floors_said(lease, claim: dict) -> tuple[dict | None, str]:
    """The lease's floor claim beside ``claim`` and what it says, where one was made."""
    floors = lease.floors.get((claim.get("experiment", ""), claim.get("claim", "")))
    said = floors and (f"at the {lease.device.upper()}'s sequential floors ({FLOORS}): "
                       f"{floors['floors']}")
    return floors, said or ""


def at_floors(claim: dict, lease, t) -> dict:
    """A schedule's claim: the lease's own sweep at the device's floors beside our run of it."""
    floors, said = floors_said(lease, claim)
    if floors is None:
        return attribution_row(claim, "", "", NO_FLOORS)
    if floors["holds"] == "yes":
        return attribution_row(claim, "holds at the floors", "the whole shortfall",
                               f"{said}: the device allows the claim, so our shortfall is our "
                               "engine's")
    return attribution_row(claim, f"{floors['holds']} at the floors", "",
                           f"{said}: the claim is '{floors['holds']}' at the floors too, so the "
                           "device explains it")
