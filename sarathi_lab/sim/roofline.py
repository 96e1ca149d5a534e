"""Iteration time from a device's ceilings: each kernel as long as the slower of its flops and bytes
at the share of peak real kernels reach, never under a kernel's floor (shares fitted to measured
kernels when calibrated: docs/sim/README.md, section 8)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sarathi_lab.config import ConfigError, Key
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim.calibration import attention_flops, ceil_to, pointwise_elems
from sarathi_lab.sim.cost_model import (
    Choice,
    CostModel,
    IterationCost,
    batch_tokens,
    register_cost_model,
)
from sarathi_lab.sim.device import Device, at_floors, load_device

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig

# Small decode-only iterations are remembered by their contexts: the same few recur through small
# batches (most of a capacity search), and hashing a few contexts costs less than predicting.
SMALL_DECODE_BATCH = 4
MEMO_SIZE = 1 << 16


@register_cost_model("roofline")
class RooflineCostModel(CostModel):
    name = "roofline"

    @classmethod
    def build(cls, choice: Choice) -> RooflineCostModel:
        return roofline_for(choice)

    def __init__(self, device: Device, config: ModelConfig, dtype: str = "bfloat16"):
        super().__init__(config, dtype)
        self.device = device
        s, e = Shape.of(config), self.elem_bytes
        self.shape = s
        # phi-2's parallel block: attention and MLP read one norm.
        self.norms = 2 if s.gated else 1
        # The residual adds move as much as two norms (the engine fuses each into a norm).
        self.pointwise_elems = {"norm": self.norms * pointwise_elems("norm", s),
                                "add": 4 * s.hidden, "rope": pointwise_elems("rope", s),
                                "act": pointwise_elems("act", s)}
        self.pointwise_bytes_per_token = e * sum(self.pointwise_elems.values())
        self.kv_bytes_per_token = s.kv_bytes_per_token(e, layers=1)
        self.qo_bytes_per_token = 2 * s.heads * s.head_dim * e
        self.attn_flops_per_pair = s.attention_flops_per_pair
        self.gemm_rate = device.peak_flops * device.gemm_flops_efficiency
        self.attn_rate = device.peak_flops * device.attention_flops_efficiency
        self.bw = device.memory_bandwidth * device.bandwidth_efficiency
        self.attn_bw = device.memory_bandwidth * device.attention_bandwidth_efficiency
        self._dense: dict[tuple[int, int], dict[str, float]] = {}
        # Exact for any subclass: the cost is a function of the batch's composition alone.
        self._small_decodes: dict[tuple[int, ...], IterationCost] = {}

    def _kernel(self, flops: float, nbytes: float, rate: float, bw: float) -> float:
        return max(flops / rate, nbytes / bw, self.device.kernel_floor_s)

    def gemm_s(self, tokens: int, k: int, n: int) -> float:
        flops = 2 * ceil_to(tokens, self.device.tile_tokens) * k * n
        return self._kernel(flops, (k * n + tokens * (k + n)) * self.elem_bytes, self.gemm_rate,
                            self.bw)

    def pointwise_s(self, tokens: int) -> float:
        """One layer's pointwise work, as one kernel."""
        return self._kernel(0, tokens * self.pointwise_bytes_per_token, 1, self.bw)

    def pointwise_parts_s(self, tokens: int) -> dict[str, float]:
        """For an engine timing them inside other operators: each kind its share of bytes."""
        whole, elems = self.pointwise_s(tokens), sum(self.pointwise_elems.values())
        return {kind: whole * n / elems for kind, n in self.pointwise_elems.items()}

    def embedding_s(self, tokens: int) -> float:
        return self._kernel(0, 2 * tokens * self.shape.hidden * self.elem_bytes, 1, self.bw)

    def _dense_ops(self, tokens: int, rows: int) -> dict[str, float]:
        key = (tokens, rows)
        if key not in self._dense:
            s, layers = self.shape, self.shape.layers
            ops = {name: layers * self.gemm_s(tokens, k, n) for name, (k, n) in s.gemms.items()}
            ops["pointwise"] = layers * self.pointwise_s(tokens)
            ops["lm_head"] = self.embedding_s(tokens) + (self.gemm_s(rows, s.hidden, s.vocab)
                                                         if rows else 0.0)
            self._dense[key] = ops
        return self._dense[key]

    def dense_s(self, tokens: int) -> float:
        """One row sampled."""
        return sum(self._dense_ops(tokens, 1).values())

    def prefill_attention_s(self, chunk: int, context: int) -> float:
        tile = self.device.attention_tile
        padded = ceil_to(chunk, tile)
        flops = attention_flops(self.attn_flops_per_pair, chunk, context, tile)
        reads = padded // tile if self.device.kv_reread else 1
        nbytes = reads * context * self.kv_bytes_per_token + chunk * (
            self.qo_bytes_per_token + self.kv_bytes_per_token)
        return self._kernel(flops, nbytes, self.attn_rate, self.attn_bw)

    def decode_attention_s(self, contexts: list[int]) -> float:
        kv_tokens = sum(contexts)
        nbytes = kv_tokens * self.kv_bytes_per_token + len(contexts) * (self.qo_bytes_per_token
                                                                          + self.kv_bytes_per_token)
        return self._kernel(self.attn_flops_per_pair * kv_tokens, nbytes, self.attn_rate,
                            self.attn_bw)

    def _cost(self, prefills, decodes, num_sampled) -> IterationCost:
        if prefills or len(decodes) > SMALL_DECODE_BATCH:
            return self._predict(prefills, decodes, num_sampled)
        key = (*decodes, num_sampled)
        cost = self._small_decodes.get(key)
        if cost is None:
            if len(self._small_decodes) >= MEMO_SIZE:
                self._small_decodes.clear()
            cost = self._small_decodes[key] = self._predict(prefills, decodes, num_sampled)
        return cost

    def _predict(self, prefills, decodes, num_sampled) -> IterationCost:
        tokens = batch_tokens(prefills, decodes)
        layers = self.shape.layers
        ops = dict(self._dense_ops(tokens, num_sampled))
        ops["prefill_attention"] = layers * sum(self.prefill_attention_s(c, x) for c, x in prefills)
        ops["decode_attention"] = layers * self.decode_attention_s(decodes) if decodes else 0.0
        return IterationCost(prepare_s=self.device.prepare_s(tokens), forward_s=sum(ops.values()),
                             sample_s=0.0, ops=ops)


@register_cost_model("calibrated")
class CalibratedRooflineCostModel(RooflineCostModel):
    name = "calibrated"

    def __init__(self, device: Device, config: ModelConfig, dtype: str = "bfloat16"):
        if device.calibration is None:
            raise ConfigError("sim_cost_model", "calibrated",
                              "is invalid with " + Key("sim_device", device.name) + ": its device "
                              "file has no calibration (no GPU kernels measured there); use "
                              "'roofline'")
        super().__init__(device, config, dtype)
        self.cal = device.calibration
        self.pointwise_bytes = {kind: pointwise_elems(kind, self.shape) * self.elem_bytes
                                for kind in self.cal.pointwise}

    def gemm_s(self, tokens: int, k: int, n: int) -> float:
        return self.cal.gemm_s(tokens, k, n, self.device.peak_flops)

    def _pointwise(self, kind: str, tokens: int) -> float:
        launch, eff = self.cal.pointwise[kind]
        return launch + tokens * self.pointwise_bytes[kind] / (self.device.memory_bandwidth * eff)

    def pointwise_parts_s(self, tokens: int) -> dict[str, float]:
        # In the order pointwise_s adds them: the same sum to the last bit.
        return {kind: (self.norms if kind == "norm" else 1) * self._pointwise(kind, tokens)
                for kind in ("norm", "rope", "act", "add")}

    def pointwise_s(self, tokens: int) -> float:
        return sum(self.pointwise_parts_s(tokens).values())

    def embedding_s(self, tokens: int) -> float:
        return self._pointwise("embedding", tokens)

    def prefill_attention_s(self, chunk: int, context: int) -> float:
        c = self.cal
        flops = attention_flops(self.attn_flops_per_pair, chunk, context, c.prefill_tile)
        return (c.prefill_launch_s + ceil_to(chunk, c.prefill_tile) * c.prefill_per_query_s
                + flops / (self.device.peak_flops * c.prefill_efficiency))

    def decode_attention_s(self, contexts: list[int]) -> float:
        c = self.cal
        return (c.decode_launch_s + c.decode_per_request_s * len(contexts)
                + sum(contexts) * self.kv_bytes_per_token / (self.device.memory_bandwidth
                                                             * c.decode_bandwidth_efficiency))


@register_cost_model("floor")
class FloorCostModel(RooflineCostModel):
    """Each kernel as long as the slower of its flops and bytes at the data-sheet peaks: the
    sequential floor no schedule's iteration beats, whatever its kernels."""
    name = "floor"

    @classmethod
    def build(cls, choice: Choice) -> FloorCostModel:
        return cls(at_floors(load_device(choice.device, choice.dtype)), choice.part, choice.dtype)


def roofline_for(choice: Choice) -> RooflineCostModel:
    """Calibrated when asked, or under kernels or a profile where the device has one."""
    dev = load_device(choice.device, choice.dtype)
    if choice.cost_model == "calibrated" or (choice.cost_model == "profile"
                                             and dev.calibration is not None):
        return CalibratedRooflineCostModel(dev, choice.part, choice.dtype)
    return RooflineCostModel(dev, choice.part, choice.dtype)
