"""How every table and figure names where a run's numbers come from: measured on a CPU, measured on
a GPU, or predicted by a cost model (which one, for which device). The one home of these words: the
sweep table, the claims table and the figures all say it this way."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def simulated_source(device: str, cost_model: str, tp: int = 1) -> str:
    """How a claim or figure names numbers a cost model predicted: 'simulated A100 (roofline)', or
    'simulated 2 x A100 (roofline, tensor parallel)'."""
    return (f"simulated {device.upper()} ({cost_model})" if int(tp) == 1
            else f"simulated {int(tp)} x {device.upper()} ({cost_model}, tensor parallel)")


def run_source(executor: Mapping[str, Any], device: str | None) -> str:
    """'measured CPU', 'measured GPU' or e.g. 'simulated A100 (calibrated)': ``executor`` holds
    ``executor`` (model | sim) and, when simulated, ``sim_device``, ``sim_cost_model`` and ``sim_tp``
    (a run's environment record holds them all); ``device``: the device a measured run ran on."""
    if executor.get("executor") == "sim":
        return simulated_source(str(executor.get("sim_device", "unrecorded")),
                                str(executor.get("sim_cost_model", "unrecorded")), executor.get("sim_tp") or 1)
    return "measured GPU" if str(device or "").startswith("cuda") else "measured CPU"
