"""The simulator: the engine's scheduler and metrics on a virtual clock, costs predicted."""
# Imported so that their cost models register, however the package is entered.
from sarathi_lab.sim import kernel_model, parallel, profile_model, roofline  # noqa: F401
from sarathi_lab.sim.build import (
                                   kv_capacity_tokens,
                                   max_batch,
                                   simulated_cost_model,
                                   simulated_kv_blocks,
)
from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.device import load_device

__all__ = ["CostModel", "kv_capacity_tokens", "load_device", "max_batch", "simulated_cost_model",
           "simulated_kv_blocks"]
