"""Every benchmark is a registered case run by one runner: each runs dry and writes a table whose
metrics carry their units; a name or an option the runner does not know is refused in one line."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from sarathi_lab.measure.bench.case import SHARED, named
from sarathi_lab.measure.commands import group_of

NAMES = tuple(group_of("ceilings").commands)

# A metric's name carries one of these among its words: its unit, or that it has none (a share,
# a ratio, a verdict).
UNITS = ("s", "ms", "us", "ns", "gbps", "gflops", "tflops", "bytes", "mb", "mib", "tok", "per",
         "frac", "fraction", "ratio", "share", "speedup", "rate", "agree", "same", "vs", "target",
         "met")


# Cases that start a process group (vLLM's world, tensor-parallel ranks) run as users start them, each
# in its own process: a group another test of the same worker left behind makes their start wait.
OWN_PROCESS = ("versus", "tp_wire")


# Float columns that name what was measured (a point of the grid, a count's median), not a metric.
LABELS = ("top_p", "decodes_p50")


def _unitless(table: pd.DataFrame) -> list[str]:
    """Float columns naming no unit among their words (``GBps``, ``ceil_GBps``, ``time_ms_p50``)."""
    floats = [c for c in table.columns if pd.api.types.is_float_dtype(table[c])]
    return [c for c in floats if c not in LABELS and not set(c.lower().split("_")) & set(UNITS)]


def test_every_case_is_registered_once_with_what_it_measures_and_its_reference():
    for name in NAMES:
        case = named(name)
        assert case.name == name and case.what and case.reference
        assert set(case.shared) <= set(SHARED), name


@pytest.mark.e2e
@pytest.mark.parametrize("name", NAMES)
def test_every_case_runs_dry_and_writes_its_table_with_units(name, tmp_path, capsys):
    out = tmp_path / f"{name}.csv"
    if name in OWN_PROCESS:
        done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", name, "--dry", "--out", str(out)],
                              check=False, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        printed, table = done.stdout, pd.read_csv(out)
    else:
        table = named(name).run(["--dry", "--out", str(out)])
        printed = capsys.readouterr().out
    written = pd.read_csv(out)
    assert len(written) == len(table) > 0 and list(written.columns) == list(table.columns)
    assert not _unitless(written), name
    assert printed


def test_the_unit_rule_sees_a_metric_without_one():
    table = pd.DataFrame([{"iter_ms": 1.0, "GBps": 2.0, "top_p": 0.9, "gain": 1.5, "rows": 3}])
    assert _unitless(table) == ["gain"]


@pytest.mark.parametrize("argv, refused", [
    (["nope"], "error: measurement 'nope' is invalid: allowed are ceilings, iteration"),
    (["ceilings", "--bogus"], ("error: --bogus is not an option of ceilings: allowed are --help, "
                               "--device, --dtype, --threads, --clock, --copy-mib")),
    (["ceilings", "--reps", "0"], "error: argument --reps: '0' is invalid: must be an integer >= 1"),
    (["host_path", "--device", "cpu"], ("error: --device is not an option of host_path: allowed "
                                        "are --help, --decode-batches")),
])
def test_the_runner_refuses_an_unknown_case_or_knob_in_one_line(argv, refused):
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(refused), done.stderr
