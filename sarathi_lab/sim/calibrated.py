"""The roofline with its efficiencies fitted to measured GPU kernels (the device file's
``calibration``): sim_cost_model=calibrated, for shapes nobody measured (docs/sim/README.md, section 8).
"""
from __future__ import annotations

from transformers import PretrainedConfig

from sarathi_lab.config import ConfigError
from sarathi_lab.sim.calibration import attention_flops, is_gated, pointwise_elems
from sarathi_lab.sim.device import Device
from sarathi_lab.sim.roofline import RooflineCostModel


class CalibratedRooflineCostModel(RooflineCostModel):
    name = "calibrated"

    def __init__(self, device: Device, config: PretrainedConfig, dtype: str = "bfloat16"):
        if device.calibration is None:
            raise ConfigError(f"sim_cost_model='calibrated' is invalid with sim_device={device.name!r}: its device "
                              "file has no calibration (no GPU kernels measured there); use 'roofline'")
        super().__init__(device, config, dtype)
        self.cal = device.calibration
        gated = is_gated(config)
        # Norm kernels a layer runs: one in phi-2's parallel block, whose attention and MLP read one norm.
        self.norms = 2 if gated else 1
        self.pointwise_bytes = {kind: pointwise_elems(kind, self.shape, gated) * self.elem_bytes
                                for kind in self.cal.pointwise}

    def gemm_s(self, tokens: int, k: int, n: int) -> float:
        return self.cal.gemm_s(tokens, k, n, self.device.peak_flops)

    def _pointwise(self, kind: str, tokens: int) -> float:
        return self.cal.pointwise_s(kind, tokens, self.pointwise_bytes[kind], self.device.memory_bandwidth)

    def pointwise_s(self, tokens: int) -> float:
        return (self.norms * self._pointwise("norm", tokens) + self._pointwise("rope", tokens)
                + self._pointwise("act", tokens) + self._pointwise("add", tokens))

    def embedding_s(self, tokens: int) -> float:
        return self._pointwise("embedding", tokens)

    def prefill_attention_s(self, chunk: int, context: int) -> float:
        c = self.cal
        flops = attention_flops(self.attn_flops_per_pair, chunk, context, c.prefill_tile)
        return (c.prefill_launch_s + -(-chunk // c.prefill_tile) * c.prefill_tile * c.prefill_per_query_s
                + flops / (self.device.peak_flops * c.prefill_efficiency))

    def decode_attention_s(self, contexts: list[int]) -> float:
        c = self.cal
        return (c.decode_launch_s + c.decode_per_request_s * len(contexts)
                + sum(contexts) * self.kv_bytes_per_token / (self.device.memory_bandwidth
                                                             * c.decode_bandwidth_efficiency))
