"""Iteration time interpolated from a table the engine measured (``task=profile``;
docs/sim/README.md, section 8)."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sarathi_lab.config import ConfigError
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.cost_model import (
    Choice,
    CostModel,
    IterationCost,
    batch_tokens,
    register_cost_model,
)
from sarathi_lab.sim.device import DEVICES
from sarathi_lab.sim.gpu_kernels import ATTENTION_OPS, curves
from sarathi_lab.sim.interpolate import Curve
from sarathi_lab.sim.profiles import OPS, profile_description, profile_path
from sarathi_lab.sim.roofline import RooflineCostModel, roofline_for

if TYPE_CHECKING:
    import pandas as pd

    from sarathi_lab.model.spec import ModelConfig

# Ops whose time depends on the token count alone (attention also on the contexts).
DENSE_OPS = tuple(op for op in OPS if op != "attention")
COLUMNS = ("op", "tokens", "context", "batch", "seconds")


# A reference forward spreading more than this while profiled is worth a warning.
DRIFT_WARNING = 0.05


def drift_spread(description: dict) -> float | None:
    """Slowest over fastest time of the reference forward, minus one; None: not timed."""
    drift = description.get("drift") or {}
    if "spread" in drift:
        return drift["spread"]
    return abs(drift["rel_change"]) if "rel_change" in drift else None


def measured_iterations(
        table: pd.DataFrame) -> list[tuple[str, list[tuple[int, int]], list[int], float]]:
    """Bare forwards as (kind, prefills, decodes, seconds): one-request ``total`` rows prefill."""
    rows = []
    for row in table[table.op.isin(("total", "hybrid_total"))].itertuples():
        tokens, context, batch = int(row.tokens), int(row.context), int(row.batch)
        seconds = float(row.seconds)
        if row.op == "hybrid_total":
            rows.append(("hybrid", [(tokens, tokens)], [context] * batch, seconds))
        elif batch == 1 and tokens == context:
            rows.append(("prefill", [(tokens, tokens)], [], seconds))
        else:
            rows.append(("decode", [], [context] * batch, seconds))
    return rows


def _fit(rows: pd.DataFrame, features: list[str]) -> np.ndarray:
    """Coefficients clipped at 0: host time never shrinks with work."""
    x = np.column_stack([np.ones(len(rows))] + [rows[f].to_numpy(float) for f in features])
    coef, *_ = np.linalg.lstsq(x, rows.seconds.to_numpy(float), rcond=None)
    return np.clip(coef, 0.0, None)


@register_cost_model("profile_table")
class ProfileCostModel(CostModel):
    name = "profile"

    @classmethod
    def applies(cls, choice: Choice) -> bool:
        # Else the expected device's table, where this one lacks the model's kernels.
        unmeasured = choice.measured_name not in gpu_kernels.measured(choice.device)
        return choice.tp == 1 and (choice.own_table or unmeasured)

    @classmethod
    def build(cls, choice: Choice) -> ProfileCostModel:
        path = (Path(choice.profile) if choice.profile is not None
                else profile_path(choice.device, choice.model))
        # Past the profiled token counts the device's roofline prices the increment.
        beyond = roofline_for(choice) if choice.device in DEVICES else None
        return cls.from_csv(path, choice.config, choice.dtype, beyond=beyond)

    def __init__(self, table: pd.DataFrame, config: ModelConfig, dtype: str = "bfloat16",
                 source: str = "table", beyond: RooflineCostModel | None = None):
        """``beyond``: a roofline past the measured counts; None: the end slope goes on."""
        super().__init__(config, dtype)
        self.beyond = beyond
        missing = [c for c in COLUMNS if c not in table.columns]
        if missing:
            raise ValueError(f"profile {source}: no column {missing[0]!r}; expected "
                             f"{', '.join(COLUMNS)}")
        self.source = source
        # A NaN would reach the clock only near a batch's size, a negative be clipped silently.
        import pandas as pd
        for column in COLUMNS[1:]:
            values = pd.to_numeric(table[column], errors="coerce").to_numpy(float)
            bad = ~(np.isfinite(values) & (values >= 0))
            if bad.any():
                i = int(bad.argmax())
                raise ValueError(f"profile {source}: row {table.index[i]} (op "
                                 f"{table.op.iloc[i]!r}) {column}={table[column].tolist()[i]!r} is "
                                 f"invalid: must be a finite number >= 0")
        by_op = {op: rows for op, rows in table.groupby("op")}
        needed = (*DENSE_OPS, "prefill_attention", "decode_attention", "lm_head", "prepare",
                  "sample")
        absent = [op for op in needed if op not in by_op]
        if absent:
            raise ValueError(f"profile {source}: no rows for op {absent[0]!r}")
        self.dense, self.prefill_attention, self.decode_attention = curves(
            table[table.op.isin((*DENSE_OPS, *ATTENTION_OPS))])
        self._dense_top = min(c.xs[-1] for c in self.dense.values())
        # Against the rows sampled: the LM head sees only those.
        self.lm_head = Curve(by_op["lm_head"].groupby("batch").seconds.median().to_dict())
        self.prepare_coef = _fit(by_op["prepare"], ["tokens", "batch"])
        self.sample_coef = _fit(by_op["sample"], ["batch"])
        floor = min(by_op["prefill_attention"].seconds.min(),
                    by_op["decode_attention"].seconds.min())
        self.attention_shared_s = self._shared_attention(by_op.get("hybrid_attention"), floor)
        self.extrapolations = 0
        self._dense_cache: dict[int, tuple[float, bool]] = {}

    def _shared_attention(self, hybrids: pd.DataFrame | None, floor: float) -> float:
        """A hybrid's once-paid cost: the median measured excess (at most the smaller part)."""
        if hybrids is None:
            return floor
        excess = []
        for row in hybrids.itertuples():
            pre, _ = self.prefill_attention(row.tokens, 0)
            dec, _ = self.decode_attention(row.batch, row.context)
            excess.append(min(max(pre + dec - row.seconds, 0.0), pre, dec))
        return float(np.median(excess))

    @classmethod
    def from_csv(cls, path: str | Path, config: ModelConfig, dtype: str = "bfloat16",
                 beyond: RooflineCostModel | None = None) -> ProfileCostModel:
        """Refused if its .json says it was measured in another dtype, whose times differ."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no profile at {path}: run task=profile on that device and "
                                    f"model first")
        description = profile_description(path)
        measured = description.get("engine", {}).get("torch_dtype")
        if measured is not None and measured != dtype:
            raise ConfigError("dtype", dtype,
                              f"is invalid with the profile {path}: it was measured in {measured} "
                              f"(run task=profile in {dtype}, or simulate in {measured})")
        spread = drift_spread(description)
        if spread is not None and spread > DRIFT_WARNING:
            warnings.warn(f"profile {path}: its reference forward moved by up to "
                          f"{100 * spread:.0f}% while it was measured; its times are about that "
                          "unsure", stacklevel=2)
        import pandas as pd
        try:
            table = pd.read_csv(path)
            if table.empty or table.isna().to_numpy().any():
                raise ValueError("empty, or a value missing or NaN")
            return cls(table, config, dtype, source=str(path), beyond=beyond)
        except ConfigError:
            raise
        except (ValueError, KeyError, IndexError, TypeError) as e:
            what = f"no column {e}" if isinstance(e, KeyError) else " ".join(str(e).split())[:160]
            raise ConfigError("sim_cost_model", "profile",
                              f"is invalid here: the profile {path} is unreadable ({what}); run "
                              "task=profile again") from None

    def _dense_s(self, tokens: int) -> tuple[float, bool]:
        if tokens not in self._dense_cache:
            top = self._dense_top
            if self.beyond is not None and tokens > top:
                at_top, _ = self._dense_s(top)
                value = at_top + self.beyond.dense_s(tokens) - self.beyond.dense_s(top)
                self._dense_cache[tokens] = (value, True)
            else:
                parts = [self.dense[op](tokens) for op in DENSE_OPS]
                self._dense_cache[tokens] = (sum(v for v, _ in parts), any(out for _, out in parts))
        return self._dense_cache[tokens]

    def _cost(self, prefills, decodes, num_sampled) -> IterationCost:
        tokens = batch_tokens(prefills, decodes)
        dense, outside = self._dense_s(tokens)
        # ``others`` was measured with one sampled row: add the LM head's other rows.
        head, head_out = self.lm_head(num_sampled) if num_sampled else (0.0, False)
        one_row, _ = self.lm_head(1)
        ops = {"dense": dense, "lm_head_extra": head - one_row}
        pre = [self.prefill_attention(chunk, context - chunk) for chunk, context in prefills]
        dec = [self.decode_attention(len(decodes), sum(decodes) / len(decodes))] if decodes else []
        parts = [t for t, _ in pre + dec]
        outside = outside or any(out for _, out in pre + dec)
        ops["prefill_attention"] = sum(t for t, _ in pre)
        ops["decode_attention"] = dec[0][0] if dec else 0.0
        forward = sum(ops.values())
        if len(parts) > 1 and self.attention_shared_s:
            # One attention pass per layer serves the whole batch: its fixed cost is paid once, and
            # more work never rounds to less time.
            attention = max(sum(parts) - self.attention_shared_s * (len(parts) - 1), max(parts))
            cut = sum(parts) - attention
            taken = min(cut, ops["decode_attention"])
            ops["decode_attention"] -= taken
            ops["prefill_attention"] -= cut - taken
            forward = ops["dense"] + ops["lm_head_extra"] + attention
        outside = outside or head_out
        if outside:
            self.extrapolations += 1
            if self.extrapolations == 1:
                warnings.warn(f"profile {self.source}: an iteration (tokens={tokens}, "
                              f"prefills={prefills[:3]}, {len(decodes)} decodes) lies outside the "
                              f"measured grid; its time is extrapolated "
                              "(later ones are counted in .extrapolations, not warned)",
                              stacklevel=3)
        a, per_token, per_request = self.prepare_coef
        sa, per_row = self.sample_coef
        return IterationCost(prepare_s=a + per_token * tokens
                             + per_request * (len(prefills) + len(decodes)), forward_s=forward,
                             sample_s=sa + per_row * num_sampled, ops=ops, extrapolated=outside)
