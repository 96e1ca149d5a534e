"""Linear layers on the CPU through oneDNN, with each weight re-laid out once at load time.

Why: ``F.linear`` on the CPU calls MKL's GEMM, which at the row counts of decode batches runs far
below the machine's rate (at 8 rows it reads cpu-small's weights at ~5 GB/s where a copy runs at
~17). oneDNN's matmul over a weight packed once into its blocked layout (what torch.compile's CPU
freezing pass emits for a frozen linear) is 1.2-1.7x faster from 2 rows to 512 on cpu-small's
shapes in isolation; in the engine, batch-8 decode iterations run 1.23x faster on 1 thread and
1.43x on 2, prefill about even. One row stays on MKL: its GEMV already streams the weight near copy
speed, and a packed weight would be re-ordered on every call (measured: 100x slower). The packed
copy doubles the linear weights' memory; ``EngineConfig(cpu_linear="aten")`` opts out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The row count oneDNN packs the weight for; measured on cpu-small, any hint from 2 to 512 gives
# within 10% of the best layout at every row count from 2 to 512.
_PACK_ROWS_HINT = 8


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class PackedLinear(nn.Module):
    """The same parameters as the ``nn.Linear`` it replaces (shared, so tied embeddings and
    ``state_dict`` are unchanged) plus a packed copy of the weight that oneDNN reads."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _PACK_ROWS_HINT)
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < 2:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linears(module: nn.Module) -> None:
    """Replace every ``nn.Linear`` under ``module`` (inputs [tokens, features]) by a PackedLinear."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child))
        else:
            pack_linears(child)
