"""The simulator's GPU cost models held against GPU kernels measured on real A100s and H100s
(vidur), and against this engine's own operator tables measured on a GPU (``task=profile``, every
``profiles/<gpu>/<model>.csv``) (docs/sim/README.md, section 5). Nothing runs on a GPU: it reruns
anywhere."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.analysis import gpu_records
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.bench.args import bench_parser
from sarathi_lab.measure.sim_check import engine_fidelity, fidelity, point_table
from sarathi_lab.measure.sim_check.fidelity import VIDUR
from sarathi_lab.model import load_config
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.device import GPU_DEVICES
from sarathi_lab.sim.profiles import profile_path, profiles_dir

DOCS = REPO_ROOT / "docs" / "sim"
GPU_DOCS = REPO_ROOT / "docs" / "gpu"
SMOKE_OPS = (1, 128, 136, 1024)
OUTPUTS = (*(f"fidelity_{name}.csv" for name in (
    "ops", "iterations", "errors", "attention_holdout", "all_reduce", "tp_errors",
    "engine_profile_ops", "engine_profile_iterations", "engine_profile_errors", "graph_replay")),
           "fidelity.png", "fidelity_engine_profile.png")


def launch_results() -> dict[tuple[str, str], dict[str, object]]:
    """(device, lease) -> each launch-step metric's value, every kept lease's read and checked by
    the suite's reader (a RecordError naming the file and the field)."""
    found = {}
    for path in sorted(GPU_DOCS.glob("*/*/steps/launch/result.json")):
        result = gpu_records.read(path, gpu_records.step_result)
        found[path.parents[3].name, path.parents[2].name] = {
            name: m.value for name, m in gpu_records.checked_values(result, str(path)).items()}
    return found


def leases_read(launches: dict[tuple[str, str], dict]) -> str:
    """'+'-joined."""
    paths = [profile_path(device, model) for device, model in engine_fidelity.profiled()]
    # A lease's table is profiles/<device>/<lease>/<model>.csv; one measured here,
    # profiles/<device>/<model>.csv.
    leases = {path.parent.name for path in paths if path.parents[1] != profiles_dir()}
    leases |= {lease for _, lease in launches}
    return "+".join(sorted(leases))


def png(fig) -> bytes:
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=90)
    return data.getvalue()


def draw(iterations: pd.DataFrame, errors: pd.DataFrame, path: Path | None = None):
    """Left: predicted / measured per iteration and cost model; right: hold-out error per model."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend

    devices = sorted(iterations.device.unique())
    fig = Figure(figsize=(13, 3.6 * len(devices)))
    axes = fig.subplots(len(devices), 2, squeeze=False)
    markers = {"roofline": "x", "calibrated": "o", "holdout": "s"}
    for row, device in zip(axes, devices):
        its = iterations[iterations.device == device].reset_index(drop=True)
        head = f"simulated {device.upper()} over {VIDUR} {device.upper()}"
        for name, marker in markers.items():
            row[0].scatter(range(len(its)), its[f"{name}_s"] / its.measured_s, marker=marker, s=14,
                           label=name)
        row[0].axhline(1.0, color="k", lw=0.8)
        for band in (0.9, 1.1):
            row[0].axhline(band, color="grey", lw=0.5, ls=":")
        row[0].set(ylabel="predicted / measured", xticks=[],
                   xlabel="iterations of every model (decode, prefill, hybrid), in the table's "
                          "order")
        row[0].set_title(f"{head}: every iteration of every model", fontsize=9)
        row[0].legend(fontsize=7)
        err = errors[errors.device == device]
        labels = [f"{m}\n{k}" for m, k in zip(err.model, err.kind)]
        x = range(len(err))
        row[1].bar([i - 0.2 for i in x], err.roofline_median_err, width=0.4,
                   label="roofline median")
        row[1].bar([i + 0.2 for i in x], err.holdout_median_err, width=0.4,
                   label="calibrated, held out: median")
        row[1].scatter(list(x), err.holdout_worst_err, marker="_", color="k", s=60,
                       label="held out: worst")
        row[1].axhline(0.10, color="grey", lw=0.6, ls="--")
        row[1].axhline(0.25, color="grey", lw=0.6, ls=":")
        row[1].set_xticks(list(x), labels, rotation=90, fontsize=6)
        row[1].set(ylabel="|predicted / measured - 1|", xlabel="model and iteration kind")
        row[1].set_title(f"{head}: error per model and kind", fontsize=9)
        row[1].legend(fontsize=7)
    fig.suptitle(f"Simulated (cost models roofline, calibrated, holdout) against {VIDUR} GPU "
                 f"kernels (their data, MIT licence)", fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=90)
    return fig


def _parser():
    parser = bench_parser("sim_fidelity", __doc__)
    cli_args.shared(parser, smoke="one device, two models, a few token counts",
                    out="directory of the CSVs and the figure", out_default=DOCS,
                    force="replace tables of another scale or of other GPU leases' profiles in OUT")
    parser.add_argument("--devices", nargs="+", choices=gpu_kernels.measured_devices())
    parser.add_argument("--models", nargs="+", choices=gpu_kernels.model_shapes().index.tolist())
    return parser


def show(title: str, table: pd.DataFrame, columns=None, digits: int = 3) -> None:
    """A table on the terminal, its seconds in ms."""
    ms = table.assign(**{c.replace("_s", "_ms"): table[c] * 1e3 for c in table
                         if c.endswith("_s")})
    print(f"{title}:")
    print((ms if columns is None else ms[columns]).round(digits).to_string(index=False))


def main(argv: list[str] | None = None) -> dict[str, pd.DataFrame]:
    parser = _parser()
    args = parser.parse_args(argv)
    scale = "ci" if args.smoke else "full" if not (args.devices or args.models) else (
        f"devices {args.devices or 'all'}, models {args.models or 'all'}")
    try:
        launches = launch_results()
        prov = provenance.Provenance("computed: cost models against measured kernels and engine "
                                     "profiles", scale, lease=leases_read(launches),
                                     writer="python -m sarathi_lab.measure sim_fidelity")
        out = output_files.Outputs(args.out, dict.fromkeys(OUTPUTS, prov),
                                   given=f"--out={args.out}", force=args.force,
                                   how="--force replaces them; --out DIR writes elsewhere")
        out.check()
    except ValueError as e:
        parser.error(str(e))
    devices, models, op_tokens = args.devices, args.models, fidelity.OP_TOKENS
    if args.smoke:
        devices, models = devices or ["a100"], models or ["llama2-7b", "phi-2"]
        op_tokens = SMOKE_OPS
    ops, iterations = fidelity.run(devices, models, op_tokens)
    errors = fidelity.errors(iterations)
    attention = fidelity.attention_holdout() if "a100" in set(ops.device) else pd.DataFrame()
    pd.set_option("display.width", 160)
    times = ["measured_ms", "roofline_ms", "calibrated_ms", "holdout_ms"]
    show("Per operator, one layer (ms)", ops, ["device", "model", "op", "tokens", *times], 4)
    show("\nPer iteration (ms; attention included where measured)", iterations,
         ["device", "model", "iteration", "attention", *times])
    show("\nError per iteration kind (|predicted / measured - 1|)", errors)
    if len(attention):
        show("\nPrefill attention, fitted without each chunk size and predicting it", attention)
    shards = [fidelity.run(devices, models, op_tokens, tp=tp)[1]
              for tp in ((2,) if args.smoke else (2, 4))]
    shard_errors = pd.concat([fidelity.errors(its) for its in shards if len(its)]
                             or [pd.DataFrame()], ignore_index=True)
    show("\nOne GPU's shard under tensor parallelism (vidur's kernels at tp 2 and 4, which no fit "
         "saw; no attention)", shard_errors)
    reduce_errors = fidelity.all_reduce_errors(
        fidelity.all_reduce(devices, tps=(2,) if args.smoke else None))
    show("\nTensor-parallel all-reduce, every measured size (calibrated = the measured table as "
         "the cost models read it; holdout = without the size it predicts)", reduce_errors)
    tables = {"ops": ops, "iterations": iterations, "errors": errors,
              "attention_holdout": attention, "all_reduce": reduce_errors,
              "tp_errors": shard_errors}
    out.add("fidelity.png", png(draw(iterations, errors)))
    engine, engine_figure = engine_profiles(show)
    if engine_figure is not None:
        out.add("fidelity_engine_profile.png", png(engine_figure))
    tables |= engine | graph_replays(show, launches)
    for name, text in csv_texts(tables).items():
        out.add(name, text)
    try:
        written = out.write()
    except output_files.OutputRefused as e:
        parser.error(str(e))
    print(f"\nwrote {len(written)} files into {args.out}: "
          + ", ".join(sorted(p.name for p in written)))
    return tables


def engine_profiles(show) -> tuple[dict[str, pd.DataFrame], object | None]:
    """The tables and their figure; none without a committed engine profile."""
    ops, iterations = engine_fidelity.run()
    if not len(iterations):
        print(f"\nno engine profile of a simulated GPU under {profiles_dir()}: its comparison is "
              f"skipped")
        return {}, None
    errors = engine_fidelity.errors(ops, iterations)
    show("\nThis engine's forward measured on the GPU (task=profile; whole model), per iteration "
         "kind and per operator: |predicted / measured - 1| and predicted / measured", errors)
    tables = {"engine_profile_ops": ops, "engine_profile_iterations": iterations,
              "engine_profile_errors": errors}
    return tables, draw_engine(ops, iterations, errors)


def graph_replays(show, launches: dict[tuple[str, str], dict]) -> dict[str, pd.DataFrame]:
    """Launch-step forwards (launch_results), eager and as the engine runs them (a graph's replay:
    GPU work alone), against each model."""
    from sarathi_lab.analysis.launch_grid import MORE_CONTEXTS, SHAPES, engine_ms, label

    model, dtype, context, _, cases = SHAPES["cuda"]
    # Each chunk follows its prompt's cached part, so that chunk + cache fills the context.
    shapes = [(chunk, decodes, ctx, label(chunk, decodes, None if ctx == context else ctx))
              for ctx in (context, *MORE_CONTEXTS["cuda"]) for chunk, decodes in cases]
    rows = []
    for (device, lease), measured in launches.items():
        if device not in GPU_DEVICES:
            continue
        cms = engine_fidelity.cost_models(device, load_config(model), dtype)
        if profile_path(device, model).is_file():
            cms["profile"] = CostModel.for_device(device, model, "profile", dtype)
        for chunk, decodes, ctx, key in shapes:
            if (graph := engine_ms(measured, key)) is None:
                continue
            row = {"device": device, "lease": lease, "model": model, "chunk": chunk,
                   "batch": decodes, "context": ctx, "eager_ms": measured.get(f"eager_ms[{key}]"),
                   "graph_ms": graph, "floor_ms": measured.get(f"floor_ms[{key}]")}
            prefills, contexts = [(chunk, ctx)] if chunk else [], [ctx] * decodes
            row |= {f"{n}_ms": cm.iteration_cost(prefills, contexts).forward_s * 1e3
                    for n, cm in cms.items()}
            # The profile model predicts the eager forward it measured; others tight kernels.
            rows.append(row | {f"{n}_over_eager" if n == "profile" else f"{n}_over_graph":
                               point_table.ratio(row[f"{n}_ms"], row["eager_ms" if n == "profile"
                                                                     else "graph_ms"])
                               for n in cms})
    if not rows:
        return {}
    table = pd.DataFrame(rows)
    show("\nThe launch step's forwards, eager and as the engine runs them (ms), against each "
         "cost model's forward", table)
    return {"graph_replay": table}


def csv_texts(tables: dict[str, pd.DataFrame]) -> dict[str, str]:
    """Each table's file name and text; a run without vidur's attention kernels writes no hold-out
    file rather than an empty one."""
    def digits(name: str) -> str:
        return "%.4g" if name.endswith(("ops", "iterations")) else "%.3f"

    return {f"fidelity_{name}.csv": table.to_csv(index=False, float_format=digits(name))
            for name, table in tables.items() if len(table) or name != "attention_holdout"}


# The same marker and colour per cost model in every row.
ENGINE_STYLES = {"roofline": ("x", "C0"), "calibrated": ("o", "C1"), "profile": ("+", "C2")}
BORROWED_STYLE = ("^", "C4")


def _engine_label(name: str, device: str) -> str:
    if name == "profile":
        return "profile cost model (this table, composed)"
    other = name.removesuffix("_calibration")
    return f"{other.upper()}'s calibration on {device.upper()} peaks" if other != name else name


def draw_engine(ops: pd.DataFrame, iterations: pd.DataFrame, errors: pd.DataFrame,
                path: Path | None = None):
    """Per (device, model): prefill and decode forwards measured and predicted; each op's ratio."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend

    pairs = list(iterations.groupby(["device", "model"], sort=True).groups)
    fig = Figure(figsize=(15, 4.2 * len(pairs)))
    axes = fig.subplots(len(pairs), 3, squeeze=False)
    for row, (device, model) in zip(axes, pairs):
        its = iterations[(iterations.device == device) & (iterations.model == model)]
        names = engine_fidelity.models_in(its)
        pre, dec = its[its.kind == "prefill"], its[its.kind == "decode"]
        kv = dec.batch * dec.context
        row[0].plot(pre.tokens, pre.measured_s * 1e3, "k.-", label="measured (engine profile)")
        row[1].scatter(kv, dec.measured_s * 1e3, color="k", s=14, label="measured (engine profile)")
        for name in names:
            (marker, color) = ENGINE_STYLES.get(name, BORROWED_STYLE)
            label = _engine_label(name, device)
            row[0].plot(pre.tokens, pre[f"{name}_s"] * 1e3, marker=marker, color=color, ms=4,
                        lw=0.8, label=label)
            row[1].scatter(kv, dec[f"{name}_s"] * 1e3, marker=marker, color=color, s=14,
                           label=label)
        row[0].set(xlabel="prompt tokens (one prompt, prefilled whole)", ylabel="forward pass (ms)")
        row[0].set_title(f"{device} {model}: prefill-only iterations", fontsize=9)
        row[1].set(xlabel="KV tokens read (decodes x context)", ylabel="forward pass (ms)")
        row[1].set_title(f"{device} {model}: decode-only iterations, batch 1-{dec.batch.max()}",
                         fontsize=9)
        err = errors[(errors.device == device) & (errors.model == model) & (errors.level == "op")]
        names = engine_fidelity.models_in(ops[(ops.device == device) & (ops.model == model)])
        width = 0.8 / max(len(names), 1)
        for i, name in enumerate(names):
            row[2].bar([j + (i - (len(names) - 1) / 2) * width for j in range(len(err))],
                       err[f"{name}_median_ratio"], width=width, label=_engine_label(name, device),
                       color=ENGINE_STYLES.get(name, BORROWED_STYLE)[1])
        row[2].axhline(1.0, color="k", lw=0.8)
        row[2].set_yscale("log")
        row[2].set_ylim(top=4 * max([1.0, *(err[f"{n}_median_ratio"].max() for n in names)]))
        row[2].set_xticks(range(len(err)), [k.replace("_", "\n") for k in err.kind], fontsize=7)
        row[2].set(ylabel="predicted / measured (median over the op's rows)", xlabel="operator")
        row[2].set_title(f"{device} {model}: each operator (whole model, every layer)", fontsize=9)
        for ax, rows in zip(row[:2], (pre, dec)):
            ax.set_ylim(0, 1.5 * rows.measured_s.max() * 1e3)
            ax.legend(fontsize=7, loc="upper right")
        row[2].legend(fontsize=7, loc="upper right")
    gpus = ", ".join(d.upper() for d in sorted(set(iterations.device)))
    fig.suptitle(f"Measured GPU: this engine on {gpus} (task=profile; no CUDA graphs, so its "
                 f"launches count), against the cost models that exist there", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))
    if path is not None:
        fig.savefig(path, dpi=90)
    return fig
