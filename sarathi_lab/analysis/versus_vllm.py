"""Our engine beside vLLM itself (experiment=versus_vllm, ``executor=model,vllm``): TTFT, P99 TBT
and throughput of both engines at the same Poisson rates on the same weights, and Sarathi-Serve's
stall-free claim measured on vLLM: its chunked prefill on (scheduler=sarathi_serve) against off
(scheduler=vllm). Draws ``<docs>/figures/versus_vllm.png`` and its claims,
``<docs>/figures/versus_vllm_claims.csv`` (claims.csv's columns), from a sweep's runs:

    python -m sarathi_lab.measure versus_vllm outputs/versus_vllm/multirun/<time>

Not in the registry: it needs vLLM installed, which ``produce`` and the GPU suite do not assume.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.analysis import claims, paper
from sarathi_lab.analysis.claims import claim_row, shown, unless_missing
from sarathi_lab.analysis.verdict import meets
from sarathi_lab.harness.results import load_runs, run_source
from sarathi_lab.provenance import Provenance

NAME = "versus_vllm"
WRITER = "python -m sarathi_lab.measure versus_vllm"
ENGINES = {"model": "sarathi_lab", "vllm": "vLLM"}
# What each of our scheduler names runs on vLLM (harness/vllm_args.py).
BATCHING = {"sarathi_serve": "chunked prefill on", "vllm": "chunked prefill off"}
STALL_FREE = ("vLLM's own chunked prefill (stall-free batching) keeps P99 TBT below vLLM without "
              "it at every load")
OURS = ("Our engine's sarathi_serve keeps P99 TBT below our vllm scheduler's at every load (the "
        "same arrivals)")


class NoRuns(ValueError):
    """No finished run of both engines under the root."""


def named(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of both engines with ``engine``, ``batching``, ``qps`` and ``source``."""
    runs = runs[runs.scheduler.isin(list(BATCHING))].copy()
    runs["engine"] = runs.executor.map(ENGINES)
    runs["batching"] = runs.scheduler.map(BATCHING)
    runs["qps"] = runs["workload.qps"].astype(float)
    runs["source"] = [run_source({"executor": e, "vllm_version": v}, d) for e, v, d in
                      zip(runs.executor, runs.get("env.vllm_version", [None] * len(runs)),
                          runs.device)]
    return runs


def p99_tbt(runs: pd.DataFrame, executor: str) -> pd.DataFrame:
    """P99 TBT (s), mean over seeds, by load and scheduler, of one engine."""
    one = runs[runs.executor == executor]
    table = one.pivot_table(index="qps", columns="scheduler", values="itl_p99_s")
    return table.reindex(columns=list(BATCHING))


def _lower_at_every_load(tbt: pd.DataFrame) -> tuple[str, str]:
    """(ours text, verdict) of sarathi_serve's P99 TBT below vllm's at each load."""
    def at(r) -> str:
        ratio = "" if r.isna().any() else f" ({r.vllm / r.sarathi_serve:.2f}x)"
        return (f"on {shown(r.sarathi_serve * 1e3, '.0f', 'no finished run', ' ms')}, "
                f"off {shown(r.vllm * 1e3, '.0f', 'no finished run', ' ms')}{ratio}")

    text = "; ".join(f"qps {q:g}: {at(r)}" for q, r in tbt.iterrows())
    flags = (unless_missing(r, r.sarathi_serve < r.vllm) for _, r in tbt.iterrows())
    return text, meets(flags)


def claims_rows(runs: pd.DataFrame) -> list[dict]:
    """The stall-free claim on vLLM itself, and the same comparison on our engine."""
    prov = _row_provenance(runs)
    seeds = len(runs.seed.unique())
    spread = claims.NO_REPEATS if seeds < 2 else f"mean of {seeds} seeds"
    rows = []
    for executor, claim in (("vllm", STALL_FREE), ("model", OURS)):
        text, holds = _lower_at_every_load(p99_tbt(runs, executor))
        row = claim_row(NAME, claim, "hybrid batching without a budget raises TBT up to "
                        f"{paper.NAIVE_HYBRID_TBT_INFLATION}x (Sarathi-Serve)", text, holds,
                        versus=("direction only: the paper's size is hybrid batching without a "
                                "budget, not this pair"))
        sources = runs[runs.executor == executor].source.dropna().unique()
        source = "; ".join(sorted(sources)) or "measured"
        rows.append({k: v for k, v in row.items() if k != "value"} | prov | {
            "source": source, "spread": spread, "left out": _unreliable(runs) or "none"})
    return rows


def _unreliable(runs: pd.DataFrame) -> str:
    """Drawn whatever the load (both engines measured alike), with flagged runs and load said."""
    flags = runs.get("env.timing_unreliable", pd.Series(dtype=bool))
    flagged = int(flags.fillna(False).astype(bool).sum())
    if not flagged:
        return ""
    load = pd.concat([runs.get(c, pd.Series(dtype=float))
                      for c in ("env.load1_start", "env.load1_end")]).dropna()
    counts = runs.get("env.cores", pd.Series(dtype=float)).dropna().unique()
    cores = "+".join(str(int(c)) for c in sorted(counts))
    seen = (f", load average {load.min():.1f} to {load.max():.1f} on {cores} cores"
            if len(load) and cores else "")
    return f"none; {flagged} of {len(runs)} runs flagged timing_unreliable (a busy machine{seen})"


def _joined(runs: pd.DataFrame, column: str) -> str:
    return "+".join(sorted({str(v) for v in runs.get(column, pd.Series(dtype=str)).dropna()}))


def _row_provenance(runs: pd.DataFrame) -> dict[str, str]:
    return {"scale": scale(runs), "dtype": _joined(runs, "dtype"),
            "threads": _joined(runs, "env.torch_threads"),
            "machine": _joined(runs, "env.device_name"), claims.DIFFERS: "",
            "commit": provenance.commits(runs.get("env.git_commit", pd.Series([None])))}


def scale(runs: pd.DataFrame) -> str:
    """The sweep's size: model, requests a run, loads, seeds."""
    qps = ", ".join(f"{q:g}" for q in sorted(runs.qps.unique()))
    seeds = ", ".join(str(s) for s in sorted(runs.seed.unique()))
    models = "+".join(sorted(runs.model.astype(str).unique()))
    requests = ("+".join(str(int(n)) for n in sorted(runs.num_requests.unique()))
                if "num_requests" in runs else "?")
    return f"{models}, {requests} requests a run at {qps} req/s, seeds {seeds}"


def figure(runs: pd.DataFrame):
    """Over load: TTFT p50/p99, P99 TBT, throughput; colour engine, style chunking, bands seeds."""
    from sarathi_lab.analysis import figures

    fig, axes = figures.subplots(1, 3, figsize=(18, 4.8))
    # One colour and line per engine and mode in every figure.
    style = {"x": "qps", "hue": "engine", "style": "batching", "errorbar": figures.SPREAD,
             "hue_order": list(ENGINES.values()), "style_order": list(BATCHING.values())}
    figures.sns.lineplot(runs, y="ttft_p50_s", ax=axes[0], legend=False, markers=True, **style)
    figures.sns.lineplot(runs, y="ttft_p99_s", ax=axes[0], legend=False, alpha=0.35, linewidth=1,
                         **style)
    figures.sns.lineplot(runs, y="itl_p99_s", ax=axes[1], legend=False, markers=True, **style)
    figures.sns.lineplot(runs, y="total_throughput_tok_s", ax=axes[2], markers=True, **style)
    axes[0].set(yscale="log", title="TTFT: p50 (marked), p99 (faint)", ylabel="TTFT (s)")
    axes[1].set(title="P99 TBT (itl_p99_s)", ylabel="P99 TBT (s)")
    axes[2].set(title="throughput (prompt + generated tokens)", ylabel="tokens / s")
    for ax in axes:
        ax.set_xlabel("load (requests / s, Poisson)")
    figures.plain_log_ticks(axes[0].yaxis)
    figures.legend_outside(axes[2], fontsize=9)
    vllm_tbt = p99_tbt(runs, "vllm")
    ratio = (vllm_tbt.vllm / vllm_tbt.sarathi_serve).dropna()
    each = ", ".join(f"{r:.2f}x at {q:g} req/s" for q, r in ratio.items())
    stall = (f"vLLM's own P99 TBT, chunked prefill off / on: {each}" if each
             else "vLLM's own P99 TBT: chunked prefill on or off not run")
    seeds = runs.seed.nunique()
    spread = f"; bands: min-max over {seeds} seeds" if seeds > 1 else "; one seed: no spread"
    prov = _row_provenance(runs)
    fig.suptitle("Our engine beside vLLM on the same weights, dtype, threads and arrivals, "
                 f"measured on CPU ({prov['machine']}, {prov['threads']} threads, "
                 f"{prov['dtype']})\n{scale(runs)}{spread}; sarathi_lab {prov['commit']}, vLLM "
                 f"{_joined(runs, 'env.vllm_version') or 'unknown'}\n{stall}", fontsize=11)
    if note := _unreliable(runs):
        fig.text(0.5, -0.02,
                 note.removeprefix("none; ") + ": drawn all the same; read the engines side by "
                 "side, not the absolute times", ha="center", va="top", fontsize=9, style="italic")
    return fig


def publish(root: str | Path, docs: str | Path = "docs", force: bool = False) -> list[Path]:
    """The figure and claims in ``docs/figures``; another source's replaced only with ``force``."""
    import matplotlib.pyplot as plt

    from sarathi_lab.analysis import figures

    runs = load_runs(root)
    if runs.empty or "executor" not in runs or not {"model", "vllm"} <= set(runs.executor) \
            or "workload.qps" not in runs:
        raise NoRuns(f"root {root} is invalid: it holds no finished runs of both engines "
                     "(executor=model and executor=vllm) at a workload.qps; run: python -m "
                     "sarathi_lab.run -m experiment=versus_vllm")
    runs, folder = named(runs), Path(docs) / "figures"
    row = _row_provenance(runs)
    prov = Provenance(" + ".join(sorted(runs.source.dropna().unique())), scale(runs),
                      row["machine"], commit=row["commit"], writer=WRITER)
    out = output_files.Outputs(folder, {f"{NAME}.png": prov, f"{NAME}_claims.csv": prov},
                               given=f"--docs={docs}", force=force,
                               how="--force replaces them; --docs DIR writes into another folder")
    out.check()
    fig = figure(runs)
    out.add(f"{NAME}.png", figures.png(fig))
    plt.close(fig)
    table = pd.DataFrame(claims_rows(runs)).reindex(columns=claims.COLUMNS)
    out.add(f"{NAME}_claims.csv", table.to_csv(index=False))
    return out.write()


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog=WRITER, description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="a sweep of experiment=versus_vllm (or "
                                     "any root with runs of both engines)")
    parser.add_argument("--docs", default="docs", type=Path,
                        help="the docs folder (figures/ under it)")
    cli_args.shared(parser, force="replace files of another source, scale or commit")
    args = parser.parse_args(argv)
    if not Path(args.root).is_dir():
        parser.error(f"root {args.root!r} is invalid: no such directory")
    try:
        print("\n".join(map(str, publish(args.root, args.docs, args.force))))
    except (NoRuns, output_files.OutputRefused) as e:
        parser.error(str(e))
