"""analysis/registry.py: every paper result is one module, and what iterates the results (produce,
the claims table, the figures, the GPU suite's plan and dry run) picks up one registered in a test."""
from __future__ import annotations

import json
import shutil

import matplotlib.pyplot as plt
import pytest

from sarathi_lab.analysis import claims, registry
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult
from sarathi_lab.analysis.runs import Results
from sarathi_lab.harness import CONF_DIR, scales
from sarathi_lab.measure.gpu.plan import STEPS, build_steps
from sarathi_lab.measure.gpu.steps.paper import sweep_argv
from sarathi_lab.produce import sweep_args


def _toy_claims(results) -> list[dict]:
    mean = results.summary("toy").total_throughput_tok_s.mean()
    return [{"experiment": "toy", "claim": "Toy throughput is at least 1 token/s", "paper": ">= 1",
             "ours": f"{mean:.1f} tokens/s", "holds": "yes" if mean >= 1 else "no", "value": mean}]


def _toy_figure(results, simulated=None):
    fig, ax = plt.subplots()
    ax.bar(["toy"], [results.summary("toy").total_throughput_tok_s.mean()])
    return fig


TOY = PaperResult(name="toy", claims=_toy_claims, figure=_toy_figure, order=5,
                  gpu=GpuRun(minutes=0.5, order=1))
# The toy's overlays, as a result's own would be written: its GPU sweep, two parts, its dry run.
TOY_OVERLAYS = {"gpu/toy": ("/scale/gpu", "seq_len: 1024"), "gpu/toy/a": ("", "seed: 0"), "gpu/toy/b": ("", "seed: 1"),
                "dry/toy": ("/scale/dry", "seq_len: 16")}


@pytest.fixture
def toy(monkeypatch, tmp_path):
    conf = tmp_path / "conf"
    for group in ("scale", "experiment"):   # beside the registered results' own
        shutil.copytree(CONF_DIR / group, conf / group)
    for path, (scale, param) in TOY_OVERLAYS.items():
        parent = "/experiment/" + ("toy" if path.count("/") == 1 else path.rsplit("/", 1)[0])
        defaults = "".join(f"  - {d}\n" for d in (parent, scale) if d)
        (conf / "experiment" / f"{path}.yaml").parent.mkdir(parents=True, exist_ok=True)
        (conf / "experiment" / f"{path}.yaml").write_text(
            f"# @package _global_\ndefaults:\n{defaults}  - _self_\nhydra:\n  sweeper:\n    params:\n      {param}\n")
    monkeypatch.setattr(scales, "CONF_DIR", conf)
    monkeypatch.setattr(registry, "RESULTS", (TOY, *registry.RESULTS))
    return TOY


def _gpu_shared() -> tuple[str, ...]:
    """What every GPU sweep passes first: scale/gpu.yaml's keys."""
    return scales.overrides("toy", "gpu")[:-1]


PAPER = ("per_token_cost", "tile_quantization", "decode_speedup", "pd_ratio", "chunk_overhead", "orca_compare",
         "scheduler_latency")


def test_the_seven_results_are_found_in_their_modules_in_order():
    # In order among whatever else is registered: a new result is its own module, not an edit here.
    assert tuple(n for n in registry.names() if n in PAPER) == PAPER
    assert all(r.reading and r.gpu for r in registry.RESULTS if r.name in PAPER)
    # The GPU suite runs each registered result's experiment, as the CPU does, with its overrides.
    paper_steps = list(dict.fromkeys(s.arg for s in STEPS if s.group == "paper"))  # a result split in parts once
    assert set(paper_steps) == {r.name for r in registry.RESULTS if r.gpu}
    assert [a for a in paper_steps if a in PAPER] == ["per_token_cost", "decode_speedup", "pd_ratio",
                                                      "tile_quantization", "chunk_overhead", "orca_compare",
                                                      "scheduler_latency"]


def test_a_result_split_in_parts_is_one_step_a_part_named_together(toy, monkeypatch):
    from dataclasses import replace

    from sarathi_lab.analysis.paper_result import GpuPart
    from sarathi_lab.measure.gpu import plan

    parts = (GpuPart("a", 1.0), GpuPart("b", 2.0))
    monkeypatch.setattr(registry, "RESULTS", (replace(toy, gpu=replace(toy.gpu, parts=parts)),))
    monkeypatch.setattr(plan, "STEPS", plan.build_steps())
    monkeypatch.setattr(plan, "BY_NAME", {s.name: s for s in plan.STEPS})
    steps = [s for s in plan.STEPS if s.group == "paper"]
    assert [(s.name, s.arg, s.minutes, s.overrides) for s in steps] == [
        ("paper.toy.a", "toy", 1.0, (*_gpu_shared(), "seq_len=1024", "seed=0")),
        ("paper.toy.b", "toy", 2.0, (*_gpu_shared(), "seq_len=1024", "seed=1"))]
    assert [s.name for s in plan.select("paper.toy")] == ["paper.toy.a", "paper.toy.b"]
    assert [s.name for s in plan.select("paper.toy.b")] == ["paper.toy.b"]


def test_a_registered_result_is_produced_run_on_the_gpu_and_dry_run(toy, tmp_path):
    # No quick set of its own (experiment/ci/toy.yaml): its experiment at the ci scale.
    args = sweep_args("toy", tmp_path, "ci")
    assert args[1] == "experiment=toy" and args[-1] == "scale=ci"
    # No simulated config of its own: the simulated set runs its experiment on the simulator.
    assert "executor=sim" in sweep_args("toy", tmp_path, "full", sim=True)
    (step, *_) = [s for s in build_steps() if s.group == "paper"]
    assert (step.name, step.overrides) == ("paper.toy", (*_gpu_shared(), "seq_len=1024"))
    assert sweep_argv(step, tmp_path, dry_run=True)[-1] == "seq_len=16"
    assert sweep_argv(step, tmp_path)[-1] == "seq_len=1024"


def _toy_runs(root, throughputs, unreliable=()) -> Results:
    for job, throughput in enumerate(throughputs):
        run = root / "toy/multiruns/2026-01-01" / str(job)
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({
            "config": {"scheduler": "static", "model": "tiny", "seed": job, "scale": "ci"}, "overrides": [],
            "resolved_config": {"engine": {"executor": "model"}}, "summary": {"total_throughput_tok_s": throughput},
            "environment": {"device": "cpu", "device_name": "Test CPU", "dtype": "float32", "torch_threads": 1,
                            "timing_unreliable": job in unreliable}}))
    return Results(root)


def test_a_registered_result_has_claims_rows_and_a_figure(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "RESULTS", (TOY,))  # the only result, so the only runs the table needs
    results = _toy_runs(tmp_path, [2.0, 0.5, 3.0], unreliable={1})
    assert results.missing() == []
    (row,) = claims.claims_table(results).to_dict("records")
    assert row["ours"] == "2.5 tokens/s" and row["spread"] == "2 to 3 over 2 seeds (min-max)"
    assert row["left out"] == "1 of 3 runs left out: timing unreliable"
    fig = registry.draw(TOY, results)
    assert fig.axes[0].patches[0].get_height() == pytest.approx(2.5)


def test_a_result_whose_every_run_is_unreliable_has_no_figure(toy, tmp_path):
    results = _toy_runs(tmp_path, [2.0], unreliable={0})
    assert registry.draw(toy, results) is None and results.unreliable_note("toy") == (
        "1 of 1 runs left out: timing unreliable")


def test_a_figure_none_of_whose_runs_is_kept_has_a_line_in_its_place(toy, tmp_path):
    # A busy machine flags every run: the notebook drew nothing, and a later cell indexed the empty frame.
    results = _toy_runs(tmp_path, [2.0, 0.5, 3.0], unreliable={0, 1, 2})
    assert results.summary("toy").empty and registry.draw(toy, results) is None
    assert results.nothing_kept_note("toy") == ("no reliable run of toy: 3 runs left out as timing_unreliable; set "
                                                "SARATHI_INCLUDE_UNRELIABLE=1 to draw them anyway")
    # The runs' settings (what the notebook's balance table measures with) are known all the same.
    assert (results.provenance("toy")["threads"], results.provenance("toy")["dtype"]) == ("1", "float32")
    # The opt-in the line names draws them.
    fig = registry.draw(toy, results.with_unreliable())
    assert fig.axes[0].patches[0].get_height() == pytest.approx(5.5 / 3)
