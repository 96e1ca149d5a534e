"""Iteration time from GPU kernels measured on the device; unmeasured parts roofline-priced."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from sarathi_lab.config import ConfigError, Key
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.calibration import FINE_GRID
from sarathi_lab.sim.cost_model import (
    Choice,
    CostModel,
    IterationCost,
    batch_tokens,
    register_cost_model,
)
from sarathi_lab.sim.gpu_kernels import ATTENTION_OPS, GEMM_OPS, POINTWISE_OPS, curves
from sarathi_lab.sim.interpolate import up_to_point
from sarathi_lab.sim.roofline import RooflineCostModel, roofline_for

if TYPE_CHECKING:
    import pandas as pd

    from sarathi_lab.model.spec import ModelConfig


@register_cost_model("gpu_kernels")
class KernelCostModel(CostModel):
    name = "profile"

    @classmethod
    def build(cls, choice: Choice) -> KernelCostModel:
        """Refused in one line where none were measured."""
        device, name, tp = choice.device, choice.measured_name, choice.tp
        one = roofline_for(choice)
        have = gpu_kernels.measured(device, tp)
        if name not in have:
            at = " at " + Key("sim_tp", tp) if tp > 1 else ""
            use = "calibrated" if one.device.calibration else "roofline"
            raise ConfigError("sim_cost_model", "profile",
                              "is invalid for this model on " + Key("sim_device", device) + at
                              + ": its GPU kernels were not measured (measured: "
                              f"{', '.join(have) or 'none'}); use {use}")
        tp_part = f" tp{tp}" if tp > 1 else ""
        return cls(gpu_kernels.kernels(device, name, tp), one, choice.part, choice.dtype,
                   source=f"{device}/{name}{tp_part} (vidur's measurements, MIT licence)")

    def __init__(self, table: pd.DataFrame, roofline: RooflineCostModel, config: ModelConfig,
                 dtype: str = "bfloat16", source: str = "table"):
        super().__init__(config, dtype)
        self.roofline, self.device = roofline, roofline.device
        ops, self.prefill_attention, self.decode_attention = curves(table)
        missing = [op for op in GEMM_OPS if op not in ops]
        if missing:
            raise ValueError(f"GPU kernels {source}: no rows for op {missing[0]!r}")
        # An op a model does not run (phi-2's post-attention norm) has no rows and costs nothing.
        self.layer_ops = {op: ops[op] for op in (*GEMM_OPS, *POINTWISE_OPS) if op in ops}
        self.embedding = ops.get("embedding")
        modelled = ["lm_head", "host (prepare, sample)"] + [
            f"{op} ({'outside the measured shapes' if surface else 'all: none measured'})"
            for op, surface in zip(ATTENTION_OPS, (self.prefill_attention, self.decode_attention))]
        self.max_tokens = max(c.xs[-1] for c in self.layer_ops.values())
        # Iterations whose attention the measurements did not cover: the roofline's.
        self.modelled_attention_iterations = 0
        warnings.warn(f"GPU kernels {source}: modelled by sim_cost_model={roofline.name!r} on "
                      f"{roofline.device.name}: {'; '.join(modelled)}", stacklevel=2)

    def _cost(self, prefills, decodes, num_sampled) -> IterationCost:
        tokens = batch_tokens(prefills, decodes)
        s = self.roofline.shape
        per_layer = {op: curve(up_to_point(curve.xs, tokens, FINE_GRID))[0]
                     for op, curve in self.layer_ops.items()}
        ops = {op: s.layers * per_layer[op] for op in GEMM_OPS}
        ops["pointwise"] = s.layers * sum(per_layer.get(op, 0.0) for op in POINTWISE_OPS)
        ops["embedding"] = self.embedding(tokens)[0] if self.embedding else 0.0
        ops["lm_head"] = (self.roofline.gemm_s(num_sampled, s.hidden, s.vocab) if num_sampled
                          else 0.0)
        roofline = self.roofline
        pre = [self._attention(self.prefill_attention, (c, x - c), roofline.prefill_attention_s,
                               c, x) for c, x in prefills]
        dec = [self._attention(self.decode_attention, (len(decodes), sum(decodes) / len(decodes)),
                               roofline.decode_attention_s, decodes)] if decodes else []
        ops["prefill_attention"] = s.layers * sum((t for t, _ in pre), 0.0)
        ops["decode_attention"] = s.layers * dec[0][0] if dec else 0.0
        self.modelled_attention_iterations += any(modelled for _, modelled in pre + dec)
        return IterationCost(prepare_s=self.device.prepare_s(tokens), forward_s=sum(ops.values()),
                             sample_s=0.0, ops=ops, extrapolated=tokens > self.max_tokens)

    @staticmethod
    def _attention(surface, at: tuple, roofline_s, *args) -> tuple[float, bool]:
        """(seconds, modelled): past the measured points the roofline's, not a curve carried on."""
        t, beyond = surface(*at) if surface else (0.0, True)
        return (roofline_s(*args), True) if beyond else (t, False)
