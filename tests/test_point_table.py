"""The simulator checks' one table of points, their one error and its summary."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab.measure.sim_check import point_table

seconds = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)


@given(st.lists(st.tuples(seconds, seconds), min_size=1, max_size=40))
def test_the_summary_is_numpys_statistics_of_the_signed_error(pairs):
    predicted, measured = map(np.array, zip(*pairs))
    err = predicted / measured - 1  # the reference, written out
    s = point_table.summary(point_table.rel_err(predicted, measured))
    assert s["points"] == len(pairs)
    assert s["median_rel_err"] == pytest.approx(np.median(err))
    assert s["median_abs_rel_err"] == pytest.approx(np.median(np.abs(err)))
    assert s["worst_abs_rel_err"] == pytest.approx(np.abs(err).max())
    assert abs(s["worst_rel_err"]) == pytest.approx(s["worst_abs_rel_err"])
    assert s["worst_rel_err"] in err
    assert s["median_ratio"] == pytest.approx(np.median(predicted / measured))


def test_a_point_without_a_measurement_is_left_out_and_a_slower_prediction_is_positive():
    assert point_table.rel_err(1.5, 1.0) == pytest.approx(0.5)
    assert point_table.rel_err(0.5, 1.0) == pytest.approx(-0.5)
    assert math.isnan(point_table.rel_err(1.0, 0.0))
    s = point_table.summary(point_table.rel_err([1.1, 0.7, 5.0], [1.0, 1.0, 0.0]))
    assert s["points"] == 2 and s["worst_rel_err"] == pytest.approx(-0.3)
    assert math.isnan(point_table.summary([])["worst_rel_err"]) and point_table.summary([])["points"] == 0


def test_wide_rows_become_one_point_per_cost_model_and_come_back_per_model_in_their_order():
    rows = pd.DataFrame({"device": ["b", "a", "a"], "kind": ["decode", "decode", "prefill"],
                         "measured_s": [1.0, 2.0, 4.0], "zeta_s": [2.0, 2.0, 2.0], "alpha_s": [1.0, 1.0, 1.0]})
    found = point_table.from_wide(rows, "test rows", ["zeta", "alpha"], ["device"])
    assert list(found.columns) == [*point_table.COLUMNS, "device"] and len(found) == 6
    wide = point_table.per_model(found, ["device", "kind"], ({"median_err": "median_abs_rel_err"},), count="n")
    # Sorted by the keys; the cost models as given, not sorted.
    assert list(wide.columns) == ["device", "kind", "n", "zeta_median_err", "alpha_median_err"]
    assert wide[["device", "kind"]].values.tolist() == [["a", "decode"], ["a", "prefill"], ["b", "decode"]]
    assert wide.zeta_median_err.tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert wide.alpha_median_err.tolist() == pytest.approx([0.5, 0.75, 0.0])
