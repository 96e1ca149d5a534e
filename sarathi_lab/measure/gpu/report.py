"""The suite's figures and claims from the finished steps; what runs cannot give yet is a note."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd

from sarathi_lab.analysis.gpu_records import is_number
from sarathi_lab.harness.results import current_names
from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.steps.env import ceilings
from sarathi_lab.measure.profiling.overhead import TARGET


def _save(fig, out: Path, name: str) -> None:
    path = out / "figures" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    # as analysis.figures.save, without its seaborn theme
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def kernels_figure(out: Path) -> bool:
    result, env = state.read_result(out, "kernels"), ceilings(out)
    metrics = result.metrics if result else []
    # Read back through gpu_records: a rate that is not a number is no bar.
    rates = {m.metric.split("[")[1].rstrip("]").replace("_", " "): m.value for m in metrics
             if m.metric.startswith("decode_kv_gbps[") and is_number(m.value)}
    case = next((m.value for m in metrics if m.metric == "decode_timed_case"),
                "Triton paged attention")
    copy = (env or {}).get("copy_gbps")
    if not rates or not is_number(copy):
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.barh(list(rates), list(rates.values()), color="tab:blue", label="paged attention, decode")
    ax.axvline(copy, color="black", ls="--", label=f"copy ceiling {copy:.0f} GB/s")
    ax.axvline(copy / 1.5, color="grey", ls=":", label="target: 1.5x of the floor")
    ax.set(xlabel="KV bytes read / s (GB/s)",
           title="Decode attention bandwidth, measured GPU: "
                 f"{env.get('device', 'unknown device')}\n{case}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)
    _save(fig, out, "kernels")
    return True


def attention_figure(out: Path) -> bool:
    """Each shape's engine, peers and floor (ms, log scale), a panel per kind of shape."""
    from sarathi_lab.measure.gpu.steps.attention import ROWS
    from sarathi_lab.measure.profiling.attention_grid import CONTENDERS, KINDS

    path = state.step_dir(out, "attention") / ROWS
    if not path.is_file():
        return False
    table = pd.read_csv(path)
    kinds = [k for k in KINDS if (table.kind == k).any()]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4 + 0.28 * len(table), 4.5), sharey=True,
                             squeeze=False,
                             gridspec_kw={"width_ratios": [max(2, (table.kind == k).sum())
                                                           for k in kinds]})
    styles = {"engine": ("o", "tab:blue"), "sdpa_flash": ("s", "tab:orange"),
              "sdpa_cudnn": ("D", "tab:red"), "flex": ("^", "tab:green")}
    for ax, kind in zip(axes[0], kinds):
        rows = table[table.kind == kind].reset_index(drop=True)
        for name in CONTENDERS:
            if f"{name}_ms" in rows:
                marker, color = styles[name]
                ax.scatter(rows.index, rows[f"{name}_ms"], marker=marker, color=color, s=22,
                           label=name, zorder=3)
        ax.scatter(rows.index, rows.floor_ms, marker="_", color="black", s=160, label="floor",
                   zorder=2)
        ax.set_xticks(rows.index, rows["shape"], rotation=90, fontsize=7)
        ax.set(yscale="log", title=kind)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("one layer's attention (ms)")
    device = (ceilings(out) or {}).get("device", table.device.iloc[0])
    fig.suptitle("One layer's attention: the engine vs its peers on the same q/k/v, and the "
                 f"floor\nmeasured: {device}, {table.dtype.iloc[0]} (sdpa_flash: "
                 f"{table.sdpa_backend.iloc[0]})", y=1.1)
    handles = {h.get_label(): h for ax in axes[0] for h in ax.collections}
    fig.legend(list(handles.values()), list(handles), fontsize=8, loc="lower center",
               bbox_to_anchor=(0.5, 0.93), ncol=len(handles))
    _save(fig, out, "attention")
    return True


def kernel_breakdown_figure(out: Path) -> bool:
    """Per iteration kind: kernels' ms stacked by group, the forward's idle GPU time, the host's."""
    from sarathi_lab.measure.gpu.steps.launch import KERNELS
    from sarathi_lab.measure.profiling.kernel_breakdown import GROUPS

    path = state.step_dir(out, "launch") / KERNELS
    table = pd.read_csv(path) if path.is_file() else pd.DataFrame()
    if table.empty:
        return False
    order = list(dict.fromkeys(table.iteration))
    wide = table.pivot_table(index="iteration", columns="group", values="total_ms",
                             aggfunc="sum").reindex(order)
    wide = wide[[g for g in GROUPS if g in wide]].fillna(0.0)
    whole = table.groupby("iteration")[["iteration_gpu_ms",
                                        "iteration_wall_ms"]].first().reindex(order)
    sampling = wide.get("sampling", 0.0)
    kernels_ms = wide.sum(axis=1) - sampling
    wide["idle (in the forward)"] = (whole.iteration_gpu_ms - kernels_ms).clip(lower=0)
    wide["host"] = (whole.iteration_wall_ms - whole.iteration_gpu_ms - sampling).clip(lower=0)
    fig, ax = plt.subplots(figsize=(3 + 0.6 * len(order), 5))
    colors = plt.get_cmap("tab20").colors
    bottom = pd.Series(0.0, index=wide.index)
    for group in wide.columns:  # same colour in every lease
        color = (colors[GROUPS.index(group) % 20] if group in GROUPS
                 else "dimgrey" if group == "host" else "gainsboro")
        ax.bar(range(len(order)), wide[group], bottom=bottom, color=color, label=group, width=0.7)
        bottom += wide[group]
    ax.set_xticks(range(len(order)), order, rotation=60, ha="right", fontsize=8)
    ax.set(ylabel="ms per iteration")
    ax.grid(axis="y", alpha=0.3)
    measured = ", ".join(x for x in ((ceilings(out) or {}).get("device"), table.source.iloc[0])
                         if x)
    ax.set_title(f"Where each iteration's time goes, as the engine runs it\n({measured})",
                 fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, out, "kernel_breakdown")
    return True


def overhead_figure(out: Path) -> bool:
    path = state.step_dir(out, "overhead") / "iterations.csv"
    if not path.is_file():
        return False
    # a suite's older files under today's names
    table = pd.read_csv(path).rename(columns=current_names)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for kind, rows in table.groupby("kind"):
        ax.scatter(rows.iteration, 100 * rows.overhead_fraction, s=8, label=kind)
    ax.axhline(100 * TARGET, color="black", ls="--", label=f"target {TARGET:.0%}")
    result = state.read_result(out, "overhead")
    shape = result.notes[0] if result and result.notes else ""
    device = (ceilings(out) or {}).get("device", "unknown device")
    ax.set(xlabel="iteration", ylabel="time outside the forward pass (%)",
           title=f"Engine overhead per iteration, measured GPU: {device}\n{shape}")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, out, "overhead")
    return True


def paper_report(out: Path, dry_run: bool = False) -> list[str]:
    """Each experiment's figure and claims from <out>/paper; a dry run keeps runs that waited."""
    from sarathi_lab.analysis import claims, registry
    from sarathi_lab.analysis.runs import Results

    root = out / "paper"
    if not root.is_dir():
        return []
    results, notes, rows = Results(root, include_unreliable=dry_run), [], []
    for result in registry.RESULTS:
        name = result.name
        if not (root / name).is_dir():
            continue
        try:
            rows += claims.rows_of(result.claims, results, name)
            fig = registry.draw(result, results)
            if fig is None:
                notes.append(f"{name}: no figure: {results.unreliable_note(name)}")
                continue
            _save(fig, out, name)
        except Exception as e:  # noqa: BLE001 (a figure or claim the runs at hand cannot give)
            plt.close("all")
            notes.append(f"{name}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}"[:200])
    if rows:
        table = pd.DataFrame(rows, columns=claims.COLUMNS)
        table.to_csv(out / "claims.csv", index=False)
        (out / "claims.md").write_text(claims_markdown(table, out))
    return notes


def _cell(value) -> str:
    return "" if pd.isna(value) else str(value).replace("|", "\\|").replace("\n", " ")


def claims_markdown(table: pd.DataFrame, out: Path) -> str:
    """claims.csv as a markdown table (the columns any row fills), then the folder's figures."""
    device = (ceilings(out) or {}).get("device", "the device the env step has not named yet")
    columns = [c for c in table.columns if table[c].map(_cell).ne("").any()]
    lines = [f"# The paper's claims, measured on {device}", "",
             ("From the runs under `paper/` (`python -m "
              "sarathi_lab.measure gpu`); the same rows as `claims.csv`."), "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |"
              for _, row in table.iterrows()]
    figures = sorted((out / "figures").glob("*.png"))
    lines += ["", "## Figures", ""] + [f"![{p.stem}](figures/{p.name})" for p in figures]
    return "\n".join(lines) + "\n"


def write_report(out: Path, dry_run: bool = False) -> list[str]:
    notes = [f"{name}: nothing to draw yet" for name, drawn in
             (("kernels", kernels_figure(out)), ("attention", attention_figure(out)),
              ("overhead", overhead_figure(out)),
              ("kernel_breakdown", kernel_breakdown_figure(out))) if not drawn]
    return notes + paper_report(out, dry_run)
