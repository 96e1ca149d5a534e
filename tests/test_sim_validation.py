"""The validation machinery at CI size: the real tiny engine and its simulation side by side.

With all requests there at once the simulated engine must make exactly the real engine's batches,
iteration by iteration, for every scheduler: the check that the simulator runs the engine's own
scheduler, block manager and loop. The cost model is a small hand-made profile (its times are not
under test here; docs/sim/ holds the measured validation)."""
from __future__ import annotations

import itertools
import json
import math

import pandas as pd
import pytest

from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.measure.sim_check.sim_validate import SERVED, Case, CPUClock, host_probe, validate

pytestmark = pytest.mark.e2e


def tiny_profile() -> pd.DataFrame:
    """Every op the profile cost model reads, on a grid covering the cases below, linear in work."""
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        rows += [(op, n, n, 1, 1e-5 * n + 1e-4) for op in ("qkv_proj", "o_proj", "ffn", "others")]
        rows.append(("prepare", n, n, 1, 2e-5 + 1e-7 * n))
    for chunk, before in itertools.product((1, 8, 16, 32, 48), (0, 16, 48)):
        rows.append(("prefill_attention", chunk, chunk + before, 1, 1e-6 * chunk * (chunk + before) + 1e-5))
    for batch, context in itertools.product((1, 2, 4), (1, 32, 64)):
        rows.append(("decode_attention", batch, context, batch, 1e-6 * batch * context + 1e-5))
    for batch in (1, 2, 4):
        rows += [("lm_head", batch, 0, batch, 1e-5 * batch), ("sample", batch, 0, batch, 1e-5 * batch)]
    return pd.DataFrame(rows, columns=["op", "tokens", "context", "batch", "seconds"])


CASES = [Case("at_once", s, 16, 4, ((40, 3), (24, 2), (32, 4))) for s in scheduler_names()] + [
    Case("poisson", "sarathi", 16, 4, ((40, 3), (24, 2), (32, 4)), arrivals=(0.0, 0.01, 0.02), repeat_real=True)]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    (root / "cpu").mkdir()
    tiny_profile().to_csv(root / "cpu" / "tiny.csv", index=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SARATHI_PROFILES_DIR", str(root))
        return validate("tiny", CASES, cpu_clock=True, progress=lambda _: None)


def test_all_at_once_the_simulation_makes_the_real_engines_batches(table):
    errors, points = table
    at_once = errors[errors.arrival == "all_at_once"]
    assert sorted(at_once.scheduler) == sorted(scheduler_names())
    assert at_once.identical_batches.all()
    assert (at_once.iterations_real == at_once.iterations_sim).all()
    assert at_once.iter_median_abs_rel_err.notna().all()
    assert set(points.scheduler) >= set(scheduler_names())
    assert (points.predicted_s > 0).all() and (points.measured_s > 0).all()


def test_the_table_has_every_served_metric_and_the_real_engines_spread(table):
    errors, _ = table
    poisson = errors[errors.arrival == "poisson"].iloc[0]
    for key in SERVED:
        assert pd.notna(poisson[f"{key}_rel_err"]) and pd.notna(poisson[f"{key}_real_spread"])
    # Present even when the repeat batched differently (NaN then): the table's columns never vary.
    assert "real_iter_median_abs_rel_spread" in errors.columns


def test_the_cpu_clock_counts_waiting_for_arrivals_but_not_sleeping():
    import time

    clock = CPUClock()
    t0 = clock.now()
    clock.sleep_until(t0 + 5.0)      # the engine waits for an arrival: the clock moves on at once
    assert clock.now() >= t0 + 5.0
    before = clock.now()
    time.sleep(0.05)                 # descheduled time (another job on the core) does not count
    assert clock.now() - before < 0.04


def test_a_profile_timed_on_another_clock_is_refused(tmp_path, monkeypatch, capsys):
    # --clock wall took the committed profile, timed on CPUClock, and compared wall-clock runs with it.
    from sarathi_lab.measure.sim_check import sim_validate

    cpu = tmp_path / "profiles" / "cpu"
    cpu.mkdir(parents=True)
    tiny_profile().to_csv(cpu / "tiny.csv", index=False)
    (cpu / "tiny.json").write_text('{"clock": "CPUClock"}')
    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path / "profiles"))
    monkeypatch.setattr(sim_validate, "validate", lambda *a, **k: pytest.fail("validated against the other clock"))
    with pytest.raises(SystemExit):
        sim_validate.main(["--smoke", "--out", str(tmp_path), "--clock", "wall"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"--clock wall is invalid with the profile {cpu / 'tiny.csv'}: it was timed on CPUClock, not WallClock "
        "(--reprofile measures it again on WallClock)")


def test_the_host_probe_times_the_profiles_reference_against_the_profile(tmp_path):
    csv = tmp_path / "tiny.csv"
    tiny_profile().to_csv(csv, index=False)
    assert math.isnan(host_probe("tiny", csv, CPUClock())())  # no description, no reference

    def probe_against(profiled_s: float) -> float:
        drift = {"reference": {"decodes": 4, "context": 32}, "first_s": profiled_s, "last_s": profiled_s}
        (tmp_path / "tiny.json").write_text(json.dumps({"drift": drift}))
        return host_probe("tiny", csv, CPUClock())()

    # A tiny model's forward takes more than a nanosecond and less than a minute.
    assert probe_against(1e-9) > 1 and 0 < probe_against(60.0) < 1
