"""The env step's read-bandwidth ceiling beside its copy one (measure/profiling/ceilings.py): a read-only
kernel's bytes over its fastest isolated time, recorded as ``read_gbps`` in env.json and the step's
metrics, where the floors' engineer reads it; the copy rate the floors use is unchanged."""
from __future__ import annotations

import json

import pytest

from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.steps import env
from sarathi_lab.measure.profiling import ceilings


def test_the_read_rate_is_the_buffers_bytes_over_the_fastest_isolated_read(monkeypatch):
    seen = {}

    def fake(calls, reps, device, warmup):
        seen.update(names=list(calls), reps=reps)
        calls["read"]()   # the reduction itself runs
        return {"read": [2.0, 0.5, 1.0]}

    monkeypatch.setattr(ceilings, "time_interleaved", fake)
    gbps = ceilings.read_bandwidth_gbps("cpu", 4 << 20, reps=3)
    assert seen == {"names": ["read"], "reps": 3}
    assert gbps == pytest.approx((4 << 20) / 0.5e-3 / 1e9)


def test_the_env_step_records_read_gbps_beside_copy_gbps(tmp_path, monkeypatch):
    monkeypatch.setitem(env.COPY_BYTES, "cpu", 8 << 20)
    ctx = Context(tmp_path, state.step_dir(tmp_path, "env"), True, "cpu", None)
    ctx.dir.mkdir(parents=True)
    metrics, _ = env.run(ctx, None)
    record = json.loads((ctx.dir / "env.json").read_text())
    assert record["read_gbps"] > 0 and record["copy_gbps"] > 0
    by_name = {m.metric: m for m in metrics}
    assert by_name["read_gbps"].unit == "GB/s" == by_name["copy_gbps"].unit
    assert by_name["read_gbps"].value == float(f"{record['read_gbps']:.4g}")
    assert sum(m.metric == "read_gbps" for m in metrics) == 1

