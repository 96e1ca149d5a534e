"""task=profile at CI size: the table the profile cost model reads, measured on the tiny engine."""
from __future__ import annotations

import importlib
import json
import warnings
from types import SimpleNamespace

import pandas as pd
import pytest

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError
from sarathi_lab.harness.schema import MeasureCfg
from sarathi_lab.sim import CostModel
from sarathi_lab.sim.profile_model import measured_iterations

pytestmark = pytest.mark.e2e

CFG = SimpleNamespace(chunk=32, batch_size=4, seq_len=64, seed=0, model=SimpleNamespace(engine_model="tiny"),
                      measure=MeasureCfg(reps=1, token_step=8, tile=16))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SARATHI_PROFILES_DIR", str(root))
        task = importlib.import_module("sarathi_lab.measure.tasks.profile")
        # The model's positions end at seq_len, as the preset's do where a profile measures its whole
        # context: a chunk placed past them raised on a GPU (an index out of bounds in the rotary table).
        llm = LLM("tiny", max_batch_size=CFG.batch_size, chunk_size=CFG.chunk, device="cpu", warmup_iters=1,
                  num_threads=1, max_model_len=CFG.seq_len)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary, tables = task.run(CFG, llm)
    return root, summary, tables["profile"]


def test_profile_writes_the_table_and_the_machine_description(profiled):
    root, summary, table = profiled
    on_disk = pd.read_csv(root / "cpu" / "tiny.csv")
    assert list(on_disk.columns) == ["op", "tokens", "context", "batch", "seconds"]
    assert len(on_disk) == len(table) == summary["profile_rows"]
    assert (on_disk.seconds > 0).all()
    description = json.loads((root / "cpu" / "tiny.json").read_text())
    assert description["machine"]["device"] == "cpu" and description["engine"]["model"] == "tiny"
    # The same full decode batch timed first, after each part of the grid and last, so a reader sees
    # whether and how the machine moved.
    drift = description["drift"]
    assert drift["reference"] == {"decodes": CFG.batch_size, "context": 40}
    series = drift["series_s"]
    assert len(series) == 5 and min(series) > 0 and (series[0], series[-1]) == (drift["first_s"], drift["last_s"])
    assert drift["rel_change"] == pytest.approx(drift["last_s"] / drift["first_s"] - 1)
    assert drift["spread"] == pytest.approx(max(series) / min(series) - 1)
    assert drift["spread"] >= abs(drift["rel_change"]) - 1e-12
    assert summary["reference_forward_rel_change"] == drift["rel_change"]
    assert summary["reference_forward_spread"] == drift["spread"]
    # The token grid steps finely and pairs every tile multiple with the token after it.
    tokens = set(on_disk[on_disk.op == "qkv_proj"].tokens)
    assert {1, 8, 16, 17, 24, 32, 33, 36} <= tokens


def test_profile_measures_hybrids_for_the_attention_they_pay_once(profiled):
    root, _, table = profiled
    hybrids = table[table.op == "hybrid_attention"]
    # The middle and the largest chunk, each beside one decode and a full batch, at the middle context.
    assert sorted(zip(hybrids.tokens, hybrids.batch)) == [(8, 1), (8, 4), (32, 1), (32, 4)]
    assert set(hybrids.context) == {40}
    cm = CostModel.for_device("cpu", model="tiny", cost_model="profile", profile=root / "cpu" / "tiny.csv")
    assert 0 <= cm.attention_shared_s < table[table.op == "decode_attention"].seconds.max()
    # Each hybrid's bare forward is kept too, so that the self-check holds the composition of a
    # chunk and decodes to a measured iteration, not only prefill-only and decode-only ones.
    totals = table[table.op == "hybrid_total"]
    assert sorted(zip(totals.tokens, totals.batch)) == sorted(zip(hybrids.tokens, hybrids.batch))
    assert (totals.seconds.to_numpy() > hybrids.seconds.to_numpy()).all()
    measured = [(prefills, decodes) for kind, prefills, decodes, _ in measured_iterations(table) if kind == "hybrid"]
    assert sorted(measured) == sorted(([(c, c)], [40] * b) for c, b in zip(hybrids.tokens, hybrids.batch))


def test_profile_cost_model_interpolates_the_measured_table(profiled):
    root, _, _ = profiled
    cm = CostModel.for_device("cpu", model="tiny", cost_model="profile", profile=root / "cpu" / "tiny.csv")
    cost = cm.iteration_cost(prefills=[(16, 48)], decodes=[40, 40])
    assert cost.total_s > 0 and not cost.extrapolated
    times = [cm.iteration_time_s(decodes=[context] * 3) for context in range(16, 65, 4)]
    assert times == sorted(times)
    with pytest.warns(UserWarning, match="extrapolated"):
        assert cm.iteration_cost(decodes=[500] * 9).extrapolated


def test_a_profile_measured_in_another_dtype_is_refused(profiled):
    root, _, _ = profiled
    path = root / "cpu" / "tiny.csv"
    measured = json.loads(path.with_suffix(".json").read_text())["engine"]["torch_dtype"]
    other = "float16" if measured == "float32" else "float32"
    with pytest.raises(ConfigError, match=rf"^dtype='{other}' is invalid with the profile {path}: it was measured in "
                                          rf"{measured} \(run task=profile in {other}, or simulate in {measured}\)$"):
        CostModel.for_device("cpu", model="tiny", cost_model="profile", dtype=other, profile=path)
    # bfloat16 is what the engine ran where it ran float32 (no bf16 units), so the profile serves it.
    assert CostModel.for_device("cpu", model="tiny", cost_model="profile", dtype="bfloat16", profile=path)



def test_reading_a_profile_whose_machine_drifted_warns_how_unsure_it_is(profiled, tmp_path):
    root, _, _ = profiled
    measured = root / "cpu" / "tiny.csv"
    description = json.loads(measured.with_suffix(".json").read_text())
    # A profile's own spread over its series; one measured before the series, its first-to-last change.
    old = {k: v for k, v in description["drift"].items() if k not in ("series_s", "spread")}
    for drift, warns in (({"spread": 0.29}, 29), ({"spread": 0.01, "rel_change": -0.3}, None),
                         (old | {"rel_change": -0.44}, 44), (old | {"rel_change": 0.01}, None)):
        path = tmp_path / "tiny.csv"
        path.write_bytes(measured.read_bytes())
        description["drift"] = drift
        path.with_suffix(".json").write_text(json.dumps(description))
        dtype = description["engine"]["torch_dtype"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            CostModel.for_device("cpu", model="tiny", cost_model="profile", dtype=dtype, profile=path)
        moved = [str(w.message) for w in caught if "reference forward moved" in str(w.message)]
        expected = (f"profile {path}: its reference forward moved by up to {warns}% while it was measured; its "
                    "times are about that unsure")
        assert moved == ([expected] if warns else []), moved


def test_a_simulated_run_on_the_measured_profile(profiled, monkeypatch):
    pytest.importorskip("sarathi_lab.engine.executor", reason="the engine's executor seam is not merged yet")
    root, _, _ = profiled
    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(root))
    llm = LLM("tiny", executor="sim", sim_device="cpu", sim_cost_model="profile", chunk_size=32, max_batch_size=4)
    llm.generate([[3] * 40, [4] * 20], max_new_tokens=8)
    assert llm.metrics.summary()["num_requests"] == 2
    assert llm.engine.executor.extrapolated_iterations == 0



def test_the_self_check_reads_the_table_in_the_dtype_it_was_measured_in(profiled, monkeypatch):
    # The engine asked for bfloat16 runs float32 on a CPU without bf16 units: the table is float32's.
    import torch

    from sarathi_lab.model import PRESETS

    task = importlib.import_module("sarathi_lab.measure.tasks.profile")
    built = []

    class Spy(task.ProfileCostModel):
        def __init__(self, table, config, dtype, **kw):
            built.append(dtype)
            super().__init__(table, config, dtype, **kw)

    monkeypatch.setattr(task, "ProfileCostModel", Spy)
    llm = SimpleNamespace(model_config=PRESETS["tiny"], config=SimpleNamespace(dtype="bfloat16"), dtype=torch.float32)
    assert set(task._self_check(profiled[2], llm)) == {"forward_median_rel_error", "forward_median_abs_rel_error"}
    assert built == ["float32"]


@pytest.mark.parametrize("chunk,seq_len", [(512, 4096), (512, 3072), (32, 64), (64, 64), (1, 1), (256, 100)])
def test_no_profiled_chunk_ends_past_seq_len(chunk, seq_len):
    cfg = SimpleNamespace(chunk=chunk, batch_size=18, seq_len=seq_len, measure=CFG.measure)
    g = importlib.import_module("sarathi_lab.measure.tasks.profile").grids(cfg)
    assert max(c + before for c, before in g["prefills"]) == seq_len
    # Every chunk after prefixes up to the longest that fits beside it, not only the largest chunk's.
    assert all(max(b for c2, b in g["prefills"] if c2 == c) == seq_len - c for c in g["chunks"])
    assert max(g["contexts"]) == seq_len


def test_a_table_measured_on_another_machine_is_replaced_only_when_asked(profiled, tmp_path, monkeypatch):
    import shutil

    from sarathi_lab.config import ConfigError

    root, _, _ = profiled
    shutil.copytree(root, tmp_path / "profiles")
    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path / "profiles"))
    task = importlib.import_module("sarathi_lab.measure.tasks.profile")
    llm = SimpleNamespace(device=__import__("torch").device("cpu"))
    refuse, overwrite = (SimpleNamespace(model=CFG.model, on_existing=o) for o in ("refuse", "overwrite"))
    task._check_replace(refuse, llm)  # this machine's own table: remeasured unasked
    described = tmp_path / "profiles" / "cpu" / "tiny.json"
    record = json.loads(described.read_text())
    record["machine"]["cpu"] = "Another CPU"
    described.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"^task=profile would replace .*tiny.csv, measured on Another CPU, .*"
                                          r"allowed: on_existing=overwrite, or SARATHI_PROFILES_DIR=<another folder>$"):
        task._check_replace(refuse, llm)
    task._check_replace(overwrite, llm)
    described.unlink()  # no record of its machine: as unknown as another's
    with pytest.raises(ConfigError, match="measured on an unrecorded machine"):
        task._check_replace(refuse, llm)
