"""Fig. 3/4: what a decode token costs against a prefill token, by operation and batch size."""
from __future__ import annotations

from sarathi_lab.analysis import derive, paper
from sarathi_lab.analysis.claims import claim_row, saturated_by, verdict
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult, gpu_minutes


def claims(results) -> list[dict]:
    ops = results.table("per_token_cost", "ops")
    ratio = derive.decode_over_prefill(ops)
    # The longest length only (the paper's 1024): mixing lengths muddles batch sizes.
    ratio = ratio[ratio.seq_len == ratio.seq_len.max()].sort_values("batch_size")
    small, large = ratio.iloc[0], ratio.iloc[-1]
    sat = derive.prefill_saturation(ops)
    at_least = " (the fewest measured)" if sat["tokens"] == sat["fewest_measured"] else ""
    total = derive.iteration_ms(results)
    fine = derive.saturation(total.index / total)
    # Points starting past 512 tokens cannot tell; the finer sweep decides.
    coarse = saturated_by(sat, paper.PREFILL_SATURATION_TOKENS)
    return [
        claim_row("per_token_cost",
                  "At small batch a decode token costs 10x or more a prefill token",
                  "200x at batch 1, 16.7x at batch 18 (length 1024)",
                  f"{small.ratio:.1f}x at batch {small.batch_size:g}, {large.ratio:.1f}x at batch "
                  f"{large.batch_size:g} (length {small.seq_len:g})", verdict([small.ratio >= 10]),
                  small.ratio),
        claim_row("per_token_cost", "Prefill throughput saturates by batch x length = 512 tokens",
                  f"~{paper.PREFILL_TOKENS_PER_MS:g} tokens/ms from "
                  f"{paper.PREFILL_SATURATION_TOKENS} tokens",
                  f"{sat['tokens_per_ms']:.2f} tokens/ms; within 10% of it from {sat['tokens']} "
                  f"tokens{at_least}; in tile_quantization's "
                  f"finer steps from {fine['tokens']} tokens",
                  verdict([coarse if coarse is not None
                           else saturated_by(fine, paper.PREFILL_SATURATION_TOKENS)]),
                  sat["tokens"]),
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
    ratio = derive.decode_over_prefill(ops)
    source = results.source("per_token_cost")
    figures.sns.lineplot(ratio.assign(seq_len=ratio.seq_len.map(lambda s: f"{source}, {s:g}")),
                         x="batch_size",
                         y="ratio", hue="seq_len", marker="o", ax=axes[2], palette="crest",
                         errorbar=figures.SPREAD)
    label = figures.simulated_label(simulated, "per_token_cost")
    if label:
        sim = derive.decode_over_prefill(simulated.table("per_token_cost", "ops"))
        for color, (length, g) in zip(figures.sim_colors(sim.seq_len.nunique()),
                                      sim.groupby("seq_len")):
            axes[2].plot(g.batch_size, g.ratio, color=color, label=f"{label}, {length:g}",
                         **figures.SIM_STYLE)
    axes[2].scatter(list(paper.DECODE_OVER_PREFILL), list(paper.DECODE_OVER_PREFILL.values()),
                    label="paper (13B/A6000, length 1024)", **figures.PAPER_STYLE)
    axes[2].set(yscale="log", xlabel="batch size",
                title="decode / prefill time per "
                      f"token\n{figures.panel_sources(results, simulated, 'per_token_cost')}",
                ylabel="decode / prefill (x)")
    axes[2].legend(title="length", fontsize=8)
    figures.headline(fig, results, "per_token_cost",
                     "Fig. 3/4: a decode token costs far more than a prefill token", simulated)
    return fig


RESULT = PaperResult(
    name="per_token_cost", order=10, claims=claims, figure=figure,
    reading=("**Fig. 3/4, per-token cost.** At small batch a decode token costs one to two orders "
             "of magnitude more than a prefill token (200x at batch 1 on LLaMA-13B/A6000), and "
             "prefill throughput saturates early. Left: time per token by operation; right: the "
             "decode/prefill ratio, the paper's values as stars."),
    # 3 seeds x 6 batch sizes at the H100's seconds.
    gpu=GpuRun(minutes=gpu_minutes(startup_s=17, job_s=(47 - 17) / 6, jobs=18), order=10),
)
