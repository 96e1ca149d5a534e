"""The W&B report of docs/wandb_report.yaml: the papers' comparisons as saved views over this
project's uploaded runs (``python -m sarathi_lab.measure wandb_report --entity E --save``; needs
``pip install wandb-workspaces``, an account and the runs synced)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SPEC = Path(__file__).resolve().parents[2] / "docs" / "wandb_report.yaml"


def load_spec(path: Path = SPEC) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def names(spec: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(config keys, summary metrics) the spec reads, without their config./summary. prefix."""
    found: dict[str, set[str]] = {"config": set(), "summary": set()}
    for section in spec["sections"]:
        used = list(section.get("groupby", []))
        for panel in section["panels"]:
            used += [panel[k] for k in ("x", "y") if k in panel] + panel.get("metrics", [])
        for name in used:
            kind, _, key = name.partition(".")
            found[kind].add(key)
    return found["config"], found["summary"]


def _metric(wr, name: str):
    kind, _, key = name.partition(".")
    return wr.Config(key) if kind == "config" else wr.SummaryMetric(key)


def _panel(wr, panel: dict[str, Any]):
    if panel["kind"] == "scatter":
        return wr.ScatterPlot(title=panel["title"], x=_metric(wr, panel["x"]),
                              y=_metric(wr, panel["y"]), log_x=panel.get("log_x"))
    if panel["kind"] == "bar":
        return wr.BarPlot(title=panel["title"], metrics=[_metric(wr, m) for m in panel["metrics"]])
    if panel["kind"] == "media":
        return wr.MediaBrowser(title=panel["title"], media_keys=list(panel["keys"]))
    raise ValueError(f"panel kind {panel['kind']!r} is invalid: allowed: scatter, bar, media")


def build(spec: dict[str, Any], entity: str, project: str):
    import wandb_workspaces.reports.v2 as wr

    blocks = []
    for section in spec["sections"]:
        runset = wr.Runset(entity=entity, project=project, name=section["title"],
                           filters=section.get("filters", ""),
                           groupby=list(section.get("groupby", [])))
        blocks += [wr.H1(section["title"]), wr.P(section.get("text", "")),
                   wr.PanelGrid(runsets=[runset],
                                panels=[_panel(wr, p) for p in section["panels"]])]
    return wr.Report(entity=entity, project=project, title=spec["title"],
                     description=spec.get("description", ""), blocks=blocks)


def main(argv: list[str] | None = None) -> None:
    from sarathi_lab import cli_args

    parser = cli_args.Parser(prog="python -m sarathi_lab.measure wandb_report", description=__doc__)
    parser.add_argument("--entity", required=True)
    parser.add_argument("--project", default="sarathi_lab")
    parser.add_argument("--spec", type=Path, default=SPEC)
    parser.add_argument("--save", action="store_true", help="save it to W&B (else only built)")
    args = parser.parse_args(argv)
    try:
        report = build(load_spec(args.spec), args.entity, args.project)
    except ImportError:
        cli_args.refuse("the W&B report needs wandb-workspaces: pip install wandb-workspaces")
    if args.save:
        report.save()
        print(report.url)
    else:
        print(f"built {report.title!r}: {len(report.blocks)} blocks; --save saves it to W&B")
