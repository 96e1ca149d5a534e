"""Fig. 3/4: what a decode token costs against a prefill token, by operation and batch size."""
from __future__ import annotations

import re

import pandas as pd

from sarathi_lab.analysis.claims import judged_row
from sarathi_lab.analysis.gpu_rejudge import Read, X
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult, Unscaled, gpu_minutes
from sarathi_lab.analysis.paper_results import tile_quantization
from sarathi_lab.analysis.verdict import SIZE, Judged, judge
from sarathi_lab.model import load_config

# Fig. 3/4 at sequence length 1024: decode over prefill per-token time, by batch size.
DECODE_OVER_PREFILL = {1: 200.0, 2: 100.0, 18: 16.7}
# Fig. 4: prefill throughput saturates at about 180 tokens/ms once batch x length reaches 512.
# Fig. 4a's rate is one layer's: LLaMA-13B's LAYERS run a token that many times slower.
PREFILL_SATURATION_TOKENS = 512
PREFILL_TOKENS_PER_MS = 180.0
LAYERS = 40


def saturates_from(rate: pd.Series, within: float = 0.9) -> dict[str, float]:
    """Fewest tokens from which ``rate`` is ``within`` of its best; that best; fewest measured."""
    rate = rate.sort_index()
    best = rate.max()
    return {"tokens": int(rate[rate >= within * best].index[0]), "tokens_per_ms": float(best),
            "fewest_measured": int(rate.index[0])}


def decode_over_prefill(ops: pd.DataFrame) -> pd.DataFrame:
    """Per (seq_len, batch_size): a decode's per-token time over a prefill token's."""
    total = ops[ops.op == "total"].pivot_table(index=["seq_len", "batch_size"], columns="phase",
                                               values="ms_per_token")
    return total.assign(ratio=total.decode / total.prefill).reset_index()


def prefill_saturation(ops: pd.DataFrame, within: float = 0.9) -> dict[str, float]:
    """``saturates_from`` of prefill throughput against batch_size x seq_len (Fig. 4)."""
    prefill = ops[(ops.op == "total") & (ops.phase == "prefill")]
    return saturates_from(1 / prefill.groupby("tokens").ms_per_token.mean(), within)


def decode_over_prefill_points(ratios: dict[int, float]) -> list[tuple[str, Judged]]:
    """Ours at each batch size the paper gives (Fig. 3/4), by batch size measured."""
    return [(f"B={b:g}", judge(ratios[b], DECODE_OVER_PREFILL[b]))
            for b in DECODE_OVER_PREFILL if b in ratios]


def saturation_point(tokens: int, fewest_measured: bool) -> Judged:
    """Where prefill saturates against the paper's 512; reached at the fewest tokens measured it
    is only a bound (no fewer than that is known), unresolved where the bound could still agree."""
    judged = judge(tokens, PREFILL_SATURATION_TOKENS, kind=SIZE)
    if fewest_measured and judged.word != "smaller":
        return Judged("unresolved", why=f"saturated at the fewest tokens measured, {tokens}")
    return judged


def per_layer_rate(tokens_per_ms: float, layers: int | None) -> str:
    """A whole model's prefill rate beside the paper's, which is one layer's (Fig. 4a)."""
    if layers is None:
        return (f"rate not compared: the paper's ~{PREFILL_TOKENS_PER_MS:g} tokens/ms is one "
                "layer's, and these runs do not name their model's layers")
    per_layer = tokens_per_ms * layers
    return (f"a layer's rate {per_layer:.0f} tokens/ms ({tokens_per_ms:.3g} x {layers} layers), "
            f"{per_layer / PREFILL_TOKENS_PER_MS:.2g}x the paper's one-layer "
            f"~{PREFILL_TOKENS_PER_MS:g} (a device's speed: not judged)")


def _layers(results) -> int | None:
    """The layers of the runs' model; None where the runs do not name a model we can read."""
    try:
        models = results.summary("per_token_cost").model.dropna().unique()
    except (KeyError, AttributeError, FileNotFoundError):
        return None
    try:
        return load_config(str(models[0])).num_hidden_layers if len(models) == 1 else None
    except ValueError:
        return None


def claims(results) -> list[dict]:
    ops = results.table("per_token_cost", "ops")
    ratio = decode_over_prefill(ops)
    # The longest length only (the paper's 1024): mixing lengths muddles batch sizes.
    ratio = ratio[ratio.seq_len == ratio.seq_len.max()].sort_values("batch_size")
    small, large = ratio.iloc[0], ratio.iloc[-1]
    sat = prefill_saturation(ops)
    at_least = " (the fewest measured)" if sat["tokens"] == sat["fewest_measured"] else ""
    total = tile_quantization.iteration_ms(results)
    fine = saturates_from(total.index / total)
    # Points starting at the fewest tokens measured cannot tell; the finer sweep decides.
    chosen = fine if sat["tokens"] == sat["fewest_measured"] else sat
    saturation = saturation_point(chosen["tokens"],
                                  chosen["tokens"] == chosen["fewest_measured"])
    rate = per_layer_rate(sat["tokens_per_ms"], _layers(results))
    return [
        judged_row("per_token_cost",
                   "At small batch a decode token costs 10x or more a prefill token",
                   "200x at batch 1, 16.7x at batch 18 (length 1024)",
                   f"{small.ratio:.1f}x at batch {small.batch_size:g}, {large.ratio:.1f}x at batch "
                   f"{large.batch_size:g} (length {small.seq_len:g})",
                   decode_over_prefill_points(dict(zip(ratio.batch_size, ratio.ratio))),
                   small.ratio),
        judged_row("per_token_cost", "Prefill throughput saturates by batch x length = 512 tokens",
                   f"~{PREFILL_TOKENS_PER_MS:g} tokens/ms a layer (Fig. 4a; "
                   f"{PREFILL_TOKENS_PER_MS / LAYERS:.1f} for LLaMA-13B's "
                   f"{LAYERS}) from {PREFILL_SATURATION_TOKENS} tokens",
                   f"{sat['tokens_per_ms']:.2f} tokens/ms (whole model); within 10% of it from "
                   f"{sat['tokens']} tokens{at_least}; in tile_quantization's "
                   f"finer steps from {fine['tokens']} tokens",
                   [(f"saturates from {chosen['tokens']} tokens", saturation)], chosen["tokens"],
                   rate),
    ]


def figure(results, simulated=None):
    from sarathi_lab.analysis import figures  # lazy: the registry imports without matplotlib
    from sarathi_lab.sim.profiles import OPS

    ops = results.table("per_token_cost", "ops")
    longest = ops[ops.seq_len == ops.seq_len.max()]
    fig, axes = figures.subplots(1, 3, figsize=(15, 4.2))
    for ax, phase in zip(axes, ("prefill", "decode")):
        parts = longest[(longest.phase == phase) & (longest.op != "total")]
        wide = parts.pivot_table(index="batch_size", columns="op", values="ms_per_token")[list(OPS)]
        wide.plot.bar(stacked=True, ax=ax, rot=0, colormap="tab10", legend=phase == "decode")
        ax.set(title=f"{phase}: time per token by "
                     f"operation\n{figures.source_label(results, 'per_token_cost')}",
               xlabel="batch size", ylabel="ms / token")
    ratio = decode_over_prefill(ops)
    source = results.source("per_token_cost")
    figures.sns.lineplot(ratio.assign(seq_len=ratio.seq_len.map(lambda s: f"{source}, {s:g}")),
                         x="batch_size",
                         y="ratio", hue="seq_len", marker="o", ax=axes[2], palette="crest",
                         errorbar=figures.SPREAD)
    label = figures.simulated_label(simulated, "per_token_cost")
    if label:
        sim = decode_over_prefill(simulated.table("per_token_cost", "ops"))
        for color, (length, g) in zip(figures.sim_colors(sim.seq_len.nunique()),
                                      sim.groupby("seq_len")):
            axes[2].plot(g.batch_size, g.ratio, color=color, label=f"{label}, {length:g}",
                         **figures.SIM_STYLE)
    axes[2].scatter(list(DECODE_OVER_PREFILL), list(DECODE_OVER_PREFILL.values()),
                    label="paper (13B/A6000, length 1024)", **figures.PAPER_STYLE)
    axes[2].set(yscale="log", xlabel="batch size",
                title="decode / prefill time per "
                      f"token\n{figures.panel_sources(results, simulated, 'per_token_cost')}",
                ylabel="decode / prefill (x)")
    axes[2].legend(title="length", fontsize=8)
    figures.headline(fig, results, "per_token_cost",
                     "Fig. 3/4: a decode token costs far more than a prefill token", simulated)
    return fig


def _row_layers(row: dict) -> int | None:
    model = row.get("source", "").rpartition(", ")[2]
    try:
        return load_config(model).num_hidden_layers if model else None
    except ValueError:
        return None


def _rejudge_decode_over_prefill(row, folder):
    ratios = {int(b): float(x) for x, b in re.findall(rf"{X} at batch (\d+)", row["ours"])}
    return Read(decode_over_prefill_points(ratios))


def _rejudge_saturation(row, folder):
    coarse = re.search(r"from (\d+) tokens( \(the fewest measured\))?", row["ours"])
    fine = re.search(r"finer steps from (\d+) tokens", row["ours"])
    rate = re.search(r"([0-9.]+) tokens/ms", row["ours"])
    if not (coarse and rate):
        return None
    tokens = int(fine[1]) if coarse[2] and fine else int(coarse[1])
    fewest = bool(coarse[2]) and not fine
    point = saturation_point(tokens, fewest)
    return Read([(f"saturates from {tokens} tokens", point)],
                per_layer_rate(float(rate[1]), _row_layers(row)))


# A lease's row written before two-sided verdicts, by how its claim starts: re-judged from its
# text (analysis/gpu_rejudge.py).
REJUDGE = {
    "At small batch": _rejudge_decode_over_prefill,
    "Prefill throughput saturates": _rejudge_saturation,
}


RESULT = PaperResult(
    name="per_token_cost", order=10, claims=claims, figure=figure,
    rejudge=REJUDGE,
    smoke_runs=((),),
    reading=("**Fig. 3/4, per-token cost.** At small batch a decode token costs one to two orders "
             "of magnitude more than a prefill token (200x at batch 1 on LLaMA-13B/A6000), and "
             "prefill throughput saturates early. Left: time per token by operation; right: the "
             "decode/prefill ratio, the paper's values as stars."),
    # 3 seeds x the paper's 3 batch sizes, at the H100's mean seconds of a job; unscaled, Fig. 3/4's
    # 6 batch sizes.
    gpu=GpuRun(minutes=gpu_minutes(startup_s=17, job_s=(47 - 17) / 6, jobs=9), order=10,
               unscaled=Unscaled(minutes=gpu_minutes(startup_s=17, job_s=(47 - 17) / 6, jobs=18))),
)
