"""Measured GPU kernel times, a layer's kernel on a GPU per row (data/gpu_kernels/README.md)."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.model.shape import Shape
from sarathi_lab.model.spec import ModelSpec
from sarathi_lab.sim.interpolate import Curve, Surface

if TYPE_CHECKING:
    import pandas as pd

    from sarathi_lab.model.spec import ModelConfig

DATA_DIR = Path(__file__).with_name("data") / "gpu_kernels"
GEMM_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
POINTWISE_OPS = ("input_norm", "post_attention_norm", "rope", "act", "add")
ATTENTION_OPS = ("prefill_attention", "decode_attention")


@functools.cache
def model_shapes() -> pd.DataFrame:
    import pandas as pd  # pandas is a fifth of a simulated run's start

    return pd.read_csv(DATA_DIR / "models.csv").set_index("model")


def _tables(device: str, tp: int) -> Path:
    """``tp<n>/``; 1: the device's own."""
    return DATA_DIR / device / (f"tp{tp}" if tp > 1 else "")


def measured(device: str, tp: int = 1) -> list[str]:
    return sorted(p.stem for p in _tables(device, tp).glob("*.csv"))


def measured_devices() -> list[str]:
    return sorted(p.name for p in DATA_DIR.iterdir() if p.is_dir())


@functools.cache
def kernels(device: str, model: str, tp: int = 1) -> pd.DataFrame:
    path = _tables(device, tp) / f"{model}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no measured GPU kernels for {model} on "
                                f"{device}{f' at tp {tp}' if tp > 1 else ''} (have: "
                                f"{', '.join(measured(device, tp))})")
    import pandas as pd

    return pd.read_csv(path)


def curves(table: pd.DataFrame) -> tuple[dict[str, Curve], Surface | None, Surface | None]:
    """Ops by tokens, attention by (chunk, context) or (decodes, context): medians; None: absent."""
    ops = {op: Curve(rows.groupby("tokens").seconds.median().to_dict())
           for op, rows in table.groupby("op") if op not in ATTENTION_OPS}
    pre = table[table.op == "prefill_attention"].assign(before=lambda r: r.context - r.tokens)
    dec = table[table.op == "decode_attention"]
    def surface(rows, keys):
        return Surface(rows.groupby(keys).seconds.median().to_dict()) if len(rows) else None
    prefill, decode = surface(pre, ["tokens", "before"]), surface(dec, ["batch", "context"])
    return ops, prefill, decode


def config_of(model: str) -> ModelConfig:
    """Weights never matter to the simulator."""
    s = model_shapes().loc[model]
    return ModelSpec("llama", hidden_size=int(s.hidden), intermediate_size=int(s.intermediate),
                     num_hidden_layers=int(s.layers), num_attention_heads=int(s.heads),
                     num_key_value_heads=int(s.kv_heads), vocab_size=int(s.vocab),
                     # phi-2's plain MLP (fc1, GELU, fc2): not gated for model.shape.is_gated.
                     max_position_embeddings=4096, hidden_act="silu" if s.gated else "gelu_new")


def model_of(config: ModelConfig) -> str | None:
    """The measured model with ``config``'s layer shapes (the vocabulary aside)."""
    s = Shape.of(config)
    shape = (s.hidden, s.intermediate, s.heads, s.kv_heads, s.layers)
    return next((str(name) for name, m in model_shapes().iterrows()
                 if (m.hidden, m.intermediate, m.heads, m.kv_heads, m.layers) == shape), None)
