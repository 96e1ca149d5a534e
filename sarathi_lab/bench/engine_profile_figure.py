"""The figure of sim_fidelity's engine-profile comparison: this engine's forward as ``task=profile``
measured it on a GPU, against each cost model that exists for that GPU (docs/sim/README.md, 5c)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from sarathi_lab.sim.engine_fidelity import models_in

MARKERS = {"roofline": "x", "calibrated": "o", "profile": "+"}


def _marker(name: str) -> str:
    return MARKERS.get(name, "^")


def _label(name: str, device: str) -> str:
    """A borrowed calibration says whose it is and on which peaks."""
    if name == "profile":
        return "profile cost model (this table, composed)"
    other = name.removesuffix("_calibration")
    return f"{other.upper()}'s calibration on {device.upper()} peaks" if other != name else name


def draw(ops: pd.DataFrame, iterations: pd.DataFrame, errors: pd.DataFrame, path: Path) -> None:
    """Per (device, model): prefill and decode forwards, measured and predicted; each op's median
    predicted / measured."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no figure to close

    pairs = list(iterations.groupby(["device", "model"], sort=True).groups)
    fig = Figure(figsize=(15, 4.2 * len(pairs)))
    axes = fig.subplots(len(pairs), 3, squeeze=False)
    for row, (device, model) in zip(axes, pairs):
        its = iterations[(iterations.device == device) & (iterations.model == model)]
        names = models_in(its)
        pre, dec = its[its.kind == "prefill"], its[its.kind == "decode"]
        kv = dec.batch * dec.context
        row[0].plot(pre.tokens, pre.measured_s * 1e3, "k.-", label="measured (engine profile)")
        row[1].scatter(kv, dec.measured_s * 1e3, color="k", s=14, label="measured (engine profile)")
        for name in names:
            row[0].plot(pre.tokens, pre[f"{name}_s"] * 1e3, marker=_marker(name), ms=4, lw=0.8,
                        label=_label(name, device))
            row[1].scatter(kv, dec[f"{name}_s"] * 1e3, marker=_marker(name), s=14, label=_label(name, device))
        row[0].set(xlabel="prompt tokens (one prompt, prefilled whole)", ylabel="forward pass (ms)")
        row[0].set_title(f"{device} {model}: prefill-only iterations", fontsize=9)
        row[1].set(xlabel="KV tokens read (decodes x context)", ylabel="forward pass (ms)")
        row[1].set_title(f"{device} {model}: decode-only iterations, batch 1-{dec.batch.max()}", fontsize=9)
        err = errors[(errors.device == device) & (errors.model == model) & (errors.level == "op")]
        names = models_in(ops[(ops.device == device) & (ops.model == model)])
        width = 0.8 / max(len(names), 1)
        for i, name in enumerate(names):
            row[2].bar([j + (i - (len(names) - 1) / 2) * width for j in range(len(err))],
                       err[f"{name}_median_ratio"], width=width, label=_label(name, device))
        row[2].axhline(1.0, color="k", lw=0.8)
        row[2].set_yscale("log")
        # Headroom above the tallest bar for the legend.
        row[2].set_ylim(top=4 * max([1.0, *(err[f"{n}_median_ratio"].max() for n in names)]))
        row[2].set_xticks(range(len(err)), [k.replace("_", "\n") for k in err.kind], fontsize=7)
        row[2].set(ylabel="predicted / measured (median over the op's rows)")
        row[2].set_title(f"{device} {model}: each operator (whole model, every layer)", fontsize=9)
        for ax, rows in zip(row[:2], (pre, dec)):
            # Headroom above the slowest measured forward for the legend.
            ax.set_ylim(0, 1.5 * rows.measured_s.max() * 1e3)
            ax.legend(fontsize=7, loc="upper right")
        row[2].legend(fontsize=7, loc="upper right")
    gpus = ", ".join(d.upper() for d in sorted(set(iterations.device)))
    fig.suptitle(f"Measured GPU: this engine on {gpus} (task=profile; no CUDA graphs, so its launches count), "
                 "against the cost models that exist there", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
