"""The nano-batch overlap rule read from the device's tuned table: the launch step's twins write the
entry, the tune step installs it, the engine's rule takes it (defaults where a table has none)."""
import json
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab import tuned_kernels
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.steps.launch import ENTRY, table_entry
from sarathi_lab.measure.gpu.steps.tune import _overlap
from sarathi_lab.model.nano_batch import MIN_OVERLAP_TOKENS, OverlapRule
from sarathi_lab.tuned_kernels import DEFAULT, TableRefused, load, table_for

H100 = "NVIDIA H100 80GB HBM3"


def _device_table(monkeypatch, table_dir, name=H100):
    monkeypatch.setattr(tuned_kernels, "TABLE_DIR", table_dir)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    tuned_kernels._cuda_table.cache_clear()
    try:
        return table_for(torch.device("cuda", 0))
    finally:
        tuned_kernels._cuda_table.cache_clear()


@pytest.mark.parametrize("entry, mode, min_tokens", [
    ({"enabled": True, "min_tokens": 640}, "nano_batch", 640),
    ({"enabled": False}, "none", MIN_OVERLAP_TOKENS),
    ({"min_tokens": 512}, "nano_batch", 512)])
def test_a_table_s_overlap_entry_is_read_for_its_device(entry, mode, min_tokens, tmp_path,
                                                        monkeypatch):
    raw = json.loads((tuned_kernels.TABLE_DIR / "NVIDIA_H100_80GB_HBM3.json").read_text())
    (tmp_path / "NVIDIA_H100_80GB_HBM3.json").write_text(json.dumps(raw | {"overlap": entry}))
    table = _device_table(monkeypatch, tmp_path)
    assert table.overlap == entry
    rule = OverlapRule.of_table("nano_batch", table)
    assert (rule.mode, rule.min_tokens) == (mode, min_tokens)
    assert OverlapRule.of_table("none", table).mode == "none"  # the table never turns it on
    assert load(tmp_path / "NVIDIA_H100_80GB_HBM3.json").to_json()["overlap"] == entry


def test_a_table_without_an_overlap_entry_gives_the_defaults(monkeypatch):
    table = _device_table(monkeypatch, tuned_kernels.TABLE_DIR)
    assert table.attention and not table.overlap
    assert OverlapRule.of_table("nano_batch", table) == OverlapRule("nano_batch")
    assert OverlapRule.of_table("nano_batch", DEFAULT) == OverlapRule("nano_batch")
    assert "overlap" not in table.to_json()


@pytest.mark.parametrize("entry, message", [
    ({"min_tokens": 0}, r"overlap.min_tokens=0 is invalid; allowed: an integer in \[1, 1048576\]"),
    ({"min_tokens": True}, r"overlap.min_tokens=True is invalid; allowed: an integer in"),
    ({"min_tokens": 384.0}, r"overlap.min_tokens=384.0 is invalid; allowed: an integer in"),
    ({"enabled": "yes"}, r"overlap.enabled='yes' is invalid; allowed: true or false"),
    ({"cut": 2}, r"overlap.cut=2 is invalid; allowed: enabled, min_tokens"),
    ([384], r"overlap=\[384\] is invalid; allowed: a mapping")])
def test_a_malformed_overlap_entry_fails_in_one_line_naming_file_key_value(entry, message,
                                                                          tmp_path):
    path = tmp_path / "GPU.json"
    path.write_text(json.dumps({"device": "GPU", "overlap": entry}))
    with pytest.raises(TableRefused, match=f"^error: {re.escape(str(path))}: {message}") as e:
        load(path, "GPU")
    assert "\n" not in str(e.value)


def test_the_launch_step_s_entry_is_installed_by_the_tune_step(tmp_path):
    launch = tmp_path / "steps" / "launch"
    launch.mkdir(parents=True)
    ctx = Context(tmp_path, tmp_path / "steps" / "tune", True, "cpu", None)
    assert _overlap(ctx) == {}  # no launch step: the table has no entry
    (launch / ENTRY).write_text(json.dumps(table_entry([(529, -2.0), (1041, -4.0), (273, 0.5)])))
    assert _overlap(ctx) == {"enabled": True, "min_tokens": 529}
    (launch / ENTRY).write_text(json.dumps({"min_tokens": -1}))
    with pytest.raises(TableRefused, match=r"overlap_entry.json: overlap.min_tokens=-1"):
        _overlap(ctx)


@given(st.lists(st.tuples(st.integers(1, 4096), st.floats(-10, 10)), min_size=1, max_size=12))
def test_the_entry_turns_overlap_on_exactly_from_where_every_larger_twin_won(gains):
    entry = table_entry(gains)
    tuned_kernels.overlap_entry("launch", entry)  # always what the schema allows
    if entry["enabled"]:
        t = entry["min_tokens"]
        assert all(g < 0 for u, g in gains if u >= t)
        assert all(not all(g < 0 for u, g in gains if u >= s) for s, _ in gains if s < t)
    else:
        assert not any(all(g < 0 for u, g in gains if u >= s) for s, _ in gains)
